"""Blocking cluster helper for the Spark tests (topics, sends, offsets), on `client.sync`."""

from __future__ import annotations

from functools import partial

from client.config import ClientConfig
from client.message import Message, MessageQueue
from client.spark._conn import Conn
from client.sync import Admin
from tests.helpers import wait_until_sync

BROKERS = ("broker-a", "broker-b")


class MQ:
    def __init__(self, namesrv_addr: str) -> None:
        self.namesrv_addr = namesrv_addr
        cfg = ClientConfig(namesrv_addr=namesrv_addr)
        self.admin = Admin(cfg).start()
        self.conn = Conn(namesrv_addr).start()
        self.producer = self.conn.producer("spark_tests_pg")

    def close(self) -> None:
        self.conn.close()
        self.admin.close()

    def _masters(self, brokers: tuple[str, ...]) -> dict[str, str]:
        """Master addresses, once every broker in `brokers` has registered (a broker started
        a moment ago may not have)."""
        masters: dict[str, str] = {}

        def registered() -> bool:
            nonlocal masters
            masters = self.admin.master_addrs(timeout=10)
            return all(b in masters for b in brokers)

        wait_until_sync(registered, total=20, what=f"registration of {brokers}")
        return masters

    def create_topic(self, topic: str, queues: int = 2, brokers: tuple[str, ...] = BROKERS) -> None:
        """Create `topic` with `queues` queues on each broker and wait for its route."""
        masters = self._masters(brokers)
        for b in brokers:
            self.admin.create_topic(
                topic,
                broker_addr=masters[b],
                read_queue_nums=queues,
                write_queue_nums=queues,
                timeout=10,
            )

        def routed() -> bool:
            try:
                route = self.admin.topic_route(topic, timeout=5)
            except Exception:
                return False
            names = {qd.broker_name for qd in route.queue_datas}
            return names >= set(brokers)

        wait_until_sync(routed, total=20, what=f"route of {topic}")

    def add_queues(self, topic: str, broker: str, queues: int) -> None:
        """Give `topic` `queues` queues on `broker` and wait until its route says so."""
        masters = self._masters((broker,))
        self.admin.create_topic(
            topic,
            broker_addr=masters[broker],
            read_queue_nums=queues,
            write_queue_nums=queues,
            timeout=10,
        )

        def routed() -> bool:
            route = self.admin.topic_route(topic, timeout=5)
            return any(
                qd.broker_name == broker and qd.read_queue_nums == queues
                for qd in route.queue_datas
            )

        wait_until_sync(routed, total=20, what=f"{queues} queues of {topic} on {broker}")

    def send(
        self,
        topic: str,
        broker: str,
        queue_id: int,
        n: int,
        *,
        start: int = 0,
        tags: str | None = None,
        size: int = 0,
    ) -> None:
        """Send `n` messages (bodies `m<i>`, key `k<i>`) into one queue, in batches."""
        mq = MessageQueue(topic, broker, queue_id)
        batch: list[Message] = []
        for i in range(start, start + n):
            body = f"m{i}".encode()
            if size:
                body = body.ljust(size, b".")
            batch.append(Message(topic, body, tags=tags, keys=f"k{i}"))
            if len(batch) == 200:
                self.conn.run(partial(self.producer.send_batch, batch, queue=mq))
                batch = []
        if batch:
            self.conn.run(partial(self.producer.send_batch, batch, queue=mq))

    def min_offset(self, topic: str, broker: str, queue_id: int) -> int:
        bounds = self.conn.bounds({topic: [(broker, queue_id)]})
        return bounds[topic][f"{broker}:{queue_id}"][0]

    def max_offsets(self, topic: str) -> dict[str, int]:
        got = self.admin.max_offsets(topic, timeout=10)
        return {f"{mq.broker_name}:{mq.queue_id}": off for mq, off in got.items()}

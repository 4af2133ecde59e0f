"""From a topic's route (NameServer answer) to the queues producers and consumers use.

Pure. The route classes live in `remoting.protocol.route`; this module only
needs their shape, spelled out as Protocols.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from client.fault import FaultStrategy
from client.message import MessageQueue
from remoting.protocol.route import MASTER_ID, PERM_READ, PERM_WRITE


class QueueDataLike(Protocol):
    @property
    def broker_name(self) -> str: ...
    @property
    def read_queue_nums(self) -> int: ...
    @property
    def write_queue_nums(self) -> int: ...
    @property
    def perm(self) -> int: ...


class BrokerDataLike(Protocol):
    @property
    def broker_name(self) -> str: ...
    @property
    def broker_addrs(self) -> Mapping[Any, str]: ...


class TopicRouteDataLike(Protocol):
    @property
    def queue_datas(self) -> Sequence[QueueDataLike]: ...
    @property
    def broker_datas(self) -> Sequence[BrokerDataLike]: ...


def master_addr(broker: BrokerDataLike) -> str | None:
    """The master's address (broker id 0), or None."""
    for k, v in broker.broker_addrs.items():
        if int(k) == MASTER_ID:
            return v
    return None


def broker_addr_table(route: TopicRouteDataLike) -> dict[str, dict[int, str]]:
    """broker name -> {broker id: address}."""
    return {
        b.broker_name: {int(k): v for k, v in b.broker_addrs.items()} for b in route.broker_datas
    }


def publish_queues(topic: str, route: TopicRouteDataLike) -> list[MessageQueue]:
    """Writable queues whose broker has a master, ordered by broker name then queue id.

    An `orderTopicConf` ("brokerA:4;brokerB:4") on the route, when present,
    decides the queues instead (ordered topics).
    """
    order_conf = getattr(route, "order_topic_conf", None)
    if order_conf:
        queues: list[MessageQueue] = []
        for item in str(order_conf).split(";"):
            name, _, num = item.partition(":")
            if name and num.strip().isdigit():
                queues.extend(MessageQueue(topic, name, i) for i in range(int(num)))
        return queues
    masters = {b.broker_name for b in route.broker_datas if master_addr(b) is not None}
    queues = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not qd.perm & PERM_WRITE or qd.broker_name not in masters:
            continue
        queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return queues


def subscribe_queues(topic: str, route: TopicRouteDataLike) -> list[MessageQueue]:
    """Readable queues, ordered by broker name then queue id."""
    queues: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if qd.perm & PERM_READ:
            queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return queues


class TopicPublishInfo:
    """A topic's writable queues with RocketMQ's round-robin selection.

    Args:
        topic: the topic name.
        queues: the publish queues (see `publish_queues`).
        order_topic: whether the route carried an order configuration.
        rng: where the round-robin counter starts (random, as RocketMQ's
            thread-local counter does).
    """

    __slots__ = ("_counter", "haveroute", "order_topic", "queues", "topic")

    def __init__(
        self,
        topic: str,
        queues: Sequence[MessageQueue],
        *,
        order_topic: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.topic = topic
        self.queues = list(queues)
        self.order_topic = order_topic
        self.haveroute = bool(self.queues)
        # A private generator: background tasks must not touch the global `random` state.
        self._counter = (rng or random.Random()).randrange(1 << 16)

    @classmethod
    def from_route(
        cls, topic: str, route: TopicRouteDataLike, *, rng: random.Random | None = None
    ) -> TopicPublishInfo:
        return cls(
            topic,
            publish_queues(topic, route),
            order_topic=bool(getattr(route, "order_topic_conf", None)),
            rng=rng,
        )

    def ok(self) -> bool:
        return bool(self.queues)

    def _next(self) -> int:
        self._counter = (self._counter + 1) & 0x7FFFFFFF
        return self._counter

    def queue_nums_of(self, broker_name: str) -> int:
        return sum(1 for q in self.queues if q.broker_name == broker_name)

    def select_one(self, last_broker_failed: str | None = None) -> MessageQueue:
        """Round robin; a retry skips queues on `last_broker_failed` when it can.

        Raises:
            IndexError: there are no queues.
        """
        n = len(self.queues)
        if n == 0:
            raise IndexError(f"no queues for topic {self.topic}")
        if last_broker_failed is not None:
            for _ in range(n):
                mq = self.queues[self._next() % n]
                if mq.broker_name != last_broker_failed:
                    return mq
        counter = self._counter = (self._counter + 1) & 0x7FFFFFFF  # `_next()`, inline
        return self.queues[counter % n]

    def select_with_fault(
        self, strategy: FaultStrategy, last_broker_failed: str | None = None
    ) -> MessageQueue:
        """RocketMQ's selection with latency fault tolerance.

        First an available queue not on `last_broker_failed` (round robin);
        else the least bad broker's next queue; else plain round robin.
        """
        if not strategy.enabled:
            return self.select_one(last_broker_failed)
        n = len(self.queues)
        if n == 0:
            raise IndexError(f"no queues for topic {self.topic}")
        if last_broker_failed is None and strategy.tolerance.all_available():
            # Nothing is isolated: the loop below would take the first queue it looks at.
            counter = self._counter = (self._counter + 1) & 0x7FFFFFFF  # `_next()`, inline
            return self.queues[counter % n]
        for _ in range(n):
            mq = self.queues[self._next() % n]
            if mq.broker_name != last_broker_failed and strategy.is_available(mq.broker_name):
                return mq
        not_best = strategy.tolerance.pick_one_at_least()
        if not_best is not None:
            nums = self.queue_nums_of(not_best)
            if nums > 0:
                return MessageQueue(self.topic, not_best, self._next() % nums)
            strategy.tolerance.remove(not_best)
        return self.select_one(last_broker_failed)

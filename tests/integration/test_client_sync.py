"""The blocking facade (`client.sync`) used from plain threads against real processes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from client import MQClientError, sync
from tests.helpers import wait_until_sync
from tests.integration.client_support import fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def ns(namesrv: NamesrvProc, start_broker: StartBroker) -> str:
    start_broker(namesrv.addr, name="broker-a")
    return namesrv.addr


def test_blocking_facade_from_several_threads(ns: str) -> None:
    cfg = fast_config(ns)
    with sync.Admin(cfg) as admin:

        def registered() -> bool:
            try:
                return bool(admin.master_addrs("DefaultCluster", timeout=5))
            except MQClientError:  # no cluster until the first broker registers
                return False

        wait_until_sync(registered, total=20, what="broker registered")
        admin.create_topic("SY1", cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4)
        wait_until_sync(
            lambda: "SY1" in admin.topic_list(timeout=5), total=20, what="topic registered"
        )
    received: list[str] = []
    lock = threading.Lock()
    worker_threads: set[str] = set()

    def listener(msgs: list[sync.MessageExt]) -> sync.ConsumeStatus:
        with lock:
            received.extend(m.body.decode() for m in msgs)
            worker_threads.add(threading.current_thread().name)
        return sync.ConsumeStatus.CONSUME_SUCCESS

    consumer = sync.PushConsumer(
        "syg",
        cfg,
        listener=listener,
        consume_from_where=sync.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("SY1")
    with consumer, sync.Producer("syp", cfg) as producer:
        results: list[sync.SendResult] = []
        errors: list[BaseException] = []

        def send_some(tid: int) -> None:
            try:
                for i in range(25):
                    r = producer.send(sync.Message("SY1", f"t{tid}-{i}"), timeout=10)
                    with lock:
                        results.append(r)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=send_some, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        assert len(results) == 100
        assert all(r.status is sync.SendStatus.SEND_OK for r in results)
        fut = producer.send_async(sync.Message("SY1", "async-1"))
        assert fut.result(timeout=10).status is sync.SendStatus.SEND_OK
        wait_until_sync(lambda: len(set(received)) >= 101, total=30, what="all consumed")
    expected = {f"t{t}-{i}" for t in range(4) for i in range(25)} | {"async-1"}
    assert set(received) == expected
    # The listener ran in worker threads, not in the caller's or the loop's thread.
    assert threading.main_thread().name not in worker_threads


def test_blocking_lite_pull_and_timeouts(ns: str) -> None:
    cfg = fast_config(ns)
    with sync.Producer("syp2", cfg) as producer:
        r = producer.send(sync.Message("SY2", "only"), timeout=10)  # auto-created topic
    with sync.PullConsumer(
        "syg2", cfg, consume_from_where=sync.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ) as c:
        c.assign([r.message_queue])
        got: list[sync.MessageExt] = []

        def polled() -> bool:
            got.extend(c.poll(timeout_ms=500))
            return bool(got)

        wait_until_sync(polled, total=20, what="poll")
        assert got[0].body == b"only"
        assert c.poll(timeout_ms=200) == []
        with pytest.raises(TimeoutError):
            c.committed(r.message_queue, timeout=0.000001)
        assert c.committed(r.message_queue, timeout=10) in (-1, 0, 1)
    c.close()  # idempotent

"""Client-side reliability on real processes: PushConsumer retry through %RETRY%<group>,
dead letters after the max reconsume times, a broker restart mid-way, and the DLQ tools."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from client import (
    Admin,
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from client._api import MQClientAPI
from remoting import RemoteError, ResponseCode
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

ENV = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(1024 * 1024),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(1000 * 20),
    "TRIMQ_CONSUMER_OFFSET_PERSIST_INTERVAL_MS": "500",
    # Every retry level is 1 s (levels above the last are clamped to it).
    "TRIMQ_MESSAGE_DELAY_LEVEL": "1s 1s 1s",
}

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def broker(namesrv: NamesrvProc, start_broker: StartBroker) -> BrokerProc:
    return start_broker(namesrv.addr, env=ENV)


@pytest.mark.slow
async def test_retry_k_times_then_success(namesrv: NamesrvProc, broker: BrokerProc) -> None:
    await create_topic(namesrv.addr, "RetryT", queues=2)
    seen: list[tuple[str, int, bytes]] = []
    k = 3

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeStatus:
        seen.extend((m.topic, m.reconsume_times, m.body) for m in msgs)
        assert ctx.message_queue.topic in ("RetryT", "%RETRY%CG_retry")
        if len(seen) <= k:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    cfg = fast_config(namesrv.addr)
    consumer = PushConsumer(
        "CG_retry",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("RetryT", "*")
    async with Producer("PG_retry", cfg) as producer, consumer:
        assert any(
            s.topic == "%RETRY%CG_retry" for s in consumer.consumer_data().subscription_data_set
        )
        await producer.send(Message("RetryT", b"once", keys="k1"))
        await wait_until(lambda: len(seen) >= k + 1, total=25, what="k retries then success")
        await trio.sleep(1.5)  # nothing more comes: it succeeded
    assert seen == [("RetryT", i, b"once") for i in range(k + 1)]
    assert consumer.sent_back == k


@pytest.mark.slow
async def test_always_failing_goes_to_dlq(namesrv: NamesrvProc, broker: BrokerProc) -> None:
    await create_topic(namesrv.addr, "DlqT", queues=1)
    seen: list[int] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.reconsume_times for m in msgs)
        raise RuntimeError("always fails")

    cfg = fast_config(namesrv.addr, max_reconsume_times=2)
    consumer = PushConsumer(
        "CG_dlq",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("DlqT", "*")
    dlq = MessageQueue("%DLQ%CG_dlq", "broker-a", 0)
    async with Producer("PG_dlq", cfg) as producer, consumer:
        await producer.send(Message("DlqT", b"poison"))
        api = consumer.instance.api

        async def in_dlq() -> bool:
            try:
                return await api.get_max_offset(broker.addr, dlq) == 1
            except Exception:
                return False

        await wait_until(in_dlq, total=25, what="message in the DLQ")
        await trio.sleep(1.5)
    # Delivered with reconsume times 0, 1, 2; the third failure dead-letters it.
    assert seen == [0, 1, 2]
    # The DLQ tools: list it (the write-only DLQ is raised to perm 6), resend it.
    async with Admin(cfg) as admin:
        dead = await admin.dlq_messages("CG_dlq")
        assert [m.body for m in dead] == [b"poison"]
        assert dead[0].properties["RETRY_TOPIC"] == "DlqT"
        _, result = await admin.resend_dlq_message("CG_dlq", dead[0].msg_id)
        assert result.message_queue.topic == "DlqT"
        route = await admin.topic_route("DlqT")
        assert route.queue_datas
        offsets = await admin.max_offsets("DlqT")
        assert sum(offsets.values()) == 2  # the original and the resent copy


@pytest.mark.slow
async def test_retry_survives_broker_restart(namesrv: NamesrvProc, broker: BrokerProc) -> None:
    await create_topic(namesrv.addr, "RestartT", queues=2)
    n = 20
    failed_once: set[bytes] = set()
    done: set[bytes] = set()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            if m.body not in failed_once:
                failed_once.add(m.body)
                return ConsumeStatus.RECONSUME_LATER
        done.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    cfg = fast_config(namesrv.addr, send_timeout_ms=2000)
    consumer = PushConsumer(
        "CG_restart",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("RestartT", "*")
    bodies = [b"m%02d" % i for i in range(n)]
    async with Producer("PG_restart", cfg) as producer, consumer:
        for b in bodies[: n // 2]:
            await producer.send(Message("RestartT", b))
        await wait_until(lambda: len(failed_once) >= n // 2, total=15, what="first failures")
        await trio.to_thread.run_sync(broker.restart)
        for b in bodies[n // 2 :]:
            for _attempt in range(20):
                try:
                    await producer.send(Message("RestartT", b))
                    break
                except Exception:
                    await trio.sleep(0.5)
        await wait_until(lambda: done >= set(bodies), total=30, what="all consumed after restart")
    assert done == set(bodies)


async def test_failed_send_back_falls_back_to_the_inner_producer(
    namesrv: NamesrvProc, broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONSUMER_SEND_MSG_BACK refused: the consumer re-sends the message to %RETRY%<group>
    through its instance's inner producer (started from a consume worker), the retry comes
    back, and leaving the consumer stops that producer cleanly."""
    await create_topic(namesrv.addr, "FallbackT", queues=1)
    refused: list[str] = []

    async def refuse(self: object, addr: str, msg: MessageExt, *args: object, **kw: object) -> None:
        refused.append(msg.msg_id)
        raise RemoteError(ResponseCode.SYSTEM_ERROR, "send back refused by the test")

    monkeypatch.setattr(MQClientAPI, "consumer_send_msg_back", refuse)
    seen: list[tuple[str, int, bytes, str | None]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(
            (m.topic, m.reconsume_times, m.body, m.properties.get("RETRY_TOPIC")) for m in msgs
        )
        return ConsumeStatus.RECONSUME_LATER if len(seen) == 1 else ConsumeStatus.CONSUME_SUCCESS

    cfg = fast_config(namesrv.addr)
    consumer = PushConsumer(
        "CG_fallback",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("FallbackT", "*")
    async with Producer("PG_fallback", cfg) as producer:
        async with consumer:
            await producer.send(Message("FallbackT", b"again"))
            instance = consumer.instance
            await wait_until(lambda: len(seen) >= 2, total=25, what="the re-sent retry")
        assert not instance.running
    assert len(refused) == 1
    assert seen == [
        ("FallbackT", 0, b"again", None),
        # Back from %RETRY%CG_fallback, under its original topic as RocketMQ restores it.
        ("FallbackT", 1, b"again", "FallbackT"),
    ]
    assert consumer.sent_back == 1

"""Message trace on real processes: traced producer, push and lite-pull consumers, then
`mqadmin queryMsgTraceById` shows the Pub and Sub records; a full trace queue or an unwritable
trace topic never blocks or fails a send; trace off writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import trio

from client import (
    Admin,
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    SendStatus,
    TransactionProducer,
)
from client.trace import TRACE_TOPIC, ConsumeReturnType
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_client_mqbench import _run as run_mqbench
from tests.integration.test_mqadmin import mqadmin

StartBroker = Callable[..., BrokerProc]
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


async def _trace(ns: str, msg_id: str, *args: str) -> dict[str, Any] | None:
    out = await trio.to_thread.run_sync(
        lambda: mqadmin("queryMsgTraceById", "-n", ns, "-i", msg_id, "--json", *args, check=False)
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


@pytest.mark.slow
async def test_traced_send_and_consume_shown_by_query_msg_trace_by_id(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker = start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "TraceT", queues=2)
    cfg = fast_config(ns, enable_trace=True)
    async with Producer("trace-pg", cfg) as p:
        first = await p.send(Message("TraceT", b"hello", tags="TagA", keys="order-1"))
        batch = [Message("TraceT", f"b{i}") for i in range(3)]
        await p.send_batch(batch)
    ids = [first.msg_id] + [m.uniq_key or "" for m in batch]

    failed: set[str] = set()
    done: set[str] = set()

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeStatus:
        for m in msgs:
            if m.msg_id == first.msg_id and m.msg_id not in failed:
                failed.add(m.msg_id)  # once: back to the broker, again after 1 s
                ctx.delay_level_when_next_consume = 1
                return ConsumeStatus.RECONSUME_LATER
            done.add(m.msg_id)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("trace-cg", cfg, listener=listener, consume_from_where=FIRST)
    consumer.subscribe("TraceT", "*")
    async with consumer:
        await wait_until(lambda: done >= set(ids), total=30, what="every message consumed")
    polled: set[str] = set()
    async with PullConsumer("trace-lite", cfg, consume_from_where=FIRST) as c:
        c.subscribe("TraceT", "*")
        with trio.move_on_after(30):
            while not polled >= set(ids):
                polled.update(m.msg_id for m in await c.poll(timeout_ms=500))
    assert polled >= set(ids)

    # The trace messages are written on close; the broker indexes them shortly after.
    views: dict[str, Any] = {}

    async def traced() -> bool:
        got = await _trace(ns, first.msg_id)
        if got is None:
            return False
        views.update(got)
        subs = got["consumers"]
        return len(subs.get("trace-cg", [])) == 2 and len(subs.get("trace-lite", [])) == 1

    await wait_until(traced, total=30, interval=0.5, what="the trace of the first message")
    [pub] = views["pub"]
    assert pub["group_name"] == "trace-pg"
    assert pub["status"] == "success"
    assert (pub["topic"], pub["tags"], pub["keys"]) == ("TraceT", "TagA", "order-1")
    assert pub["store_host"] == broker.addr
    assert pub["offset_msg_id"] == first.offset_msg_id
    assert pub["msg_type"] == "Normal_Msg"
    assert pub["client_host"].startswith("127.0.0.1:")
    stored = views["stored"]
    assert (stored["topic"], stored["broker_name"]) == ("TraceT", "broker-a")
    assert (stored["queue_id"], stored["queue_offset"]) == (
        first.message_queue.queue_id,
        first.queue_offset,
    )
    push = sorted(views["consumers"]["trace-cg"], key=lambda v: v["retry_times"])
    assert [(v["status"], v["retry_times"]) for v in push] == [("failed", 0), ("success", 1)]
    assert push[0]["context_code"] == ConsumeReturnType.FAILED
    assert push[1]["context_code"] == ConsumeReturnType.SUCCESS
    assert all(v["client_host"].startswith("127.0.0.1:") for v in push)
    [lite] = views["consumers"]["trace-lite"]
    assert (lite["status"], lite["retry_times"]) == ("success", 0)
    kinds = sorted(v["trace_type"] for v in views["records"])
    assert kinds == ["Pub"] + ["SubAfter"] * 3 + ["SubBefore"] * 3

    # A batch element has its own Pub record.
    async def batch_traced() -> bool:
        got = await _trace(ns, ids[2])
        return got is not None and len(got["pub"]) == 1 and "trace-cg" in got["consumers"]

    await wait_until(batch_traced, total=30, interval=0.5, what="the trace of a batch element")

    # RocketMQ's columns, without --json.
    text = (await trio.to_thread.run_sync(
        lambda: mqadmin("query-msg-trace-by-id", "-n", ns, "-i", first.msg_id)
    )).stdout  # fmt: skip
    lines = text.splitlines()
    assert lines[0].split() == ["#Type", "#ProducerGroup", "#ClientHost", "#SendTime",
                                "#CostTimes", "#Status"]  # fmt: skip
    assert lines[1].split()[:2] == ["Pub", "trace-pg"]
    assert lines[1].split()[-1] == "success"
    assert "#ConsumerGroup" in text
    assert any(line.split()[:2] == ["Sub", "trace-lite"] for line in lines)

    # An id without a trace, and a bad id.
    out = await trio.to_thread.run_sync(
        lambda: mqadmin("queryMsgTraceById", "-n", ns, "-i", "NOSUCHID", check=False)
    )
    assert out.returncode == 1
    assert "no trace of message NOSUCHID" in out.stderr
    out = await trio.to_thread.run_sync(
        lambda: mqadmin("queryMsgTraceById", "-n", ns, "-i", "a b", check=False)
    )
    assert out.returncode == 2


async def test_full_trace_queue_and_unwritable_trace_topic_never_hold_sends(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    # No auto-create and no trace topic: every trace write fails.
    start_broker(namesrv.addr, name="broker-a", auto_create_topic=False)
    await create_topic(namesrv.addr, "TraceQ", queues=1)
    cfg = fast_config(namesrv.addr, enable_trace=True, trace_queue_size=4)
    async with Producer("trace-full", cfg) as p:
        tracer = p._tracer
        assert tracer is not None
        # 40 Pub records appended at once (one batch): the queue holds 4, and the writer
        # task waiting on it may take one more.
        results = await p.send_batch([Message("TraceQ", f"m{i}") for i in range(40)])
        assert tracer.dropped >= 35
        assert tracer.appended + tracer.dropped == 40
        for i in range(5):
            r = await p.send(Message("TraceQ", f"s{i}"))
            assert r.status is SendStatus.SEND_OK
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert tracer.failed_records > 0
    assert tracer.sent_records == 0
    async with Admin(fast_config(namesrv.addr)) as admin:
        with pytest.raises(Exception, match="No route"):
            await admin.topic_route(TRACE_TOPIC)


async def test_trace_off_writes_nothing(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "TraceOff", queues=1)
    await create_topic(ns, TRACE_TOPIC, queues=1)
    cfg = fast_config(ns)  # enable_trace defaults to off
    async with Producer("untraced-pg", cfg) as p:
        assert p._tracer is None
        sent = [await p.send(Message("TraceOff", f"m{i}")) for i in range(5)]
    got: set[str] = set()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.update(m.msg_id for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("untraced-cg", cfg, listener=listener, consume_from_where=FIRST)
    consumer.subscribe("TraceOff", "*")
    async with consumer:
        await wait_until(lambda: len(got) == 5, total=20, what="consumed")
    assert got == {r.msg_id for r in sent}
    async with Admin(fast_config(ns)) as admin:
        offsets = await admin.max_offsets(TRACE_TOPIC)
    assert offsets
    assert set(offsets.values()) == {0}


async def test_mqbench_trace_flag_writes_trace_records(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "TraceBench", queues=1)
    summary = await trio.to_thread.run_sync(
        lambda: run_mqbench(
            "producer", "-n", ns, "-t", "TraceBench", "-c", "20", "-w", "2", "--trace", "--json"
        )
    )
    assert summary["messages"] == 20
    assert summary["errors"] == 0
    async with Admin(fast_config(ns)) as admin:

        async def written() -> bool:
            return sum((await admin.max_offsets(TRACE_TOPIC)).values()) > 0

        # Written by the time mqbench exits (the producer's close sends what is queued).
        await wait_until(written, total=20, interval=0.2, what="trace messages from mqbench")


async def test_orderly_consumer_traces(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "TraceOrd", queues=1)
    cfg = fast_config(ns, enable_trace=True, suspend_current_queue_time_ms=100)
    async with Producer("trace-ord-pg", cfg) as p:
        sent = await p.send_orderly(Message("TraceOrd", b"in order"), "k")
    calls: list[str] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        calls.append(msgs[0].msg_id)
        if len(calls) == 1:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT  # retried in place
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(
        "trace-ord-cg", cfg, orderly_listener=listener, consume_from_where=FIRST
    )
    consumer.subscribe("TraceOrd", "*")
    async with consumer:
        await wait_until(lambda: len(calls) >= 2, total=30, what="the orderly retry")

    async def traced() -> bool:
        got = await _trace(ns, sent.msg_id)
        return got is not None and len(got["consumers"].get("trace-ord-cg", [])) == 2

    await wait_until(traced, total=30, interval=0.5, what="the orderly trace")
    got = await _trace(ns, sent.msg_id)
    assert got is not None
    subs = sorted(got["consumers"]["trace-ord-cg"], key=lambda v: v["time_stamp"])
    assert [(v["status"], v["context_code"]) for v in subs] == [
        ("failed", ConsumeReturnType.FAILED),
        ("success", ConsumeReturnType.SUCCESS),
    ]

    # A transaction's half message: its Pub record says so.
    async def commit(msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async with TransactionProducer("trace-tx-pg", cfg, execute_local_transaction=commit) as tp:
        tx = await tp.send_message_in_transaction(Message("TraceOrd", b"tx"))
    half_id = tx.send_result.msg_id

    async def half_traced() -> bool:
        got = await _trace(ns, half_id)
        return got is not None and len(got["pub"]) == 1

    await wait_until(half_traced, total=30, interval=0.5, what="the half message's trace")
    got = await _trace(ns, half_id)
    assert got is not None
    assert got["pub"][0]["msg_type"] == "Trans_Msg_Half"
    assert got["pub"][0]["group_name"] == "trace-tx-pg"
    # Its end: an EndTransaction record with the state the local transaction gave.

    async def end_traced() -> bool:
        got = await _trace(ns, half_id)
        return got is not None and any(r["trace_type"] == "EndTransaction" for r in got["records"])

    await wait_until(end_traced, total=30, interval=0.5, what="the transaction's end trace")
    got = await _trace(ns, half_id)
    assert got is not None
    [end] = [r for r in got["records"] if r["trace_type"] == "EndTransaction"]
    assert end["transaction_state"] == "COMMIT_MESSAGE"
    assert end["group_name"] == "trace-tx-pg"
    assert end["store_host"]

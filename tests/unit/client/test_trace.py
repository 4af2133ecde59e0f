"""Message trace records: RocketMQ 4.9's text format field by field (fixed strings written from
the format's description, not from the encoder), round trips, the decoder's leniency, and the
dispatcher's batching and dropping (on trio's MockClock, with a recording producer)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from client.config import ClientConfig
from client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from client.trace import (
    MAX_BATCH_KEY_CHARS,
    MAX_TRACE_GROUP_LENGTH,
    ConsumeReturnType,
    TraceBean,
    TraceContext,
    TraceDispatcher,
    TraceMessageType,
    TraceType,
    decode_trace_data,
    encode_context,
    message_type,
    pub_contexts,
    sub_after,
    sub_before,
    trace_group_name,
    trace_views,
)

A, B = "\x01", "\x02"
MSG_ID = "7F0000010C2018B4AAC2A1B2C3D40000"


def pub() -> TraceContext:
    return TraceContext(
        TraceType.Pub,
        1700000000123,
        "DefaultRegion",
        "PG",
        cost_time=7,
        success=True,
        request_id="R1",
        beans=[
            TraceBean(
                topic="TopicA",
                msg_id=MSG_ID,
                offset_msg_id="7F00000100002A9F0000000000000123",
                tags="TagA",
                keys="k1 k2",
                store_host="127.0.0.1:10911",
                body_length=11,
                msg_type=TraceMessageType.Normal_Msg,
            )
        ],
    )


PUB_TEXT = (
    "Pub" + A + "1700000000123" + A + "DefaultRegion" + A + "PG" + A + "TopicA" + A + MSG_ID
    + A + "TagA" + A + "k1 k2" + A + "127.0.0.1:10911" + A + "11" + A + "7" + A + "0" + A
    + "7F00000100002A9F0000000000000123" + A + "true" + B
)  # fmt: skip


def test_pub_record_field_by_field() -> None:
    t = encode_context(pub())
    assert t.data == PUB_TEXT
    assert t.keys == [MSG_ID, "k1", "k2"]


def test_sub_before_and_after_one_record_per_message() -> None:
    beans = [
        TraceBean(msg_id="M1", keys=None, retry_times=0),
        TraceBean(msg_id="M2", keys="kk", retry_times=3),
    ]
    before = TraceContext(
        TraceType.SubBefore, 1700000000200, "DefaultRegion", "CG", request_id="REQ", beans=beans
    )
    assert encode_context(before).data == (
        "SubBefore" + A + "1700000000200" + A + "DefaultRegion" + A + "CG" + A + "REQ" + A
        + "M1" + A + "0" + A + "null" + B
        + "SubBefore" + A + "1700000000200" + A + "DefaultRegion" + A + "CG" + A + "REQ" + A
        + "M2" + A + "3" + A + "kk" + B
    )  # fmt: skip
    assert encode_context(before).keys == ["M1", "M2", "kk"]
    after = TraceContext(
        TraceType.SubAfter,
        1700000000250,
        "DefaultRegion",
        "CG",
        cost_time=25,
        success=False,
        request_id="REQ",
        context_code=int(ConsumeReturnType.FAILED),
        beans=beans[:1],
    )
    assert encode_context(after).data == (
        "SubAfter" + A + "REQ" + A + "M1" + A + "25" + A + "false" + A + "null" + A + "4" + A
        + "1700000000250" + A + "CG" + B
    )  # fmt: skip


def test_end_transaction_record() -> None:
    ctx = TraceContext(
        TraceType.EndTransaction,
        1700000000300,
        "DefaultRegion",
        "TPG",
        beans=[
            TraceBean(
                topic="T",
                msg_id="M",
                tags=None,
                keys=None,
                store_host="127.0.0.1:10911",
                msg_type=TraceMessageType.Trans_msg_Commit,
                transaction_id="TX",
                transaction_state="COMMIT_MESSAGE",
                from_transaction_check=True,
            )
        ],
    )
    assert encode_context(ctx).data == (
        "EndTransaction" + A + "1700000000300" + A + "DefaultRegion" + A + "TPG" + A + "T" + A
        + "M" + A + "null" + A + "null" + A + "127.0.0.1:10911" + A + "2" + A + "TX" + A
        + "COMMIT_MESSAGE" + A + "true" + B
    )  # fmt: skip


def test_decode_fixed_text() -> None:
    contexts, bad = decode_trace_data(PUB_TEXT)
    assert bad == 0
    [ctx] = contexts
    assert ctx.trace_type is TraceType.Pub
    assert (ctx.time_stamp, ctx.region_id, ctx.group_name) == (1700000000123, "DefaultRegion", "PG")
    assert (ctx.cost_time, ctx.success) == (7, True)
    b = ctx.beans[0]
    assert (b.topic, b.msg_id, b.tags, b.keys) == ("TopicA", MSG_ID, "TagA", "k1 k2")
    assert (b.store_host, b.body_length, b.msg_type) == ("127.0.0.1:10911", 11, 0)
    assert b.offset_msg_id == "7F00000100002A9F0000000000000123"


def test_round_trip_of_several_records_in_one_body() -> None:
    before = TraceContext(
        TraceType.SubBefore,
        5,
        "R",
        "CG",
        request_id="REQ",
        beans=[TraceBean(msg_id="M1", keys="a", retry_times=2)],
    )
    after = sub_after(before, 1, True, ConsumeReturnType.SUCCESS)
    text = "".join(encode_context(c).data for c in (pub(), before, after))
    contexts, bad = decode_trace_data(text)
    assert bad == 0
    assert [c.trace_type for c in contexts] == [
        TraceType.Pub,
        TraceType.SubBefore,
        TraceType.SubAfter,
    ]
    assert encode_context(contexts[0]).data == PUB_TEXT
    assert contexts[1].request_id == contexts[2].request_id == "REQ"
    assert contexts[1].beans[0].retry_times == 2
    assert contexts[2].group_name == "CG"
    assert contexts[2].context_code == 0
    assert contexts[2].success is True


def test_older_and_newer_layouts_and_bad_records() -> None:
    # 13 fields (no offset id), 15 (a client host), a SubAfter without time and group.
    old = "Pub" + A + "1" + A + "R" + A + "G" + A + "T" + A + "M" + A + "t" + A + "k" + A + "h"
    old += A + "3" + A + "4" + A + "3" + A + "false" + B
    new = PUB_TEXT[:-1] + A + "192.0.2.9" + B
    short_after = "SubAfter" + A + "REQ" + A + "M" + A + "9" + A + "true" + A + "k" + B
    junk = "Pub" + A + "notanumber" + B + "Nothing" + A + "x" + B + "SubBefore" + A + "1" + B
    contexts, bad = decode_trace_data(old + new + short_after + junk)
    assert bad == 2  # the bad number and the truncated SubBefore; unknown types are ignored
    c_old, c_new, c_after = contexts
    assert c_old.success is False
    assert c_old.beans[0].msg_type is TraceMessageType.Delay_Msg
    assert c_old.beans[0].offset_msg_id == ""
    assert c_new.beans[0].client_host == "192.0.2.9"
    assert c_after.cost_time == 9
    assert c_after.group_name is None
    assert decode_trace_data("") == ([], 0)
    assert decode_trace_data(B + B) == ([], 0)


def test_separators_inside_values_do_not_break_records() -> None:
    ctx = pub()
    ctx.beans[0].keys = "evil" + A + "key" + B
    contexts, bad = decode_trace_data(encode_context(ctx).data)
    assert bad == 0
    assert contexts[0].beans[0].keys == "evil key "


def test_message_types_and_batch_pub_records() -> None:
    assert message_type(Message("T", b"x")) is TraceMessageType.Normal_Msg
    assert message_type(Message("T", b"x", delay_time_level=3)) is TraceMessageType.Delay_Msg
    half = Message("T", b"x")
    half.properties["TRAN_MSG"] = "true"
    assert message_type(half) is TraceMessageType.Trans_Msg_Half
    msgs = [Message("T", b"ab", keys="k0"), Message("T", b"cde", tags="tg")]
    msgs[0].properties["UNIQ_KEY"] = "U0"
    msgs[1].properties["UNIQ_KEY"] = "U1"
    result = SendResult(SendStatus.SEND_OK, "U0,U1", "O0,O1", MessageQueue("T", "b", 1), 4)
    ctxs = pub_contexts("PG", msgs, result, "h:1", "R", 1000, 8)
    assert [
        (c.beans[0].msg_id, c.beans[0].offset_msg_id, c.beans[0].body_length) for c in ctxs
    ] == [
        ("U0", "O0", 2),
        ("U1", "O1", 3),
    ]
    assert all(c.success and c.cost_time == 8 for c in ctxs)


def _ext(topic: str, props: dict[str, str], born: str = "192.0.2.11:5000") -> MessageExt:
    return MessageExt(topic, b"x", properties=props, born_host=born, reconsume_times=1)


def test_sub_before_skips_trace_off_and_trace_topic_messages() -> None:
    msgs = [
        _ext("T", {"UNIQ_KEY": "A"}),
        _ext("T", {"UNIQ_KEY": "B", "TRACE_ON": "false"}),
        _ext("RMQ_SYS_TRACE_TOPIC", {"UNIQ_KEY": "C"}),
    ]
    ctx = sub_before("CG", msgs, "RMQ_SYS_TRACE_TOPIC")
    assert ctx is not None
    assert [b.msg_id for b in ctx.beans] == ["A"]
    assert ctx.beans[0].retry_times == 1
    assert sub_before("CG", msgs[1:], "RMQ_SYS_TRACE_TOPIC") is None


def test_trace_views_keep_the_message_and_pair_retries() -> None:
    before = TraceContext(
        TraceType.SubBefore,
        1700000000200,
        "R",
        "CG",
        request_id="Q",
        beans=[TraceBean(msg_id=MSG_ID, retry_times=2)],
    )
    after = sub_after(before, 1, False, ConsumeReturnType.EXCEPTION)
    other = TraceContext(TraceType.SubBefore, 11, "R", "CG", beans=[TraceBean(msg_id="OTHER")])
    body = "".join(encode_context(c).data for c in (pub(), before, other, after)).encode()
    views, bad = trace_views(MSG_ID, [_ext("RMQ_SYS_TRACE_TOPIC", {}, "198.51.100.9:1234")])
    assert views == []
    assert bad == 0
    tm = MessageExt("RMQ_SYS_TRACE_TOPIC", body, properties={}, born_host="198.51.100.9:1234")
    views, bad = trace_views(MSG_ID, [tm, MessageExt("X", b"\xff", properties={})])
    assert bad == 1  # not UTF-8
    assert [v.trace_type for v in views] == ["Pub", "SubBefore", "SubAfter"]  # by time
    sub = views[2]
    assert (sub.group_name, sub.status, sub.retry_times, sub.context_code) == ("CG", "failed", 2, 2)
    assert all(v.client_host == "198.51.100.9:1234" for v in views)
    assert [v.msg_type for v in views] == ["Normal_Msg", None, None]


class _Recorder:
    """Stands for the dispatcher's producer: records what it is asked to send."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[Message] = []
        self.fail = fail

    async def send(self, msg: Message, **kw: Any) -> None:
        if self.fail:
            raise RuntimeError("broker gone")
        self.sent.append(msg)


def _dispatcher(queue_size: int = 16, **kw: Any) -> TraceDispatcher:
    cfg = ClientConfig(namesrv_addr="127.0.0.1:1", enable_trace=True)
    d = TraceDispatcher(None, cfg, "PG", "PRODUCER", queue_size=queue_size, **kw)  # type: ignore[arg-type]
    return d


def test_append_never_waits_and_counts_drops() -> None:
    d = _dispatcher(queue_size=2)
    assert d.append(pub()) is False
    assert d.dropped == 1
    d._closed = False
    assert [d.append(pub()) for _ in range(5)] == [True, True, False, False, False]
    assert (d.appended, d.dropped) == (2, 4)
    assert d.group_name.startswith("_INNER_TRACE_PRODUCER-PG-PRODUCER-")


def _run_dispatcher(d: TraceDispatcher, rec: _Recorder, feed: Any) -> None:
    async def main() -> None:
        d._producer = rec  # type: ignore[assignment]
        d._closed = False
        async with trio.open_nursery() as n:
            n.start_soon(d._run)
            await feed(d)
            await d._send_ch.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_batches_flush_after_the_interval_and_on_close() -> None:
    rec = _Recorder()
    d = _dispatcher()

    async def feed(d: TraceDispatcher) -> None:
        d.append(pub())
        d.append(pub())
        await trio.sleep(d.flush_interval_s * 2)  # the first batch leaves on its timer
        assert len(rec.sent) == 1
        d.append(pub())

    _run_dispatcher(d, rec, feed)
    assert len(rec.sent) == 2  # the second on close
    first = rec.sent[0]
    assert first.topic == "RMQ_SYS_TRACE_TOPIC"
    assert first.body == (PUB_TEXT * 2).encode()
    assert first.keys == f"{MSG_ID} k1 k2"  # each key once
    assert (d.sent_records, d.sent_messages, d.failed_records) == (3, 2, 0)


def test_batches_split_by_size_and_key_length() -> None:
    rec = _Recorder()
    d = _dispatcher(queue_size=4096, max_batch_chars=len(PUB_TEXT) * 3)

    async def feed(d: TraceDispatcher) -> None:
        for _ in range(7):
            d.append(pub())

    _run_dispatcher(d, rec, feed)
    assert [len(m.body) for m in rec.sent] == [len(PUB_TEXT) * 3] * 2 + [len(PUB_TEXT)]

    rec = _Recorder()
    d = _dispatcher(queue_size=4096)
    n = 2 * MAX_BATCH_KEY_CHARS // (len(MSG_ID) + 1)

    async def feed_ids(d: TraceDispatcher) -> None:
        for i in range(n):
            c = pub()
            c.beans[0].msg_id, c.beans[0].keys = f"{MSG_ID[:-6]}{i:06d}", None
            d.append(c)

    _run_dispatcher(d, rec, feed_ids)
    assert len(rec.sent) >= 2
    assert all(len(m.keys or "") <= MAX_BATCH_KEY_CHARS for m in rec.sent)
    assert sum(len((m.keys or "").split()) for m in rec.sent) == n


def test_failed_trace_sends_are_counted() -> None:
    rec = _Recorder(fail=True)
    d = _dispatcher()

    async def feed(d: TraceDispatcher) -> None:
        d.append(pub())

    _run_dispatcher(d, rec, feed)
    assert (d.failed_records, d.sent_records) == (1, 0)


@pytest.mark.parametrize("topic", ["", "bad topic", "x" * 128])
def test_trace_topic_is_checked(topic: str) -> None:
    with pytest.raises(ValueError, match="trace_topic"):
        ClientConfig(trace_topic=topic)


def test_trace_group_names_stay_valid_group_names() -> None:
    assert trace_group_name("PG", "PRODUCER", 3) == "_INNER_TRACE_PRODUCER-PG-PRODUCER-3"
    long = trace_group_name("g" * 255, "CONSUMER", 12345)
    assert len(long) == MAX_TRACE_GROUP_LENGTH
    assert long.endswith("g-CONSUMER-12345")


def test_a_record_that_cannot_be_encoded_does_not_stop_the_writer() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    rec = _Recorder()
    d = _dispatcher()

    async def feed(d: TraceDispatcher) -> None:
        bad = pub()
        bad.beans[0].topic = Unprintable()  # type: ignore[assignment]
        d.append(bad)
        d.append(pub())

    _run_dispatcher(d, rec, feed)
    assert (d.failed_records, d.sent_records) == (1, 1)
    assert [m.body for m in rec.sent] == [PUB_TEXT.encode()]


def test_end_transaction_record_from_a_producer() -> None:
    from client.producer import Producer

    p = Producer("TPG", ClientConfig(namesrv_addr="127.0.0.1:1", enable_trace=True))
    d = _dispatcher()
    d._closed = False
    msg = Message("TxTopic", b"x", tags="TagT", keys="order-9")
    p._trace_end_transaction(msg, "M9", None, "TX9", "ROLLBACK_MESSAGE", False)  # not started
    assert d.appended == 0
    p._tracer = d
    p._trace_end_transaction(msg, "M9", "127.0.0.1:10911", "TX9", "ROLLBACK_MESSAGE", True)
    p._trace_end_transaction(Message("RMQ_SYS_TRACE_TOPIC", b"x"), "M", None, None, "UNKNOW", False)
    assert d.appended == 1
    ctx = d._recv_ch.receive_nowait()
    text = encode_context(ctx).data
    assert text == (
        "EndTransaction" + A + str(ctx.time_stamp) + A + "DefaultRegion" + A + "TPG" + A
        + "TxTopic" + A + "M9" + A + "TagT" + A + "order-9" + A + "127.0.0.1:10911" + A + "2"
        + A + "TX9" + A + "ROLLBACK_MESSAGE" + A + "true" + B
    )  # fmt: skip
    [back], bad = decode_trace_data(text)
    assert bad == 0
    assert back.beans[0].transaction_state == "ROLLBACK_MESSAGE"
    assert back.beans[0].from_transaction_check is True

"""The consumer's decoding (native, with the reference decoder as the only fallback), lazy
properties, process queue.

`decode_pull_body` must give exactly what the reference path gives
(`MessageExt.from_store` over `common.message.decode_records`) on every field, and raise the
same errors; the process queue must keep "commit the smallest offset in flight".
"""

from __future__ import annotations

import random
import struct
import zlib

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from client._api import PullResult, PullStatus, decode_messages
from client.config import ClientConfig
from client.consumer._base import _QueueState
from client.consumer.offset_store import RemoteOffsetStore
from client.consumer.process_queue import ProcessQueue
from client.consumer.push import ConsumeStatus, Listener, PushConsumer
from client.errors import MQClientError
from client.message import (
    MessageExt,
    MessageQueue,
    decode_pull_body,
    put_properties_lazily,
)
from common.message import (
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_ZLIB,
    NATIVE,
    RECORD_FIXED_STRUCTS,
    MessageDecodeError,
    MessageInner,
    decode_records,
    decode_records_into,
    encode_record,
)

FIELDS = (
    "topic",
    "body",
    "flag",
    "properties",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "store_size",
    "offset_msg_id",
    "broker_name",
    "msg_id",
    "tags",
    "keys",
    "uniq_key",
)


def _reference(body: bytes, broker: str = "b") -> list[MessageExt]:
    return [MessageExt.from_store(e, broker) for e in decode_records(body)]


def _assert_same(fast: list[MessageExt], ref: list[MessageExt]) -> None:
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref, strict=True):
        for f in FIELDS:
            assert getattr(a, f) == getattr(b, f), f
        assert type(a.body) is bytes
        assert a.user_properties() == b.user_properties()
        assert repr(a) == repr(b)


def _record(
    i: int,
    *,
    topic: str = "BenchTopic",
    body: bytes = b"hello",
    props: dict[str, str] | None = None,
    born: tuple[str, int] = ("192.0.2.5", 50000),
    store: tuple[str, int] = ("192.0.2.6", 10911),
    sys_flag: int = 0,
) -> bytes:
    msg = MessageInner(
        topic,
        body,
        queue_id=i % 4,
        flag=i,
        properties=props if props is not None else {"TAGS": "TagA", "UNIQ_KEY": f"U{i:031d}"},
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000 + i,
        born_host=born,
        store_host=store,
        reconsume_times=i % 3,
        prepared_transaction_offset=i * 7,
    )
    return bytes(encode_record(msg, 100 + i, 5000 + i * 300, 1_700_000_000_500 + i))


def _v2(rec: bytes) -> bytes:
    """The same record as a 5.x V2 record (2-byte topic length)."""
    (sys_flag,) = struct.unpack_from(">i", rec, 36)
    fixed = RECORD_FIXED_STRUCTS[sys_flag & 0x30].size
    (body_len,) = struct.unpack_from(">i", rec, fixed - 4)
    body_end = fixed + body_len
    topic_len = rec[body_end]
    out = bytearray(rec[:body_end] + struct.pack(">H", topic_len) + rec[body_end + 1 :])
    struct.pack_into(">iI", out, 0, len(out), 0xDAA320AB)
    return bytes(out)


def test_plain_batch_matches_reference_on_every_field() -> None:
    body = b"".join(_record(i, body=bytes([i]) * (i + 1)) for i in range(32))
    fast = decode_pull_body(body, "b")
    _assert_same(fast, _reference(body))
    assert [m.queue_offset for m in fast] == list(range(100, 132))
    assert fast[0].msg_id == "U" + "0" * 31  # the UNIQ_KEY wins over the offset id


def test_buffer_types_and_empty_body() -> None:
    body = b"".join(_record(i) for i in range(3))
    ref = _reference(body)
    _assert_same(decode_pull_body(bytearray(body), "b"), ref)
    _assert_same(decode_pull_body(memoryview(body), "b"), ref)
    assert decode_pull_body(b"") == []
    assert decode_messages(b"") == []


def test_odd_properties_hosts_v2_and_compressed_bodies() -> None:
    raw = b"compress me " * 50
    recs = [
        _record(0, props={}),  # no properties at all: offset id is the msg id
        _record(1, props={"KEYS": "k1 k2", "ünï": "çødé ✓", "a=b": "c:d;e", "TAGS": "τ"}),
        _record(2, born=("2001:db8::1", 1), store=("192.0.2.1", 2)),
        _record(3, born=("192.0.2.1", 1), store=("2001:db8::8a2e:370:7334", 10911)),
        _record(4, born=("::1", 1), store=("::1", 2)),
        _record(5, body=zlib.compress(raw), sys_flag=COMPRESSED_FLAG),
        _record(6, body=zlib.compress(raw), sys_flag=COMPRESSED_FLAG | COMPRESSION_ZLIB),
        _v2(_record(7)),
        _v2(_record(8, born=("::1", 1), store=("::1", 2))),
        _record(9, topic="%RETRY%cg", body=b""),
    ]
    body = b"".join(recs)
    fast = decode_pull_body(body, "b")
    _assert_same(fast, _reference(body))
    assert fast[0].msg_id == fast[0].offset_msg_id
    assert fast[1].properties["ünï"] == "çødé ✓"
    assert fast[3].store_host == "2001:db8::8a2e:370:7334:10911"
    assert len(fast[3].offset_msg_id) == 56
    assert fast[5].body == raw
    assert fast[9].topic == "%RETRY%cg"


def _error_of(fn: object, body: bytes) -> str | None:
    """The decode error's text, or None when `body` decodes."""
    assert callable(fn)
    try:
        fn(body)
    except MessageDecodeError as exc:
        return str(exc)
    return None


def test_truncated_and_corrupt_bodies_raise_the_reference_errors() -> None:
    good = _record(1) + _record(2)
    cases = [good[:cut] for cut in range(1, len(good))]
    bad_props = bytearray(_record(3, props={"KEYS": "abcd"}))
    bad_props[-1] = 0xFF  # not UTF-8
    bad_magic = bytearray(_record(4))
    struct.pack_into(">I", bad_magic, 4, 0x12345678)
    cases += [
        bytes(bad_props),
        bytes(bad_magic),
        _record(5, body=b"not zlib", sys_flag=COMPRESSED_FLAG),
        _record(6, body=b"x", sys_flag=COMPRESSED_FLAG | COMPRESSION_LZ4),
        b"\x00" * 200,
    ]
    raised = 0
    for body in cases:
        expected = _error_of(_reference, body)
        assert _error_of(decode_pull_body, body) == expected
        if expected is None:  # a cut at a record boundary is a valid body
            _assert_same(decode_pull_body(body, "b"), _reference(body))
            continue
        raised += 1
        with pytest.raises(MQClientError, match="bad message records"):
            decode_messages(body, "b")
    assert raised == len(cases) - 1


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5),
    props=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda s: "\x01" not in s and "\x02" not in s),
        st.text(min_size=1, max_size=12).filter(lambda s: "\x01" not in s and "\x02" not in s),
        max_size=4,
    ),
    body=st.binary(max_size=64),
)
def test_random_records_match_reference(n: int, props: dict[str, str], body: bytes) -> None:
    data = b"".join(_record(i, body=body, props=props) for i in range(n))
    _assert_same(decode_pull_body(data, "b"), _reference(data))


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
def test_native_decoder_gives_the_reference_messages() -> None:
    body = b"".join(
        [_record(i, body=bytes([i]) * i, topic=f"T{i % 3}") for i in range(40)]
        + [_v2(_record(40)), _record(41, props={}), _record(42, topic="%RETRY%cg", body=b"")]
    )
    native = decode_records_into(body, MessageExt, "b")
    assert native is not None  # the common case does not fall back
    assert all(type(m) is MessageExt for m in native)
    _assert_same(native, _reference(body))


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
@pytest.mark.parametrize(
    "rec",
    [
        _record(0, born=("2001:db8::1", 1)),
        _record(0, store=("::1", 2)),
        _record(0, body=zlib.compress(b"z" * 100), sys_flag=COMPRESSED_FLAG),
        _record(0, props={"KEYS": "ünï"}),
        _record(0)[:-1],
        b"\x00" * 200,
    ],
    ids=["v6-born", "v6-store", "compressed", "non-ascii-properties", "truncated", "zeros"],
)
def test_native_decoder_leaves_the_unusual_to_python(rec: bytes) -> None:
    body = _record(1) + rec + _record(2)
    assert decode_records_into(body, MessageExt, "b") is None
    assert _error_of(decode_pull_body, body) == _error_of(_reference, body)


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
def test_native_decoder_needs_the_plain_slots() -> None:
    class Loose:  # no __slots__: attributes in a __dict__
        pass

    class Partial:
        __slots__ = ("body", "topic")

    body = _record(0)
    assert decode_records_into(body, Loose, "b") is None
    assert decode_records_into(body, Partial, "b") is None


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
)
def test_corrupted_bodies_decode_as_the_reference_or_fail_as_it(
    edits: list[tuple[int, int]], cut: int
) -> None:
    """Random byte changes (lengths, magic, flags, text) and cuts: the native decoder must
    never accept what the reference rejects, crash, or read past the body."""
    good = bytearray(_record(1) + _v2(_record(2)) + _record(3, props={"KEYS": "a b"}))
    for pos, value in edits:
        good[pos % len(good)] = value
    body = bytes(good[: len(good) - cut % len(good)])
    expected = _error_of(_reference, body)
    assert _error_of(decode_pull_body, body) == expected
    if expected is None:
        _assert_same(decode_pull_body(body, "b"), _reference(body))


def test_properties_are_parsed_lazily_and_pending_ones_applied() -> None:
    msgs = decode_pull_body(b"".join(_record(i) for i in range(4)), "b")
    # Natively decoded messages parse their properties on first read; the reference decoder
    # (no accelerators) parses them at once. The stamps below work either way.
    lazy = NATIVE
    assert all(m._props is None for m in msgs) == lazy
    msgs[1].properties["X"] = "y"  # parsed before the stamps: set directly
    put_properties_lazily(msgs, (("MIN_OFFSET", "0"), ("MAX_OFFSET", "9")))
    put_properties_lazily(msgs[:3], (("CONSUME_START_TIME", "123"),))
    if lazy:
        assert msgs[0]._props is None
        assert msgs[0]._pending is msgs[2]._pending  # one merged tuple for the batch
    for i, m in enumerate(msgs):
        p = m.properties
        assert p["MIN_OFFSET"] == "0"
        assert p["MAX_OFFSET"] == "9"
        assert p["TAGS"] == "TagA"
        assert ("CONSUME_START_TIME" in p) == (i < 3)
    assert msgs[1].properties["X"] == "y"
    # Later stamps win over the stored value, as a dict assignment would.
    (m,) = decode_pull_body(_record(0, props={"MIN_OFFSET": "old"}), "b")
    put_properties_lazily([m], (("MIN_OFFSET", "new"),))
    assert m.properties["MIN_OFFSET"] == "new"
    m.properties = {"A": "b"}
    assert m.tags is None
    assert m.properties == {"A": "b"}


def test_lazy_fields_can_be_set() -> None:
    (m,) = decode_pull_body(_record(0), "b")
    m.born_host = "h:1"
    m.store_host = "s:2"
    m.offset_msg_id = "ID"
    assert (m.born_host, m.store_host, m.offset_msg_id) == ("h:1", "s:2", "ID")
    built = MessageExt("T", b"x", properties={"UNIQ_KEY": "u"}, offset_msg_id="o", born_host="b")
    assert (built.msg_id, built.offset_msg_id, built.born_host, built.store_host) == (
        "u",
        "o",
        "b",
        "",
    )


# --- process queue ---------------------------------------------------------------------------


def _m(off: int, size: int = 3) -> MessageExt:
    return MessageExt("T", b"x" * size, properties={}, queue_offset=off)


class _ModelQueue:
    """The reference semantics: a dict and min/max over it."""

    def __init__(self) -> None:
        self.msgs: dict[int, MessageExt] = {}
        self.top = -1

    def put(self, msgs: list[MessageExt]) -> int:
        added = 0
        for m in msgs:
            if m.queue_offset not in self.msgs:
                self.msgs[m.queue_offset] = m
                self.top = max(self.top, m.queue_offset)
                added += 1
        return added

    def remove(self, offs: list[int]) -> int:
        for o in offs:
            self.msgs.pop(o, None)
        return self.commit()

    def commit(self) -> int:
        if self.msgs:
            return min(self.msgs)
        return self.top + 1 if self.top >= 0 else -1


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 120), max_size=12)), max_size=40),
    seed=st.integers(0, 1000),
)
def test_process_queue_matches_model(ops: list[tuple[bool, list[int]]], seed: int) -> None:
    rnd = random.Random(seed)
    pq, model = ProcessQueue(), _ModelQueue()
    for is_put, offs in ops:
        if is_put:
            msgs = [_m(o, 1 + o % 5) for o in offs]
            assert pq.put_messages(msgs) == model.put(msgs)
        else:
            live = list(model.msgs)
            rnd.shuffle(live)
            chosen = live[: len(offs)] + offs[:2]  # some in flight, some not
            assert pq.remove([_m(o) for o in chosen]) == model.remove(chosen)
        assert pq.commit_offset() == model.commit()
        assert pq.msg_count == len(model.msgs) == len(pq)
        assert pq.msg_size == sum(len(m.body) for m in model.msgs.values())
        keys = sorted(model.msgs)
        assert pq.max_span() == (keys[-1] - keys[0] if keys else 0)
        assert [m.queue_offset for m in pq.take(5)] == keys[:5]
        assert pq.queue_offset_max == model.top


def test_process_queue_batch_remove_out_of_order_keeps_smallest() -> None:
    pq = ProcessQueue()
    batches = [[_m(o) for o in range(b * 32, b * 32 + 32)] for b in range(4)]
    for b in batches:
        pq.put_messages(b)
    # Batches finish out of order: the commit point waits for the oldest one.
    assert pq.remove(batches[2]) == 0
    assert pq.remove(batches[3]) == 0
    assert pq.max_span() == 63  # batches 0 and 1 still in flight
    assert pq.remove(batches[0]) == 32
    assert pq.remove(batches[1]) == 128
    assert pq.is_empty()
    assert pq.max_span() == 0
    # A re-pull of an old offset after everything was consumed is accepted again.
    assert pq.put_messages([_m(5)]) == 1
    assert pq.commit_offset() == 5


# --- push consumer: a consume batch end to end (no broker) -----------------------------------


class _NoBackend:
    async def fetch_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        return -1

    async def store_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        return None


def _pulled(n: int) -> list[MessageExt]:
    """`n` pulled messages of queue offsets 100, 101, ... (broker-a)."""
    return decode_pull_body(b"".join(_record(i) for i in range(n)), "broker-a")


def _push_consumer(concurrency: int, listener: Listener) -> PushConsumer:
    cfg = ClientConfig(consume_concurrency=concurrency, consume_message_batch_max_size=2)
    c = PushConsumer("cg_fast", cfg, listener=listener)
    c._offset_store = RemoteOffsetStore("cg_fast", _NoBackend())
    c._wants_context = False
    return c


def test_consume_batches_respect_concurrency_and_commit_smallest_in_flight() -> None:
    mq = MessageQueue("T", "broker-a", 0)
    running = [0, 0]  # now, max
    seen: list[dict[str, str]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        running[0] += 1
        running[1] = max(running[1], running[0])
        await trio.sleep(0.01 if msgs[0].queue_offset == 100 else 0)
        seen.extend(m.properties for m in msgs)
        running[0] -= 1
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = _push_consumer(2, listener)
        pq = ProcessQueue()
        msgs = _pulled(8)
        put_properties_lazily(msgs, (("MIN_OFFSET", "100"), ("MAX_OFFSET", "108")))
        pq.put_messages(msgs)
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            await c._deliver(mq, pq, msgs, False)  # four batches of two
            await trio.sleep(0.005)
            # The first batch (100-101) is still in the listener: nothing passes it.
            assert c.offset_store.table()[mq] == 100
            with trio.fail_after(5):
                await c._idle.wait()
            assert c._workers == 2  # the pool held the third and fourth batches
            nursery.cancel_scope.cancel()  # the idle workers
        assert running[1] == 2
        assert c.consumed_ok == 8
        assert pq.is_empty()
        assert c.offset_store.table()[mq] == 108
        assert all(p["MAX_OFFSET"] == "108" and "CONSUME_START_TIME" in p for p in seen)

    trio.run(main)


def test_consume_workers_are_reused_and_capped() -> None:
    """Batches go to a pool of worker tasks: one worker serves batches that come one at a
    time; at most `consume_concurrency` run, the rest wait their turn in order."""
    mq = MessageQueue("T", "broker-a", 0)
    order: list[int] = []
    gate = trio.Event()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].queue_offset >= 108:
            await gate.wait()
        order.append(msgs[0].queue_offset)
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = _push_consumer(3, listener)
        pq = ProcessQueue()
        msgs = _pulled(20)
        pq.put_messages(msgs)
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            for i in range(0, 8, 2):  # one batch at a time
                await c._deliver(mq, pq, msgs[i : i + 2], False)
                with trio.fail_after(5):
                    await c._idle.wait()
            assert c._workers == 1
            # Six batches at once, three held at the gate.
            await c._deliver(mq, pq, msgs[8:], False)
            await trio.testing.wait_all_tasks_blocked()
            assert c._workers == 3
            assert order == [100, 102, 104, 106]
            gate.set()
            with trio.fail_after(5):
                await c._idle.wait()
            nursery.cancel_scope.cancel()
        assert sorted(order[4:7]) == [108, 110, 112]  # the first three, released together
        assert sorted(order[7:]) == [114, 116, 118]  # then the queued ones
        assert c.offset_store.table()[mq] == 120

    trio.run(main)


def test_a_batch_retried_locally_waits_without_holding_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neither send-back path worked: the batch is offered again after the local retry delay,
    while the only worker goes on with the next batches."""
    monkeypatch.setattr("client.consumer.push.LOCAL_RETRY_DELAY_S", 0.05)
    mq = MessageQueue("T", "broker-a", 0)
    seen: list[tuple[int, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.append((msgs[0].queue_offset, msgs[0].reconsume_times))
        if [o for o, _ in seen] == [100]:  # the first time only
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    async def no_send_back(msg: MessageExt, delay_level: int) -> bool:
        return False

    async def main() -> None:
        c = _push_consumer(1, listener)
        c.send_message_back = no_send_back  # type: ignore[method-assign]
        pq = ProcessQueue()
        msgs = _pulled(4)
        pq.put_messages(msgs)
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            await c._deliver(mq, pq, msgs[:2], False)
            await trio.testing.wait_all_tasks_blocked()
            await c._deliver(mq, pq, msgs[2:], False)
            with trio.fail_after(5):
                await trio.testing.wait_all_tasks_blocked()
                # The worker was free for the next batch while the first one waits.
                assert [o for o, _ in seen] == [100, 102]
                assert c.offset_store.table()[mq] == 100  # the retried batch holds the offset
                await c._idle.wait()
            nursery.cancel_scope.cancel()
        assert [o for o, _ in seen] == [100, 102, 100]
        assert seen[2][1] == seen[0][1] + 1  # offered again with one more reconsume time
        assert c._workers == 1
        assert c.offset_store.table()[mq] == 104

    trio.run(main)


@pytest.mark.parametrize("caught_up", [True, False])
def test_a_caught_up_batch_reaches_its_listener_before_delivery_returns(caught_up: bool) -> None:
    """Caught up (the next pull is likely to be held), a batch handed to a parked worker
    runs its listener before `_deliver` returns, so before the pull loop sends its next pull;
    with a backlog `_deliver` returns at once and the next pull goes first. Either way it
    returns without waiting for a listener that blocks."""
    mq = MessageQueue("T", "broker-a", 0)
    order: list[str] = []
    gate = trio.Event()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        order.append(f"listener {msgs[0].queue_offset}")
        if msgs[0].queue_offset == 104:
            await gate.wait()
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = _push_consumer(2, listener)
        pq = ProcessQueue()
        msgs = _pulled(6)
        pq.put_messages(msgs)
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            await c._deliver(mq, pq, msgs[:2], False)  # starts a worker
            with trio.fail_after(5):
                await c._idle.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert c._idle_workers == 1
            order.clear()
            await c._deliver(mq, pq, msgs[2:4], caught_up)
            order.append("delivered")
            with trio.fail_after(5):
                await c._idle.wait()
            await trio.testing.wait_all_tasks_blocked()
            order.clear()
            with trio.fail_after(5):  # a listener that blocks does not hold delivery
                await c._deliver(mq, pq, msgs[4:], caught_up)
            order.append("delivered")
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
            with trio.fail_after(5):
                await c._idle.wait()
            nursery.cancel_scope.cancel()
        assert c.offset_store.table()[mq] == 106

    trio.run(main)
    if caught_up:
        assert order == ["listener 104", "delivered"]
    else:
        assert order == ["delivered", "listener 104"]


def test_the_pull_loop_tells_delivery_whether_the_queue_was_caught_up() -> None:
    """`caught_up` is true when the pull read up to the queue's max offset."""
    mq = MessageQueue("T", "broker-a", 0)
    msgs = _pulled(4)

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> list[bool]:
        c = _push_consumer(1, listener)
        st = _QueueState(ProcessQueue(), 100, trio.CancelScope())
        results = [
            PullResult(PullStatus.FOUND, 102, 0, 110, msgs[:2]),  # a backlog behind
            PullResult(PullStatus.FOUND, 104, 0, 104, msgs[2:]),  # read to the end
        ]
        seen: list[bool] = []

        async def pull_once(mq: MessageQueue, st: _QueueState) -> PullResult:
            if not results:
                st.pq.dropped = True  # ends the loop
                return PullResult(PullStatus.NO_NEW_MSG, st.next_offset, 0, 104, [])
            return results.pop(0)

        async def deliver(
            mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], caught_up: bool
        ) -> None:
            seen.append(caught_up)

        c._pull_once = pull_once  # type: ignore[method-assign]
        c._deliver = deliver  # type: ignore[method-assign]
        c._consume_here = lambda msgs: False  # type: ignore[method-assign]
        with trio.fail_after(5):
            await c._pull_loop(mq, st)
        return seen

    assert trio.run(main) == [False, True]


def test_a_caught_up_batch_is_consumed_by_the_pull_task_while_the_other_pulls() -> None:
    """A queue's two pull tasks take turns: the one that receives a caught-up batch runs
    its listener at once, before the next pull, which the other task sends. A listener that
    waits does not hold up pulling: the next caught-up batch, arriving while it waits, goes
    to a worker. With a backlog the batch goes to a worker too."""
    mq = MessageQueue("T", "broker-a", 0)
    msgs = _pulled(6)
    events: list[str] = []
    gate = trio.Event()

    ran_in: dict[int, str] = {}

    async def listener(batch: list[MessageExt]) -> ConsumeStatus:
        events.append(f"listener {batch[0].queue_offset}")
        ran_in[batch[0].queue_offset] = trio.lowlevel.current_task().name
        if batch[0].queue_offset == 100:
            await gate.wait()
            events.append("listener 100 done")
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = _push_consumer(4, listener)
        st = _QueueState(ProcessQueue(), 100, trio.CancelScope())
        results = [
            PullResult(PullStatus.FOUND, 102, 0, 102, msgs[:2]),  # caught up: consumed here
            PullResult(PullStatus.FOUND, 104, 0, 104, msgs[2:4]),  # caught up, 100 still waits
            PullResult(PullStatus.FOUND, 106, 0, 110, msgs[4:]),  # a backlog behind
        ]
        calls = [0]

        async def pull_once(mq: MessageQueue, st: _QueueState) -> PullResult:
            await trio.lowlevel.checkpoint()  # a pull waits for its answer
            calls[0] += 1
            events.append(f"pull {calls[0]}")
            if results:
                return results.pop(0)
            await gate.wait()
            await trio.testing.wait_all_tasks_blocked()
            st.pq.dropped = True  # ends the loop
            return PullResult(PullStatus.NO_NEW_MSG, st.next_offset, 0, 106, [])

        c._pull_once = pull_once  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            with trio.fail_after(5):
                nursery.start_soon(c._pull_loop, mq, st)
                await trio.testing.wait_all_tasks_blocked()
                # 100 ran at once, before the next pull, and waits in its listener; the
                # other task went on pulling meanwhile, and 102 and 104 went to workers.
                assert events[:3] == ["pull 1", "listener 100", "pull 2"]
                assert sorted(events[3:]) == ["listener 102", "listener 104", "pull 3", "pull 4"]
                gate.set()
                await c._idle.wait()
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()  # the idle workers
        assert events[-1] == "listener 100 done"
        # 100 ran in a pull task, 102 and 104 in workers.
        assert ran_in[100].endswith("._pull_turns")
        assert ran_in[102].endswith("._worker")
        assert ran_in[104].endswith("._worker")
        assert c.consumed_ok == 6
        assert c.offset_store.table()[mq] == 106

    trio.run(main)


def test_the_pull_turns_end_together() -> None:
    """The queue is dropped while one pull task consumes a batch: both tasks end."""
    mq = MessageQueue("T", "broker-a", 0)
    msgs = _pulled(2)
    gate = trio.Event()

    async def listener(batch: list[MessageExt]) -> ConsumeStatus:
        await gate.wait()
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = _push_consumer(2, listener)
        st = _QueueState(ProcessQueue(), 100, trio.CancelScope())
        first = [True]

        async def pull_once(mq: MessageQueue, st: _QueueState) -> PullResult:
            await trio.lowlevel.checkpoint()  # a pull waits for its answer
            if first:
                first.clear()
                return PullResult(PullStatus.FOUND, 102, 0, 102, msgs)
            st.pq.dropped = True  # rebalance took the queue
            return PullResult(PullStatus.NO_NEW_MSG, 102, 0, 102, [])

        c._pull_once = pull_once  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            with trio.fail_after(5):
                done = trio.Event()

                async def run() -> None:
                    await c._pull_loop(mq, st)
                    done.set()

                nursery.start_soon(run)
                await trio.testing.wait_all_tasks_blocked()
                assert not done.is_set()  # the listener still waits
                gate.set()
                await done.wait()
        assert c.consumed_ok == 2

    trio.run(main)


def test_listeners_in_pull_tasks_count_against_consume_concurrency() -> None:
    """Workers and listeners running in pull tasks together never exceed
    `consume_concurrency`: with two queues, caught-up batches on both and a backlog behind
    (every listener waits), at most two listeners run with a concurrency of two."""
    msgs = _pulled(12)
    running = [0, 0]  # now, max
    gate = trio.Event()
    stop = trio.Event()

    async def listener(batch: list[MessageExt]) -> ConsumeStatus:
        running[0] += 1
        running[1] = max(running[1], running[0])
        await gate.wait()
        running[0] -= 1
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = _push_consumer(2, listener)

        def results(q: int) -> list[PullResult]:
            base = 6 * q
            return [
                PullResult(PullStatus.FOUND, 102, 0, 102, msgs[base : base + 2]),  # caught up
                PullResult(PullStatus.FOUND, 104, 0, 110, msgs[base + 2 : base + 4]),  # backlog
                PullResult(PullStatus.FOUND, 106, 0, 110, msgs[base + 4 : base + 6]),
            ]

        pending = {0: results(0), 1: results(1)}

        async def pull_once(mq: MessageQueue, st: _QueueState) -> PullResult:
            await trio.lowlevel.checkpoint()
            if pending[mq.queue_id]:
                return pending[mq.queue_id].pop(0)
            await stop.wait()
            st.pq.dropped = True
            return PullResult(PullStatus.NO_NEW_MSG, st.next_offset, 0, 110, [])

        c._pull_once = pull_once  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            with trio.fail_after(5):
                for q in (0, 1):
                    st = _QueueState(ProcessQueue(), 100, trio.CancelScope())
                    nursery.start_soon(c._pull_loop, MessageQueue("T", "broker-a", q), st)
                await trio.testing.wait_all_tasks_blocked()
                assert running[1] == 2
                gate.set()
                await trio.testing.wait_all_tasks_blocked()
                await c._idle.wait()
                assert c.consumed_ok == 12  # the batches queued meanwhile got workers
                stop.set()
            nursery.cancel_scope.cancel()
        assert running[1] == 2

    trio.run(main)

"""`Producer.send_batch`'s one-pass batch encoder gives the bytes, ids and errors of the
reference path (`split_batch` + `encode_batch_body`), and `UniqKeyGenerator.next_many` the keys
of `next()`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest

from client.config import ClientConfig
from client.errors import MessageValidationError
from client.message import Message, encode_batch_chunks
from client.producer import Producer
from common.message import (
    PropertiesSizeExceededError,
    UniqKeyGenerator,
    decode_batch_body,
    decode_uniq_key,
    encode_batch_body,
)

T0 = 1_700_000_000.123  # a fixed wall clock (seconds)


def _clock(value: list[float]) -> Callable[[], float]:
    return lambda: value[0]


def _producer(max_message_size: int = 4 * 1024 * 1024, now: float = T0) -> Producer:
    cfg = ClientConfig(
        namesrv_addr="ns:1", client_ip="127.0.0.1", max_message_size=max_message_size
    )
    p = Producer("pg", cfg)
    p._uniq = UniqKeyGenerator("127.0.0.1", pid=77, seed=5, clock=_clock([now]))
    p._uniq._counter = 0xFFF0  # the counter starts at random: the same start for both paths
    return p


def _reference(p: Producer, msgs: list[Message]) -> list[tuple[bytes, str]]:
    """The pre-fast-path send_batch: split_batch, then encode_batch_body per chunk."""
    return [
        (
            encode_batch_body(item for _, item in chunk),
            ",".join(m.properties["UNIQ_KEY"] for m, _ in chunk),
        )
        for chunk in p.split_batch(msgs)
    ]


def _both(
    msgs: list[Message], max_message_size: int = 4 * 1024 * 1024
) -> tuple[list[tuple[bytes, str]], list[tuple[bytes, str]], list[Message], list[Message]]:
    fast_msgs, ref_msgs = copy.deepcopy(msgs), copy.deepcopy(msgs)
    fast = _producer(max_message_size)._batch_bodies(fast_msgs)
    ref = _reference(_producer(max_message_size), ref_msgs)
    return fast, ref, fast_msgs, ref_msgs


def _varied_batch() -> list[Message]:
    msgs = [
        Message("T", b"plain"),
        Message("T", b"tagged", tags="TagA"),
        Message("T", "ключ body", tags="Tag-ü", keys=["k1", "k2"], flag=7),
        Message("T", b"\x00" * 3000, properties={"user": "v", "empty": ""}),
        Message("T", b"x", keys="only-one"),
    ]
    preset = Message("T", b"has a key", tags="B")
    preset.properties["UNIQ_KEY"] = "7F00000100AB0000000100000000000A"
    msgs.insert(2, preset)
    return msgs


def test_fast_path_bytes_ids_and_message_keys_equal_the_reference() -> None:
    fast, ref, fast_msgs, ref_msgs = _both(_varied_batch())
    assert fast == ref
    assert [m.properties for m in fast_msgs] == [m.properties for m in ref_msgs]
    # Key order inside each message's properties (the encoded order) is the reference's too.
    assert [list(m.properties) for m in fast_msgs] == [list(m.properties) for m in ref_msgs]
    assert len(fast) == 1
    items = decode_batch_body(fast[0][0])
    assert [i.body for i in items] == [m.body for m in fast_msgs]
    assert fast[0][1].split(",")[2] == "7F00000100AB0000000100000000000A"


def test_wait_false_batches_and_many_messages_match() -> None:
    msgs = [Message("T", bytes([i]) * (i + 1), wait_store_msg_ok=False) for i in range(64)]
    fast, ref, _, _ = _both(msgs)
    assert fast == ref


@pytest.mark.parametrize("limit", [200, 500, 1100, 5000])
def test_splitting_at_the_size_limit_matches(limit: int) -> None:
    msgs = [Message("T", b"y" * (17 * i % 120 + 1), tags="t") for i in range(40)]
    fast, ref, _, _ = _both(msgs, max_message_size=limit)
    assert fast == ref
    assert len(fast) >= (1 if limit >= 5000 else 2)


def test_batch_bodies_are_never_compressed_as_before() -> None:
    """Single sends compress bodies over `compress_over`; batches never did (nor does Java's
    MessageBatch): the body bytes go out as given, sys_flag 0."""
    msgs = [Message("T", b"compressible " * 1000, tags="z") for _ in range(3)]
    fast_msgs, ref_msgs = copy.deepcopy(msgs), copy.deepcopy(msgs)
    fast_p, ref_p = _producer(), _producer()
    for p in (fast_p, ref_p):
        p.config = p.config.model_copy(update={"compress_over": 16})
    fast = fast_p._batch_bodies(fast_msgs)
    assert fast == _reference(ref_p, ref_msgs)
    assert [i.body for i in decode_batch_body(fast[0][0])] == [m.body for m in msgs]


def test_non_str_property_values_take_the_reference_path() -> None:
    msgs = [Message("T", b"a", tags="x"), Message("T", b"b")]
    msgs[1].properties["nothing"] = None  # type: ignore[assignment]  # skipped by the encoder
    msgs[1].properties["number"] = 5  # type: ignore[assignment]  # formatted as text
    fast, ref, _, _ = _both(msgs)
    assert fast == ref
    assert "number\x015" in decode_batch_body(fast[0][0])[1].properties
    # The direct encoder itself hands such a batch back.
    assert encode_batch_chunks(copy.deepcopy(msgs), iter(["K"] * 2), 1 << 20) is None


def test_oversized_properties_raise_as_before() -> None:
    msgs = [Message("T", b"a", properties={"big": "v" * 40000})]
    with pytest.raises(PropertiesSizeExceededError):
        _producer()._batch_bodies(copy.deepcopy(msgs))
    with pytest.raises(PropertiesSizeExceededError):
        _reference(_producer(), copy.deepcopy(msgs))


def _error(fn: Callable[[], object]) -> str:
    with pytest.raises(MessageValidationError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize(
    "build",
    [
        list,
        lambda: [Message("A", b"1"), Message("B", b"2")],
        lambda: [Message("A", b"1"), Message("A", b"2", delay_time_level=2)],
        lambda: [Message("%RETRY%g", b"1")],
        lambda: [Message("A", b"1"), Message("A", b"2", wait_store_msg_ok=False)],
        lambda: [Message("A", b"1"), Message("A", b"")],
        lambda: [Message("bad topic!", b"1")],
        lambda: [Message("TBW102", b"1")],
        lambda: [Message("SCHEDULE_TOPIC_XXXX", b"1")],
        lambda: [Message("A", b"1"), Message("A", b"z" * 2000)],
        lambda: [Message("A", b"z" * 990)],  # body fits, the item (with overhead) does not
    ],
)
def test_rule_violations_raise_the_reference_error(build: Callable[[], list[Message]]) -> None:
    fast = _error(lambda: _producer(1000)._batch_bodies(build()))
    ref = _error(lambda: _reference(_producer(1000), build()))
    assert fast == ref


def _keys_one_by_one(gen: UniqKeyGenerator, n: int) -> list[str]:
    return [gen.next() for _ in range(n)]


@pytest.mark.parametrize("first", [0, 1, 31, 65_500, 65_535, 65_536])
@pytest.mark.parametrize("n", [1, 32, 100])
def test_next_many_equals_next_called_n_times(first: int, n: int) -> None:
    now = [T0]
    one = UniqKeyGenerator("127.0.0.1", pid=9, seed=3, clock=_clock(now))
    many = UniqKeyGenerator("127.0.0.1", pid=9, seed=3, clock=_clock(now))
    many._counter = one._counter = 0xFFF0  # the 16-bit counter wraps inside the batch
    # `first` keys in this millisecond already (crossing the 65,536 per ms bound for some).
    assert _keys_one_by_one(one, first) == many.next_many(first)
    assert _keys_one_by_one(one, n) == many.next_many(n)
    now[0] += 0.005  # a later millisecond, then the same one again
    assert _keys_one_by_one(one, n) == many.next_many(n)
    assert _keys_one_by_one(one, 3) == many.next_many(3)


def test_next_many_keys_are_unique_and_decode() -> None:
    gen = UniqKeyGenerator("127.0.0.1", pid=9, seed=3, clock=_clock([T0]))
    keys = gen.next_many(70_000) + gen.next_many(5)
    assert len(set(keys)) == len(keys)
    ip, pid, _t, _c = decode_uniq_key(keys[-1])
    assert (ip, pid) == ("127.0.0.1", 9)


def test_next_many_across_a_month_boundary() -> None:
    now = [T0]
    one = UniqKeyGenerator("127.0.0.1", pid=9, seed=3, clock=_clock(now))
    many = UniqKeyGenerator("127.0.0.1", pid=9, seed=3, clock=_clock(now))
    many._counter = one._counter = 7
    assert _keys_one_by_one(one, 4) == many.next_many(4)
    now[0] += 40 * 86400  # next month: the time field restarts from the month's start
    assert _keys_one_by_one(one, 4) == many.next_many(4)


def test_keys_come_from_the_iterator_only_for_messages_without_one() -> None:
    msgs = [Message("T", b"a"), Message("T", b"b"), Message("T", b"c")]
    msgs[1].properties["UNIQ_KEY"] = "PRESET"
    keys: Iterator[str] = iter(["K1", "K2"])
    chunks = encode_batch_chunks(msgs, keys, 1 << 20)
    assert chunks is not None
    assert chunks[0][1] == "K1,PRESET,K2"
    assert next(keys, None) is None

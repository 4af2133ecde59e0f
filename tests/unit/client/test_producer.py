"""Producer logic that runs before any network call: validation, ids, compression, batches."""

from __future__ import annotations

import zlib

import pytest

from client.config import ClientConfig
from client.errors import ClientClosedError, MessageValidationError
from client.message import Message, MessageQueue
from client.producer import Producer, select_by_hash
from common.message import decode_batch_body, decode_properties


def _producer(**cfg: object) -> Producer:
    return Producer("pg", ClientConfig(namesrv_addr="127.0.0.1:1", **cfg))  # type: ignore[arg-type]


def test_prepare_sets_uniq_key_and_compresses_big_bodies() -> None:
    p = _producer()
    msg = Message("T", b"x" * 100, tags="A")
    body, sys_flag, properties, uniq = p._prepare(msg)
    assert sys_flag == 0
    assert body == b"x" * 100
    assert len(uniq) == 32
    assert msg.properties["UNIQ_KEY"] == uniq
    assert decode_properties(properties) == {"TAGS": "A", "UNIQ_KEY": uniq}
    big_body = b"abcd" * 2000
    big = p._prepare(Message("T", big_body))
    assert big[1] == 0x1 | 0x300
    assert zlib.decompress(big[0]) == big_body
    assert big[3] != uniq


def test_prepare_keeps_a_given_uniq_key_and_flags_prepared_transactions() -> None:
    p = _producer()
    msg = Message("T", b"x", properties={"k": "v"})
    msg.properties["UNIQ_KEY"] = "ABC"
    msg.properties["TRAN_MSG"] = "true"
    _, sys_flag, properties, uniq = p._prepare(msg)
    assert uniq == "ABC"
    assert sys_flag == 0x4  # TRANSACTION_PREPARED_TYPE
    assert decode_properties(properties) == {"k": "v", "UNIQ_KEY": "ABC", "TRAN_MSG": "true"}


def test_compression_threshold_is_configurable() -> None:
    p = _producer(compress_over=10_000)
    assert p._prepare(Message("T", b"a" * 5000))[1] == 0


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (Message("T", b""), "body length is zero"),
        (Message("T", b"x" * 101), "over max value"),
        (Message("T", b"x", delay_time_level=19), "out of range"),
        (Message("TBW102", b"x"), "AUTO_CREATE_TOPIC_KEY_TOPIC"),
        (Message("SCHEDULE_TOPIC_XXXX", b"x"), "forbidden"),
        (Message("bad topic", b"x"), "illegal characters"),
    ],
)
def test_prepare_checks_every_message_also_after_its_topic_passed(msg: Message, error: str) -> None:
    """The topic checks run once per topic; the other checks on every message."""
    p = _producer(max_message_size=100)
    try:
        p._prepare(Message(msg.topic, b"ok"))  # the topic passes (and is cached), or not
    except MessageValidationError:
        pass
    for _ in range(2):
        with pytest.raises(MessageValidationError, match=error):
            p._prepare(msg)
    assert "UNIQ_KEY" not in msg.properties  # nothing set on a refused message


def test_prepare_accepts_a_valid_delay_level_on_a_known_topic() -> None:
    p = _producer()
    p._prepare(Message("T", b"ok"))
    _, _, properties, _ = p._prepare(Message("T", b"x", delay_time_level=3))
    assert decode_properties(properties)["DELAY"] == "3"


def test_topic_cache_is_bounded() -> None:
    p = _producer()
    for i in range(3000):
        p._prepare(Message(f"T{i}", b"x"))
    assert 0 < len(p._send_topics) <= 1024


async def test_validation_happens_before_any_network_call() -> None:
    p = _producer()  # never started: a network call would raise ClientClosedError
    with pytest.raises(MessageValidationError):
        await p.send(Message("bad topic!", b"x"))
    with pytest.raises(MessageValidationError):
        await p.send(Message("T", b""))
    with pytest.raises(MessageValidationError):
        await p.send(Message("T", b"x" * (4 * 1024 * 1024 + 1)))
    with pytest.raises(ClientClosedError):
        await p.send(Message("T", b"x"))


def test_batch_rules() -> None:
    p = _producer()
    with pytest.raises(MessageValidationError, match="same"):
        p.split_batch([Message("A", b"1"), Message("B", b"2")])
    with pytest.raises(MessageValidationError, match="Delay"):
        p.split_batch([Message("A", b"1", delay_time_level=2)])
    with pytest.raises(MessageValidationError, match="Retry"):
        p.split_batch([Message("%RETRY%g", b"1")])
    with pytest.raises(MessageValidationError, match="empty"):
        p.split_batch([])


def test_batch_split_by_size() -> None:
    p = _producer(max_message_size=1000)
    msgs = [Message("T", bytes([65 + i]) * 300) for i in range(7)]
    chunks = p.split_batch(msgs)
    # Three 300-byte bodies (plus ~80 bytes of overhead and properties each) exceed 1000.
    assert [len(c) for c in chunks] == [2, 2, 2, 1]
    flat = [m for c in chunks for m, _ in c]
    assert flat == msgs
    from common.message import encode_batch_body

    for chunk in chunks:
        body = encode_batch_body(item for _, item in chunk)
        assert len(body) <= 1000
        decoded = decode_batch_body(body)
        assert [d.body for d in decoded] == [m.body for m, _ in chunk]
    uniq = {m.uniq_key for m in msgs}
    assert len(uniq) == 7
    assert None not in uniq
    with pytest.raises(MessageValidationError, match="over the limit"):
        p.split_batch([Message("T", b"x" * 999)])


def test_select_by_hash_is_stable_and_java_compatible() -> None:
    mqs = [MessageQueue("T", "b", i) for i in range(8)]
    m = Message("T", b"x")
    assert select_by_hash(mqs, m, "order-1") == select_by_hash(mqs, m, "order-1")
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE; Java: |MIN % 8| = 0.
    assert select_by_hash(mqs, m, "polygenelubricants").queue_id == 0
    # "TagA".hashCode() == 2598919; 2598919 % 8 == 7.
    assert select_by_hash(mqs, m, "TagA").queue_id == 7
    spread = {select_by_hash(mqs, m, f"k{i}").queue_id for i in range(200)}
    assert len(spread) == 8

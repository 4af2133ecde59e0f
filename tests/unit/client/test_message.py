"""Message building and validation, and the subscription expression parser."""

from __future__ import annotations

import zlib

import pytest

from client.errors import MessageValidationError
from client.filter import parse_subscription
from client.message import (
    Message,
    MessageExt,
    MessageQueue,
    check_topic,
    validate_message,
)
from common.message import java_string_hash

MAX = 4 * 1024 * 1024


def test_message_properties() -> None:
    m = Message("T", "hi", tags="TagA", keys=["k1", "k2"], delay_time_level=3)
    assert m.body == b"hi"
    assert m.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "DELAY": "3"}
    assert m.key_list == ["k1", "k2"]
    assert m.wait_store_msg_ok
    m.put_user_property("color", "red")
    assert m.user_properties() == {"color": "red"}
    with pytest.raises(MessageValidationError, match="used by system"):
        m.put_user_property("UNIQ_KEY", "x")
    m.tags = None
    assert m.tags is None


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("", "blank"),
        ("a" * 128, "longer"),
        ("bad topic", "illegal"),
        ("TBW102", "conflict"),
    ],
)
def test_topic_rules(topic: str, reason: str) -> None:
    with pytest.raises(MessageValidationError, match=reason):
        check_topic(topic)


@pytest.mark.parametrize(
    "body", [b"ab\xff", bytearray(b"ab\xff"), memoryview(b"ab\xff"), "ab\u00ff"]
)
def test_message_body_is_always_bytes(body: bytes | bytearray | memoryview | str) -> None:
    m = Message("T", body)
    assert type(m.body) is bytes
    assert m.body == (body.encode() if isinstance(body, str) else bytes(body))
    if isinstance(body, bytearray):
        body[0] = 0  # a copy, not a view of the caller's buffer
        assert m.body[0] == ord("a")


def test_topic_rules_accept() -> None:
    check_topic("a" * 127)
    check_topic("%RETRY%group-1_x|y")


def test_validate_message() -> None:
    validate_message(Message("T", b"x"), MAX)
    with pytest.raises(MessageValidationError, match="zero"):
        validate_message(Message("T", b""), MAX)
    with pytest.raises(MessageValidationError, match="over max"):
        validate_message(Message("T", b"x" * (MAX + 1)), MAX)
    with pytest.raises(MessageValidationError, match="forbidden"):
        validate_message(Message("SCHEDULE_TOPIC_XXXX", b"x"), MAX)
    with pytest.raises(MessageValidationError, match="delay level"):
        validate_message(Message("T", b"x", delay_time_level=19), MAX)


def test_message_ext_ids() -> None:
    ext = MessageExt(
        "T",
        b"x",
        properties={"UNIQ_KEY": "AB" * 16},
        offset_msg_id="7F00000100002A9F0000000000000000",
        broker_name="b",
        queue_id=2,
    )
    assert ext.msg_id == "AB" * 16
    assert ext.message_queue == MessageQueue("T", "b", 2)
    ext.properties.clear()
    assert ext.msg_id == "7F00000100002A9F0000000000000000"


def test_java_string_hash() -> None:
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("") == 0
    # Overflow to negative, as Java's int does.
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("\u00e9t\u00e9") == 0xE9 * 961 + ord("t") * 31 + 0xE9


def test_parse_subscription() -> None:
    s = parse_subscription("T", "TagA || TagB ||TagA")
    assert s.tags_set == ["TagA", "TagB"]
    assert s.code_set == [2598919, java_string_hash("TagB")]
    assert s.match_tags("TagB")
    assert not s.match_tags("TagC")
    assert not s.match_tags(None)
    every = parse_subscription("T", "*")
    assert every.sub_string == "*"
    assert every.match_tags(None)
    assert parse_subscription("T", None).matches_all
    with pytest.raises(ValueError, match="no tag"):
        parse_subscription("T", "||")


def test_message_ext_from_store_record() -> None:
    from common.message import MessageInner, decode_records, encode_record

    raw = b"payload " * 1000
    inner = MessageInner(
        "T",
        zlib.compress(raw),
        queue_id=1,
        properties={"TAGS": "TagA", "UNIQ_KEY": "CD" * 16, "KEYS": "k1 k2"},
        sys_flag=0x1 | 0x300,
        born_host=("192.0.2.7", 5000),
        store_host=("127.0.0.1", 10911),
    )
    rec = encode_record(inner, queue_offset=7, physical_offset=1234, store_timestamp=99)
    (ext,) = decode_records(bytes(rec))
    m = MessageExt.from_store(ext, "broker-a")
    assert m.body == raw
    assert m.tags == "TagA"
    assert m.key_list == ["k1", "k2"]
    assert m.msg_id == "CD" * 16
    assert m.offset_msg_id == "7F00000100002A9F00000000000004D2"
    assert m.queue_offset == 7
    assert m.commit_log_offset == 1234
    assert m.born_host == "192.0.2.7:5000"
    assert m.message_queue == MessageQueue("T", "broker-a", 1)

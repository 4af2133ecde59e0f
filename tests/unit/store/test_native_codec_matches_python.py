"""common.speedups against the pure-Python reference in common.message, byte for byte.

Skipped when the extension is not built. Both implementations are called directly (whatever
TRIMQ_NO_NATIVE says), so these tests run the same with and without it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import message as m
from common.message import (
    BatchItem,
    EncodedRecords,
    MessageDecodeError,
    MessageEncodeError,
    MessageInner,
    PropertiesSizeExceededError,
)

sp = pytest.importorskip("common.speedups")

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def native_encode(msgs: list[MessageInner]) -> EncodedRecords:
    buf, sizes, ts, host = sp.encode_records(
        msgs, m._pack_ip, MessageEncodeError, PropertiesSizeExceededError
    )
    return EncodedRecords(buf, sizes, ts, host)


def same_outcome(f: Callable[[], Any], g: Callable[[], Any]) -> Any:
    """Run both; they must return equal values or raise the same exception type."""
    try:
        a = f()
    except Exception as exc:
        with pytest.raises(type(exc)):
            g()
        return None
    b = g()
    assert a == b
    return a


# ------------------------------------------------------------------ crc32 / hashes
@SETTINGS
@given(st.binary(max_size=3000), st.integers(0, 0xFFFFFFFF))
def test_crc32_matches_zlib(data: bytes, start: int) -> None:
    assert sp.crc32(data, start) == zlib.crc32(data, start)
    assert sp.crc32(data) == zlib.crc32(data)


def test_crc32_large_and_views() -> None:
    data = bytes(range(256)) * 1000 + b"tail"
    assert sp.crc32(data) == zlib.crc32(data)
    assert sp.crc32(memoryview(data)[3:-5]) == zlib.crc32(data[3:-5])
    assert sp.crc32(bytearray(data[:100])) == zlib.crc32(data[:100])
    with pytest.raises(TypeError):
        sp.crc32("text")


@SETTINGS
@given(st.text(max_size=300))
def test_java_string_hash(s: str) -> None:
    assert sp.java_string_hash(s) == m._py_java_string_hash(s)


def test_java_string_hash_known_values() -> None:
    assert sp.java_string_hash("") == 0
    assert sp.java_string_hash("hello") == 99162322
    assert sp.java_string_hash("\U0001f600") == m._py_java_string_hash("\U0001f600")
    assert sp.java_string_hash("\ud800x") == m._py_java_string_hash("\ud800x")
    with pytest.raises(TypeError):
        sp.java_string_hash(b"x")


@SETTINGS
@given(st.text(max_size=40), st.text(max_size=80))
def test_key_hash2(prefix: str, key: str) -> None:
    from store.index_file import _abs32

    assert sp.key_hash2(prefix, key) == _abs32(m._py_java_string_hash(prefix + key))


# ------------------------------------------------------------------ properties
_prop_text = st.text(alphabet=st.sampled_from("ab\x01\x02é€\U0001f600 "), max_size=60)


@SETTINGS
@given(_prop_text)
def test_decode_properties(text: str) -> None:
    a = m._py_decode_properties(text)
    b = sp.decode_properties(text)
    assert a == b
    assert list(a) == list(b)  # same order too


# ------------------------------------------------------------------ encode_records
_hosts = st.sampled_from([("127.0.0.1", 0), ("192.0.2.3", 10911), ("::1", 5), ("fe80::1:2", 65535)])
_ascii = st.text(alphabet="abcXYZ_-%0123456789", min_size=1, max_size=20)


@st.composite
def _messages(draw: st.DrawFn) -> MessageInner:
    props = draw(st.dictionaries(_ascii, st.text(min_size=1, max_size=20), max_size=4))
    msg = MessageInner(
        draw(st.sampled_from(["T", "TopicA", "%RETRY%g", "тема"])),
        draw(st.binary(max_size=300)),
        queue_id=draw(st.integers(-(2**31), 2**31 - 1)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        properties=props,
        sys_flag=draw(st.sampled_from([0, 1, 2, 4, 8, 0xC, 0x10, 0x30, 0x80])),
        born_timestamp=draw(st.integers(-(2**63), 2**63 - 1)),
        born_host=draw(_hosts),
        store_host=draw(_hosts),
        reconsume_times=draw(st.integers(0, 100)),
        prepared_transaction_offset=draw(st.integers(0, 2**40)),
    )
    if draw(st.booleans()):
        msg.encoded_properties()
    return msg


def _check_same(msgs: list[MessageInner]) -> None:
    a = m._py_encode_records(msgs)
    b = native_encode(msgs)
    assert bytes(a.buf) == bytes(b.buf)
    assert type(b.buf) is bytearray
    assert a.sizes == b.sizes
    assert a.ts_positions == b.ts_positions
    assert a.store_host == b.store_host


@SETTINGS
@given(st.lists(_messages(), max_size=6))
def test_encode_records_equivalent(msgs: list[MessageInner]) -> None:
    _check_same(msgs)


@SETTINGS
@given(_messages(), st.integers(1, 5))
def test_encode_records_batch_of_one_message(msg: MessageInner, n: int) -> None:
    _check_same([msg] * n)
    assert bytes(native_encode([msg]).buf) == bytes(m.encode_record_template(msg))


def test_encode_records_sets_properties_string() -> None:
    msg = MessageInner("T", b"x", properties={"A": "1", "B": "2"})
    native_encode([msg])
    assert msg.properties_string == "A\x011\x02B\x012"


@pytest.mark.parametrize(
    ("change", "exc"),
    [
        ({"topic": "t" * 128}, MessageEncodeError),
        ({"topic": "é" * 64}, MessageEncodeError),
        ({"properties_string": "x" * 32768}, PropertiesSizeExceededError),
        ({"properties_string": "é" * 16384}, PropertiesSizeExceededError),
        ({"queue_id": 2**31}, MessageEncodeError),
        ({"flag": -(2**31) - 1}, MessageEncodeError),
        ({"born_timestamp": 2**63}, MessageEncodeError),
        ({"reconsume_times": 2**31}, MessageEncodeError),
        ({"prepared_transaction_offset": -(2**63) - 1}, MessageEncodeError),
        ({"born_host": ("127.0.0.1", 2**31)}, MessageEncodeError),
        ({"store_host": ("not-an-ip", 1)}, MessageEncodeError),
        ({"queue_id": "3"}, MessageEncodeError),
        ({"body": "text"}, TypeError),
        ({"sys_flag": 2**40}, MessageEncodeError),
    ],
)
def test_encode_records_errors(change: dict[str, Any], exc: type[Exception]) -> None:
    good = MessageInner("T", b"body", properties={"K": "v"})
    bad = MessageInner("T", b"body", properties={"K": "v"})
    for k, v in change.items():
        setattr(bad, k, v)
    for msgs in ([bad], [good, bad], [bad, good]):
        with pytest.raises(exc):
            m._py_encode_records(msgs)
        with pytest.raises(exc):
            native_encode(msgs)


def test_encode_records_edge_sizes() -> None:
    # exactly at the limits: accepted by both
    msg = MessageInner("t" * 127, b"", properties_string="x" * 32767)
    _check_same([msg])
    _check_same([])


# ------------------------------------------------------------------ patch_records
@SETTINGS
@given(
    st.lists(_messages(), min_size=1, max_size=6),
    st.integers(0, 2**40),
    st.integers(0, 2**50),
    st.integers(0, 2**45),
    st.data(),
)
def test_patch_records_equivalent(
    msgs: list[MessageInner], qo: int, phy: int, ts: int, data: st.DataObject
) -> None:
    a = m._py_encode_records(msgs)
    b = native_encode(msgs)
    n = len(msgs)
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    pos = sum(a.sizes[:start])
    out_a: list[int] = [7]
    out_b: list[int] = [7]
    m._py_patch_records(a, start, stop, pos, qo, phy, ts, out_a)
    sp.patch_records(b.buf, b.sizes, b.ts_positions, start, stop, pos, qo, phy, ts, out_b)
    assert bytes(a.buf) == bytes(b.buf)
    assert out_a == out_b


def test_patch_records_checks_bounds() -> None:
    rec = native_encode([MessageInner("T", b"abc")])
    with pytest.raises(struct.error):  # as pack_into beyond the buffer in the Python version
        m._py_patch_records(rec, 0, 1, len(rec.buf) - 40, 0, 0, 0, [])
    with pytest.raises(struct.error):
        sp.patch_records(rec.buf, [len(rec.buf)], None, 0, 1, len(rec.buf) - 40, 0, 0, 0, [])
    with pytest.raises(IndexError):
        sp.patch_records(rec.buf, rec.sizes, None, 0, 2, 0, 0, 0, 0, [])
    with pytest.raises(TypeError):
        sp.patch_records(bytes(rec.buf), rec.sizes, None, 0, 1, 0, 0, 0, 0, [])


# ------------------------------------------------------------------ message ids / units
@SETTINGS
@given(st.lists(st.integers(0, 2**63 - 1), max_size=10), _hosts)
def test_offset_msg_ids(phys: list[int], host: tuple[str, int]) -> None:
    head = m.create_offset_msg_id(host, 0)[:-16]
    assert sp.offset_msg_ids(head, phys) == [m.create_offset_msg_id(host, p) for p in phys]


def test_offset_msg_ids_rejects_negative() -> None:
    with pytest.raises(ValueError):
        sp.offset_msg_ids("AB", [-1])


_UNIT = struct.Struct(">qiq")


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(-(2**63), 2**63 - 1),
        ),
        max_size=40,
    )
)
def test_pack_cq_units(units: list[tuple[int, int, int]]) -> None:
    phys = [u[0] for u in units]
    sizes = [u[1] for u in units]
    tags = [u[2] for u in units]
    assert sp.pack_cq_units(phys, sizes, tags) == b"".join(map(_UNIT.pack, phys, sizes, tags))


@pytest.mark.parametrize(
    ("phys", "sizes", "tags"),
    [([0], [2**31], [0]), ([2**63], [0], [0]), ([0], [0], [-(2**63) - 1]), ([0], ["1"], [0])],
)
def test_pack_cq_units_bad_fields(phys: list[Any], sizes: list[Any], tags: list[Any]) -> None:
    with pytest.raises(struct.error):
        b"".join(map(_UNIT.pack, phys, sizes, tags))
    with pytest.raises(struct.error):
        sp.pack_cq_units(phys, sizes, tags)


# ------------------------------------------------------------------ SEND_BATCH body
_items = st.lists(
    st.builds(
        BatchItem,
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=100),
        st.text(max_size=40),
    ),
    max_size=8,
)


def native_decode_batch(body: m.Buffer) -> list[BatchItem]:
    items: list[BatchItem] = sp.decode_batch_body(body, BatchItem, MessageDecodeError)
    return items


@SETTINGS
@given(_items)
def test_decode_batch_body_equivalent(items: list[BatchItem]) -> None:
    body = m.encode_batch_body(items)
    a = m._py_decode_batch_body(body)
    b = native_decode_batch(body)
    assert a == b == items
    assert all(type(x) is BatchItem for x in b)
    assert native_decode_batch(bytearray(body)) == a
    assert native_decode_batch(memoryview(body)) == a


@SETTINGS
@given(_items, st.data())
def test_decode_batch_body_truncated_or_corrupt(
    items: list[BatchItem], data: st.DataObject
) -> None:
    body = bytearray(m.encode_batch_body(items))
    if body:
        if data.draw(st.booleans()):
            body = body[: data.draw(st.integers(0, len(body) - 1))]
        else:
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] = data.draw(st.integers(0, 255))
    same_outcome(
        lambda: m._py_decode_batch_body(bytes(body)), lambda: native_decode_batch(bytes(body))
    )


@pytest.mark.parametrize(
    "body",
    [
        b"\x00" * 21,
        struct.pack(">iiiii", 22, 0, 0, 0, -1) + b"\x00\x00",
        struct.pack(">iiiii", 23, 0, 0, 0, 0) + b"\x00\x00",
        struct.pack(">iiiii", 22, 0, 0, 0, 0) + b"\xff\xff",
        struct.pack(">iiiii", 24, 0, 0, 0, 0) + b"\x00\x02\xff\xfe",
        struct.pack(">iiiii", 30, 0, 0, 0, 100) + b"\x00\x00",
        struct.pack(">iiiii", 2**31 - 1, 0, 0, 0, 2**31 - 30) + b"\x00\x00",
    ],
)
def test_decode_batch_body_errors(body: bytes) -> None:
    with pytest.raises(MessageDecodeError):
        m._py_decode_batch_body(body)
    with pytest.raises(MessageDecodeError):
        native_decode_batch(body)


def test_public_names_follow_the_switch() -> None:
    if m.NATIVE:
        assert m.decode_properties is sp.decode_properties
        assert m.java_string_hash is sp.java_string_hash
    else:
        assert m.decode_properties is m._py_decode_properties
        assert m.encode_records is m._py_encode_records


@SETTINGS
@given(st.lists(_messages(), max_size=6))
def test_encode_records_is_the_templates_back_to_back(msgs: list[MessageInner]) -> None:
    # Mixed topics with unchanged hosts once gave a wrong TOTALSIZE in the Python loop.
    expected = b"".join(bytes(m.encode_record_template(x)) for x in msgs)
    assert bytes(m._py_encode_records(msgs).buf) == expected
    assert bytes(native_encode(msgs).buf) == expected


class _PropertyTopic(MessageInner):
    """A subclass whose topic is a property: the native code must use getattr for it."""

    @property
    def topic(self) -> str:
        return "FromProperty"

    @topic.setter
    def topic(self, value: str) -> None:
        pass


class _Duck:
    """Not a MessageInner at all: only attributes."""

    def __init__(self, msg: MessageInner) -> None:
        for name in MessageInner.__slots__:
            setattr(self, name, getattr(msg, name))

    def encoded_properties(self) -> str:
        return "A\x011"


def test_encode_records_other_message_types() -> None:
    base = MessageInner("T", b"abc", properties={"A": "1"})
    sub = _PropertyTopic("T", b"abc", properties={"A": "1"})
    duck: Any = _Duck(base)
    duck.properties_string = None
    for msgs in ([sub], [base, sub], [sub, base], [duck, base], [base, duck, sub]):
        _check_same(msgs)  # type: ignore[arg-type]
    assert b"FromProperty" in bytes(native_encode([sub]).buf)


def test_encode_records_unset_slot() -> None:
    msg = MessageInner("T", b"abc")
    del msg.flag
    with pytest.raises(AttributeError):
        m._py_encode_records([msg])
    with pytest.raises(AttributeError):
        native_encode([msg])


def test_callbacks_that_mutate_the_inputs_do_not_crash() -> None:
    msgs = [MessageInner("T", b"a", born_host=(f"127.0.0.{i + 1}", 1)) for i in range(4)]

    def pack_ip(ip: str) -> bytes:
        msgs.clear()  # the native code works on its own copy of the sequence
        return m._pack_ip(ip)

    _buf, sizes, _, _ = sp.encode_records(
        msgs, pack_ip, MessageEncodeError, PropertiesSizeExceededError
    )
    assert len(sizes) == 4

    rec = native_encode([MessageInner("T", b"abc")] * 2)
    sizes_list: list[Any] = list(rec.sizes)

    class Shrinking:
        def __index__(self) -> int:
            sizes_list.clear()
            return int(rec.sizes[0])

    sizes_list[0] = Shrinking()
    with pytest.raises(IndexError):
        sp.patch_records(rec.buf, sizes_list, None, 0, 2, 0, 0, 0, 0, [])

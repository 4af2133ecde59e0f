"""common.message: the RocketMQ V1 record codec, property strings, ids and batch bodies."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.message import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_ZLIB,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    STORE_TIMESTAMP_POS_V4,
    STORE_TIMESTAMP_POS_V6,
    STOREHOSTADDRESS_V6_FLAG,
    SYSFLAG_POS,
    BatchItem,
    DispatchStatus,
    MessageDecodeError,
    MessageEncodeError,
    MessageExt,
    MessageInner,
    PropertiesSizeExceededError,
    check_record,
    create_offset_msg_id,
    decode_batch_body,
    decode_offset_msg_id,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch_body,
    encode_blank,
    encode_properties,
    encode_record,
    encode_record_template,
    iter_records,
    java_string_hash,
    patch_record,
    store_timestamp_pos,
    tags_code,
)

# Reference example D (RocketMQ 4.x record layout): topic "T", body "hi", queue 0, offsets 0,
# born 1700000000000 from 127.0.0.1:50000, stored 5 ms later on 127.0.0.1:10911,
# properties TAGS=TagA, CLUSTER=DefaultCluster. 126 bytes.
EXAMPLE_D = bytes.fromhex(
    "0000007e daa320a7 58932aac 00000000"
    "00000000 00000000 00000000 00000000"
    "00000000 00000000 0000018b cfe56800"
    "7f000001 0000c350 0000018b cfe56805"
    "7f000001 00002a9f 00000000 00000000"
    "00000000 00000002 6869 01 54 0020 5441"
    "47530154 61674102 434c5553 54455201"
    "44656661 756c7443 6c757374 6572".replace(" ", "")
)


def _example_d_msg() -> MessageInner:
    return MessageInner(
        "T",
        b"hi",
        properties={"TAGS": "TagA", "CLUSTER": "DefaultCluster"},
        born_timestamp=1700000000000,
        born_host=("127.0.0.1", 50000),
        store_host=("127.0.0.1", 10911),
    )


# --- byte-exact vectors --------------------------------------------------------------------


def test_example_d_encodes_byte_exact() -> None:
    assert len(EXAMPLE_D) == 126
    record = encode_record(_example_d_msg(), 0, 0, 1700000000005)
    assert bytes(record) == EXAMPLE_D


def test_example_d_decodes() -> None:
    m = decode_record(EXAMPLE_D)
    assert m.store_size == 126
    assert m.body_crc == 0x58932AAC == zlib.crc32(b"hi") & 0x7FFFFFFF
    assert m.topic == "T"
    assert m.body == b"hi"
    assert m.queue_id == 0
    assert m.queue_offset == 0
    assert m.commit_log_offset == 0
    assert m.born_timestamp == 1700000000000
    assert m.store_timestamp == 1700000000005
    assert m.born_host == ("127.0.0.1", 50000)
    assert m.store_host == ("127.0.0.1", 10911)
    assert m.properties == {"TAGS": "TagA", "CLUSTER": "DefaultCluster"}
    assert m.tags == "TagA"
    assert m.keys is None
    assert m.uniq_key is None
    assert m.msg_id == "7F00000100002A9F0000000000000000"


def test_example_d_check_record() -> None:
    d = check_record(EXAMPLE_D, 0)
    assert d.status is DispatchStatus.OK
    assert d.size == 126
    assert d.topic == "T"
    assert d.tags_code == 2598919
    assert d.store_timestamp == 1700000000005
    assert d.commit_log_offset == 0
    assert d.keys == ""
    assert d.uniq_key is None


def test_java_string_hash_vectors() -> None:
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("") == 0
    # Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == Integer.MIN_VALUE
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)
    # non-BMP: U+1F600 is the surrogate pair D83D DE00 -> 31*0xD83D + 0xDE00
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00
    # BMP non-ASCII: a single UTF-16 unit
    assert java_string_hash("é") == 0xE9
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919


def _java_hash_reference(s: str) -> int:
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@given(st.text(max_size=300))
def test_java_string_hash_matches_utf16_definition(s: str) -> None:
    assert java_string_hash(s) == _java_hash_reference(s)


def test_java_string_hash_long_strings() -> None:
    rng = random.Random(7)
    for n in (1023, 1024, 1025, 2048, 5000):
        ascii_s = "".join(chr(rng.randrange(32, 127)) for _ in range(n))
        assert java_string_hash(ascii_s) == _java_hash_reference(ascii_s)
        mixed = "".join(chr(rng.choice([0x41, 0xE9, 0x4E2D, 0x1F600])) for _ in range(n))
        assert java_string_hash(mixed) == _java_hash_reference(mixed)


def test_offset_msg_id_vectors() -> None:
    assert create_offset_msg_id(("127.0.0.1", 10911), 0) == "7F00000100002A9F0000000000000000"
    assert (
        create_offset_msg_id(("192.0.2.5", 10911), 1073741950) == "C000020500002A9F000000004000007E"
    )
    assert decode_offset_msg_id("C000020500002A9F000000004000007E") == (
        ("192.0.2.5", 10911),
        1073741950,
    )


# --- properties ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("a\x01", {}),  # value empty: \x01 is the last char
        ("\x01b", {}),  # name empty: \x01 is the first char
        ("ab", {}),  # no separator
        ("a\x01b", {"a": "b"}),
        ("a\x01b\x02", {"a": "b"}),  # empty trailing segment
        ("\x02\x02a\x01b\x02\x02c\x01d", {"a": "b", "c": "d"}),  # empty segments
        ("a\x01b\x01c", {"a": "b\x01c"}),  # the first \x01 splits
        ("\x01\x01", {}),
        ("k\x01\x01", {"k": "\x01"}),
        ("a\x01b\x02a\x01c", {"a": "c"}),  # later duplicate wins
        (
            "TAGS\x01TagA\x02CLUSTER\x01DefaultCluster",
            {"TAGS": "TagA", "CLUSTER": "DefaultCluster"},
        ),
    ],
)
def test_decode_properties_edge_cases(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


def test_encode_properties() -> None:
    assert encode_properties({}) == ""
    assert encode_properties({"a": "b"}) == "a\x01b"
    assert encode_properties({"a": "b", "c": "d"}) == "a\x01b\x02c\x01d"


_prop_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"),
    min_size=1,
    max_size=20,
)


@given(st.dictionaries(_prop_text, _prop_text, max_size=10))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


# --- record round trips ------------------------------------------------------------------

_ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
_ipv6 = st.sampled_from(["::1", "fe80::1", "2001:db8::8a2e:370:7334", "::ffff:192.0.2.1"])
_host = st.tuples(st.one_of(_ipv4, _ipv6), st.integers(0, 65535))
_topic = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40).filter(
    lambda t: len(t.encode()) <= 127
)
_int32 = st.integers(-(2**31), 2**31 - 1)
_int64 = st.integers(-(2**63), 2**63 - 1)
_big_body = st.tuples(st.integers(60000, 70000), st.integers(0, 2**32)).map(
    lambda t: random.Random(t[1]).randbytes(t[0])
)
_body = st.one_of(st.binary(max_size=64), _big_body)


@st.composite
def _messages(draw: st.DrawFn) -> tuple[MessageInner, int, int, int]:
    msg = MessageInner(
        draw(_topic),
        draw(_body),
        queue_id=draw(_int32),
        flag=draw(_int32),
        properties=draw(st.dictionaries(_prop_text, _prop_text, max_size=6)),
        sys_flag=draw(st.integers(0, 0xFFF)),
        born_timestamp=draw(_int64),
        born_host=draw(_host),
        store_host=draw(_host),
        reconsume_times=draw(_int32),
        prepared_transaction_offset=draw(_int64),
    )
    return msg, draw(_int64), draw(_int64), draw(_int64)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(_messages())
def test_record_round_trip(case: tuple[MessageInner, int, int, int]) -> None:
    msg, qoff, phy, store_ts = case
    rec = encode_record(msg, qoff, phy, store_ts)
    assert struct.unpack_from(">i", rec, 0)[0] == len(rec)
    m = decode_record(bytes(rec), check_crc=True)
    assert m.store_size == len(rec)
    assert m.topic == msg.topic
    assert m.body == msg.body
    assert m.queue_id == msg.queue_id
    assert m.flag == msg.flag
    assert m.queue_offset == qoff
    assert m.commit_log_offset == phy
    assert m.store_timestamp == store_ts
    assert m.born_timestamp == msg.born_timestamp
    assert m.reconsume_times == msg.reconsume_times
    assert m.prepared_transaction_offset == msg.prepared_transaction_offset
    assert m.properties == msg.properties
    v6_born = ":" in msg.born_host[0]
    v6_store = ":" in msg.store_host[0]
    assert bool(m.sys_flag & BORNHOST_V6_FLAG) == v6_born
    assert bool(m.sys_flag & STOREHOSTADDRESS_V6_FLAG) == v6_store
    assert m.sys_flag & ~0x30 == msg.sys_flag & ~0x30
    import ipaddress

    assert ipaddress.ip_address(m.born_host[0]) == ipaddress.ip_address(msg.born_host[0])
    assert m.born_host[1] == msg.born_host[1]
    assert ipaddress.ip_address(m.store_host[0]) == ipaddress.ip_address(msg.store_host[0])
    expected_id_len = 56 if v6_store else 32
    assert len(m.msg_id) == expected_id_len
    assert decode_offset_msg_id(m.msg_id)[1] == phy
    # the fixed part is 91 bytes + 12 per IPv6 host
    fixed = MIN_RECORD_SIZE + 12 * (v6_born + v6_store)
    props_len = len(encode_properties(msg.properties).encode())
    assert len(rec) == fixed + len(msg.body) + len(msg.topic.encode()) + props_len
    d = check_record(rec, 0)
    assert d.status is DispatchStatus.OK
    assert d.size == len(rec)
    assert d.topic == msg.topic
    assert d.queue_offset == qoff
    assert d.commit_log_offset == phy
    assert d.store_timestamp == store_ts
    assert d.tags_code == tags_code(msg.properties.get("TAGS"))


def test_template_and_patch_equal_encode_record() -> None:
    for born, store in [
        (("127.0.0.1", 1), ("127.0.0.1", 2)),
        (("::1", 1), ("127.0.0.1", 2)),
        (("127.0.0.1", 1), ("::1", 2)),
        (("::1", 1), ("::1", 2)),
    ]:
        msg = MessageInner("TopicX", b"body", born_host=born, store_host=store)
        tmpl = encode_record_template(msg)
        # patch in place inside a larger buffer, as the commitlog does in its mapped file
        buf = bytearray(10) + tmpl + bytearray(5)
        patch_record(buf, 10, 7, 123456789, 1700000000123)
        expected = encode_record(msg, 7, 123456789, 1700000000123)
        assert bytes(buf[10 : 10 + len(tmpl)]) == bytes(expected)
        sys_flag = struct.unpack_from(">i", expected, SYSFLAG_POS)[0]
        pos = store_timestamp_pos(sys_flag)
        assert pos == (STORE_TIMESTAMP_POS_V6 if born[0] == "::1" else STORE_TIMESTAMP_POS_V4)
        assert struct.unpack_from(">q", expected, pos)[0] == 1700000000123
        assert struct.unpack_from(">q", expected, QUEUE_OFFSET_POS)[0] == 7
        assert struct.unpack_from(">q", expected, PHYSICAL_OFFSET_POS)[0] == 123456789


def test_encode_limits() -> None:
    with pytest.raises(MessageEncodeError):
        encode_record(MessageInner("t" * 128, b""), 0, 0, 0)
    encode_record(MessageInner("t" * 127, b""), 0, 0, 0)
    with pytest.raises(PropertiesSizeExceededError):
        encode_record(MessageInner("t", b"", properties={"k": "v" * 32766}), 0, 0, 0)
    encode_record(MessageInner("t", b"", properties={"k": "v" * 32765}), 0, 0, 0)
    with pytest.raises(MessageEncodeError):
        encode_record(MessageInner("t", b"", born_host=("not-an-ip", 1)), 0, 0, 0)
    topic = "é" * 63 + "a"  # 127 UTF-8 bytes
    assert len(topic.encode()) == 127
    m = decode_record(bytes(encode_record(MessageInner(topic, b"x"), 0, 0, 0)))
    assert m.topic == topic
    assert check_record(encode_record(MessageInner(topic, b"x"), 0, 0, 0), 0).topic == topic
    with pytest.raises(MessageEncodeError):
        encode_record(MessageInner("é" * 64, b""), 0, 0, 0)


def test_properties_string_is_cached_and_used() -> None:
    msg = MessageInner("t", b"", properties_string="A\x011\x02TAGS\x01x")
    assert msg.properties == {"A": "1", "TAGS": "x"}
    assert msg.tags_code == java_string_hash("x")
    m = decode_record(bytes(encode_record(msg, 0, 0, 0)))
    assert m.properties == {"A": "1", "TAGS": "x"}
    assert m.properties_string == "A\x011\x02TAGS\x01x"


def test_decode_records_many_and_read_body_false() -> None:
    records = [
        encode_record(
            MessageInner(f"topic{i % 3}", bytes([i]) * i, properties={"KEYS": f"k{i} j{i}"}),
            i,
            i * 1000,
            i,
        )
        for i in range(50)
    ]
    buf = b"".join(bytes(r) for r in records)
    msgs = decode_records(buf)
    assert [m.queue_offset for m in msgs] == list(range(50))
    assert [m.body for m in msgs] == [bytes([i]) * i for i in range(50)]
    assert [m.topic for m in msgs] == [f"topic{i % 3}" for i in range(50)]
    assert [m.keys for m in msgs] == [f"k{i} j{i}" for i in range(50)]
    assert [m.queue_offset for m in iter_records(memoryview(buf))] == list(range(50))
    no_body = decode_records(bytearray(buf), read_body=False)
    assert all(m.body is None for m in no_body)
    assert [m.store_size for m in no_body] == [len(r) for r in records]
    # decode at an offset inside a bigger buffer (a mapped file)
    second = decode_record(memoryview(buf), len(records[0]))
    assert second.queue_offset == 1
    assert decode_records(b"") == []


def test_compressed_body() -> None:
    raw = b"hello world " * 1000
    for flag in (COMPRESSED_FLAG, COMPRESSED_FLAG | COMPRESSION_ZLIB):
        rec = encode_record(MessageInner("t", zlib.compress(raw, 5), sys_flag=flag), 0, 0, 0)
        m = decode_record(bytes(rec))
        assert m.body == zlib.compress(raw, 5)  # stored body is kept as is
        assert m.decompressed_body() == raw
        with pytest.raises(MessageDecodeError):
            m.decompressed_body(max_size=100)
    plain = decode_record(bytes(encode_record(MessageInner("t", b"abc"), 0, 0, 0)))
    assert plain.decompressed_body() == b"abc"
    lz4 = decode_record(
        bytes(encode_record(MessageInner("t", b"x", sys_flag=1 | COMPRESSION_LZ4), 0, 0, 0))
    )
    with pytest.raises(MessageDecodeError, match="LZ4"):
        lz4.decompressed_body()
    bad = decode_record(bytes(encode_record(MessageInner("t", b"junk", sys_flag=1), 0, 0, 0)))
    with pytest.raises(MessageDecodeError):
        bad.decompressed_body()


def test_to_inner_round_trip() -> None:
    m = decode_record(EXAMPLE_D)
    inner = m.to_inner()
    assert isinstance(m, MessageExt)
    assert bytes(encode_record(inner, 0, 0, 1700000000005)) == EXAMPLE_D


def test_v2_magic_decodes_two_byte_topic_length() -> None:
    # a 5.x V2 record: same layout with a 2-byte topic length
    topic = "T" * 200
    v1 = bytearray(encode_record(MessageInner("x", b"hi"), 0, 0, 0))
    body_end = 88 + 2
    v2 = v1[:body_end] + struct.pack(">H", len(topic)) + topic.encode() + v1[body_end + 2 :]
    struct.pack_into(">iI", v2, 0, len(v2), 0xDAA320AB)
    m = decode_record(bytes(v2))
    assert m.topic == topic
    assert m.body == b"hi"
    # check_record only accepts the V1 records trimq writes
    assert check_record(v2, 0).status is DispatchStatus.INVALID


# --- garbage -------------------------------------------------------------------------------


def test_truncated_records_raise_decode_error_and_check_invalid() -> None:
    for cut in range(len(EXAMPLE_D)):
        data = EXAMPLE_D[:cut]
        with pytest.raises(MessageDecodeError):
            decode_record(data)
        if cut:
            with pytest.raises(MessageDecodeError):
                decode_records(EXAMPLE_D + data)
        status = check_record(data, 0).status
        assert status in (DispatchStatus.INVALID, DispatchStatus.END)
        if cut >= 8:
            assert status is DispatchStatus.INVALID


def test_flipped_bytes_detected() -> None:
    body_pos = 88
    bad = bytearray(EXAMPLE_D)
    bad[body_pos] ^= 0x01
    assert check_record(bad, 0).status is DispatchStatus.INVALID
    assert check_record(bad, 0, check_crc=False).status is DispatchStatus.OK
    with pytest.raises(MessageDecodeError):
        decode_record(bytes(bad), check_crc=True)
    # lengths that no longer add up
    for pos, value in [(0, 125), (0, 127), (84, 3), (90, 2), (91, 0x21)]:
        bad = bytearray(EXAMPLE_D)
        if pos == 0 or pos == 84:
            struct.pack_into(">i", bad, pos, value)
        elif pos == 90:
            bad[pos] = value
        else:
            struct.pack_into(">h", bad, pos, value)
        assert check_record(bad, 0).status is DispatchStatus.INVALID, (pos, value)
        with pytest.raises(MessageDecodeError):
            decode_record(bytes(bad))
    bad = bytearray(EXAMPLE_D)
    struct.pack_into(">I", bad, 4, 0x12345678)
    assert check_record(bad, 0).status is DispatchStatus.INVALID
    with pytest.raises(MessageDecodeError):
        decode_record(bytes(bad))


def test_check_record_end_blank_and_bounds() -> None:
    assert check_record(b"", 0).status is DispatchStatus.END
    assert check_record(bytes(4096), 0).status is DispatchStatus.END
    assert check_record(bytes(5), 0).status is DispatchStatus.END
    assert check_record(EXAMPLE_D + bytes(100), 126).status is DispatchStatus.END
    assert check_record(EXAMPLE_D, 126).status is DispatchStatus.END
    assert check_record(b"\x00\x01\x02", 0).status is DispatchStatus.INVALID
    assert check_record(EXAMPLE_D, -1).status is DispatchStatus.INVALID
    blank = encode_blank(40) + bytes(32)
    assert struct.unpack(">iI", blank[:8]) == (40, BLANK_MAGIC_CODE)
    d = check_record(blank, 0)
    assert d.status is DispatchStatus.BLANK
    assert d.size == 40
    assert check_record(encode_blank(41) + bytes(32), 0).status is DispatchStatus.INVALID
    assert check_record(EXAMPLE_D, 0, max_size=125).status is DispatchStatus.INVALID
    # a record in a file: followed by another record, then zeros
    second = encode_record(_example_d_msg(), 1, 126, 1700000000006)
    buf = EXAMPLE_D + bytes(second) + bytes(64)
    d2 = check_record(buf, 126)
    assert d2.status is DispatchStatus.OK
    assert d2.commit_log_offset == 126
    assert d2.queue_offset == 1
    assert check_record(buf, 252).status is DispatchStatus.END
    assert check_record(memoryview(buf), 126).status is DispatchStatus.OK
    assert MESSAGE_MAGIC_CODE == 0xDAA320A7


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(0, 310))
def test_random_bytes_never_escape(data: bytes, offset: int) -> None:
    try:
        decode_record(data, offset if offset < len(data) else 0)
    except MessageDecodeError:
        pass
    try:
        decode_records(data)
    except MessageDecodeError:
        pass
    try:
        decode_batch_body(data)
    except MessageDecodeError:
        pass
    d = check_record(data, offset)
    assert d.status in set(DispatchStatus)


@settings(max_examples=300)
@given(st.integers(0, 125), st.integers(0, 255), st.integers(1, 126))
def test_mutated_example_never_escapes(pos: int, value: int, cut: int) -> None:
    bad = bytearray(EXAMPLE_D)
    bad[pos] = value
    for data in (bytes(bad), bytes(bad[:cut])):
        try:
            m = decode_record(data)
            _ = m.properties, m.born_host, m.store_host, m.msg_id
        except MessageDecodeError:
            pass
        d = check_record(data, 0)
        if d.status is DispatchStatus.OK:
            assert d.size == 126


def test_random_garbage_seeded() -> None:
    rng = random.Random(1234)
    for _ in range(2000):
        n = rng.randrange(0, 400)
        data = bytes(rng.getrandbits(8) for _ in range(n))
        if n >= 8 and rng.random() < 0.5:
            data = struct.pack(">iI", rng.randrange(0, 500), MESSAGE_MAGIC_CODE) + data[8:]
        try:
            decode_records(data)
        except MessageDecodeError:
            pass
        assert check_record(data, 0).status in (DispatchStatus.INVALID, DispatchStatus.END)


def test_offset_msg_id_errors_and_ipv6() -> None:
    mid = create_offset_msg_id(("2001:db8::1", 10911), 42)
    assert len(mid) == 56
    assert mid == mid.upper()
    assert decode_offset_msg_id(mid) == (("2001:db8::1", 10911), 42)
    for bad in ("", "00", "Z" * 32, "0" * 33):
        with pytest.raises(MessageDecodeError):
            decode_offset_msg_id(bad)


@given(_host, st.integers(0, 2**63 - 1))
def test_offset_msg_id_round_trip(host: tuple[str, int], offset: int) -> None:
    import ipaddress

    mid = create_offset_msg_id(host, offset)
    assert len(mid) == (56 if ":" in host[0] else 32)
    (ip, port), off = decode_offset_msg_id(mid)
    assert ipaddress.ip_address(ip) == ipaddress.ip_address(host[0])
    assert (port, off) == (host[1], offset)


# --- batch body ------------------------------------------------------------------------------


def test_batch_body_layout() -> None:
    body = encode_batch_body([BatchItem(3, b"ab", "K\x01v")])
    assert body == struct.pack(">iiiii", 27, 0, 0, 3, 2) + b"ab" + struct.pack(">h", 3) + b"K\x01v"
    assert decode_batch_body(body) == [BatchItem(3, b"ab", "K\x01v")]
    assert decode_batch_body(b"") == []


_batch_item = st.builds(
    BatchItem,
    _int32,
    st.binary(max_size=200),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=50),
)


@given(st.lists(_batch_item, max_size=10))
def test_batch_body_round_trip(items: list[BatchItem]) -> None:
    body = encode_batch_body(items)
    assert decode_batch_body(body) == items
    assert decode_batch_body(memoryview(body)) == items
    boundaries = {0}
    for item in items:
        boundaries.add(max(boundaries) + 22 + len(item.body) + len(item.properties.encode()))
    for cut in {1, len(body) // 2, len(body) - 1} - boundaries:
        if 0 < cut < len(body):
            with pytest.raises(MessageDecodeError):
                decode_batch_body(body[:cut])


def test_batch_body_rejects_inconsistent_lengths() -> None:
    good = encode_batch_body([BatchItem(0, b"abc", "")])
    bad = bytearray(good)
    struct.pack_into(">i", bad, 0, len(good) + 1)
    with pytest.raises(MessageDecodeError):
        decode_batch_body(bytes(bad))
    bad = bytearray(good)
    struct.pack_into(">i", bad, 16, -1)
    with pytest.raises(MessageDecodeError):
        decode_batch_body(bytes(bad))
    with pytest.raises(PropertiesSizeExceededError):
        encode_batch_body([BatchItem(0, b"", "x" * 40000)])

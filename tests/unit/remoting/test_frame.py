"""Frame codec: byte-exact RocketMQ examples, round trips, and hostile input."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import (
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    LanguageCode,
    RemotingCommand,
    RequestCode,
    SerializeType,
    encode_frame,
)
from remoting.protocol import SendMessageRequestHeader

# --- worked examples (hex written out by hand from the RocketMQ 4.x framing rules) -------------

# A. GET_ROUTEINFO_BY_TOPIC, JSON header, topic "T", opaque 1, version 409: 131 bytes.
EXAMPLE_A = bytes.fromhex(
    "0000007f0000007b7b22636f6465223a"
    "3130352c226578744669656c6473223a"
    "7b22746f706963223a2254227d2c2266"
    "6c6167223a302c226c616e6775616765"
    "223a224a415641222c226f7061717565"
    "223a312c2273657269616c697a655479"
    "706543757272656e74525043223a224a"
    "534f4e222c2276657273696f6e223a34"
    "30397d"
)

# B. The same request with the ROCKETMQ binary header: 41 bytes.
EXAMPLE_B = bytes.fromhex(
    "00000025 01000021"  # length 37, word (1 << 24) | 33
    "0069 00 0199 00000001 00000000"  # code 105, JAVA, version 409, opaque 1, flag 0
    "00000000"  # remark: null
    "0000000c 0005 746f706963 00000001 54"  # extFields: 12 bytes, "topic" -> "T"
)

# C. SEND_MESSAGE_V2, opaque 2, body "hi": 291 bytes. \u0001 / \u0002 are 6-character escapes.
EXAMPLE_C_HEADER = (
    b'{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"0","f":"0",'
    b'"g":"1700000000000","h":"0","i":"WAIT\\u0001true\\u0002TAGS\\u0001TagA","j":"0",'
    b'"k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":2,'
    b'"serializeTypeCurrentRPC":"JSON","version":409}'
)
EXAMPLE_C = bytes.fromhex("0000011f 00000119") + EXAMPLE_C_HEADER + b"hi"


def _route_request(serialize_type: int) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        opaque=1,
        ext_fields={"topic": "T"},
        language=LanguageCode.JAVA,
        version=409,
        serialize_type=serialize_type,
    )


def _send_v2_request() -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic="T",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1700000000000,
        flag=0,
        properties="WAIT\x01true\x02TAGS\x01TagA",
        reconsume_times=0,
        unit_mode=False,
        batch=False,
        broker_name="broker-a",
    )
    return RemotingCommand(
        RequestCode.SEND_MESSAGE_V2,
        opaque=2,
        ext_fields=header.to_fields_v2(),
        body=b"hi",
        language=LanguageCode.JAVA,
        version=409,
        serialize_type=SerializeType.JSON,
    )


def test_example_a_json_route_request() -> None:
    assert len(EXAMPLE_A) == 131
    assert encode_frame(_route_request(SerializeType.JSON)) == EXAMPLE_A
    assert FrameDecoder().feed(EXAMPLE_A) == [_route_request(SerializeType.JSON)]


def test_example_b_binary_route_request() -> None:
    assert len(EXAMPLE_B) == 41
    assert encode_frame(_route_request(SerializeType.ROCKETMQ)) == EXAMPLE_B
    assert FrameDecoder().feed(EXAMPLE_B) == [_route_request(SerializeType.ROCKETMQ)]


def test_example_c_send_message_v2() -> None:
    assert len(EXAMPLE_C_HEADER) == 281
    assert len(EXAMPLE_C) == 291
    frame = encode_frame(_send_v2_request())
    assert frame == EXAMPLE_C
    [cmd] = FrameDecoder().feed(frame)
    assert cmd.body == b"hi"
    header = SendMessageRequestHeader.from_command(cmd)
    assert header.properties == "WAIT\x01true\x02TAGS\x01TagA"
    assert header.born_timestamp == 1700000000000


def test_example_c_decodes_whatever_the_ext_field_order() -> None:
    # A Java HashMap may order extFields differently; the decoder must not care.
    reordered = EXAMPLE_C_HEADER.replace(b'"a":"PG","b":"T",', b'"b":"T","a":"PG",')
    frame = struct.pack(">iI", 4 + len(reordered) + 2, len(reordered)) + reordered + b"hi"
    [cmd] = FrameDecoder().feed(frame)
    assert cmd == _send_v2_request()


# --- round trips ----------------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=20)


@st.composite
def bodies(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["none", "small", "large"]))
    if kind == "none":
        return None
    if kind == "small":
        return draw(st.binary(max_size=300))
    size = draw(st.integers(300, 1 << 20))
    return random.Random(size).randbytes(size)


@st.composite
def frames(draw: st.DrawFn) -> RemotingCommand:
    serialize_type = draw(st.sampled_from([int(t) for t in SerializeType]))
    small = serialize_type == SerializeType.ROCKETMQ
    num = st.integers(-(2**15), 2**15 - 1) if small else st.integers(-(2**31), 2**31 - 1)
    remark = draw(st.one_of(st.none(), TEXT))
    if small and remark == "":
        remark = None
    return RemotingCommand(
        draw(num),
        opaque=draw(st.integers(-(2**31), 2**31 - 1)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        remark=remark,
        ext_fields=draw(st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=8))),
        body=draw(bodies()),
        language=draw(st.sampled_from([int(x) for x in LanguageCode])),
        version=draw(num),
        serialize_type=serialize_type,
    )


def _chunks(data: bytes, rnd: random.Random) -> list[bytes]:
    out = []
    pos = 0
    while pos < len(data):
        step = rnd.choice([1, 2, 3, 7, 100, 4096, 65536, 1 << 20])
        out.append(data[pos : pos + step])
        pos += step
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(frames(), min_size=1, max_size=5), st.integers(0, 2**32))
def test_frames_round_trip_in_random_chunks(cmds: list[RemotingCommand], seed: int) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for chunk in _chunks(stream, random.Random(seed)):
        out.extend(decoder.feed(chunk))
    assert out == cmds
    assert [c.serialize_type for c in out] == [c.serialize_type for c in cmds]
    assert decoder.buffered == 0


def test_feed_accepts_bytearray_and_memoryview() -> None:
    frame = encode_frame(_route_request(SerializeType.MSGPACK))
    decoder = FrameDecoder()
    assert decoder.feed(bytearray(frame[:5])) == []
    assert decoder.feed(memoryview(frame)[5:]) == [_route_request(SerializeType.MSGPACK)]


# --- hostile input --------------------------------------------------------------------------


@settings(max_examples=500)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_raise_only_frame_error(chunks: list[bytes]) -> None:
    decoder = FrameDecoder(max_frame_size=4096)
    try:
        for chunk in chunks:
            for cmd in decoder.feed(chunk):
                assert isinstance(cmd, RemotingCommand)
    except FrameError:
        pass
    assert decoder.buffered <= sum(len(c) for c in chunks)


@settings(max_examples=300)
@given(st.sampled_from([0, 1, 0x6D, 2, 0xFF]), st.binary(max_size=200), st.binary(max_size=50))
def test_random_headers_in_valid_frames_raise_only_frame_error(
    serialize_type: int, header: bytes, body: bytes
) -> None:
    frame = struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header))
    try:
        FrameDecoder().feed(frame + header + body)
    except FrameError:
        pass


@settings(max_examples=100, deadline=None)
@given(frames(), st.data())
def test_truncated_and_corrupted_frames(cmd: RemotingCommand, data: st.DataObject) -> None:
    frame = encode_frame(cmd)
    cut = data.draw(st.integers(0, len(frame) - 1))
    # A truncated frame is simply incomplete: nothing comes out, nothing is raised.
    assert FrameDecoder().feed(frame[:cut]) == []
    # A corrupted byte may or may not be detected, but only FrameError may come out.
    pos = data.draw(st.integers(0, min(len(frame), 400) - 1))
    corrupted = bytearray(frame)
    corrupted[pos] ^= data.draw(st.integers(1, 255))
    try:
        FrameDecoder().feed(bytes(corrupted))
    except FrameError:
        pass


def test_declared_length_above_max_raises_before_the_body_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">i", 1025))  # only the length word has arrived
    decoder = FrameDecoder()  # default 16 MiB
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">iI", 16 * 1024 * 1024 + 1, 0) + b"x" * 100)
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"\x7f\xff\xff\xff")


def test_frame_of_exactly_max_size_is_accepted() -> None:
    cmd = RemotingCommand(1, serialize_type=SerializeType.MSGPACK)
    header_len = len(encode_frame(cmd)) - 8
    cmd.body = b"z" * (1000 - 4 - header_len)
    frame = encode_frame(cmd)
    assert struct.unpack(">i", frame[:4])[0] == 1000
    assert FrameDecoder(max_frame_size=1000).feed(frame) == [cmd]
    with pytest.raises(FrameTooLargeError):
        FrameDecoder(max_frame_size=999).feed(frame)


@pytest.mark.parametrize(
    "prefix",
    [
        struct.pack(">i", -1),
        struct.pack(">i", 0),
        struct.pack(">i", 3),
        struct.pack(">iI", 10, 7),  # header length 7 > 10 - 4
        struct.pack(">iI", 4, (1 << 24) | 1),  # header length 1 > 0
    ],
)
def test_impossible_lengths_raise_frame_error(prefix: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(prefix + bytes(16))


def test_many_small_frames_in_one_feed_and_a_leftover() -> None:
    cmds = [
        RemotingCommand(i, opaque=i, body=b"%d" % i, serialize_type=SerializeType.MSGPACK)
        for i in range(1000)
    ]
    stream = b"".join(encode_frame(c) for c in cmds)
    decoder = FrameDecoder()
    out = decoder.feed(stream[:-3])
    assert out == cmds[:-1]
    assert decoder.buffered > 0
    assert decoder.feed(stream[-3:]) == cmds[-1:]
    assert decoder.buffered == 0


def test_example_e_json_response() -> None:
    request = FrameDecoder().feed(EXAMPLE_A)[0]
    response = request.make_response(body=b"{}")
    response.language = LanguageCode.JAVA
    response.version = 409
    header = (
        b'{"code":0,"flag":1,"language":"JAVA","opaque":1,'
        b'"serializeTypeCurrentRPC":"JSON","version":409}'
    )
    expected = struct.pack(">iI", 4 + len(header) + 2, len(header)) + header + b"{}"
    assert encode_frame(response) == expected

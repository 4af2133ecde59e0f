"""Header codecs: JSON (0), ROCKETMQ binary (1), msgpack (0x6D)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import (
    FrameError,
    LanguageCode,
    RemotingCommand,
    SerializeType,
    _header_codec,
    decode_header,
    encode_header,
)
from remoting._header_codec import py_decode_header

# The decoder in use (native when built) and the pure-Python reference: both read every form.
_JSON_DECODERS: list[Callable[[int, bytes], RemotingCommand]] = [decode_header, py_decode_header]
if _header_codec.native is not None and _header_codec.native.decode_header is not decode_header:
    _JSON_DECODERS.append(_header_codec.native.decode_header)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
# Text including the RocketMQ property separators and non-ASCII characters.
TEXT = st.text(
    alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from('\x01\x02\x00"\\/é漢😀')),
    max_size=40,
)
EXT = st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=12))
LANG = st.sampled_from([int(x) for x in LanguageCode])


def commands(serialize_type: int, *, small: bool) -> st.SearchStrategy[RemotingCommand]:
    num = INT16 if small else INT32
    return st.builds(
        lambda code, opaque, flag, remark, ext, lang, version: RemotingCommand(
            code,
            opaque=opaque,
            flag=flag,
            remark=remark,
            ext_fields=ext,
            language=lang,
            version=version,
            serialize_type=serialize_type,
        ),
        num,
        INT32,
        INT32,
        st.one_of(st.none(), TEXT),
        EXT,
        LANG,
        num,
    )


def _normalise_binary(cmd: RemotingCommand) -> RemotingCommand:
    # The binary header writes an empty remark as length 0, which means null.
    if cmd.remark == "":
        cmd.remark = None
    return cmd


@settings(max_examples=300)
@given(commands(SerializeType.JSON, small=False))
def test_json_round_trip(cmd: RemotingCommand) -> None:
    data = encode_header(cmd)
    assert decode_header(SerializeType.JSON, data) == cmd
    # What a Java peer reads: standard JSON with RocketMQ's field names, alphabetical.
    obj = json.loads(data)
    assert list(obj) == sorted(obj)
    assert obj["language"] == LanguageCode(cmd.language).name
    assert obj["serializeTypeCurrentRPC"] == "JSON"
    assert ("remark" in obj) == (cmd.remark is not None)
    assert ("extFields" in obj) == (cmd.ext_fields is not None)


@settings(max_examples=300)
@given(commands(SerializeType.ROCKETMQ, small=True))
def test_rocketmq_binary_round_trip(cmd: RemotingCommand) -> None:
    data = encode_header(cmd)
    assert decode_header(SerializeType.ROCKETMQ, data) == _normalise_binary(cmd)


@settings(max_examples=300)
@given(commands(SerializeType.MSGPACK, small=False))
def test_msgpack_round_trip(cmd: RemotingCommand) -> None:
    data = encode_header(cmd)
    decoded = decode_header(SerializeType.MSGPACK, data)
    assert decoded == cmd
    assert decoded.serialize_type == SerializeType.MSGPACK


@given(st.integers(0, 255), st.binary(max_size=300))
def test_random_header_bytes_raise_only_frame_error(serialize_type: int, data: bytes) -> None:
    try:
        cmd = decode_header(serialize_type, data)
    except FrameError:
        return
    assert serialize_type in (0, 1, 0x6D)
    assert isinstance(cmd, RemotingCommand)


def test_empty_binary_header_is_21_bytes() -> None:
    cmd = RemotingCommand(0, language=0, version=0, serialize_type=SerializeType.ROCKETMQ)
    assert encode_header(cmd) == bytes(21)
    back = decode_header(SerializeType.ROCKETMQ, bytes(21))
    assert back.remark is None
    assert back.ext_fields is None


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        ('"JAVA"', LanguageCode.JAVA),
        ('"CPP"', LanguageCode.CPP),
        ('"PYTHON"', LanguageCode.PYTHON),
        ("3", LanguageCode.PYTHON),
        ("9", LanguageCode.GO),
        ('"COBOL"', LanguageCode.OTHER),
        ("99", LanguageCode.OTHER),
    ],
)
def test_json_language_as_name_or_number(language: str, expected: LanguageCode) -> None:
    text = '{"code":105,"extFields":{"topic":"T"},"language":' + language + ',"opaque":7}'
    cmd = decode_header(SerializeType.JSON, text.encode())
    assert cmd.language == expected
    assert cmd.code == 105
    assert cmd.opaque == 7


def test_json_missing_fields_default_and_unknown_fields_are_ignored() -> None:
    cmd = decode_header(SerializeType.JSON, b'{"code":34,"newField":[1,2],"another":{"x":1}}')
    assert cmd.code == 34
    assert cmd.opaque == 0
    assert cmd.flag == 0
    assert cmd.remark is None
    assert cmd.ext_fields is None
    assert cmd.language == LanguageCode.JAVA
    assert cmd.version == 0


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"[1,2]",
        b"{",
        b'{"code":1.5}',
        b'{"code":true}',
        b'{"code":"1x"}',
        b'{"code":1,"opaque":null,"flag":"x"}',
        b'{"code":1,"remark":true}',
        b'{"code":1,"remark":[]}',
        b'{"code":1,"extFields":{"a":[1]}}',
        b'{"code":1,"extFields":{"a":{"b":"c"}}}',
        b'{"code":1,"extFields":{"a":NaN}}',
        b'{"code":1,"extFields":{"a":Infinity}}',
        b'{"code":1,"extFields":[]}',
        b'{"code":1,"extFields":"a=b"}',
        b'{"code":1,"language":[]}',
        b"\xff\xfe",
        b"[" * 100000,
        # Integers past int()'s 4,300-digit limit in every int field (not a ValueError).
        *(b'{"%s":%s}' % (k, b"9" * 5000) for k in (b"code", b"opaque", b"flag", b"version")),
        b'{"code":1,"language":%s}' % (b"1" * 5000),
        b'{"code":-%s}' % (b"1" * 21),
    ],
)
def test_json_malformed_headers_raise_frame_error(text: bytes) -> None:
    for decode in _JSON_DECODERS:
        with pytest.raises(FrameError):
            decode(SerializeType.JSON, text)


# The Apache RocketMQ C++ client's SEND_MESSAGE header (rocketmq-client-cpp 2.x, jsoncpp): numbers
# inside extFields, no serializeTypeCurrentRPC.
_CPP_SEND = (
    b'{"code":10,"extFields":{"bornTimestamp":"1764255600000","defaultTopic":"TBW102",'
    b'"defaultTopicQueueNums":4,"flag":0,"producerGroup":"G","properties":"TAGS\\u0001TagA\\u0002",'
    b'"queueId":0,"reconsumeTimes":0,"sysFlag":0,"topic":"T","unitMode":false},'
    b'"flag":0,"language":"CPP","opaque":5,"remark":"","version":213}'
)


@pytest.mark.parametrize(
    ("text", "code", "ext"),
    [
        (
            _CPP_SEND,
            10,
            {
                "bornTimestamp": "1764255600000",
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": "4",
                "flag": "0",
                "producerGroup": "G",
                "properties": "TAGS\x01TagA\x02",
                "queueId": "0",
                "reconsumeTimes": "0",
                "sysFlag": "0",
                "topic": "T",
                "unitMode": "false",
            },
        ),
        # numbers as Java prints them: an integer's literal text, a decimal as BigDecimal does
        (
            b'{"code":1,"extFields":{"a":-7,"b":12345678901234567890123}}',
            1,
            {"a": "-7", "b": "12345678901234567890123"},
        ),
        (
            b'{"code":1,"extFields":{"a":1.50,"b":1e3,"c":-2.5E-7}}',
            1,
            {"a": "1.50", "b": "1E+3", "c": "-2.5E-7"},
        ),
        # booleans as true/false, null as an absent field (a later duplicate wins)
        (b'{"code":1,"extFields":{"a":true,"b":false,"c":null}}', 1, {"a": "true", "b": "false"}),
        (b'{"code":1,"extFields":{"a":"x","b":"y","a":null}}', 1, {"b": "y"}),
        (b'{"code":1,"extFields":{"a":null}}', 1, {}),
        # integer fields written as strings, as fastjson reads them
        (b'{"code":"105","opaque":"-3"}', 105, None),
    ],
)
def test_json_lenient_forms_read_as_apache_does(
    text: bytes, code: int, ext: dict[str, str] | None
) -> None:
    for decode in _JSON_DECODERS:
        cmd = decode(SerializeType.JSON, text)
        assert cmd.code == code
        assert cmd.ext_fields == ext
        assert all(type(v) is str for v in (cmd.ext_fields or {}).values())


def test_json_cpp_header_fields() -> None:
    for decode in _JSON_DECODERS:
        cmd = decode(SerializeType.JSON, _CPP_SEND)
        assert cmd.language == LanguageCode.CPP
        assert cmd.opaque == 5
        assert cmd.version == 213
        assert cmd.remark == ""


def test_json_remark_number_is_its_text() -> None:
    for decode in _JSON_DECODERS:
        assert decode(SerializeType.JSON, b'{"code":1,"remark":12}').remark == "12"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        bytes(20),  # one byte short of the empty header
        bytes(22),  # one trailing byte
        bytes(13) + struct.pack(">i", -1) + bytes(4),  # negative remark length
        bytes(13) + struct.pack(">i", 100) + bytes(4),  # remark past the end
        bytes(13) + bytes(4) + struct.pack(">i", 50),  # extFields past the end
        bytes(13) + bytes(4) + struct.pack(">i", 3) + b"\x00\x05a",  # key past the block
        bytes(13) + struct.pack(">i", 2) + b"\xff\xfe" + bytes(4),  # remark not UTF-8
    ],
)
def test_binary_malformed_headers_raise_frame_error(data: bytes) -> None:
    with pytest.raises(FrameError):
        decode_header(SerializeType.ROCKETMQ, data)


@pytest.mark.parametrize(
    "obj",
    [
        {"code": 1},  # a map, not an array
        [1, 3, 409, 1],  # too short
        ["1", 3, 409, 1, 0, None, None],  # code not an integer
        [1, 3, 409, 1, 0, 5, None],  # remark not a string
        [1, 3, 409, 1, 0, None, {"a": 1}],  # ext value not a string
        [1, 3, 409, 1, 0, None, [1]],  # ext not a map
        [1, 3, 409, 1, 0, None, {1: "a"}],  # non-string key (strict_map_key)
        [1, 3, 409, 1.5, 0, None, None],  # float opaque
        [1, True, 409, 1, 0, None, None],  # bool language
    ],
)
def test_msgpack_malformed_headers_raise_frame_error(obj: object) -> None:
    data = msgpack.packb(obj, use_bin_type=True, strict_types=False)
    with pytest.raises(FrameError):
        decode_header(SerializeType.MSGPACK, data)


def test_msgpack_extra_trailing_elements_are_ignored() -> None:
    data = msgpack.packb([105, 3, 409, 9, 0, None, {"topic": "T"}, "future"], use_bin_type=True)
    cmd = decode_header(SerializeType.MSGPACK, data)
    assert cmd.code == 105
    assert cmd.opaque == 9
    assert cmd.ext_fields == {"topic": "T"}


def test_msgpack_header_layout() -> None:
    cmd = RemotingCommand(
        105,
        opaque=1,
        ext_fields={"topic": "T"},
        language=LanguageCode.JAVA,
        version=409,
        serialize_type=SerializeType.MSGPACK,
    )
    # fixarray(7), 105, 0, uint16 409, 1, 0, nil, fixmap(1) "topic" -> "T"
    assert encode_header(cmd) == bytes.fromhex("97 69 00 cd0199 01 00 c0 81 a5746f706963 a154")


def test_unknown_serialize_type() -> None:
    with pytest.raises(FrameError):
        decode_header(2, b"{}")
    with pytest.raises(ValueError, match="serialize type"):
        encode_header(RemotingCommand(1, serialize_type=2))


def test_binary_encode_rejects_code_outside_int16() -> None:
    with pytest.raises(ValueError, match="ROCKETMQ"):
        encode_header(RemotingCommand(200050, serialize_type=SerializeType.ROCKETMQ))


@pytest.mark.parametrize("serialize_type", [0, 1, 0x6D])
@pytest.mark.parametrize(
    "ext",
    [{"queueId": 3}, {"flag": True}, {"k": None}, {"k": b"bytes"}, {5: "v"}],
)
def test_non_string_ext_fields_are_rejected_at_encode(
    serialize_type: int, ext: dict[object, object]
) -> None:
    cmd = RemotingCommand(1, ext_fields=ext, serialize_type=serialize_type)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="extFields"):
        encode_header(cmd)

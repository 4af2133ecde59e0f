"""remoting._speedups (C) against the pure-Python frame and header codec it replaces.

Every case compares the native function with the Python reference on the same input: the same
bytes, the same command (values and their types), or the same exception type and message.
The tests run whether or not TRIMQ_NO_NATIVE is set (they set the native module up themselves);
they are skipped only when the extension is not built.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import random
import struct
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import (
    FrameError,
    FrameTooLargeError,
    LanguageCode,
    RemotingCommand,
    SerializeType,
    _frame,
    _header_codec,
)
from remoting._frame import FrameDecoder, py_encode_frame_parts, py_parse_frames
from remoting._header_codec import py_decode_header, py_encode_header

pytestmark = pytest.mark.unit

_speedups = pytest.importorskip("remoting._speedups")
NATIVE: types.ModuleType = _header_codec.native or _header_codec.setup_native(_speedups)

ROOT = Path(__file__).resolve().parents[3]
SLOTS = RemotingCommand.__slots__
MSGPACK = int(SerializeType.MSGPACK)


def _outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """('ok', value) or ('err', (exception type, message))."""
    try:
        return "ok", fn(*args)
    except Exception as exc:
        return "err", (type(exc), str(exc))


def _typed(cmd: RemotingCommand) -> tuple[object, ...]:
    """Every slot of `cmd` with its type (so 1 and True, or str and a subclass, differ)."""
    out: list[object] = []
    for name in SLOTS:
        value = getattr(cmd, name)
        if type(value) is dict:
            value = tuple(value.items())  # key order matters on the wire
        out.append((type(value), value))
    return (type(cmd), *out)


def _same_command_outcome(a: tuple[str, Any], b: tuple[str, Any]) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert _typed(a[1]) == _typed(b[1])
    else:
        assert a[1] == b[1]


# --- header and frame encode ------------------------------------------------------------------

TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"), st.sampled_from('\x01\x02\x00\x7f\x1f"\\/\b\f\n\r\té漢😀')
    ),
    max_size=40,
)
# Lone surrogates cannot be UTF-8 encoded: both sides must fail the same way.
ODD_TEXT = st.one_of(
    TEXT,
    st.sampled_from(["a\ud800b", "\udc00", "\ud83d\ude00", "x\udfff"]),
    st.text(min_size=32, max_size=300),
)


class _Code(enum.IntEnum):
    SEND = 310


class _Str(str):
    pass


class _Dict(dict[str, str]):
    pass


# Integers around every msgpack size boundary, beyond int64, and values that are not plain ints.
_EDGES = [
    0, 1, 31, 32, 127, 128, 255, 256, 2**15 - 1, 2**15, 65535, 65536, 2**31 - 1, 2**31,
    2**32 - 1, 2**32,
    2**63 - 1, 2**63, 2**64 - 1, 2**64,
]  # fmt: skip
INTS = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from(_EDGES + [-e for e in _EDGES] + [-32, -33, -128, -129, -32768, -32769]),
    st.integers(),
)
FIELD = st.one_of(
    INTS,
    INTS,
    INTS,
    st.sampled_from([True, False, _Code.SEND, LanguageCode.JAVA, 1.5, "7", None]),
)
EXT = st.one_of(
    st.none(),
    st.dictionaries(TEXT, TEXT, max_size=20),
    st.dictionaries(ODD_TEXT, ODD_TEXT, max_size=3),
    st.dictionaries(TEXT, st.one_of(TEXT, st.integers(), st.none(), st.binary()), max_size=3),
    st.builds(_Dict, st.dictionaries(TEXT, TEXT, max_size=3)),
    st.builds(lambda d: {_Str(k): _Str(v) for k, v in d.items()}, st.dictionaries(TEXT, TEXT)),
    st.just({5: "v"}),
)
REMARK = st.one_of(st.none(), ODD_TEXT, st.builds(_Str, TEXT), st.just(b"bytes"), st.just(3))
SERIALIZE = st.sampled_from([0, 1, MSGPACK, MSGPACK, MSGPACK, 2, SerializeType.MSGPACK, True])


def _view(data: bytes) -> memoryview:
    return memoryview(data)


BODY = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.builds(bytearray, st.binary(max_size=64)),
    st.binary(max_size=64).map(_view),
)


@st.composite
def commands(draw: Callable[[st.SearchStrategy[Any]], Any]) -> RemotingCommand:
    cmd = RemotingCommand(
        draw(FIELD),
        opaque=draw(FIELD),
        flag=draw(FIELD),
        remark=draw(REMARK),
        ext_fields=draw(EXT),
        body=draw(BODY),
        language=draw(FIELD),
        version=draw(FIELD),
        serialize_type=draw(SERIALIZE),
    )
    return cmd


@settings(max_examples=1500, deadline=None)
@given(commands())
def test_encode_header_matches_python(cmd: RemotingCommand) -> None:
    assert _outcome(NATIVE.encode_header, cmd) == _outcome(py_encode_header, cmd)


@settings(max_examples=1500, deadline=None)
@given(commands())
def test_encode_frame_parts_matches_python(cmd: RemotingCommand) -> None:
    native = _outcome(NATIVE.encode_frame_parts, cmd)
    python = _outcome(py_encode_frame_parts, cmd)
    assert native[0] == python[0], (native, python)
    if native[0] == "err":
        assert native[1] == python[1]
        return
    (n_head, n_body), (p_head, p_body) = native[1], python[1]
    assert type(n_head) is bytes
    assert n_head == p_head
    assert n_body is p_body  # the body object itself, never a copy (None when empty)


def test_msgpack_encode_is_native_for_the_common_case() -> None:
    cmd = RemotingCommand(
        310, opaque=7, ext_fields={"a": "PG", "b": "T"}, body=b"x", serialize_type=MSGPACK
    )
    head, body = NATIVE.encode_frame_parts(cmd)
    assert body == b"x"
    assert head[8:] == py_encode_header(cmd)
    assert struct.unpack(">iI", head[:8]) == (
        4 + len(head) - 8 + 1,
        (MSGPACK << 24) | len(head) - 8,
    )


def test_encode_subclass_and_unset_slots_take_the_python_path() -> None:
    class Sub(RemotingCommand):
        __slots__ = ()

    sub = Sub(1, ext_fields={"k": "v"}, serialize_type=MSGPACK)
    assert NATIVE.encode_frame_parts(sub) == py_encode_frame_parts(sub)
    bare = object.__new__(RemotingCommand)
    native = _outcome(NATIVE.encode_frame_parts, bare)
    assert native[0] == "err"
    assert native[1][0] is AttributeError
    bare.serialize_type = MSGPACK
    assert _outcome(NATIVE.encode_frame_parts, bare)[1][0] is AttributeError


def test_frame_too_large_to_describe() -> None:
    cmd = RemotingCommand(1, serialize_type=MSGPACK, remark="r" * (0xFFFFFF + 1))
    assert _outcome(NATIVE.encode_frame_parts, cmd) == _outcome(py_encode_frame_parts, cmd)
    assert _outcome(NATIVE.encode_frame_parts, cmd)[0] == "err"


# --- header decode ----------------------------------------------------------------------------

# msgpack values: mostly the header's shape, often slightly off it.
MP_INTS = INTS.filter(lambda i: -(2**63) <= i < 2**64)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    MP_INTS,
    st.floats(allow_nan=False),
    TEXT,
    st.binary(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=8), st.dictionaries(st.one_of(TEXT, MP_INTS), inner)
    ),
    max_leaves=12,
)


@st.composite
def header_objects(draw: st.DrawFn) -> object:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(VALUES)
    fields: list[object] = [draw(MP_INTS) for _ in range(5)]
    fields.append(draw(st.one_of(st.none(), TEXT, st.text(min_size=30, max_size=70000))))
    fields.append(draw(st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=20))))
    if kind == 1:
        fields[draw(st.integers(0, 6))] = draw(VALUES)
    elif kind == 2:
        fields.append(draw(VALUES))  # a later version's extra element
    elif kind == 3:
        fields.pop()
    return fields


def _pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(header_objects(), st.sampled_from(["as-is", "trailing", "truncate", "flip"]), st.data())
def test_decode_header_matches_python(obj: object, how: str, data: st.DataObject) -> None:
    raw = _pack(obj)
    if how == "trailing":
        raw += data.draw(st.binary(min_size=1, max_size=3))
    elif how == "truncate" and raw:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip" and raw:
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1 :]
    for serialize_type in (MSGPACK, 0, 1, 2):
        _same_command_outcome(
            _outcome(NATIVE.decode_header, serialize_type, raw),
            _outcome(py_decode_header, serialize_type, raw),
        )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x97",
        bytes.fromhex("97 01 03 cd0199 01 00 a2ff41 c0"),  # remark not UTF-8
        bytes.fromhex("97 01 03 cd0199 01 00 c0 81 a1ff a141"),  # key not UTF-8
        bytes.fromhex("97 01 03 cd0199 01 00 c0 81 a141 a2c3"),  # value truncated UTF-8
        bytes.fromhex("97 01 03 cd0199 01 00 c0 81 a141 a3414243"),  # string past the end
        bytes.fromhex("97 01 03 cd0199 01 00 c0 8f"),  # 15 entries announced, none there
        bytes.fromhex("97 01 03 cd0199 01 00 c0 df ffffffff"),  # huge map length
        bytes.fromhex("97 01 03 cd0199 01 00 db ffffffff"),  # huge str length
        bytes.fromhex("97 01 03 cd0199 01 00 c0 c0 00"),  # trailing byte
        bytes.fromhex("97 cf ffffffffffffffff 03 00 01 00 c0 c0"),  # uint64 above int64
        bytes.fromhex("97 c3 03 00 01 00 c0 c0"),  # bool code
        bytes.fromhex("97 01 63 00 01 00 c0 c0"),  # unknown language 99 -> OTHER
        bytes.fromhex("dc0007 01 03 00 01 00 c0 c0"),  # array16 of 7
        bytes.fromhex("97 01 03 00 01 00 c0 de0001 a141 a142"),  # map16
        bytes.fromhex("97 d3 8000000000000000 03 00 01 00 d9 03 616263 c0"),  # int64 min, str8
    ],
)
def test_decode_edge_cases_match_python(raw: bytes) -> None:
    _same_command_outcome(
        _outcome(NATIVE.decode_header, MSGPACK, raw), _outcome(py_decode_header, MSGPACK, raw)
    )


def test_decode_header_odd_arguments_go_to_python() -> None:
    raw = _pack([1, 3, 409, 1, 0, None, None])
    for serialize_type in (SerializeType.MSGPACK, 109.0, True, 2**70, -1):
        _same_command_outcome(
            _outcome(NATIVE.decode_header, serialize_type, raw),
            _outcome(py_decode_header, serialize_type, raw),
        )
    with pytest.raises(TypeError):
        NATIVE.decode_header(MSGPACK)


# --- ROCKETMQ binary header (type 1) -----------------------------------------------------------


@st.composite
def binary_headers(draw: st.DrawFn) -> bytes:
    cmd = RemotingCommand(
        draw(st.integers(-(2**15), 2**15 - 1)),
        opaque=draw(st.integers(-(2**31), 2**31 - 1)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        remark=draw(st.one_of(st.none(), TEXT)),
        ext_fields=draw(st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=14))),
        language=draw(st.integers(0, 255)),
        version=draw(st.integers(-(2**15), 2**15 - 1)),
        serialize_type=1,
    )
    raw = bytearray(py_encode_header(cmd))
    if draw(st.booleans()):
        raw[2] = draw(st.integers(0, 255))  # any language byte, known or not
    how = draw(st.sampled_from(["as-is", "trailing", "truncate", "flip", "flip", "int32"]))
    if how == "trailing":
        raw += draw(st.binary(min_size=1, max_size=3))
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        pos = draw(st.integers(0, len(raw) - 1))
        raw[pos] ^= draw(st.integers(1, 255))
    elif how == "int32" and len(raw) >= 21:
        # Overwrite the remark or extFields length (or something after it) with any int32.
        pos = draw(st.integers(13, len(raw) - 4))
        raw[pos : pos + 4] = struct.pack(">i", draw(INTS.filter(lambda i: -(2**31) <= i < 2**31)))
    return bytes(raw)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(binary_headers())
def test_binary_decode_matches_python(raw: bytes) -> None:
    _same_command_outcome(
        _outcome(NATIVE.decode_header, 1, raw), _outcome(py_decode_header, 1, raw)
    )


@pytest.mark.parametrize(
    "raw",
    [
        bytes(20),
        bytes(21),
        bytes.fromhex("0069 46 0199 00000001 00000000 00000000 00000000"),  # language 70
        bytes.fromhex("0069 c8 0199 00000001 00000000 00000000 00000000"),  # language 200
        bytes.fromhex("0069 00 0199 00000001 00000000 ffffffff 00000000"),  # remark length -1
        bytes.fromhex("0069 00 0199 00000001 00000000 00000002 ff41 00000000"),  # remark not UTF-8
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 fffffffe"),  # ext length negative
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000009 8001 41 00000001 42"),
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000008 0001 ff 00000001 42"),
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000008 0001 41 00000001 ff"),
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000008 0001 41 ffffffff 42"),
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000009 0001 41 00000001 42 00"),
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000008 0001 41 00000000 42"),
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000 00000007 0001 41 00000000") + b"X",
        # A key length with the sign bit set, inside a block big enough to hold that many bytes.
        bytes.fromhex("0069 00 0199 00000001 00000000 00000000")
        + struct.pack(">iH", 2 + 0x8000 + 4, 0x8000)
        + b"k" * 0x8000
        + bytes(4),
    ],
)
def test_binary_decode_edge_cases_match_python(raw: bytes) -> None:
    _same_command_outcome(
        _outcome(NATIVE.decode_header, 1, raw), _outcome(py_decode_header, 1, raw)
    )


@pytest.mark.parametrize(
    "cmd",
    [
        RemotingCommand(2**15, serialize_type=1),
        RemotingCommand(1, version=-(2**15) - 1, serialize_type=1),
        RemotingCommand(1, opaque=2**31, serialize_type=1),
        RemotingCommand(1, flag=-(2**31) - 1, serialize_type=1),
        RemotingCommand(1, language=256, serialize_type=1),
        RemotingCommand(1, language=-1, serialize_type=1),
        RemotingCommand(1, remark="", ext_fields={}, serialize_type=1),
        RemotingCommand(1, remark="", ext_fields={"k": ""}, serialize_type=1),
        RemotingCommand(1, ext_fields={"k" * 0x7FFF: "v"}, serialize_type=1),
        RemotingCommand(1, ext_fields={"k" * 0x8000: "v"}, serialize_type=1),
        RemotingCommand(1, ext_fields={"é" * 0x4000: "v"}, serialize_type=1),
        RemotingCommand(1, remark="a\udc80", serialize_type=1),
        RemotingCommand(1, ext_fields={"k": "\ud800"}, serialize_type=1),
    ],
)
def test_binary_encode_edge_cases_match_python(cmd: RemotingCommand) -> None:
    assert _outcome(NATIVE.encode_frame_parts, cmd) == _outcome(py_encode_frame_parts, cmd)
    assert _outcome(NATIVE.encode_header, cmd) == _outcome(py_encode_header, cmd)


# --- JSON header decode (type 0) ---------------------------------------------------------------

_JSON_KEYS = ["code", "flag", "opaque", "version", "language", "remark", "extFields"]
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    ODD_TEXT,
    st.sampled_from(["JAVA", "PYTHON", "GO", "OTHER", "java", "", "RUST"]),
    # extFields values as real clients send them: strings, numbers, booleans, null.
    st.dictionaries(
        ODD_TEXT,
        st.one_of(
            ODD_TEXT,
            st.integers(),
            st.integers(-(10**25), 10**25),
            st.none(),
            st.booleans(),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        max_size=4,
    ),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), TEXT), max_size=3),
    st.dictionaries(TEXT, TEXT, max_size=6),
    st.lists(st.integers(), max_size=2),
)


@st.composite
def json_headers(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        cmd = RemotingCommand(
            draw(st.integers(-(2**31), 2**31 - 1)),
            opaque=draw(st.integers(-(2**31), 2**31 - 1)),
            flag=draw(st.integers(0, 3)),
            remark=draw(st.one_of(st.none(), ODD_TEXT)),
            ext_fields=draw(st.one_of(st.none(), st.dictionaries(ODD_TEXT, ODD_TEXT, max_size=14))),
            language=draw(st.integers(-1, 70)),
            version=draw(st.integers(-(2**31), 2**31 - 1)),
            serialize_type=0,
        )
        raw = py_encode_header(cmd)
    else:
        keys = draw(st.lists(st.sampled_from([*_JSON_KEYS, "serializeTypeCurrentRPC", "x"])))
        obj = {k: draw(JSON_VALUES) for k in keys}
        text = json.dumps(
            obj,
            ensure_ascii=draw(st.booleans()),
            separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :")])),
            indent=draw(st.sampled_from([None, None, 1])),
        )
        raw = text.encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(["as-is", "as-is", "trailing", "truncate", "flip", "ws"]))
    if how == "trailing":
        raw += draw(st.sampled_from([b" ", b"\n", b"x", b"}", b",", b"\t\r"]))
    elif how == "truncate" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif how == "flip" and raw:
        pos = draw(st.integers(0, len(raw) - 1))
        raw = raw[:pos] + bytes([raw[pos] ^ draw(st.integers(1, 255))]) + raw[pos + 1 :]
    elif how == "ws" and raw:
        pos = draw(st.integers(0, len(raw)))
        raw = raw[:pos] + draw(st.sampled_from([b" ", b"\n", b"\x0b", b"\x00"])) + raw[pos:]
    return raw


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(json_headers())
def test_json_decode_matches_python(raw: bytes) -> None:
    _same_command_outcome(
        _outcome(NATIVE.decode_header, 0, raw), _outcome(py_decode_header, 0, raw)
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"{}",
        b" { } ",
        b"{,}",
        b'{"code":1,}',
        b'{"code":1 "flag":2}',
        b'{"code":1,,"flag":2}',
        b'{"c\\u006fde":7}',
        b'{"code":1,"code":null}',
        b'{"code":01}',
        b'{"code":-}',
        b'{"code":-0}',
        b'{"code":1e5}',
        b'{"code":1.0}',
        b'{"code":NaN}',
        b'{"code":true}',
        b'{"code":1234567890123456789}',
        b'{"code":123456789012345678}',
        b'{"language":"PYTHON","language":null}',
        b'{"language":"nope"}',
        b'{"language":99}',
        b'{"language":-1}',
        b'{"language":true}',
        b'{"remark":"a\\ud83d\\ude00b\\ud800\\u00e9\\/\\"\\\\"}',
        b'{"remark":"\\udc00\\ud800"}',
        b'{"remark":"\\ud800\\u0041"}',
        b'{"remark":"\\ud800\\ue000\\udbff\\udfff\\ud800\\udc00"}',
        b'{"remark":"\\x"}',
        b'{"remark":"\\u12"}',
        b'{"remark":"\\u12g4"}',
        b'{"remark":"a\x01b"}',
        b'{"remark":"\xed\xa0\x80"}',
        b'{"remark":"\xff"}',
        b'{"remark":"caf\xc3\xa9 \\n"}',
        b'{"remark":"\\',
        b'{"remark":"abc',
        b'{"extFields":{}}',
        b'{"extFields":{"a":"b",}}',
        b'{"extFields":{"a":"b" "c":"d"}}',
        b'{"extFields":{"a":"b","a":"c"}}',
        b'{"extFields":{"a":1}}',
        b'{"extFields":{"a":-0,"b":123456789012345678901234567890,"c":0}}',
        b'{"extFields":{"a":true,"b":false,"c":null}}',
        b'{"extFields":{"a":"1","b":"x","a":null,"a":"2"}}',
        b'{"extFields":{"a":null,"a":"2"}}',
        b'{"extFields":{"a":1.50,"b":1e3,"c":-1.5E-7}}',
        b'{"extFields":{"a":01}}',
        b'{"extFields":{"a":tru}}',
        b'{"extFields":{"a":nul}}',
        b'{"extFields":{"a":[1]}}',
        b'{"extFields":{"a":{"b":"c"}}}',
        b'{"code":"105","opaque":"-3","flag":"1.5"}',
        b'{"remark":12}',
        b'{"extFields":{"a":"b"},"extFields":null}',
        b'{"extFields":[]}',
        b'{"x":{"nested":1},"code":3}',
        b'{"x":[1,2],"code":3}',
        b'{"x":-5,"y":null,"z":"s","code":3}',
        b'\xef\xbb\xbf{"code":1}',
        b'{"code":1}\x00',
        b"[1]",
        b"",
    ],
)
def test_json_decode_edge_cases_match_python(raw: bytes) -> None:
    _same_command_outcome(
        _outcome(NATIVE.decode_header, 0, raw), _outcome(py_decode_header, 0, raw)
    )


# --- frames -----------------------------------------------------------------------------------


def _frame_bytes(cmd: RemotingCommand) -> bytes:
    head, body = py_encode_frame_parts(cmd)
    return head if body is None else head + bytes(body)


@st.composite
def valid_commands(draw: st.DrawFn) -> RemotingCommand:
    serialize_type = draw(st.sampled_from([0, 1, MSGPACK, MSGPACK]))
    small = serialize_type == 1
    num = st.integers(-(2**15), 2**15 - 1) if small else st.integers(-(2**31), 2**31 - 1)
    remark = draw(st.one_of(st.none(), TEXT))
    return RemotingCommand(
        draw(num),
        opaque=draw(st.integers(-(2**31), 2**31 - 1)),
        flag=draw(st.integers(0, 3)),
        remark=None if small and remark == "" else remark,
        ext_fields=draw(st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=14))),
        body=draw(st.one_of(st.none(), st.binary(min_size=1, max_size=100))),
        language=draw(st.sampled_from([int(x) for x in LanguageCode])),
        version=draw(num),
        serialize_type=serialize_type,
    )


@contextlib.contextmanager
def _frame_loop(parse: Callable[..., int]) -> Iterator[None]:
    """FrameDecoder with `parse` as its frame loop (hypothesis cannot use monkeypatch)."""
    saved = _frame._parse_frames
    _frame._parse_frames = parse
    try:
        yield
    finally:
        _frame._parse_frames = saved


def _feed_all(
    parse: Callable[..., int], chunks: Sequence[bytes | bytearray], max_len: int
) -> tuple[list[tuple[object, ...]], tuple[str, Any], int]:
    """Run a FrameDecoder with `parse` as its frame loop over `chunks`."""
    decoder = FrameDecoder(max_len)
    out: list[RemotingCommand] = []
    result: tuple[str, Any] = ("ok", None)
    with _frame_loop(parse):
        for chunk in chunks:
            got = _outcome(decoder.feed, chunk)
            if got[0] == "err":
                result = got
                break
            out.extend(got[1])
    return [_typed(c) for c in out], result, decoder.buffered


@settings(max_examples=60, deadline=None)
@given(st.lists(valid_commands(), min_size=1, max_size=3))
def test_frames_split_at_every_byte_boundary(cmds: list[RemotingCommand]) -> None:
    stream = b"".join(_frame_bytes(c) for c in cmds)
    for cut in range(len(stream) + 1):
        chunks: list[bytes | bytearray] = [stream[:cut], bytearray(stream[cut:])]
        native = _feed_all(NATIVE.parse_frames, chunks, 1 << 24)
        python = _feed_all(py_parse_frames, chunks, 1 << 24)
        assert native[1:] == python[1:] == (("ok", None), 0)
        assert native[0] == python[0]  # values and their types, slot by slot
        assert [c[0] for c in native[0]] == [RemotingCommand] * len(cmds)
    # And the values are the commands sent (RemotingCommand equality: {} and None alike).
    with _frame_loop(NATIVE.parse_frames):
        assert FrameDecoder().feed(stream) == cmds


@settings(max_examples=400, deadline=None)
@given(
    st.lists(valid_commands(), max_size=3),
    st.lists(st.binary(max_size=40), max_size=3),
    st.sampled_from([0, 3, 8, 40, 1 << 24]),
    st.integers(0, 2**32),
    st.data(),
)
def test_hostile_streams_match_python(
    cmds: list[RemotingCommand],
    junk: list[bytes],
    max_len: int,
    seed: int,
    data: st.DataObject,
) -> None:
    rnd = random.Random(seed)
    parts = [_frame_bytes(c) for c in cmds] + junk
    rnd.shuffle(parts)
    stream = bytearray(b"".join(parts))
    if stream and data.draw(st.booleans()):
        pos = data.draw(st.integers(0, len(stream) - 1))
        stream[pos] ^= data.draw(st.integers(1, 255))
    chunks: list[bytes] = []
    pos = 0
    while pos < len(stream):
        step = rnd.choice([1, 2, 5, 9, 64, 1000])
        chunks.append(bytes(stream[pos : pos + step]))
        pos += step
    native = _feed_all(NATIVE.parse_frames, chunks, max_len)
    python = _feed_all(py_parse_frames, chunks, max_len)
    assert native == python
    if native[1][0] == "err":
        assert issubclass(native[1][1][0], FrameError)


@pytest.mark.parametrize(
    ("raw", "max_len", "error"),
    [
        (struct.pack(">i", 1025), 1024, FrameTooLargeError),
        (b"\x7f\xff\xff\xff", 1 << 24, FrameTooLargeError),
        (struct.pack(">i", -1), 1 << 24, FrameError),
        (struct.pack(">i", 0), 1 << 24, FrameError),
        (struct.pack(">i", 3) + bytes(8), 1 << 24, FrameError),
        (struct.pack(">iI", 10, 7) + bytes(6), 1 << 24, FrameError),
        (struct.pack(">iI", 4, (1 << 24) | 1), 1 << 24, FrameError),
        (struct.pack(">iI", 12, (MSGPACK << 24) | 8) + b"\x97" + bytes(7), 1 << 24, FrameError),
        (struct.pack(">iI", 7, (2 << 24) | 3) + b"abc", 1 << 24, FrameError),
        (struct.pack(">iI", 5, 0) + b"x", -1, FrameTooLargeError),
        (struct.pack(">iI", 5, (MSGPACK << 24) | 1) + b"\xc0", 2**80, FrameError),
    ],
)
def test_frame_errors_match_python(raw: bytes, max_len: int, error: type[Exception]) -> None:
    native_out: list[RemotingCommand] = []
    python_out: list[RemotingCommand] = []
    native = _outcome(NATIVE.parse_frames, raw, max_len, native_out)
    python = _outcome(py_parse_frames, raw, max_len, python_out)
    assert native == python
    assert native[0] == "err"
    assert native[1][0] is error


def test_parse_frames_accepts_any_buffer_and_rejects_bad_arguments() -> None:
    cmd = RemotingCommand(1, opaque=5, body=b"b", serialize_type=MSGPACK)
    frame = _frame_bytes(cmd)
    for src in (frame, bytearray(frame), memoryview(frame), memoryview(b"xx" + frame)[2:]):
        out: list[RemotingCommand] = []
        assert NATIVE.parse_frames(src, 1 << 24, out) == len(frame)
        assert out == [cmd]
    with pytest.raises(TypeError):
        NATIVE.parse_frames("text", 100, [])
    with pytest.raises(TypeError):
        NATIVE.parse_frames(frame, 100, ())
    with pytest.raises(TypeError):
        NATIVE.parse_frames(frame, "100", [])


def test_setup_rejects_a_class_without_the_slots() -> None:
    class Other:
        __slots__ = ("code",)

    with pytest.raises(TypeError, match="__slots__"):
        NATIVE.setup(
            Other, py_decode_header, py_encode_header, FrameError, FrameError, (0,), 7, ("JAVA",)
        )
    # The failed call left the working setup in place.
    cmd = RemotingCommand(1, serialize_type=MSGPACK)
    assert NATIVE.encode_header(cmd) == py_encode_header(cmd)


# --- selection --------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "native"), [(None, True), ("", True), ("0", True), ("1", False)])
def test_trimq_no_native_selects_the_python_codec(value: str | None, native: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRIMQ_NO_NATIVE"}
    if value is not None:
        env["TRIMQ_NO_NATIVE"] = value
    code = (
        "from remoting import _frame, _header_codec as h\n"
        "n = h.native\n"
        "print(n is not None, _frame.encode_frame_parts is (n and n.encode_frame_parts),"
        " h.decode_header is (n and n.decode_header))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    expected = "True True True" if native else "False False False"
    assert result.stdout.split("\n")[0] == expected

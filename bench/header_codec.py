"""RemotingCommand header codecs: trimq's native C, its pure-Python reference, and msgspec.

Could msgspec (https://jcristharif.com/msgspec/) replace the header part of
remoting/_speedups.c? Measured per call, on this machine, for four representative headers in
JSON (serialize type 0) and msgpack (0x6D, trimq's own), both directions, with the same API as
`remoting.decode_header(serialize_type, data) -> RemotingCommand` and
`remoting.encode_header(cmd) -> bytes`, end to end (extFields values are str, language and the
fixed fields as trimq's callers get them, the same FrameError/ValueError contract):

  native        remoting._speedups (what runs unless TRIMQ_NO_NATIVE=1)
  python        py_decode_header / py_encode_header (what TRIMQ_NO_NATIVE=1 runs)
  ms dict       msgspec decodes into plain Python objects (JSON: float_hook keeps a number's
                text), then the checks and conversions of the reference in Python
  ms Struct     msgspec decodes into a msgspec.Struct mirroring the header with
                RemotingCommand's types (code, language, version, opaque, flag, remark,
                extFields, serializeTypeCurrentRPC; a missing field gets Java's default;
                msgpack: array_like); a JSON header outside those types (the C++ client's
                numbers in extFields, "105" as a code, nulls) is decoded again by the "ms dict"
                path, as the native codec hands such headers to Python. Encode: a Struct in
                fastjson's field order (msgpack: array_like) built from the command, encoded.
  ms call only  the bare msgspec call of "ms Struct" (decode into the Struct / encode a built
                Struct): no RemotingCommand, no checks; the floor of any msgspec design

Before it is timed, every variant's result is checked against the Python reference's (the
same command; encoded bytes decoded back to the same command), and the table says whether the
encoded bytes are the same as trimq's. Times: best of 5 repeats of a timeit loop (each repeat
>= 0.2 s, 0.02 s with --quick), microseconds per call; ratios are against the native codec.
Two more tables run the behaviour cases (the leniencies and checks of remoting/_header_codec.py
and its tests) through every decoder, and odd commands through every encoder. The write-up is
docs/header-codec-msgspec.md.

Usage: python bench/header_codec.py [--quick]   (needs msgspec: pip install msgspec)
"""

from __future__ import annotations

import argparse
import re
import timeit
import types
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from remoting import (
    FLAG_RESPONSE,
    FrameError,
    LanguageCode,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    _header_codec,
)
from remoting._command import DEFAULT_VERSION, new_command
from remoting._header_codec import py_decode_header, py_encode_header
from remoting.protocol.headers import (
    PullMessageRequestHeader,
    SendMessageResponseHeader,
    send_request_fields_v2,
)

JSON = int(SerializeType.JSON)
MSGPACK = int(SerializeType.MSGPACK)
PYTHON = int(LanguageCode.PYTHON)

Decode = Callable[[int, bytes], RemotingCommand]
Encode = Callable[[RemotingCommand], bytes]


def _native() -> types.ModuleType | None:
    """remoting._speedups, set up (also under TRIMQ_NO_NATIVE=1); None when not built."""
    if _header_codec.native is not None:
        return _header_codec.native
    try:
        from remoting import _speedups
    except ImportError:
        return None
    return _header_codec.setup_native(_speedups)


# ---------------------------------------------------------------------------------------------
# msgspec codecs: the API and the contract of remoting._header_codec
# ---------------------------------------------------------------------------------------------
_LANG_NAME: dict[int, str] = {int(m): m.name for m in LanguageCode}
_LANG_BY_NAME: dict[str, int] = {m.name: int(m) for m in LanguageCode}
_LANG_OTHER = int(LanguageCode.OTHER)
_LANG_VALID = frozenset(_LANG_NAME)
_DIGITS = re.compile(r"-?[0-9]{1,19}")
# What msgspec raises on bad input: DecodeError (ValidationError is one), UnicodeDecodeError
# (invalid UTF-8 in a str), RecursionError (nesting), and ArithmeticError/ValueError from the
# float hook (Decimal) or int().
_MS_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ArithmeticError, ValueError)


class _Number(str):
    """A JSON number with a fraction or exponent, as Java's BigDecimal.toString writes it."""

    __slots__ = ()


def _number(text: str) -> _Number:
    # msgspec hands the float_hook the number's text: keep it as the reference does.
    return _Number(str(Decimal(text)))


class JsonHeader(msgspec.Struct):
    """The JSON header as decoded: RemotingCommand's types, and a missing field's default."""

    code: int = 0
    extFields: dict[str, str] | None = None  # the wire names
    flag: int = 0
    language: str | int = "JAVA"
    opaque: int = 0
    remark: str | None = None
    serializeTypeCurrentRPC: str | None = None
    version: int = 0


class JsonHeaderOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The JSON header as trimq writes it: fastjson's alphabetical order, no null fields."""

    code: int
    extFields: dict[str, str] | None = None
    flag: int
    language: str
    opaque: int
    remark: str | None = None
    serializeTypeCurrentRPC: str
    version: int


class MsgpackHeader(msgspec.Struct, array_like=True):
    """trimq's msgpack header: [code, language, version, opaque, flag, remark, extFields]."""

    code: int
    language: int
    version: int
    opaque: int
    flag: int
    remark: str | None
    extFields: dict[str, str] | None


_json_any = msgspec.json.Decoder(float_hook=_number)
_json_struct = msgspec.json.Decoder(JsonHeader)
_json_enc = msgspec.json.Encoder()
_mp_any = msgspec.msgpack.Decoder()
_mp_struct = msgspec.msgpack.Decoder(MsgpackHeader)
_mp_enc = msgspec.msgpack.Encoder()


def _ms_int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0  # every fixed field defaults to 0 when absent (language aside)
    if type(value) is int:
        return value
    if type(value) is str and _DIGITS.fullmatch(value):
        return int(value)
    raise FrameError(f"JSON header field {key!r} is not an integer: {value!r:.40}")


def _ms_language(value: object) -> int:
    if value is None:
        return int(LanguageCode.JAVA)
    if type(value) is str:
        return _LANG_BY_NAME.get(value, _LANG_OTHER)
    if type(value) is int:
        return value if value in _LANG_VALID else _LANG_OTHER
    raise FrameError(f"JSON header field 'language' is neither a name nor a number: {value!r:.40}")


def _ms_ext(ext: object) -> dict[str, str] | None:
    if ext is None:
        return None
    if type(ext) is not dict:
        raise FrameError("JSON header extFields is not an object")
    for value in ext.values():
        if type(value) is not str:
            break
    else:
        return ext
    out: dict[str, str] = {}
    for key, value in ext.items():
        kind = type(value)
        if kind is str:
            out[key] = value
        elif kind is int or kind is _Number:
            out[key] = str(value)  # an int's text: "-0" becomes "0" (the reference keeps "-0")
        elif kind is bool:
            out[key] = "true" if value else "false"
        elif value is None:
            continue
        else:
            raise FrameError(f"JSON header extFields entry {key!r:.40} is not a string or number")
    return out


def _ms_json_dict(data: bytes) -> RemotingCommand:
    try:
        obj = _json_any.decode(data)
    except _MS_ERRORS as exc:
        raise FrameError(f"JSON header is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise FrameError("JSON header is not an object")
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        if type(remark) is int or type(remark) is _Number:
            remark = str(remark)
        else:
            raise FrameError("JSON header field 'remark' is not a string")
    return new_command(
        _ms_int(obj, "code"),
        _ms_int(obj, "opaque"),
        _ms_int(obj, "flag"),
        remark,
        _ms_ext(obj.get("extFields")),
        None,
        _ms_language(obj.get("language")),
        _ms_int(obj, "version"),
        JSON,
    )


def _ms_msgpack_dict(data: bytes) -> RemotingCommand:
    try:
        obj = _mp_any.decode(data)
    except _MS_ERRORS as exc:
        raise FrameError(f"msgpack header is not valid msgpack: {type(exc).__name__}") from None
    if type(obj) is not list or len(obj) < 7:
        raise FrameError("msgpack header is not an array of at least 7 elements")
    code, language, version, opaque, flag, remark, ext = obj[:7]
    if (
        type(code) is not int
        or type(language) is not int
        or type(version) is not int
        or type(opaque) is not int
        or type(flag) is not int
    ):
        raise FrameError(
            "msgpack header: code, language, version, opaque and flag must be integers"
        )
    if remark is not None and type(remark) is not str:
        raise FrameError("msgpack header remark is not a string")
    if ext is not None:
        if type(ext) is not dict:
            raise FrameError("msgpack header extFields is not a map")
        for key, value in ext.items():
            if type(value) is not str or type(key) is not str:
                raise FrameError(f"msgpack header extFields entry {key!r:.40} is not str to str")
    return new_command(
        code,
        opaque,
        flag,
        remark,
        ext,
        None,
        language if language in _LANG_VALID else _LANG_OTHER,
        version,
        MSGPACK,
    )


def ms_dict_decode(serialize_type: int, data: bytes) -> RemotingCommand:
    if serialize_type == MSGPACK:
        return _ms_msgpack_dict(data)
    if serialize_type == JSON:
        return _ms_json_dict(data)
    return py_decode_header(serialize_type, data)  # ROCKETMQ binary: not msgspec's


def ms_struct_decode(serialize_type: int, data: bytes) -> RemotingCommand:
    if serialize_type == MSGPACK:
        try:
            m = _mp_struct.decode(data)
        except _MS_ERRORS as exc:
            raise FrameError(f"msgpack header is not valid msgpack: {exc}") from None
        lang = m.language
        return new_command(
            m.code,
            m.opaque,
            m.flag,
            m.remark,
            m.extFields,
            None,
            lang if lang in _LANG_VALID else _LANG_OTHER,
            m.version,
            MSGPACK,
        )
    if serialize_type == JSON:
        try:
            h = _json_struct.decode(data)
        except msgspec.ValidationError:
            return _ms_json_dict(data)  # the lenient forms: numbers in extFields, nulls, "105"
        except _MS_ERRORS as exc:
            raise FrameError(f"JSON header is not valid JSON: {exc}") from None
        name = h.language
        if isinstance(name, str):
            language = _LANG_BY_NAME.get(name, _LANG_OTHER)
        else:
            language = name if name in _LANG_VALID else _LANG_OTHER
        return new_command(
            h.code, h.opaque, h.flag, h.remark, h.extFields, None, language, h.version, JSON
        )
    return py_decode_header(serialize_type, data)


def _check_for_encode(cmd: RemotingCommand) -> None:
    """The checks of py_encode_header, which msgspec does not make (it writes an int as a JSON
    number where a str is expected): extFields str to str, remark a str."""
    ext = cmd.ext_fields
    if ext:
        for key, value in ext.items():
            if type(value) is not str or type(key) is not str:
                raise ValueError(f"extFields must map str to str; got {key!r:.40}")
    if cmd.remark is not None and type(cmd.remark) is not str:
        raise ValueError("remark must be a str")


def ms_dict_encode(cmd: RemotingCommand) -> bytes:
    _check_for_encode(cmd)
    try:
        if cmd.serialize_type == MSGPACK:
            return _mp_enc.encode(
                (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark,
                 cmd.ext_fields)
            )  # fmt: skip
        if cmd.serialize_type == JSON:
            obj: dict[str, object] = {"code": cmd.code}
            if cmd.ext_fields is not None:
                obj["extFields"] = cmd.ext_fields
            obj["flag"] = cmd.flag
            obj["language"] = _LANG_NAME.get(cmd.language, "OTHER")
            obj["opaque"] = cmd.opaque
            if cmd.remark is not None:
                obj["remark"] = cmd.remark
            obj["serializeTypeCurrentRPC"] = "JSON"
            obj["version"] = cmd.version
            return _json_enc.encode(obj)
    except (UnicodeEncodeError, OverflowError, TypeError) as exc:  # lone surrogates, > uint64
        raise ValueError(f"command does not fit the header: {exc}") from None
    return py_encode_header(cmd)


def ms_struct_encode(cmd: RemotingCommand) -> bytes:
    _check_for_encode(cmd)
    try:
        if cmd.serialize_type == MSGPACK:
            return _mp_enc.encode(
                MsgpackHeader(
                    cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark,
                    cmd.ext_fields,
                )
            )  # fmt: skip
        if cmd.serialize_type == JSON:
            return _json_enc.encode(
                JsonHeaderOut(
                    code=cmd.code,
                    extFields=cmd.ext_fields,
                    flag=cmd.flag,
                    language=_LANG_NAME.get(cmd.language, "OTHER"),
                    opaque=cmd.opaque,
                    remark=cmd.remark,
                    serializeTypeCurrentRPC="JSON",
                    version=cmd.version,
                )
            )
    except (UnicodeEncodeError, OverflowError, TypeError) as exc:
        raise ValueError(f"command does not fit the header: {exc}") from None
    return py_encode_header(cmd)


def _struct_of(cmd: RemotingCommand) -> JsonHeaderOut | MsgpackHeader:
    if cmd.serialize_type == MSGPACK:
        return MsgpackHeader(
            cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields
        )
    return JsonHeaderOut(
        code=cmd.code,
        extFields=cmd.ext_fields,
        flag=cmd.flag,
        language=_LANG_NAME.get(cmd.language, "OTHER"),
        opaque=cmd.opaque,
        remark=cmd.remark,
        serializeTypeCurrentRPC="JSON",
        version=cmd.version,
    )


# ---------------------------------------------------------------------------------------------
# the headers
# ---------------------------------------------------------------------------------------------
PROPERTIES = "UNIQ_KEY\x017F0000010B5018B4AAC2190A2B3C0000\x02WAIT\x01true\x02TAGS\x01TagA"
SEND_FIELDS = send_request_fields_v2(
    "bench_producer_group", "BenchmarkTest", "TBW102", "4", 1, 0, 1700000000000, 0,
    PROPERTIES, "broker-a",
)  # fmt: skip
PULL_FIELDS = PullMessageRequestHeader(
    consumer_group="bench_consumer_group",
    topic="BenchmarkTest",
    queue_id=1,
    queue_offset=123456,
    max_msg_nums=32,
    sys_flag=3,
    commit_offset=123400,
    suspend_timeout_millis=15000,
    subscription="*",
    sub_version=1700000000000,
    expression_type="TAG",
).to_fields()
ANSWER_FIELDS = SendMessageResponseHeader(
    msg_id="7F00000100002A9F00000000001E2400", queue_id=1, queue_offset=123456
).to_fields()
ANSWER_FIELDS.update({"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})
OPAQUE = 1_234_567

# (name, code, flag, extFields)
HEADERS: list[tuple[str, int, int, dict[str, str] | None]] = [
    ("SEND_MESSAGE_V2 request", int(RequestCode.SEND_MESSAGE_V2), 0, SEND_FIELDS),
    ("PULL_MESSAGE request", int(RequestCode.PULL_MESSAGE), 0, PULL_FIELDS),
    ("SEND answer", int(ResponseCode.SUCCESS), FLAG_RESPONSE, ANSWER_FIELDS),
    ("HEART_BEAT request (no extFields)", int(RequestCode.HEART_BEAT), 0, None),
]

# The Apache RocketMQ C++ client's SEND_MESSAGE header (tests/unit/remoting/test_header_codec.py):
# numbers and a boolean inside extFields, an empty remark, no serializeTypeCurrentRPC.
CPP_SEND = (
    b'{"code":10,"extFields":{"bornTimestamp":"1764255600000","defaultTopic":"TBW102",'
    b'"defaultTopicQueueNums":4,"flag":0,"producerGroup":"G","properties":"TAGS\\u0001TagA\\u0002",'
    b'"queueId":0,"reconsumeTimes":0,"sysFlag":0,"topic":"T","unitMode":false},'
    b'"flag":0,"language":"CPP","opaque":5,"remark":"","version":213}'
)


def _command(code: int, flag: int, ext: dict[str, str] | None, stype: int) -> RemotingCommand:
    return RemotingCommand(
        code,
        opaque=OPAQUE,
        flag=flag,
        ext_fields=None if ext is None else dict(ext),
        language=PYTHON,
        version=DEFAULT_VERSION,
        serialize_type=stype,
    )


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def best_us(stmt: str, env: dict[str, Any], target: float) -> float:
    """Best of 5 repeats, microseconds per call; each repeat runs for at least `target` s."""
    timer = timeit.Timer(stmt, globals=env)
    number = 1
    while True:
        if timer.timeit(number) >= target / 4:
            break
        number *= 4
    number = max(1, int(number * target / max(timer.timeit(number), 1e-9)))
    return min(timer.repeat(repeat=5, number=number)) / number * 1e6


def _same(a: RemotingCommand, b: RemotingCommand) -> bool:
    return (
        a == b
        and type(a.code) is type(b.code) is int
        and all(type(v) is str for v in (a.ext_fields or {}).values())
    )


VARIANTS = ("native", "python", "ms dict", "ms Struct")


def run(quick: bool) -> None:
    console = Console() if Console().is_terminal else Console(width=200)
    native = _native()
    target = 0.02 if quick else 0.2
    decoders: dict[str, Decode | None] = {
        "native": native.decode_header if native is not None else None,
        "python": py_decode_header,
        "ms dict": ms_dict_decode,
        "ms Struct": ms_struct_decode,
    }
    encoders: dict[str, Encode | None] = {
        "native": native.encode_header if native is not None else None,
        "python": py_encode_header,
        "ms dict": ms_dict_encode,
        "ms Struct": ms_struct_encode,
    }
    base = "native" if native is not None else "python"
    if native is None:
        console.print("[yellow]remoting._speedups is not built: ratios are against python[/]")

    table = Table(
        title=(
            f"header codecs, us per call (best of 5; x = / {base}); msgspec {msgspec.__version__}"
        )
    )
    for col in ("header", "codec", "op", "bytes", *VARIANTS, "ms call only", "same bytes"):
        table.add_column(col, justify="left" if col in ("header", "codec", "op") else "right")

    cases: list[tuple[str, str, int, RemotingCommand | None, bytes]] = []
    for name, code, flag, ext in HEADERS:
        for stype, codec in ((JSON, "JSON"), (MSGPACK, "msgpack")):
            built = _command(code, flag, ext, stype)
            cases.append((name, codec, stype, built, py_encode_header(built)))
    cases.append(("C++ client SEND_MESSAGE", "JSON", JSON, None, CPP_SEND))

    def cell(us: float, ref: float | None) -> str:
        return f"{us:.2f}" if ref is None else f"{us:.2f} ({us / ref:.1f}x)"

    for name, codec, stype, cmd, data in cases:
        # decode
        expected = py_decode_header(stype, data)
        times: dict[str, float] = {}
        for var, fn in decoders.items():
            if fn is None:
                continue
            got = fn(stype, data)
            if not _same(got, expected):
                raise AssertionError(f"{var} decoded {name} {codec} to {got!r}, not {expected!r}")
            times[var] = best_us("f(t, d)", {"f": fn, "t": stype, "d": data}, target)
        floor_dec = _mp_struct.decode if stype == MSGPACK else _json_struct.decode
        try:
            floor_dec(data)
            floor = cell(best_us("f(d)", {"f": floor_dec, "d": data}, target), times.get(base))
        except msgspec.ValidationError:
            floor = "strict: no"
        ref = times.get(base)
        table.add_row(
            name, codec, "decode", str(len(data)),
            *[cell(times[v], ref) if v in times else "n/a" for v in VARIANTS],
            floor, "",
        )  # fmt: skip
        if cmd is None:
            continue
        # encode
        times = {}
        same: list[str] = []
        for var, enc in encoders.items():
            if enc is None:
                continue
            out = enc(cmd)
            if not _same(py_decode_header(stype, out), cmd):
                raise AssertionError(f"{var} encoded {name} {codec} to {out!r}")
            if var.startswith("ms"):
                same.append("yes" if out == data else "no")
            times[var] = best_us("f(c)", {"f": enc, "c": cmd}, target)
        struct = _struct_of(cmd)
        floor_us = best_us("f(s)", {"f": (_mp_enc if stype == MSGPACK else _json_enc).encode,
                                    "s": struct}, target)  # fmt: skip
        ref = times.get(base)
        table.add_row(
            "", "", "encode", str(len(data)),
            *[cell(times[v], ref) if v in times else "n/a" for v in VARIANTS],
            cell(floor_us, ref), "/".join(same),
        )  # fmt: skip
        if codec == "msgpack":
            table.add_section()
    console.print(table)
    console.print(
        "ms call only: msgspec's decode into / encode of the strict Struct alone (no "
        "RemotingCommand, no checks); 'strict: no' = the header is outside the strict types.\n"
        "same bytes: ms dict / ms Struct encoded exactly what trimq encodes."
    )
    behaviour(console, native)


# ---------------------------------------------------------------------------------------------
# behaviour
# ---------------------------------------------------------------------------------------------
_mp_lenient = msgspec.msgpack.Decoder(MsgpackHeader, strict=False)
_json_lenient = msgspec.json.Decoder(JsonHeader, strict=False)


def _mp(obj: object) -> bytes:
    return msgspec.msgpack.encode(obj)


# (label, serialize type, header bytes)
BEHAVIOUR: list[tuple[str, int, bytes]] = [
    ("JSON: trimq's own SEND header", JSON, b""),  # filled in below
    ("JSON: C++ client (ints, false in extFields)", JSON, CPP_SEND),
    ("JSON: ext int -7, 23-digit int", JSON,
     b'{"code":1,"extFields":{"a":-7,"b":12345678901234567890123}}'),
    ("JSON: ext int -0 (text kept?)", JSON, b'{"code":1,"extFields":{"a":-0}}'),
    ("JSON: ext 1.50, 1e3 (BigDecimal text)", JSON, b'{"code":1,"extFields":{"a":1.50,"b":1e3}}'),
    ("JSON: ext true/false/null", JSON, b'{"code":1,"extFields":{"a":true,"b":false,"c":null}}'),
    ("JSON: ext duplicate key, last null", JSON,
     b'{"code":1,"extFields":{"a":"x","b":"y","a":null}}'),
    ("JSON: ext value 5000-digit int", JSON, b'{"code":1,"extFields":{"a":' + b"1" * 5000 + b"}}"),
    ("JSON: code/opaque as strings", JSON, b'{"code":"105","opaque":"-3"}'),
    ("JSON: code \"007\"", JSON, b'{"code":"007"}'),
    ("JSON: code \"1e3\"", JSON, b'{"code":"1e3"}'),
    ("JSON: code 1.0", JSON, b'{"code":1.0}'),
    ("JSON: code true", JSON, b'{"code":true}'),
    ("JSON: code null, fields missing", JSON, b'{"code":null}'),
    ("JSON: opaque 2^40 (no int32 check)", JSON, b'{"code":1,"opaque":1099511627776}'),
    ("JSON: code 5000 digits", JSON, b'{"code":' + b"1" * 5000 + b"}"),
    ("JSON: language 3, version \"5\"", JSON, b'{"code":1,"language":3,"version":"5"}'),
    ("JSON: language \"COBOL\"", JSON, b'{"code":1,"language":"COBOL"}'),
    ("JSON: language 99", JSON, b'{"code":1,"language":99}'),
    ("JSON: remark 12", JSON, b'{"code":1,"remark":12}'),
    ("JSON: remark true", JSON, b'{"code":1,"remark":true}'),
    ("JSON: unknown keys, any values", JSON, b'{"code":34,"newField":[1,2],"another":{"x":1}}'),
    ("JSON: duplicate top-level key", JSON, b'{"code":1,"code":2}'),
    ("JSON: ext value an array", JSON, b'{"code":1,"extFields":{"a":[1]}}'),
    ("JSON: extFields an array", JSON, b'{"code":1,"extFields":[]}'),
    ("JSON: NaN", JSON, b'{"code":1,"extFields":{"a":NaN}}'),
    ("JSON: not an object", JSON, b"[1,2]"),
    ("JSON: trailing bytes", JSON, b'{"code":1} x'),
    ("JSON: invalid UTF-8", JSON, b'{"code":1,"remark":"\xff"}'),
    ("JSON: UTF-8 BOM", JSON, b'\xef\xbb\xbf{"code":1}'),
    ("JSON: UTF-16", JSON, '{"code":1}'.encode("utf-16")),
    ("JSON: lone surrogate \\ud800", JSON, b'{"code":1,"remark":"\\ud800"}'),
    ("JSON: raw control char", JSON, b'{"code":1,"remark":"\x01"}'),
    ("JSON: 100000 x [", JSON, b"[" * 100000),
    ("msgpack: trimq's own SEND header", MSGPACK, b""),  # filled in below
    ("msgpack: 8 elements (later fields)", MSGPACK,
     _mp([105, 3, 409, 9, 0, None, {"t": "T"}, "f"])),
    ("msgpack: 4 elements", MSGPACK, _mp([1, 3, 409, 1])),
    ("msgpack: a map", MSGPACK, _mp({"code": 1})),
    ("msgpack: code \"1\"", MSGPACK, _mp(["1", 3, 409, 1, 0, None, None])),
    ("msgpack: opaque 1.0", MSGPACK, _mp([1, 3, 409, 1.0, 0, None, None])),
    ("msgpack: language true", MSGPACK, _mp([1, True, 409, 1, 0, None, None])),
    ("msgpack: language 99", MSGPACK, _mp([1, 99, 409, 1, 0, None, None])),
    ("msgpack: code 2^64-1", MSGPACK, _mp([2**64 - 1, 3, 409, 1, 0, None, None])),
    ("msgpack: remark 5", MSGPACK, _mp([1, 3, 409, 1, 0, 5, None])),
    ("msgpack: remark bin", MSGPACK, _mp([1, 3, 409, 1, 0, b"x", None])),
    ("msgpack: ext value 1", MSGPACK, _mp([1, 3, 409, 1, 0, None, {"a": 1}])),
    ("msgpack: ext key 1", MSGPACK, _mp([1, 3, 409, 1, 0, None, {1: "a"}])),
    ("msgpack: ext duplicate key", MSGPACK,
     bytes.fromhex("97 01 03 cd0199 01 00 c0 82 a161 a178 a161 a179")),
    ("msgpack: invalid UTF-8 str", MSGPACK, bytes.fromhex("970103cd01990100a2fffec0")),
    ("msgpack: trailing byte", MSGPACK, _mp([1, 3, 409, 1, 0, None, None]) + b"\x00"),
    ("msgpack: 100000 nested arrays", MSGPACK, b"\x91" * 100000 + b"\xc0"),
    ("msgpack: array32 of 2^32-1", MSGPACK, b"\xdd\xff\xff\xff\xff"),
]  # fmt: skip


def _outcome(fn: Callable[..., object], *args: object) -> str:
    try:
        got = fn(*args)
    except Exception as exc:
        return type(exc).__name__
    if isinstance(got, RemotingCommand):
        ext = got.ext_fields
        text = "" if ext is None else ",".join(f"{k}={v[:8]}" for k, v in list(ext.items())[:3])
        code = str(got.code) if len(str(got.code)) < 12 else f"{str(got.code)[:4]}..."
        return f"ok {code} L{got.language} r={got.remark!r:.8} {{{text}}}"
    if isinstance(got, msgspec.Struct):
        fields = msgspec.structs.asdict(got)
        code = str(fields.get("code"))
        code = code if len(code) < 12 else f"{code[:4]}..."
        return f"ok {code} {fields.get('extFields')!r:.24}"
    return f"ok {got!r:.30}"


def behaviour(console: Console, native: types.ModuleType | None) -> None:
    cases = list(BEHAVIOUR)
    cases[0] = (cases[0][0], JSON, py_encode_header(_command(310, 0, SEND_FIELDS, JSON)))
    i = next(i for i, c in enumerate(cases) if c[0].startswith("msgpack: trimq"))
    cases[i] = (cases[i][0], MSGPACK, py_encode_header(_command(310, 0, SEND_FIELDS, MSGPACK)))
    table = Table(title="behaviour: the same bytes through each decoder")
    for col in (
        "case",
        "python (reference)",
        "native",
        "ms dict / ms Struct",
        "ms alone",
        "ms alone strict=False",
    ):
        table.add_column(col)
    for label, stype, data in cases:
        ref = _outcome(py_decode_header, stype, data)
        nat = _outcome(native.decode_header, stype, data) if native is not None else "n/a"
        md = _outcome(ms_dict_decode, stype, data)
        ms = _outcome(ms_struct_decode, stype, data)
        wrapped = md if md == ms else f"{md} / {ms}"
        strict_dec = _mp_struct if stype == MSGPACK else _json_struct
        lenient_dec = _mp_lenient if stype == MSGPACK else _json_lenient
        alone = _outcome(strict_dec.decode, data)
        lenient = _outcome(lenient_dec.decode, data)
        mark = "" if wrapped == ref else "* "
        table.add_row(label, ref, nat, f"{mark}{wrapped}", alone, lenient)
    console.print(table)
    console.print(
        "ms dict / ms Struct: the msgspec codecs above (Python checks around msgspec); * where "
        "they differ from the reference.\nms alone: msgspec decoding into the Struct of 'ms "
        "Struct' (RemotingCommand's types, defaults for missing fields), nothing around it: no "
        "fallback, language not mapped, errors not FrameError; strict=False: msgspec's own "
        "lenient mode (str -> int and the like)."
    )
    encode_behaviour(console, native)


ENCODE_CASES: list[tuple[str, int, dict[str, Any]]] = [
    ("JSON: ext value 3 (an int)", JSON, {"ext_fields": {"queueId": 3}}),
    ("JSON: ext value None", JSON, {"ext_fields": {"k": None}}),
    ("JSON: ext key 5", JSON, {"ext_fields": {5: "v"}}),
    ("JSON: remark 5", JSON, {"remark": 5}),
    ("JSON: non-ASCII remark", JSON, {"remark": "\u00e9\u6f22\U0001f600"}),
    ("JSON: lone surrogate remark", JSON, {"remark": "\ud800"}),
    ("JSON: code 2^70", JSON, {"code": 2**70}),
    ("msgpack: ext value 3 (an int)", MSGPACK, {"ext_fields": {"queueId": 3}}),
    ("msgpack: non-ASCII remark", MSGPACK, {"remark": "\u00e9\u6f22\U0001f600"}),
    ("msgpack: lone surrogate remark", MSGPACK, {"remark": "\ud800"}),
    ("msgpack: code 2^64", MSGPACK, {"code": 2**64}),
    ("msgpack: code True", MSGPACK, {"code": True}),
]


def encode_behaviour(console: Console, native: types.ModuleType | None) -> None:
    table = Table(title="behaviour: encoding odd commands (* = not what the reference does)")
    for col in ("case", "python (reference)", "native", "ms dict", "ms Struct"):
        table.add_column(col)
    for label, stype, changes in ENCODE_CASES:
        cmd = _command(1, 0, None, stype)
        for attr, value in changes.items():
            setattr(cmd, attr, value)
        outcomes: list[str] = []
        ref: bytes | None = None
        encoders = (py_encode_header, native.encode_header if native else None,
                    ms_dict_encode, ms_struct_encode)  # fmt: skip
        for enc in encoders:
            if enc is None:
                outcomes.append("n/a")
                continue
            try:
                out = enc(cmd)
            except Exception as exc:
                name = type(exc).__name__
                outcomes.append(name if not outcomes or outcomes[0] == name else f"* {name}")
                continue
            if ref is None:
                ref = out
            outcomes.append(f"ok, {len(out)} B" + ("" if out == ref else ", * other bytes"))
        table.add_row(label, *outcomes)
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about 15 s)")
    args = parser.parse_args()
    run(args.quick)

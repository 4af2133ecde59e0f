"""RemotingCommand header codecs: JSON (type 0), ROCKETMQ binary (type 1), msgpack (type 0x6D).

Sans-IO and stateless. `encode_header(cmd)` writes the header in `cmd.serialize_type`;
`decode_header(serialize_type, data)` reads one back into a RemotingCommand without a body.
Every decode failure raises `FrameError`; an encode of values a codec cannot carry (for
example a code outside int16 in the binary header) raises `ValueError`.

The layouts are described in docs/protocol.md.

When the C extension `remoting._speedups` imports (and TRIMQ_NO_NATIVE is unset, empty or "0"),
`encode_header` and `decode_header` are its versions: msgpack, ROCKETMQ binary and JSON headers
are coded natively (JSON decode for the subset fastjson and the C++ client write: integer,
boolean and null values inside extFields included); every other case
(anything outside the native subset, every error) goes to the pure-Python `py_encode_header` /
`py_decode_header` below, which stay the reference.
"""

from __future__ import annotations

import json
import os
import re
import struct
import types
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgpack  # type: ignore[import-untyped]

from remoting._command import RemotingCommand, new_command
from remoting.codes import LanguageCode, SerializeType
from remoting.errors import FrameError, FrameTooLargeError

__all__ = [
    "decode_header",
    "encode_header",
    "native",
    "native_enabled",
    "py_decode_header",
    "py_encode_header",
    "setup_native",
]

_JSON = int(SerializeType.JSON)
_ROCKETMQ = int(SerializeType.ROCKETMQ)
_MSGPACK = int(SerializeType.MSGPACK)

# Language name <-> number. Unknown numbers and names become OTHER.
_LANG_NAME: dict[int, str] = {int(m): m.name for m in LanguageCode}
_LANG_BY_NAME: dict[str, int] = {m.name: int(m) for m in LanguageCode}
_LANG_OTHER = int(LanguageCode.OTHER)
_LANG_VALID = frozenset(_LANG_NAME)

# What Java assumes when a JSON header leaves a field out.
_DEFAULT_LANGUAGE = int(LanguageCode.JAVA)
_DEFAULT_VERSION = 0
_DIGITS = re.compile(r"-?[0-9]{1,19}")

# ---------------------------------------------------------------------------
# JSON (type 0)
# ---------------------------------------------------------------------------
# fastjson writes RemotingCommand's bean properties alphabetically, leaving out
# nulls. The fixed fields are formatted directly; only remark and extFields go
# through the json encoder (C-accelerated, compact separators). Non-ASCII text is
# written as \uXXXX escapes: valid JSON that fastjson reads, and faster to produce.
_json_dumps: Callable[[Any], str] = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=True, check_circular=False
).encode
_json_loads = json.loads


def _encode_json(cmd: RemotingCommand) -> bytes:
    lang = _LANG_NAME.get(cmd.language, "OTHER")
    parts = ['{"code":', str(int(cmd.code))]
    ext = cmd.ext_fields
    if ext is not None:
        parts.append(',"extFields":')
        parts.append(_json_dumps(ext))
    parts.append(f',"flag":{int(cmd.flag)},"language":"{lang}","opaque":{int(cmd.opaque)}')
    if cmd.remark is not None:
        parts.append(',"remark":')
        parts.append(_json_dumps(cmd.remark))
    parts.append(f',"serializeTypeCurrentRPC":"JSON","version":{int(cmd.version)}}}')
    return "".join(parts).encode("ascii")


class _JsonInt(str):
    """A JSON integer literal, kept as its text (as fastjson's numberString does)."""

    __slots__ = ()


class _JsonNumber(str):
    """A JSON number with a fraction or exponent, as the text of Java's BigDecimal.toString."""

    __slots__ = ()


def _json_number(text: str) -> _JsonNumber:
    # fastjson parses such a number as a BigDecimal; BigDecimal.toString and Python's
    # Decimal.__str__ both follow the General Decimal Arithmetic to-scientific-string rules.
    return _JsonNumber(str(Decimal(text)))


def _json_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _int_literal(value: str, key: str) -> int:
    # Header fields are Java ints: a literal longer than any 64-bit number is refused here
    # (int() would raise ValueError past 4,300 digits, and that must stay a FrameError).
    if len(value) > 20:
        raise FrameError(f"JSON header field {key!r} is out of range: {value:.40}...")
    return int(value)


def _json_int(obj: dict[str, Any], key: str, default: int) -> int:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is _JsonInt:
        return _int_literal(value, key)
    if type(value) is str and _DIGITS.fullmatch(value):
        # fastjson reads "12" into an int field too.
        return int(value)
    raise FrameError(f"JSON header field {key!r} is not an integer: {value!r:.40}")


def _json_language(value: object) -> int:
    if value is None:
        return _DEFAULT_LANGUAGE
    if type(value) is str:
        return _LANG_BY_NAME.get(value, _LANG_OTHER)
    if type(value) is _JsonInt:
        number = _int_literal(value, "language")
        return number if number in _LANG_VALID else _LANG_OTHER
    raise FrameError(f"JSON header field 'language' is neither a name nor a number: {value!r:.40}")


def _json_ext_fields(ext: object) -> dict[str, str] | None:
    """extFields as Apache's broker reads them into a map of strings (fastjson's StringCodec).

    A string stays as it is; a number becomes its decimal text; true/false become "true" and
    "false"; null leaves the entry out (a custom header field that is absent). Objects and
    arrays cannot be read as a string and are refused.
    """
    if ext is None:
        return None
    if type(ext) is not dict:
        raise FrameError("JSON header extFields is not an object")
    plain = True
    for value in ext.values():
        if type(value) is not str:
            plain = False
            break
    if plain:
        return ext
    out: dict[str, str] = {}
    for key, value in ext.items():
        kind = type(value)
        if kind is str:
            out[key] = value
        elif kind is _JsonInt or kind is _JsonNumber:
            out[key] = str.__str__(value)
        elif kind is bool:
            out[key] = "true" if value else "false"
        elif value is None:
            continue
        else:
            raise FrameError(f"JSON header extFields entry {key!r:.40} is not a string or number")
    return out


def _decode_json(data: bytes) -> RemotingCommand:
    try:
        obj = _json_loads(
            data, parse_int=_JsonInt, parse_float=_json_number, parse_constant=_json_constant
        )
    except (ValueError, UnicodeDecodeError, RecursionError, ArithmeticError) as exc:
        raise FrameError(f"JSON header is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise FrameError("JSON header is not an object")
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        if type(remark) is _JsonInt or type(remark) is _JsonNumber:
            remark = str.__str__(remark)
        else:
            raise FrameError("JSON header field 'remark' is not a string")
    return new_command(
        _json_int(obj, "code", 0),
        _json_int(obj, "opaque", 0),
        _json_int(obj, "flag", 0),
        remark,
        _json_ext_fields(obj.get("extFields")),
        None,
        _json_language(obj.get("language")),
        _json_int(obj, "version", _DEFAULT_VERSION),
        _JSON,
    )


# ---------------------------------------------------------------------------
# ROCKETMQ binary (type 1)
# ---------------------------------------------------------------------------
# code int16, language byte, version int16, opaque int32, flag int32
_FIXED = struct.Struct(">hBhii")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_FIXED_SIZE = _FIXED.size  # 13
_EMPTY_TAIL = b"\x00\x00\x00\x00\x00\x00\x00\x00"  # remark len 0, extFields len 0


def _encode_rocketmq(cmd: RemotingCommand) -> bytes:
    try:
        fixed = _FIXED.pack(
            cmd.code,
            cmd.language if 0 <= cmd.language <= 255 else _LANG_OTHER,
            cmd.version,
            cmd.opaque,
            cmd.flag,
        )
    except struct.error as exc:
        raise ValueError(f"command does not fit the ROCKETMQ binary header: {exc}") from None
    remark = cmd.remark
    ext = cmd.ext_fields
    if not remark and not ext:
        return fixed + _EMPTY_TAIL
    out = bytearray(fixed)
    if remark:
        rb = remark.encode("utf-8")
        out += _I32.pack(len(rb))
        out += rb
    else:
        out += b"\x00\x00\x00\x00"
    if ext:
        parts: list[bytes] = []
        append = parts.append
        pack16 = _I16.pack
        pack32 = _I32.pack
        for key, value in ext.items():
            kb = key.encode("utf-8")
            vb = value.encode("utf-8")
            if len(kb) > 0x7FFF:
                raise ValueError(f"extFields key longer than 32767 bytes: {key[:40]!r}")
            append(pack16(len(kb)))
            append(kb)
            append(pack32(len(vb)))
            append(vb)
        block = b"".join(parts)
        out += pack32(len(block))
        out += block
    else:
        out += b"\x00\x00\x00\x00"
    return bytes(out)


def _decode_rocketmq(data: bytes) -> RemotingCommand:
    size = len(data)
    if size < _FIXED_SIZE + 8:
        raise FrameError(f"ROCKETMQ header too short: {size} bytes")
    code, language, version, opaque, flag = _FIXED.unpack_from(data, 0)
    pos = _FIXED_SIZE
    (remark_len,) = _I32.unpack_from(data, pos)
    pos += 4
    remark: str | None = None
    if remark_len:
        if remark_len < 0 or pos + remark_len + 4 > size:
            raise FrameError(f"ROCKETMQ header remark length {remark_len} out of bounds")
        try:
            remark = data[pos : pos + remark_len].decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("ROCKETMQ header remark is not UTF-8") from None
        pos += remark_len
    (ext_len,) = _I32.unpack_from(data, pos)
    pos += 4
    ext: dict[str, str] | None = None
    if ext_len:
        end = pos + ext_len
        if ext_len < 0 or end > size:
            raise FrameError(f"ROCKETMQ header extFields length {ext_len} out of bounds")
        ext = {}
        unpack32 = _I32.unpack_from
        try:
            while pos < end:
                if pos + 2 > end:
                    raise FrameError("ROCKETMQ header extFields entry truncated")
                klen = (data[pos] << 8) | data[pos + 1]
                if klen & 0x8000:
                    raise FrameError("ROCKETMQ header extFields key length is negative")
                pos += 2
                key_end = pos + klen
                if key_end + 4 > end:
                    raise FrameError(f"ROCKETMQ header extFields key length {klen} out of bounds")
                key = data[pos:key_end].decode("utf-8")
                (vlen,) = unpack32(data, key_end)
                pos = key_end + 4
                value_end = pos + vlen
                if vlen < 0 or value_end > end:
                    raise FrameError(f"ROCKETMQ header extFields value length {vlen} out of bounds")
                ext[key] = data[pos:value_end].decode("utf-8")
                pos = value_end
        except UnicodeDecodeError:
            raise FrameError("ROCKETMQ header extFields entry is not UTF-8") from None
    if pos != size:
        raise FrameError(f"ROCKETMQ header has {size - pos} trailing bytes")
    return new_command(
        code,
        opaque,
        flag,
        remark,
        ext,
        None,
        language if language in _LANG_VALID else _LANG_OTHER,
        version,
        _ROCKETMQ,
    )


# ---------------------------------------------------------------------------
# msgpack (type 0x6D, trimq's own)
# ---------------------------------------------------------------------------
# One msgpack array: [code, language, version, opaque, flag, remark|nil, extFields|nil].
# Decoders ignore extra trailing elements, so later versions may append fields.
_MSGPACK_FIELDS = 7
_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_unpackb = msgpack.unpackb


def _encode_msgpack(cmd: RemotingCommand) -> bytes:
    try:
        return _packb(
            (
                cmd.code,
                cmd.language,
                cmd.version,
                cmd.opaque,
                cmd.flag,
                cmd.remark,
                cmd.ext_fields,
            )
        )
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"command does not fit the msgpack header: {exc}") from None


def _check_ext_fields(ext: object) -> dict[str, str] | None:
    if ext is None:
        return None
    if type(ext) is not dict:
        raise FrameError("msgpack header extFields is not a map")
    for key, value in ext.items():
        if type(value) is not str or type(key) is not str:
            raise FrameError(f"msgpack header extFields entry {key!r:.40} is not string to string")
    return ext


def _decode_msgpack(data: bytes) -> RemotingCommand:
    try:
        obj = _unpackb(
            data,
            raw=False,
            use_list=False,
            strict_map_key=True,
        )  # unpackb bounds every str/array/map length by len(data)
    except Exception as exc:  # msgpack raises many types (ExtraData, FormatError, ValueError...)
        raise FrameError(f"msgpack header is not valid msgpack: {type(exc).__name__}") from None
    if type(obj) is not tuple or len(obj) < _MSGPACK_FIELDS:
        raise FrameError("msgpack header is not an array of at least 7 elements")
    code, language, version, opaque, flag, remark, ext = (
        obj if len(obj) == _MSGPACK_FIELDS else obj[:_MSGPACK_FIELDS]
    )
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
    return new_command(
        code,
        opaque,
        flag,
        remark,
        _check_ext_fields(ext),
        None,
        language if language in _LANG_VALID else _LANG_OTHER,
        version,
        _MSGPACK,
    )


# ---------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------
_ENCODERS: dict[int, Callable[[RemotingCommand], bytes]] = {
    _JSON: _encode_json,
    _ROCKETMQ: _encode_rocketmq,
    _MSGPACK: _encode_msgpack,
}
_DECODERS: dict[int, Callable[[bytes], RemotingCommand]] = {
    _JSON: _decode_json,
    _ROCKETMQ: _decode_rocketmq,
    _MSGPACK: _decode_msgpack,
}


def py_encode_header(cmd: RemotingCommand) -> bytes:
    """Encode the header of `cmd` in `cmd.serialize_type`.

    Args:
        cmd: the command; its body is not part of the header.

    Returns:
        The header bytes (without the frame's length and header words).

    Raises:
        ValueError: unknown serialize type, or a value the codec cannot carry.
    """
    encoder = _ENCODERS.get(cmd.serialize_type)
    if encoder is None:
        raise ValueError(f"unknown serialize type {cmd.serialize_type}")
    ext = cmd.ext_fields
    if ext:
        # Catch a non-string value here, at the sender, rather than have the peer reject the
        # frame (and drop the connection) or misread it.
        for key, value in ext.items():
            if not isinstance(value, str) or not isinstance(key, str):
                raise ValueError(  # noqa: TRY004 - every encode failure is a ValueError
                    f"extFields must map str to str; got {key!r:.40}: {type(value).__name__}"
                )
    if cmd.remark is not None and not isinstance(cmd.remark, str):
        raise ValueError(f"remark must be a str, not {type(cmd.remark).__name__}")
    return encoder(cmd)


def py_decode_header(serialize_type: int, data: bytes) -> RemotingCommand:
    """Decode a header into a RemotingCommand (no body) whose serialize type is `serialize_type`.

    Args:
        serialize_type: the top byte of the frame's header word.
        data: the header bytes.

    Returns:
        The command, `body` None.

    Raises:
        FrameError: unknown serialize type or undecodable header.
    """
    decoder = _DECODERS.get(serialize_type)
    if decoder is None:
        raise FrameError(f"unknown serialize type {serialize_type}")
    return decoder(data)


# ---------------------------------------------------------------------------
# native selection
# ---------------------------------------------------------------------------
def setup_native(module: types.ModuleType) -> types.ModuleType:
    """Give `remoting._speedups` this module's classes and pure-Python fallbacks; return it."""
    module.setup(
        RemotingCommand,
        py_decode_header,
        py_encode_header,
        FrameError,
        FrameTooLargeError,
        tuple(sorted(_LANG_VALID)),
        _LANG_OTHER,
        tuple(_LANG_NAME.get(i) for i in range(max(_LANG_NAME) + 1)),
    )
    return module


def native_enabled() -> bool:
    """False when TRIMQ_NO_NATIVE is set to a non-empty value other than "0"."""
    return os.environ.get("TRIMQ_NO_NATIVE", "") in ("", "0")


def _load_native() -> types.ModuleType | None:
    """`remoting._speedups`, set up; None when disabled or not built."""
    if not native_enabled():
        return None
    try:
        from remoting import _speedups
    except ImportError:
        return None
    return setup_native(_speedups)


native = _load_native()
"""The set-up `remoting._speedups` module, or None when the pure-Python codecs are in use."""

encode_header: Callable[[RemotingCommand], bytes] = py_encode_header
decode_header: Callable[[int, bytes], RemotingCommand] = py_decode_header
if native is not None:
    encode_header = native.encode_header
    decode_header = native.decode_header

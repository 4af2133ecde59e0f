"""remoting._speedups.FieldsDecoder against the generated Python decoders of every typed header.

Same input, same outcome: a header with the same attribute values and types, or the same
exception type and message. Runs with or without TRIMQ_NO_NATIVE (the decoders are built here);
skipped only when the extension is not built.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import HeaderError, RemotingCommand, RequestCode, _header_codec
from remoting.protocol import headers

pytestmark = pytest.mark.unit

_speedups = pytest.importorskip("remoting._speedups")
NATIVE: types.ModuleType = _header_codec.native or _header_codec.setup_native(_speedups)

CLASSES = sorted(
    (
        obj
        for obj in vars(headers).values()
        if isinstance(obj, type) and issubclass(obj, headers._Header) and obj is not headers._Header
    ),
    key=lambda c: c.__name__,
)
# (class, table, Python decoder) for every table, the V2 short names included.
_SEND = headers.SendMessageRequestHeader
TABLES: list[tuple[type[Any], tuple[Any, ...], Any]] = [
    (c, c._TABLE, c._py_decode) for c in CLASSES
] + [(_SEND, _SEND._TABLE_V2, _SEND._py_decode_v2)]


def test_only_the_send_header_has_a_v2_table() -> None:
    assert [c for c in CLASSES if hasattr(c, "_TABLE_V2")] == [_SEND]


def _outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        obj = fn(*args)
    except Exception as exc:
        return "err", (type(exc), str(exc))
    return "ok", (
        type(obj),
        [
            (f.name, type(getattr(obj, f.name)), getattr(obj, f.name))
            for f in dataclasses.fields(obj)
        ],
    )


NUMBER_TEXT = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        ["0", "-0", "+5", "007", " 12 ", "1_000", "", "-", "+", "0x10", "1.5", "١٢", "9" * 19]
    ),
    # the edges of int32 and int64 and one past them, padded past the 18-digit fast path too
    st.sampled_from([2**31, 2**63])
    .flatmap(lambda b: st.sampled_from([-b - 1, -b, b - 1, b]))
    .flatmap(lambda n: st.sampled_from([str(n), f"{n:+025d}", f" {n}", f"{n:_}"])),
    st.text(max_size=6),
)
BOOL_TEXT = st.sampled_from(
    [
        "true",
        "TRUE",
        "True",
        "tRuE",
        "false",
        "",
        "yes",
        "1",
        "truee",
        "tru",
        "trüe",
        "true ",
        "trux",
        "frue",
        "tXue",
        "trXe",
        "TRU\x05",
    ]
)
ODD_VALUE = st.one_of(st.none(), st.integers(), st.just(b"true"), st.just(True))


@st.composite
def field_maps(draw: st.DrawFn, table: tuple[Any, ...]) -> object:
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return None
    out: dict[str, Any] = {}
    for _attr, wire, kind, _required, _default in table:
        if draw(st.integers(0, 9)) == 0:
            continue  # missing
        if isinstance(kind, headers.IntWidth):
            value: Any = draw(NUMBER_TEXT) if draw(st.booleans()) else str(draw(st.integers()))
        elif kind is bool:
            value = draw(BOOL_TEXT)
        else:
            value = draw(st.text(max_size=10))
        if draw(st.integers(0, 19)) == 0:
            value = draw(ODD_VALUE)
        out[wire] = value
    if draw(st.integers(0, 4)) == 0:
        out[draw(st.text(max_size=3))] = draw(st.text(max_size=3))
    if shape == 1:
        return types.MappingProxyType(out)
    return out


@pytest.mark.parametrize(
    ("cls", "table", "py_decode"), TABLES, ids=lambda x: getattr(x, "__name__", "")
)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_native_fields_decoder_matches_python(
    cls: type[Any], table: Any, py_decode: Any, data: st.DataObject
) -> None:
    decoder = headers.native_decoder(NATIVE, cls, table, py_decode)
    fields: Any = data.draw(field_maps(table))
    native = _outcome(decoder, cls, fields)
    python = _outcome(py_decode, cls, fields)
    assert native == python
    if native[0] == "err" and fields is not None and all(type(v) is str for v in fields.values()):
        assert native[1][0] is HeaderError


def test_the_send_header_decodes_natively_and_falls_back_for_errors() -> None:
    cls = headers.SendMessageRequestHeader
    decoder = headers.native_decoder(NATIVE, cls, cls._TABLE_V2, cls._py_decode_v2)
    fields = headers.send_request_fields_v2(
        "PG", "T", "TBW102", "8", 3, 0, 1700000000000, 0, "p", "broker-a", batch=True
    )
    hdr = decoder(cls, fields)
    assert hdr == cls._py_decode_v2(cls, fields)
    assert (hdr.queue_id, hdr.born_timestamp, hdr.batch, hdr.unit_mode) == (
        3,
        1700000000000,
        True,
        False,
    )
    assert hdr.max_reconsume_times is None
    del fields["b"]
    with pytest.raises(HeaderError, match="'b'"):
        decoder(cls, fields)
    fields["b"] = "T"
    fields["e"] = "three"
    with pytest.raises(HeaderError, match="not a number"):
        decoder(cls, fields)


def test_subclass_and_keywords_take_the_python_path() -> None:
    cls = headers.GetMaxOffsetRequestHeader
    calls: list[object] = []

    def fallback(c: type[Any], f: Mapping[str, str] | None) -> object:
        calls.append(c)
        return cls._py_decode(c, f)

    decoder = headers.native_decoder(NATIVE, cls, cls._TABLE, fallback)
    assert decoder(cls, {"topic": "T", "queueId": "1"}).queue_id == 1
    assert calls == []

    @dataclasses.dataclass(slots=True, kw_only=True)
    class Sub(cls):  # type: ignore[valid-type,misc]
        pass

    assert type(decoder(Sub, {"topic": "T", "queueId": "1"})) is Sub
    assert calls == [Sub]


def test_bad_tables_are_rejected() -> None:
    cls = headers.GetMaxOffsetRequestHeader
    with pytest.raises(TypeError, match="__slots__"):
        NATIVE.FieldsDecoder(cls, (("nope", "nope", 0, True, None),), cls._py_decode)
    with pytest.raises(ValueError, match="kind"):
        NATIVE.FieldsDecoder(cls, (("topic", "topic", 7, True, None),), cls._py_decode)
    with pytest.raises(TypeError):
        NATIVE.FieldsDecoder(cls, ("topic",), cls._py_decode)
    with pytest.raises(TypeError):
        NATIVE.FieldsDecoder(cls, (), 5)


def test_from_command_picks_the_v2_table() -> None:
    fields = headers.send_request_fields_v2("PG", "T", "TBW102", "8", 3, 0, 1, 0, "p", "broker-a")
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=fields)
    assert headers.SendMessageRequestHeader.from_command(cmd).topic == "T"
    long_form = headers.SendMessageRequestHeader.from_command(cmd).to_fields()
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=long_form)
    assert headers.SendMessageRequestHeader.from_command(cmd).topic == "T"

"""Pull bodies -> Arrow batches and rows -> messages for the Spark source (pyarrow, no Spark)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from client.spark.arrow import (  # noqa: E402
    ARROW_SCHEMA,
    WRITE_ID_PROPERTY,
    records_to_batch,
    rows_to_messages,
)
from common.message import (  # noqa: E402
    COMPRESSED_FLAG,
    NATIVE,
    MessageDecodeError,
    MessageInner,
    decode_records_columns,
    encode_record,
)


def _body(n: int, *, start: int = 0, compressed: bool = False) -> bytes:
    out = b""
    phy = 0
    for i in range(start, start + n):
        body = f"m{i}".encode()
        sys_flag = 0
        if compressed:
            body, sys_flag = zlib.compress(body), COMPRESSED_FLAG
        props = {"KEYS": f"k{i}", "UNIQ_KEY": f"{i:032X}", "color": "red"}
        if i % 2 == 0:
            props["TAGS"] = "even"
        msg = MessageInner(
            "T",
            body,
            queue_id=3,
            properties=props,
            sys_flag=sys_flag,
            born_timestamp=1_700_000_000_000 + i,
        )
        rec = encode_record(msg, i, phy, 1_700_000_000_500 + i)
        phy += len(rec)
        out += bytes(rec)
    return out


def test_records_to_batch_schema_and_values() -> None:
    rb = records_to_batch("T", "broker-a", 3, _body(5, start=10), end=100)
    assert rb is not None
    assert rb.schema == ARROW_SCHEMA
    d = rb.to_pydict()
    assert d["queue_offset"] == [10, 11, 12, 13, 14]
    assert d["topic"] == ["T"] * 5
    assert d["broker"] == ["broker-a"] * 5
    assert d["queue_id"] == [3] * 5
    assert d["body"] == [b"m10", b"m11", b"m12", b"m13", b"m14"]
    assert d["keys"] == ["k10", "k11", "k12", "k13", "k14"]
    assert d["tags"] == ["even", None, "even", None, "even"]
    assert d["msg_id"][0] == f"{10:032X}"
    assert d["born_timestamp"][0].timestamp() == pytest.approx(1_700_000_000.010)
    assert d["store_timestamp"][1].timestamp() == pytest.approx(1_700_000_000.511)
    assert dict(d["properties"][0])["color"] == "red"


def test_records_to_batch_clips_at_end_and_inflates() -> None:
    rb = records_to_batch("T", "b", 3, _body(5, compressed=True), end=3)
    assert rb is not None
    assert rb.to_pydict()["body"] == [b"m0", b"m1", b"m2"]
    assert records_to_batch("T", "b", 3, _body(2, start=7), end=7) is None


def test_rows_to_messages_properties_ids_and_pins() -> None:
    cols: dict[str, list[Any]] = {
        "body": ["a", b"b"],
        "topic": ["T1", None],
        "keys": ["k1", None],
        "tags": [None, "t"],
        "properties": [[("p", "1"), ("KEYS", "x"), ("UNIQ_KEY", "y")], {"q": "2"}],
        "broker": ["broker-a", None],
        "queue_id": [1, None],
    }
    out = list(rows_to_messages(cols, 2, default_topic="TT", write_id_prefix="q:5:2", first_row=10))
    (m1, pin1), (m2, pin2) = out
    assert (m1.topic, m1.body, m1.keys, m1.tags) == ("TT", b"a", "k1", None)
    assert m1.properties["p"] == "1"
    assert m1.properties["KEYS"] == "k1"  # the column wins; system names in the map are dropped
    assert "UNIQ_KEY" not in m1.properties
    assert m1.properties[WRITE_ID_PROPERTY] == "q:5:2:10"
    assert pin1 == ("broker-a", 1)
    assert (m2.body, m2.tags, m2.properties["q"], pin2) == (b"b", "t", "2", None)
    assert m2.properties[WRITE_ID_PROPERTY] == "q:5:2:11"


def test_rows_to_messages_errors() -> None:
    with pytest.raises(ValueError, match="null body"):
        list(
            rows_to_messages(
                {"body": [None]}, 1, default_topic="T", write_id_prefix="x", first_row=0
            )
        )
    with pytest.raises(ValueError, match="no topic"):
        list(
            rows_to_messages(
                {"body": [b"x"], "topic": [None]},
                1,
                default_topic=None,
                write_id_prefix="x",
                first_row=0,
            )
        )


def _record(
    i: int,
    *,
    body: bytes = b"hello",
    props: dict[str, str] | None = None,
    raw_props: bytes | None = None,
    sys_flag: int = 0,
    store: tuple[str, int] = ("127.0.0.1", 10911),
) -> bytes:
    """One record at queue offset `i`; `raw_props` replaces the encoded properties as is."""
    msg = MessageInner(
        "T",
        body,
        queue_id=3,
        properties=props if props is not None else {},
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000 + i,
        born_host=("127.0.0.1", 40000 + i),
        store_host=store,
    )
    rec = bytes(encode_record(msg, i, 4096 * i, 1_700_000_000_500 + i))
    if raw_props is None:
        return rec
    assert props is None
    out = bytearray(rec[:-2] + struct.pack(">h", len(raw_props)) + raw_props)
    struct.pack_into(">i", out, 0, len(out))
    return bytes(out)


def _python_batch(body: bytes, end: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr("client.spark.arrow.decode_records_columns", lambda _b, _e: None)
        return records_to_batch("T", "broker-a", 3, body, end)


ODD_PROPS = [
    b"",
    b"\x02\x02",
    b"a\x01\x02b\x01x",  # a segment without a value is skipped
    b"\x01v\x02KEYS\x01k1 k2",  # ... and one without a name
    b"TAGS\x01t\x01u\x02UNIQ_KEY\x01ABC",  # the value runs to the next \x02
    b"KEYS\x01k\x02",
]


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
@pytest.mark.parametrize("end", [0, 1, 5, 11, 100])
def test_native_columns_match_the_python_decoder(end: int, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = [_record(i, raw_props=p) for i, p in enumerate(ODD_PROPS)]
    recs += [
        _record(6, body=b"", props={"KEYS": "k", "TAGS": "t", "UNIQ_KEY": "0A" * 16}),
        _record(7, body=bytes(range(256)) * 8, props={"color": "red"}),
        _record(8, props={}, store=("127.0.0.1", 65535)),
    ]
    recs += [_record(9 + i, body=b"x" * i, props={"n": str(i)}) for i in range(5)]
    body = b"".join(recs)
    cols = decode_records_columns(body, end)
    assert cols is not None  # the common case does not fall back
    assert cols[0] == min(end, len(recs))
    native = records_to_batch("T", "broker-a", 3, body, end)
    python = _python_batch(body, end, monkeypatch)
    if end == 0:
        assert native is None
        assert python is None
        return
    assert native is not None
    assert python is not None
    assert native.schema == ARROW_SCHEMA
    native.validate(full=True)
    assert native.to_pylist() == python.to_pylist()


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
@pytest.mark.parametrize(
    "rec",
    [
        _record(1, raw_props=b"k\x01a\x02k\x01b"),
        _record(1, props={"KEYS": "ünï"}),
        _record(1, body=zlib.compress(b"z" * 100), sys_flag=COMPRESSED_FLAG),
        _record(1, store=("::1", 10911)),
    ],
    ids=["repeated-name", "non-ascii", "compressed", "ipv6"],
)
def test_native_columns_leave_the_unusual_to_python(
    rec: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = _record(0, props={"a": "b"}) + rec + _record(2, props={"a": "c"})
    assert decode_records_columns(body, 100) is None
    rb = records_to_batch("T", "broker-a", 3, body, 100)
    assert rb is not None
    assert rb.num_rows == 3
    assert rb.to_pylist() == _python_batch(body, 100, monkeypatch).to_pylist()


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
def test_a_damaged_body_gets_the_python_decoders_error() -> None:
    body = _record(0, props={"a": "b"}) + _record(1)[:-1]
    assert decode_records_columns(body, 100) is None
    with pytest.raises(MessageDecodeError):
        records_to_batch("T", "broker-a", 3, body, 100)


@pytest.mark.skipif(not NATIVE, reason="native accelerators not built or disabled")
@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.binary(max_size=40),
            st.lists(
                st.tuples(
                    st.text(st.characters(max_codepoint=127), max_size=6),
                    st.text(st.characters(max_codepoint=127), max_size=6),
                ),
                max_size=4,
            ),
        ),
        min_size=1,
        max_size=6,
    ),
    end=st.integers(0, 8),
)
def test_random_bodies_decode_as_the_python_decoder(
    rows: list[tuple[bytes, list[tuple[str, str]]]], end: int
) -> None:
    body = b"".join(
        _record(i, body=b, raw_props="\x02".join(f"{k}\x01{v}" for k, v in ps).encode())
        for i, (b, ps) in enumerate(rows)
    )
    with pytest.MonkeyPatch.context() as m:
        native = records_to_batch("T", "broker-a", 3, body, end)
        python = _python_batch(body, end, m)
    if python is None:
        assert native is None
        return
    assert native is not None
    assert native.to_pylist() == python.to_pylist()


def test_rows_without_properties_or_pins_make_the_same_messages() -> None:
    cols: dict[str, list[Any]] = {
        "body": [b"a", "b\u00e9", bytearray(b"c"), b""],
        "keys": ["k1", None, "", "k4 k5"],
        "tags": [None, "t", "", "t4"],
    }

    def run(extra: dict[str, list[Any]]) -> list[tuple[str, bytes, int, dict[str, str], Any]]:
        out = rows_to_messages(
            {**cols, **extra}, 4, default_topic="TT", write_id_prefix="q:1:0", first_row=7
        )
        return [(m.topic, m.body, m.flag, m.properties, pin) for m, pin in out]

    fast = run({})
    assert fast == run({"properties": [None] * 4})  # the general path
    assert fast[1][1] == "bé".encode()
    assert fast[3][3] == {WRITE_ID_PROPERTY: "q:1:0:10", "TAGS": "t4", "KEYS": "k4 k5"}
    with pytest.raises(ValueError, match="row 8 has a null body"):
        list(
            rows_to_messages(
                {"body": [b"x", None]}, 2, default_topic="T", write_id_prefix="x", first_row=7
            )
        )

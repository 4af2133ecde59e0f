"""Pull bodies -> Arrow batches and rows -> messages for the Spark source (pyarrow, no Spark)."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from client.spark.arrow import (  # noqa: E402
    ARROW_SCHEMA,
    WRITE_ID_PROPERTY,
    records_to_batch,
    rows_to_messages,
)
from store.message import (  # noqa: E402
    COMPRESSED_FLAG,
    MessageInner,
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

"""Pulled records -> Arrow record batches (read side), Arrow batches -> messages (write side).

Imports pyarrow; only the Spark data source imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from client.message import SYSTEM_PROPERTIES, Message
from common.message import (
    COMPRESSED_FLAG,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    RecordColumns,
    decode_records,
    decode_records_columns,
)

__all__ = [
    "ARROW_SCHEMA",
    "READ_SCHEMA_DDL",
    "WRITE_ID_PROPERTY",
    "records_to_batch",
    "rows_to_messages",
]

READ_SCHEMA_DDL = (
    "topic STRING, queue_id INT, broker STRING, queue_offset BIGINT, msg_id STRING, "
    "keys STRING, tags STRING, body BINARY, born_timestamp TIMESTAMP, "
    "store_timestamp TIMESTAMP, properties MAP<STRING, STRING>"
)

_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("broker", pa.string()),
        ("queue_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("body", pa.binary()),
        ("born_timestamp", _TS),
        ("store_timestamp", _TS),
        ("properties", pa.map_(pa.string(), pa.string())),
    ]
)

WRITE_ID_PROPERTY = "SPARK_WRITE_ID"
"""Property set on every message the sink writes: `queryId:batchId:partition:row`.

The same rows of a replayed micro-batch get the same ids, so consumers can
drop duplicates (the sink is at-least-once)."""


def _ms_to_ts(values: list[int]) -> pa.Array:
    return pa.array(values, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(_TS)


def records_to_batch(
    topic: str, broker: str, queue_id: int, body: bytes, end: int
) -> pa.RecordBatch | None:
    """The records of one pull body as a RecordBatch, keeping offsets below `end`.

    Returns None when no record is below `end`.
    """
    cols = decode_records_columns(body, end)
    if cols is not None:
        return _columns_to_batch(topic, broker, queue_id, cols)
    offsets: list[int] = []
    msg_ids: list[str] = []
    keys: list[str | None] = []
    tags: list[str | None] = []
    bodies: list[bytes | None] = []
    born: list[int] = []
    stored: list[int] = []
    prop_offsets: list[int] = [0]
    prop_keys: list[str] = []
    prop_values: list[str] = []
    for m in decode_records(body):
        off = m.queue_offset
        if off >= end:
            break
        offsets.append(off)
        p = m.properties
        msg_ids.append(m.uniq_key or m.msg_id)
        keys.append(p.get("KEYS"))
        tags.append(p.get("TAGS"))
        bodies.append(m.decompressed_body() if m.sys_flag & COMPRESSED_FLAG else m.body)
        born.append(m.born_timestamp)
        stored.append(m.store_timestamp)
        prop_keys.extend(p.keys())
        prop_values.extend(p.values())
        prop_offsets.append(len(prop_keys))
    n = len(offsets)
    if n == 0:
        return None
    columns = [
        pa.array([topic] * n, pa.string()),
        pa.array([queue_id] * n, pa.int32()),
        pa.array([broker] * n, pa.string()),
        pa.array(offsets, pa.int64()),
        pa.array(msg_ids, pa.string()),
        pa.array(keys, pa.string()),
        pa.array(tags, pa.string()),
        pa.array(bodies, pa.binary()),
        _ms_to_ts(born),
        _ms_to_ts(stored),
        pa.MapArray.from_arrays(
            pa.array(prop_offsets, pa.int32()),
            pa.array(prop_keys, pa.string()),
            pa.array(prop_values, pa.string()),
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _columns_to_batch(
    topic: str, broker: str, queue_id: int, cols: RecordColumns
) -> pa.RecordBatch | None:
    """The natively decoded buffers as a RecordBatch (no per-row Python objects)."""
    n = cols[0]
    if n == 0:
        return None
    buf = [pa.py_buffer(b) for b in cols[1:]]
    (qoff, born, stored, body_off, bodies, mid_off, mids, k_valid, k_off, keys, t_valid, t_off,
     tags, p_off, name_off, names, val_off, vals) = buf  # fmt: skip
    entries = len(cols[15]) // 4 - 1  # name offsets: one more than the entries
    columns = [
        pa.array([topic] * n, pa.string()),
        pa.array([queue_id] * n, pa.int32()),
        pa.array([broker] * n, pa.string()),
        pa.Array.from_buffers(pa.int64(), n, [None, qoff]),
        pa.Array.from_buffers(pa.string(), n, [None, mid_off, mids]),
        pa.Array.from_buffers(pa.string(), n, [k_valid, k_off, keys], null_count=-1),
        pa.Array.from_buffers(pa.string(), n, [t_valid, t_off, tags], null_count=-1),
        pa.Array.from_buffers(pa.binary(), n, [None, body_off, bodies]),
        pa.Array.from_buffers(_TS, n, [None, born]),
        pa.Array.from_buffers(_TS, n, [None, stored]),
        pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), n + 1, [None, p_off]),
            pa.Array.from_buffers(pa.string(), entries, [None, name_off, names]),
            pa.Array.from_buffers(pa.string(), entries, [None, val_off, vals]),
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _as_bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def rows_to_messages(
    columns: Mapping[str, Sequence[Any]],
    n: int,
    *,
    default_topic: str | None,
    write_id_prefix: str,
    first_row: int,
) -> Iterator[tuple[Message, tuple[str, int] | None]]:
    """Messages for `n` rows given column-wise (`{name: values}`), with their pinned queue.

    Args:
        columns: `body` (required) and optionally `topic`, `keys`, `tags`,
            `properties` (a map as a dict or a list of pairs; system property
            names such as KEYS or UNIQ_KEY are ignored), `broker` + `queue_id`.
        n: number of rows.
        default_topic: the `topic` option; it overrides a `topic` column.
        write_id_prefix: `queryId:batchId:partition`; the row number is appended.
        first_row: row number of the first row within the task.

    Raises:
        ValueError: a row has no body or no topic.
    """
    body_col = columns["body"]
    topic_col = columns.get("topic")
    keys_col = columns.get("keys")
    tags_col = columns.get("tags")
    props_col = columns.get("properties")
    broker_col = columns.get("broker")
    qid_col = columns.get("queue_id")
    new = Message.__new__
    for i in range(n):
        body = body_col[i]
        if type(body) is not bytes:
            body = _as_bytes(body)
            if body is None:
                raise ValueError(f"rocketmq sink: row {first_row + i} has a null body")
        topic = default_topic or (topic_col[i] if topic_col is not None else None)
        if not topic:
            raise ValueError(
                f"rocketmq sink: row {first_row + i} has no topic "
                "(set the 'topic' option or a non-null 'topic' column)"
            )
        # Built as `Message(topic, body, tags=, keys=, properties=)` builds it, without
        # checking the names set here (the write id, TAGS, KEYS); map entries are checked.
        msg = new(Message)
        msg.topic, msg.body, msg.flag, msg.properties = topic, body, 0, {}
        if props_col is not None and (raw := props_col[i]) is not None:
            items = raw.items() if isinstance(raw, Mapping) else raw
            for k, v in items:
                # System properties (KEYS, TAGS, UNIQ_KEY...) come from columns or the
                # producer; dropping them lets a read DataFrame be written back as is.
                if k is not None and v is not None and k not in SYSTEM_PROPERTIES:
                    msg.put_user_property(str(k), str(v))
        props = msg.properties
        props[WRITE_ID_PROPERTY] = f"{write_id_prefix}:{first_row + i}"
        if tags_col is not None and (tag := tags_col[i]):
            props[PROPERTY_TAGS] = tag
        if keys_col is not None and (key := keys_col[i]):
            props[PROPERTY_KEYS] = key
        pinned: tuple[str, int] | None = None
        if broker_col is not None and qid_col is not None:
            b, q = broker_col[i], qid_col[i]
            if b is not None and q is not None:
                pinned = (str(b), int(q))
        yield msg, pinned

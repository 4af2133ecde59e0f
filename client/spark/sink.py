"""The `rocketmq` PySpark data source: batch and streaming writes (at-least-once)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from client.message import Message, MessageQueue
from client.spark._conn import SendSession, get_conn
from client.spark.arrow import rows_to_messages
from client.spark.options import SinkOptions

__all__ = ["BatchWriter", "SendSummary", "StreamWriter", "check_write_schema"]

log = structlog.get_logger()

WRITE_COLUMNS = ("body", "topic", "keys", "tags", "properties", "broker", "queue_id")


@dataclass
class SendSummary(WriterCommitMessage):
    """What one write task sent (`write()` must return a WriterCommitMessage)."""

    partition_id: int
    count: int


def check_write_schema(schema: StructType, opts: SinkOptions) -> list[str]:
    """The columns the sink uses, after checking their types.

    Raises:
        ValueError: no `body` column, no topic (column or option), or a column of the wrong type.
    """
    fields = {f.name.lower(): f for f in schema.fields}
    names = ", ".join(f.name for f in schema.fields) or "none"
    body = fields.get("body")
    if body is None:
        raise ValueError(
            "rocketmq sink: the DataFrame needs a 'body' column (binary or string); "
            f"its columns are: {names}"
        )
    if not isinstance(body.dataType, BinaryType | StringType):
        raise ValueError(  # noqa: TRY004 (Spark shows ValueErrors as option errors)
            f"rocketmq sink: column 'body' must be binary or string, not {body.dataType}"
        )
    if opts.topic is None and "topic" not in fields:
        raise ValueError(
            "rocketmq sink: no topic: set option 'topic' or add a 'topic' column "
            f"(columns: {names})"
        )
    for col in ("topic", "keys", "tags", "broker"):
        f = fields.get(col)
        if f is not None and not isinstance(f.dataType, StringType):
            raise ValueError(f"rocketmq sink: column '{col}' must be a string, not {f.dataType}")
    props = fields.get("properties")
    if props is not None and not (
        isinstance(props.dataType, MapType)
        and isinstance(props.dataType.keyType, StringType)
        and isinstance(props.dataType.valueType, StringType)
    ):
        raise ValueError(
            f"rocketmq sink: column 'properties' must be map<string,string>, not {props.dataType}"
        )
    if ("broker" in fields) != ("queue_id" in fields):
        raise ValueError("rocketmq sink: columns 'broker' and 'queue_id' go together")
    return [f.name for f in schema.fields if f.name.lower() in WRITE_COLUMNS]


def _send_all(
    opts: SinkOptions, columns: list[str], batches: Iterator[pa.RecordBatch], prefix: str
) -> int:
    conn = get_conn(
        opts.namesrv_addr,
        serialize_type=opts.serialize_type,
        access_key=opts.access_key,
        secret_key=opts.secret_key,
        tls=opts.tls,
        trace_topic=opts.trace_topic,
    )
    session: SendSession = conn.send_session(
        opts.producer_group, timeout_ms=opts.send_msg_timeout_ms
    )
    pending: dict[tuple[str, tuple[str, int] | None], list[Message]] = {}
    row = 0
    wanted = {c.lower(): c for c in columns}
    try:
        for rb in batches:
            cols = {
                key: rb.column(rb.schema.get_field_index(name)).to_pylist()
                for key, name in wanted.items()
            }
            for msg, pinned in rows_to_messages(
                cols,
                rb.num_rows,
                default_topic=opts.topic,
                write_id_prefix=prefix,
                first_row=row,
            ):
                key = (msg.topic, pinned)
                chunk = pending.setdefault(key, [])
                chunk.append(msg)
                if len(chunk) >= opts.send_batch_size:
                    session.submit(chunk, _queue(msg.topic, pinned))
                    del pending[key]
            row += rb.num_rows
        for (topic, pinned), chunk in pending.items():
            session.submit(chunk, _queue(topic, pinned))
    finally:
        sent = session.finish()
    return sent


def _queue(topic: str, pinned: tuple[str, int] | None) -> MessageQueue | None:
    return None if pinned is None else MessageQueue(topic, pinned[0], pinned[1])


def _task_ids() -> tuple[int, str | None, str | None]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return 0, None, None
    return (
        tc.partitionId(),
        tc.getLocalProperty("sql.streaming.queryId"),
        tc.getLocalProperty("streaming.sql.batchId"),
    )


class BatchWriter(DataSourceArrowWriter):
    """`df.write.format("rocketmq").mode("append")`: each task sends its rows in batches."""

    def __init__(self, opts: SinkOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns
        # Made once on the driver and pickled: a retried task reuses the same ids.
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SendSummary:
        pid, _q, _b = _task_ids()
        sent = _send_all(self.opts, self.columns, iterator, f"{self.write_id}:0:{pid}")
        return SendSummary(pid, sent)

    def commit(self, messages: list[Any]) -> None:
        total = sum(m.count for m in messages if m is not None)
        log.info("spark_write_committed", messages=total, tasks=len(messages))

    def abort(self, messages: list[Any]) -> None:
        sent = sum(m.count for m in messages if m is not None)
        log.warning("spark_write_aborted", messages_already_sent=sent)


class StreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("rocketmq")`: at-least-once; ids `queryId:batchId:partition:row`."""

    def __init__(self, opts: SinkOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SendSummary:
        pid, query_id, batch_id = _task_ids()
        prefix = f"{query_id or 'query'}:{batch_id or 0}:{pid}"
        return SendSummary(pid, _send_all(self.opts, self.columns, iterator, prefix))

    def commit(self, messages: list[Any], batchId: int) -> None:
        total = sum(m.count for m in messages if m is not None)
        log.debug("spark_stream_write_committed", batch_id=batchId, messages=total)

    def abort(self, messages: list[Any], batchId: int) -> None:
        sent = sum(m.count for m in messages if m is not None)
        log.warning("spark_stream_write_aborted", batch_id=batchId, messages_already_sent=sent)

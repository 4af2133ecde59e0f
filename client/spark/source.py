"""The `rocketmq` PySpark data source: batch and streaming reads.

See `client.spark` for the user-facing summary. Everything a reader needs on
an executor travels in the pickled reader (its parsed options) and in the
`RangePartition`; connections are opened lazily in each process (`_conn`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from client.spark._conn import Conn, get_conn
from client.spark.arrow import READ_SCHEMA_DDL, records_to_batch
from client.spark.offsets import (
    EARLIEST,
    LATEST,
    Bounds,
    OffsetMap,
    QueueRange,
    canonical,
    cap_by_lag,
    resolve_offsets,
    split_ranges,
    stream_start,
)
from client.spark.options import (
    SourceOptions,
    match_topics,
    parse_queue_key,
    parse_sink_options,
    parse_source_options,
)

__all__ = ["BatchReader", "RangePartition", "RocketMQDataSource", "StreamReader"]

log = structlog.get_logger()


@dataclass
class RangePartition(InputPartition):
    """Offsets `[start, end)` of one queue: what one Spark task reads."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int


def _conn(opts: SourceOptions) -> Conn:
    return get_conn(
        opts.namesrv_addr,
        serialize_type=opts.serialize_type,
        access_key=opts.access_key,
        secret_key=opts.secret_key,
        tls=opts.tls,
    )


def resolve_queues(conn: Conn, opts: SourceOptions) -> dict[str, list[tuple[str, int]]]:
    """The queues a read covers, `{topic: [(broker, queue id)]}`.

    Raises:
        ValueError: a batch read or `assign` names a topic without a route, or
            `assign` names a queue the topic does not have.
    """
    strict = not opts.streaming or opts.assign is not None
    if opts.subscribe is not None:
        topics = list(opts.subscribe)
    elif opts.subscribe_pattern is not None:
        topics = match_topics(re.compile(opts.subscribe_pattern), conn.topic_list())
    else:
        assert opts.assign is not None
        topics = list(opts.assign)
    out: dict[str, list[tuple[str, int]]] = {}
    for topic in topics:
        queues = conn.queues(topic)
        if queues is None:
            if strict:
                raise ValueError(
                    f"rocketmq data source: topic {topic!r} does not exist "
                    f"(no route on NameServer {opts.namesrv_addr})"
                )
            continue
        if opts.assign is not None:
            wanted = [parse_queue_key(k) for k in opts.assign[topic]]
            missing = sorted(set(wanted) - set(queues))
            if missing:
                raise ValueError(
                    f"rocketmq data source: option 'assign' names queues "
                    f"{[f'{b}:{q}' for b, q in missing]} that topic {topic!r} does not have"
                )
            queues = wanted
        out[topic] = queues
    return out


def _read_range(opts: SourceOptions, p: RangePartition) -> Iterator[pa.RecordBatch]:
    conn = _conn(opts)
    rng = QueueRange(p.topic, p.broker, p.queue_id, p.start, p.end)
    for pulled in conn.iter_range(
        rng,
        batch=opts.pull_batch_size,
        sub_expression=opts.sub_expression,
        timeout_ms=opts.poll_timeout_ms,
        fail_on_data_loss=opts.fail_on_data_loss,
    ):
        batch = records_to_batch(p.topic, p.broker, p.queue_id, pulled.body, p.end)
        if batch is not None:
            yield batch


def _partitions(ranges: list[QueueRange]) -> list[RangePartition]:
    return [RangePartition(r.topic, r.broker, r.queue_id, r.start, r.end) for r in ranges]


def _bounds(opts: SourceOptions) -> Bounds:
    conn = _conn(opts)
    return conn.bounds(
        resolve_queues(conn, opts),
        retries=opts.fetch_offset_num_retries,
        retry_interval_ms=opts.fetch_offset_retry_interval_ms,
    )


class BatchReader(DataSourceReader):
    """`spark.read.format("rocketmq")`: one partition per queue range."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[RangePartition]:
        opts = self.opts
        bounds = _bounds(opts)
        start = resolve_offsets(
            opts.starting_offsets, bounds, default=EARLIEST, name="startingOffsets"
        )
        end = resolve_offsets(opts.ending_offsets, bounds, default=LATEST, name="endingOffsets")
        for topic, queues in end.items():
            for q, e in queues.items():
                _lo, hi = bounds[topic][q]
                if e > hi:
                    raise ValueError(
                        f"rocketmq data source: endingOffsets {e} of {topic} {q} is beyond "
                        f"the queue's max offset {hi}"
                    )
                if e < start[topic][q]:
                    raise ValueError(
                        f"rocketmq data source: endingOffsets {e} of {topic} {q} is before "
                        f"startingOffsets {start[topic][q]}"
                    )
        step = stream_start(start, bounds, fail_on_data_loss=opts.fail_on_data_loss)
        return _partitions(split_ranges(step.start, end, opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder partition when there is nothing to read
        return _read_range(self.opts, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("rocketmq")`: offsets `{topic: {"broker:queue": next}}`.

    One instance lives in Spark's source runner for a whole query run (it keeps
    the caches below); another is pickled for `read()`, which needs only the
    options and the partition. No network I/O happens in `__init__`.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._initial: OffsetMap | None = None
        self._target: OffsetMap | None = None
        self._latest: OffsetMap | None = None
        self._new_starts: dict[tuple[str, str], int] = {}

    def initialOffset(self) -> OffsetMap:
        # Spark calls this twice on a fresh query: answer the same both times.
        if self._initial is None:
            bounds = _bounds(self.opts)
            self._initial = resolve_offsets(
                self.opts.starting_offsets, bounds, default=LATEST, name="startingOffsets"
            )
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = _bounds(self.opts)
        self._target = {t: {q: hi for q, (_lo, hi) in qs.items()} for t, qs in bounds.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        bounds = _bounds(self.opts)
        step = stream_start(start, bounds, fail_on_data_loss=self.opts.fail_on_data_loss)
        for msg in step.lost:
            log.warning("spark_data_loss_skipped", detail=msg)
        target = self._target
        end: OffsetMap = {}
        for topic, queues in step.start.items():
            per: dict[str, int] = {}
            for q, s in queues.items():
                if topic not in start or q not in start[topic]:
                    self._new_starts.setdefault((topic, q), s)
                hi = bounds[topic][q][1]
                if target is not None:
                    hi = min(hi, target.get(topic, {}).get(q, s))
                per[q] = max(s, hi)
            end[topic] = per
        self._latest = canonical(
            {t: {q: hi for q, (_lo, hi) in qs.items()} for t, qs in bounds.items()}
        )
        if isinstance(limit, ReadMaxRows):
            end = cap_by_lag(step.start, end, limit.max_rows)
        end = canonical(end)
        if end == canonical(start):
            return start
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[RangePartition]:
        full: OffsetMap = {}
        missing: list[tuple[str, str]] = []
        for topic, queues in end.items():
            per: dict[str, int] = {}
            for q in queues:
                s = start.get(topic, {}).get(q)
                if s is None:
                    s = self._new_starts.get((topic, q))
                if s is None:
                    missing.append((topic, q))
                    continue
                per[q] = s
            full[topic] = per
        if missing:  # a new queue after a restart: it started at its min offset
            bounds = _bounds(self.opts)
            for topic, q in missing:
                lo = bounds.get(topic, {}).get(q, (0, 0))[0]
                self._new_starts[(topic, q)] = lo
                full[topic][q] = lo
        return _partitions(split_ranges(full, end, self.opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder partition when there is nothing to read
        return _read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.opts.consumer_group
        if group is None:
            return
        try:
            _conn(self.opts).update_offsets(group, canonical(end))
        except Exception as exc:  # monitoring only: never fail the query for it
            log.warning("spark_commit_offsets_failed", group=group, error=str(exc))

    def stop(self) -> None:
        pass


class RocketMQDataSource(DataSource):
    """The `rocketmq` format: reads topics as DataFrames and writes DataFrames into topics.

    Works with any RocketMQ-protocol cluster (trimq or Apache RocketMQ 4.x).
    """

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        return READ_SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return BatchReader(parse_source_options(_opts(self.options), streaming=False))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return StreamReader(parse_source_options(_opts(self.options), streaming=True))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from client.spark.sink import BatchWriter, check_write_schema

        if overwrite:
            raise ValueError(
                "rocketmq data source: only mode('append') is supported: messages in a "
                "topic cannot be overwritten"
            )
        opts = parse_sink_options(_opts(self.options))
        return BatchWriter(opts, check_write_schema(schema, opts))

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        from client.spark.sink import StreamWriter, check_write_schema

        opts = parse_sink_options(_opts(self.options))
        return StreamWriter(opts, check_write_schema(schema, opts))


def _opts(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's CaseInsensitiveDict stores lower-cased keys; keep them lower-cased.
    return {str(k).lower(): v for k, v in options.items()}

"""Offset arithmetic of the `rocketmq` data source (sans-IO).

An offset map is `{topic: {"brokerName:queueId": next offset to read}}`. Spark
stores it verbatim in the checkpoint and compares offsets as JSON strings, so
every map built here is canonical: topics sorted, queue keys sorted by
(broker name, queue id). Bounds are `{topic: {queue key: (min, max)}}` as the
brokers answered GET_MIN_OFFSET / GET_MAX_OFFSET (max = next offset to write).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

from client.spark.options import OffsetSpec, parse_queue_key

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bounds",
    "DataLossError",
    "OffsetMap",
    "QueueRange",
    "canonical",
    "cap_by_lag",
    "queue_key",
    "resolve_offsets",
    "split_ranges",
    "stream_start",
    "total_rows",
]

EARLIEST = -2
LATEST = -1

OffsetMap = dict[str, dict[str, int]]
Bounds = Mapping[str, Mapping[str, tuple[int, int]]]


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (failOnDataLoss=true)."""


def queue_key(broker: str, queue_id: int) -> str:
    return f"{broker}:{queue_id}"


def _qsort(key: str) -> tuple[str, int]:
    return parse_queue_key(key)


def canonical(offsets: Mapping[str, Mapping[str, int]]) -> OffsetMap:
    """The same offsets with topics and queue keys in canonical order."""
    return {
        t: {q: int(offsets[t][q]) for q in sorted(offsets[t], key=_qsort)} for t in sorted(offsets)
    }


def resolve_offsets(spec: OffsetSpec, bounds: Bounds, *, default: int, name: str) -> OffsetMap:
    """Turn `earliest` / `latest` / per-queue JSON into concrete offsets.

    Args:
        spec: the parsed option.
        bounds: `(min, max)` of every queue read.
        default: EARLIEST or LATEST, for queues the JSON leaves out.
        name: the option's name, for errors.

    Raises:
        ValueError: the JSON names a topic or queue that is not read.
    """
    if isinstance(spec, dict):
        for topic, queues in spec.items():
            if topic not in bounds:
                raise ValueError(
                    f"rocketmq data source: option '{name}' names topic {topic!r}, "
                    f"which is not read (topics: {', '.join(sorted(bounds)) or 'none'})"
                )
            unknown = sorted(set(queues) - set(bounds[topic]))
            if unknown:
                raise ValueError(
                    f"rocketmq data source: option '{name}' names queues {unknown} of {topic!r} "
                    f"that do not exist (queues: {', '.join(sorted(bounds[topic], key=_qsort))})"
                )
    out: OffsetMap = {}
    for topic in sorted(bounds):
        per: dict[str, int] = {}
        for q in sorted(bounds[topic], key=_qsort):
            lo, hi = bounds[topic][q]
            if spec == "earliest":
                v = EARLIEST
            elif spec == "latest":
                v = LATEST
            else:
                assert isinstance(spec, dict)
                v = spec.get(topic, {}).get(q, default)
            per[q] = lo if v == EARLIEST else hi if v == LATEST else v
        out[topic] = per
    return out


@dataclass(frozen=True, slots=True)
class StreamStep:
    """What the stream reader does with the queues between `start` and the brokers' bounds."""

    start: OffsetMap
    """`start` with new queues added at their min offset and lost ranges handled."""
    lost: list[str]
    """Human-readable data-loss events (skipped because failOnDataLoss=false)."""


def stream_start(
    start: Mapping[str, Mapping[str, int]], bounds: Bounds, *, fail_on_data_loss: bool
) -> StreamStep:
    """Reconcile a checkpointed start with what the brokers hold now.

    - A queue in `bounds` but not in `start` is new: it starts at its min offset.
    - A start below the queue's min offset lost messages; a queue in `start` but
      gone from `bounds` vanished. Either fails (DataLossError) or, with
      `fail_on_data_loss=False`, moves on (to min / dropping the queue).

    Raises:
        DataLossError: data was lost and `fail_on_data_loss` is set.
    """
    lost: list[str] = []
    out: OffsetMap = {}
    for topic in sorted(set(start) | set(bounds)):
        old = start.get(topic, {})
        now = bounds.get(topic, {})
        per: dict[str, int] = {}
        for q in sorted(set(old) | set(now), key=_qsort):
            if q not in now:
                lost.append(f"queue {topic} {q} no longer exists (was at offset {old[q]})")
                continue
            lo, _hi = now[q]
            if q not in old:
                per[q] = lo
                continue
            off = old[q]
            if off < lo:
                lost.append(
                    f"{topic} {q}: offsets {off}..{lo - 1} were deleted "
                    f"(the queue's min offset is now {lo})"
                )
                off = lo
            per[q] = off
        if per:
            out[topic] = per
    if lost and fail_on_data_loss:
        raise DataLossError(
            "rocketmq data source: data loss: "
            + "; ".join(lost)
            + ". Set option failOnDataLoss=false to skip lost offsets."
        )
    return StreamStep(out, lost)


def total_rows(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> int:
    return sum(
        max(0, off - start.get(t, {}).get(q, off)) for t, qs in end.items() for q, off in qs.items()
    )


def cap_by_lag(
    start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]], max_rows: int
) -> OffsetMap:
    """Limit `end` to at most `max_rows` offsets past `start`, split in proportion to lag.

    Each queue gets `floor(max_rows * lag / total)`; the rounding remainder goes
    one offset at a time to the queues with the largest fractional share (ties
    in canonical queue order). The result is deterministic and canonical; when
    the total lag fits, `end` itself (canonical) is returned. Queues missing
    from `start` have no lag.
    """
    end_c = canonical(end)
    lags: list[tuple[str, str, int, int]] = []  # topic, queue, start, lag
    for t, qs in end_c.items():
        for q, e in qs.items():
            s = start.get(t, {}).get(q, e)
            lags.append((t, q, s, max(0, e - s)))
    total = sum(lag for *_, lag in lags)
    if total <= max_rows:
        return end_c
    out: OffsetMap = {t: dict(qs) for t, qs in end_c.items()}
    given = 0
    fractions: list[tuple[int, int, str, str]] = []
    for i, (t, q, s, lag) in enumerate(lags):
        share, rem = divmod(max_rows * lag, total)
        out[t][q] = s + share
        given += share
        if lag > share:
            fractions.append((-rem, i, t, q))
    heapq.heapify(fractions)
    left = max_rows - given
    while left > 0 and fractions:
        _, _, t, q = heapq.heappop(fractions)
        out[t][q] += 1
        left -= 1
    return out


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Offsets `[start, end)` of one queue (the unit of work of a Spark partition)."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(
    start: Mapping[str, Mapping[str, int]],
    end: Mapping[str, Mapping[str, int]],
    min_partitions: int | None = None,
) -> list[QueueRange]:
    """One range per queue with offsets to read, split further to reach `min_partitions`.

    Splitting halves the largest range until there are `min_partitions` ranges
    or every range holds a single offset. The order is canonical
    (topic, broker, queue, start), so the same offsets always give the same ranges.
    """
    ranges: list[QueueRange] = []
    for t, qs in canonical(end).items():
        for q, e in qs.items():
            s = start.get(t, {}).get(q, e)
            if e > s:
                broker, qid = parse_queue_key(q)
                ranges.append(QueueRange(t, broker, qid, s, e))
    if min_partitions and len(ranges) < min_partitions:
        heap = [(-r.size, i, r) for i, r in enumerate(ranges)]
        heapq.heapify(heap)
        seq = len(ranges)
        while len(heap) < min_partitions and heap and -heap[0][0] > 1:
            _, _, r = heapq.heappop(heap)
            mid = r.start + r.size // 2
            for part in (
                QueueRange(r.topic, r.broker, r.queue_id, r.start, mid),
                QueueRange(r.topic, r.broker, r.queue_id, mid, r.end),
            ):
                heapq.heappush(heap, (-part.size, seq, part))
                seq += 1
        ranges = [r for _, _, r in heap]
    ranges.sort(key=lambda r: (r.topic, r.broker, r.queue_id, r.start))
    return ranges

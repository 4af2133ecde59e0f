"""Pure accumulators behind the broker's and the NameServer's Prometheus metrics.

The hot paths count into plain lists and dicts (an increment costs what a dict lookup costs);
`broker.metrics` and `namesrv.metrics` turn them into Prometheus samples when scraped. Nothing
here imports prometheus_client or knows what a topic is.

Histograms keep one count per bucket (not cumulative) plus the sum; bucket `i` holds the
observations `v` with `bounds[i-1] < v <= bounds[i]` (Prometheus' `le`, OpenTelemetry's
explicit buckets), the last one those above every bound (`+Inf`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

__all__ = [
    "OVERFLOW",
    "RPC_LATENCY_BUCKETS_MS",
    "RpcLatencyStats",
    "bucket_index",
    "cumulative_buckets",
]

# RocketMQ 5.x's buckets of rocketmq_rpc_latency (milliseconds).
RPC_LATENCY_BUCKETS_MS: tuple[float, ...] = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)

# The key label sets beyond a family's cap are counted under (documented in docs/metrics.md).
OVERFLOW = "__overflow__"


def bucket_index(bounds: Sequence[float], value: float) -> int:
    """The bucket of `value`: the first bound >= value, len(bounds) for +Inf."""
    return bisect_left(bounds, value)


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, int]]:
    """Prometheus' (le, cumulative count) pairs of per-bucket `counts` (len(bounds) + 1)."""
    out: list[tuple[str, int]] = []
    total = 0
    for bound, count in zip(bounds, counts, strict=False):
        total += count
        out.append((_le(bound), total))
    total += counts[len(bounds)]
    out.append(("+Inf", total))
    return out


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


class RpcLatencyStats:
    """RPC durations by (request code, response code): a `remoting.RpcObserver`.

    Args:
        max_label_sets: distinct (code, response code) pairs kept; later new pairs are counted
            under (-1, -1) (a peer sending every code cannot grow the table without bound).
    """

    __slots__ = ("bounds", "max_label_sets", "rows")

    def __init__(
        self,
        max_label_sets: int = 512,
        bounds: tuple[float, ...] = RPC_LATENCY_BUCKETS_MS,
    ) -> None:
        self.bounds = bounds
        self.max_label_sets = max_label_sets
        # (code, response code) -> [count per bucket..., sum in ms]
        self.rows: dict[tuple[int, int], list[float]] = {}

    def observe(self, codes: Sequence[int], seconds: float) -> None:
        """The requests of `codes` (request code, response code, request code, ...) took
        `seconds` each (one read to one write)."""
        n = len(codes) // 2
        if not n:
            return
        ms = seconds * 1000.0
        index = bisect_left(self.bounds, ms)
        rows = self.rows
        first = (codes[0], codes[1])
        # The common batch: one kind of request, all answered alike (a producer's sends).
        # `count` is a C loop: one row update for the whole batch.
        if n == 1 or (codes[0::2].count(first[0]) == n and codes[1::2].count(first[1]) == n):
            row = rows.get(first)
            if row is None:
                row = self._new_row(first)
            row[index] += n
            row[-1] += ms * n
            return
        for i in range(0, 2 * n, 2):
            key = (codes[i], codes[i + 1])
            row = rows.get(key)
            if row is None:
                row = self._new_row(key)
            row[index] += 1
            row[-1] += ms

    def _new_row(self, key: tuple[int, int]) -> list[float]:
        if len(self.rows) >= self.max_label_sets:
            key = (-1, -1)
            row = self.rows.get(key)
            if row is not None:
                return row
        row = [0.0] * (len(self.bounds) + 2)
        self.rows[key] = row
        return row

    def samples(self) -> list[tuple[int, int, list[tuple[str, int]], float]]:
        """(code, response code, cumulative buckets, sum in ms) of every row."""
        n = len(self.bounds) + 1
        return [
            (code, rc, cumulative_buckets(self.bounds, [int(c) for c in row[:n]]), row[-1])
            for (code, rc), row in sorted(self.rows.items())
        ]

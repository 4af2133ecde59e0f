"""`common.metrics` (the plain accumulators) and `common.metrics_http.parse_listen`."""

from __future__ import annotations

import pytest

from common.metrics import (
    RPC_LATENCY_BUCKETS_MS,
    RpcLatencyStats,
    bucket_index,
    cumulative_buckets,
)
from common.metrics_http import parse_listen


def test_bucket_index_is_prometheus_le() -> None:
    bounds = (1, 3, 5)
    assert [bucket_index(bounds, v) for v in (0, 1, 1.5, 3, 5, 5.01, 99)] == [0, 0, 1, 1, 2, 3, 3]


def test_cumulative_buckets() -> None:
    assert cumulative_buckets((1, 2.5), [1, 0, 2]) == [("1", 1), ("2.5", 1), ("+Inf", 3)]


def test_rpc_latency_stats_counts_each_answer_in_its_bucket() -> None:
    stats = RpcLatencyStats()
    stats.observe([310, 0, 310, 0, 11, 19], 0.004)  # 4 ms
    stats.observe([310, 0], 2.5)  # 2500 ms
    stats.observe([310, 0, 310, 0], 0.0)  # the one-kind batch path
    stats.observe([], 1.0)
    rows = {(c, rc): (b, s) for c, rc, b, s in stats.samples()}
    buckets, total = rows[310, 0]
    assert dict(buckets) == {
        "1": 2,
        "3": 2,
        "5": 4,
        "7": 4,
        "10": 4,
        "100": 4,
        "1000": 4,
        "2000": 4,
        "3000": 5,
        "+Inf": 5,
    }
    assert total == pytest.approx(2 * 4 + 2500)
    assert dict(rows[11, 19][0])["+Inf"] == 1
    assert len(buckets) == len(RPC_LATENCY_BUCKETS_MS) + 1


def test_rpc_latency_stats_caps_its_label_sets() -> None:
    stats = RpcLatencyStats(max_label_sets=3)
    stats.observe([c for code in range(10) for c in (code, 3)], 0.0)
    keys = [(c, rc) for c, rc, _, _ in stats.samples()]
    assert len(keys) == 4  # three codes and the overflow row
    assert (-1, -1) in keys
    overflow = next(b for c, _, b, _ in stats.samples() if c == -1)
    assert dict(overflow)["+Inf"] == 7


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("  ", None),
        ("127.0.0.1:5557", ("127.0.0.1", 5557)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9", ("::1", 9)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int] | None) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["5557", "host:", ":1", "h:70000", "h:x"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(text)

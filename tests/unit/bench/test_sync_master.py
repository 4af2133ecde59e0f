"""The trimq-sync-master system's own logic: replication lag from a sample series, the report's
rows and targets for it, and mqbench counting answers other than SEND_OK as failures."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from bench.peers.ha_lag import Sample, growing_window, lags, summarize
from bench.peers.report import failures, lag_notes, render, targets
from bench.peers.run import CONFIGS, LAG_SAMPLED, OPT_IN, PAIRS, pair_label
from client import MessageQueue, SendResult, SendStatus
from client.cli import mqbench

# ---- lag from samples -----------------------------------------------------------------------


def _series(rows: Sequence[tuple[float, int, int]]) -> list[Sample]:
    """Samples from (t in ms, master max, slave ack) rows."""
    return [Sample(t / 1000.0, m, a) for t, m, a in rows]


def test_lag_is_the_time_to_the_first_sample_acknowledging_the_max() -> None:
    samples = _series(
        [
            (0, 100, 100),  # idle before the load: not counted
            (5, 100, 100),
            (10, 200, 100),  # grown: acked at 20 -> 10 ms
            (15, 300, 150),  # acked at 25 -> 10 ms
            (20, 400, 200),  # acked at 30 -> 10 ms
            (25, 500, 350),  # the last growth: acked at 35 -> 10 ms
            (30, 500, 450),  # no growth since 25: not counted
            (35, 500, 500),
            (40, 500, 500),
        ]
    )
    assert growing_window(samples) == range(2, 6)
    got = lags(samples)
    assert got.unresolved == 0
    assert got.lags_ms == pytest.approx([10.0, 10.0, 10.0, 10.0])


def test_an_acknowledgement_in_the_same_answer_is_no_lag() -> None:
    samples = _series([(0, 0, 0), (5, 10, 10), (10, 20, 15), (15, 30, 30)])
    assert lags(samples).lags_ms == pytest.approx([0.0, 5.0, 0.0])


def test_a_max_never_acknowledged_is_unresolved_not_zero() -> None:
    # The slave drops out (-1) and never catches up with 300.
    samples = _series([(0, 0, 0), (5, 100, 0), (10, 300, 100), (15, 300, -1), (20, 300, 200)])
    got = lags(samples)
    assert got.lags_ms == pytest.approx([5.0])
    assert got.unresolved == 1


def test_no_growth_means_no_lag_samples() -> None:
    samples = _series([(0, 100, 100), (5, 100, 90), (10, 100, 100)])
    assert growing_window(samples) == range(0)
    assert lags(samples) == ([], 0)
    assert lags([]) == ([], 0)


def test_summary_percentiles_and_poll_interval() -> None:
    # Polls 5 ms apart; the max grows by 1,000 a poll up to poll 100; the slave acknowledges
    # half of poll j's max at poll j (1,000 x j // 2): sample i is acknowledged at poll 2i,
    # a lag of 5 x i ms (5, 10, ..., 500).
    samples = [Sample(0.005 * j, 1000 * min(j, 100), 1000 * min(j // 2, 100)) for j in range(221)]
    s = summarize(samples, 5.0)
    assert s["polls"] == 221
    assert s["samples"] == 100
    assert s["unresolved"] == 0
    assert s["lag_ms"]["p50"] == pytest.approx(255.0)
    assert s["lag_ms"]["p99"] == pytest.approx(500.0)
    assert s["lag_ms"]["max"] == pytest.approx(500.0)
    assert s["poll_interval_ms"]["mean"] == pytest.approx(5.0)
    assert s["poll_interval_ms"]["max"] == pytest.approx(5.0)
    assert s["bytes"] == 100_000


# ---- the report -----------------------------------------------------------------------------


def _run(rate: float, lag: dict[str, Any] | None = None, errors: int = 0) -> dict[str, Any]:
    res = {
        "result": {
            "msgs_per_s": rate,
            "messages": 1000,
            "errors": errors,
            "latency_ms": {"p99": 1.0},
        },
        "server_cpu_s": 1.0,
        "client_cpu_s": 0.5,
    }
    run = {w: dict(res) for w in ("W1", "W2", "W3", "W4", "W5")}
    if lag is not None:
        run["W1"]["replication_lag"] = lag
    return run


def _lag(p50: float, p99: float, mx: float) -> dict[str, Any]:
    return {
        "kind": "ha-lag",
        "interval_ms": 5.0,
        "polls": 400,
        "samples": 380,
        "unresolved": 0,
        "lag_ms": {"p50": p50, "p99": p99, "max": mx},
        "poll_interval_ms": {"mean": 5.2, "p99": 7.0, "max": 9.5},
        "bytes": 1_000_000,
    }


def test_sync_master_is_a_default_system_compared_with_trimq_async() -> None:
    assert CONFIGS["trimq-sync-master"] == ("trimq", "sync-master")
    assert "trimq-sync-master" not in OPT_IN
    assert ("trimq-sync-master", "trimq-async") in PAIRS
    assert LAG_SAMPLED == {"trimq-sync-master": "W1"}
    assert pair_label("trimq-sync-master", "trimq-async") == "sync-master/trimq-async"
    assert pair_label("trimq-async", "nats") == "async/nats"


def test_report_rows_ratio_and_targets_for_sync_master() -> None:
    runs = {
        "trimq-async": [_run(40_000)],
        "trimq-sync-master": [_run(24_000, _lag(3.0, 12.5, 30.0))],
    }
    text = render({"runs": runs})
    assert "| metric | trimq-async | trimq-sync-master | sync-master/trimq-async |" in text
    assert "| W1 publish, 64 in flight: msgs/s | 40,000 | 24,000 | 0.60x |" in text
    assert "| W1 replication lag p50 ms | - | 3.00 | - |" in text
    assert "| W1 replication lag p99 ms | - | 12.50 | - |" in text
    assert "| W1 replication lag max ms | - | 30.00 | - |" in text
    assert "| SYNC_MASTER W1 >= 0.5x ASYNC_MASTER W1 | met |" in text
    assert "| SYNC_MASTER replication lag p99 <= 50 ms under W1 | met |" in text
    (note,) = lag_notes(runs)
    assert "replication lag p50 3.0 p99 12.5 max 30.0 ms over 380 samples" in note
    assert "polled every 5.20 ms on average (asked 5" in note
    assert "upper bound" in note
    assert f"- {note}" in text


def test_sync_master_targets_missed_and_not_measured() -> None:
    runs = {
        "trimq-async": [_run(40_000)],
        "trimq-sync-master": [_run(10_000, _lag(20.0, 80.0, 120.0))],
    }
    got = {desc: (ok, figures) for desc, ok, figures in targets(runs)}
    ok, figures = got["SYNC_MASTER W1 >= 0.5x ASYNC_MASTER W1"]
    assert ok is False
    assert "0.25x the reference 40,000" in figures
    ok, figures = got["SYNC_MASTER replication lag p99 <= 50 ms under W1"]
    assert ok is False
    assert "over the bound by 60%" in figures
    alone = {desc: ok for desc, ok, _ in targets({"trimq-async": [_run(40_000)]})}
    assert alone["SYNC_MASTER W1 >= 0.5x ASYNC_MASTER W1"] is None
    assert alone["SYNC_MASTER replication lag p99 <= 50 ms under W1"] is None
    # No lag table rows without a lag-sampled system.
    assert "| W1 replication lag" not in render({"runs": {"trimq-async": [_run(40_000)]}})


def test_sends_not_ok_are_reported_as_failures() -> None:
    bad = _run(24_000, _lag(3.0, 12.5, 30.0), errors=7)
    bad["W1"]["result"]["not_ok"] = {"SLAVE_NOT_AVAILABLE": 7}
    runs = {"trimq-sync-master": [bad]}
    note = "trimq-sync-master run 1 W1: 7 errors (messages answered SLAVE_NOT_AVAILABLE 7)"
    assert note in failures(runs)
    assert f"- {note}" in render({"runs": runs})
    assert failures({"trimq-sync-master": [_run(24_000)]}) == []


# ---- mqbench's send statuses ----------------------------------------------------------------


class _FakeProducer:
    """Answers every fourth send (after the warm-up) with SLAVE_NOT_AVAILABLE."""

    sends = 0

    def __init__(self, group: str, cfg: Any) -> None:
        pass

    async def __aenter__(self) -> _FakeProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _result(self, ids: str) -> SendResult:
        n = type(self).sends
        type(self).sends += 1
        status = SendStatus.SLAVE_NOT_AVAILABLE if n % 4 == 0 else SendStatus.SEND_OK
        return SendResult(status, ids, "x", MessageQueue("T", "b", 0), n)

    async def send(self, msg: Any) -> SendResult:
        return self._result("id")

    async def send_batch(self, msgs: Sequence[Any]) -> list[SendResult]:
        return [self._result(",".join("id" for _ in msgs))]


@pytest.mark.parametrize(("batch", "sends"), [(1, 40), (4, 10)])
def test_mqbench_counts_slave_not_available_as_a_failure(
    monkeypatch: pytest.MonkeyPatch, batch: int, sends: int
) -> None:
    monkeypatch.setattr(mqbench, "Producer", _FakeProducer)
    monkeypatch.setattr(mqbench, "freeze_startup_heap", lambda: None)
    monkeypatch.setattr(_FakeProducer, "sends", 1)  # the warm-up send is number 1
    args = ["producer", "-n", "127.0.0.1:1", "-t", "T", "-w", "1", "-c", "40", "--json"]
    res = CliRunner().invoke(mqbench.cli, [*args, "-b", str(batch)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    # Sends 4, 8, ... answered SLAVE_NOT_AVAILABLE: a quarter of them (minus the warm-up's).
    failed = sends // 4
    assert summary["errors"] == failed
    assert summary["not_ok"] == {"SLAVE_NOT_AVAILABLE": failed * batch}
    assert summary["messages"] == 40 - failed * batch
    assert summary["latency_ms"]["samples"] == sends - failed


def test_mqbench_stats_count_each_part_of_a_batch_by_status() -> None:
    stats = mqbench.Stats()
    mq = MessageQueue("T", "b", 0)
    parts = [
        SendResult(SendStatus.SEND_OK, "a,b", "x", mq, 0),
        SendResult(SendStatus.FLUSH_SLAVE_TIMEOUT, "c,d,e", "x", mq, 2),
    ]
    stats.send_not_ok(parts)
    assert stats.errors == 1
    assert stats.not_ok == {"FLUSH_SLAVE_TIMEOUT": 3}
    summary = stats.summary("producer", {})
    assert summary["not_ok"] == {"FLUSH_SLAVE_TIMEOUT": 3}
    assert summary["messages"] == 0

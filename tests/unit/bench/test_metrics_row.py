"""bench.peers' trimq-metrics system: the scrape parser and the count check after W5, which
must refuse a broker whose counters do not match what the workloads sent."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from bench.peers import run, scrape
from bench.peers.report import targets
from bench.peers.run import CONFIGS, OPT_IN, PAIRS

pytestmark = pytest.mark.unit


def _exposition(in_bench: int, in_seq: int, out_w3: int) -> str:
    reg = CollectorRegistry()
    msgs_in = Counter("rocketmq_messages_in", "in", ["topic"], registry=reg)
    msgs_out = Counter("rocketmq_messages_out", "out", ["topic", "consumer_group"], registry=reg)
    msgs_in.labels("Bench").inc(in_bench)
    msgs_in.labels("BenchSeq").inc(in_seq)
    msgs_out.labels("Bench", "bench_w3").inc(out_w3)
    msgs_out.labels("Bench", "other").inc(7)
    return generate_latest(reg).decode()


def _results() -> dict[str, Any]:
    return {
        "W1": {"result": {"messages": 100}},
        "W2": {"result": {"messages": 64}},
        "W5": {"result": {"messages": 10}},
    }


def test_sample_value_matches_labels_and_sums() -> None:
    text = _exposition(3, 4, 5)
    assert scrape.sample_value(text, "rocketmq_messages_in_total", {"topic": "Bench"}) == 3
    assert scrape.sample_value(text, "rocketmq_messages_out_total", {"topic": "Bench"}) == 12
    assert scrape.sample_value(text, "rocketmq_messages_in_total", {"topic": "X"}) is None


def test_counts_check_accepts_exact_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "_count", lambda w: 50)
    # W1 + W2 + their two warm-up messages; W5 + its warm-up message.
    monkeypatch.setattr(scrape, "fetch", lambda url: _exposition(166, 11, 50))
    lines = run._check_counts("http://x/metrics", _results(), scrape.Scraper([]))
    assert "in Bench 166" in lines


@pytest.mark.parametrize(
    ("in_bench", "in_seq", "out_w3"), [(165, 11, 50), (166, 12, 50), (166, 11, 49)]
)
def test_counts_check_refuses_a_wrong_count(
    monkeypatch: pytest.MonkeyPatch, in_bench: int, in_seq: int, out_w3: int
) -> None:
    monkeypatch.setattr(run, "_count", lambda w: 50)
    monkeypatch.setattr(scrape, "fetch", lambda url: _exposition(in_bench, in_seq, out_w3))
    with pytest.raises(RuntimeError, match="trimq-metrics counts"):
        run._check_counts("http://x/metrics", _results(), scrape.Scraper([]))


def test_the_metrics_row_is_opt_in_and_compared_with_trimq_async() -> None:
    assert CONFIGS["trimq-metrics"] == ("trimq", "metrics")
    assert "trimq-metrics" in OPT_IN
    assert ("trimq-metrics", "trimq-async") in PAIRS
    runs = {
        "trimq-async": [{"W1": {"result": {"msgs_per_s": 100.0}}}],
        "trimq-metrics": [{"W1": {"result": {"msgs_per_s": 96.0}}}],
    }
    row = [t for t in targets(runs) if t[0].startswith("metrics W1")]
    assert row
    assert row[0][1] is False
    runs["trimq-metrics"][0]["W1"]["result"]["msgs_per_s"] = 97.5
    row = [t for t in targets(runs) if t[0].startswith("metrics W1")]
    assert row[0][1] is True

"""The peers harness's own logic: CPU readings, summaries, medians, targets, the report."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from bench.peers._cpu import idle_wake_us, interp_ns, loopback_rtt_us, trio_checkpoint_us
from bench.peers._proc import cpu_seconds
from bench.peers._stats import BODY_SIZE, E2E_HEAD, body_pool, e2e_body, e2e_latency_ms, summary
from bench.peers.report import disturbed, render, targets
from bench.peers.run import _trimq_args, cpu_per_msg_us, metric


def test_cpu_seconds_of_this_process_grows_with_work() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.1


def test_summary_percentiles_and_rate() -> None:
    s = summary("x", 1000, 2.0, [float(i) for i in range(1, 101)], errors=3, extra="y")
    assert s["msgs_per_s"] == 500.0
    assert s["errors"] == 3
    assert s["extra"] == "y"
    assert s["latency_ms"]["p50"] == 51.0
    assert s["latency_ms"]["p99"] == 100.0
    assert s["latency_ms"]["max"] == 100.0
    assert summary("x", 0, 1.0, [])["latency_ms"]["p99"] == 0.0


def test_e2e_body_roundtrip() -> None:
    body = e2e_body(42, b"p" * (1024 - E2E_HEAD.size))
    assert len(body) == 1024
    seq, ms = e2e_latency_ms(body)
    assert seq == 42
    assert 0 <= ms < 5_000


def _run(w1: float, p99: float, w3: float, cpu: float) -> dict[str, Any]:
    def res(rate: float, lat99: float = 1.0) -> dict[str, Any]:
        return {
            "result": {"msgs_per_s": rate, "messages": 1000, "latency_ms": {"p99": lat99}},
            "server_cpu_s": cpu,
            "client_cpu_s": cpu / 2,
        }

    return {"W1": res(w1, p99), "W2": res(w1), "W3": res(w3), "W4": res(2000, p99), "W5": res(w1)}


def test_medians_targets_and_report() -> None:
    runs = {
        "trimq-async": [_run(100, 4, 300, 1.0), _run(300, 9, 100, 3.0), _run(200, 6, 200, 2.0)],
        "nats": [_run(150, 1, 50, 1.0)],
        "redis-everysec": [_run(1000, 1, 250, 0.1)],
        "trimq-sync": [_run(120, 8, 100, 1.0)],
    }
    assert metric(runs["trimq-async"], "W1", ("msgs_per_s",)) == 200
    assert cpu_per_msg_us(runs["trimq-async"], "W1", "server_cpu_s") == 2000.0
    got = {desc: (ok, figures) for desc, ok, figures in targets(runs)}
    assert list(got) == [
        "W1 >= 1.2x JetStream msgs/s",
        "W1 >= 0.6x Redis (everysec) msgs/s",
        "W1 p99 <= 5 ms",
        "W2 >= 150,000 msgs/s",
        "W3 >= 1.5x the faster peer",
        "W4 p99 not worse than either peer",
        "W5 >= 1.0x JetStream msgs/s",
        "SYNC_FLUSH W1 >= 0.6x ASYNC_FLUSH W1",
        "W1 broker CPU us/msg <= JetStream server's",
        "SYNC_MASTER W1 >= 0.5x ASYNC_MASTER W1",
        "SYNC_MASTER replication lag p99 <= 50 ms under W1",
        "ACL W1 >= 0.85x W1 without ACL",
        "metrics W1 >= 0.97x W1 without metrics",
    ]
    assert got["W1 >= 1.2x JetStream msgs/s"][0] is True  # 200 vs 1.2 x 150 = 180
    assert got["W1 >= 0.6x Redis (everysec) msgs/s"][0] is False  # 200 vs 600
    assert "short of the bound by 67%" in got["W1 >= 0.6x Redis (everysec) msgs/s"][1]
    assert "0.20x the reference 1,000" in got["W1 >= 0.6x Redis (everysec) msgs/s"][1]
    assert got["W1 p99 <= 5 ms"][0] is False  # median 6
    assert "over the bound by 20%" in got["W1 p99 <= 5 ms"][1]
    assert got["W2 >= 150,000 msgs/s"][0] is False  # 200
    assert got["W3 >= 1.5x the faster peer"][0] is False  # 200 vs 1.5 x 250 = 375
    assert got["W4 p99 not worse than either peer"][0] is False  # 6 vs 1
    assert got["W5 >= 1.0x JetStream msgs/s"][0] is True  # 200 vs 150
    assert got["SYNC_FLUSH W1 >= 0.6x ASYNC_FLUSH W1"][0] is True  # 120 vs 0.6 x 200 = 120
    assert got["W1 broker CPU us/msg <= JetStream server's"][0] is False  # 2,000 vs 1,000 us
    text = render({"runs": runs})
    assert "| W1 publish, 64 in flight: msgs/s | 200 | 150 | 1,000 | 120 |" in text
    assert "| W1 >= 1.2x JetStream msgs/s | met |" in text
    assert "| W1 broker CPU us/msg <= JetStream server's | missed |" in text
    assert "cpu reference: not measured" in text


def test_targets_without_a_peer_are_not_measured() -> None:
    runs = {"trimq-async": [_run(100, 4, 300, 1.0)], "trimq-sync": [_run(70, 4, 300, 1.0)]}
    got = {desc: ok for desc, ok, _ in targets(runs)}
    assert got["W1 >= 1.2x JetStream msgs/s"] is None
    assert got["W3 >= 1.5x the faster peer"] is None
    assert got["W1 broker CPU us/msg <= JetStream server's"] is None
    assert got["W1 p99 <= 5 ms"] is True
    assert got["SYNC_FLUSH W1 >= 0.6x ASYNC_FLUSH W1"] is True  # 70 vs 60


def test_runs_disturbed_by_other_processes_are_named() -> None:
    quiet, busy = _run(100, 4, 300, 1.0), _run(100, 4, 300, 1.0)
    busy["W2"]["others_cores"] = 0.4
    quiet["W2"]["others_cores"] = 0.05
    runs = {"trimq-async": [quiet, busy]}
    note = "trimq-async run 2 W2: disturbed (other processes used 0.40 cores meanwhile)"
    assert disturbed(runs) == [note]
    assert f"- {note}" in render({"runs": runs})
    assert "disturbed" not in render({"runs": {"trimq-async": [quiet]}})


def test_the_plain_nats_check_runs_the_harness_knobs() -> None:
    # nats-py is the bench extra's, not in the test install (`make test`).
    pytest.importorskip("nats", reason="nats-py (the bench extra) is not installed")
    from bench.peers import crosscheck_nats, nats_client

    assert crosscheck_nats.PENDING_SIZE == nats_client.PENDING_SIZE
    assert crosscheck_nats.SKIP_SUBJECT_VALIDATION == nats_client.SKIP_SUBJECT_VALIDATION


def test_every_producer_workload_sends_from_the_same_body_pool() -> None:
    pool = body_pool(8)
    assert len(set(pool)) == 8
    assert {len(b) for b in pool} == {BODY_SIZE}
    for w in ("W1", "W2", "W5"):
        args = _trimq_args(w, "127.0.0.1:9876")
        assert args[args.index("--body-pool") + 1] == "4096"
        assert args[args.index("-s") + 1] == str(BODY_SIZE)


def test_report_names_the_runs_cpu_reference() -> None:
    ref = {"cpu_model": "X", "interp_ns": 70.5, "trio_checkpoint_us": 4.2, "loopback_rtt_us": 30.0}
    runs = {"trimq-async": [_run(100, 4, 300, 1.0)]}
    text = render({"runs": runs, "machine": {"cpu_reference": ref}})
    assert (
        "cpu reference (X): 70.5 ns per Python loop iteration, 4.2 us per trio checkpoint" in text
    )


def test_cpu_reference_probes_measure_something() -> None:
    assert 0 < interp_ns(n=20_000, repeats=2) < 100_000
    assert 0 < trio_checkpoint_us(n=2_000, repeats=2) < 10_000
    assert 0 < loopback_rtt_us(n=50) < 1_000_000
    wake = idle_wake_us(n=50, gap=0.001)
    assert sorted(wake) == ["asyncio", "epoll", "trio"]
    assert all(0 < us < 1_000_000 for us in wake.values())


def test_report_names_the_idle_wake_up_cost_when_measured() -> None:
    ref = {"cpu_model": "X", "interp_ns": 70.5, "trio_checkpoint_us": 4.2, "loopback_rtt_us": 30.0}
    runs = {"trimq-async": [_run(100, 4, 300, 1.0)]}
    wake = {"epoll": 20.0, "asyncio": 35.5, "trio": 64.0}
    text = render({"runs": runs, "machine": {"cpu_reference": {**ref, "idle_wake_us": wake}}})
    assert (
        "CPU per idle wake-up: 20.0 us (bare epoll loop), 35.5 us (asyncio), 64.0 us (trio)" in text
    )
    # A run saved before the probe existed still renders, without it.
    assert "idle wake-up" not in render({"runs": runs, "machine": {"cpu_reference": ref}})

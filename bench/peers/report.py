"""Render a `python -m bench.peers --out FILE` result as the Markdown table of bench/RESULTS.md.

.venv/bin/python -m bench.peers.report /tmp/peers.json > /tmp/table.md  # machine JSON on stderr
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .run import (
    CONFIGS,
    LAG_METRICS,
    LAG_SAMPLED,
    METRICS,
    PAIRS,
    WORKLOADS,
    _fmt,
    _ratio,
    cpu_per_msg_us,
    cpu_reference_line,
    lag_line,
    metric,
    pair_label,
)

Runs = dict[str, list[dict[str, Any]]]


def targets(all_runs: Runs) -> list[tuple[str, bool | None, str]]:
    """The targets RESULTS.md states: (description, met (None = not measured), figures).

    Every bound comes from the same run's figures (medians), but W1 p99 and W2's, which are
    absolute. A missed target's figures say by how much it was missed.
    """

    def m(c: str, w: str, *path: str) -> float | None:
        return metric(all_runs[c], w, path) if c in all_runs else None

    def cpu(c: str, w: str) -> float | None:
        return cpu_per_msg_us(all_runs[c], w, "server_cpu_s") if c in all_runs else None

    out: list[tuple[str, bool | None, str]] = []

    def check(
        desc: str,
        value: float | None,
        bound: float | None,
        higher: bool,
        ref: float | None = None,
        factor: float = 1.0,
    ) -> None:
        """`value` against `bound` = `factor` x `ref` (or an absolute `bound`)."""
        if ref is not None:
            bound = ref * factor
        if value is None or not bound:
            out.append((desc, None, "not measured"))
            return
        ok = value >= bound if higher else value <= bound
        figures = f"{_fmt(value)} vs bound {_fmt(bound)} ({value / bound:.2f}x the bound)"
        if ref is not None and factor != 1.0:
            figures += f"; {value / ref:.2f}x the reference {_fmt(ref)}"
        if not ok and higher:
            figures += f"; short of the bound by {1 - value / bound:.0%}"
        elif not ok:
            figures += f"; over the bound by {value / bound - 1:.0%}"
        out.append((desc, ok, figures))

    def faster(*vals: float | None) -> float | None:
        return max((v for v in vals if v is not None), default=None)

    def lower(*vals: float | None) -> float | None:
        return min((v for v in vals if v is not None), default=None)

    w1 = m("trimq-async", "W1", "msgs_per_s")
    jn, rd = m("nats", "W1", "msgs_per_s"), m("redis-everysec", "W1", "msgs_per_s")
    check("W1 >= 1.2x JetStream msgs/s", w1, None, True, jn, 1.2)
    check("W1 >= 0.6x Redis (everysec) msgs/s", w1, None, True, rd, 0.6)
    check("W1 p99 <= 5 ms", m("trimq-async", "W1", "latency_ms", "p99"), 5.0, False)
    check("W2 >= 150,000 msgs/s", m("trimq-async", "W2", "msgs_per_s"), 150_000.0, True)
    w3 = m("trimq-async", "W3", "msgs_per_s")
    best3 = faster(m("nats", "W3", "msgs_per_s"), m("redis-everysec", "W3", "msgs_per_s"))
    check("W3 >= 1.5x the faster peer", w3, None, True, best3, 1.5)
    p99 = m("trimq-async", "W4", "latency_ms", "p99")
    peers4 = lower(
        m("nats", "W4", "latency_ms", "p99"), m("redis-everysec", "W4", "latency_ms", "p99")
    )
    check("W4 p99 not worse than either peer", p99, None, False, peers4)
    w5 = m("trimq-async", "W5", "msgs_per_s")
    check("W5 >= 1.0x JetStream msgs/s", w5, None, True, m("nats", "W5", "msgs_per_s"))
    sync1 = m("trimq-sync", "W1", "msgs_per_s")
    check("SYNC_FLUSH W1 >= 0.6x ASYNC_FLUSH W1", sync1, None, True, w1, 0.6)
    check(
        "W1 broker CPU us/msg <= JetStream server's",
        cpu("trimq-async", "W1"),
        None,
        False,
        cpu("nats", "W1"),
    )
    sm1 = m("trimq-sync-master", "W1", "msgs_per_s")
    check("SYNC_MASTER W1 >= 0.5x ASYNC_MASTER W1", sm1, None, True, w1, 0.5)
    lag99 = (
        metric(all_runs["trimq-sync-master"], "W1", ("lag_ms", "p99"), "replication_lag")
        if "trimq-sync-master" in all_runs
        else None
    )
    check("SYNC_MASTER replication lag p99 <= 50 ms under W1", lag99, 50.0, False)
    acl1 = m("trimq-acl", "W1", "msgs_per_s")
    check("ACL W1 >= 0.85x W1 without ACL", acl1, None, True, w1, 0.85)
    met1 = m("trimq-metrics", "W1", "msgs_per_s")
    check("metrics W1 >= 0.97x W1 without metrics", met1, None, True, w1, 0.97)
    return out


def secured_notes(all_runs: Runs) -> list[str]:
    """One line per run of each secured config: what the harness checked before W1 (that it
    refuses what it should, `bench.peers.secure.verify`)."""
    notes: list[str] = []
    for config, runs in all_runs.items():
        for i, run in enumerate(runs):
            notes.extend(
                f"{config} run {i + 1} {key}: {'; '.join(run[key])}"
                for key in ("secured", "checked", "final_check")
                if run.get(key)
            )
    return notes


def failures(all_runs: Runs) -> list[str]:
    """Workload runs whose client counted failed sends or answers other than SEND_OK (those
    are left out of its msgs/s), or messages it never received (W4)."""
    notes = []
    for config, runs in all_runs.items():
        for i, run in enumerate(runs):
            for w in WORKLOADS:
                result = run.get(w, {}).get("result", {})
                errors = result.get("errors") or 0
                if not errors:
                    continue
                not_ok = result.get("not_ok") or {}
                detail = ", ".join(f"{k} {v:,}" for k, v in sorted(not_ok.items()))
                notes.append(
                    f"{config} run {i + 1} {w}: {errors:,} errors"
                    + (f" (messages answered {detail})" if detail else "")
                )
    return notes


def lag_notes(all_runs: Runs) -> list[str]:
    """One line per run of each lag-sampled config: its replication lag and poll interval."""
    notes = []
    for config, w in LAG_SAMPLED.items():
        for i, run in enumerate(all_runs.get(config, [])):
            lag = run.get(w, {}).get("replication_lag", {})
            notes.append(f"{config} run {i + 1} {w}: {lag_line(lag)}")
    return notes


# Cores' worth of CPU other processes may use during a workload before its figures are flagged.
DISTURBED_CORES = 0.15


def disturbed(all_runs: Runs) -> list[str]:
    """Workload runs during which processes outside the run used >= DISTURBED_CORES."""
    notes = []
    for config, runs in all_runs.items():
        for i, run in enumerate(runs):
            for w in WORKLOADS:
                cores = run.get(w, {}).get("others_cores")
                if cores is not None and cores >= DISTURBED_CORES:
                    notes.append(
                        f"{config} run {i + 1} {w}: disturbed (other processes used "
                        f"{cores:.2f} cores meanwhile)"
                    )
    return notes


def render(data: dict[str, Any]) -> str:
    runs: Runs = data["runs"]
    configs = [c for c in CONFIGS if c in runs]
    pairs = [p for p in PAIRS if p[0] in runs and p[1] in runs]
    head = ["metric", *configs, *(pair_label(a, b) for a, b in pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, w, path, _higher in METRICS:
        vals = {c: metric(runs[c], w, path) for c in configs}
        row = [label, *(_fmt(vals[c]) for c in configs)]
        row += [_ratio(vals[a], vals[b]) for a, b in pairs]
        lines.append("| " + " | ".join(row) + " |")
    if any(c in LAG_SAMPLED for c in configs):
        for label, w, path in LAG_METRICS:
            vals = {c: metric(runs[c], w, path, "replication_lag") for c in configs}
            row = [label, *(_fmt(vals[c]) for c in configs), *("-" for _ in pairs)]
            lines.append("| " + " | ".join(row) + " |")
    for w in WORKLOADS:
        for key, name in (("server_cpu_s", "server"), ("client_cpu_s", "client")):
            vals = {c: cpu_per_msg_us(runs[c], w, key) for c in configs}
            row = [f"{w} {name} CPU us/msg", *(_fmt(vals[c]) for c in configs)]
            row += [_ratio(vals[a], vals[b]) for a, b in pairs]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(cpu_reference_line(data.get("machine", {})))
    lag = [*lag_notes(runs), *secured_notes(runs)]
    if lag:
        lines.append("")
        lines.extend(f"- {note}" for note in lag)
    lines.append("")
    lines.append("| target | result | figures |")
    lines.append("|---|---|---|")
    for desc, ok, figures in targets(runs):
        mark = "not measured" if ok is None else ("met" if ok else "missed")
        lines.append(f"| {desc} | {mark} | {figures} |")
    notes = [*failures(runs), *disturbed(runs)]
    if notes:
        lines.append("")
        lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("result", type=Path)
    opts = ap.parse_args()
    data = json.loads(opts.result.read_text())
    # The machine and disk figures go to stderr: stdout is the Markdown alone.
    print(json.dumps({"machine": data["machine"], "disk": data["disk"]}, indent=1), file=sys.stderr)
    print(render(data))


if __name__ == "__main__":
    main()

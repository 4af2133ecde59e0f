"""Sweep nats-py's knobs for W1 and W2 against Debian's nats-server; `nats_client`'s defaults
are the best settings found.

    .venv/bin/python -m bench.peers.nats_sweep [--rounds 3] [--count 100000] [--out sweep.json]

One knob moves at a time from nats-py's defaults (and the combinations named). Every (round,
setting, workload) runs on a new `nats-server -js` with an empty store, settings interleaved
within each round; the table gives medians over rounds of msgs/s, ack p99 and server / client
CPU per message, with the load average before each round and the cores' worth of CPU other
processes used during each run (`_proc.host_busy_seconds`): runs below `QUIET` count as
undisturbed. W1 with a pending limit above 64 is another workload (more in flight than W1
allows any system): it is shown, never kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._proc import Server, free_port, host_busy_seconds, run_client

REPO = Path(__file__).resolve().parents[2]
QUIET = 0.15  # cores of other processes' CPU below which a run counts as undisturbed

# (label, nats_client options, workloads it applies to)
SETTINGS: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("nats-py defaults", [], ("W1", "W2")),
    ("pending_size 64 KiB", ["--pending-size", str(64 * 1024)], ("W1", "W2")),
    ("pending_size 256 KiB", ["--pending-size", str(256 * 1024)], ("W1", "W2")),
    ("pending_size 16 MiB", ["--pending-size", str(16 * 1024 * 1024)], ("W1", "W2")),
    ("flusher_queue_size 1", ["--flusher-queue-size", "1"], ("W1", "W2")),
    ("flusher_queue_size 16", ["--flusher-queue-size", "16"], ("W1", "W2")),
    ("flusher_queue_size 8192", ["--flusher-queue-size", "8192"], ("W1", "W2")),
    (
        "pending_size 64 KiB + flush_timeout 1 s",
        ["--pending-size", str(64 * 1024), "--flush-timeout", "1"],
        ("W1", "W2"),
    ),
    ("skip_subject_validation", ["--skip-subject-validation"], ("W1", "W2")),
    (
        "pending_size 64 KiB + flusher_queue_size 1 + skip_subject_validation",
        [
            "--pending-size",
            str(64 * 1024),
            "--flusher-queue-size",
            "1",
            "--skip-subject-validation",
        ],
        ("W1", "W2"),
    ),
    (
        "pending_size 64 KiB + skip_subject_validation",
        ["--pending-size", str(64 * 1024), "--skip-subject-validation"],
        ("W1", "W2"),
    ),
    ("publish_async_max_pending 4000", ["--max-pending", "4000"], ("W2",)),
    ("W1 window 256 (not W1)", ["--max-pending", "256"], ("W1",)),
    ("W1 window 4000 (not W1)", ["--max-pending", "4000"], ("W1",)),
]


def one(
    opts: list[str], workload: str, count: int, scratch: Path, env: dict[str, str], startup: float
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="nats-", dir=scratch))
    port = free_port()
    with open(root / "server.log", "wb") as log:
        srv = Server(
            "nats-server",
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(root / "js")],
            log,
            port,
        )
        srv.start()
        try:
            before, host_before = srv.cpu(), host_busy_seconds()
            args = [sys.executable, "-m", "bench.peers.nats_client", "--url",
                    f"nats://127.0.0.1:{port}", "--workload", workload, "--count", str(count),
                    "--limit", "300", *opts]  # fmt: skip
            cr = run_client(args, 360, REPO, env, root)
            server_cpu = srv.cpu() - before
            others = host_busy_seconds() - host_before - server_cpu - cr.cpu_s
        finally:
            srv.stop()
    r = cr.result
    n = r.get("messages") or 0
    return {
        "msgs_per_s": r.get("msgs_per_s", 0.0),
        "p99_ms": r.get("latency_ms", {}).get("p99", 0.0),
        "errors": r.get("errors", -1),
        "server_us": server_cpu / n * 1e6 if n else 0.0,
        "client_us": max(0.0, cr.cpu_s - startup) / n * 1e6 if n else 0.0,
        # cores' worth of CPU used by anything else while the client ran (0 on a quiet host)
        "others_cores": max(0.0, others) / max(cr.wall_s, 1e-9),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--only", default=None, help="comma-separated setting numbers (0 = defaults)")
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    workloads = opts.workloads.split(",")
    chosen = [int(i) for i in opts.only.split(",")] if opts.only else range(len(SETTINGS))
    settings = [SETTINGS[i] for i in chosen]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nats-sweep-") as tmp:
        probe = [sys.executable, "-c", "import bench.peers.nats_client"]
        startup = min(run_client(probe, 60, REPO, env, Path(tmp)).cpu_s for _ in range(3))
        for rnd in range(opts.rounds):
            loads.append(os.getloadavg()[0])
            print(f"round {rnd + 1}/{opts.rounds}, load average {loads[-1]:.2f}", flush=True)
            for label, knobs, applies in settings:
                for w in workloads:
                    if w not in applies:
                        continue
                    r = one(knobs, w, opts.count, Path(tmp), env, startup)
                    res.setdefault((label, w), []).append(r)
                    print(
                        f"  {label:42} {w}: {r['msgs_per_s']:>9,.0f} msg/s  p99 "
                        f"{r['p99_ms']:6.2f} ms  server {r['server_us']:5.1f} us/msg  "
                        f"client {r['client_us']:5.1f}  others {r['others_cores']:.2f} cores  "
                        f"errors {r['errors']}",
                        flush=True,
                    )
    starts = ", ".join(f"{x:.2f}" for x in loads)
    print(
        f"\nmedians of {opts.rounds} rounds, {opts.count:,} x 1 KiB; load average at each "
        f"round's start {starts}, at the end {os.getloadavg()[0]:.2f}; client CPU excludes "
        f"{startup * 1000:.0f} ms of interpreter start-up"
    )
    quiet_col = f"msgs/s, runs with others < {QUIET} cores (how many)"
    cols = ["setting", "workload", "msgs/s", "p99 ms", "server CPU us/msg", "client CPU us/msg",
            quiet_col, "msgs/s per round (others, cores)"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for (label, w), runs in res.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        quiet = [r["msgs_per_s"] for r in runs if r["others_cores"] < QUIET]
        q = f"{statistics.median(quiet):,.0f} ({len(quiet)})" if quiet else "-"
        rounds = " / ".join(f"{r['msgs_per_s']:,.0f} ({r['others_cores']:.2f})" for r in runs)
        print(f"| {label} | {w} | {med['msgs_per_s']:,.0f} | {med['p99_ms']:.2f} | "
              f"{med['server_us']:.1f} | {med['client_us']:.1f} | {q} | {rounds} |")  # fmt: skip
    if opts.out:
        opts.out.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "loadavg": loads,
                    "results": [
                        {"setting": label, "workload": w, "runs": runs}
                        for (label, w), runs in res.items()
                    ],
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()

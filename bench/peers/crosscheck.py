"""Each peer's harness figure against the peer's own tools, interleaved on one host.

    .venv/bin/python -m bench.peers.crosscheck [--rounds 3] [--count 100000] [--out check.json]

Per round, each on a new server with an empty data directory:
  - Redis (appendfsync everysec): the harness's W1 (2 connections x pipelines of 32) and W2
    (4 x 32) against `redis-benchmark` with the same connections and pipeline depth (`-c 2
    -P 32`, `-c 4 -P 32`), and W5 against `-c 1 -P 1`. redis-benchmark 7.0 does not expand
    `__data__` in a custom command, so its XADD carries one literal 1 KiB field value;
  - NATS JetStream: the harness's W1 against `crosscheck_nats`, a plain nats-py script.
Prints msgs/s with the load average before each measurement and the cores' worth of CPU
processes outside the check used during it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._proc import Server, free_port, host_busy_seconds, run_client

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def _redis(root: Path, log: Any) -> Server:
    port = free_port()
    (root / "redis").mkdir()
    return Server(
        "redis-server",
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root / "redis"),
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"],
        log,
        port,
    )  # fmt: skip


def _nats(root: Path, log: Any) -> Server:
    port = free_port()
    return Server(
        "nats-server",
        ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(root / "js")],
        log,
        port,
    )


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def on_new_server(
    make: Callable[[Path, Any], Server], scratch: Path, measure: Callable[[int, Path], float]
) -> tuple[float, float, float]:
    """(load average before, msgs/s, cores other processes used meanwhile) of
    `measure(port, root)` against a new server."""
    root = Path(tempfile.mkdtemp(dir=scratch))
    with open(root / "server.log", "wb") as log:
        srv = make(root, log)
        load = os.getloadavg()[0]
        srv.start()
        try:
            t0, host0 = time.monotonic(), host_busy_seconds()
            srv0, kids0 = srv.cpu(), _children_cpu()
            rate = measure(srv.port, root)
            ours = srv.cpu() - srv0 + _children_cpu() - kids0
            others = (host_busy_seconds() - host0 - ours) / (time.monotonic() - t0)
            return load, rate, max(0.0, others)
        finally:
            srv.stop()


def redis_benchmark(port: int, count: int, conns: int, depth: int) -> float:
    value = os.urandom(512).hex()  # 1,024 bytes
    args = ["redis-benchmark", "-p", str(port), "-n", str(count), "-c", str(conns),
            "-P", str(depth), "--csv", "XADD", "bench", "*", "b", value]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    return float(rows[-1]["rps"])


def harness(module: str, url_args: list[str], workload: str, count: int, root: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [PY, "-m", module, *url_args, "--workload", workload, "--count", str(count)]
    cr = run_client(args, 600, REPO, env, root)
    if cr.returncode != 0 or cr.result.get("errors"):
        raise RuntimeError(f"{module} {workload}: exit {cr.returncode} {cr.stderr}")
    return float(cr.result["msgs_per_s"])


def plain_nats(port: int, count: int, root: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [PY, "-m", "bench.peers.crosscheck_nats", "--url", f"nats://127.0.0.1:{port}",
            "--count", str(count)]  # fmt: skip
    cr = run_client(args, 600, REPO, env, root)
    if cr.returncode != 0 or cr.result.get("stream_messages") != count + 1:
        raise RuntimeError(f"crosscheck_nats: exit {cr.returncode} {cr.result} {cr.stderr}")
    return float(cr.result["msgs_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--w5-count", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    n, n5 = opts.count, opts.w5_count

    def rh(w: str, c: int) -> Callable[[int, Path], float]:
        return lambda port, root: harness(
            "bench.peers.redis_client", ["--port", str(port)], w, c, root
        )

    def rb(c: int, conns: int, depth: int) -> Callable[[int, Path], float]:
        return lambda port, root: redis_benchmark(port, c, conns, depth)

    def nh(port: int, root: Path) -> float:
        return harness(
            "bench.peers.nats_client", ["--url", f"nats://127.0.0.1:{port}"], "W1", n, root
        )

    checks: list[tuple[str, Callable[[Path, Any], Server], Callable[[int, Path], float]]] = [
        ("redis W1 harness (2 x 32)", _redis, rh("W1", n)),
        ("redis W1 redis-benchmark -c 2 -P 32", _redis, rb(n, 2, 32)),
        ("redis W2 harness (4 x 32)", _redis, rh("W2", n)),
        ("redis W2 redis-benchmark -c 4 -P 32", _redis, rb(n, 4, 32)),
        ("redis W5 harness (1 x 1)", _redis, rh("W5", n5)),
        ("redis W5 redis-benchmark -c 1 -P 1", _redis, rb(n5, 1, 1)),
        ("nats W1 harness (64 pending)", _nats, nh),
        ("nats W1 plain nats-py script (64 pending)", _nats, lambda p, r: plain_nats(p, n, r)),
    ]
    res: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="peers-check-") as tmp:
        for rnd in range(opts.rounds):
            print(f"round {rnd + 1}/{opts.rounds}", flush=True)
            for label, make, measure in checks:
                load, rate, others = on_new_server(make, Path(tmp), measure)
                res.setdefault(label, []).append((load, rate, others))
                print(f"  {label:44} {rate:>10,.0f} msgs/s  (load {load:.2f}, others "
                      f"{others:.2f} cores)", flush=True)  # fmt: skip
    print(f"\n{time.strftime('%Y-%m-%d %H:%M %Z')}, load average at the end {os.getloadavg()}")
    print("| check | msgs/s (median) | per round | load average before each | others, cores |")
    print("|---|---|---|---|---|")
    for label, vals in res.items():
        rates = " / ".join(f"{r:,.0f}" for _, r, _ in vals)
        loads = " / ".join(f"{x:.2f}" for x, _, _ in vals)
        cores = " / ".join(f"{o:.2f}" for _, _, o in vals)
        med = statistics.median(r for _, r, _ in vals)
        print(f"| {label} | {med:,.0f} | {rates} | {loads} | {cores} |")
    if opts.out:
        opts.out.write_text(json.dumps({"date": time.strftime("%c %Z"), "results": res}, indent=1))


if __name__ == "__main__":
    main()

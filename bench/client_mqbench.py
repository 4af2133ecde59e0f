"""Client throughput and latency: `mqbench` against a real `mqnamesrv` + `mqbroker`.

Starts a NameServer and one broker (async flush) on free loopback ports in a temporary
directory, creates an 8-queue topic, then runs:
  1. mqbench producer, 1 KiB bodies, 8 workers, one message per send
  2. mqbench producer, 1 KiB bodies, 4 workers, batches of 32
  3. mqbench consumer from the first offset (drains the backlog of 1 and 2)
and prints each summary as one JSON line (msgs/s, MB/s, latency avg/p50/p99/max).

    .venv/bin/python bench/client_mqbench.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} did not open")


def _run(args: list[str]) -> dict[str, object]:
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=600)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trimq-bench-") as tmp:
        ns_port, br_port = _free_port(), _free_port()
        ns_addr = f"127.0.0.1:{ns_port}"
        logs = open(Path(tmp) / "servers.log", "wb")  # noqa: SIM115 (lives as long as the servers)
        ns = subprocess.Popen(
            [str(BIN / "mqnamesrv"), "--listen", ns_addr, "--log-level", "warning"],
            stdout=logs, stderr=subprocess.STDOUT,
        )  # fmt: skip
        br = subprocess.Popen(
            [str(BIN / "mqbroker"), "-n", ns_addr, "--listen", f"127.0.0.1:{br_port}",
             "--store-dir", str(Path(tmp) / "store"), "--log-level", "warning"],
            stdout=logs, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            _wait_port(ns_port)
            _wait_port(br_port)
            admin = [str(BIN / "mqadmin")]
            for _ in range(100):
                done = subprocess.run(
                    [*admin, "updateTopic", "-n", ns_addr, "-c", "DefaultCluster", "-t",
                     "BenchTopic", "-r", "8", "-w", "8"],
                    capture_output=True, check=False,
                )  # fmt: skip
                if done.returncode == 0:
                    break
                time.sleep(0.2)
            time.sleep(1)
            bench = [str(BIN / "mqbench")]
            secs = str(opts.seconds)
            runs = [
                [*bench, "producer", "-n", ns_addr, "-t", "BenchTopic", "-w", "8", "-s", "1024",
                 "--duration", secs, "--json"],
                [*bench, "producer", "-n", ns_addr, "-t", "BenchTopic", "-w", "4", "-s", "1024",
                 "-b", "32", "--duration", secs, "--json"],
                [*bench, "consumer", "-n", ns_addr, "-t", "BenchTopic", "-g", "bench",
                 "--from", "first", "--duration", str(opts.seconds * 3), "--json"],
            ]  # fmt: skip
            for args in runs:
                print(json.dumps(_run(args), sort_keys=True), flush=True)
        finally:
            for p in (br, ns):
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
            logs.close()


if __name__ == "__main__":
    main()

"""What this machine's CPU does for Python right now: a reference taken with each bench run.

The host of this bench is shared, and its speed moves between phases (the same code and the
same peers have measured 3-4x apart on different days; bench/RESULTS.md). Absolute targets
(msgs/s, ms) only mean something next to how fast the machine was when they were taken, so
each run records:

- `interp_ns`: nanoseconds per iteration of a fixed pure-Python loop (attribute, dict and
  arithmetic work, the kind a broker's hot path is made of), best of 5;
- `trio_checkpoint_us`: one `trio.lowlevel.checkpoint()` (a pass through trio's scheduler,
  with its epoll call), best of 5;
- `loopback_rtt_us`: a 1 KiB round trip over a loopback TCP connection between two threads'
  blocking sockets (two writes, two reads, two wake-ups), median of 2,000;
- the CPU model.

Each probe is bounded (well under a second in all) and runs before any system is started.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import trio


class _Probe:
    __slots__ = ("count", "table")

    def __init__(self) -> None:
        self.count = 0
        self.table: dict[int, int] = {}


def _interp_loop(n: int) -> float:
    p = _Probe()
    table = p.table
    t0 = time.perf_counter()
    for i in range(n):
        p.count += i & 7
        table[i & 255] = i
    return (time.perf_counter() - t0) / n * 1e9


def interp_ns(n: int = 200_000, repeats: int = 5) -> float:
    """Best of `repeats` timings of a fixed pure-Python loop: ns per iteration."""
    return min(_interp_loop(n) for _ in range(repeats))


def trio_checkpoint_us(n: int = 20_000, repeats: int = 5) -> float:
    """Best of `repeats` timings of `n` trio checkpoints in one task: us per checkpoint."""

    async def main() -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                await trio.lowlevel.checkpoint()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best

    return trio.run(main)


def loopback_rtt_us(n: int = 2_000, size: int = 1024) -> float:
    """Median round trip of `size` bytes over 127.0.0.1 TCP to an echoing thread: us."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def echo() -> None:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while data := conn.recv(65536):
                    conn.sendall(data)

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        payload = b"x" * size
        times: list[float] = []
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(n):
                t0 = time.perf_counter()
                client.sendall(payload)
                got = 0
                while got < size:
                    chunk = client.recv(65536)
                    if not chunk:
                        raise RuntimeError("the echo thread closed the connection")
                    got += len(chunk)
                times.append(time.perf_counter() - t0)
        thread.join(timeout=10)
    return statistics.median(times) * 1e6


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def reference() -> dict[str, Any]:
    """The machine's CPU reference for one bench run (see the module docstring)."""
    return {
        "cpu_model": cpu_model(),
        "interp_ns": round(interp_ns(), 1),
        "trio_checkpoint_us": round(trio_checkpoint_us(), 2),
        "loopback_rtt_us": round(loopback_rtt_us(), 1),
    }

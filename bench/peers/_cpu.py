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
- `idle_wake_us`: CPU time (user + system) of a thread that sleeps in an event loop until a
  100-byte message arrives, every 0.5 ms, per wake-up, with a bare `select.epoll` loop, with
  asyncio and with trio. An idle server pays it per request: at W4's 2,000 msgs/s trimq's
  broker wakes about twice per message (the send, then the consumer's next pull);
- the CPU model.

Each probe is bounded (about 2 s in all) and runs before any system is started.
"""

from __future__ import annotations

import asyncio
import os
import resource
import select
import socket
import statistics
import threading
import time
from collections.abc import Callable
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


def _drain(fd: int) -> int:
    """Bytes read from the non-blocking `fd` in one read (0 if there was nothing)."""
    try:
        return len(os.read(fd, 65536))
    except BlockingIOError:
        return 0


def _wait_epoll(fd: int, total: int) -> int:
    ep = select.epoll()
    try:
        ep.register(fd, select.EPOLLIN)
        got = reads = 0
        deadline = time.monotonic() + 30
        while got < total and time.monotonic() < deadline:
            ep.poll(1)
            n = _drain(fd)
            got += n
            reads += n > 0
        return reads
    finally:
        ep.close()


def _wait_asyncio(fd: int, total: int) -> int:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        count = [0, 0]

        def readable() -> None:
            n = _drain(fd)
            count[0] += n
            count[1] += n > 0
            if count[0] >= total and not done.done():
                done.set_result(count[1])

        loop.add_reader(fd, readable)
        try:
            return await asyncio.wait_for(done, 30)
        finally:
            loop.remove_reader(fd)

    return asyncio.run(main())


def _wait_trio(fd: int, total: int) -> int:
    async def main() -> int:
        got = reads = 0
        with trio.fail_after(30):
            while got < total:
                await trio.lowlevel.wait_readable(fd)
                n = _drain(fd)
                got += n
                reads += n > 0
        return reads

    return trio.run(main)


def _wake_cpu_us(wait: Callable[[int, int], int], n: int, gap: float) -> float:
    """CPU us of this thread per wake-up of `wait`, fed `n` messages `gap` seconds apart."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        size = 100

        def feed() -> None:
            payload = b"x" * size
            start = time.perf_counter()
            for i in range(n):
                time.sleep(max(0.0, start + i * gap - time.perf_counter()))
                theirs.sendall(payload)

        thread = threading.Thread(target=feed, daemon=True)
        before = resource.getrusage(resource.RUSAGE_THREAD)
        thread.start()
        wakes = wait(ours.fileno(), n * size)
        after = resource.getrusage(resource.RUSAGE_THREAD)
        thread.join(timeout=10)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent / max(wakes, 1) * 1e6


def idle_wake_us(n: int = 1_000, gap: float = 0.0005) -> dict[str, float]:
    """CPU us per idle wake-up with a bare epoll loop, asyncio and trio (module docstring)."""
    return {
        name: round(_wake_cpu_us(wait, n, gap), 1)
        for name, wait in (("epoll", _wait_epoll), ("asyncio", _wait_asyncio), ("trio", _wait_trio))
    }


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
        "idle_wake_us": idle_wake_us(),
    }

"""Small test helpers: bounded polling instead of bare sleeps."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from remoting import Connection, Processor, RemotingCommand, SerializeType, run_inline


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    total: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll `predicate` every `interval` seconds until it is true; fail after `total` seconds."""
    deadline = trio.current_time() + total
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if trio.current_time() >= deadline:
            raise AssertionError(f"timed out after {total}s waiting for {what}")
        await trio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], bool],
    *,
    total: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Blocking variant of `wait_until` for code outside trio."""
    deadline = time.monotonic() + total
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {total}s waiting for {what}")
        time.sleep(interval)


def _port_range() -> range:
    """This process's ports for `free_port`: below the kernel's ephemeral range (which its
    own port-0 binds and outgoing connections draw from), split between pytest-xdist's
    workers. A port a test frees while it restarts a server is then never taken meanwhile
    by another worker's server or by any client socket."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    first, last = 10000, max(10000 + 1000, min(low, 32768))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = (last - first) // count
    start = first + (index % count) * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PORTS = _port_range()
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from this worker's own range and
    not one this process handed out lately (so the ports of a test are distinct)."""
    if len(_handed_out) > len(_PORTS) // 2:
        _handed_out.clear()  # the oldest are long free again
    for _ in range(len(_PORTS)):
        port = random.choice(_PORTS[:-1])
        # port + 1 too: a broker's HA port defaults to its listen port + 1.
        if port in _handed_out or port + 1 in _handed_out:
            continue
        if not (_bindable(port) and _bindable(port + 1)):
            continue
        _handed_out.update((port, port + 1))
        return port
    raise RuntimeError(f"no free port left in {_PORTS}")


def json_request(
    code: int, fields: dict[str, str] | None = None, body: bytes | None = None
) -> RemotingCommand:
    """A request with a JSON header, as an Apache client sends it."""
    return RemotingCommand.request(code, fields, body, serialize_type=SerializeType.JSON)


class StagingGuard(trio.abc.Instrument):
    """Checks the store's staging rule from the outside: between `MessageStore.begin_staging`
    and `end_staging` no task may yield to the event loop (the run's records are in memory
    only, and no answer, flush plan or other task may see them). `watch` wraps the two
    methods; every task step that ends while a run is open is recorded in `violations`."""

    def __init__(self) -> None:
        self.open_runs = 0
        self.runs = 0
        self.violations: list[str] = []

    def watch(self, monkeypatch: Any) -> None:
        from store.message_store import MessageStore

        begin, end = MessageStore.begin_staging, MessageStore.end_staging

        def begin_staging(store: MessageStore) -> None:
            self.open_runs += 1
            self.runs += 1
            begin(store)

        def end_staging(store: MessageStore) -> None:
            self.open_runs -= 1
            end(store)

        monkeypatch.setattr(MessageStore, "begin_staging", begin_staging)
        monkeypatch.setattr(MessageStore, "end_staging", end_staging)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.open_runs:
            self.violations.append(f"task {task.name} yielded with a staging run open")


def call_inline(
    processor: Processor, conn: Connection, cmd: RemotingCommand, *, run: Any = None
) -> RemotingCommand | None:
    """`remoting.run_inline` inside one run of `run` (a `broker.commit.CommitBatcher`, or
    anything with `begin` and `end`) when given; a suspension fails the test."""
    if run is not None:
        run.begin()
    try:
        return run_inline(processor, conn, cmd)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None
    finally:
        if run is not None:
            run.end()

"""Fixtures that start real `mqnamesrv` / `mqbroker` processes and always stop them.

- `namesrv`: one NameServer (default settings) for the test.
- `start_namesrv(**kw) -> NamesrvProc`: start another; keywords as `NamesrvProc`.
- `start_broker(namesrv_addr, **kw) -> BrokerProc`: start a broker; keywords as `BrokerProc`.

Everything a factory started is stopped in the fixture's finalizer (SIGTERM, then
SIGKILL after a bounded wait), whatever the test's outcome; processes that failed
to start are reaped too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.procs import BrokerProc, ManagedProcess, NamesrvProc, stop_all


@pytest.fixture
def start_namesrv(tmp_path: Path) -> Iterator[Callable[..., NamesrvProc]]:
    started: list[ManagedProcess] = []

    def _start(**kwargs: Any) -> NamesrvProc:
        n = sum(isinstance(p, NamesrvProc) for p in started)
        kwargs.setdefault("name", f"namesrv{n}" if n else "namesrv")
        proc = NamesrvProc(tmp_path / kwargs["name"], **kwargs)
        started.append(proc)
        proc.start()
        return proc

    try:
        yield _start
    finally:
        stop_all(started)


@pytest.fixture
def namesrv(start_namesrv: Callable[..., NamesrvProc]) -> NamesrvProc:
    return start_namesrv()


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProc]]:
    started: list[ManagedProcess] = []

    def _start(namesrv_addr: str, **kwargs: Any) -> BrokerProc:
        name = kwargs.setdefault("name", "broker-a")
        suffix = sum(isinstance(p, BrokerProc) and p.broker_name == name for p in started)
        workdir = tmp_path / (f"{name}-{suffix}" if suffix else name)
        proc = BrokerProc(workdir, namesrv_addr, **kwargs)
        started.append(proc)
        proc.start()
        return proc

    try:
        yield _start
    finally:
        stop_all(started)

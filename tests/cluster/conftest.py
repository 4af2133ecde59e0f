"""The compose cluster of the `cluster` tests: built, started once per session, always removed.

`make image` builds trimq:latest first (so `make test` on a fresh machine builds it), then the
project `trimq-test-<pid>` of deploy/docker-compose.yml (three SYNC_MASTER masters, each with a
slave) starts with free loopback ports, short timings (NameServer expiry 6 s, scan 1 s, broker
registration every 2 s, slave metadata copy every 1 s, HA heartbeat 1 s and housekeeping 5 s)
and SYNC_FLUSH. The finalizer saves the containers' logs and runs `down -v` whatever happened.

Set TRIMQ_SKIP_CLUSTER=1 to skip these tests on a machine without a Docker engine.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.support import PORT_COUNT, REPO, Cluster, Row
from tests.helpers import free_port

ROWS: list[Row] = []


def _build_image() -> None:
    lock_path = REPO / "deploy" / ".image.lock"
    with lock_path.open("w") as lock:
        # Two test runs at once must not rebuild deploy/wheels under each other.
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            ["make", "image"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"`make image` failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("TRIMQ_SKIP_CLUSTER") == "1":
        pytest.skip("TRIMQ_SKIP_CLUSTER=1: docker compose cluster tests skipped on request")
    started = time.monotonic()
    _build_image()
    built = time.monotonic()
    ports: list[int] = []
    while len(ports) < PORT_COUNT:
        port = free_port()
        if port not in ports:
            ports.append(port)
    c = Cluster(f"trimq-test-{os.getpid()}", ports)
    # Outside pytest's rotating tmp dirs, so the logs of a failed run stay readable.
    logdir = Path(tempfile.gettempdir()) / "trimq-cluster-logs"
    logdir.mkdir(exist_ok=True)
    c.logdir = logdir
    try:
        c.compose("up", "-d")
        c.wait_healthy(total=120)
        print(
            f"\ncluster {c.project}: image {built - started:.1f}s, "
            f"up and healthy {time.monotonic() - built:.1f}s; NameServers {c.namesrv_addr}"
        )
        yield c
    finally:
        try:
            (logdir / f"{c.project}.log").write_text(c.compose("logs", "--no-color", timeout=120))
            print(f"\ncompose logs: {logdir / c.project}.log")
        except Exception as exc:
            print(f"\ncould not save compose logs: {exc}")
        c.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300)


@pytest.fixture
def rows() -> list[Row]:
    return ROWS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ROWS:
        return
    terminalreporter.write_sep("=", "cluster failover scenarios")
    terminalreporter.write_line(Row.HEADER)
    for row in ROWS:
        terminalreporter.write_line(row.line())

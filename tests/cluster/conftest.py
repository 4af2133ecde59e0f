"""The compose projects of the `cluster` tests: built, started once, always removed.

`make image` builds trimq:latest first (so `make test` on a fresh machine builds it), once per
session. `cluster`: the project `trimq-test-<pid>` of deploy/docker-compose.yml (three
SYNC_MASTER masters, each with a slave) with free loopback ports, short timings (NameServer
expiry 6 s, scan 1 s, broker registration every 2 s, slave metadata copy every 1 s, HA
heartbeat 1 s and housekeeping 5 s) and SYNC_FLUSH, for the whole session.
`controller_cluster`: the project `trimq-ctl-test-<pid>` of deploy/docker-compose.controller.yml
(etcd, controllers, broker-a's two controller-mode replicas, broker-b; timings in
tests/cluster/controller_support.py) for one test module. `secure_cluster`: the project
`trimq-sec-test-<pid>`, `cluster`'s settings with deploy/docker-compose.secure.yml over them
(ACL and TLS enforcing; certificates, accounts and secrets made for the run by
deploy/make_secure.py in a temporary directory, removed after), for one test module. The
finalizers save the containers' logs and run `down -v` whatever happened. The secured and the
controller scenarios' modules sort before the others (test_acl_tls_failover.py,
test_controller_failover.py), so no two projects run at once: `cluster` lives until the session
ends.

Set TRIMQ_SKIP_CLUSTER=1 to skip these tests on a machine without a Docker engine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.controller_support import PORT_COUNT as CONTROLLER_PORT_COUNT
from tests.cluster.controller_support import ControllerCluster
from tests.cluster.support import PORT_COUNT, REPO, Cluster, ComposeProject, Row, SecureCluster
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
def image() -> float:
    """`make image` once per session; the seconds it took."""
    if os.environ.get("TRIMQ_SKIP_CLUSTER") == "1":
        pytest.skip("TRIMQ_SKIP_CLUSTER=1: docker compose cluster tests skipped on request")
    started = time.monotonic()
    _build_image()
    return time.monotonic() - started


def _free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _log_dir() -> Path:
    # Outside pytest's rotating tmp dirs, so the logs of a failed run stay readable.
    logdir = Path(tempfile.gettempdir()) / "trimq-cluster-logs"
    logdir.mkdir(exist_ok=True)
    return logdir


def _down(c: ComposeProject) -> None:
    try:
        print(f"\ncompose logs: {c.save_all_logs()}")
    except Exception as exc:
        print(f"\ncould not save compose logs: {exc}")
    c.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300)


@pytest.fixture(scope="session")
def cluster(image: float) -> Iterator[Cluster]:
    started = time.monotonic()
    c = Cluster(f"trimq-test-{os.getpid()}", _free_ports(PORT_COUNT))
    c.logdir = _log_dir()
    try:
        c.compose("up", "-d")
        c.wait_healthy(total=120)
        print(
            f"\ncluster {c.project}: image {image:.1f}s, "
            f"up and healthy {time.monotonic() - started:.1f}s; NameServers {c.namesrv_addr}"
        )
        yield c
    finally:
        _down(c)


@pytest.fixture(scope="module")
def secure_cluster(image: float, request: pytest.FixtureRequest) -> Iterator[SecureCluster]:
    """The secured project for the requesting module, whose `SECURED_NAMES` lists the scenario
    names the application account gets a topic and a group for."""
    started = time.monotonic()
    names = list(getattr(request.module, "SECURED_NAMES", ()))
    run_id = uuid.uuid4().hex[:8]
    secure_dir = Path(tempfile.mkdtemp(prefix="trimq-secure-"))
    try:
        SecureCluster.make_material(secure_dir, run_id, names)
        c = SecureCluster(
            f"trimq-sec-test-{os.getpid()}", _free_ports(PORT_COUNT), secure_dir, run_id
        )
        c.logdir = _log_dir()
        try:
            c.compose("up", "-d")
            c.wait_healthy(total=120)
            print(
                f"\nsecured cluster {c.project}: image {image:.1f}s, up and healthy "
                f"{time.monotonic() - started:.1f}s; NameServers {c.namesrv_addr}"
            )
            yield c
        finally:
            _down(c)
    finally:
        shutil.rmtree(secure_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def controller_cluster(image: float) -> Iterator[ControllerCluster]:
    started = time.monotonic()
    c = ControllerCluster(f"trimq-ctl-test-{os.getpid()}", _free_ports(CONTROLLER_PORT_COUNT))
    c.logdir = _log_dir()
    try:
        # `up` returns once the controllers are healthy (the replicas depend on a leader).
        c.compose("up", "-d", timeout=300)
        c.wait_healthy(total=120)
        print(
            f"\ncontroller cluster {c.project}: image {image:.1f}s, up and healthy "
            f"{time.monotonic() - started:.1f}s; NameServer {c.namesrv_addr}, controllers "
            f"{c.controller_addrs}"
        )
        yield c
    finally:
        _down(c)


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

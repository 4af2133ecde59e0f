"""Fixtures of the compatibility suite: real trimq processes and the C++ client in a subprocess.

- `cpp_available` (session): skips the whole suite, with the reason, where the `rocketmq`
  wheel cannot load (not Linux x86-64, not installed: `pip install -e '.[compat]'`, or
  librocketmq fails to load).
- `cluster` (module): one `mqnamesrv` and one `mqbroker` on free loopback ports with a tmp
  store, always stopped. The broker's delay levels are Apache's defaults except level 3,
  shortened to 1 s: a consumer's first retry uses level 3 (10 s by default).
- `cpp` (function): runs `tests/compat/cpp_client.py SCENARIO` with HOME set to the test's
  tmp dir and a bounded wait. When the test fails, the C++ client's own logs
  (`$HOME/logs/rocketmq-cpp/*`), the scenario's stderr and the broker's log tail are added
  to the report.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.procs import BrokerProc, ManagedProcess, NamesrvProc, stop_all

DRIVER = Path(__file__).with_name("cpp_client.py")

# Apache's 18 levels, level 3 shortened from 10 s to 1 s (level 1 stays 1 s).
DELAY_LEVELS = "1s 5s 1s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

_LOG_TAIL_LINES = 150
_logs_key = pytest.StashKey[list[tuple[str, Path]]]()
_texts_key = pytest.StashKey[list[tuple[str, str]]]()


class CppClientError(AssertionError):
    """The driver script failed, timed out or printed no result."""


@dataclass
class Cluster:
    namesrv: NamesrvProc
    broker: BrokerProc

    @property
    def addr(self) -> str:
        return self.namesrv.addr


@dataclass
class CppClient:
    """Runs scenarios of cpp_client.py; each run is a fresh process with HOME=`home`."""

    home: Path
    runs: list[tuple[str, str]] = field(default_factory=list)

    def run_sync(self, scenario: str, spec: dict[str, Any], *, time_limit: float) -> dict[str, Any]:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
        env["HOME"] = str(self.home)
        try:
            proc = subprocess.run(
                [sys.executable, str(DRIVER), scenario],
                input=json.dumps(spec).encode(),
                capture_output=True,
                env=env,
                timeout=time_limit,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            self.runs.append((scenario, _text(exc.stderr)))
            raise CppClientError(
                f"cpp_client.py {scenario} did not finish within {time_limit}s; "
                f"stderr:\n{_text(exc.stderr)[-4000:]}"
            ) from None
        stderr = _text(proc.stderr)
        self.runs.append((scenario, stderr))
        lines = _text(proc.stdout).strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise CppClientError(
                f"cpp_client.py {scenario} exited with {proc.returncode}; stderr:\n{stderr[-4000:]}"
            )
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    async def run(
        self, scenario: str, spec: dict[str, Any], *, time_limit: float
    ) -> dict[str, Any]:
        """`run_sync` in a worker thread (the subprocess is killed after `time_limit` s)."""
        return await trio.to_thread.run_sync(
            lambda: self.run_sync(scenario, spec, time_limit=time_limit)
        )


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")


def _load_failure() -> str | None:
    """Why the C++ client cannot run here, or None."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (
            f"the rocketmq 0.4.4 wheel bundles librocketmq for Linux x86-64 only "
            f"(this is {sys.platform} {platform.machine()})"
        )
    try:
        proc = subprocess.run(
            [sys.executable, str(DRIVER), "probe"],
            input=b"{}",
            capture_output=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "importing the rocketmq binding did not finish within 60 s"
    if proc.returncode != 0:
        err = _text(proc.stderr).strip().splitlines()
        return (
            "the rocketmq binding does not load (install the compat extra: "
            f"pip install -e '.[compat]'): {err[-1] if err else proc.returncode}"
        )
    return None


@pytest.fixture(scope="session")
def cpp_available() -> None:
    reason = _load_failure()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster(cpp_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("compat-cluster")
    started: list[ManagedProcess] = []
    try:
        namesrv = NamesrvProc(base / "namesrv")
        started.append(namesrv)
        namesrv.start()
        broker = BrokerProc(
            base / "broker-a",
            namesrv.addr,
            env={"TRIMQ_MESSAGE_DELAY_LEVEL": DELAY_LEVELS},
        )
        started.append(broker)
        broker.start()
        yield Cluster(namesrv, broker)
    finally:
        stop_all(started)


@pytest.fixture
def cpp(request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path) -> CppClient:
    client = CppClient(tmp_path / "home")
    request.node.stash[_logs_key] = [
        ("broker", cluster.broker.log_path),
        ("rocketmq-cpp", client.home / "logs" / "rocketmq-cpp"),
    ]
    request.node.stash[_texts_key] = client.runs
    return client


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when in ("setup", "call") and report.failed:
        _add_logs(item, report)
    return report


def _add_logs(item: pytest.Item, report: pytest.TestReport) -> None:
    for scenario, stderr in item.stash.get(_texts_key, []):
        if stderr.strip():
            report.sections.append((f"cpp_client.py {scenario} stderr", stderr[-8000:]))
    seen: set[Path] = set()
    for label, path in item.stash.get(_logs_key, []):
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for f in files:
            if f in seen or not f.is_file():
                continue
            seen.add(f)
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
            report.sections.append(
                (
                    f"{label} log {f.name} (last {_LOG_TAIL_LINES} lines)",
                    "\n".join(lines[-_LOG_TAIL_LINES:]),
                ),
            )

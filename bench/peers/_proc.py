"""Processes for the peers harness: servers started and stopped by PID, clients timed, CPU read.

CPU seconds come from /proc/<pid>/stat (utime + stime, all threads) for servers, read before
and after each workload, and from `os.wait4`'s rusage for client processes (the whole process,
interpreter start included; `run.py` subtracts the start-up cost measured once per client).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    """Until 127.0.0.1:`port` accepts a connection; RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open within {timeout} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads), from /proc/<pid>/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _TICKS


def host_busy_seconds() -> float:
    """User and system CPU seconds of the whole host since boot (/proc/stat; interrupts and
    steal left out): less the measured processes' own, what other processes and kernel
    threads used in the meantime."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:4]
    return sum(int(f) for f in fields) / _TICKS


@dataclass
class Server:
    """One server process of a system under test."""

    name: str
    args: list[str]
    log: IO[bytes]
    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            wait_port(self.port)
        except RuntimeError:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}") from None
            raise

    def cpu(self) -> float:
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 15 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)


@dataclass
class System:
    """The servers of one system (trimq: NameServer + broker; a peer: one server)."""

    name: str
    servers: list[Server] = field(default_factory=list)
    # Variables its clients need on top of the harness's environment (credentials, TLS).
    client_env: dict[str, str] = field(default_factory=dict)
    # What the harness verified of its security once it started (bench.peers.secure).
    checks: list[str] = field(default_factory=list)
    # Checked after the last workload with the run's results (trimq-metrics: the counts the
    # broker exported); its lines go to the results, a failure raises.
    final_check: Callable[[dict[str, Any]], list[str]] | None = None
    # Called first by `stop` (a scraper thread).
    stop_hooks: list[Callable[[], None]] = field(default_factory=list)

    def cpu(self) -> float:
        return sum(s.cpu() for s in self.servers)

    def stop(self) -> None:
        for hook in self.stop_hooks:
            hook()
        for s in reversed(self.servers):
            s.stop()


def _wait_usage(
    proc: subprocess.Popen[Any], deadline: float
) -> tuple[int, resource.struct_rusage | None]:
    """Reap `proc` (SIGKILL by PID at `deadline`): its status and resource usage."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage
        if time.monotonic() > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            _pid, status, usage = os.wait4(proc.pid, 0)
            return status, usage
        time.sleep(0.02)


@dataclass
class ClientRun:
    """What a client process printed (its last JSON line) and the CPU it used."""

    result: dict[str, Any]
    cpu_s: float
    wall_s: float
    returncode: int
    stderr: str


def run_client(
    args: Sequence[str], timeout: float, cwd: Path, env: dict[str, str], scratch: Path
) -> ClientRun:
    """Run a client to completion (killed by PID after `timeout` s); parse its last JSON line.

    Its output goes to files in `scratch` (never the repo).
    """
    out_path = scratch / "client.out"
    err_path = scratch / "client.err"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(list(args), stdout=out, stderr=err, cwd=cwd, env=env)
        status, usage = _wait_usage(proc, t0 + timeout)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return _client_run(proc.returncode, usage, time.monotonic() - t0, out_path, err_path)


def _client_run(
    returncode: int,
    usage: resource.struct_rusage | None,
    wall: float,
    out_path: Path,
    err_path: Path,
) -> ClientRun:
    text = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")[-2000:]
    result: dict[str, Any] = {}
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    cpu = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
    return ClientRun(result, cpu, wall, returncode, stderr)


class Sidecar:
    """A helper process that runs alongside a client (a sampler): started, waited for until it
    touches its ready file, told to finish by closing its standard input, then reaped (killed
    by PID if it does not end in time) with its last JSON line and CPU, as `run_client`.

    Use as a context manager: leaving it always reaps the process.
    """

    def __init__(
        self, args: Sequence[str], cwd: Path, env: dict[str, str], scratch: Path, name: str
    ) -> None:
        self.args = list(args)
        self.cwd, self.env = cwd, env
        self.ready = scratch / f"{name}.ready"
        self.out_path = scratch / f"{name}.out"
        self.err_path = scratch / f"{name}.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.run: ClientRun | None = None
        self._t0 = 0.0

    def __enter__(self) -> Sidecar:
        self.ready.unlink(missing_ok=True)
        self._t0 = time.monotonic()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [*self.args, "--ready", str(self.ready)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=self.cwd, env=self.env,
            )  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the process says it is ready; RuntimeError if it ends or times out first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.err_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.args[:4]} not ready: exit {self.proc.poll()}\n{err}")
            time.sleep(0.02)

    def finish(self, timeout: float = 30.0) -> ClientRun:
        """Close its standard input and reap it (SIGKILL by PID after `timeout` s)."""
        if self.run is not None:
            return self.run
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        if self.proc.returncode is None:
            status, usage = _wait_usage(self.proc, time.monotonic() + timeout)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        else:  # reaped by poll(): no rusage left to read
            usage = None
        wall = time.monotonic() - self._t0
        self.run = _client_run(self.proc.returncode, usage, wall, self.out_path, self.err_path)
        return self.run

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.finish(timeout=5.0)

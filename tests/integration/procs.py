"""Real `mqnamesrv` / `mqbroker` processes for integration tests.

Each process listens on a free loopback port, writes stdout and stderr to a log
file under the test's tmp_path, and is synchronous to drive (subprocess.Popen),
so both plain and trio tests can use it (trio tests may wrap the blocking calls
in `trio.to_thread.run_sync`).

The environment of a child is the test process's environment without any
`TRIMQ_*` variable (except TRIMQ_NO_NATIVE, so a run without the native accelerators runs
its brokers without them too), plus the `env` given: tests stay hermetic.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.helpers import free_port

BIN_DIR = Path(sys.executable).parent

START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


class ProcessError(AssertionError):
    """A process failed to start or stop as expected (message includes its log tail)."""


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def threads_stopped(pid: int) -> bool:
    """Every live thread of process `pid` is stopped (/proc state T or t); True once it is
    gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        # "tid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
        if stat[stat.rindex(")") + 2] not in "TtZX":
            return False
    return True


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: ours minus TRIMQ_* (TRIMQ_NO_NATIVE kept), plus
    `extra`."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_") or k == "TRIMQ_NO_NATIVE"
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ManagedProcess:
    """One server process: start, stop (SIGTERM then SIGKILL), kill, restart, logs.

    Args:
        name: label used in the log file name and error messages.
        workdir: directory for the log file (created).
        port: the port the process listens on (it is told so by `argv()`).
        env: extra environment variables.
    """

    def __init__(
        self,
        name: str,
        workdir: Path,
        port: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.env = dict(env or {})
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- to override --------------------------------------------------------------------
    def argv(self) -> list[str]:
        raise NotImplementedError

    # -- state --------------------------------------------------------------------------
    @property
    def addr(self) -> str:
        """`127.0.0.1:<port>`."""
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def log_text(self) -> str:
        """Everything the process (all its starts) wrote to stdout/stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, *, timeout: float = START_TIMEOUT) -> None:
        """Start the process and wait until its port accepts connections.

        Raises:
            ProcessError: it exited, or the port did not open within `timeout` s
                (the process is killed then).
        """
        if self.running:
            raise ProcessError(f"{self.name} is already running")
        self.starts += 1
        argv = self.argv()
        with self.log_path.open("ab") as log:
            log.write(f"---- start #{self.starts}: {' '.join(argv)}\n".encode())
            log.flush()
            # The child keeps its own copy of the descriptor; ours closes here.
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(self.env),
                cwd=self.workdir,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise ProcessError(
                    f"{self.name} exited with code {code} during start; log tail:\n"
                    f"{self.log_tail()}"
                )
            if _port_open(self.port):
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise ProcessError(
                    f"{self.name} did not listen on {self.addr} within {timeout}s; log tail:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, *, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait up to `timeout` s, then SIGKILL. Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        return proc.returncode

    def kill(self) -> int | None:
        """SIGKILL and reap. Returns the exit code (negative signal number)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait(timeout=STOP_TIMEOUT)
        return proc.returncode

    def pause(self, *, timeout: float = STOP_TIMEOUT) -> None:
        """SIGSTOP, and return once every thread of the process has stopped: it keeps its
        sockets but answers nothing from then on.

        The kernel stops a process thread by thread (the thread the signal woke stops the
        others once it runs), so on a busy host its other threads may still answer for a
        while after `kill` returns."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not threads_stopped(proc.pid):
            if proc.poll() is not None:
                return
            if time.monotonic() >= deadline:
                raise ProcessError(f"{self.name} did not stop within {timeout}s of SIGSTOP")
            time.sleep(0.002)

    def resume(self) -> None:
        """SIGCONT after `pause()`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def restart(self, *, kill: bool = False, timeout: float = START_TIMEOUT) -> None:
        """Stop (or kill) then start again on the same port and settings."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.start(timeout=timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.addr} pid={self.pid}>"


class NamesrvProc(ManagedProcess):
    """`mqnamesrv --listen 127.0.0.1:<port> [args]`.

    Args:
        workdir: directory for the log file.
        port: listen port (default: a free one).
        env: extra environment, e.g. `{"TRIMQ_BROKER_CHANNEL_EXPIRED_TIME_MS": "1500"}`.
        args: extra command-line arguments.
        name: label for logs.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        name: str = "namesrv",
    ) -> None:
        super().__init__(name, workdir, port if port is not None else free_port(), env)
        self.args = list(args)

    def argv(self) -> list[str]:
        return [str(BIN_DIR / "mqnamesrv"), "--listen", self.addr, *self.args]


class BrokerProc(ManagedProcess):
    """`mqbroker -n ADDR --name NAME --listen 127.0.0.1:<port> --store-dir DIR [flags]`.

    Args:
        workdir: directory for the log file; the store goes to `workdir/store` unless
            `store_dir` is given.
        namesrv_addr: NameServer address(es), `;`-separated ("" for none).
        name: broker name (`--name`).
        port: listen port (default: a free one).
        store_dir: store root directory.
        cluster: `--cluster`.
        broker_id: `--id`.
        advertise: `--advertise`.
        flush: "sync" or "async" (`--flush`).
        auto_create_topic: `--auto-create-topic` / `--no-auto-create-topic`.
        config: `--config FILE`.
        env: extra environment (`TRIMQ_*` settings).
        args: extra command-line arguments.
    """

    def __init__(
        self,
        workdir: Path,
        namesrv_addr: str,
        *,
        name: str = "broker-a",
        port: int | None = None,
        store_dir: Path | None = None,
        cluster: str | None = None,
        broker_id: int | None = None,
        advertise: str | None = None,
        flush: str | None = None,
        auto_create_topic: bool | None = None,
        config: Path | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        super().__init__(name, workdir, port if port is not None else free_port(), env)
        self.namesrv_addr = namesrv_addr
        self.broker_name = name
        self.store_dir = store_dir if store_dir is not None else workdir / "store"
        self.cluster = cluster
        self.broker_id = broker_id
        self.advertise = advertise
        self.flush = flush
        self.auto_create_topic = auto_create_topic
        self.config = config
        self.args = list(args)

    def argv(self) -> list[str]:
        argv = [
            str(BIN_DIR / "mqbroker"),
            "-n",
            self.namesrv_addr,
            "--name",
            self.broker_name,
            "--listen",
            self.addr,
            "--store-dir",
            str(self.store_dir),
        ]
        if self.cluster is not None:
            argv += ["--cluster", self.cluster]
        if self.broker_id is not None:
            argv += ["--id", str(self.broker_id)]
        if self.advertise is not None:
            argv += ["--advertise", self.advertise]
        if self.flush is not None:
            argv += ["--flush", self.flush]
        if self.auto_create_topic is not None:
            argv.append(
                "--auto-create-topic" if self.auto_create_topic else "--no-auto-create-topic"
            )
        if self.config is not None:
            argv += ["--config", str(self.config)]
        return [*argv, *self.args]


def stop_all(procs: list[ManagedProcess]) -> None:
    """Stop `procs` in reverse start order; kill any that fails to stop, and raise once all
    are down if any failed."""
    errors: list[str] = []
    for p in reversed(procs):
        try:
            p.stop()
        except Exception as exc:  # keep stopping the others
            errors.append(f"{p!r}: {exc!r}")
            try:
                p.kill()
            except Exception as kill_exc:
                errors.append(f"{p!r} kill: {kill_exc!r}")
    if errors:
        raise RuntimeError("failed to stop processes: " + "; ".join(errors))

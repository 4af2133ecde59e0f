"""`mqnamesrv` as a process: exit codes, signals, config file, start log line."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_until_sync
from tests.integration.procs import BIN_DIR, NamesrvProc, ProcessError, child_env

MQNAMESRV = str(BIN_DIR / "mqnamesrv")


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MQNAMESRV, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_bad_listen_flag_exits_2() -> None:
    r = _run(["--listen", "nonsense"])
    assert r.returncode == 2
    assert "listen" in r.stderr
    assert "HOST:PORT" in r.stderr


def test_bad_config_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = [\n")
    r = _run(["--config", str(bad)])
    assert r.returncode == 2
    assert "not valid TOML" in r.stderr
    r = _run(["--config", str(tmp_path / "missing.toml")])
    assert r.returncode == 2
    assert "cannot read config file" in r.stderr
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("no_such_setting = 1\n")
    r = _run(["--config", str(unknown)])
    assert r.returncode == 2
    assert "no_such_setting: unknown setting" in r.stderr


def test_bad_env_value_exits_2() -> None:
    r = _run(["--listen", "127.0.0.1:0"], env={"TRIMQ_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "-1"})
    assert r.returncode == 2
    assert "scan_not_active_broker_interval_ms" in r.stderr


def test_port_in_use_exits_1() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run(["--listen", f"127.0.0.1:{port}"])
    assert r.returncode == 1
    assert "namesrv_start_failed" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_with_exit_0(
    start_namesrv: Callable[..., NamesrvProc], sig: signal.Signals
) -> None:
    ns = start_namesrv()
    # The port accepts a moment before the line is written.
    wait_until_sync(lambda: "namesrv_started" in ns.log_text(), what="start log line")
    assert f"listen='{ns.addr}'" in ns.log_text()
    assert ns.proc is not None
    ns.proc.send_signal(sig)
    assert ns.proc.wait(timeout=15) == 0
    assert "namesrv_stopped" in ns.log_text()


def test_config_file_and_json_logs(
    tmp_path: Path, start_namesrv: Callable[..., NamesrvProc]
) -> None:
    port = free_port()
    cfg = tmp_path / "namesrv.toml"
    # The file's listen is overridden by the --listen flag NamesrvProc passes.
    cfg.write_text(
        f'listen = "127.0.0.1:{free_port()}"\nlog_json = true\n'
        "broker_channel_expired_time_ms = 4321\n"
    )
    ns = start_namesrv(port=port, args=["--config", str(cfg)])
    assert ns.port == port
    wait_until_sync(lambda: "namesrv_started" in ns.log_text(), what="start log line")
    line = next(ln for ln in ns.log_text().splitlines() if "namesrv_started" in ln)
    assert line.startswith("{")
    assert '"expire_ms": 4321' in line
    assert f'"listen": "127.0.0.1:{port}"' in line


def test_proc_helper_reports_start_failure_with_log_tail(tmp_path: Path) -> None:
    proc = NamesrvProc(tmp_path, args=["--log-level", "bogus"])
    with pytest.raises(ProcessError) as info:
        proc.start()
    assert "exited with code 2" in str(info.value)
    assert "bogus" in str(info.value)  # click's message, from the log tail
    assert not proc.running


def test_proc_helper_kill_and_restart_same_port(tmp_path: Path) -> None:
    proc = NamesrvProc(tmp_path)
    try:
        proc.start()
        port, first_pid = proc.port, proc.pid
        assert proc.kill() == -signal.SIGKILL
        assert proc.returncode == -signal.SIGKILL
        proc.restart()
        assert proc.running
        assert proc.port == port
        assert proc.pid != first_pid
        assert proc.log_text().count("---- start #") == 2
    finally:
        code = proc.stop()
    assert code == 0

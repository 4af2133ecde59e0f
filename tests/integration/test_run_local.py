"""deploy/run-local.sh (`make run`): Ctrl-C stops the broker first, then the NameServer.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group. The script starts
the two processes outside that group, so only the script hears it and stops them in order:
the broker unregisters from a NameServer that is still up.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_until_sync
from tests.integration.procs import BIN_DIR, _port_open, child_env

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "run-local.sh"


def _default_sigint() -> None:
    # A shell cannot trap a signal that was ignored when it started, and a test run started
    # in the background (`make test &`, CI) may pass SIGINT down ignored: a terminal's shell
    # starts its foreground jobs with the default action.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def test_ctrl_c_stops_the_broker_before_the_namesrv(tmp_path: Path) -> None:
    ns_port, br_port = free_port(), free_port()
    log_path = tmp_path / "run.log"
    env = child_env(
        {
            "BIN": str(BIN_DIR),
            "NAMESRV_ADDR": f"127.0.0.1:{ns_port}",
            "BROKER_LISTEN": f"127.0.0.1:{br_port}",
            "STORE_DIR": str(tmp_path / "store"),
        }
    )
    with open(log_path, "wb") as log:
        # Its own process group, as a shell's foreground job: the group is what Ctrl-C hits.
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
        children: list[int] = []
        try:
            wait_until_sync(
                lambda: "registered_with_namesrv" in log_path.read_text(errors="replace"),
                total=30,
                interval=0.1,
                what="the broker registered",
            )
            children = _children(proc.pid)
            assert len(children) == 2
            os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
            assert proc.wait(timeout=30) == 0
        finally:
            # The two servers have process groups of their own: stopped one by one.
            for pid in [proc.pid, *children]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)
    text = log_path.read_text(errors="replace")
    assert "unregistered_from_namesrv" in text, text[-3000:]
    assert "unregister_broker_failed" not in text, text[-3000:]
    assert text.index("broker_stopped") < text.index("namesrv_stopped")
    assert "clean=True" in text
    assert not _port_open(ns_port)
    assert not _port_open(br_port)

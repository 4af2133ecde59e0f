"""The test harness's own process control: what `ManagedProcess.pause` promises."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests.helpers import free_port
from tests.integration.procs import ManagedProcess, threads_stopped

# Answers "x" to every connection; four threads keep both cores busy, so the thread a
# SIGSTOP wakes often waits for a core while the others run on.
_BUSY_SERVER = """
import socket, sys, threading

def spin():
    while True:
        pass

server = socket.socket()
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
while True:
    conn, _ = server.accept()
    try:
        conn.sendall(b"x")
    except OSError:
        pass  # the client gave up first
    conn.close()
"""


class _BusyServer(ManagedProcess):
    def argv(self) -> list[str]:
        return [sys.executable, "-c", _BUSY_SERVER, str(self.port)]


def _answer(port: int, timeout: float) -> bytes | None:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
        conn.settimeout(timeout)
        try:
            return conn.recv(1)
        except TimeoutError:
            return None


def test_pause_returns_once_every_thread_is_stopped(tmp_path: Path) -> None:
    proc = _BusyServer("busy", tmp_path, free_port())
    proc.start()
    try:
        assert proc.pid is not None
        for _ in range(10):
            proc.pause()
            assert threads_stopped(proc.pid)
            proc.resume()
        proc.pause()
        # The kernel queues the connection; nobody accepts it while the process is stopped.
        assert _answer(proc.port, timeout=0.3) is None
        proc.resume()
        assert _answer(proc.port, timeout=5) == b"x"
    finally:
        proc.resume()
        proc.kill()


def test_threads_stopped_of_a_process_that_is_gone(tmp_path: Path) -> None:
    proc = _BusyServer("gone", tmp_path, free_port())
    proc.start()
    pid = proc.pid
    assert pid is not None
    assert not threads_stopped(pid)  # running
    proc.kill()
    assert threads_stopped(pid)

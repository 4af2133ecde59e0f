"""A real `etcd` for tests, and a TCP proxy between a client and it that can cut the link.

- `EtcdProc(workdir)`: one single-member etcd on free 127.0.0.1 client and peer ports with its
  data under `workdir/data`; `start()` returns once /health says true; `stop()` is SIGTERM then
  SIGKILL (`tests.integration.procs.ManagedProcess`). Blocking, like the other processes; trio
  tests call `await trio.to_thread.run_sync(proc.start)` (or `astart` / `astop`).
- `etcd_procs(tmp_path)`: a context manager that stops every `EtcdProc` it started, whatever
  happens.
- `open_tcp_proxy(port)`: an async context manager serving a `TcpProxy` on a free loopback
  port that forwards to `port`; `partition()` stops every byte in both directions (connections
  stay open, new ones are accepted and held: the client sees silence, not an error), `heal()`
  forwards again (held connections are closed); `drop_requests` closes a connection on its
  first request bytes instead of forwarding them.

etcd runs with a short election timeout (500 ms), so its minimum lease TTL is 1 s and a new
member elects itself within about a second.
"""

from __future__ import annotations

import functools
import http.client
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from tests.helpers import free_port
from tests.integration.procs import START_TIMEOUT, ManagedProcess, ProcessError, stop_all

ETCD_BIN = shutil.which("etcd") or "/usr/bin/etcd"


def etcd_available() -> bool:
    return shutil.which("etcd") is not None or Path(ETCD_BIN).exists()


def etcd_healthy(port: int, timeout: float = 0.5) -> bool:
    """GET /health answers {"health": "true"} (the member has a leader)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        answer = conn.getresponse()
        body = answer.read()
        return answer.status == 200 and json.loads(body).get("health") == "true"
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class EtcdProc(ManagedProcess):
    """`etcd` alone in its cluster, on 127.0.0.1 only.

    Args:
        workdir: log file and `data/` (kept across restarts: leases and keys survive).
        port: client port (default: a free one); `peer_port` likewise.
        args: extra command-line arguments.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        name: str = "etcd",
        port: int | None = None,
        peer_port: int | None = None,
        args: Sequence[str] = (),
    ) -> None:
        super().__init__(name, workdir, port if port is not None else free_port())
        self.peer_port = peer_port if peer_port is not None else free_port()
        self.data_dir = workdir / "data"
        self.args = list(args)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        client = self.url
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            ETCD_BIN,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            "--logger",
            "zap",
            "--log-level",
            "warn",
            *self.args,
        ]

    def start(self, *, timeout: float = START_TIMEOUT) -> None:
        """Start and wait until /health is true (the port opens before a leader exists)."""
        deadline = time.monotonic() + timeout
        super().start(timeout=timeout)
        while not etcd_healthy(self.port):
            if not self.running:
                raise ProcessError(f"{self.name} exited during start; log tail:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                self.kill()
                raise ProcessError(
                    f"{self.name} not healthy within {timeout}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    async def astart(self) -> None:
        await trio.to_thread.run_sync(self.start)

    async def astop(self) -> None:
        await trio.to_thread.run_sync(self.stop)


@contextmanager
def etcd_procs(tmp_path: Path) -> Iterator[Callable[..., EtcdProc]]:
    """A factory of started `EtcdProc`s (keywords as `EtcdProc`), all stopped at exit."""
    started: list[ManagedProcess] = []

    def _start(**kwargs: Any) -> EtcdProc:
        kwargs.setdefault("name", f"etcd{len(started)}")
        proc = EtcdProc(tmp_path / kwargs["name"], **kwargs)
        started.append(proc)
        proc.start()
        return proc

    try:
        yield _start
    finally:
        stop_all(started)


class TcpProxy:
    """Forwards connections from `port` to `target_port` on 127.0.0.1 until partitioned.

    `drop_requests = True`: a connection whose client sends anything is closed instead, its
    bytes not forwarded (the client cannot tell whether its request arrived)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self.drop_requests = False
        self._healed = trio.Event()
        self._healed.set()
        # Every open connection's scope: all are cancelled (their sockets closed) on heal,
        # since a connection open during a partition may have lost bytes.
        self._held: set[trio.CancelScope] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def partitioned(self) -> bool:
        return not self._healed.is_set()

    def partition(self) -> None:
        """No byte passes from now on; connections stay open."""
        if self._healed.is_set():
            self._healed = trio.Event()

    def heal(self) -> None:
        """Forward again; connections held during the partition are closed."""
        if not self._healed.is_set():
            self._healed.set()
            for scope in list(self._held):
                scope.cancel()

    async def _pump(
        self,
        src: trio.SocketStream,
        dst: trio.SocketStream,
        connection: trio.CancelScope,
        from_client: bool,
    ) -> None:
        while True:
            data = await src.receive_some(65536)
            if not data:
                await dst.send_eof()
                return
            if from_client and self.drop_requests:
                connection.cancel()
                return
            # A partition stops the byte in flight too: it waits for the heal, which
            # closes this connection.
            if not self._healed.is_set():
                await trio.sleep_forever()
            await dst.send_all(data)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        with trio.CancelScope() as scope:
            self._held.add(scope)
            try:
                async with client:
                    if not self._healed.is_set():
                        await trio.sleep_forever()
                    try:
                        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                    except OSError:
                        return
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, client, upstream, scope, True)
                        nursery.start_soon(self._pump, upstream, client, scope, False)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                self._held.discard(scope)


@asynccontextmanager
async def open_tcp_proxy(target_port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(target_port)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, proxy._handle, 0, host="127.0.0.1")
        )
        proxy.port = int(listeners[0].socket.getsockname()[1])
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()

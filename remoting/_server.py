"""`RemotingServer`: accepts connections and dispatches requests to processors by code."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from functools import partial

import structlog
import trio

from remoting._connection import ByteBudget, Connection, _address
from remoting._frame import DEFAULT_MAX_FRAME_SIZE
from remoting._processor import ProcessorTable
from remoting._protocol import PendingBudget, opaque_counter
from remoting.tls import TlsConfigError, TlsServerSettings, accept_tls, tls_files_signature

__all__ = ["RemotingServer"]

log = structlog.get_logger()


class RemotingServer:
    """A RocketMQ remoting server on trio.

    Register processors in `processors` (`remoting._processor`), then
    `await nursery.start(server.run)`; the started value is the bound port. Cancelling `run`
    closes the listeners and every connection.

    Args:
        host: address to listen on.
        port: TCP port; 0 picks a free one (read it from `port` or the started value).
        max_frame_size: frames declaring a larger length close their connection.
        outbound_queue_size: frames queued per connection before senders wait.
        max_inflight_per_connection: requests handled at once per connection; beyond it the
            connection stops reading until one finishes.
        msgpack_headers: read trimq's msgpack headers and advertise them to trimq clients that
            start in JSON; False serves only RocketMQ's own header codecs, as an Apache server
            does (a msgpack frame closes its connection as an unknown serialize type).
        idle_timeout_ms: close a connection whose peer has sent nothing for this long while
            none of its requests is in flight (RocketMQ's 120 s channel idle time); 0: never.
        read_timeout_ms: close a connection that has sent part of a frame and then nothing for
            this long; 0: never.
        max_partial_frame_bytes: bytes of incomplete frames held over all connections; above
            it a connection holding some stops reading until others complete theirs.
        tls: TLS on this port (`remoting.tls.TlsServerSettings`: disabled, permissive or
            enforcing); None: disabled. The certificate and key are loaded when `run`
            starts, before listening: a bad file raises `TlsConfigError` from `run`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        outbound_queue_size: int = 1024,
        max_inflight_per_connection: int = 4096,
        max_pending: int = 65536,
        msgpack_headers: bool = True,
        idle_timeout_ms: int = 120_000,
        read_timeout_ms: int = 30_000,
        max_partial_frame_bytes: int = 128 * 1024 * 1024,
        tls: TlsServerSettings | None = None,
    ) -> None:
        self.host = host
        self.tls = tls if tls is not None and tls.enabled else None
        # The context new TLS connections get; replaced when the files change.
        self._ssl_context: ssl.SSLContext | None = None
        self._msgpack = msgpack_headers
        self._idle_timeout = max(idle_timeout_ms, 0) / 1000
        self._read_timeout = max(read_timeout_ms, 0) / 1000
        self._partial = ByteBudget(max_partial_frame_bytes)
        self.port = port
        self._max_frame_size = max_frame_size
        self._outbound_queue_size = outbound_queue_size
        self._max_inflight = max_inflight_per_connection
        self.processors = ProcessorTable()
        self._on_connect: list[Callable[[Connection], None]] = []
        self._on_disconnect: list[Callable[[Connection], None]] = []
        self._connections: dict[int, Connection] = {}
        self._budget = PendingBudget(max_pending)
        self._next_opaque = opaque_counter()

    # -- configuration --------------------------------------------------------
    def on_connect(self, cb: Callable[[Connection], None]) -> None:
        """Call `cb(conn)` for each new connection."""
        self._on_connect.append(cb)

    def on_disconnect(self, cb: Callable[[Connection], None]) -> None:
        """Call `cb(conn)` when a connection has closed."""
        self._on_disconnect.append(cb)

    @property
    def connections(self) -> list[Connection]:
        """The open connections."""
        return list(self._connections.values())

    # -- running --------------------------------------------------------------
    async def run(
        self,
        *,
        on_bound: Callable[[int], Awaitable[None]] | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen and serve until cancelled; `task_status.started(port)` once listening.

        Args:
            on_bound: awaited with the bound port before the first connection is accepted
                (state a handler needs that depends on the port, e.g. the address stored in
                message ids); connections that arrive meanwhile wait in the listen backlog.

        Raises:
            TlsConfigError: TLS is on and its certificate, key or trust file does not load.
        """
        tls = self.tls
        files_seen: tuple[tuple[int, int, int], ...] = ()
        if tls is not None:
            files_seen = await trio.to_thread.run_sync(tls_files_signature, tls.files)
            self._ssl_context = await tls.load_context()
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = int(listeners[0].socket.getsockname()[1])
        if on_bound is not None:
            try:
                await on_bound(self.port)
            except BaseException:
                for listener in listeners:
                    await listener.aclose()
                raise
        log.info(
            "remoting_server_listening",
            host=self.host,
            port=self.port,
            tls=tls.mode if tls is not None else "disabled",
        )
        # Plain servers keep today's handler: no TLS step on their connections.
        handler = self._serve if tls is None else self._serve_tls
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    partial(trio.serve_listeners, handler, listeners, handler_nursery=nursery)
                )
                if self._idle_timeout or self._read_timeout:
                    nursery.start_soon(self._watch_silence)
                if tls is not None and tls.reload_interval_ms:
                    nursery.start_soon(self._watch_tls_files, tls, files_seen)
                task_status.started(self.port)
        finally:
            for conn in list(self._connections.values()):
                conn.close()

    async def _watch_silence(self) -> None:
        """Close connections silent for too long: idle ones (nothing received, nothing in
        flight) after the idle timeout, ones stuck inside a frame after the read timeout. A
        connection's silence is measured from the last scan that saw its read count change, so
        a timeout fires between 1 and 1 1/4 times its length."""
        idle, read = self._idle_timeout, self._read_timeout
        period = min(t for t in (idle, read) if t) / 4
        seen: dict[int, tuple[int, float]] = {}
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            live: dict[int, tuple[int, float]] = {}
            for conn in list(self._connections.values()):
                last = seen.get(conn.id)
                if last is None or last[0] != conn.reads:
                    live[conn.id] = (conn.reads, now)
                    continue
                live[conn.id] = last
                silent = now - last[1]
                if read and silent >= read and conn.partial_frame_bytes:
                    log.warning(
                        "remoting_read_timeout",
                        peer=conn.remote_address,
                        conn=conn.id,
                        partial_bytes=conn.partial_frame_bytes,
                        silent_s=round(silent, 1),
                    )
                    conn.close_with_reason(f"no bytes for {silent:.0f} s inside a frame")
                elif idle and silent >= idle and not conn.busy:
                    log.info(
                        "remoting_idle_closed",
                        peer=conn.remote_address,
                        conn=conn.id,
                        silent_s=round(silent, 1),
                    )
                    conn.close_with_reason(f"idle for {silent:.0f} s")
            seen = live

    async def _watch_tls_files(
        self, tls: TlsServerSettings, seen: tuple[tuple[int, int, int], ...]
    ) -> None:
        """Load the certificate, key and trust files again when they change on disk; new
        connections get the new context, open ones keep theirs. A change that does not load
        (a file half written, a key not matching its certificate yet) is tried again at every
        poll until it loads or changes back, and logged once per distinct state."""
        failed: tuple[tuple[int, int, int], ...] | None = None
        while True:
            await trio.sleep(tls.reload_interval_ms / 1000)
            now = await trio.to_thread.run_sync(tls_files_signature, tls.files)
            if now == seen:
                continue
            try:
                context = await tls.load_context()
            except TlsConfigError as exc:
                error = str(exc)
            else:
                self._ssl_context = context
                seen, failed = now, None
                log.info("remoting_tls_reloaded", port=self.port)
                continue
            if now != failed:
                failed = now
                log.error("remoting_tls_reload_failed", port=self.port, error=error)

    async def _serve_tls(self, stream: trio.SocketStream) -> None:
        """A connection to a permissive or enforcing server (`accept_tls`): the plain path
        reads the raw socket as on a server without TLS."""
        tls = self.tls
        assert tls is not None
        context = self._ssl_context
        assert context is not None
        # Permissive: a plain client may be as quiet before its first request as the idle
        # timeout allows any connection. Enforcing: only a TLS client is served, and its
        # handshake (first byte included) must end in time.
        if tls.mode == "permissive" and self._idle_timeout:
            first_byte_timeout = self._idle_timeout
        else:
            first_byte_timeout = tls.handshake_timeout_ms / 1000
        served = await accept_tls(
            stream,
            tls,
            context,
            peer=_address(stream.socket, peer=True),
            first_byte_timeout_s=first_byte_timeout,
            port_name="remoting",
        )
        if served is not None:
            await self._serve(served)

    async def _serve(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        conn = Connection(
            stream,
            self.processors,
            max_frame_size=self._max_frame_size,
            outbound_queue_size=self._outbound_queue_size,
            max_inflight=self._max_inflight,
            next_opaque=self._next_opaque,
            pending_budget=self._budget,
            msgpack=self._msgpack,
            advertise_msgpack=self._msgpack,
            partial_budget=self._partial,
        )
        self._connections[conn.id] = conn
        log.debug("remoting_connected", peer=conn.remote_address, conn=conn.id)
        _notify(self._on_connect, conn)
        try:
            await conn.run()
        finally:
            del self._connections[conn.id]
            log.debug(
                "remoting_disconnected",
                peer=conn.remote_address,
                conn=conn.id,
                reason=conn.close_reason,
            )
            _notify(self._on_disconnect, conn)


def _notify(callbacks: list[Callable[[Connection], None]], conn: Connection) -> None:
    for cb in callbacks:
        try:
            cb(conn)
        except Exception:
            log.exception("remoting_callback_failed", peer=conn.remote_address, conn=conn.id)

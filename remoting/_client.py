"""`RemotingClient`: request/response calls to many addresses over one connection each."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

import structlog
import trio

from remoting._command import RemotingCommand
from remoting._connection import Connection
from remoting._frame import DEFAULT_MAX_FRAME_SIZE
from remoting._processor import ProcessorTable
from remoting._protocol import PendingBudget, opaque_counter
from remoting.codes import LanguageCode, SerializeType
from remoting.errors import RemotingConnectError, RemotingTimeoutError
from remoting.tls import TlsClientSettings, connect_tls, describe_handshake_error

__all__ = ["RemotingClient", "split_address"]

log = structlog.get_logger()


def split_address(addr: str) -> tuple[str, int]:
    """ "host:port" (or "[v6]:port") -> (host, port).

    Raises:
        RemotingConnectError: not of that form.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RemotingConnectError(f"bad address {addr!r}; expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _ConnectAttempt:
    __slots__ = ("conn", "done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.conn: Connection | None = None
        self.error: BaseException | None = None


class RemotingClient:
    """A RocketMQ remoting client: `async with RemotingClient() as client: ...`.

    One connection per address, opened on first use (concurrent first calls share one connect)
    and opened again after it is lost. Requests the server sends on a connection (for example
    CHECK_TRANSACTION_STATE) go to the processors registered in `processors`
    (`remoting._processor`).

    Args:
        serialize_type: header codec of every request sent (responses come back in it).
        upgrade_to_msgpack: start each connection in `serialize_type` and move it to msgpack
            once the server's answer says it reads msgpack (a trimq server); a server that
            never says so (any other RocketMQ server) is spoken to in `serialize_type` only.
        max_frame_size: largest frame accepted from a server.
        connect_timeout_ms: time allowed to open a connection.
        max_pending: cap on requests waiting for responses, over all connections.
        language: the LanguageCode put on every request.
        outbound_queue_size: frames queued per connection before senders wait.
        max_inflight: server-sent requests handled at once per connection.
        before_send: called with every request before it is sent (`invoke`, `invoke_oneway`);
            it may change the request's extFields and body, which reach the server exactly
            as they are then (RocketMQ's RPCHook: the client's ACL signer adds `AccessKey`
            and `Signature`). It runs when `invoke` is called, again for each call with the
            same command; what it raises, the call raises.
        tls: open every connection with TLS (`remoting.tls.TlsClientSettings`; None or
            `enable=False`: plain TCP). The context is built when the client is entered
            (`async with`), which raises `TlsConfigError` for a bad file; the handshake is
            part of the connect and bounded by `connect_timeout_ms`, and a failed one is a
            `RemotingConnectError` naming the reason (certificate not trusted, name
            mismatch, server without TLS).
    """

    def __init__(
        self,
        *,
        serialize_type: int = SerializeType.MSGPACK,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        connect_timeout_ms: int = 3000,
        max_pending: int = 65536,
        language: int = LanguageCode.PYTHON,
        outbound_queue_size: int = 1024,
        max_inflight: int = 256,
        upgrade_to_msgpack: bool = False,
        before_send: Callable[[RemotingCommand], None] | None = None,
        tls: TlsClientSettings | None = None,
    ) -> None:
        self.tls = tls if tls is not None and tls.enable else None
        self._ssl_context: ssl.SSLContext | None = None
        self.serialize_type = int(serialize_type)
        self.before_send = before_send
        self._upgrade = upgrade_to_msgpack
        self.language = int(language)
        self._max_frame_size = max_frame_size
        self._connect_timeout = connect_timeout_ms / 1000
        self._outbound_queue_size = outbound_queue_size
        self._max_inflight = max_inflight
        self._budget = PendingBudget(max_pending)
        self._next_opaque = opaque_counter()
        self.processors = ProcessorTable()
        self._on_disconnect: list[Callable[[str], None]] = []
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, _ConnectAttempt] = {}
        self._nursery: trio.Nursery | None = None
        self._stack = AsyncExitStack()

    # -- lifecycle --------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self.tls is not None:
            self._ssl_context = await self.tls.load_context()
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        nursery = self._nursery
        self._nursery = None
        for conn in list(self._connections.values()):
            conn.close()
        if nursery is not None:
            nursery.cancel_scope.cancel()
        return await self._stack.__aexit__(exc_type, exc, tb)

    # -- configuration ------------------------------------------------------------
    def on_disconnect(self, cb: Callable[[str], None]) -> None:
        """Call `cb(addr)` when the connection to `addr` closes."""
        self._on_disconnect.append(cb)

    @property
    def pending(self) -> int:
        """Requests waiting for a response, over all connections."""
        return self._budget.count

    def connection(self, addr: str) -> Connection | None:
        """The open connection to `addr`, if any."""
        conn = self._connections.get(addr)
        return conn if conn is not None and not conn.closed else None

    # -- calls ----------------------------------------------------------------------
    def invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> Coroutine[Any, Any, RemotingCommand]:
        """Send a request to `addr` and wait for its response (returned whatever its code).

        A coroutine to await (as an ``async def``'s call is). The timeout covers opening the
        connection too. `long_poll`: the peer may hold the request until it has an answer
        (see `Connection.invoke`).

        Raises:
            RemotingTimeoutError: no response within `timeout_ms`.
            RemotingConnectError: the connection could not be opened.
            RemotingConnectionLost: the connection closed before the response.
            RemotingTooManyRequestsError: `max_pending` requests are already waiting.
        """
        if self.before_send is not None:
            # The header codec carries extFields as they are, so the hook sees the final ones.
            self.before_send(cmd)
        conn = self._connections.get(addr)
        if conn is not None and not conn.closed and timeout_ms >= 1:
            # Connected: the connection's own invoke is the coroutine (no frame of ours per
            # call, no clock reads for a connect that does not happen).
            cmd.serialize_type = conn.serialize_type
            cmd.language = self.language
            return conn.invoke(cmd, timeout_ms, long_poll=long_poll)
        return self._connect_and_invoke(addr, cmd, timeout_ms, long_poll)

    async def _connect_and_invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int, long_poll: bool
    ) -> RemotingCommand:
        start = trio.current_time()
        conn = await self._get_connection(addr)
        remaining_ms = timeout_ms - (trio.current_time() - start) * 1000
        if remaining_ms <= 0:
            raise RemotingTimeoutError(f"connecting to {addr} used the whole {timeout_ms} ms")
        cmd.serialize_type = conn.serialize_type
        cmd.language = self.language
        return await conn.invoke(cmd, int(remaining_ms) or 1, long_poll=long_poll)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        """Send a request that gets no response.

        Raises:
            RemotingConnectError: the connection could not be opened.
            RemotingConnectionLost: the connection is closed.
        """
        if self.before_send is not None:
            self.before_send(cmd)
        conn = await self._get_connection(addr)
        cmd.serialize_type = conn.serialize_type
        cmd.language = self.language
        await conn.invoke_oneway(cmd)

    async def close_connection(self, addr: str) -> None:
        """Close the connection to `addr` (if open) and wait until it is down."""
        conn = self._connections.get(addr)
        if conn is not None:
            conn.close()
            await conn.wait_closed()

    # -- connections ------------------------------------------------------------------
    def _fail_attempt(self, addr: str, attempt: _ConnectAttempt, error: BaseException) -> None:
        attempt.error = error
        if self._connecting.get(addr) is attempt:
            del self._connecting[addr]
        attempt.done.set()

    async def _get_connection(self, addr: str) -> Connection:
        conn = self._connections.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._nursery is None:
            raise RuntimeError("RemotingClient used outside `async with`")
        attempt = self._connecting.get(addr)
        if attempt is None:
            attempt = _ConnectAttempt()
            self._connecting[addr] = attempt
            # The connect runs in the client's nursery, so a caller that gives up does not
            # cancel it for the others waiting on the same attempt.
            self._nursery.start_soon(self._connect_and_run, addr, attempt)
        await attempt.done.wait()
        if attempt.conn is None:
            assert attempt.error is not None
            raise attempt.error
        return attempt.conn

    async def _connect_and_run(self, addr: str, attempt: _ConnectAttempt) -> None:
        error: RemotingConnectError | None = None
        tcp: trio.SocketStream | None = None
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] | None = None
        try:
            host, port = split_address(addr)
            with trio.fail_after(self._connect_timeout):
                stream = tcp = await trio.open_tcp_stream(host, port)
                if self._ssl_context is not None:
                    assert self.tls is not None
                    stream = await connect_tls(tcp, self.tls, self._ssl_context, host)
        except trio.TooSlowError:
            step = "connect" if stream is None else "TLS handshake"
            error = RemotingConnectError(
                f"{step} to {addr} timed out after {self._connect_timeout * 1000:.0f} ms"
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            error = RemotingConnectError(
                f"TLS handshake with {addr} failed: {describe_handshake_error(exc)}"
            )
        except OSError as exc:
            error = RemotingConnectError(f"connect to {addr} failed: {exc}")
        except RemotingConnectError as exc:
            error = exc
        except BaseException:  # cancelled: the client is closing
            if tcp is not None:
                await trio.aclose_forcefully(tcp)
            self._fail_attempt(addr, attempt, RemotingConnectError("the client is closing"))
            raise
        if error is not None or stream is None:
            if tcp is not None:
                await trio.aclose_forcefully(tcp)
            self._fail_attempt(addr, attempt, error or RemotingConnectError(f"no stream to {addr}"))
            return
        conn = Connection(
            stream,
            self.processors,
            max_frame_size=self._max_frame_size,
            outbound_queue_size=self._outbound_queue_size,
            max_inflight=self._max_inflight,
            next_opaque=self._next_opaque,
            pending_budget=self._budget,
            serialize_type=self.serialize_type,
            upgrade_to_msgpack=self._upgrade and self.serialize_type != SerializeType.MSGPACK,
        )
        self._connections[addr] = conn
        del self._connecting[addr]
        attempt.conn = conn
        attempt.done.set()
        log.debug("remoting_client_connected", addr=addr, conn=conn.id)
        try:
            await conn.run()
        finally:
            if self._connections.get(addr) is conn:
                del self._connections[addr]
            log.debug("remoting_client_disconnected", addr=addr, reason=conn.close_reason)
            for cb in self._on_disconnect:
                try:
                    cb(addr)
                except Exception:
                    log.exception("remoting_callback_failed", addr=addr)

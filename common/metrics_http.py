"""A tiny HTTP/1.x server on trio for one read-only page: Prometheus' `GET /metrics`.

The broker and the NameServer serve their metrics with it (`broker.metrics`,
`namesrv.metrics`); the text itself comes from a `render()` callback (prometheus_client's
exposition, which this package does not import: `common` stays free of it).

Every connection is bounded, so a bad client costs a little memory for a few seconds and never
the server:
- one request per connection, answered with `Connection: close`;
- the request head (request line and headers) must arrive within `request_timeout_s` and fit
  in `max_head_bytes`: else 408 or 431, then close;
- a body is never read (a GET has none; anything else is refused 405);
- the answer must be taken by the client within `request_timeout_s` (a client that stops
  reading is dropped);
- at most `max_connections` at once: more are answered 503 and closed at once.

`render()` runs on the event loop (it reads the server's state, which lives there) and must not
block; an exception in it is answered 500 and logged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import structlog
import trio

__all__ = ["MetricsHttpServer", "MetricsListenError", "parse_listen", "start_exporter"]

log = structlog.get_logger()

# How long and how much the server reads after an answer (`_linger`).
_LINGER_S = 0.25
_LINGER_BYTES = 2 * 1024 * 1024

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def parse_listen(value: str) -> tuple[str, int] | None:
    """`HOST:PORT` -> (host, port); "" -> None (metrics off).

    Raises:
        ValueError: not HOST:PORT, or the port is outside 0-65535.
    """
    text = value.strip()
    if not text:
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]"), int(port_text)


class MetricsHttpServer:
    """Serves `render()` at `path` on `host:port` (`start`), everything else 404.

    Args:
        host, port: where to listen (port 0: any free port; `port` is the bound one after
            `start`).
        render: the page's bytes (called once per GET of `path`, on the event loop).
        content_type: its Content-Type.
        path: the one page served.
        max_head_bytes: the longest request head accepted (request line and headers).
        request_timeout_s: how long a client has to send its head, and to take the answer.
        max_connections: connections served at once.
    """

    def __init__(
        self,
        host: str,
        port: int,
        render: Callable[[], bytes],
        *,
        content_type: str = "text/plain; charset=utf-8",
        path: str = "/metrics",
        max_head_bytes: int = 8192,
        request_timeout_s: float = 5.0,
        max_connections: int = 16,
    ) -> None:
        self.host = host
        self.port = port
        self._render = render
        self._content_type = content_type
        self._path = path
        self._max_head = max_head_bytes
        self._timeout = request_timeout_s
        self._max_connections = max_connections
        self._active = 0
        self.served = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, nursery: trio.Nursery) -> int:
        """Bind, then serve in `nursery` until it is cancelled; returns the bound port.

        Raises:
            OSError: the address cannot be bound (in use, not local, ...).
        """
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = int(listeners[0].socket.getsockname()[1])
        nursery.start_soon(partial(trio.serve_listeners, self._handle, listeners))
        return self.port

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One connection: never raises (an error here would stop the whole listener)."""
        try:
            async with stream:
                if self._active >= self._max_connections:
                    await self._answer(stream, 503, b"too many connections\n")
                    await self._linger(stream)
                    return
                self._active += 1
                try:
                    await self._serve_one(stream)
                    await self._linger(stream)
                finally:
                    self._active -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("metrics_http_failed")

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        head = await self._read_head(stream)
        if isinstance(head, int):
            messages = {408: b"request head too slow\n", 431: b"request head too large\n"}
            await self._answer(stream, head, messages.get(head, b"bad request\n"))
            return
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            await self._answer(stream, 400, b"bad request line\n")
            return
        method, target = parts[0], parts[1]
        path = target.split(b"?", 1)[0]
        if path != self._path.encode():
            await self._answer(stream, 404, b"not found: try " + self._path.encode() + b"\n")
            return
        if method not in (b"GET", b"HEAD"):
            await self._answer(stream, 405, b"only GET\n", extra=b"Allow: GET, HEAD\r\n")
            return
        try:
            body = self._render()
        except Exception:
            log.exception("metrics_render_failed")
            await self._answer(stream, 500, b"metrics unavailable\n")
            return
        self.served += 1
        await self._answer(
            stream, 200, body, content_type=self._content_type, head_only=method == b"HEAD"
        )

    async def _linger(self, stream: trio.SocketStream) -> None:
        """After the answer: end our side, then read (and drop) what the client still sends,
        briefly and boundedly, before closing. Closing with unread bytes makes the kernel
        reset the connection, and a client may lose the answer to the reset."""
        await stream.send_eof()
        left = _LINGER_BYTES
        with trio.move_on_after(_LINGER_S):
            while left > 0:
                data = await stream.receive_some(min(left, 65536))
                if not data:
                    return
                left -= len(data)

    async def _read_head(self, stream: trio.SocketStream) -> bytes | int:
        """The request head up to its blank line, or the status refusing it (400, 408, 431)."""
        buf = bytearray()
        with trio.move_on_after(self._timeout):
            while True:
                # Up to the limit plus the terminator, so a head just at the limit fits.
                chunk = await stream.receive_some(self._max_head + 4 - len(buf))
                if not chunk:
                    return 400  # closed before the head ended
                start = max(0, len(buf) - 3)
                buf += chunk
                end = buf.find(b"\r\n\r\n", start)
                if end >= 0:
                    return bytes(buf[:end])
                if len(buf) >= self._max_head + 4:
                    return 431
        return 408

    async def _answer(
        self,
        stream: trio.SocketStream,
        status: int,
        body: bytes,
        *,
        content_type: str = "text/plain; charset=utf-8",
        extra: bytes = b"",
        head_only: bool = False,
    ) -> None:
        head = (
            (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n"
            ).encode()
            + extra
            + b"\r\n"
        )
        # A client that does not take its answer in time is dropped.
        with trio.move_on_after(self._timeout):
            await stream.send_all(head if head_only else head + body)


class MetricsListenError(Exception):
    """`metrics_listen` was set explicitly and cannot be bound (the server does not start)."""


async def start_exporter(
    nursery: trio.Nursery,
    listen: str,
    *,
    explicit: bool,
    render: Callable[[], bytes],
    content_type: str,
) -> MetricsHttpServer | None:
    """Serve `render()` at `/metrics` on `listen` in `nursery`; None when `listen` is empty
    (off), or when it is not `explicit` (the server's default) and cannot be bound (a
    warning: several servers on one host share the default).

    Raises:
        MetricsListenError: an `explicit` address that cannot be bound.
    """
    where = parse_listen(listen)
    if where is None:
        return None
    server = MetricsHttpServer(where[0], where[1], render, content_type=content_type)
    try:
        await server.start(nursery)
    except OSError as exc:
        if explicit:
            raise MetricsListenError(f"metrics_listen {listen} cannot be bound: {exc}") from exc
        log.warning("metrics_listen_failed", listen=listen, error=str(exc))
        return None
    log.info("metrics_listening", listen=server.address)
    return server

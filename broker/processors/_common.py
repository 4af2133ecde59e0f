"""Helpers shared by the processors: error responses and the exception guard (the same for
inline and task processors)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

import structlog

from remoting import Connection, HeaderError, RemotingCommand, ResponseCode

log = structlog.get_logger()

S = TypeVar("S")


class _SendFamily(Protocol):
    def region_fields(self) -> dict[str, str]: ...


SP = TypeVar("SP", bound=_SendFamily)
# A processor method (`remoting.Processor` with its instance first).
MethodHandler = Callable[
    [S, Connection, RemotingCommand], Coroutine[Any, Any, RemotingCommand | None]
]


def error(cmd: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    """A response with `code` and `remark`."""
    return cmd.make_response(code, remark)


def guarded(
    header_error_code: int = ResponseCode.SYSTEM_ERROR,
) -> Callable[[MethodHandler[S]], MethodHandler[S]]:
    """Turn a bad header into `header_error_code` and any other exception into SYSTEM_ERROR.

    The remark names the bad field or the exception, so a client sees why.
    """

    def deco(fn: MethodHandler[S]) -> MethodHandler[S]:
        return _guard(fn, header_error_code, None)

    return deco


def guarded_send(fn: MethodHandler[SP]) -> MethodHandler[SP]:
    """`guarded` for the send family: a bad header is MESSAGE_ILLEGAL, and every error
    response still carries `self.region_fields()` (MSG_REGION, TRACE_ON)."""

    def extra(self: SP) -> dict[str, str]:
        return self.region_fields()

    return _guard(fn, ResponseCode.MESSAGE_ILLEGAL, extra)


def _error_response(
    self: S,
    conn: Connection,
    cmd: RemotingCommand,
    exc: Exception,
    header_error_code: int,
    extra_fields: Callable[[S], dict[str, str]] | None,
) -> RemotingCommand:
    if isinstance(exc, HeaderError):
        resp = error(cmd, header_error_code, f"bad request header: {exc}")
    elif isinstance(exc, ValueError):
        resp = error(cmd, ResponseCode.SYSTEM_ERROR, f"bad request: {exc}")
    else:
        log.exception("handler_failed", code=cmd.code, peer=conn.remote_address)
        resp = error(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
    if extra_fields is not None:
        resp.ext_fields = extra_fields(self)
    return resp


def _guard(
    fn: MethodHandler[S],
    header_error_code: int,
    extra_fields: Callable[[S], dict[str, str]] | None,
) -> MethodHandler[S]:
    @functools.wraps(fn)
    async def wrapper(self: S, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        try:
            return await fn(self, conn, cmd)
        except Exception as exc:
            return _error_response(self, conn, cmd, exc, header_error_code, extra_fields)

    return wrapper


def split_addr(addr: str) -> tuple[str, int]:
    """'ip:port' -> (ip, port); a bracketed IPv6 host loses its brackets."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        return host or "127.0.0.1", 0

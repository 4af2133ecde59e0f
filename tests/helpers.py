"""Small test helpers: bounded polling instead of bare sleeps."""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable

import trio

from remoting import RemotingCommand, SerializeType


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    total: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll `predicate` every `interval` seconds until it is true; fail after `total` seconds."""
    deadline = trio.current_time() + total
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if trio.current_time() >= deadline:
            raise AssertionError(f"timed out after {total}s waiting for {what}")
        await trio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], bool],
    *,
    total: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Blocking variant of `wait_until` for code outside trio."""
    deadline = time.monotonic() + total
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {total}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def json_request(
    code: int, fields: dict[str, str] | None = None, body: bytes | None = None
) -> RemotingCommand:
    """A request with a JSON header, as an Apache client sends it."""
    return RemotingCommand.request(code, fields, body, serialize_type=SerializeType.JSON)

"""Small helpers shared by the client's context managers."""

from __future__ import annotations

from contextlib import AsyncExitStack
from types import TracebackType

import trio

from common.exceptions import exception_leaves


async def close_stack(
    stack: AsyncExitStack,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool | None:
    """Close `stack`, re-raising the body's own exception unwrapped.

    Our objects keep a trio nursery open around the user's `async with` body,
    so an error in the body would come out wrapped in an ExceptionGroup. When
    that group holds nothing but the body's exception (and cancellations),
    the exception itself is raised instead: `except NoRouteError` keeps working.
    """
    try:
        return await stack.__aexit__(exc_type, exc, tb)
    except BaseExceptionGroup as eg:
        leaves = exception_leaves(eg)
        real = [e for e in leaves if not isinstance(e, trio.Cancelled)]
        if len(real) == 1 and (exc is None or real[0] is exc):
            raise real[0] from None
        raise

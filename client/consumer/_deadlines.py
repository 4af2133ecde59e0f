"""One timer for the deadlines of many calls that share a fixed timeout (the listener calls of a
push consumer, `consume_timeout_ms`).

`trio.move_on_after` around each call would do the same, but a call that ends before its
deadline (nearly every listener call: the default timeout is 15 minutes) leaves its cancel
scope behind in trio's deadline heap, which trio prunes only once ~1,000 such entries pile up.
Those scopes outlive the garbage collector's young generation, so every collection scans them
again, each a pause on some message's way (docs/design-notes.md, "Deadlines that die young").
Here a call runs in a cancel scope without a
deadline (it leaves nothing behind) and is registered with its deadline in an
insertion-ordered dict. The timeout is fixed, so the oldest call has the earliest deadline:
`run` sleeps until that one and cancels what is due, exactly at its deadline.
"""

from __future__ import annotations

import trio

__all__ = ["CallDeadlines"]


class CallDeadlines:
    """Deadlines `timeout_s` after each `open`, enforced by `run` (one task for all calls)."""

    __slots__ = ("_calls", "_idle", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # Open scopes and their deadlines, oldest (earliest) first.
        self._calls: dict[trio.CancelScope, float] = {}
        self._idle: trio.Event | None = None  # set when `run` waits for a first call

    def open(self) -> trio.CancelScope:
        """A cancel scope for one call, cancelled by `run` `timeout_s` from now unless
        `close`d first. Enter it at once (no checkpoint in between) and `close` it after."""
        scope = trio.CancelScope()
        self._calls[scope] = trio.current_time() + self.timeout_s
        idle = self._idle
        if idle is not None:
            self._idle = None
            idle.set()
        return scope

    def close(self, scope: trio.CancelScope) -> None:
        """The call of `scope` is over: forget its deadline."""
        self._calls.pop(scope, None)

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    async def run(self) -> None:
        """Cancel each open scope at its deadline. Runs until cancelled."""
        calls = self._calls
        while True:
            if not calls:
                idle = self._idle = trio.Event()
                await idle.wait()
                continue
            scope, deadline = next(iter(calls.items()))
            if trio.current_time() >= deadline:
                del calls[scope]
                scope.cancel()
                continue
            # Woken at the oldest call's deadline even if it ended meanwhile: at most one
            # wake-up per timeout, then the next oldest's deadline. The scope is not held
            # meanwhile: a call that ended leaves nothing behind.
            del scope
            await trio.sleep_until(deadline)

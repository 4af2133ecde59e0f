"""A trio loop hosted in a daemon thread, called into from plain threads.

Code that is not trio (scripts, web apps, Spark's Python workers) reaches trio objects through
one `TrioThread`: `start()` runs `trio.run` in a daemon thread and returns once the loop is
ready; `run` and `run_sync` hand a call to the loop and block until it is done; `close()`
stops the loop and joins the thread.

    thread = TrioThread("worker", SomeAsyncResource).start()  # entered in the loop
    print(thread.run(thread.value.fetch, "key"))
    thread.close()

Shutdown order, inside the loop: background tasks (the `nursery`) are cancelled first, then
the setup context exits (not cancelled), then `trio.run` returns. A forked child never uses
its parent's loop thread: the thread and its loop do not exist there, so every call raises
instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, Self, TypeVar, cast, overload

import structlog
import trio

__all__ = ["START_TIMEOUT_S", "TrioThread", "TrioThreadClosedError"]

log = structlog.get_logger()

T = TypeVar("T")
V = TypeVar("V")

START_TIMEOUT_S = 30.0


class TrioThreadClosedError(RuntimeError):
    """A call into a `TrioThread` that is not running: not started yet, closed (or its loop
    ended), or started by another process (a forked child's copy)."""


class TrioThread(Generic[V]):
    """A trio loop in a daemon thread, with blocking calls into it from other threads.

    One object runs one loop once: `start()` a second time raises `RuntimeError`.
    Every method may be called from any thread; `run`, `run_sync` and `start_soon` must not be
    called from the loop thread itself (trio raises `RuntimeError` there).

    Args:
        name: the thread's name.
        setup: called in the loop thread before it is ready; the async context manager it
            returns is entered there, its value is `value`, and it is left (not cancelled) when
            the loop stops, after the background tasks have been cancelled. A failure entering
            it is raised by `start()`.
        what: how error messages name this loop ("the trio thread 'name'" by default).
        closed_error: builds the error raised by calls made while the loop is not running,
            from a message naming the reason (default `TrioThreadClosedError`).
        start_timeout: seconds `start()` waits for the loop to be ready, and `close()` for
            the thread to end.
    """

    @overload
    def __init__(
        self: TrioThread[None],
        name: str,
        setup: None = None,
        *,
        what: str | None = None,
        closed_error: Callable[[str], Exception] = TrioThreadClosedError,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None: ...

    @overload
    def __init__(
        self,
        name: str,
        setup: Callable[[], AbstractAsyncContextManager[V]],
        *,
        what: str | None = None,
        closed_error: Callable[[str], Exception] = TrioThreadClosedError,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None: ...

    def __init__(
        self,
        name: str,
        setup: Callable[[], AbstractAsyncContextManager[V]] | None = None,
        *,
        what: str | None = None,
        closed_error: Callable[[str], Exception] = TrioThreadClosedError,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.name = name
        # The process that owns the loop thread: the creator's until start(), then the starter's.
        self.pid = os.getpid()
        self._setup = setup
        self._what = what if what is not None else f"the trio thread {name!r}"
        self._closed_error = closed_error
        self._start_timeout = start_timeout
        # Guards the fields below that start(), close() and the loop thread all write.
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        # Set while the loop runs and no close() was asked for: the calls' "running" test.
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._value: V | None = None
        self._has_value = False
        self._closing = False
        self._error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Self:
        """Start the thread and wait until the loop is ready (the setup context entered).

        Returns:
            self.

        Raises:
            TimeoutError: the loop was not ready within `start_timeout` (it is stopped).
            RuntimeError: this object was started before.
            TrioThreadClosedError: (or `closed_error`'s type) `close()` came first.
            BaseException: whatever the setup raised (the thread has ended).
        """
        with self._lock:
            if self._thread is not None:
                raise RuntimeError(f"{self._what} was started already (a TrioThread runs once)")
            if self._closing:
                raise self._closed_error(f"{self._what} is closed")
            self.pid = os.getpid()
            thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread = thread
        thread.start()
        if not self._ready.wait(self._start_timeout):
            # The loop may still become ready: _closing makes it stop instead.
            self._request_stop()
            raise TimeoutError(f"{self._what} did not start")
        if not self._has_value:  # the loop ended before it was ready
            thread.join(self._start_timeout)
            if self._error is not None:
                raise self._error
            raise self._closed_error(f"{self._what} is closed")  # close() came first
        return self

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
            if self._has_value:  # start() has returned: nobody else will see this error
                log.warning("trio_thread_failed", thread=self.name, error=repr(exc))
        finally:
            with self._lock:
                self._token = None
                self._nursery = None
            self._ready.set()

    async def _main(self) -> None:
        setup = self._setup() if self._setup is not None else contextlib.nullcontext()
        async with setup as value, trio.open_nursery() as nursery:
            stop = trio.Event()
            with self._lock:
                if self._closing:  # close() came before the loop was ready
                    return
                self._value = cast(V, value)
                self._has_value = True
                self._nursery = nursery
                self._stop = stop
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
            await stop.wait()
            nursery.cancel_scope.cancel()

    def _request_stop(self) -> None:
        with self._lock:
            self._closing = True
            token, stop = self._token, self._stop
            self._token = None
        if token is None or stop is None or self.pid != os.getpid():
            # Not running, or a forked child: the parent's loop is not ours to signal (its
            # wakeup socket is shared with the parent, and no thread here would answer).
            return
        if threading.current_thread() is self._thread:
            stop.set()
            return
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(stop.set, trio_token=token)

    def close(self) -> None:
        """Stop the loop and wait for its thread to end (idempotent, from any thread).

        Background tasks are cancelled, then the setup context exits. Called from the loop
        thread itself, this asks the loop to stop and returns without waiting. Calls made
        after `close()` raise `closed_error` at once. An error the loop ends with is
        logged, not raised.
        """
        self._request_stop()
        thread = self._thread
        if (
            thread is not None
            and thread is not threading.current_thread()
            and self.pid == os.getpid()
        ):
            thread.join(self._start_timeout)

    # -- state -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """The thread is alive, its loop running and not closing, and owned by this process."""
        thread = self._thread
        return (
            thread is not None
            and thread.is_alive()
            and self._token is not None
            and self.pid == os.getpid()
        )

    @property
    def value(self) -> V:
        """The setup context's value (None without setup), from start() on; kept after close.

        Raises:
            TrioThreadClosedError: (or `closed_error`'s type) the loop was never ready.
        """
        if not self._has_value:
            raise self._closed_error(self._why_not_running())
        return cast(V, self._value)

    @property
    def nursery(self) -> trio.Nursery:
        """The nursery for background tasks, for code running in the loop thread.

        Its tasks are cancelled when the loop stops, before the setup context exits.

        Raises:
            TrioThreadClosedError: (or `closed_error`'s type) the loop is not running.
        """
        nursery = self._nursery
        if nursery is None:
            raise self._closed_error(self._why_not_running())
        return nursery

    def _why_not_running(self) -> str:
        if self.pid != os.getpid():
            return f"{self._what} belongs to process {self.pid}, not to this (forked) one"
        if self._thread is None:
            return f"{self._what} is not started"
        return f"{self._what} is closed"

    def _running_token(self) -> trio.lowlevel.TrioToken:
        token = self._token
        if token is None or self.pid != os.getpid():
            raise self._closed_error(self._why_not_running())
        return token

    # -- calls from other threads ------------------------------------------------------
    def run(self, async_fn: Callable[..., Awaitable[T]], /, *args: Any) -> T:
        """`await async_fn(*args)` in the loop; blocks until done and returns its result.

        Raises:
            TrioThreadClosedError: (or `closed_error`'s type) the loop is not running, or
                stopped before the call got in.
            BaseException: whatever `async_fn` raised.
        """
        token = self._running_token()
        try:
            return trio.from_thread.run(async_fn, *args, trio_token=token)
        except trio.RunFinishedError:
            raise self._closed_error(self._why_not_running()) from None

    def run_sync(self, fn: Callable[..., T], /, *args: Any) -> T:
        """`fn(*args)` in the loop thread; blocks until done and returns its result.

        Raises:
            TrioThreadClosedError: (or `closed_error`'s type) the loop is not running, or
                stopped before the call got in.
            BaseException: whatever `fn` raised.
        """
        token = self._running_token()
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=token)
        except trio.RunFinishedError:
            raise self._closed_error(self._why_not_running()) from None

    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], /, *args: Any) -> None:
        """Start `async_fn(*args)` as a background task in `nursery` (returns at once).

        Raises:
            TrioThreadClosedError: (or `closed_error`'s type) the loop is not running.
        """
        self.run_sync(self._start_soon, async_fn, *args)

    def _start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.nursery.start_soon(async_fn, *args)

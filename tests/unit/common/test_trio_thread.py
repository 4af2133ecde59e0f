"""common.trio_thread: a trio loop in a daemon thread, called into from plain threads."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
import trio

from common.trio_thread import TrioThread, TrioThreadClosedError

pytestmark = pytest.mark.unit


class Resource:
    """What a setup context yields: records its lifecycle and the thread it ran on."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.thread: int | None = None


def _threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


@pytest.fixture
def loop() -> Iterator[TrioThread[None]]:
    t = TrioThread("tt-plain").start()
    yield t
    t.close()


def test_start_and_close_end_the_thread() -> None:
    t = TrioThread("tt-life")
    alive = [t.alive]
    assert t.start() is t
    alive.append(t.alive)
    assert alive == [False, True]
    assert len(_threads_named("tt-life")) == 1
    assert t.value is None
    t.close()
    assert not t.alive
    assert _threads_named("tt-life") == []


def test_run_and_run_sync_return_results_in_the_loop_thread(loop: TrioThread[None]) -> None:
    async def double(x: int) -> int:
        await trio.lowlevel.checkpoint()
        return 2 * x

    assert loop.run(double, 21) == 42
    assert loop.run_sync(lambda a, b: a + b, 1, 2) == 3
    loop_ident = loop.run_sync(threading.get_ident)
    assert loop_ident != threading.get_ident()
    assert loop.run(trio.to_thread.run_sync, threading.get_ident) not in (loop_ident, None)


def test_run_and_run_sync_raise_the_callees_errors(loop: TrioThread[None]) -> None:
    async def fail() -> None:
        raise ValueError("async failure")

    def fail_sync() -> None:
        raise KeyError("sync failure")

    with pytest.raises(ValueError, match="async failure"):
        loop.run(fail)
    with pytest.raises(KeyError, match="sync failure"):
        loop.run_sync(fail_sync)
    assert loop.run_sync(lambda: 7) == 7  # the loop survives its callers' errors


def test_calls_before_start_and_after_close_raise_the_closed_error() -> None:
    t = TrioThread("tt-closed")
    with pytest.raises(TrioThreadClosedError, match="'tt-closed' is not started"):
        t.run_sync(lambda: None)
    with pytest.raises(TrioThreadClosedError, match="is not started"):
        _ = t.nursery
    t.start()
    t.close()
    with pytest.raises(TrioThreadClosedError, match="'tt-closed' is closed"):
        t.run(trio.sleep, 0)
    with pytest.raises(TrioThreadClosedError, match="is closed"):
        t.run_sync(lambda: None)
    with pytest.raises(TrioThreadClosedError, match="is closed"):
        t.start_soon(trio.sleep, 0)
    with pytest.raises(RuntimeError, match="started already"):
        t.start()


def test_closed_error_and_what_name_the_callers_error() -> None:
    class MyError(Exception):
        pass

    t = TrioThread("tt-mine", what="the widget", closed_error=MyError)
    with pytest.raises(MyError, match=r"^the widget is not started$"):
        t.run_sync(lambda: None)


def test_setup_value_is_exposed_and_left_after_the_background_tasks() -> None:
    res = Resource()

    @asynccontextmanager
    async def setup() -> AsyncIterator[Resource]:
        res.thread = threading.get_ident()
        res.events.append("enter")
        try:
            yield res
        finally:
            res.events.append("exit")

    async def background(started: threading.Event) -> None:
        try:
            started.set()
            await trio.sleep_forever()
        finally:
            res.events.append("task cancelled")

    t = TrioThread("tt-setup", setup).start()
    assert t.value is res
    assert res.events == ["enter"]
    assert res.thread == t.run_sync(threading.get_ident)
    started = threading.Event()
    t.start_soon(background, started)
    assert started.wait(5)
    t.close()
    assert res.events == ["enter", "task cancelled", "exit"]
    assert t.value is res  # kept after close


def test_setup_failure_is_raised_by_start_and_the_thread_ends() -> None:
    class Failing:
        async def __aenter__(self) -> None:
            raise OSError("cannot connect")

        async def __aexit__(self, *exc_info: object) -> None:
            pass

    t = TrioThread("tt-fail", Failing)
    with pytest.raises(OSError, match="cannot connect"):
        t.start()
    assert not t.alive
    assert _threads_named("tt-fail") == []
    with pytest.raises(TrioThreadClosedError, match="is closed"):
        t.run_sync(lambda: None)
    t.close()  # nothing left to stop


def test_start_timeout_raises_and_the_late_loop_stops() -> None:
    @asynccontextmanager
    async def slow_setup() -> AsyncIterator[None]:
        await trio.sleep(0.2)
        yield

    t = TrioThread("tt-slow", slow_setup, start_timeout=0.02)
    with pytest.raises(TimeoutError, match="'tt-slow' did not start"):
        t.start()
    for thread in _threads_named("tt-slow"):
        thread.join(5)
    assert _threads_named("tt-slow") == []
    assert not t.alive


def test_close_is_idempotent_from_several_threads() -> None:
    t = TrioThread("tt-close").start()
    closers = [threading.Thread(target=t.close) for _ in range(4)]
    for c in closers:
        c.start()
    for c in closers:
        c.join(5)
    assert not any(c.is_alive() for c in closers)
    assert not t.alive
    assert _threads_named("tt-close") == []
    t.close()


def test_close_from_the_loop_thread_does_not_join_itself() -> None:
    t = TrioThread("tt-self").start()
    t.run_sync(t.close)  # asks the loop to stop; cannot wait for its own thread
    assert not t.alive
    t.close()  # from outside: waits for the thread
    assert _threads_named("tt-self") == []


def test_a_forked_child_never_uses_the_parents_loop(loop: TrioThread[None]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: intended here
        pid = os.fork()
    if pid == 0:  # the child: no loop thread here; report through the exit status only
        code = 1
        try:
            if not loop.alive:
                try:
                    loop.run_sync(lambda: None)
                except TrioThreadClosedError as exc:
                    if "belongs to process" in str(exc):
                        loop.close()  # must neither signal the parent's loop nor wait
                        code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert loop.alive  # the child's close did not stop the parent's loop
    assert loop.run_sync(lambda: 1) == 1

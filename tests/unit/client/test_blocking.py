"""The blocking facade's loop thread, with an in-memory async object (no network)."""

from __future__ import annotations

import threading
from types import TracebackType

import pytest
import trio

from client.blocking import _Held
from client.errors import ClientClosedError


class Resource:
    """An async context manager recording its lifecycle and the threads it ran on."""

    def __init__(self, fail_on_enter: bool = False) -> None:
        self.events: list[str] = []
        self.fail_on_enter = fail_on_enter
        self.threads: set[int] = set()

    async def __aenter__(self) -> Resource:
        self.threads.add(threading.get_ident())
        if self.fail_on_enter:
            raise ValueError("cannot start")
        self.events.append("enter")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.events.append("exit")

    async def work(self, x: int) -> int:
        self.threads.add(threading.get_ident())
        await trio.sleep(0.01)
        return x * 2

    async def slow(self) -> None:
        await trio.sleep(60)


def test_calls_from_many_threads_run_in_one_loop_thread() -> None:
    res = Resource()
    held = _Held("t", res)
    held.start()
    results: list[int] = []
    lock = threading.Lock()

    def caller(base: int) -> None:
        for i in range(20):
            r = held.loop.run(res.work, base + i)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=caller, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == sorted(2 * (k * 100 + i) for k in range(4) for i in range(20))
    assert len(res.threads) == 1
    assert threading.get_ident() not in res.threads
    held.close()
    assert res.events == ["enter", "exit"]
    held.close()  # idempotent
    with pytest.raises(ClientClosedError):
        held.loop.run(res.work, 1)


def test_timeout_raises_builtin_timeout_error() -> None:
    res = Resource()
    held = _Held("t", res)
    held.start()
    try:
        with pytest.raises(TimeoutError):
            held.loop.run(res.slow, timeout=0.05)
        assert held.loop.run(res.work, 2, timeout=5) == 4  # still usable
    finally:
        held.close()


def test_start_failure_is_raised_and_the_thread_ends() -> None:
    res = Resource(fail_on_enter=True)
    held = _Held("t", res)
    with pytest.raises(ValueError, match="cannot start"):
        held.start()
    assert not any(t.name == "t" for t in threading.enumerate())

"""`CallDeadlines`: one timer task cancels each call at its own deadline, and a call that ends
first leaves nothing behind (its scope is freed at once, not kept by trio's deadline heap).
On trio's MockClock: the times below are exact."""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from client.consumer._deadlines import CallDeadlines

pytestmark = pytest.mark.unit


def _run(d: CallDeadlines, body: Callable[[], Awaitable[None]]) -> None:
    """`body` on trio's MockClock with `d`'s timer running; every call must be over after it."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.run)
            await body()
            assert d.open_calls == 0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def _call(d: CallDeadlines, seconds: float, out: dict[str, float], name: str) -> None:
    """A call that takes `seconds`; records when it ended and whether it was cut."""
    scope = d.open()
    try:
        with scope:
            await trio.sleep(seconds)
    finally:
        d.close(scope)
    out[name] = trio.current_time()
    out[name + "_cut"] = float(scope.cancelled_caught)


def test_each_call_is_cut_at_its_own_deadline() -> None:
    out: dict[str, float] = {}
    d = CallDeadlines(10.0)

    async def body() -> None:
        async with trio.open_nursery() as calls:
            calls.start_soon(_call, d, 20.0, out, "a")  # starts at 0: cut at 10
            await trio.sleep(1)
            calls.start_soon(_call, d, 5.0, out, "b")  # starts at 1: ends at 6
            await trio.sleep(1)
            calls.start_soon(_call, d, 30.0, out, "c")  # starts at 2: cut at 12

    _run(d, body)
    assert (out["a"], out["a_cut"]) == (10.0, 1.0)
    assert (out["b"], out["b_cut"]) == (6.0, 0.0)
    assert (out["c"], out["c_cut"]) == (12.0, 1.0)


def test_the_timer_wakes_for_a_call_after_idling() -> None:
    out: dict[str, float] = {}
    d = CallDeadlines(3.0)

    async def body() -> None:
        await trio.sleep(100)  # no call: the timer waits without a deadline
        await _call(d, 50.0, out, "late")

    _run(d, body)
    assert (out["late"], out["late_cut"]) == (103.0, 1.0)


def test_a_call_that_ends_first_leaves_nothing_behind() -> None:
    """`trio.move_on_after` would leave the scope in trio's deadline heap until its deadline
    (or a prune ~1,000 entries later), for the garbage collector to scan again and again."""

    d = CallDeadlines(900.0)

    async def body() -> None:
        await trio.lowlevel.checkpoint()  # the timer waits for a first call
        refs = []
        for _ in range(3):
            scope = d.open()
            with scope:
                await trio.sleep(1)
            d.close(scope)
            refs.append(weakref.ref(scope))
            del scope
        assert [r() for r in refs] == [None, None, None]  # freed at once, no collection

    _run(d, body)

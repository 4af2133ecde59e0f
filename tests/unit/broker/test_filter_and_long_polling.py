"""Tag filter parsing (FilterAPI rules) and long polling with a fake clock."""

from __future__ import annotations

import gc
import weakref

import pytest
import trio
import trio.testing

from broker.filter import build_subscription, tag_filter
from broker.long_polling import LongPollingService, ParkedPull
from common.filter import SubscriptionParseError
from common.message import java_string_hash


def test_java_string_hash_known_values() -> None:
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("") == 0
    # Overflows to a negative int32 like Java.
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("\u00e9t\u00e9") == 0xE9 * 31 * 31 + 0x74 * 31 + 0xE9


def test_build_subscription_like_filter_api() -> None:
    sub = build_subscription("T", " TagA ||TagB|| TagA ||  ")
    assert sub.sub_string == "TagA ||TagB|| TagA ||"
    assert sub.tags_set == ["TagA", "TagB"]
    assert sub.code_set == [java_string_hash("TagA"), java_string_hash("TagB")]
    for everything in ("*", "", None, " * "):
        s = build_subscription("T", everything)
        assert s.sub_string == "*"
        assert tag_filter(s) is None
    with pytest.raises(SubscriptionParseError):
        build_subscription("T", "||")
    # SQL92 is built as sent; `sql_filter` compiles it (tests/unit/broker/test_filter_sql92.py).
    sql = build_subscription("T", " a > 3 ", expression_type="SQL92", sub_version=7)
    assert (sql.sub_string, sql.expression_type, sql.sub_version) == ("a > 3", "SQL92", 7)
    assert tag_filter(sql) is None
    with pytest.raises(SubscriptionParseError):
        build_subscription("T", "a > 3", expression_type="CLASS")


def test_tag_filter_matches_by_code_including_sign_extension() -> None:
    f = tag_filter(build_subscription("T", "TagA || polygenelubricants"))
    assert f is not None
    assert f(2598919)
    assert not f(java_string_hash("TagB"))
    assert not f(0)
    # The consume queue stores int64; a negative hash may arrive sign-extended or not.
    assert f(-2147483648)
    assert f(0x80000000)


class Recorder:
    """A parked pull's resume callback: records (offset, final, time); answers unless told to
    keep waiting for the next `keep` calls."""

    def __init__(self, keep: int = 0) -> None:
        self.calls: list[tuple[int, bool, float]] = []
        self.keep = keep

    def __call__(self, p: ParkedPull, final: bool) -> bool:
        self.calls.append((p.offset, final, trio.current_time()))
        if self.keep and not final:
            self.keep -= 1
            p.offset += 10  # as a resume that skipped filtered-out messages
            return False
        return True


async def test_long_poll_resumes_on_arrival_without_a_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lp = LongPollingService()
    start = trio.current_time()
    a, b = Recorder(), Recorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lp.run)
        assert lp.park("T", 0, 5, start + 15, a) is not None
        assert lp.park("T", 0, 9, start + 15, b) is not None
        assert lp.parked_count == 2
        await trio.sleep(1)
        assert lp.notify("T", 1, 100) == 0  # another queue
        assert lp.notify("T", 0, 5) == 0  # nothing past offset 5 yet
        assert lp.notify("T", 0, 6) == 1  # resumes the pull at 5 only, right here
        assert a.calls == [(5, False, start + 1)]
        assert lp.parked_count == 1
        await trio.sleep(2)
        assert lp.notify("T", 0, 10) == 1
        assert b.calls == [(9, False, start + 3)]
        assert lp.parked_count == 0
        await trio.sleep(20)  # the timer finds nothing left to finish
        nursery.cancel_scope.cancel()
    assert len(a.calls) == len(b.calls) == 1


async def test_long_poll_filtered_arrivals_keep_waiting_then_time_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lp = LongPollingService()
    start = trio.current_time()
    r = Recorder(keep=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lp.run)
        p = lp.park("T", 0, 0, start + 15, r)
        assert p is not None
        await trio.sleep(1)
        assert lp.notify("T", 0, 1) == 0  # resumed, moved on to offset 10, still parked
        assert lp.notify("T", 0, 10) == 0  # not past its new offset: not resumed
        assert lp.parked_count == 1
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    # The timer finished it once, at its deadline, as final.
    assert r.calls == [(0, False, start + 1), (10, True, start + 15)]
    assert p.done
    assert lp.parked_count == 0


async def test_long_poll_timer_follows_an_earlier_deadline_and_survives_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lp = LongPollingService()
    start = trio.current_time()
    late, early = Recorder(), Recorder()

    def boom(p: ParkedPull, final: bool) -> bool:
        raise RuntimeError("resume failed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lp.run)
        lp.park("T", 0, 0, start + 20, late)
        await trio.sleep(1)
        lp.park("T", 1, 0, start + 5, early)  # earlier than the timer's current wake-up
        lp.park("T", 2, 0, start + 3, boom)
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert early.calls == [(0, True, start + 5)]
    assert late.calls == [(0, True, start + 20)]
    assert lp.parked_count == 0  # the failing one left too


async def test_long_poll_is_bounded_and_wake_all_finishes_everything() -> None:
    small = LongPollingService(max_parked=1)
    r = Recorder(keep=5)
    assert small.park("T", 0, 0, 15.0, r) is not None
    assert small.park("T", 0, 0, 15.0, r) is None
    small.wake_all()
    assert [final for _o, final, _t in r.calls] == [True]
    assert small.parked_count == 0
    assert small.park("T", 0, 0, 15.0, r) is not None


async def test_pulls_answered_early_leave_no_garbage_behind() -> None:
    """Answered pulls drop their callback at once, and their heap entries go at the next
    park once they outnumber the parked ones 4:1, not at the (far) timer wake-up."""
    lp = LongPollingService()
    callbacks: list[weakref.ref[Recorder]] = []
    for i in range(5000):  # a busy queue: each pull answered by the next arrival
        r = Recorder()
        callbacks.append(weakref.ref(r))
        assert lp.park("T", 0, i, 1_000.0, r) is not None
        del r
        assert lp.notify("T", 0, i + 1) == 1
        assert len(lp._deadlines) <= max(65, 4 * lp.parked_count + 1)
    assert lp.parked_count == 0
    gc.collect()
    assert all(ref() is None for ref in callbacks)  # no request kept alive by the service
    # A pull still parked survives every compaction and is finished by its deadline.
    keep = Recorder()
    assert lp.park("T", 1, 0, 2.0, keep) is not None
    for i in range(3000):
        assert lp.park("T", 0, 10_000 + i, 1_000.0, Recorder()) is not None
        lp.notify("T", 0, 10_001 + i)
    assert lp.parked_count == 1
    assert any(p.resume is keep for p in lp._deadlines.items())
    lp.wake_all()
    assert keep.calls
    assert keep.calls[-1][1] is True

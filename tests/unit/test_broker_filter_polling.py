"""Tag filter parsing (FilterAPI rules) and long polling with a fake clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.filter import (
    SubscriptionParseError,
    build_subscription,
    java_string_hash,
    tag_filter,
)
from broker.long_polling import LongPollingService


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
    with pytest.raises(SubscriptionParseError):
        build_subscription("T", "a > 3", expression_type="SQL92")


def test_tag_filter_matches_by_code_including_sign_extension() -> None:
    f = tag_filter(build_subscription("T", "TagA || polygenelubricants"))
    assert f is not None
    assert f(2598919)
    assert not f(java_string_hash("TagB"))
    assert not f(0)
    # The consume queue stores int64; a negative hash may arrive sign-extended or not.
    assert f(-2147483648)
    assert f(0x80000000)


async def test_long_poll_wakes_on_arrival(autojump_clock: trio.testing.MockClock) -> None:
    lp = LongPollingService()
    results: list[tuple[bool, float]] = []

    async def puller(offset: int) -> None:
        p = lp.park("T", 0, offset)
        assert p is not None
        woke = await lp.wait(p, trio.current_time() + 15)
        results.append((woke, trio.current_time()))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(puller, 5)
        nursery.start_soon(puller, 9)
        await trio.testing.wait_all_tasks_blocked()
        assert lp.parked_count == 2
        await trio.sleep(1)
        assert lp.notify("T", 1, 100) == 0  # another queue
        assert lp.notify("T", 0, 5) == 0  # nothing past offset 5 yet
        assert lp.notify("T", 0, 6) == 1  # wakes the pull at 5 only
        await trio.sleep(2)
        assert lp.notify("T", 0, 10) == 1
    assert results == [(True, start + 1), (True, start + 3)]
    assert lp.parked_count == 0


async def test_long_poll_times_out(autojump_clock: trio.testing.MockClock) -> None:
    lp = LongPollingService()
    p = lp.park("T", 0, 0)
    assert p is not None
    start = trio.current_time()
    assert not await lp.wait(p, start + 15)
    assert trio.current_time() == start + 15
    assert lp.parked_count == 0
    # Bounded: a full service refuses to park.
    small = LongPollingService(max_parked=1)
    assert small.park("T", 0, 0) is not None
    assert small.park("T", 0, 0) is None

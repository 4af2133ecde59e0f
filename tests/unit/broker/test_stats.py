"""broker.stats: the minute/hour/day rings behind VIEW_BROKER_STATS_DATA, on explicit
timestamps (a hand-driven clock)."""

from __future__ import annotations

import pytest

from broker.stats import (
    BROKER_GET_NUMS,
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    SNDBCK_PUT_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    StatsManager,
    Window,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Totals:
    def __init__(self) -> None:
        self.put_count = 0
        self.get_count = 0


def _mgr(max_keys: int = 100) -> tuple[StatsManager, Clock, Totals]:
    clock = Clock()
    totals = Totals()
    return StatsManager("C1", totals, clock, max_keys=max_keys), clock, totals


def _run(mgr: StatsManager, clock: Clock, until: float, step: float = 1.0) -> None:
    """Advance the clock to `until`, ticking every `step` seconds as the controller does."""
    while clock.now < until:
        clock.now = min(clock.now + step, until)
        mgr.tick(clock.now)


def test_new_key_counts_from_its_creation() -> None:
    mgr, clock, _ = _mgr()
    assert mgr.view(TOPIC_PUT_NUMS, "T") is None
    clock.now = 1005.0
    mgr.count_put("T", 3, 300)
    mgr.count_put("T", 1, 100)
    clock.now = 1009.0
    got = mgr.view(TOPIC_PUT_NUMS, "T")
    assert got is not None
    minute, hour, day = got
    # 4 messages over the 4 s since the key appeared, in 2 puts.
    assert minute == Window(4, 1.0, 2.0)
    assert hour == day == minute
    size = mgr.view(TOPIC_PUT_SIZE, "T")
    assert size is not None
    assert size[0] == Window(400, 100.0, 200.0)


def test_minute_window_slides_hour_and_day_keep() -> None:
    mgr, clock, _ = _mgr()
    mgr.count_put("T", 60, 600)  # at 1000: the key's creation
    _run(mgr, clock, 1100.0)
    # Nothing in the last minute; the hour and the day still hold the 60.
    got = mgr.view(TOPIC_PUT_NUMS, "T")
    assert got is not None
    minute, hour, day = got
    assert minute.sum == 0
    assert minute.tps == 0.0
    assert minute.avgpt == 0.0
    assert hour == Window(60, 0.6, 60.0)
    assert day == hour
    # 30 more, 12 s after a 10 s snapshot: the minute runs from the oldest snapshot inside
    # the last 60 s (tick at 1060: at 1112 that is 1060) to now.
    clock.now = 1112.0
    mgr.count_put("T", 30, 300)
    got = mgr.view(TOPIC_PUT_NUMS, "T")
    assert got is not None
    assert got[0] == Window(30, 30 / 52, 30.0)
    assert got[1] == Window(90, 90 / 112, 45.0)


def test_hour_window_drops_older_snapshots() -> None:
    mgr, clock, _ = _mgr()
    mgr.count_put("T", 10, 10)
    _run(mgr, clock, 1000.0 + 2 * 3600, step=10.0)
    mgr.count_put("T", 5, 5)
    got = mgr.view(TOPIC_PUT_NUMS, "T")
    assert got is not None
    minute, hour, day = got
    assert minute.sum == 5
    # Hour snapshots every 600 s: the oldest inside the last hour is exactly an hour old.
    assert hour == Window(5, 5 / 3600, 5.0)
    assert day == Window(15, 15 / 7200, 7.5)


def test_day_window_after_a_day() -> None:
    mgr, clock, _ = _mgr()
    mgr.count_put("T", 7, 7)
    _run(mgr, clock, 1000.0 + 3600, step=10.0)
    mgr.count_put("T", 1, 1)
    _run(mgr, clock, 1000.0 + 86400 + 3600, step=600.0)
    got = mgr.view(TOPIC_PUT_NUMS, "T")
    assert got is not None
    # The day window starts at the hour snapshot of 1000 + 3600 (after the 7, before the 1).
    assert got[2] == Window(1, 1 / 86400, 1.0)
    assert got[1].sum == 0


def test_groups_send_back_and_broker_totals() -> None:
    mgr, clock, totals = _mgr()
    mgr.count_get("T", "G", 4, 40)
    mgr.count_get("T", "G", 2, 20)
    mgr.count_send_back("%RETRY%G", "G")
    totals.put_count, totals.get_count = 9, 6
    clock.now = 1002.0
    got = mgr.view(GROUP_GET_NUMS, "T@G")
    assert got is not None
    assert got[0] == Window(6, 3.0, 3.0)
    got = mgr.view(GROUP_GET_SIZE, "T@G")
    assert got is not None
    assert got[0] == Window(60, 30.0, 30.0)
    got = mgr.view(SNDBCK_PUT_NUMS, "%RETRY%G@G")
    assert got is not None
    assert got[0].sum == 1
    got = mgr.view(BROKER_PUT_NUMS, "C1")
    assert got is not None
    assert got[0] == Window(9, 4.5, 0.0)
    got = mgr.view(BROKER_GET_NUMS, "C1")
    assert got is not None
    assert got[0].sum == 6
    # Unknown names and keys.
    assert mgr.view("NO_SUCH_STATS", "T") is None
    assert mgr.view(GROUP_GET_NUMS, "T") is None
    assert mgr.view(BROKER_PUT_NUMS, "OtherCluster") is None
    assert mgr.view(TOPIC_PUT_NUMS, "") is None


def test_keys_are_bounded_and_idle_keys_dropped() -> None:
    mgr, clock, _ = _mgr(max_keys=2)
    for topic in ("A", "B", "C"):
        mgr.count_put(topic, 1, 1)
    assert mgr.view(TOPIC_PUT_NUMS, "C") is None
    assert len(mgr.topic_put.rows) == 2
    # A stays busy, B idles: after more than a day of hourly snapshots B is gone, which
    # makes room for a new key.
    for _ in range(26):
        _run(mgr, clock, clock.now + 3600, step=600.0)
        mgr.count_put("A", 1, 1)
    assert mgr.view(TOPIC_PUT_NUMS, "B") is None
    assert mgr.view(TOPIC_PUT_NUMS, "A") is not None
    mgr.count_put("C", 2, 2)
    got = mgr.view(TOPIC_PUT_NUMS, "C")
    assert got is not None
    assert got[0].sum == 2


def test_rings_are_bounded() -> None:
    mgr, clock, _ = _mgr()
    for _ in range(72):
        mgr.count_put("T", 1, 1)
        _run(mgr, clock, clock.now + 3600, step=10.0)
    s = mgr.topic_put.series["T"]
    # Snapshots of 4 ints: time, messages, bytes, puts.
    assert (len(s.minute), len(s.hour), len(s.day)) == (7 * 4, 7 * 4, 25 * 4)

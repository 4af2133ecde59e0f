"""A consumer's pull and consume figures (client/consumer/stats.py): the running info's
statusTable, over a minute and an hour that move in bucket steps."""

from __future__ import annotations

import pytest

from client.consumer.stats import ConsumerStats

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_figures_over_the_last_minute() -> None:
    clock = _Clock(1000.0)  # a bucket boundary: the consumer is born at the window's start
    stats = ConsumerStats(clock)
    assert stats.status("T") == {"pullRT": 0.0, "pullTPS": 0.0, "consumeRT": 0.0,
                                 "consumeOKTPS": 0.0, "consumeFailedTPS": 0.0,
                                 "consumeFailedMsgs": 0}  # fmt: skip
    stats.pulled("T", 10, 32)
    stats.pulled("T", 30, 0)  # found nothing after filtering: a round trip, no messages
    clock.now = 1005.0
    stats.consumed("T", 4, ok=30, failed=2)
    stats.consumed("T", 8, ok=0, failed=0)
    clock.now = 1020.0
    got = stats.status("T")
    assert got["pullRT"] == 20.0
    assert got["pullTPS"] == 32 / 20  # younger than the minute: divided by its age
    assert got["consumeRT"] == 6.0
    assert got["consumeOKTPS"] == 30 / 20
    assert got["consumeFailedTPS"] == 2 / 20
    assert got["consumeFailedMsgs"] == 2
    # Another topic is kept apart.
    assert stats.status("%RETRY%G")["consumeOKTPS"] == 0.0


def test_old_figures_leave_the_minute_and_failures_stay_for_the_hour() -> None:
    clock = _Clock(0.0)
    stats = ConsumerStats(clock)
    stats.consumed("T", 50, ok=600, failed=6)
    clock.now = 59.0  # the first bucket [0, 10) is still in the minute
    assert stats.status("T")["consumeOKTPS"] == pytest.approx(600 / 59)
    clock.now = 65.0
    stats.consumed("T", 10, ok=120, failed=0)
    got = stats.status("T")
    # Window [10, 65): the first bucket has left it.
    assert got["consumeOKTPS"] == pytest.approx(120 / 55)
    assert got["consumeRT"] == 10.0
    assert got["consumeFailedTPS"] == 0.0
    assert got["consumeFailedMsgs"] == 6
    clock.now = 3599.0
    assert stats.status("T")["consumeFailedMsgs"] == 6
    clock.now = 3600.0  # an hour after the first minute's bucket began
    assert stats.status("T")["consumeFailedMsgs"] == 0
    assert stats.status("T")["consumeOKTPS"] == 0.0


def test_a_long_running_consumer_keeps_only_recent_buckets() -> None:
    clock = _Clock(0.0)
    stats = ConsumerStats(clock)
    for second in range(0, 7200, 5):
        clock.now = float(second)
        stats.pulled("T", 1, 1)
        stats.consumed("T", 1, ok=1, failed=1)
    got = stats.status("T")
    assert got["pullTPS"] == pytest.approx(12 / 55)  # window [7140, 7195]: 12 pulls
    assert got["consumeFailedMsgs"] == 720
    rolling = stats._topics["T"].consume_failed_hour
    assert len(rolling._buckets) == 60
    assert len(stats._topics["T"].pull_tps._buckets) == 6

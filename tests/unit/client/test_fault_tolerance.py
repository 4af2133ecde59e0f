"""Latency fault tolerance and queue selection (RocketMQ's MQFaultStrategy)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from client.config import ClientConfig
from client.fault import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_DURATION_MS,
    FaultStrategy,
    LatencyFaultTolerance,
    compute_not_available_duration,
)
from client.message import MessageQueue
from client.route import TopicPublishInfo


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("latency", "duration"),
    [(0, 0), (49, 0), (100, 0), (549, 0), (550, 30000), (999, 30000), (1000, 60000),
     (2000, 120000), (3000, 180000), (14999, 180000), (15000, 600000), (30000, 600000)],
)  # fmt: skip
def test_duration_table(latency: int, duration: int) -> None:
    assert compute_not_available_duration(latency) == duration


def test_fault_item_availability() -> None:
    clock = Clock()
    lft = LatencyFaultTolerance(clock, random.Random(1))
    assert lft.is_available("a")
    lft.update_fault_item("a", 3000, 180000)
    assert not lft.is_available("a")
    clock.now += 179999
    assert not lft.is_available("a")
    clock.now += 1
    assert lft.is_available("a")
    lft.remove("a")
    assert lft.pick_one_at_least() is None


def test_pick_one_at_least_prefers_better_half() -> None:
    clock = Clock()
    lft = LatencyFaultTolerance(clock, random.Random(7))
    lft.update_fault_item("slow", 15000, 600000)
    lft.update_fault_item("slower", 20000, 600000)
    lft.update_fault_item("fast", 600, 30000)
    lft.update_fault_item("fast2", 700, 30000)
    picks = {lft.pick_one_at_least() for _ in range(20)}
    assert picks == {"fast", "fast2"}
    # A single item is always the answer.
    one = LatencyFaultTolerance(clock)
    one.update_fault_item("x", 1, 1000)
    assert one.pick_one_at_least() == "x"


def _info() -> TopicPublishInfo:
    qs = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(4)]
    return TopicPublishInfo("T", qs, rng=random.Random(3))


def test_round_robin_covers_every_queue() -> None:
    info = _info()
    seen = [info.select_one() for _ in range(8)]
    assert sorted(seen) == sorted(info.queues)


def test_retry_avoids_last_failed_broker() -> None:
    info = _info()
    for _ in range(20):
        assert info.select_one("a").broker_name == "b"
    strat = FaultStrategy(True, Clock())
    for _ in range(20):
        assert info.select_with_fault(strat, "b").broker_name == "a"


def test_unavailable_broker_is_skipped_until_it_recovers() -> None:
    clock = Clock()
    strat = FaultStrategy(True, clock, random.Random(5))
    info = _info()
    strat.update_fault_item("a", 100, isolation=True)  # isolation counts as 30 s latency
    assert not strat.is_available("a")
    for _ in range(20):
        assert info.select_with_fault(strat).broker_name == "b"
    clock.now += 600000
    assert {info.select_with_fault(strat).broker_name for _ in range(8)} == {"a", "b"}


def test_all_unavailable_falls_back_to_least_bad() -> None:
    clock = Clock()
    strat = FaultStrategy(True, clock, random.Random(5))
    info = _info()
    strat.update_fault_item("a", 1000, isolation=False)  # 60 s
    strat.update_fault_item("b", 15000, isolation=False)  # 600 s
    # Least bad of two = the better half, i.e. "a".
    for _ in range(10):
        mq = info.select_with_fault(strat)
        assert mq.broker_name == "a"
        assert 0 <= mq.queue_id < 4


def test_disabled_strategy_records_nothing() -> None:
    strat = FaultStrategy(False, Clock())
    strat.update_fault_item("a", 30000, isolation=True)
    assert strat.is_available("a")
    assert strat.choose_broker_order(["a", "b"], "a") == (["b"], None)


def test_configured_tables_replace_rocketmqs() -> None:
    clock = Clock()
    strat = FaultStrategy(
        True,
        clock,
        random.Random(5),
        latency_max_ms=(50, 550, 15000),
        not_available_duration_ms=(0, 1000, 8000),
    )
    assert strat.tolerance.not_available_duration(549) == 0
    assert strat.tolerance.not_available_duration(550) == 1000
    assert strat.tolerance.not_available_duration(14999) == 1000
    assert strat.tolerance.not_available_duration(30000) == 8000
    strat.update_fault_item("a", 10, isolation=True)  # isolation = 30 s latency -> 8 s
    assert not strat.is_available("a")
    clock.now += 7999
    assert not strat.is_available("a")
    clock.now += 1
    assert strat.is_available("a")
    strat.update_fault_item("a", 600, isolation=False)
    clock.now += 999
    assert not strat.is_available("a")
    clock.now += 1
    assert strat.is_available("a")


def test_client_config_fault_tables_default_to_rocketmqs_and_are_validated() -> None:
    cfg = ClientConfig(namesrv_addr="ns:1", client_ip="127.0.0.1")
    assert cfg.latency_max_ms == LATENCY_MAX_MS == (50, 100, 550, 1000, 2000, 3000, 15000)
    assert cfg.not_available_duration_ms == NOT_AVAILABLE_DURATION_MS
    assert NOT_AVAILABLE_DURATION_MS == (0, 0, 30000, 60000, 120000, 180000, 600000)
    ok = ClientConfig(
        namesrv_addr="ns:1",
        client_ip="127.0.0.1",
        latency_max_ms=[100, 100, 3000],  # type: ignore[arg-type]  # a list is accepted
        not_available_duration_ms=(0, 500, 500),
    )
    assert ok.latency_max_ms == (100, 100, 3000)
    bad = [
        ((50, 100), (0, 0, 1000), "entries"),
        ((50, 40), (0, 1000), "non-decreasing"),
        ((50, 100), (2000, 1000), "non-decreasing"),
        ((), (), "empty"),
        ((-1, 100), (0, 1000), "negative"),
    ]
    for latency, duration, what in bad:
        with pytest.raises(ValidationError, match=what):
            ClientConfig(
                namesrv_addr="ns:1",
                client_ip="127.0.0.1",
                latency_max_ms=latency,
                not_available_duration_ms=duration,
            )
        with pytest.raises(ValueError, match=what):
            LatencyFaultTolerance(latency_max_ms=latency, not_available_duration_ms=duration)

"""Latency fault tolerance (RocketMQ's `MQFaultStrategy` + `LatencyFaultToleranceImpl`).

Pure: the clock is injected. Every send records its latency per broker; a slow
or failed broker is marked unavailable for a duration from a latency table
(RocketMQ's by default, `ClientConfig.latency_max_ms` / `not_available_duration_ms`),
and queue selection skips it until then.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence

# A send slower than LATENCY_MAX[i] ms makes the broker unavailable for
# NOT_AVAILABLE_DURATION[i] ms (the largest i that applies). RocketMQ's defaults; a producer
# takes its tables from ClientConfig (latency_max_ms, not_available_duration_ms).
LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS: tuple[int, ...] = (0, 0, 30000, 60000, 120000, 180000, 600000)
# Latency charged for an isolating failure (connection refused, timeout...).
ISOLATION_LATENCY_MS = 30000


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


_NEG_INF = float("-inf")


def check_fault_tables(latency_max_ms: Sequence[int], not_available_ms: Sequence[int]) -> None:
    """Validate a latency -> not-available table pair.

    Raises:
        ValueError: empty, of different lengths, negative, or decreasing.
    """
    if not latency_max_ms:
        raise ValueError("latency_max_ms is empty")
    if len(latency_max_ms) != len(not_available_ms):
        raise ValueError(
            f"latency_max_ms has {len(latency_max_ms)} entries but not_available_duration_ms "
            f"has {len(not_available_ms)}"
        )
    for name, table in (
        ("latency_max_ms", latency_max_ms),
        ("not_available_duration_ms", not_available_ms),
    ):
        if any(v < 0 for v in table):
            raise ValueError(f"{name} has a negative entry: {tuple(table)}")
        if any(b < a for a, b in itertools.pairwise(table)):
            raise ValueError(f"{name} must be non-decreasing: {tuple(table)}")


def compute_not_available_duration(
    latency_ms: float,
    latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
    not_available_ms: Sequence[int] = NOT_AVAILABLE_DURATION_MS,
) -> int:
    """The not-available duration (ms) RocketMQ assigns to a send latency."""
    for i in range(len(latency_max_ms) - 1, -1, -1):
        if latency_ms >= latency_max_ms[i]:
            return not_available_ms[i]
    return 0


class FaultItem:
    """What is known about one broker: last latency and when it is usable again."""

    __slots__ = ("current_latency", "name", "start_timestamp")

    def __init__(self, name: str, current_latency: float, start_timestamp: float) -> None:
        self.name = name
        self.current_latency = current_latency
        self.start_timestamp = start_timestamp

    def is_available(self, now: float) -> bool:
        return now >= self.start_timestamp

    def __repr__(self) -> str:
        return (
            f"FaultItem({self.name!r}, latency={self.current_latency}, "
            f"start={self.start_timestamp})"
        )


class LatencyFaultTolerance:
    """Per-broker availability from recorded send latencies.

    Args:
        clock: current time in milliseconds (monotonic); injected for tests.
        rng: random source for `pick_one_at_least`'s shuffle.
        latency_max_ms: latency thresholds (ms), non-decreasing.
        not_available_duration_ms: the not-available duration (ms) for a latency at or over
            the threshold of the same index, non-decreasing.

    Raises:
        ValueError: the tables are invalid (see `check_fault_tables`).
    """

    def __init__(
        self,
        clock: Callable[[], float] = _monotonic_ms,
        rng: random.Random | None = None,
        *,
        latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
        not_available_duration_ms: Sequence[int] = NOT_AVAILABLE_DURATION_MS,
    ) -> None:
        check_fault_tables(latency_max_ms, not_available_duration_ms)
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_duration_ms = tuple(not_available_duration_ms)
        self._clock = clock
        self._rng = rng or random.Random()
        self._items: dict[str, FaultItem] = {}
        self._worst = itertools.count(self._rng.randrange(1 << 16))
        # The latest "available again" time set by an update with a not-available duration:
        # before it some broker may be unavailable; from it on every broker is available,
        # which selection checks first. -inf once passed (the clock is monotonic), so the
        # check needs no clock read until the next isolation. An update without a duration
        # makes its broker available from now on: it never moves this time.
        self._isolated_until = float("-inf")

    def not_available_duration(self, latency_ms: float) -> int:
        """The not-available duration (ms) this table assigns to a send latency."""
        return compute_not_available_duration(
            latency_ms, self.latency_max_ms, self.not_available_duration_ms
        )

    def update_fault_item(self, name: str, latency_ms: float, not_available_ms: float) -> None:
        """Record a latency and mark the broker unavailable for `not_available_ms`."""
        start = self._clock() + not_available_ms
        if not_available_ms > 0 and start > self._isolated_until:
            self._isolated_until = start
        item = self._items.get(name)
        if item is None:
            self._items[name] = FaultItem(name, latency_ms, start)
        else:
            item.current_latency = latency_ms
            item.start_timestamp = start

    def is_available(self, name: str) -> bool:
        item = self._items.get(name)
        return item is None or item.is_available(self._clock())

    def all_available(self) -> bool:
        """Whether every broker is available now (no per-broker lookups; a clock read only
        while some isolation may last).

        Conservative: after `remove`, or after an isolated broker's later success, it may
        say False while all are available (until the isolation's time passes).
        """
        until = self._isolated_until
        if until == _NEG_INF:
            return True
        if self._clock() >= until:
            self._isolated_until = _NEG_INF
            return True
        return False

    def remove(self, name: str) -> None:
        self._items.pop(name, None)

    def pick_one_at_least(self) -> str | None:
        """The least bad broker when none is available, RocketMQ's way.

        Items are sorted (available first, then lower latency, then earlier
        recovery) and one of the better half is chosen round robin.
        """
        if not self._items:
            return None
        now = self._clock()
        items = list(self._items.values())
        self._rng.shuffle(items)
        items.sort(
            key=lambda it: (not it.is_available(now), it.current_latency, it.start_timestamp)
        )
        half = len(items) // 2
        if half <= 0:
            return items[0].name
        return items[next(self._worst) % half].name

    def snapshot(self) -> dict[str, FaultItem]:
        return dict(self._items)


class FaultStrategy:
    """RocketMQ's `MQFaultStrategy`: latency bookkeeping plus queue choice.

    Args:
        enabled: when False, selection is plain round robin avoiding the last
            failed broker (RocketMQ's default) and nothing is recorded.
        clock: milliseconds clock (injected for tests).
        rng: random source of the least-bad-broker choice.
        latency_max_ms: see `LatencyFaultTolerance` (RocketMQ's table by default).
        not_available_duration_ms: see `LatencyFaultTolerance`.
    """

    def __init__(
        self,
        enabled: bool = True,
        clock: Callable[[], float] = _monotonic_ms,
        rng: random.Random | None = None,
        *,
        latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
        not_available_duration_ms: Sequence[int] = NOT_AVAILABLE_DURATION_MS,
    ) -> None:
        self.enabled = enabled
        self.tolerance = LatencyFaultTolerance(
            clock,
            rng,
            latency_max_ms=latency_max_ms,
            not_available_duration_ms=not_available_duration_ms,
        )
        # Latencies below this map to a zero not-available duration (the tables are
        # non-decreasing), so a normal successful send skips the table walk.
        self._zero_below = next(
            (
                lat
                for lat, na in zip(latency_max_ms, not_available_duration_ms, strict=True)
                if na > 0
            ),
            float("inf"),
        )

    def update_fault_item(self, broker_name: str, latency_ms: float, isolation: bool) -> None:
        """Record one send's outcome for `broker_name`."""
        if not self.enabled:
            return
        if not isolation and latency_ms < self._zero_below:
            self.tolerance.update_fault_item(broker_name, latency_ms, 0)
            return
        duration = self.tolerance.not_available_duration(
            ISOLATION_LATENCY_MS if isolation else latency_ms
        )
        self.tolerance.update_fault_item(broker_name, latency_ms, duration)

    def is_available(self, broker_name: str) -> bool:
        return self.tolerance.is_available(broker_name)

    def all_available(self) -> bool:
        """True when queue selection is plain round robin for a first attempt: the strategy
        is off, or no broker is isolated (see `LatencyFaultTolerance.all_available`)."""
        return not self.enabled or self.tolerance.all_available()

    def choose_broker_order(
        self, brokers: Sequence[str], last_failed: str | None
    ) -> tuple[list[str], str | None]:
        """Split `brokers` into the available ones (not `last_failed`) and a fallback.

        Returns:
            (preferred brokers in the given order, the least bad broker when
            none is preferred).
        """
        preferred = [
            b for b in brokers if b != last_failed and (not self.enabled or self.is_available(b))
        ]
        if preferred or not self.enabled:
            return preferred, None
        return [], self.tolerance.pick_one_at_least()

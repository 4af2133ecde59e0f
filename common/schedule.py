"""Delay levels (RocketMQ 4.x): the schedule topic, the default levels and their parser.

A message sent with DELAY = n > 0 is stored in `SCHEDULE_TOPIC` queue n-1 until level n's delay
has passed (`broker.schedule` delivers it; the store's recovery recomputes its consume-queue tags
code, the delivery time, from the same levels). The levels are RocketMQ's `messageDelayLevel`
string: space-separated items, each a whole number followed by a unit of s, m, h or d, level 1
first.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MESSAGE_DELAY_LEVEL",
    "SCHEDULE_TOPIC",
    "clamp_level",
    "level_delivery_ms",
    "parse_delay_levels",
]

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
"""RocketMQ's system topic holding messages sent with a delay level (queue = level - 1)."""

DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
"""RocketMQ's default `messageDelayLevel`: 18 levels, 1 s to 2 h."""

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> list[int]:
    """`"1s 5s 1m 2h"` -> delays in ms, level 1 first (empty for a blank string).

    Items are separated by any whitespace. Unlike Java's `Long.parseLong`, a sign is refused:
    a negative delay has no meaning.

    Args:
        spec: The level string, e.g. `DEFAULT_MESSAGE_DELAY_LEVEL`.

    Returns:
        The delay of each level in milliseconds.

    Raises:
        ValueError: an item is not a number followed by s, m, h or d.
    """
    out = []
    for item in spec.split():
        unit = _UNIT_MS.get(item[-1:])
        # isdecimal: exactly the strings int() reads as a plain number (no sign, no "_").
        if unit is None or not item[:-1].isdecimal():
            raise ValueError(f"bad delay level {item!r} (want e.g. 5s, 2m, 1h, 1d)")
        out.append(int(item[:-1]) * unit)
    return out


def clamp_level(level: int, levels: int) -> int:
    """A DELAY value as a level in 1..levels (0 when not delayed: level <= 0 or no levels)."""
    if level <= 0 or levels <= 0:
        return 0
    return min(level, levels)


def level_delivery_ms(store_timestamp: int, level: int, delays_ms: list[int]) -> int:
    """When a `SCHEDULE_TOPIC` record is due: its store time plus its (clamped) level's delay;
    the store time itself when the level is not a delay. This is the record's consume-queue
    tags code, which the broker writes and the store's recovery recomputes."""
    n = clamp_level(level, len(delays_ms))
    return store_timestamp + delays_ms[n - 1] if n else store_timestamp

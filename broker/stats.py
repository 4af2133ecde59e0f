"""Per-topic and per-group counts over the last minute, hour and day: what
VIEW_BROKER_STATS_DATA (315) answers, as RocketMQ's `BrokerStatsManager` names them.

The send and pull processors add to cumulative counters (one dict lookup per put or pull
answer, never per message); `tick` (the controller's once-a-second stats loop, on the event
loop) snapshots every counter into bounded rings every `MINUTE_STEP_S`, `HOUR_STEP_S` and
`DAY_STEP_S` seconds, O(keys). A window's figures are the live counter minus the oldest
snapshot still inside the window (RocketMQ uses its newest snapshot instead of the live
counter, so its figures lag by up to one step). A key's rings start at its creation with
zeros, so a new topic's first messages are counted.

Keys per table are bounded (`max_keys`); once full, puts or pulls of new keys go uncounted
here (they are still in the broker totals), and keys idle for a whole day are dropped at the
day step.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"

# RocketMQ's StatsItem: a snapshot every 10 s kept 7 deep (one minute), every 10 min kept 7
# deep (one hour), every hour kept 25 deep (one day).
MINUTE_STEP_S = 10.0
HOUR_STEP_S = 600.0
DAY_STEP_S = 3600.0
MINUTE_S = 60.0
HOUR_S = 3600.0
DAY_S = 86400.0
_MINUTE_DEPTH = 7
_HOUR_DEPTH = 7
_DAY_DEPTH = 25

MAX_KEYS = 4096


class BrokerTotals(Protocol):
    """The broker-wide message counters (broker.controller.BrokerStats)."""

    put_count: int
    get_count: int


@dataclass(frozen=True, slots=True)
class Window:
    """One window's figures (RocketMQ's StatsSnapshot): `sum` of the counter over the window,
    `tps` = sum per second, `avgpt` = sum per counted call (0.0 without calls)."""

    sum: int
    tps: float
    avgpt: float

    def to_json(self) -> dict[str, object]:
        return {"sum": self.sum, "tps": self.tps, "avgpt": self.avgpt}


def _ms(t: float) -> int:
    return round(t * 1000)


class _Series:
    """The three rings of one key. A ring is a flat int64 array of snapshots, `stride` ints
    each: time in ms, then the counter values (about 1.3 KB a key with full rings, no Python
    object per value)."""

    __slots__ = ("day", "hour", "minute")

    def __init__(self, first: list[int]) -> None:
        self.minute = array("q", first)
        self.hour = array("q", first)
        self.day = array("q", first)


def _push(ring: array[int], snap: list[int], depth: int) -> None:
    ring.extend(snap)
    if len(ring) > depth * len(snap):
        del ring[: len(snap)]


class _Table:
    """Counters of one kind: key -> [values...] and their rings."""

    __slots__ = ("max_keys", "rows", "series", "width")

    def __init__(self, width: int, max_keys: int) -> None:
        self.width = width
        self.max_keys = max_keys
        self.rows: dict[str, list[int]] = {}
        self.series: dict[str, _Series] = {}

    def new_row(self, key: str, now: float) -> list[int] | None:
        if len(self.rows) >= self.max_keys:
            return None
        row = self.rows[key] = [0] * self.width
        self.series[key] = _Series([_ms(now), *row])
        return row

    def sample(self, now: float, minute: bool, hour: bool, day: bool) -> None:
        t = _ms(now)
        for key, row in self.rows.items():
            snap = [t, *row]
            s = self.series[key]
            if minute:
                _push(s.minute, snap, _MINUTE_DEPTH)
            if hour:
                _push(s.hour, snap, _HOUR_DEPTH)
            if day:
                _push(s.day, snap, _DAY_DEPTH)

    def drop_idle(self) -> None:
        """Drop keys whose counters did not move over a full day ring."""
        stride = self.width + 1
        idle = [
            key
            for key, s in self.series.items()
            if len(s.day) == _DAY_DEPTH * stride and s.day[1:stride] == s.day[-stride + 1 :]
        ]
        for key in idle:
            del self.rows[key]
            del self.series[key]


def _window(ring: array[int], live: list[int], span: float, vi: int, ti: int) -> Window:
    """Figures from the oldest snapshot of `ring` inside `span` seconds (else its newest) to
    `live` ([time in ms, values...]); `vi` is the value's index in a snapshot, `ti` the calls'
    index (0: no calls counted)."""
    stride = len(live)
    now = live[0]
    first = len(ring) - stride
    oldest = now - _ms(span)
    for i in range(0, len(ring), stride):
        if ring[i] >= oldest:
            first = i
            break
    total = live[vi] - ring[first + vi]
    dt = (now - ring[first]) / 1000.0
    tps = total / dt if dt > 0 else 0.0
    calls = live[ti] - ring[first + ti] if ti else 0
    avgpt = total / calls if calls > 0 else 0.0
    return Window(total, tps, avgpt)


class StatsManager:
    """The counters behind VIEW_BROKER_STATS_DATA (event loop only)."""

    def __init__(
        self,
        cluster_name: str,
        totals: BrokerTotals,
        clock: Callable[[], float],
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.cluster_name = cluster_name
        self._totals = totals
        self._clock = clock
        # topic -> [messages, bytes, puts]
        self.topic_put = _Table(3, max_keys)
        # topic@group -> [messages, bytes, pull answers]
        self.group_get = _Table(3, max_keys)
        # topic@group -> [messages, send-backs]
        self.send_back = _Table(2, max_keys)
        # cluster name -> [broker puts, broker gets] (copied from `totals` when sampled)
        self.broker = _Table(2, 1)
        self._tables = (self.topic_put, self.group_get, self.send_back, self.broker)
        start = clock()
        self.broker.new_row(cluster_name, start)
        self._next_minute = start + MINUTE_STEP_S
        self._next_hour = start + HOUR_STEP_S
        self._next_day = start + DAY_STEP_S
        # name -> (table, value index in a snapshot, calls index or 0)
        self._names: dict[str, tuple[_Table, int, int]] = {
            TOPIC_PUT_NUMS: (self.topic_put, 1, 3),
            TOPIC_PUT_SIZE: (self.topic_put, 2, 3),
            GROUP_GET_NUMS: (self.group_get, 1, 3),
            GROUP_GET_SIZE: (self.group_get, 2, 3),
            SNDBCK_PUT_NUMS: (self.send_back, 1, 2),
            BROKER_PUT_NUMS: (self.broker, 1, 0),
            BROKER_GET_NUMS: (self.broker, 2, 0),
        }

    # -- counting (hot path: one lookup per put or pull answer) ------------------------------
    def count_put(self, topic: str, msgs: int, nbytes: int) -> None:
        row = self.topic_put.rows.get(topic)
        if row is None:
            row = self.topic_put.new_row(topic, self._clock())
            if row is None:
                return
        row[0] += msgs
        row[1] += nbytes
        row[2] += 1

    def count_get(self, topic: str, group: str, msgs: int, nbytes: int) -> None:
        key = f"{topic}@{group}"
        row = self.group_get.rows.get(key)
        if row is None:
            row = self.group_get.new_row(key, self._clock())
            if row is None:
                return
        row[0] += msgs
        row[1] += nbytes
        row[2] += 1

    def count_send_back(self, topic: str, group: str, msgs: int = 1) -> None:
        key = f"{topic}@{group}"
        row = self.send_back.rows.get(key)
        if row is None:
            row = self.send_back.new_row(key, self._clock())
            if row is None:
                return
        row[0] += msgs
        row[1] += 1

    # -- sampling ---------------------------------------------------------------------------
    def _copy_totals(self) -> None:
        row = self.broker.rows[self.cluster_name]
        row[0] = self._totals.put_count
        row[1] = self._totals.get_count

    def tick(self, now: float) -> None:
        """Snapshot the counters whose step is due (cheap when none is)."""
        minute = now >= self._next_minute
        hour = now >= self._next_hour
        day = now >= self._next_day
        if not (minute or hour or day):
            return
        self._copy_totals()
        for table in self._tables:
            table.sample(now, minute, hour, day)
        if minute:
            self._next_minute = max(self._next_minute + MINUTE_STEP_S, now)
        if hour:
            self._next_hour = max(self._next_hour + HOUR_STEP_S, now)
        if day:
            self._next_day = max(self._next_day + DAY_STEP_S, now)
            for table in self._tables[:3]:
                table.drop_idle()

    # -- answers ----------------------------------------------------------------------------
    def view(self, name: str, key: str) -> tuple[Window, Window, Window] | None:
        """(minute, hour, day) figures of `name` for `key`, or None when there is no such
        name or the key was never counted."""
        entry = self._names.get(name)
        if entry is None:
            return None
        table, vi, ti = entry
        if table is self.broker:
            self._copy_totals()
        row = table.rows.get(key)
        if row is None:
            return None
        s = table.series[key]
        live = [_ms(self._clock()), *row]
        return (
            _window(s.minute, live, MINUTE_S, vi, ti),
            _window(s.hour, live, HOUR_S, vi, ti),
            _window(s.day, live, DAY_S, vi, ti),
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._names)

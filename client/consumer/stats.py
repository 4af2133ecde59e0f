"""A consumer's pull and consume figures per topic: the `statusTable` of its running info
(`mqadmin consumerStatus -i`), RocketMQ's ConsumerStatsManager.

Per topic, over about the last minute: the mean pull round trip of the pulls that found
messages (ms) and the messages they brought per second, the mean listener call (ms), and the
messages consumed and failed per second; over about the last hour, the messages that failed.
A window is a ring of buckets (10 s for the minute, 1 min for the hour), so its span moves in
bucket steps, as RocketMQ's 10 s samples do; a consumer younger than the window divides by
its age. Recording is one dictionary lookup and a few additions per pull answer or listener
call."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

_MINUTE = (10.0, 6)  # bucket width (s), buckets
_HOUR = (60.0, 60)


class _Rolling:
    """Sum and count of values added over the last `slots` buckets of `width` s."""

    __slots__ = ("_born", "_buckets", "_slots", "_width")

    def __init__(self, born: float, width: float, slots: int) -> None:
        self._born = born
        self._width = width
        self._slots = slots
        # [bucket index, sum, count], oldest first, at most `slots` of them.
        self._buckets: deque[list[float]] = deque()

    def add(self, now: float, value: float, count: int = 1) -> None:
        index = now // self._width
        buckets = self._buckets
        if not buckets or buckets[-1][0] != index:
            buckets.append([index, 0.0, 0])
            while buckets[0][0] <= index - self._slots:
                buckets.popleft()
        last = buckets[-1]
        last[1] += value
        last[2] += count

    def window(self, now: float) -> tuple[float, int, float]:
        """(sum, count, seconds) over the window that ends `now`."""
        first = now // self._width - self._slots + 1
        total, count = 0.0, 0
        for index, value, n in self._buckets:
            if index >= first:
                total += value
                count += int(n)
        seconds = now - max(first * self._width, self._born)
        return total, count, seconds


class _TopicStats:
    __slots__ = ("consume_failed", "consume_failed_hour", "consume_ok", "consume_rt", "pull_rt",
                 "pull_tps")  # fmt: skip

    def __init__(self, now: float) -> None:
        self.pull_rt = _Rolling(now, *_MINUTE)
        self.pull_tps = _Rolling(now, *_MINUTE)
        self.consume_rt = _Rolling(now, *_MINUTE)
        self.consume_ok = _Rolling(now, *_MINUTE)
        self.consume_failed = _Rolling(now, *_MINUTE)
        self.consume_failed_hour = _Rolling(now, *_HOUR)


class ConsumerStats:
    """One consumer's figures; `clock` in seconds (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._topics: dict[str, _TopicStats] = {}

    def _of(self, topic: str, now: float) -> _TopicStats:
        st = self._topics.get(topic)
        if st is None:
            st = self._topics[topic] = _TopicStats(now)
        return st

    def pulled(self, topic: str, rt_ms: float, found: int) -> None:
        """A pull answered FOUND after `rt_ms`, with `found` messages (after tag filtering)."""
        now = self._clock()
        st = self._of(topic, now)
        st.pull_rt.add(now, rt_ms)
        if found:
            st.pull_tps.add(now, found)

    def consumed(self, topic: str, rt_ms: float, ok: int, failed: int) -> None:
        """A listener call took `rt_ms`; `ok` messages succeeded and `failed` did not."""
        now = self._clock()
        st = self._of(topic, now)
        st.consume_rt.add(now, rt_ms)
        if ok:
            st.consume_ok.add(now, ok)
        if failed:
            st.consume_failed.add(now, failed)
            st.consume_failed_hour.add(now, failed)

    def status(self, topic: str) -> dict[str, float | int]:
        """RocketMQ's ConsumeStatus of `topic` (zeros for a topic with nothing recorded)."""
        now = self._clock()
        st = self._topics.get(topic)
        if st is None:
            return {"pullRT": 0.0, "pullTPS": 0.0, "consumeRT": 0.0, "consumeOKTPS": 0.0,
                    "consumeFailedTPS": 0.0, "consumeFailedMsgs": 0}  # fmt: skip
        return {
            "pullRT": _mean(st.pull_rt.window(now)),
            "pullTPS": _rate(st.pull_tps.window(now)),
            "consumeRT": _mean(st.consume_rt.window(now)),
            "consumeOKTPS": _rate(st.consume_ok.window(now)),
            "consumeFailedTPS": _rate(st.consume_failed.window(now)),
            "consumeFailedMsgs": int(st.consume_failed_hour.window(now)[0]),
        }


def _mean(window: tuple[float, int, float]) -> float:
    total, count, _ = window
    return total / count if count else 0.0


def _rate(window: tuple[float, int, float]) -> float:
    total, _, seconds = window
    return total / seconds if seconds > 0 else 0.0

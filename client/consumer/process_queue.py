"""The messages pulled from one queue and not yet consumed (pure).

Ordered by queue offset. The offset a consumer may commit is the smallest
offset still in flight, or one past the largest seen when nothing is: a crash
then re-delivers what was in flight instead of losing it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from client.message import MessageExt


class ProcessQueue:
    """In-flight messages of one assigned queue plus its flow-control counters.

    Offsets are kept in a deque in ascending order next to the offset -> message dict.
    Removing messages leaves holes in the deque that are trimmed from both ends, so the
    committable offset (the first entry) and the span (last minus first) cost O(1) and
    each offset is appended and popped once: no sort or min() over everything in flight
    per consumed batch.

    Attributes:
        dropped: set when rebalance takes the queue away; pull loops stop.
        last_pull_timestamp: monotonic seconds of the last pull.
    """

    __slots__ = (
        "_msgs",
        "_order",
        "consuming",
        "dropped",
        "last_consume_timestamp",
        "last_pull_timestamp",
        "msg_count",
        "msg_size",
        "queue_offset_max",
    )

    def __init__(self) -> None:
        self._msgs: dict[int, MessageExt] = {}
        # Ascending offsets; those gone from `_msgs` may remain inside but never at either
        # end while `_msgs` is not empty.
        self._order: deque[int] = deque()
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False
        self.consuming = False
        self.last_pull_timestamp = time.monotonic()
        self.last_consume_timestamp = time.monotonic()

    def put_messages(self, msgs: Iterable[MessageExt]) -> int:
        """Add pulled messages (duplicates by offset are ignored); returns how many were new."""
        d = self._msgs
        order = self._order
        top = self.queue_offset_max
        added = 0
        size = 0
        unordered = False
        for m in msgs:
            off = m.queue_offset
            if off in d:
                continue
            d[off] = m
            added += 1
            size += len(m.body)
            if off > top:
                top = off
                order.append(off)
            else:
                unordered = True
        if unordered:  # an offset below one seen before (rare): rebuild the order
            self._order = deque(sorted(d))
        self.queue_offset_max = top
        self.msg_count += added
        self.msg_size += size
        return added

    def take(self, n: int) -> list[MessageExt]:
        """Up to `n` messages, lowest offsets first (they stay in flight until removed)."""
        d = self._msgs
        out: list[MessageExt] = []
        if n <= 0:
            return out
        for off in self._order:
            m = d.get(off)
            if m is not None:
                out.append(m)
                if len(out) >= n:
                    break
        return out

    def remove(self, msgs: Iterable[MessageExt]) -> int:
        """Mark messages consumed; returns the offset to commit (-1 if nothing was ever added).

        The result is the smallest offset still in flight, or `max + 1` when
        none is.
        """
        d = self._msgs
        pop = d.pop
        removed = 0
        size = 0
        for m in msgs:
            got = pop(m.queue_offset, None)
            if got is not None:
                removed += 1
                size += len(got.body)
        if removed:
            self.msg_count -= removed
            self.msg_size -= size
            order = self._order
            if d:
                while order[0] not in d:
                    order.popleft()
                while order[-1] not in d:
                    order.pop()
            else:
                order.clear()
            self.last_consume_timestamp = time.monotonic()
        return self.commit_offset()

    def commit_offset(self) -> int:
        """The offset that is safe to commit now (-1 if nothing was ever added)."""
        if self._msgs:
            return self._order[0]
        return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    def max_span(self) -> int:
        """Largest minus smallest offset in flight (0 when empty)."""
        if not self._msgs:
            return 0
        order = self._order
        return order[-1] - order[0]

    def clear(self) -> None:
        self._msgs.clear()
        self._order.clear()
        self.msg_count = 0
        self.msg_size = 0

    def __len__(self) -> int:
        return len(self._msgs)

    def is_empty(self) -> bool:
        return not self._msgs

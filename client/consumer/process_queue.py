"""The messages pulled from one queue and not yet consumed (pure).

Ordered by queue offset. The offset a consumer may commit is the smallest
offset still in flight, or one past the largest seen when nothing is: a crash
then re-delivers what was in flight instead of losing it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from client.message import MessageExt


class ProcessQueue:
    """In-flight messages of one assigned queue plus its flow-control counters.

    Attributes:
        dropped: set when rebalance takes the queue away; pull loops stop.
        last_pull_timestamp: monotonic seconds of the last pull.
    """

    __slots__ = (
        "_msgs",
        "_sorted_keys",
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
        self._sorted_keys: list[int] | None = []
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False
        self.consuming = False
        self.last_pull_timestamp = time.monotonic()
        self.last_consume_timestamp = time.monotonic()

    def _keys(self) -> list[int]:
        if self._sorted_keys is None:
            self._sorted_keys = sorted(self._msgs)
        return self._sorted_keys

    def put_messages(self, msgs: Iterable[MessageExt]) -> int:
        """Add pulled messages (duplicates by offset are ignored); returns how many were new."""
        added = 0
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs:
                continue
            self._msgs[off] = m
            added += 1
            self.msg_size += len(m.body)
            if off > self.queue_offset_max:
                self.queue_offset_max = off
                if self._sorted_keys is not None:
                    self._sorted_keys.append(off)
            else:
                self._sorted_keys = None
        self.msg_count += added
        return added

    def take(self, n: int) -> list[MessageExt]:
        """Up to `n` messages, lowest offsets first (they stay in flight until removed)."""
        keys = self._keys()
        return [self._msgs[k] for k in keys[:n]]

    def remove(self, msgs: Iterable[MessageExt]) -> int:
        """Mark messages consumed; returns the offset to commit (-1 if nothing was ever added).

        The result is the smallest offset still in flight, or `max + 1` when
        none is.
        """
        removed = False
        for m in msgs:
            got = self._msgs.pop(m.queue_offset, None)
            if got is not None:
                removed = True
                self.msg_count -= 1
                self.msg_size -= len(got.body)
        if removed:
            self._sorted_keys = None
            self.last_consume_timestamp = time.monotonic()
        return self.commit_offset()

    def commit_offset(self) -> int:
        """The offset that is safe to commit now (-1 if nothing was ever added)."""
        if self._msgs:
            return min(self._msgs) if self._sorted_keys is None else self._sorted_keys[0]
        return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    def max_span(self) -> int:
        """Largest minus smallest offset in flight (0 when empty)."""
        if not self._msgs:
            return 0
        keys = self._keys()
        return keys[-1] - keys[0]

    def clear(self) -> None:
        self._msgs.clear()
        self._sorted_keys = []
        self.msg_count = 0
        self.msg_size = 0

    def __len__(self) -> int:
        return len(self._msgs)

    def is_empty(self) -> bool:
        return not self._msgs

"""A heap of deadlines whose finished entries are dropped lazily, without I/O: the caller gives
the time and acts on what expired (held pulls, requests waiting for a response)."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Generic, Protocol, TypeVar

__all__ = ["COMPACT_MIN", "DeadlineHeap", "Finishable"]

# From this many entries on, the entries of finished items are dropped at once when they
# outnumber the live items 4:1 (amortised O(1) per push). Kept small so that they die before
# the garbage collector's young generation is collected, instead of being rescanned by every
# collection (docs/design-notes.md, "Deadlines that die young").
COMPACT_MIN = 64


class Finishable(Protocol):
    """An item with a deadline: `done` once finished, after which its entry is dropped."""

    done: bool


T = TypeVar("T", bound=Finishable)


class DeadlineHeap(Generic[T]):
    """Items by deadline; `next_deadline` is the earliest entry's (inf when empty)."""

    __slots__ = ("_heap", "_seq", "next_deadline")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()
        self.next_deadline = math.inf

    def __len__(self) -> int:
        """Entries held, finished ones not yet dropped included."""
        return len(self._heap)

    def items(self) -> list[T]:
        """The items of the entries held (finished ones not yet dropped included)."""
        return [entry[2] for entry in self._heap]

    def push(self, deadline: float, item: T, live: int) -> bool:
        """Hold `item` until `deadline`; `live` is how many items are not finished (for the
        compaction). True when it is now the earliest deadline (re-arm the timer)."""
        heap = self._heap
        if len(heap) > COMPACT_MIN and len(heap) > 4 * live:
            heap[:] = [e for e in heap if not e[2].done]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, next(self._seq), item))
        if deadline < self.next_deadline:
            self.next_deadline = deadline
            return True
        return False

    def expire(self, now: float) -> list[T]:
        """The unfinished items whose deadline is at or before `now`, earliest first (their
        entries removed); finished entries met on the way are dropped."""
        heap = self._heap
        expired: list[T] = []
        while heap:
            deadline, _seq, item = heap[0]
            if item.done:
                heapq.heappop(heap)
            elif deadline <= now:
                heapq.heappop(heap)
                expired.append(item)
            else:
                break
        self.next_deadline = heap[0][0] if heap else math.inf
        return expired

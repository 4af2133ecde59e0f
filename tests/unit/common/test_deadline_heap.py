"""`DeadlineHeap`: expiry against a given time, finished entries dropped lazily, compaction."""

from __future__ import annotations

import math

from common.deadlines import COMPACT_MIN, DeadlineHeap


class Item:
    def __init__(self, name: str) -> None:
        self.name = name
        self.done = False


def test_items_expire_in_deadline_order_and_finished_ones_never_come_back() -> None:
    heap: DeadlineHeap[Item] = DeadlineHeap()
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    assert heap.next_deadline == math.inf
    assert heap.push(5.0, a, 1)  # the earliest: re-arm
    assert heap.push(2.0, b, 2)
    assert not heap.push(9.0, c, 3)
    assert not heap.push(2.0, d, 4)  # a tie: both expire, in push order
    assert heap.expire(1.0) == []
    assert heap.next_deadline == 2.0
    assert heap.expire(2.0) == [b, d]
    a.done = True
    assert heap.expire(100.0) == [c]
    assert heap.next_deadline == math.inf
    assert len(heap) == 0


def test_finished_entries_are_compacted_when_they_outnumber_the_live_ones() -> None:
    heap: DeadlineHeap[Item] = DeadlineHeap()
    keep = Item("keep")
    heap.push(1_000.0, keep, 1)
    for i in range(10 * COMPACT_MIN):
        item = Item(str(i))
        heap.push(500.0 + i, item, 2)
        item.done = True
        assert len(heap) <= max(COMPACT_MIN + 1, 4 * 2 + 1)
    assert keep in heap.items()
    assert heap.expire(2_000.0) == [keep]

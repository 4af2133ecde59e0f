"""Process queue: ordering, commit offset = smallest in flight, counters."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from client.consumer.process_queue import ProcessQueue
from client.message import MessageExt


def _m(off: int, size: int = 10) -> MessageExt:
    return MessageExt("T", b"x" * size, properties={}, queue_offset=off)


def test_commit_offset_is_smallest_in_flight() -> None:
    pq = ProcessQueue()
    assert pq.commit_offset() == -1
    msgs = [_m(i) for i in range(10, 15)]
    assert pq.put_messages(msgs) == 5
    assert pq.msg_count == 5
    assert pq.msg_size == 50
    assert pq.queue_offset_max == 14
    assert pq.max_span() == 4
    # Finishing later messages first does not move the commit point.
    assert pq.remove([msgs[3], msgs[4]]) == 10
    assert pq.remove([msgs[0]]) == 11
    assert pq.remove([msgs[1], msgs[2]]) == 15
    assert pq.is_empty()
    assert pq.msg_count == 0
    assert pq.msg_size == 0


def test_duplicates_and_out_of_order_puts() -> None:
    pq = ProcessQueue()
    pq.put_messages([_m(5), _m(3)])
    assert pq.put_messages([_m(5), _m(4)]) == 1
    assert [m.queue_offset for m in pq.take(10)] == [3, 4, 5]
    assert [m.queue_offset for m in pq.take(2)] == [3, 4]
    assert len(pq) == 3
    # Removing something not in flight changes nothing.
    assert pq.remove([_m(99)]) == 3


def test_clear() -> None:
    pq = ProcessQueue()
    pq.put_messages([_m(1), _m(2)])
    pq.clear()
    assert pq.msg_count == 0
    assert pq.commit_offset() == 3


@given(
    offsets=st.lists(st.integers(0, 200), min_size=1, max_size=60, unique=True),
    order=st.randoms(use_true_random=False),
)
def test_commit_offset_never_passes_an_unconsumed_message(
    offsets: list[int], order: object
) -> None:
    assert isinstance(order, random.Random)
    pq = ProcessQueue()
    pq.put_messages([_m(o) for o in offsets])
    pending = sorted(offsets)
    done = list(offsets)
    order.shuffle(done)
    committed = -1
    for off in done:
        got = pq.remove([_m(off)])
        pending.remove(off)
        expected = pending[0] if pending else max(offsets) + 1
        assert got == expected
        # Monotonic, and never beyond the smallest message still in flight.
        assert got >= committed
        committed = got

"""Queue allocation strategies."""

from __future__ import annotations

import pytest

from client.consumer.rebalance import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
    AllocateStrategy,
    allocate,
)
from client.message import MessageQueue


def _mqs(n: int, brokers: tuple[str, ...] = ("b",)) -> list[MessageQueue]:
    return [MessageQueue("T", b, i) for b in brokers for i in range(n)]


def test_averagely_10_over_4() -> None:
    mqs = _mqs(10)
    cids = ["c0", "c1", "c2", "c3"]
    s = AllocateMessageQueueAveragely()
    shares = [allocate(s, "g", c, mqs, cids) for c in cids]
    assert [len(x) for x in shares] == [3, 3, 2, 2]
    assert shares[0] == mqs[0:3]
    assert shares[1] == mqs[3:6]
    assert shares[2] == mqs[6:8]
    assert shares[3] == mqs[8:10]


def test_averagely_more_clients_than_queues() -> None:
    mqs = _mqs(2)
    cids = ["a", "b", "c"]
    s = AllocateMessageQueueAveragely()
    assert [allocate(s, "g", c, mqs, cids) for c in cids] == [[mqs[0]], [mqs[1]], []]


def test_unknown_client_gets_nothing() -> None:
    assert allocate(AllocateMessageQueueAveragely(), "g", "zz", _mqs(4), ["a"]) == []


def test_inputs_are_sorted_first() -> None:
    mqs = _mqs(4, ("b2", "b1"))
    s = AllocateMessageQueueAveragely()
    got = allocate(s, "g", "x", list(reversed(mqs)), ["y", "x"])
    assert got == sorted(mqs)[:4]
    assert all(q.broker_name == "b1" for q in got)


def test_by_circle() -> None:
    mqs = _mqs(7)
    s = AllocateMessageQueueAveragelyByCircle()
    assert allocate(s, "g", "a", mqs, ["a", "b", "c"]) == [mqs[0], mqs[3], mqs[6]]
    assert allocate(s, "g", "c", mqs, ["a", "b", "c"]) == [mqs[2], mqs[5]]


@pytest.mark.parametrize(
    "strategy",
    [
        AllocateMessageQueueAveragely(),
        AllocateMessageQueueAveragelyByCircle(),
        AllocateMessageQueueConsistentHash(),
    ],
)
@pytest.mark.parametrize(("nq", "nc"), [(1, 1), (8, 3), (16, 5), (3, 7), (32, 4)])
def test_partition_no_overlap_no_gap(strategy: AllocateStrategy, nq: int, nc: int) -> None:
    mqs = _mqs(nq, ("b1", "b2"))
    cids = [f"192.0.2.1@{i}" for i in range(nc)]
    shares = [allocate(strategy, "g", c, mqs, cids) for c in cids]
    flat = [q for s in shares for q in s]
    assert sorted(flat) == sorted(mqs)
    assert len(flat) == len(set(flat))


def test_consistent_hash_moves_little_when_a_client_leaves() -> None:
    s = AllocateMessageQueueConsistentHash(virtual_node_count=50)
    mqs = _mqs(64)
    cids = [f"c{i}" for i in range(4)]
    before = {c: set(allocate(s, "g", c, mqs, cids)) for c in cids}
    after_cids = cids[:-1]
    after = {c: set(allocate(s, "g", c, mqs, after_cids)) for c in after_cids}
    # Survivors keep everything they had; they only gain the leaver's queues.
    for c in after_cids:
        assert before[c] <= after[c]
    with pytest.raises(ValueError):
        AllocateMessageQueueConsistentHash(0)

"""Queue allocation strategies for clustering consumers (pure).

Every consumer of a group runs the same function over the same sorted inputs
(all queues of a topic, all client ids of the group) and keeps its own share,
so the shares do not overlap once everyone sees the same membership.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Protocol

from client.message import MessageQueue


class AllocateStrategy(Protocol):
    """`allocate(group, current_cid, mq_all, cid_all) -> my queues` (inputs sorted)."""

    name: str

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]: ...


class AllocateMessageQueueAveragely:
    """Contiguous blocks; the first `n % c` clients get one extra queue (the default)."""

    name = "AVG"

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not mq_all or current_cid not in cid_all:
            return []
        idx = cid_all.index(current_cid)
        n, c = len(mq_all), len(cid_all)
        mod = n % c
        if n <= c:
            avg = 1
        elif mod > 0 and idx < mod:
            avg = n // c + 1
        else:
            avg = n // c
        start = idx * avg if (mod > 0 and idx < mod) else idx * avg + mod
        rng = min(avg, n - start)
        return [mq_all[(start + i) % n] for i in range(max(rng, 0))]


class AllocateMessageQueueAveragelyByCircle:
    """Client i takes queues i, i + c, i + 2c, ..."""

    name = "AVG_BY_CIRCLE"

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not mq_all or current_cid not in cid_all:
            return []
        idx = cid_all.index(current_cid)
        return [mq_all[i] for i in range(idx, len(mq_all), len(cid_all))]


def _md5_hash(key: str) -> int:
    """First four bytes of the MD5 digest as an unsigned number (RocketMQ's MD5Hash)."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


def _mq_key(mq: MessageQueue) -> str:
    # The text Java's MessageQueue.toString() gives, so mixed groups agree.
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


class AllocateMessageQueueConsistentHash:
    """A hash ring of clients with virtual nodes; each queue goes to the next node clockwise.

    Args:
        virtual_node_count: ring points per client (RocketMQ's default 10).
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_count: int = 10) -> None:
        if virtual_node_count <= 0:
            raise ValueError("virtual_node_count must be positive")
        self.virtual_node_count = virtual_node_count

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        if not mq_all or current_cid not in cid_all:
            return []
        ring: list[tuple[int, str]] = sorted(
            (_md5_hash(f"{cid}-{i}"), cid)
            for cid in cid_all
            for i in range(self.virtual_node_count)
        )
        points = [p for p, _ in ring]
        result = []
        for mq in mq_all:
            pos = bisect.bisect_left(points, _md5_hash(_mq_key(mq)))
            owner = ring[pos % len(ring)][1]
            if owner == current_cid:
                result.append(mq)
        return result


def allocate(
    strategy: AllocateStrategy,
    consumer_group: str,
    current_cid: str,
    mq_all: Sequence[MessageQueue],
    cid_all: Sequence[str],
) -> list[MessageQueue]:
    """Sort both inputs (as RocketMQ's rebalance does) and apply `strategy`."""
    return strategy.allocate(consumer_group, current_cid, sorted(set(mq_all)), sorted(set(cid_all)))


STRATEGIES: dict[str, type[AllocateStrategy]] = {
    "AVG": AllocateMessageQueueAveragely,
    "AVG_BY_CIRCLE": AllocateMessageQueueAveragelyByCircle,
    "CONSISTENT_HASH": AllocateMessageQueueConsistentHash,
}

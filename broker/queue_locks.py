"""Queue locks for orderly consumers (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).

A client holds a queue of a group until it unlocks it or stops renewing it for
`lock_max_live_ms` (60 s, RocketMQ's `rocketmq.broker.rebalance.lockMaxLiveTime`).
Pure bookkeeping; time is passed in for tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from remoting.protocol.bodies import MessageQueue

log = structlog.get_logger()

LOCK_MAX_LIVE_MS = 60_000


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class LockEntry:
    client_id: str
    last_update_ms: int


class QueueLockManager:
    """group -> queue -> holder."""

    def __init__(self, lock_max_live_ms: int = LOCK_MAX_LIVE_MS) -> None:
        self.lock_max_live_ms = lock_max_live_ms
        self._locks: dict[str, dict[MessageQueue, LockEntry]] = {}

    def _expired(self, entry: LockEntry, now: int) -> bool:
        return now - entry.last_update_ms > self.lock_max_live_ms

    def is_locked(
        self, group: str, mq: MessageQueue, client_id: str, now: int | None = None
    ) -> bool:
        now = _now_ms() if now is None else now
        entry = self._locks.get(group, {}).get(mq)
        return entry is not None and entry.client_id == client_id and not self._expired(entry, now)

    def try_lock_batch(
        self, group: str, mqs: Iterable[MessageQueue], client_id: str, now: int | None = None
    ) -> set[MessageQueue]:
        """Lock (or renew) what is free, expired, or already ours. Returns the queues we hold."""
        now = _now_ms() if now is None else now
        table = self._locks.setdefault(group, {})
        held: set[MessageQueue] = set()
        for mq in mqs:
            entry = table.get(mq)
            if entry is None or entry.client_id == client_id or self._expired(entry, now):
                if entry is not None and entry.client_id != client_id:
                    log.info(
                        "queue_lock_taken_over",
                        group=group,
                        queue=f"{mq.topic}:{mq.queue_id}",
                        old=entry.client_id,
                        new=client_id,
                    )
                table[mq] = LockEntry(client_id, now)
                held.add(mq)
        return held

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        table = self._locks.get(group)
        if not table:
            return
        for mq in mqs:
            entry = table.get(mq)
            if entry is not None and entry.client_id == client_id:
                del table[mq]
        if not table:
            del self._locks[group]

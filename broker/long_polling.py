"""Long polling: pulls that found nothing wait, per (topic, queue), for new messages.

A pull handler that gets nothing and may suspend calls `park`, then awaits `wait` with its
deadline. The store's arrival listener calls `notify(topic, queue_id, new_max_offset)`, which
sets the event of every parked pull on that queue whose requested offset is below the new max.
The handler then re-runs the pull without suspending. No periodic scan: each parked pull waits
on its own `trio.Event` under its own deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio


@dataclass(slots=True, eq=False)
class ParkedPull:
    """One suspended pull: woken when the queue's max offset passes `offset`."""

    topic: str
    queue_id: int
    offset: int
    event: trio.Event = field(default_factory=trio.Event)


class LongPollingService:
    """Parked pulls keyed by (topic, queue id), bounded by `max_parked`."""

    def __init__(self, max_parked: int = 100_000) -> None:
        self.max_parked = max_parked
        self._parked: dict[tuple[str, int], set[ParkedPull]] = {}
        self._count = 0

    @property
    def parked_count(self) -> int:
        return self._count

    def park(self, topic: str, queue_id: int, offset: int) -> ParkedPull | None:
        """Register a pull. None when the service is full (answer the pull at once)."""
        if self._count >= self.max_parked:
            return None
        p = ParkedPull(topic, queue_id, offset)
        self._parked.setdefault((topic, queue_id), set()).add(p)
        self._count += 1
        return p

    def unpark(self, p: ParkedPull) -> None:
        key = (p.topic, p.queue_id)
        bucket = self._parked.get(key)
        if bucket is not None and p in bucket:
            bucket.discard(p)
            self._count -= 1
            if not bucket:
                del self._parked[key]

    def notify(self, topic: str, queue_id: int, max_offset: int) -> int:
        """New messages up to `max_offset` (exclusive) on a queue: wake the pulls they satisfy.

        Returns the number of pulls woken. Safe to call from any trio task (sync, no await).
        """
        bucket = self._parked.get((topic, queue_id))
        if not bucket:
            return 0
        woken = 0
        for p in bucket:
            if max_offset > p.offset and not p.event.is_set():
                p.event.set()
                woken += 1
        return woken

    async def wait(self, p: ParkedPull, deadline: float) -> bool:
        """Wait until woken or `deadline` (trio clock). True when woken. Always unparks."""
        try:
            with trio.move_on_at(deadline):
                await p.event.wait()
            return p.event.is_set()
        finally:
            self.unpark(p)

    def wake_all(self) -> None:
        """Wake every parked pull (shutdown)."""
        for bucket in self._parked.values():
            for p in bucket:
                p.event.set()

"""Long polling: pulls that found nothing wait, per (topic, queue), for new messages.

A pull processor that gets nothing and may suspend `park`s the pull with its deadline and a
`resume` callback, and answers later through its `Responder`: no task, no event and no cancel
scope per held pull. The store's arrival listener calls `notify(topic, queue_id,
new_max_offset)` once new records are written (for a run of sends, when the run's write is
done: `MessageStore.end_staging`); it calls `resume(pull, final=False)` for every parked pull
on that queue whose offset is below the new max. `resume` reads the
queue again and either answers (returns True: the pull leaves) or, when the new messages did
not match its filter, moves its `offset` past them and keeps waiting (returns False). One
timer task (`run`) calls `resume(pull, final=True)` for the pulls whose deadline passed; a
final resume always answers. `wake_all` finishes every parked pull the same way (shutdown).

Answering from the arrival saves a task switch per pull, and the answer leaves before the
producer's own answers of that run: a message's end-to-end latency is the sum of these hops
(docs/design-notes.md, "Held pulls answered when the run ends").
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio

from common.deadlines import DeadlineHeap

__all__ = ["LongPollingService", "ParkedPull"]

log = structlog.get_logger()

Resume = Callable[["ParkedPull", bool], bool]


def _left(_pull: ParkedPull, _final: bool) -> bool:
    """The `resume` of a pull that left: its heap entry may outlive it, its callback not."""
    return True


class ParkedPull:
    """One suspended pull: resumed when its queue's max offset passes `offset`.

    Attributes:
        topic, queue_id: Its queue.
        offset: The queue offset it waits beyond (moved on by a resume that found only
            messages its filter skips).
        deadline: When the timer finishes it (trio clock).
        resume: ``resume(pull, final) -> done`` (see the module docstring).
        done: True once it left the service.
    """

    __slots__ = ("deadline", "done", "offset", "queue_id", "resume", "topic")

    def __init__(
        self, topic: str, queue_id: int, offset: int, deadline: float, resume: Resume
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.deadline = deadline
        self.resume = resume
        self.done = False

    def __repr__(self) -> str:
        return (
            f"ParkedPull({self.topic}:{self.queue_id} offset={self.offset}"
            f" deadline={self.deadline:.3f} done={self.done})"
        )


class LongPollingService:
    """Parked pulls keyed by (topic, queue id), bounded by `max_parked`; `run` is its timer."""

    def __init__(self, max_parked: int = 100_000) -> None:
        self.max_parked = max_parked
        self._parked: dict[tuple[str, int], dict[ParkedPull, None]] = {}
        self._count = 0
        # (deadline, seq, pull); entries of pulls already done are dropped when they surface.
        # The parked pulls by deadline. Pulls that left are dropped lazily, and all at once
        # when they outnumber the parked ones (`DeadlineHeap.push`): here, at a park, and not
        # in the timer, which sleeps until the earliest deadline (the suspend timeout, ~15 s)
        # while a busy queue would pile up entries for every garbage collection to scan.
        self._deadlines: DeadlineHeap[ParkedPull] = DeadlineHeap()
        self._kick = trio.Event()

    @property
    def parked_count(self) -> int:
        return self._count

    def park(
        self, topic: str, queue_id: int, offset: int, deadline: float, resume: Resume
    ) -> ParkedPull | None:
        """Hold a pull until `notify` passes `offset` or `deadline`. None when the service is
        full (answer the pull at once)."""
        if self._count >= self.max_parked:
            return None
        p = ParkedPull(topic, queue_id, offset, deadline, resume)
        bucket = self._parked.get((topic, queue_id))
        if bucket is None:
            bucket = self._parked[(topic, queue_id)] = {}
        bucket[p] = None
        self._count += 1
        if self._deadlines.push(deadline, p, self._count):
            self._kick.set()
        return p

    def unpark(self, p: ParkedPull) -> None:
        """Remove `p` (no resume). Its heap entry goes when it surfaces or at the next
        compaction; the callback (and the request it holds) goes now."""
        if p.done:
            return
        p.done = True
        p.resume = _left
        self._count -= 1
        key = (p.topic, p.queue_id)
        bucket = self._parked.get(key)
        if bucket is not None:
            bucket.pop(p, None)
            if not bucket:
                del self._parked[key]

    def _resume(self, p: ParkedPull, final: bool) -> bool:
        """Call `p.resume`; a failing callback finishes the pull (it answered or never will)."""
        try:
            done = p.resume(p, final) or final
        except Exception:
            log.exception("long_poll_resume_failed", topic=p.topic, queue_id=p.queue_id)
            done = True
        if done:
            self.unpark(p)
        return done

    def notify(self, topic: str, queue_id: int, max_offset: int) -> int:
        """New messages up to `max_offset` (exclusive) on a queue: resume the pulls waiting
        below it. Returns how many of them were answered. Sync: called by the store's arrival
        listener."""
        bucket = self._parked.get((topic, queue_id))
        if not bucket:
            return 0
        answered = 0
        for p in [p for p in bucket if max_offset > p.offset]:
            if not p.done and self._resume(p, False):
                answered += 1
        return answered

    def wake_all(self) -> None:
        """Finish every parked pull now (shutdown): each answers with what its queue has."""
        for bucket in list(self._parked.values()):
            for p in list(bucket):
                if not p.done:
                    self._resume(p, True)

    async def run(self) -> None:
        """The timer: finish the pulls whose deadline passed. Runs until cancelled."""
        deadlines = self._deadlines
        while True:
            for p in deadlines.expire(trio.current_time()):
                if not p.done:  # an earlier one's resume may have finished it
                    self._resume(p, True)
            if self._kick.is_set():
                self._kick = trio.Event()
            with trio.move_on_at(deadlines.next_deadline):
                await self._kick.wait()

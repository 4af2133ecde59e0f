"""Dispatch: every appended (or recovered) record reaches its consume queue and the index, then
the arrival listeners hear (topic, queue id, new max offset).

Appends dispatch in the calling task right after writing, so there is no reput lag; recovery
re-dispatches scanned records through the same path (consume queues and index skip what they
already hold). Within a run of sends (`MessageStore.begin_staging`) the index keeps the
records and indexes them when the run ends (`IndexService.deferring`), and the arrivals are
held (`holding`) and told once the run's records are written (`release_arrivals`): a
listener never reads a record that is only staged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from common.message import PROPERTY_DELAY, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, DispatchRequest
from common.schedule import SCHEDULE_TOPIC, level_delivery_ms
from store.commitlog import DispatchBatch, is_not_queued
from store.consume_queue import ConsumeQueue
from store.index_file import IndexService

__all__ = ["ArrivalListener", "Dispatcher"]

log = structlog.get_logger()

ArrivalListener = Callable[[str, int, int], None]


class Dispatcher:
    """Consume queues by (topic, queue id), the index, and the arrival listeners.

    Args:
        root: Store root (consume queues live under it).
        cq_file_size: Consume-queue file size.
        index: The index service, or None when indexing is off.
        delay_levels_ms: Delay of each level (for SCHEDULE_TOPIC_XXXX tags codes on recovery).
        keep_free: Bytes a new consume-queue file must leave free (see `MappedFile`).
    """

    def __init__(
        self,
        root: Path,
        cq_file_size: int,
        index: IndexService | None,
        delay_levels_ms: list[int],
        *,
        keep_free: int = 0,
    ) -> None:
        self._root = root
        self._keep_free = keep_free
        self._cq_file_size = cq_file_size
        self.index = index
        self.consume_queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.listeners: list[ArrivalListener] = []
        self._delays = delay_levels_ms
        # While True, arrivals are kept here (queue -> new max offset) instead of told.
        self.holding = False
        self._held: dict[tuple[str, int], int] = {}

    def find_cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The consume queue, if it exists."""
        return self.consume_queues.get((topic, queue_id))

    def get_cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The consume queue, created empty when missing."""
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None:
            cq = ConsumeQueue(
                self._root, topic, queue_id, self._cq_file_size, keep_free=self._keep_free
            )
            self.consume_queues[key] = cq
        return cq

    def dispatch(self, req: DispatchRequest | DispatchBatch, *, notify: bool = True) -> None:
        """Put `req` in its consume queue (unless it is a transaction PREPARED/ROLLBACK record)
        and in the index; tell listeners.

        A `DispatchBatch` is dispatched as a whole: its units in one write, its index entries
        in one loop, and the listeners told once, with the new max offset after the batch.
        """
        if isinstance(req, DispatchBatch):
            self._dispatch_batch(req, notify)
            return
        if not is_not_queued(req.sys_flag):
            cq = self.get_cq(req.topic, req.queue_id)
            if (
                cq.put(req.commit_log_offset, req.size, req.tags_code, req.queue_offset)
                and notify
                and self.listeners
            ):
                self._notify(req.topic, req.queue_id, cq.max_offset_in_queue)
        if self.index is not None:
            self.index.build_index(req)

    def _dispatch_batch(self, batch: DispatchBatch, notify: bool) -> None:
        msgs = batch.msgs
        first = msgs[0]
        topic = first.topic
        queue_id = first.queue_id
        cq = self.consume_queues.get((topic, queue_id))
        if cq is None:
            cq = self.get_cq(topic, queue_id)
        phys = batch.commit_log_offsets
        if (
            cq.put_batch(batch.first_queue_offset, phys, batch.sizes, [m.tags_code for m in msgs])
            and notify
            and self.listeners
        ):
            self._notify(topic, queue_id, cq.max_offset_in_queue)
        index = self.index
        if index is not None:
            props = [m.properties for m in msgs]
            index.build_index_batch(
                topic,
                phys,
                [p.get(PROPERTY_UNIQ_KEY) for p in props],
                [p.get(PROPERTY_KEYS) for p in props],
                batch.store_timestamp,
            )

    def release_arrivals(self) -> None:
        """Stop holding arrivals and tell the held ones (each queue once, its latest max)."""
        self.holding = False
        held = self._held
        if held:
            self._held = {}
            for (topic, queue_id), new_max in held.items():
                self._notify(topic, queue_id, new_max)

    def drop_arrivals(self) -> None:
        """Stop holding arrivals and forget the held ones (their records were not written)."""
        self.holding = False
        self._held = {}

    def _notify(self, topic: str, queue_id: int, new_max: int) -> None:
        if self.holding:
            self._held[(topic, queue_id)] = new_max
            return
        for listener in self.listeners:
            try:
                listener(topic, queue_id, new_max)
            except Exception:
                log.exception("arrival_listener_failed", topic=topic)

    def recovered(self, req: DispatchRequest) -> None:
        """Dispatch a record found by recovery (schedule-topic tags code recomputed)."""
        if req.topic == SCHEDULE_TOPIC:
            req = req._replace(tags_code=self._delivery_time(req))
        self.dispatch(req, notify=False)

    def replicated(self, req: DispatchRequest) -> None:
        """Dispatch a record a master sent (`MessageStore.append_replica`): as `recovered`
        (the schedule-topic tags code is the delivery time, computed as the master's recovery
        would), and the listeners are told, so long polls and delay timers wake on a slave."""
        if req.topic == SCHEDULE_TOPIC:
            req = req._replace(tags_code=self._delivery_time(req))
        self.dispatch(req)

    def _delivery_time(self, req: DispatchRequest) -> int:
        props = req.properties or {}
        try:
            level = int(props.get(PROPERTY_DELAY, "0"))
        except ValueError:
            level = 0
        return level_delivery_ms(req.store_timestamp, level, self._delays)

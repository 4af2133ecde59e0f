"""Delayed delivery: RocketMQ delay levels and trimq's exact delivery timestamps.

Delay levels (RocketMQ 4.x): a message with DELAY = n > 0 is stored in `SCHEDULE_TOPIC_XXXX`
queue n-1 (levels above the maximum are clamped) with REAL_TOPIC / REAL_QID saved and its
delivery time (store timestamp + level delay) as the consume-queue tags code. One task per level
walks its queue in order (within a level, store order is delivery order) and, once the head is
due, writes a new record on the real topic with REAL_* and DELAY cleared. The next offset to
deliver per level is kept in `config/delayOffset.json` (`{"offsetTable":{"1":n,...}}`, RocketMQ's
shape), written after every delivered batch, so a killed broker re-delivers at most one batch.

Exact timestamps (beyond 4.x): the property `TIMER_DELIVER_MS` (absolute epoch ms, what the
RocketMQ 5 clients' `setDeliverTimeMs` sends; `__STARTDELIVERTIME` (4.x ONS clients),
`TIMER_DELAY_MS` and `TIMER_DELAY_SEC` (relative) are accepted and normalised to it) stores the
message in `rmq_sys_trimq_timer` queue 0 with tags code = delivery time, up to
`max_delay_timestamp_ahead_ms` (7 days) ahead. Messages there arrive out of delivery order, so the
service keeps a heap keyed by delivery time of every not-yet-delivered message, sleeping until
the head is due (woken early when a sooner message arrives). Durable state:
- `config/timerOffset.json` `{"deliveredOffset": W}`: every queue offset below W is delivered;
- `config/timerDelivered.marks`: int64 (big-endian) queue offsets >= W already delivered,
  appended after each batch and rewritten when W moves.
At start the heap is rebuilt by reading the queue from W to its end, skipping marked offsets.

Retention: the store deletes commitlog files older than `file_reserved_hours`, but a timer
message may be due days later. Every undelivered timer record whose store time is older than
half the retention is re-appended to the timer queue (same properties and delivery time, plus
`TRIMQ_TIMER_ORIGIN` = the old record's queue offset) and the old entry is then marked delivered,
so an undelivered timer message always has a record younger than the retention age. A crash
between the two leaves both records; the restart's scan drops the older one when it meets the
newer one's origin (see `_timer_load`), so the message is delivered once.

Time is wall-clock epoch ms (store timestamps are); `now_ms` is injectable for tests.
"""

from __future__ import annotations

import heapq
import os
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import trio

from broker._persist import CONFIG_DIR, read_json_file, write_atomically
from broker.commit import Put
from broker.topic_manager import TIMER_TOPIC
from common.message import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    MessageDecodeError,
    MessageExt,
    MessageInner,
    decode_record,
)
from common.schedule import SCHEDULE_TOPIC, clamp_level
from remoting.protocol.bodies import dumps
from store.results import GetMessageStatus

if TYPE_CHECKING:
    from store import MessageStore

log = structlog.get_logger()

SCHEDULE_GROUP = "SCHEDULE_SERVICE"  # statistics label of the service's reads

PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
# On a timer record re-appended before retention could delete the original: the queue offset of
# the record it replaces (never on a delivered message).
PROPERTY_TIMER_ORIGIN = "TRIMQ_TIMER_ORIGIN"
TIMER_PROPERTIES = (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
)

DELAY_OFFSET_FILE = "delayOffset.json"
TIMER_OFFSET_FILE = "timerOffset.json"
TIMER_MARKS_FILE = "timerDelivered.marks"

BATCH = 32
_READ_BYTES = 4 * 1024 * 1024
_RETRY_AFTER_S = 1.0
_MARK = struct.Struct(">q")
_REFRESH_EVERY_MAX_MS = 3_600_000  # re-append check period: retention / 8, at most one hour
_REFRESH_EVERY_MIN_MS = 100


def wall_ms() -> int:
    return int(time.time() * 1000)


# -- pure helpers -------------------------------------------------------------------------------
def exact_delivery_ms(props: Mapping[str, str], now_ms: int) -> int | None:
    """The exact delivery time a message asks for, or None when it asks for none.

    Raises:
        ValueError: the property is not an integer.
    """
    for name in TIMER_PROPERTIES:
        raw = props.get(name)
        if raw is None or raw == "":
            continue
        value = int(raw)
        if name == PROPERTY_TIMER_DELAY_MS:
            return now_ms + value
        if name == PROPERTY_TIMER_DELAY_SEC:
            return now_ms + value * 1000
        return value
    return None


def strip_timer_properties(props: dict[str, str]) -> None:
    for name in TIMER_PROPERTIES:
        props.pop(name, None)
    props.pop(PROPERTY_TIMER_ORIGIN, None)


def real_message(ext: MessageExt, store_host: tuple[str, int]) -> MessageInner:
    """The record to write on the real topic for a delayed (or half) record `ext`:
    topic/queue from REAL_TOPIC/REAL_QID, those and the delay properties removed."""
    msg = ext.to_inner()
    props = msg.properties
    msg.topic = props.pop(PROPERTY_REAL_TOPIC, ext.topic)
    try:
        msg.queue_id = int(props.pop(PROPERTY_REAL_QID, str(ext.queue_id)))
    except ValueError:
        msg.queue_id = 0
    props.pop(PROPERTY_DELAY, None)
    strip_timer_properties(props)
    msg.properties_string = None
    msg.store_host = store_host
    return msg


class _Wakeup:
    """A re-armable event: `set()` from sync code, `wait()` returns once per set."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class ScheduleService:
    """Delay-level and exact-timestamp delivery over a `MessageStore`.

    Args:
        store_dir: the broker's store directory (state files go to `config/` under it).
        delays_ms: delay of each level, level 1 first.
        store_host: the broker's (ip, port) for records it writes.
        now_ms: wall clock in epoch ms (tests pass one built on trio's clock).
    """

    def __init__(
        self,
        store_dir: Path,
        delays_ms: list[int],
        store_host: Callable[[], tuple[str, int]],
        *,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.delays_ms = delays_ms
        self.levels = len(delays_ms)
        self.path = store_dir / CONFIG_DIR / DELAY_OFFSET_FILE
        self.timer_path = store_dir / CONFIG_DIR / TIMER_OFFSET_FILE
        self.marks_path = store_dir / CONFIG_DIR / TIMER_MARKS_FILE
        self.now_ms = now_ms
        self._store_host = store_host
        self.offsets: dict[int, int] = {}
        self.dirty = False
        self.delivered = 0
        self._store: MessageStore | None = None
        self._append: Put | None = None
        self._level_wakeups = [_Wakeup() for _ in range(self.levels)]
        self._persist_wakeup = _Wakeup()
        self._persist_lock = trio.Lock()  # one writer at a time (they share the .tmp files)
        # Exact-timestamp state.
        self.timer_delivered_offset = 0
        self._timer_marks: set[int] = set()  # delivered offsets >= timer_delivered_offset
        self._timer_pending_marks: list[int] = []
        self._timer_marks_rewrite = False
        # (due, queue offset, phy offset, size, store timestamp) of every undelivered record.
        self._timer_heap: list[tuple[int, int, int, int, int]] = []
        # Heap entries replaced by a re-appended record (already marked delivered): skipped
        # when they reach the head, removed at the next re-append round.
        self._timer_dropped: set[int] = set()
        self._timer_refresh_age_ms = 0  # 0: no re-appending (set by `run` from the store)
        self._timer_refresh_every_ms = _REFRESH_EVERY_MAX_MS
        self._timer_next_refresh_ms = 0
        self.timer_refreshed = 0  # timer records re-appended so far
        self._timer_scan_offset = 0
        self._timer_wakeup = _Wakeup()
        self._timer_state_dirty = False
        self.timer_lateness_ms: list[int] = []  # recent delivery lateness (bounded)

    # -- persistence ---------------------------------------------------------------------------
    def load(self) -> None:
        """Read delayOffset.json, timerOffset.json and the marks file (blocking: small files)."""
        raw = read_json_file(self.path)
        if isinstance(raw, dict):
            for key, value in (raw.get("offsetTable") or {}).items():
                try:
                    self.offsets[int(key)] = int(value)
                except (TypeError, ValueError):
                    log.warning("delay_offset_skipped", level=key)
        raw = read_json_file(self.timer_path)
        if isinstance(raw, dict):
            try:
                self.timer_delivered_offset = int(raw.get("deliveredOffset", 0))
            except (TypeError, ValueError):
                log.warning("timer_offset_unreadable", path=str(self.timer_path))
        try:
            data = self.marks_path.read_bytes()
        except FileNotFoundError:
            data = b""
        usable = len(data) - len(data) % _MARK.size  # a torn last mark is ignored
        for (off,) in _MARK.iter_unpack(data[:usable]):
            if off >= self.timer_delivered_offset:
                self._timer_marks.add(off)

    def encode(self) -> bytes:
        return dumps({"offsetTable": {str(k): v for k, v in sorted(self.offsets.items())}})

    def snapshot(self) -> bytes:
        """delayOffset.json contents now; clears `dirty`."""
        self.dirty = False
        return self.encode()

    def _write_timer_state(
        self, offset: int | None, rewrite: list[int] | None, append: list[int]
    ) -> None:
        # Blocking file work (runs in a worker thread).
        if offset is not None:
            write_atomically(self.timer_path, dumps({"deliveredOffset": offset}))
        if rewrite is not None:
            write_atomically(self.marks_path, b"".join(_MARK.pack(o) for o in sorted(rewrite)))
        elif append:
            self.marks_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.marks_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, b"".join(_MARK.pack(o) for o in append))
            finally:
                os.close(fd)

    async def persist(self) -> None:
        """Write whatever changed (delay offsets, timer watermark and marks) in a worker thread."""
        async with self._persist_lock:
            await self._persist()

    async def _persist(self) -> None:
        if self.dirty:
            data = self.snapshot()
            try:
                await trio.to_thread.run_sync(write_atomically, self.path, data)
            except BaseException:
                self.dirty = True
                raise
        if self._timer_state_dirty or self._timer_pending_marks:
            offset = self.timer_delivered_offset if self._timer_state_dirty else None
            rewrite = sorted(self._timer_marks) if self._timer_marks_rewrite else None
            append = self._timer_pending_marks
            self._timer_pending_marks = []
            self._timer_state_dirty = False
            self._timer_marks_rewrite = False
            try:
                await trio.to_thread.run_sync(self._write_timer_state, offset, rewrite, append)
            except BaseException:
                self._timer_pending_marks[:0] = append
                self._timer_state_dirty = True
                self._timer_marks_rewrite = rewrite is not None
                raise

    async def _persist_loop(self) -> None:
        while True:
            await self._persist_wakeup.wait()
            self._persist_wakeup.clear()
            try:
                await self.persist()
            except OSError as exc:
                log.error("delay_state_persist_failed", error=str(exc))  # noqa: TRY400
                await trio.sleep(_RETRY_AFTER_S)
                self._persist_wakeup.set()

    # -- routing (send path) -------------------------------------------------------------------
    def route_delay(self, msg: MessageInner) -> None:
        """DELAY > 0: move `msg` to its SCHEDULE_TOPIC_XXXX queue (caller re-encodes props)."""
        try:
            level = int(msg.properties.get(PROPERTY_DELAY, "0"))
        except ValueError:
            return
        level = clamp_level(level, self.levels)
        if level == 0:
            return
        msg.properties[PROPERTY_DELAY] = str(level)
        msg.properties[PROPERTY_REAL_TOPIC] = msg.topic
        msg.properties[PROPERTY_REAL_QID] = str(msg.queue_id)
        msg.topic = SCHEDULE_TOPIC
        msg.queue_id = level - 1
        msg.tags_code = self.now_ms() + self.delays_ms[level - 1]
        msg.properties_string = None

    def route_timer(self, msg: MessageInner, deliver_ms: int) -> None:
        """Move `msg` to the timer topic, to be delivered at `deliver_ms`."""
        props = msg.properties
        strip_timer_properties(props)
        props.pop(PROPERTY_DELAY, None)
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
        props[PROPERTY_REAL_TOPIC] = msg.topic
        props[PROPERTY_REAL_QID] = str(msg.queue_id)
        msg.topic = TIMER_TOPIC
        msg.queue_id = 0
        msg.tags_code = deliver_ms
        msg.properties_string = None

    # -- service ---------------------------------------------------------------------------
    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store arrival listener: wake the level or timer task."""
        if topic == SCHEDULE_TOPIC and 0 <= queue_id < self.levels:
            self._level_wakeups[queue_id].set()
        elif topic == TIMER_TOPIC:
            self._timer_wakeup.set()

    async def run(
        self,
        store: MessageStore,
        put: Put,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Deliver until cancelled (`store.add_arrival_listener(self.on_arrival)` first); `put`
        appends (the broker's `CommitBatcher.put`), `store` is read."""
        self._store = store
        self._append = put
        # Half the retention: a record is re-appended while its commitlog file (whose age is
        # its mtime, at or after the store time of the records it holds) still has at least
        # half the retention to live. Delay levels need none of this: RocketMQ's longest is 2 h,
        # far below the 72 h retention (a custom level near the retention would need it).
        reserved_ms = int(store.config.file_reserved_hours * 3_600_000)
        if reserved_ms > 0:
            self._timer_refresh_age_ms = reserved_ms // 2
            self._timer_refresh_every_ms = max(
                _REFRESH_EVERY_MIN_MS, min(_REFRESH_EVERY_MAX_MS, reserved_ms // 8)
            )
        else:
            log.warning("timer_refresh_disabled", reason="file_reserved_hours is 0")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._persist_loop)
            for level in range(1, self.levels + 1):
                nursery.start_soon(self._level_loop, level)
            nursery.start_soon(self._timer_loop)
            task_status.started()

    async def _put(self, msg: MessageInner) -> bool:
        assert self._append is not None
        result = await self._append((msg,))
        if not result.ok:
            log.warning("scheduled_delivery_failed", topic=msg.topic, status=result.status.name)
            return False
        self.delivered += 1
        return True

    async def _level_loop(self, level: int) -> None:
        store = self._store
        assert store is not None
        qid = level - 1
        wakeup = self._level_wakeups[qid]
        delay = self.delays_ms[qid]
        while True:
            wakeup.clear()
            offset = self.offsets.get(level, 0)
            res = await store.get_message(
                SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, offset, BATCH, _READ_BYTES
            )
            if res.status is not GetMessageStatus.FOUND:
                if res.status in (
                    GetMessageStatus.OFFSET_TOO_SMALL,
                    GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                    GetMessageStatus.OFFSET_FOUND_NULL,
                ) or (
                    res.status is GetMessageStatus.MESSAGE_WAS_REMOVING
                    and res.next_begin_offset > offset
                ):
                    log.warning(
                        "delay_offset_corrected",
                        level=level,
                        offset=offset,
                        next=res.next_begin_offset,
                        status=res.status.name,
                    )
                    self._set_level_offset(level, res.next_begin_offset)
                    continue
                await wakeup.wait()
                continue
            progressed = False
            wait_ms = 0
            for buf, qoff in zip(res.buffers, res.queue_offsets, strict=True):
                try:
                    ext = decode_record(buf)
                except MessageDecodeError:
                    log.exception("delay_record_undecodable", level=level, offset=qoff)
                    self._set_level_offset(level, qoff + 1)
                    progressed = True
                    continue
                due = ext.store_timestamp + delay
                now = self.now_ms()
                if due > now:
                    wait_ms = due - now
                    break
                if not await self._put(real_message(ext, self._store_host())):
                    wait_ms = int(_RETRY_AFTER_S * 1000)
                    break
                self._set_level_offset(level, qoff + 1)
                progressed = True
            else:
                if res.next_begin_offset > self.offsets.get(level, 0):
                    self._set_level_offset(level, res.next_begin_offset)
            if progressed:
                self._persist_wakeup.set()
            if wait_ms > 0:
                await trio.sleep(wait_ms / 1000)

    def _set_level_offset(self, level: int, offset: int) -> None:
        if self.offsets.get(level) != offset:
            self.offsets[level] = offset
            self.dirty = True

    # -- exact timestamps ----------------------------------------------------------------------
    async def _timer_load(self) -> None:
        """Read timer-queue units from the scan offset to the end into the heap."""
        store = self._store
        assert store is not None
        while True:
            offset = self._timer_scan_offset
            res = await store.get_message(
                SCHEDULE_GROUP, TIMER_TOPIC, 0, offset, BATCH, _READ_BYTES
            )
            if res.status is not GetMessageStatus.FOUND:
                if res.next_begin_offset > offset and res.status in (
                    GetMessageStatus.OFFSET_TOO_SMALL,
                    GetMessageStatus.OFFSET_FOUND_NULL,
                    GetMessageStatus.MESSAGE_WAS_REMOVING,
                ):
                    # Records gone (retention): nothing to deliver below the new start.
                    for off in range(offset, res.next_begin_offset):
                        self._timer_done(off)
                    self._timer_scan_offset = res.next_begin_offset
                    continue
                return
            for buf, qoff in zip(res.buffers, res.queue_offsets, strict=True):
                for skipped in range(self._timer_scan_offset, qoff):
                    self._timer_done(skipped)  # units whose record was unreadable
                self._timer_scan_offset = qoff + 1
                if qoff < self.timer_delivered_offset or qoff in self._timer_marks:
                    continue
                try:
                    ext = decode_record(buf, read_body=False)
                    due = int(ext.properties.get(PROPERTY_TIMER_DELIVER_MS, "0"))
                    origin = int(ext.properties.get(PROPERTY_TIMER_ORIGIN, "-1"))
                except (MessageDecodeError, ValueError):
                    log.exception("timer_record_undecodable", offset=qoff)
                    self._timer_done(qoff)
                    continue
                if 0 <= origin < qoff and self._timer_is_pending(origin):
                    # A re-appended copy whose original was never marked delivered (a crash
                    # came between the append and the mark): keep only the copy.
                    log.info("timer_record_superseded", offset=origin, by=qoff)
                    self._timer_drop(origin)
                heapq.heappush(
                    self._timer_heap,
                    (due, qoff, ext.commit_log_offset, ext.store_size, ext.store_timestamp),
                )
            if res.next_begin_offset > self._timer_scan_offset:
                for skipped in range(self._timer_scan_offset, res.next_begin_offset):
                    self._timer_done(skipped)
                self._timer_scan_offset = res.next_begin_offset
            await trio.lowlevel.checkpoint()

    def _timer_is_pending(self, qoff: int) -> bool:
        """Whether `qoff` was scanned into the heap and is neither delivered nor replaced."""
        return (
            self.timer_delivered_offset <= qoff < self._timer_scan_offset
            and qoff not in self._timer_marks
        )

    def _timer_drop(self, qoff: int) -> None:
        """A heap entry replaced by a re-appended record: mark it and skip it in the heap."""
        self._timer_done(qoff)
        self._timer_dropped.add(qoff)

    def _timer_done(self, qoff: int) -> None:
        """Record `qoff` as delivered; advance the watermark over a delivered prefix."""
        if qoff < self.timer_delivered_offset or qoff in self._timer_marks:
            return
        self._timer_marks.add(qoff)
        self._timer_pending_marks.append(qoff)
        moved = False
        while self.timer_delivered_offset in self._timer_marks:
            self._timer_marks.discard(self.timer_delivered_offset)
            self.timer_delivered_offset += 1
            moved = True
        if moved:
            self._timer_state_dirty = True
            self._timer_marks_rewrite = True

    async def _timer_loop(self) -> None:
        store = self._store
        assert store is not None
        self._timer_scan_offset = max(
            self.timer_delivered_offset, store.get_min_offset_in_queue(TIMER_TOPIC, 0)
        )
        if self._timer_scan_offset > self.timer_delivered_offset:
            self.timer_delivered_offset = self._timer_scan_offset
            self._timer_marks = {m for m in self._timer_marks if m >= self._timer_scan_offset}
            self._timer_state_dirty = True
            self._timer_marks_rewrite = True
        heap = self._timer_heap
        while True:
            self._timer_wakeup.clear()
            await self._timer_load()
            delivered = False
            failed = False
            while heap and heap[0][0] <= self.now_ms():
                due, qoff, phy, size, _stored = heap[0]
                if qoff in self._timer_dropped:
                    heapq.heappop(heap)
                    self._timer_dropped.discard(qoff)
                    continue
                ext = store.look_message_by_offset(phy, size)
                if ext is None:
                    log.warning("timer_record_gone", offset=qoff, phy=phy)
                    heapq.heappop(heap)
                    self._timer_done(qoff)
                    continue
                if not await self._put(real_message(ext, self._store_host())):
                    failed = True
                    break
                heapq.heappop(heap)
                lateness = self.now_ms() - due
                if len(self.timer_lateness_ms) >= 1024:
                    del self.timer_lateness_ms[:512]
                self.timer_lateness_ms.append(lateness)
                self._timer_done(qoff)
                delivered = True
            refresh = self._timer_refresh_age_ms > 0
            if not failed and refresh and self.now_ms() >= self._timer_next_refresh_ms:
                failed = not await self._timer_refresh(store)
                self._timer_next_refresh_ms = self.now_ms() + (
                    int(_RETRY_AFTER_S * 1000) if failed else self._timer_refresh_every_ms
                )
            if delivered or self._timer_state_dirty or self._timer_pending_marks:
                self._persist_wakeup.set()
            if failed:
                await trio.sleep(_RETRY_AFTER_S)  # the store refused: retry later
                continue
            if not heap:
                await self._timer_wakeup.wait()
                continue
            wake_at = heap[0][0]
            if refresh:
                wake_at = min(wake_at, self._timer_next_refresh_ms)
            with trio.move_on_after(max(0, wake_at - self.now_ms()) / 1000):
                await self._timer_wakeup.wait()

    async def _timer_refresh(self, store: MessageStore) -> bool:
        """Re-append every undelivered timer record older than half the retention.

        Order, the same as a delivery's: the new record is appended first, then the old queue
        offset is marked delivered (the mark reaches the marks file later, in the persister).
        A crash between the two leaves two records for one message, never none; `_timer_load`
        keeps only the newer one (its TRIMQ_TIMER_ORIGIN names the older). Durability of the
        new record is the store's: for a killed process the page cache keeps it; under
        ASYNC_FLUSH an OS crash can lose it like any recent record, under SYNC_FLUSH the put
        returned once it was on disk.

        Returns:
            False when the store refused a put (the rest waits for the next round).
        """
        heap = self._timer_heap
        dropped = self._timer_dropped
        if dropped:  # compact: replaced entries leave the heap
            heap[:] = [e for e in heap if e[1] not in dropped]
            heapq.heapify(heap)
            dropped.clear()
        limit = self.now_ms() - self._timer_refresh_age_ms
        old = sorted(e for e in heap if e[4] <= limit)
        ok = True
        for due, qoff, phy, size, stored in old:
            ext = store.look_message_by_offset(phy, size)
            if ext is None:
                log.warning("timer_record_gone", offset=qoff, phy=phy)
                self._timer_drop(qoff)
                continue
            msg = ext.to_inner()
            msg.properties[PROPERTY_TIMER_ORIGIN] = str(qoff)
            msg.properties_string = None
            msg.tags_code = due
            msg.store_host = self._store_host()
            assert self._append is not None
            result = await self._append((msg,))
            if not result.ok:
                log.warning("timer_refresh_failed", offset=qoff, status=result.status.name)
                ok = False
                break
            self._timer_drop(qoff)
            self.timer_refreshed += 1
            log.info("timer_record_refreshed", offset=qoff, due=due, stored=stored)
            await trio.lowlevel.checkpoint()
        return ok

    # -- admin -----------------------------------------------------------------------------
    def pending_timer_messages(self) -> int:
        return len(self._timer_heap) - len(self._timer_dropped)

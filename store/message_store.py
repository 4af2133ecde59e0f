"""`MessageStore`: the store facade the broker uses.

``async with MessageStore(cfg) as store:`` takes the directory lock, recovers (in a worker
thread: it reads and checks every record it scans), creates the abort marker, and runs the flush
and cleanup tasks in its own nursery. Leaving the block flushes everything, writes the
checkpoint and removes the abort marker.

Reads (`get_message`, `read_record`, ...) are synchronous slices of the mapped files. They may
touch cold pages; all of them go through `CommitLog.read*`, the one place to move to a thread
later if that shows up in latency.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import fcntl
import functools
import mmap
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import structlog
import trio

from common.message import (
    PROPERTY_WAIT,
    DispatchRequest,
    MessageDecodeError,
    MessageEncodeError,
    MessageExt,
    MessageInner,
    PropertiesSizeExceededError,
    decode_record,
)
from common.schedule import parse_delay_levels
from store._cleanup import CleanupService, Clock, DiskUsage, NeededOffset
from store._disk import METADATA_HEADROOM, DiskMonitor
from store._dispatcher import ArrivalListener, Dispatcher
from store._flush import FlushService
from store._mapped_file import MappedFile, is_out_of_space, populate_for_write
from store._recovery import (
    DAMAGED_DIR,
    REBUILD_MARKER,
    DamagedRegion,
    FileScanner,
    IndexRebuild,
    RecoveryReport,
    load_damaged_regions,
    read_rebuild_marker,
    recover_commitlog,
    save_damaged_region,
)
from store._replica import ReplicaCursor, ReplicaScan, scan_replica
from store.checkpoint import StoreCheckpoint
from store.commitlog import CommitLog, is_not_queued
from store.config import StoreConfig
from store.consume_queue import CQ_UNIT_SIZE, GAP_UNIT_SIZE, ConsumeQueue
from store.errors import (
    ReplicaDataError,
    ReplicaOffsetError,
    StoreClosedError,
    StoreLockedError,
    StorePathError,
)
from store.index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexService
from store.paths import (
    abort_path,
    checkpoint_path,
    commitlog_dir,
    consume_queue_root,
    index_dir,
    lock_path,
)
from store.results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

__all__ = ["MessageStore"]

log = structlog.get_logger()

_CQ_UNIT = struct.Struct(">qiq")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _populate_first_pages(paths: Iterable[Path]) -> None:
    """Fault in the first page of each (new, sparse) file for writing, in a worker thread.

    The first write to a fresh file waits for ext4's block allocation in the page fault; done
    here, the store's first append to it is a plain memory write. The contents are not
    touched, so this is safe while the event loop appends to the same file. Errors are ignored
    (an older kernel, a file deleted meanwhile): the first append then pays as before.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            with mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED) as mm:
                # Not mm.madvise: it keeps the GIL while the fault waits on the journal.
                populate_for_write(mm, 0, mmap.PAGESIZE)
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)


def _destroy_all(files: Iterable[MappedFile]) -> None:
    for mf in files:
        mf.destroy()


def _unlink_all(files: Iterable[MappedFile], directory: Path) -> None:
    """Remove the files' names and make that durable (blocking); the maps stay."""
    for mf in files:
        mf.path.unlink(missing_ok=True)
    _fsync_path(directory)


@contextlib.contextmanager
def _scan_file(mf: MappedFile, max_size: int) -> Iterator[FileScanner]:
    """Recovery's `FileScanner` over a commitlog file from its start (layout checks, damaged
    regions skipped), reading with ``pread`` on a descriptor of its own, never the mapping
    (blocking: worker thread)."""
    fd = os.open(mf.path, os.O_RDONLY)
    try:
        yield FileScanner(
            lambda pos, size: os.pread(fd, size, pos),
            mf.file_from_offset,
            mf.file_size,
            check_crc=False,  # checked when they were appended or recovered
            max_size=max_size,
            light=True,
        )
    finally:
        os.close(fd)


def _cut_queue(cq: ConsumeQueue, offset: int) -> tuple[int, list[MappedFile]]:
    """Drop the units of `cq` pointing at or past commitlog offset `offset` (recovery's
    `ConsumeQueue.truncate_dirty`). Returns how many, and the files wholly past the cut,
    detached here (event loop) for the caller to destroy in a worker thread: units follow
    the commitlog, so a file whose first unit points at or past `offset` holds nothing
    else (or gap fillers)."""
    files = cq.mfq.files
    k = len(files)
    while k > 1:
        unit = cq.get_unit(files[k - 1].file_from_offset // CQ_UNIT_SIZE)
        if unit is None or unit[1] == GAP_UNIT_SIZE or unit[0] < offset:
            break
        k -= 1
    before = cq.max_offset_in_queue
    gone = cq.mfq.truncate_to(files[k].file_from_offset) if k < len(files) else []
    cq.truncate_dirty(offset)
    if gone:  # `truncate_dirty` moves it only when it drops units itself
        last = cq.get_unit(cq.max_offset_in_queue - 1)
        if last is None or last[1] == GAP_UNIT_SIZE:
            cq.max_physic_offset = -1
        else:
            cq.max_physic_offset = last[0] + last[1]
    return before - cq.max_offset_in_queue, gone


def _retire_damaged_copies(root: Path, regions: Iterable[DamagedRegion]) -> None:
    """Rename the copies of damaged regions cut from the commitlog out of the names a start
    reads back (``.bin.cut``), durably (blocking): read back, they would mark the records
    written there later as damaged."""
    d = root / DAMAGED_DIR
    for r in regions:
        path = d / f"{r.offset}-{r.length}.bin"
        with contextlib.suppress(FileNotFoundError):
            path.rename(path.with_name(path.name + ".cut"))
    if d.is_dir():
        _fsync_path(d)


def _queues_room(todo: Iterable[tuple[ConsumeQueue, int, int]]) -> None:
    """`ConsumeQueue.room_for(queue_offset, count)` of each (blocking: files are created)."""
    for cq, queue_offset, count in todo:
        cq.room_for(queue_offset, count)


def _reindexing(
    index: IndexService, durable_ts: int, dispatch: Callable[[DispatchRequest], None]
) -> Callable[[DispatchRequest], None]:
    """`dispatch` for abnormal recovery: at the first record stored at or after `durable_ts`
    (the checkpoint's index timestamp), the index is cut there (`IndexService.truncate`: the
    file holding it sealed, later ones deleted), so that record and every later one are
    indexed again in a new file. Their entries in the sealed file were written after its last
    write-back: after an OS crash some may be missing, and `build_index` would skip them all
    as indexed already. (After a process crash they are all there; the duplicates this makes
    are dropped by `IndexService.query`.)"""
    cut = False

    def recovered(req: DispatchRequest) -> None:
        nonlocal cut
        if not cut and req.store_timestamp >= durable_ts:
            cut = True
            deleted = index.truncate(req.commit_log_offset)
            log.info(
                "index_reindexing_from",
                phy_offset=req.commit_log_offset,
                store_timestamp=req.store_timestamp,
                checkpoint_index_ts=durable_ts,
                files_deleted=deleted,
            )
        dispatch(req)

    return recovered


class _Stats:
    __slots__ = ("get_found", "get_total", "put_bytes", "put_msgs", "samples")

    def __init__(self) -> None:
        self.put_msgs = 0
        self.put_bytes = 0
        self.get_total = 0
        self.get_found = 0
        self.samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=61)

    def sample(self, now: float) -> None:
        self.samples.append((now, self.put_msgs, self.get_found))

    def tps(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return 0.0, 0.0
        t1, p1, g1 = self.samples[-1]
        t0, p0, g0 = self.samples[max(0, len(self.samples) - 11)]
        dt = t1 - t0
        if dt <= 0:
            return 0.0, 0.0
        return (p1 - p0) / dt, (g1 - g0) / dt


class MessageStore:
    """The message store: commitlog, consume queues, index, recovery, flush and cleanup.

    Args:
        config: Store configuration.
        clock: Wall clock (seconds since the epoch) for store timestamps and file ages.
        disk_usage: Used fraction of the filesystem of a path (cleanup, disk-full refusal).
        needed_offset: Where consumers stand: the smallest commitlog offset some consumer
            still needs (and who), or None when all is consumed. Cleanup keeps the files from
            there on under disk pressure (see `store._cleanup`); the broker passes it, the
            store knowing nothing of consumers.

    Use it as ``async with MessageStore(cfg) as store:``. One process (and one object) at a time
    may have a directory open: a second one raises `StoreLockedError`.
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        clock: Clock | None = None,
        disk_usage: DiskUsage | None = None,
        needed_offset: NeededOffset | None = None,
    ) -> None:
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self._clock: Clock = clock or time.time
        # Reads further behind the commitlog's end than this are likely not in the page cache.
        self._in_memory_bytes = (
            _physical_memory() * config.access_message_in_memory_max_ratio // 100
        )
        # Free space every new mapped file must leave: an index file (sparse, written through
        # a map) may still grow to its full size, plus the metadata files (store._disk).
        headroom = METADATA_HEADROOM
        if config.message_index_enable:
            headroom += (
                HEADER_SIZE
                + config.max_hash_slot_num * SLOT_SIZE
                + config.max_index_num * ENTRY_SIZE
            )
        self.commitlog = CommitLog(
            self.root,
            config.mapped_file_size_commitlog,
            pwrite_appends=True,
            zero_blocks=config.flush_disk_type == "SYNC_FLUSH",
            keep_free=headroom,
        )
        index = (
            IndexService(index_dir(self.root), config.max_hash_slot_num, config.max_index_num)
            if config.message_index_enable
            else None
        )
        self.dispatcher = Dispatcher(
            self.root,
            config.mapped_file_size_consume_queue,
            index,
            parse_delay_levels(config.message_delay_level),
            keep_free=headroom,
        )
        self.disk = DiskMonitor(
            self.root,
            config,
            headroom=headroom,
            disk_usage=disk_usage,
            index_files=(lambda: [f.path for f in index.files]) if index is not None else None,
        )
        self.checkpoint = StoreCheckpoint(checkpoint_path(self.root))
        self.flush_service = FlushService(
            self.commitlog,
            config,
            consume_queues=lambda: list(self.dispatcher.consume_queues.values()),
            on_commitlog_flushed=self._on_commitlog_flushed,
            on_consume_queues_flushed=self._on_consume_queues_flushed,
            on_out_of_space=self._out_of_space,
        )
        self.cleanup_service = CleanupService(
            config,
            self.commitlog,
            self.dispatcher,
            self.flush_service,
            clock=self._clock,
            disk=self.disk,
            needed=needed_offset,
        )
        self.recovery: RecoveryReport | None = None
        # Commitlog regions recovery found damaged (and earlier starts copied aside), sorted:
        # (start, end). Units pointing into them are skipped by pulls and lookups.
        self.damaged_regions: list[DamagedRegion] = []
        self._damaged: list[tuple[int, int]] = []
        self.damaged_queue_units = 0
        # Index files to rebuild from the commitlog in the background (see `_rebuild_index`).
        self.index_rebuild: IndexRebuild | None = None
        self.index_rebuild_state = "none"
        self.last_exit_ok = True
        self._lock_fd: int | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._running = False
        self._closing = False
        # Set when staged appends could not be written (`end_staging`): appends are refused.
        self._write_failed: str | None = None
        self._crash = False
        self._flushed_at_close = False
        # Monotonic time of the last write-back of the index file being written (see
        # `_on_consume_queues_flushed`); the first flush round writes it back.
        self._index_flushed_at = float("-inf")
        self._trash_seq = 0
        self._stats = _Stats()
        # Replica appends (`append_replica`): one at a time; where their dispatch stands.
        self._replica_lock = trio.Lock()
        self._replica = ReplicaCursor()
        # Empty commitlog files an empty slave gave up for the master's start offset: already
        # unlinked, unmapped at close (see `_replica_start_at`).
        self._replica_discarded: list[MappedFile] = []

    # ================================================================== lifecycle
    async def __aenter__(self) -> MessageStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Lock the directory, recover, create the abort marker and start the services.

        Raises:
            StoreLockedError: The directory is open elsewhere.
            OSError: The files cannot be created or mapped.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            # Mapping files and scanning records reads the disk: worker thread.
            await trio.to_thread.run_sync(self._load_and_recover)
            abort = abort_path(self.root)
            abort.touch()
            # Make the abort marker durable before accepting writes.
            await trio.to_thread.run_sync(_fsync_path, self.root)
            # statvfs, and the first commitlog file of an empty store created (fallocate) and
            # mapped ahead of the first put: worker thread.
            try:
                await trio.to_thread.run_sync(self.disk.read)
            except OSError:
                log.exception("disk_usage_failed")
            self.disk.evaluate()
            if not self.commitlog.mfq.files:
                try:
                    await trio.to_thread.run_sync(
                        functools.partial(self.commitlog.mfq.prepare_next, first=True)
                    )
                except OSError as exc:
                    self._out_of_space(exc, self.config.mapped_file_size_commitlog, "commitlog")
            stack = contextlib.AsyncExitStack()
            await stack.__aenter__()
            try:
                self._nursery = await stack.enter_async_context(trio.open_nursery())
                await self._nursery.start(self.flush_service.run)
                self._nursery.start_soon(self.cleanup_service.run)
                self._nursery.start_soon(self.disk.run)
                self._nursery.start_soon(self._stats_loop)
                if self.index_rebuild is not None:
                    self._nursery.start_soon(self._rebuild_index, self.index_rebuild)
            except BaseException:
                await stack.aclose()
                raise
            self._stack = stack
        except BaseException:
            self._release_lock()
            raise
        self._running = True
        self._closing = False
        self._write_failed = None
        self._replica = ReplicaCursor()  # recovery ended the commitlog at a record boundary

    def _take_lock(self) -> None:
        fd = os.open(lock_path(self.root), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(f"store {self.root} is open in another process") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _load_and_recover(self) -> None:
        cfg = self.config
        abnormal = abort_path(self.root).exists()
        self.last_exit_ok = not abnormal
        cl = self.commitlog
        cl.mfq.load()
        cqs = self._load_consume_queues()
        index = self.dispatcher.index
        rebuild_from: int | None = None  # index files to rebuild from here (see below)
        rebuild_to = 1 << 62
        if index is not None:
            # Always keep the index files: `build_index` skips what is already indexed, and
            # dropping the current file after a crash would lose every key it holds.
            index.load()
            marker = read_rebuild_marker(index.directory)
            if index.unusable:
                # A damaged file: the index is derived data, rebuild all of it.
                log.warning("index_damaged_full_rebuild", unusable_files=index.unusable)
                index.drop_range(0, 1 << 62)
                rebuild_from = 0
            elif marker is not None:
                # A rebuild did not finish: its files may be incomplete; do it again.
                dropped_files = index.drop_range(*marker)
                log.warning(
                    "index_rebuild_unfinished",
                    from_offset=marker[0],
                    to_offset=marker[1],
                    files_dropped=dropped_files,
                )
                rebuild_from, rebuild_to = marker
                if index.files:
                    # Records below it are the rebuild's, not the live indexing's.
                    index.rebuild_below = rebuild_to
                else:
                    rebuild_to = 1 << 62  # nothing indexed live either: rebuild all of it
            elif not index.files and cl.mfq.files:
                rebuild_from = 0
        full = bool(cl.mfq.files) and not any(cq.mfq.files for cq in cqs)
        if full:
            log.warning("consume_queues_missing_full_rebuild", root=str(self.root))
        dispatch: Callable[[DispatchRequest], None] | None = None
        scan_from_ts = self.checkpoint.min_timestamp()
        index_missing = index is not None and not index.files and rebuild_from is not None
        if index_missing:
            # The whole index is rebuilt after recovery: recovery's redispatch leaves it alone.
            self.dispatcher.index = None
        try:
            if abnormal or full:
                dispatch = self.dispatcher.recovered
                if abnormal and index is not None and not index_missing:
                    # The index is durable only up to the checkpoint's index timestamp (the
                    # file being written is written back every flush_interval_index_ms):
                    # re-index from there.
                    scan_from_ts = self.checkpoint.min_timestamp_index()
                    dispatch = _reindexing(index, self.checkpoint.index_msg_timestamp, dispatch)
            report, dropped = recover_commitlog(
                cl,
                abnormal=abnormal,
                checkpoint_min_timestamp=scan_from_ts,
                full=full,
                check_crc=cfg.check_crc_on_recover,
                max_size=self._max_record_size,
                dispatch=dispatch,
            )
        finally:
            self.dispatcher.index = index
        _destroy_all(dropped)
        if index is not None:
            # Index entries of records past the valid end (index flushed further than the
            # commitlog) must not make new records there look indexed already.
            index.truncate(report.valid_end)
        self.recovery = report
        valid_end = report.valid_end
        min_phy = cl.min_offset
        self._note_damaged(report)
        table: dict[tuple[str, int], int] = {}
        for cq in self.dispatcher.consume_queues.values():
            lost = cq.truncate_dirty(valid_end)
            if lost:
                log.warning(
                    "consume_queue_truncated",
                    topic=cq.topic,
                    queue_id=cq.queue_id,
                    units=lost,
                    max_offset=cq.max_offset_in_queue,
                )
            if cl.mfq.files:
                cq.correct_min_offset(min_phy)
            if cq.max_offset_in_queue:
                table[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue
        cl.topic_queue_table = table
        # What recovery repaired (or what the page cache held at a crash) is made durable now.
        for mf in cl.mfq.files[-2:]:
            mf.fsync()
        for cq in self.dispatcher.consume_queues.values():
            for mf in cq.mfq.flush_plan(cq.mfq.max_offset):
                mf.fsync()
            cq.mfq.flushed_to(cq.mfq.max_offset)
        if report.last_store_timestamp:
            self.checkpoint.physic_msg_timestamp = report.last_store_timestamp
            self.checkpoint.logics_msg_timestamp = report.last_store_timestamp
        if index is not None and rebuild_from is not None:
            start = max(rebuild_from, min_phy)
            end = min(rebuild_to, valid_end)
            if start < end:
                rebuild = IndexRebuild(
                    index,
                    commitlog_dir(self.root),
                    cl.file_size,
                    start,
                    end,
                    check_crc=False,  # recovery checked what it scanned; damage is skipped
                    max_size=self._max_record_size,
                )
                rebuild.write_marker()
                index.rebuild_below = end
                self.index_rebuild = rebuild
                self.index_rebuild_state = "pending"
            else:
                index.rebuild_below = 0
                (index.directory / REBUILD_MARKER).unlink(missing_ok=True)

    def _note_damaged(self, report: RecoveryReport) -> None:
        """Copy the damaged regions aside, merge those of earlier starts, count the queue
        units pointing into them, log the summary (blocking: recovery's worker thread)."""
        found = {(r.offset, r.length): r for r in report.damaged}
        for r in report.damaged:
            data = self.commitlog.read(r.offset, r.length) or b""
            try:
                path = save_damaged_region(self.root, r, data)
                log.error(
                    "commitlog_damaged_region_saved",
                    offset=r.offset,
                    length=r.length,
                    records=r.records,
                    copy=str(path),
                )
            except OSError:
                log.exception("commitlog_damaged_region_copy_failed", offset=r.offset)
        min_phy = self.commitlog.min_offset
        for r in load_damaged_regions(self.root):
            if r.end > min_phy and r.offset < report.valid_end:
                found.setdefault((r.offset, r.length), r)
        regions = sorted(found.values(), key=lambda r: r.offset)
        self.damaged_regions = regions
        self._damaged = [(r.offset, r.end) for r in regions]
        if not regions:
            return
        units = 0
        for cq in self.dispatcher.consume_queues.values():
            for mf in cq.mfq.files:
                data = mf.read(0, mf.wrote_position)
                for phy, size, _tags in _CQ_UNIT.iter_unpack(data):
                    if size != GAP_UNIT_SIZE and self._is_damaged(phy):
                        units += 1
        self.damaged_queue_units = units
        log.error(
            "store_damage_report",
            regions=[r.describe() for r in regions],
            lost_bytes=sum(r.length for r in regions),
            lost_records=sum(r.records or 0 for r in regions),
            unknown_record_counts=sum(r.records is None for r in regions),
            queue_units_skipped=units,
            copies=str(self.root / "damaged"),
        )

    def _is_damaged(self, phy: int) -> bool:
        """Whether commitlog offset `phy` lies in a damaged region."""
        regions = self._damaged
        i = bisect.bisect_right(regions, (phy, 1 << 62)) - 1
        return i >= 0 and regions[i][0] <= phy < regions[i][1]

    async def _rebuild_index(self, rebuild: IndexRebuild) -> None:
        """Rebuild index files in the background, a slice at a time (`IndexRebuild`)."""
        log.info(
            "index_rebuild_started",
            from_offset=rebuild.start,
            to_offset=rebuild.end,
            bytes=rebuild.end - rebuild.start,
        )
        self.index_rebuild_state = "running"
        last_log = time.monotonic()
        try:
            while True:
                # Reading the commitlog and writing index pages block: worker thread.
                done = await trio.to_thread.run_sync(rebuild.step)
                if done:
                    break
                now = time.monotonic()
                if now - last_log >= 5:
                    last_log = now
                    log.info(
                        "index_rebuild_progress",
                        offset=rebuild.pos,
                        to_offset=rebuild.end,
                        percent=round(
                            100 * (rebuild.pos - rebuild.start) / (rebuild.end - rebuild.start), 1
                        ),
                        records=rebuild.records,
                        keys=rebuild.keys,
                    )
                await trio.lowlevel.checkpoint()
            # Write-back of the rebuilt files, marker removal: worker thread.
            await trio.to_thread.run_sync(rebuild.finish)
        except BaseException as exc:
            # Stopped (store closing) or failed: the marker stays; the next start redoes it.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(rebuild.close)
            self.index_rebuild_state = "interrupted"
            if isinstance(exc, Exception):
                log.exception("index_rebuild_failed", offset=rebuild.pos)
                return
            log.warning("index_rebuild_interrupted", offset=rebuild.pos, records=rebuild.records)
            raise
        self.index_rebuild_state = "done"
        log.info(
            "index_rebuild_finished",
            records=rebuild.records,
            keys=rebuild.keys,
            files=rebuild.files_created,
            seconds=round(time.monotonic() - rebuild.started_at, 2),
        )

    def _load_consume_queues(self) -> list[ConsumeQueue]:
        root = consume_queue_root(self.root)
        out: list[ConsumeQueue] = []
        if not root.is_dir():
            return out
        for topic_dir in sorted(root.iterdir()):
            if topic_dir.name.startswith(".deleted-"):
                # Left by delete_topics when the process stopped before removing it.
                shutil.rmtree(topic_dir, ignore_errors=True)
                continue
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if not qdir.is_dir() or not qdir.name.lstrip("-").isdigit():
                    continue
                cq = self.dispatcher.get_cq(topic_dir.name, int(qdir.name))
                cq.load()
                cq.recover()
                out.append(cq)
        return out

    def simulate_crash(self) -> None:
        """Make the next `close` behave like a killed process (tests): no final flush, no
        checkpoint, the abort marker stays. Written data stays in the page cache, as after
        SIGKILL."""
        self._crash = True

    async def close(self) -> None:
        """Refuse new puts, flush everything, write the checkpoint, remove the abort marker,
        release the directory."""
        if not self._running:
            return
        self._closing = True
        try:
            if not self._crash:
                with trio.CancelScope(shield=True):
                    await self.flush_service.flush_all()
                self._flushed_at_close = True
        finally:
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
            try:
                if self._stack is not None:
                    await self._stack.aclose()
            finally:
                self._stack = None
                self._nursery = None
                self._running = False
                with trio.CancelScope(shield=True):
                    # Unmapping files, fsync of index and checkpoint: worker thread.
                    await trio.to_thread.run_sync(self._close_files)
                self._release_lock()

    def _close_files(self) -> None:
        index = self.dispatcher.index
        clean = self._flushed_at_close and not self._crash
        if clean:
            ts = self.commitlog.last_store_timestamp
            if index is not None:
                self.checkpoint.index_msg_timestamp = index.flush(ts)
            if ts:
                self.checkpoint.physic_msg_timestamp = ts
                self.checkpoint.logics_msg_timestamp = ts
            self.checkpoint.flush()
        if index is not None:
            index.close()
        self.commitlog.mfq.close_all()
        discarded, self._replica_discarded = self._replica_discarded, []
        for mf in discarded:
            mf.close()
        for cq in self.dispatcher.consume_queues.values():
            cq.mfq.close_all()
        if clean:
            abort_path(self.root).unlink(missing_ok=True)
            _fsync_path(self.root)
        log.info("store_closed", clean=clean, max_phy_offset=self.max_phy_offset)

    def _on_commitlog_flushed(self, store_timestamp: int) -> None:
        if store_timestamp:
            self.checkpoint.physic_msg_timestamp = store_timestamp

    def _on_consume_queues_flushed(self, store_timestamp: int) -> None:
        # Runs in a worker thread (fdatasync + atomic checkpoint rewrite).
        index = self.dispatcher.index
        if index is not None:
            # Full index files are written back at once; the one being written every
            # flush_interval_index_ms (see `IndexService.flush`).
            now = time.monotonic()
            live = (now - self._index_flushed_at) * 1000 >= self.config.flush_interval_index_ms
            if live:
                self._index_flushed_at = now
            self.checkpoint.index_msg_timestamp = index.flush(store_timestamp, live=live)
        if store_timestamp:
            self.checkpoint.logics_msg_timestamp = store_timestamp
        self.checkpoint.flush()

    async def _stats_loop(self) -> None:
        while True:
            self._stats.sample(trio.current_time())
            await trio.sleep(1)

    # ================================================================== puts
    def _refusal(self) -> str | None:
        if not self._running or self._closing:
            return "message store is not running (shutting down or not open)"
        if self._write_failed is not None:
            return self._write_failed
        # The disk monitor's cached verdict (store._disk): no system call per put.
        return self.disk.refusal

    def _out_of_space(self, exc: OSError, size: int, what: str) -> None:
        """A file could not be created for want of space: puts are refused until there is."""
        if is_out_of_space(exc):
            self.disk.out_of_space(size, what, exc)
        else:
            log.error("mapped_file_create_failed", what=what, error=str(exc))

    def _append_failed(self, exc: OSError, size: int, what: str) -> PutMessageResult:
        if is_out_of_space(exc):
            self._out_of_space(exc, size, what)
            reason = self.disk.refusal or f"maybe disk full, {exc}"
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, reason)
        log.exception("commitlog_append_failed")
        return PutMessageResult(
            PutMessageStatus.CREATE_MAPPED_FILE_FAILED, None, f"{what} append: {exc}"
        )

    def _make_room(self, msgs: Sequence[MessageInner], nbytes: int) -> PutMessageResult | None:
        """Create the files this append will need before writing anything (a full disk then
        refuses the put whole); nothing to do, and no system call, while the current files
        have room. None when there is room."""
        first = msgs[0]
        cl = self.commitlog
        try:
            cl.room_for(nbytes)
        except OSError as exc:
            return self._append_failed(exc, cl.file_size, "commitlog")
        key = (first.topic, first.queue_id)
        cq = self.dispatcher.consume_queues.get(key)
        if cq is not None:
            files = cq.mfq.files
            if files and files[-1].remaining >= len(msgs) * CQ_UNIT_SIZE:
                return None  # the usual case
        elif is_not_queued(first.sys_flag):
            return None
        try:
            if cq is None:
                cq = self.dispatcher.get_cq(first.topic, first.queue_id)
            cq.room_for(cl.topic_queue_table.get(key, 0), len(msgs))
        except OSError as exc:
            return self._append_failed(
                exc, self.config.mapped_file_size_consume_queue, "consume queue"
            )
        return None

    async def put_message(self, msg: MessageInner) -> PutMessageResult:
        """Append one message. See `put_messages`."""
        return await self.put_messages((msg,))

    async def put_messages(self, msgs: Sequence[MessageInner]) -> PutMessageResult:
        """Append messages of one topic and queue with consecutive queue offsets.

        Under SYNC_FLUSH the call returns once the records are durable (group commit), or with
        FLUSH_DISK_TIMEOUT after `sync_flush_timeout_ms` (the records stay written), unless a
        message has WAIT=false. `put_messages_nowait` + `wait_put_durable` is the same in two
        steps, for callers that can answer without awaiting when no flush wait is needed.

        Returns:
            PUT_OK with the append; SERVICE_NOT_AVAILABLE (closing, disk full: see `remark`),
            MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED, CREATE_MAPPED_FILE_FAILED or
            FLUSH_DISK_TIMEOUT.
        """
        result, flush_end = self.put_messages_nowait(msgs)
        if flush_end < 0:
            return result
        return await self.wait_put_durable(result, flush_end)

    def begin_staging(self) -> None:
        """Start a run of puts that `end_staging` completes; the caller must call it before
        the event loop can switch tasks and before answering any of the puts (see
        `CommitLog.begin_staging`). For a server that runs the sends of one read without
        switching tasks and answers them together:

        - single-message appends are staged and written with one ``pwrite`` for the run;
        - in both flush modes, the records' index entries are written together, one batch
          per run of one topic and store time (`IndexService.deferring`), instead of one
          ``_last_file`` lookup, hash and header write each;
        - the arrival listeners hear of the run's records only once `end_staging` has
          written them (`Dispatcher.holding`).
        """
        self.commitlog.begin_staging()
        self.dispatcher.holding = True
        index = self.dispatcher.index
        if index is not None:
            index.deferring = True  # a plain attribute: no call on every read

    def end_staging(self) -> None:
        """Write what `begin_staging` staged and index the run's records; call it before
        answering those sends.

        Raises:
            OSError: the write failed. The sends since `begin_staging` must not be
                acknowledged; from now on every append is refused (SERVICE_NOT_AVAILABLE)
                until the store is reopened, since records after the unwritten ones would
                sit beyond a hole that recovery stops at. Their index entries are dropped.
        """
        index = self.dispatcher.index
        try:
            self.commitlog.end_staging()
        except OSError as exc:
            self.dispatcher.drop_arrivals()
            if index is not None:
                index.drop_deferred()
            self._write_failed = (
                f"commitlog write failed ({exc}); appends are refused until the store is reopened"
            )
            log.exception("commitlog_staged_write_failed")
            raise
        if index is not None:
            if index.kept:
                try:
                    index.build_deferred()
                except Exception:
                    # The records are stored and in their consume queues: the sends succeed,
                    # as when RocketMQ's index service fails; the index is derived data.
                    log.exception("index_build_failed")
            else:  # a read without sends: no call
                index.deferring = False
        self.dispatcher.release_arrivals()

    def put_messages_nowait(self, msgs: Sequence[MessageInner]) -> tuple[PutMessageResult, int]:
        """The synchronous part of `put_messages`: validate, encode, append, dispatch, count.

        Never blocks (the append writes mapped memory; fsync is the flush service's job).

        Returns:
            (result, flush_end). flush_end < 0: `result` is final. flush_end >= 0 (SYNC_FLUSH,
            not yet durable, WAIT not false): the records are written but the put is complete
            only after `await wait_put_durable(result, flush_end)`, which gives the final
            result (PUT_OK or FLUSH_DISK_TIMEOUT).
        """
        reason = self._refusal()
        if reason is not None:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, reason), -1
        if not msgs:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, "no message"), -1
        first = msgs[0]
        max_body = self.config.max_message_size
        for m in msgs:
            if len(m.body) > max_body:
                return PutMessageResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    None,
                    f"message body is {len(m.body)} bytes, the limit is {max_body}",
                ), -1
            if m.topic != first.topic or m.queue_id != first.queue_id:
                return PutMessageResult(
                    PutMessageStatus.MESSAGE_ILLEGAL, None, "a batch must have one topic and queue"
                ), -1
        cl = self.commitlog
        try:
            records = cl.encode(msgs)
        except PropertiesSizeExceededError as exc:
            return PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, None, str(exc)), -1
        except (MessageEncodeError, ValueError) as exc:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, str(exc)), -1
        refused = self._make_room(msgs, len(records.buf))
        if refused is not None:
            return refused, -1
        now_ms = int(self._clock() * 1000)
        try:
            result, requests = cl.append(msgs, records, now_ms)
        except OSError as exc:
            return self._append_failed(exc, cl.file_size, "commitlog"), -1
        end = cl.max_offset
        dispatch = self.dispatcher.dispatch
        try:
            for req in requests:
                dispatch(req)
        except OSError as exc:
            # A consume-queue or index file beyond the one `_make_room` prepared (a batch
            # over several tiny files), or a file not reserved at load: the record is in
            # the commitlog (recovery re-dispatches it), the put is not acknowledged.
            log.exception("dispatch_failed", topic=first.topic, queue_id=first.queue_id)
            return self._append_failed(
                exc, self.config.mapped_file_size_consume_queue, "consume queue"
            ), -1
        stats = self._stats
        stats.put_msgs += result.msg_num
        stats.put_bytes += result.wrote_bytes
        flush = self.flush_service
        if (
            flush.sync
            and first.properties.get(PROPERTY_WAIT) != "false"
            and not flush.is_flushed(end)
        ):
            return PutMessageResult(PutMessageStatus.PUT_OK, result), end
        return PutMessageResult(PutMessageStatus.PUT_OK, result), -1

    async def wait_put_durable(self, result: PutMessageResult, flush_end: int) -> PutMessageResult:
        """Complete a SYNC_FLUSH put of `put_messages_nowait`: wait (group commit) until the
        commitlog is durable up to `flush_end`; FLUSH_DISK_TIMEOUT (records kept) if it takes
        longer than `sync_flush_timeout_ms`."""
        if await self.flush_service.wait_flushed(flush_end):
            return result
        return self.not_durable(result)

    def when_put_durable(
        self,
        result: PutMessageResult,
        flush_end: int,
        callback: Callable[[PutMessageResult], object],
    ) -> None:
        """`wait_put_durable` without a task: `callback(final)` is called later on the event
        loop (never from within this call) with the final result, PUT_OK once the group commit
        made the commitlog durable up to `flush_end`, FLUSH_DISK_TIMEOUT (records kept) after
        `sync_flush_timeout_ms` or when the store closes first. The callback must not block;
        an exception it raises is logged and dropped."""
        self.when_durable(
            flush_end, lambda durable: callback(result if durable else self.not_durable(result))
        )

    def when_durable(self, flush_end: int, callback: Callable[[bool], object]) -> None:
        """`when_put_durable` for many puts at once (a run of sends answered together):
        `callback(durable)` is called later on the event loop (never from within this call),
        with True once the group commit made the commitlog durable up to `flush_end` (the
        largest of their ends), False after `sync_flush_timeout_ms` or when the store closes
        first; `not_durable` then gives each put's final result. The callback must not
        block; an exception it raises is logged and dropped."""
        flush = self.flush_service
        flush.on_flushed(flush_end, lambda: callback(flush.is_flushed(flush_end)))

    def not_durable(self, result: PutMessageResult) -> PutMessageResult:
        """The final result of a SYNC_FLUSH put whose records were not made durable in time
        (`when_durable` called back with False): FLUSH_DISK_TIMEOUT, records kept. With True,
        the put's own PUT_OK result is final."""
        return PutMessageResult(
            PutMessageStatus.FLUSH_DISK_TIMEOUT,
            result.append,
            f"not durable after {self.config.sync_flush_timeout_ms} ms",
        )

    # ================================================================== gets
    async def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        max_bytes: int,
        tag_filter: Callable[[int], bool] | None = None,
    ) -> GetMessageResult:
        """Read up to `max_msgs` records (and about `max_bytes`) from a queue at `offset`.

        Statuses and next-begin-offset corrections follow RocketMQ 4.9's
        `DefaultMessageStore.getMessage`: no queue -> NO_MATCHED_LOGIC_QUEUE (next 0); empty
        queue -> NO_MESSAGE_IN_QUEUE (next 0); offset < min -> OFFSET_TOO_SMALL (next min);
        offset == max -> OFFSET_OVERFLOW_ONE (next offset); offset > max -> OFFSET_OVERFLOW_BADLY
        (next min if min is 0, else max); units whose tags code `tag_filter` rejects are skipped
        (NO_MATCHED_MESSAGE when nothing matched); units whose record is gone give
        MESSAGE_WAS_REMOVING; a consume-queue file that is gone gives OFFSET_FOUND_NULL.

        Args:
            group: Consumer group (for statistics only).
            topic: Topic.
            queue_id: Queue id.
            offset: First logical offset wanted.
            max_msgs: Most records to return.
            max_bytes: Stop before the total size passes this (at least one record is returned).
            tag_filter: Tags code -> keep?; None keeps everything.

        Raises:
            StoreClosedError: The store is not open.
        """
        return self.get_message_nowait(
            group, topic, queue_id, offset, max_msgs, max_bytes, tag_filter
        )

    def get_message_nowait(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        max_bytes: int,
        tag_filter: Callable[[int], bool] | None = None,
    ) -> GetMessageResult:
        """`get_message` without the await, for callers on the event loop (a pull processor
        answering inline). It reads mapped memory only (no file I/O calls), as `get_message`
        always has.

        Raises:
            StoreClosedError: The store is not open.
        """
        self._require_open()
        self._stats.get_total += 1
        res = self._get(topic, queue_id, offset, max_msgs, max_bytes, tag_filter)
        if res.message_count:
            self._stats.get_found += res.message_count
        return res

    def _get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        max_bytes: int,
        tag_filter: Callable[[int], bool] | None,
    ) -> GetMessageResult:
        cq = self.dispatcher.find_cq(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0)
        min_off = cq.min_offset_in_queue
        max_off = cq.max_offset_in_queue
        res = GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if max_off == 0:
            return res
        if offset < min_off:
            res.status = GetMessageStatus.OFFSET_TOO_SMALL
            res.next_begin_offset = min_off
            return res
        if offset == max_off:
            res.status = GetMessageStatus.OFFSET_OVERFLOW_ONE
            res.next_begin_offset = offset
            return res
        if offset > max_off:
            res.status = GetMessageStatus.OFFSET_OVERFLOW_BADLY
            res.next_begin_offset = min_off if min_off == 0 else max_off
            return res
        max_msgs = max(1, max_msgs)
        found = cq.iter_units(offset, max(16000, max_msgs * CQ_UNIT_SIZE) // CQ_UNIT_SIZE)
        if found is None:
            res.status = GetMessageStatus.OFFSET_FOUND_NULL
            res.next_begin_offset = cq.roll_next_file(offset)
            return res
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        next_phy_file_start = -1
        read = self.commitlog.read
        buffers = res.buffers
        qoffs = res.queue_offsets
        total = 0
        i = 0
        last_phy = 0
        count, units = found
        damaged = self._damaged
        for i, (phy, size, tags) in enumerate(units):
            if next_phy_file_start >= 0 and phy < next_phy_file_start:
                continue
            if size == GAP_UNIT_SIZE or (damaged and self._is_damaged(phy)):
                # A gap filler, or a record in a damaged region (recovery): nothing to serve.
                continue
            if buffers and (len(buffers) >= max_msgs or total + size > max_bytes):
                break
            if tag_filter is not None and not tag_filter(tags):
                continue
            data = read(phy, size)
            if data is None:
                if not buffers:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                next_phy_file_start = self.commitlog.roll_next_file(phy)
                continue
            buffers.append(data)
            last_phy = phy
            qoffs.append(offset + i)
            total += size
            status = GetMessageStatus.FOUND
            next_phy_file_start = -1
        else:
            i = count
        res.status = status
        res.next_begin_offset = offset + i
        if buffers:
            res.suggest_pulling_from_slave = (
                self.commitlog.max_offset - last_phy > self._in_memory_bytes
            )
        res.message_count = len(buffers)
        res.buffer_total_size = total
        return res

    # ================================================================== replication
    def read_commitlog(self, phy_offset: int, max_bytes: int) -> bytes | None:
        """A copy of the commitlog bytes from `phy_offset` on, what a master streams to its
        slaves (RocketMQ's getCommitLogData): up to the write position of the file holding
        it, never past that file's end (the next file's bytes come with the next call), at
        most `max_bytes`. The BLANK filler padding a file's end is included, its header and
        the zeros after it. None when `phy_offset` is at or past the max offset, or below
        the min offset (deleted).

        Only bytes written to the file are returned: bytes a run of sends staged
        (`begin_staging`) come with a later call, once the run has written them; nothing is
        drained. A copy from the page cache on the event loop: keep `max_bytes` small (the
        HA stream sends at most 32 KiB at a time); a page no longer cached is read from disk.

        Raises:
            StoreClosedError: The store is not open.
            ValueError: `max_bytes` is not positive.
        """
        self._require_open()
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        return self.commitlog.read_written(phy_offset, max_bytes)

    async def append_replica(
        self, phy_offset: int, data: bytes, written: Callable[[], None] | None = None
    ) -> None:
        """Append commitlog bytes a master sent (its `read_commitlog`) at the same offset,
        and dispatch every record they complete: consume queues, index and arrival listeners
        (long polls and delay timers wake on a slave as on a master).

        `written()`, if given, is called once the bytes are in the commitlog (the max phy
        offset moved) and before their records are dispatched: a slave acknowledges what its
        commitlog holds, as RocketMQ's do, and its consume queues follow. It must not raise.

        `phy_offset` must be the store's max phy offset. An empty store (nothing ever
        written) takes instead any start of a commitlog file (a multiple of the file size),
        and its first file is named by it: a new slave starts from the start of the
        master's last file. `data` must lie within one commitlog file and may end inside a
        record: that record is dispatched by the call that brings its last byte. Bytes at a
        file's first byte go into a new file named by their offset. Everything is checked
        (recovery's checks, `store._replica`) and every file needed is created before
        anything is written, so a refused call changes nothing.

        The bytes are made durable as puts are (the flush service; the checkpoint gets the
        records' store timestamps). A store reopened after a stop (clean or not) recovers
        to the end of the last complete record: bytes of a record whose end had not come are
        cut, and the master sends them again from the max phy offset.

        A store taking replica appends must take no puts (a broker refuses sends on a
        slave): a put between two appends that leave a record incomplete would be written
        into the middle of it. Mixing them is not supported.

        Raises:
            ReplicaOffsetError: `phy_offset` is not where the bytes must start.
            ReplicaDataError: `data` runs past its file's end, or holds bytes that are no
                record (garbage, a bad CRC, a record claiming another offset, or one larger
                than ``max_message_size`` + 64 KiB, the limit recovery applies).
            StoreClosedError: The store is not open, or closing.
            OSError: A file could not be created (ENOSPC, ...) or the bytes not written:
                nothing was written. Or a consume-queue or index write failed after the
                commitlog write: the bytes are kept (the max phy offset moved) and the
                records not dispatched are dispatched by the next call.
        """
        self._require_writable()
        async with self._replica_lock:
            self._require_writable()
            cl = self.commitlog
            size = cl.file_size
            empty = cl.empty
            if empty:
                if phy_offset < 0 or phy_offset % size:
                    raise ReplicaOffsetError(
                        phy_offset,
                        cl.max_offset,
                        f"an empty store starts at a file start (a multiple of {size})",
                    )
            elif phy_offset != cl.max_offset:
                raise ReplicaOffsetError(phy_offset, cl.max_offset)
            if not data:
                return
            file_from = phy_offset - phy_offset % size
            if phy_offset + len(data) > file_from + size:
                raise ReplicaDataError(
                    f"{len(data)} replica bytes at commitlog offset {phy_offset} run past the "
                    f"end of their file at {file_from + size}"
                )
            cur = self._replica
            if empty or cur.end != phy_offset:
                cur.reset(phy_offset)
            scan = self._scan_replica(phy_offset, data)
            await self._replica_room(phy_offset, empty, scan.records)
            mf = cl.mfq.file_for_append(phy_offset)
            assert mf.end_offset == phy_offset, (mf, phy_offset)
            try:
                # Through pwrite, as the single records of puts (see `CommitLog`).
                mf.pwrite_append(data)
            except OSError as exc:  # nothing moved
                if is_out_of_space(exc):
                    self._out_of_space(exc, size, "commitlog")
                else:
                    log.exception("replica_write_failed", phy_offset=phy_offset)
                raise
            cur.end = cl.max_offset
            if written is not None:
                written()
            self._dispatch_replica(scan)

    @property
    def _max_record_size(self) -> int:
        """The largest record recovery keeps (and so a slave takes)."""
        return self.config.max_message_size + 64 * 1024

    def _require_writable(self) -> None:
        if not self._running or self._closing:
            raise StoreClosedError("the store is not open, or closing")

    def _scan_replica(self, phy_offset: int, data: bytes) -> ReplicaScan:
        """The records that `data`, at the max offset `phy_offset`, completes with the bytes
        the cursor left pending (`store._replica`). Reads nothing while the pending record
        still lacks bytes.

        Raises:
            ReplicaDataError: see `scan_replica`.
        """
        cur = self._replica
        cl = self.commitlog
        size = cl.file_size
        max_size = self._max_record_size
        file_from = phy_offset - phy_offset % size
        pos = cur.pos
        done: list[DispatchRequest] = []
        if pos < file_from:
            # A dispatch failed (OSError) after the bytes up to the previous file's end were
            # written: the records left in that file first.
            prev = pos - pos % size
            tail = cl.read(pos, file_from - pos)
            if prev + size != file_from or tail is None:
                raise RuntimeError(f"replica cursor at {pos} lost behind {file_from}")
            prev_scan = scan_replica(tail, pos, prev, size, max_size=max_size)
            if prev_scan.next_pos != file_from:
                raise ReplicaDataError(
                    f"the commitlog file at {prev} ends at {prev_scan.next_pos} without "
                    "its BLANK filler"
                )
            done = prev_scan.records
            pos = file_from
        elif cur.need and phy_offset - pos + len(data) < cur.need:
            return ReplicaScan(pos, cur.need)
        buf = data
        if phy_offset > pos:
            head = cl.read(pos, phy_offset - pos)
            if head is None:
                raise RuntimeError(f"replica bytes from {pos} to {phy_offset} unreadable")
            buf = head + data
        scan = scan_replica(buf, pos, file_from, size, max_size=max_size)
        if done:
            scan.records[:0] = done
        return scan

    async def _replica_room(
        self, phy_offset: int, empty: bool, records: list[DispatchRequest]
    ) -> None:
        """Create, in worker threads, the files a replica append needs before anything is
        written (a full disk refuses it whole, as `_make_room` does puts): the commitlog
        file named by `phy_offset` when the bytes start one, and the next file of each
        consume queue whose last one cannot take the units of `records`. Creating a file
        (fallocate, mmap) blocks on the filesystem: never on the event loop, as the flush
        service creates the next files of puts ahead of time.

        Raises:
            OSError: a file cannot be created (ENOSPC is told to the disk monitor).
            StoreClosedError: the store closed meanwhile.
        """
        mfq = self.commitlog.mfq
        awaited = False
        if empty:
            there = mfq.files[0].file_from_offset if mfq.files else mfq.prepared_offset
            if there is not None and there != phy_offset:
                await self._replica_start_at(phy_offset)
                awaited = True
        last = mfq.last_file
        if (last is None or last.is_full) and mfq.prepared_offset != phy_offset:
            try:
                await trio.to_thread.run_sync(mfq.prepare, phy_offset)
            except OSError as exc:
                self._out_of_space(exc, mfq.file_size, "commitlog")
                raise
            awaited = True
        todo = self._replica_queues_short(records)
        if todo:
            try:
                await trio.to_thread.run_sync(_queues_room, todo)
            except OSError as exc:
                self._out_of_space(exc, self.config.mapped_file_size_consume_queue, "consume queue")
                raise
            awaited = True
        if awaited:
            self._require_writable()

    def _replica_queues_short(
        self, records: list[DispatchRequest]
    ) -> list[tuple[ConsumeQueue, int, int]]:
        """The consume queues whose last file cannot take the units of `records` (no system
        call), each with its first queue offset and unit count."""
        counts: dict[tuple[str, int], list[int]] = {}
        for req in records:
            if is_not_queued(req.sys_flag):
                continue
            key = (req.topic, req.queue_id)
            seen = counts.get(key)
            if seen is None:
                counts[key] = [req.queue_offset, 1]
            else:
                seen[1] += 1
        short: list[tuple[ConsumeQueue, int, int]] = []
        cqs = self.dispatcher.consume_queues
        for (topic, queue_id), (first, count) in counts.items():
            cq = cqs.get((topic, queue_id))
            if cq is None:
                cq = self.dispatcher.get_cq(topic, queue_id)
            else:
                files = cq.mfq.files
                if files and files[-1].remaining >= count * CQ_UNIT_SIZE:
                    continue
            short.append((cq, first, count))
        return short

    async def _replica_start_at(self, start: int) -> None:
        """The first bytes of an empty store start at `start`, not where its empty first file
        (or the file prepared at open) is: give those files up, so that the files on disk
        follow one another from `start` (a file left at 0 would stop the next load at the
        gap before `start`). Their names are removed, durably, in a worker thread before
        anything is written; they stay mapped until close, since the flush service's worker
        threads may be using the last file (reserving blocks ahead) without a lock."""
        mfq = self.commitlog.mfq
        async with self.flush_service.commitlog_lock:  # no flush round over them in flight
            gone = mfq.detach_all()
        self._replica_discarded.extend(gone)
        log.info("replica_first_file", offset=start, given_up=[mf.path.name for mf in gone])
        await trio.to_thread.run_sync(_unlink_all, gone, mfq.directory)

    def _dispatch_replica(self, scan: ReplicaScan) -> None:
        """Dispatch the records an append completed and move the cursor past them."""
        cur = self._replica
        cl = self.commitlog
        table = cl.topic_queue_table
        dispatcher = self.dispatcher
        replicated = dispatcher.replicated
        index = dispatcher.index
        # As a run of puts: the index entries are written in runs of one topic (hashed in
        # one call) and each queue's listeners are told once, after the loop. Synchronous:
        # no run of puts can be open meanwhile (a slave takes none; runs never suspend).
        dispatcher.holding = True
        if index is not None:
            index.deferring = True
        try:
            for req in scan.records:
                try:
                    replicated(req)
                except OSError:
                    # The bytes are written: the next append dispatches again from this
                    # record (consume queues and index skip what they hold already).
                    cur.need = 0
                    log.exception(
                        "replica_dispatch_failed",
                        phy_offset=req.commit_log_offset,
                        topic=req.topic,
                        queue_id=req.queue_id,
                    )
                    raise
                cur.pos = req.commit_log_offset + req.size
                cl.last_store_timestamp = req.store_timestamp
                if not is_not_queued(req.sys_flag):
                    key = (req.topic, req.queue_id)
                    if table.get(key, 0) <= req.queue_offset:
                        table[key] = req.queue_offset + 1
        finally:
            try:
                if index is not None:
                    index.build_deferred()
            finally:
                dispatcher.release_arrivals()
        cur.pos = scan.next_pos
        cur.need = scan.need

    # ================================================================== truncation
    async def truncate_commitlog(self, offset: int) -> int:
        """Cut the commitlog at `offset`, dropping every record from there on (RocketMQ 5.x
        ``truncateFiles``): a master that was replaced cuts what its group never
        acknowledged before it follows the new master (`append_replica` from `offset`).

        `offset` must be a record boundary within ``[min_phy_offset, max_phy_offset]``: a
        file start, the start or end of a record found scanning its file from the start
        (recovery's `FileScanner`), or the max offset (nothing to do: returns 0). Afterwards
        the max phy offset is `offset`; consume queues, index, topic queue table, flush
        positions, checkpoint and replica cursor agree with it, as after recovery cut a torn
        tail there. The bytes after `offset` in its file are zeroed and that file synced,
        and later files removed, before the call returns: a crash right after recovers to
        `offset`.

        The caller guarantees that no appends are in flight (no puts, no run of puts open;
        `append_replica` calls wait for this one). Reads may come at any time: they see the
        store before the cut or after it. Not cancellable once the cut has begun.

        Returns:
            The number of commitlog bytes dropped.

        Raises:
            ValueError: `offset` is out of range or not a record boundary; nothing changed.
            RuntimeError: a run of puts is open (`begin_staging`); nothing changed.
            StoreClosedError: The store is not open, or closing.
            OSError: The zeroing, a sync or a removal failed after the cut: the store holds
                the cut in memory but refuses appends until reopened (the disk may still
                hold the dropped records).
        """
        self._require_writable()
        async with self._replica_lock:  # no replica append meanwhile
            self._require_writable()
            flush = self.flush_service
            # No flush round over a file being cut or removed, no consume-queue flush (it
            # writes the checkpoint) and no cleanup detaching files meanwhile: all take these.
            async with flush.commitlog_lock, flush.cq_lock:
                mfq = self.commitlog.mfq
                lo, hi = mfq.min_offset, mfq.max_offset
                if not lo <= offset <= hi:
                    raise ValueError(
                        f"commitlog offset {offset} is outside the stored range [{lo}, {hi}]"
                    )
                if offset == hi:
                    return 0
                last = mfq.last_file
                if self.dispatcher.holding or (last is not None and last.staged):
                    raise RuntimeError("truncate_commitlog within a run of puts")
                mf = mfq.find(offset)
                assert mf is not None, offset  # below the max offset
                prev = mfq.find(mf.file_from_offset - 1)
                # Scanning up to a whole file: worker thread.
                keep_ts = await trio.to_thread.run_sync(self._cut_point, offset, mf, prev)
                # Once begun, the cut completes: stopped halfway, the bytes past `offset`
                # would stay on disk for a crash to bring back.
                with trio.CancelScope(shield=True):
                    dropped = await self._cut(offset, keep_ts)
        return dropped

    def _cut_point(self, offset: int, mf: MappedFile, prev: MappedFile | None) -> int:
        """Check that `offset` (in `mf`, below the max offset) is a record boundary; return
        the store timestamp of the last record before it (0 if none; when that record is in
        `prev`, the previous file, the first one's there, a lower bound). Blocking: reads
        the files.

        Raises:
            ValueError: `offset` is not a record boundary.
        """
        ts = 0
        if offset > mf.file_from_offset:
            found = False
            with _scan_file(mf, self._max_record_size) as records:
                for req in records:
                    start = req.commit_log_offset
                    if start >= offset:
                        found = start == offset
                        break
                    ts = req.store_timestamp
                    if start + req.size == offset:
                        found = True
                        break
            if not found:
                raise ValueError(f"commitlog offset {offset} is not a record boundary")
        if not ts and prev is not None:
            with _scan_file(prev, self._max_record_size) as records:
                ts = next((req.store_timestamp for req in records), 0)
        return ts

    async def _cut(self, offset: int, keep_ts: int) -> int:
        """`truncate_commitlog` once `offset` is checked (its locks held, shielded)."""
        cl = self.commitlog
        mfq = cl.mfq
        old_max = mfq.max_offset
        # The cut itself, on the event loop in one synchronous stretch, so that readers see
        # the store before it or after it: the files past `offset` leave the list and the
        # write position of the one holding it moves back to it (what `truncate_to` does,
        # without zeroing: nothing reads past a write position, so the bytes there are
        # zeroed afterwards, off the loop).
        files = mfq.files
        kept = [mf for mf in files if mf.file_from_offset < offset] or files[:1]
        gone = files[len(kept) :]
        last = kept[-1]
        rel = offset - last.file_from_offset
        last.wrote_position = rel
        last.flushed_position = min(last.flushed_position, rel)
        mfq.files = kept
        mfq.flushed_where = min(mfq.flushed_where, offset)
        # Consume queues and their table, as recovery leaves them after a torn tail.
        queues: list[ConsumeQueue] = []
        cq_gone: list[MappedFile] = []
        table: dict[tuple[str, int], int] = {}
        units = 0
        for cq in self.dispatcher.consume_queues.values():
            lost, detached = _cut_queue(cq, offset)
            if lost or detached:
                queues.append(cq)
                cq_gone.extend(detached)
                units += lost
            if cq.max_offset_in_queue:
                table[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue
        cl.topic_queue_table = table
        index = self.dispatcher.index
        if index is not None and index.kept:  # none between runs; never one past the cut
            index.kept = [req for req in index.kept if req.commit_log_offset < offset]
        self._replica.reset(offset)
        cut_regions = [r for r in self.damaged_regions if r.end > offset]  # none straddles
        self._damaged = [(a, b) for a, b in self._damaged if b <= offset]
        # The checkpoint never names a store time past the last record kept: a crash
        # recovery would start scanning too late, after the records written from here on.
        cl.last_store_timestamp = keep_ts
        cp = self.checkpoint
        cp.physic_msg_timestamp = min(cp.physic_msg_timestamp, keep_ts)
        cp.logics_msg_timestamp = min(cp.logics_msg_timestamp, keep_ts)
        cp.index_msg_timestamp = min(cp.index_msg_timestamp, keep_ts)
        try:
            # ftruncate of up to a whole file's tail, fsync, munmap and unlink of many
            # files: worker thread.
            await trio.to_thread.run_sync(
                functools.partial(
                    self._cut_files,
                    offset,
                    gone,
                    queues,
                    cq_gone,
                    cut_regions,
                )
            )
        except OSError as exc:
            self._write_failed = (
                f"commitlog truncation to {offset} failed ({exc}); appends are refused until "
                "the store is reopened"
            )
            log.exception("commitlog_truncate_failed", offset=offset)
            raise
        dropped = old_max - offset
        log.warning(
            "commitlog_truncated_online",
            offset=offset,
            dropped_bytes=dropped,
            dropped_files=[mf.path.name for mf in gone],
            queue_units_dropped=units,
            queues=len(queues),
        )
        return dropped

    def _cut_files(
        self,
        offset: int,
        gone: list[MappedFile],
        queues: list[ConsumeQueue],
        cq_gone: list[MappedFile],
        cut_regions: list[DamagedRegion],
    ) -> None:
        """The disk side of `_cut` (blocking: worker thread), durable when it returns."""
        mfq = self.commitlog.mfq
        # Recovery's cut of a torn tail; the list is cut already, so this zeroes the rest of
        # the file holding `offset` (a hole punched, as recovery does) and gives back the
        # file prepared ahead, which may lie past the cut.
        gone = gone + mfq.truncate_to(offset)
        last = mfq.last_file
        if last is not None:
            last.fsync()
        _destroy_all(gone)
        _fsync_path(mfq.directory)
        _destroy_all(cq_gone)
        for cq in queues:
            cq_last = cq.mfq.last_file
            if cq_last is not None:
                cq_last.fsync()
            _fsync_path(cq.mfq.directory)
        index = self.dispatcher.index
        if index is not None:
            # The file straddling `offset` is sealed, later ones deleted (as after recovery).
            index.truncate(offset)
            index_files = index.files
            if index_files:
                _fsync_path(index_files[-1].path)  # the sealed header
            _fsync_path(index.directory)
        if cut_regions:
            _retire_damaged_copies(self.root, cut_regions)
        self.checkpoint.flush()

    # ================================================================== lookups
    def read_record(self, phy_offset: int, size: int | None = None) -> bytes | None:
        """Raw record at a commitlog offset (size read from the record when None).

        Raises:
            StoreClosedError: The store is not open (its files are unmapped).
        """
        self._require_open()
        if self._damaged and self._is_damaged(phy_offset):
            return None
        if size is None:
            return self.commitlog.read_record(phy_offset)
        return self.commitlog.read(phy_offset, size)

    def look_message_by_offset(self, phy_offset: int, size: int | None = None) -> MessageExt | None:
        """Decoded record at a commitlog offset, or None when there is none."""
        raw = self.read_record(phy_offset, size)
        if raw is None:
            return None
        try:
            return decode_record(raw)
        except MessageDecodeError:
            return None

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
    ) -> QueryMessageResult:
        """Records of `topic` whose KEYS or UNIQ_KEY contains `key`, stored in
        [begin_ts, end_ts], through the index (at most `max_num`)."""
        self._require_open()
        res = QueryMessageResult()
        index = self.dispatcher.index
        if index is None or max_num <= 0:
            return res
        offsets, last_ts, last_phy = index.query(topic, key, max_num, begin_ts, end_ts)
        res.index_last_update_timestamp = last_ts
        res.index_last_update_phyoffset = last_phy
        damaged = self._damaged
        for phy in offsets:  # each offset once (`IndexService.query`)
            if damaged and self._is_damaged(phy):
                continue
            raw = self.commitlog.read_record(phy)
            if raw is None:
                continue
            try:
                m = decode_record(raw, read_body=False)
            except MessageDecodeError:
                continue
            # The index is a hash: make sure the record really has the key.
            if m.topic != topic or (key != m.uniq_key and key not in (m.keys or "").split(" ")):
                continue
            res.buffers.append(raw)
            if len(res.buffers) >= max_num:
                break
        return res

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First logical offset stored at or after `timestamp_ms` (max offset if none; 0
        without a queue)."""
        self._require_open()
        cq = self.dispatcher.find_cq(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp_ms, self.commitlog.store_timestamp_at)

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Commitlog offset of the first stored message at or after logical `offset` of a
        queue (RocketMQ's getCommitLogOffsetInQueue, clamped to what is stored), None when
        there is none (no queue, or `offset` at or past its end). Memory reads only."""
        cq = self.dispatcher.find_cq(topic, queue_id)
        if cq is None:
            return None
        end = cq.max_offset_in_queue
        offset = max(offset, cq.min_offset_in_queue)
        for off in range(offset, min(end, offset + 64)):  # past a few gap units
            unit = cq.get_unit(off)
            if unit is None:
                return None
            if unit[1] != GAP_UNIT_SIZE:
                return unit[0]
        return None if offset >= end else self.commitlog.min_offset

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """One past the last logical offset (0 without a queue)."""
        cq = self.dispatcher.find_cq(topic, queue_id)
        return 0 if cq is None else cq.max_offset_in_queue

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """First logical offset still stored (0 without a queue)."""
        cq = self.dispatcher.find_cq(topic, queue_id)
        return 0 if cq is None else cq.min_offset_in_queue

    def get_message_store_timestamp(self, topic: str, queue_id: int, offset: int) -> int:
        """Store timestamp of the message at a logical offset, -1 when there is none."""
        self._require_open()
        cq = self.dispatcher.find_cq(topic, queue_id)
        if cq is None or offset < cq.min_offset_in_queue:
            return -1
        unit = cq.get_unit(offset)
        if unit is None:
            return -1
        ts = self.commitlog.store_timestamp_at(unit[0], unit[1])
        return -1 if ts is None else ts

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store timestamp of the queue's first stored message, -1 when there is none."""
        cq = self.dispatcher.find_cq(topic, queue_id)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.min_offset_in_queue)

    @property
    def max_phy_offset(self) -> int:
        """Commitlog offset where the next record goes."""
        return self.commitlog.max_offset

    @property
    def min_phy_offset(self) -> int:
        """First commitlog offset still stored."""
        return self.commitlog.min_offset

    async def prepare_queues(self, topic: str, queue_ids: Iterable[int]) -> int:
        """Create the first consume-queue file of each new queue of `topic` ahead of its first
        message (a topic just created), its first page faulted in by a worker thread.

        Without it the first message of each queue pays for the new file's first page (ext4
        block allocation) on the event loop, which a burst of sends to a fresh topic's queues
        all wait for. Queues that exist already (or had records) are left alone; the new
        queues read as empty, exactly as missing ones. Returns how many queues were prepared.
        (docs/design-notes.md, "Consume queues prepared ahead")
        """
        self._require_open()
        consume_queues = self.dispatcher.consume_queues
        queue_table = self.commitlog.topic_queue_table
        paths: list[Path] = []
        for n, queue_id in enumerate(queue_ids):
            if n % 16 == 15:
                # Each new file is a few syscalls on the event loop: let others run between.
                await trio.lowlevel.checkpoint()
                self._require_open()
            key = (topic, queue_id)
            if key in consume_queues or key in queue_table:
                continue
            try:
                cq = self.dispatcher.get_cq(topic, queue_id)
                paths.append(cq.mfq.file_for_append(0).path)
            except StorePathError as exc:
                log.warning("consume_queue_refused", topic=topic[:80], error=str(exc))
                break
            except OSError as exc:
                log.warning(
                    "consume_queue_prepare_failed", topic=topic, queue=queue_id, error=str(exc)
                )
                # Out of descriptors or space: every later queue fails the same way.
                break
        if paths:
            await trio.to_thread.run_sync(_populate_first_pages, paths)
        return len(paths)

    def add_arrival_listener(self, cb: ArrivalListener) -> None:
        """Call ``cb(topic, queue_id, new_max_offset)`` after each dispatched record."""
        self.dispatcher.listeners.append(cb)

    def delete_topics(self, topics: Iterable[str]) -> None:
        """Forget the consume queues of `topics` and delete their files (in the background when
        the store is running). The commitlog keeps the records until cleanup.

        Each topic directory is renamed out of the way at once (a metadata-only rename), so a
        queue of the same name created right after starts from empty files.
        """
        names = set(topics)
        doomed: list[ConsumeQueue] = []
        for key in [k for k in self.dispatcher.consume_queues if k[0] in names]:
            doomed.append(self.dispatcher.consume_queues.pop(key))
            self.commitlog.topic_queue_table.pop(key, None)
        cq_root = consume_queue_root(self.root)
        trash: list[Path] = []
        for t in sorted(names):
            src = cq_root / t
            if src.is_dir():
                self._trash_seq += 1
                dst = cq_root / f".deleted-{os.getpid()}-{self._trash_seq}-{t}"
                os.rename(src, dst)
                trash.append(dst)
        if not doomed and not trash:
            return
        log.info("topics_deleted", topics=sorted(names), queues=len(doomed))
        if self._nursery is not None and self._running:
            self._nursery.start_soon(self._destroy_cqs, doomed, trash)
        else:
            self._destroy_cqs_sync(doomed, trash)

    async def _destroy_cqs(self, cqs: list[ConsumeQueue], trash: list[Path]) -> None:
        async with self.flush_service.cq_lock:
            # munmap + recursive delete: worker thread.
            await trio.to_thread.run_sync(self._destroy_cqs_sync, cqs, trash)

    @staticmethod
    def _destroy_cqs_sync(cqs: list[ConsumeQueue], trash: list[Path]) -> None:
        for cq in cqs:
            for mf in cq.mfq.detach_all():
                mf.close()  # the files moved to `trash`; their old paths may be reused
        for d in trash:
            shutil.rmtree(d, ignore_errors=True)

    def runtime_info(self) -> dict[str, str]:
        """Counters for GET_BROKER_RUNTIME_INFO (all values are strings)."""
        put_tps, get_tps = self._stats.tps()
        cl = self.commitlog
        return {
            "putTps": f"{put_tps:.2f}",
            "getFoundTps": f"{get_tps:.2f}",
            "putMessageTotalTimes": str(self._stats.put_msgs),
            "putMessageSizeTotal": str(self._stats.put_bytes),
            "getMessageTotalTimes": str(self._stats.get_total),
            "getMessageFoundTotal": str(self._stats.get_found),
            "commitLogMinOffset": str(cl.min_offset),
            "commitLogMaxOffset": str(cl.max_offset),
            "commitLogDirCapacity": str(commitlog_dir(self.root)),
            "commitLogDiskRatio": f"{self.cleanup_service.disk_ratio:.4f}",
            "consumeQueueCount": str(len(self.dispatcher.consume_queues)),
            "flushRounds": str(self.flush_service.flush_rounds),
            "commitLogFilesDeleted": str(self.cleanup_service.deleted_files),
            **self.disk_info(),
            **self.recovery_info(),
        }

    def disk_info(self) -> dict[str, str]:
        """Disk state (strings, for GET_BROKER_RUNTIME_INFO): whether and why puts are refused
        (`store._disk`), and why cleanup keeps files under disk pressure (`store._cleanup`)."""
        return {
            "diskFull": "true" if self.disk.refusal is not None else "false",
            "diskFreeBytes": str(self.disk.free),
            "putRefusedReason": self._refusal() or "",
            "commitLogCleanBlocked": self.cleanup_service.blocked,
            "cleanFileForciblyEnable": str(self.config.clean_file_forcibly_enable).lower(),
        }

    def recovery_info(self) -> dict[str, str]:
        """What the last start found damaged or lost, and the index rebuild's state (strings,
        for GET_BROKER_RUNTIME_INFO)."""
        rep = self.recovery
        regions = self.damaged_regions
        info = {
            "recoveryDamagedRegions": ";".join(r.describe() for r in regions) or "none",
            "recoveryDamagedBytes": str(sum(r.length for r in regions)),
            "recoveryDamagedRecords": str(sum(r.records or 0 for r in regions)),
            "recoveryDamagedRecordsUnknown": str(sum(r.records is None for r in regions)),
            "recoveryDamagedQueueUnits": str(self.damaged_queue_units),
            "recoveryTruncatedBytes": str(rep.truncated_bytes if rep else 0),
            "recoveryDroppedFiles": str(rep.dropped_files if rep else 0),
            "indexRebuild": self.index_rebuild_state,
        }
        rb = self.index_rebuild
        if rb is not None:
            info["indexRebuildRange"] = f"{rb.start}-{rb.end}"
            info["indexRebuildOffset"] = str(rb.pos)
            info["indexRebuildKeys"] = str(rb.keys)
        return info

    def _require_open(self) -> None:
        if not self._running:
            raise StoreClosedError("the store is not open")


def _physical_memory() -> int:
    """Bytes of physical memory (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0

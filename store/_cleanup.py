"""Cleanup: delete old commitlog files, then the consume-queue and index files that only point
below the new commitlog min offset.

Files older than `file_reserved_hours` go at the `delete_when` hour(s). When disk usage is above
`disk_max_used_ratio`, the oldest files go at once whatever their age (never the current file),
but only those no consumer still needs: the store knows nothing of consumer
groups, so its owner (the broker) gives it `needed`, a callable returning the smallest commitlog
offset some consumer has not consumed yet (and who), and a file ending after that offset is
kept; the reason is logged and shown in `blocked` (runtime info `commitLogCleanBlocked`). Puts
are refused instead once the disk is full (`store._disk`). With `clean_file_forcibly_enable`
those files are deleted all the same (RocketMQ's forced deletion): their unconsumed messages are
lost. Without `needed` (a store used on its own) nothing is known to be needed.
The clock and the disk-usage function are injectable for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
import trio

from store._disk import DiskMonitor, DiskUsage, disk_usage_ratio
from store._dispatcher import Dispatcher
from store._flush import FlushService
from store._mapped_file import MappedFile
from store.commitlog import CommitLog
from store.config import StoreConfig

__all__ = ["CleanupService", "Clock", "DiskUsage", "NeededOffset", "disk_usage_ratio"]

log = structlog.get_logger()

Clock = Callable[[], float]
"""Wall-clock seconds since the epoch (``time.time``)."""
NeededOffset = Callable[[], tuple[int, str] | None]
"""The smallest commitlog offset a consumer still needs and a description of who (e.g. "group
G, topic T, queue 3 at offset 10 of 900"), or None when every stored message is consumed."""

MAX_FILES_PER_RUN = 10
BLOCKED_LOG_EVERY_S = 60.0
"""While cleanup keeps files for consumers, it says so at most this often (and on change)."""


def _destroy_all(files: list[MappedFile]) -> None:
    for mf in files:
        mf.destroy()


def _delete_hours(spec: str) -> set[int]:
    hours: set[int] = set()
    for part in spec.replace(",", ";").split(";"):
        part = part.strip()
        if part.isdigit():
            hours.add(int(part))
    return hours


class CleanupService:
    """Periodic deletion of expired files (``nursery.start_soon(service.run)``).

    Attributes:
        deleted_files: Commitlog files deleted so far.
        needed: Where consumers stand (see `NeededOffset`); None: nothing is known to be
            needed.
        blocked: Why files are kept under disk pressure ("" when they are not).
    """

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        dispatcher: Dispatcher,
        flush: FlushService,
        *,
        clock: Clock,
        disk: DiskMonitor,
        needed: NeededOffset | None = None,
    ) -> None:
        self._cfg = config
        self._cl = commitlog
        self._dispatcher = dispatcher
        self._flush = flush
        self._clock = clock
        self._disk = disk
        self._hours = _delete_hours(config.delete_when)
        self.deleted_files = 0
        self.needed = needed
        self.blocked = ""
        self._blocked_logged: tuple[str, float] = ("", 0.0)
        # One round at a time: the periodic one and those an admin asks for.
        self._round = trio.Lock()

    @property
    def disk_ratio(self) -> float:
        """Disk usage seen by the last check."""
        return self._disk.ratio

    def check_disk(self) -> float:
        """Measure the disk now (blocking statvfs: tests) and return the used fraction."""
        try:
            self._disk.check()
        except OSError:
            log.exception("disk_usage_failed")
        return self._disk.ratio

    async def _measure(self) -> float:
        try:
            # statvfs can block on a slow filesystem: worker thread.
            await trio.to_thread.run_sync(self._disk.read)
        except OSError:
            log.exception("disk_usage_failed")
        self._disk.evaluate()
        return self._disk.ratio

    async def clean_once(self) -> int:
        """One cleanup round. Returns how many commitlog files were deleted."""
        async with self._round:
            return await self._clean_once()

    async def delete_expired_now(self) -> int:
        """Delete the commitlog files past their reserved time now, whatever the hour
        (`delete_when`), then the consume-queue and index files that pointed into them: an
        admin's request (RocketMQ's manual delete). Returns how many commitlog files went."""
        async with self._round:
            deleted = await self._delete_commitlog_files(self._clock(), False)
            if deleted:
                await self._follow_commitlog()
            return deleted

    async def clean_expired_consume_queues(self) -> None:
        """Delete the consume-queue and index files that point only below the commitlog's first
        offset (as after a round that deleted commitlog files): an admin's request."""
        async with self._round:
            await self._follow_commitlog()

    async def _clean_once(self) -> int:
        ratio = await self._measure()
        force = ratio > self._cfg.disk_max_used_ratio
        now = self._clock()
        at_hour = time.localtime(now).tm_hour in self._hours
        deleted = 0
        if force or at_hour:
            deleted = await self._delete_commitlog_files(now, force)
        else:
            self.blocked = ""
        if deleted:
            await self._follow_commitlog()
        return deleted

    def _needed_offset(self) -> tuple[int, str] | None:
        if self.needed is None or self._cfg.clean_file_forcibly_enable:
            return None
        try:
            return self.needed()
        except Exception:
            # Unknown is not "nothing needed": keep the files, as if everything were.
            log.exception("cleanup_needed_offset_failed")
            return 0, "unknown (the consumer offsets could not be read)"

    async def _delete_commitlog_files(self, now: float, force: bool) -> int:
        reserved_s = self._cfg.file_reserved_hours * 3600
        deleted = 0
        mfq = self._cl.mfq
        # Where consumers stand: once per round, on the event loop (it reads the broker's
        # offset table and one consume-queue unit per queue with an offset: no file I/O).
        needed = self._needed_offset() if force else None
        kept = ""
        while deleted < MAX_FILES_PER_RUN and len(mfq.files) > 1:
            # Detach under the lock (no fsync of that file is in flight, and no later flush
            # plan includes it), then unmap and unlink without holding up group commit.
            async with self._flush.commitlog_lock:
                if len(mfq.files) <= 1:
                    break
                first = mfq.files[0]
                expired = first.mtime() + reserved_s <= now
                if not expired and not force:
                    break
                if not expired and needed is not None:
                    file_end = first.file_from_offset + first.file_size
                    if needed[0] < file_end:
                        kept = self._kept_for_consumers(first.path.name, needed)
                        break
                gone = mfq.detach_first(1)
            if not expired:
                log.warning(
                    "commitlog_deleted_for_disk_space",
                    file=first.path.name,
                    disk_ratio=round(self.disk_ratio, 3),
                    forcibly=self._cfg.clean_file_forcibly_enable,
                )
            # munmap + unlink of a big file block: worker thread.
            await trio.to_thread.run_sync(_destroy_all, gone)
            deleted += 1
            log.info("commitlog_file_deleted", file=first.path.name, expired=expired)
            if force and not expired and await self._measure() <= self._cfg.disk_max_used_ratio:
                force = False
        self.blocked = kept
        self.deleted_files += deleted
        return deleted

    def _kept_for_consumers(self, first_file: str, needed: tuple[int, str]) -> str:
        """Say (log, `blocked`) why cleanup keeps the files from `first_file` on."""
        cfg = self._cfg
        offset, who = needed
        reason = (
            f"commitlog files from {first_file} kept although the disk is "
            f"{self.disk_ratio:.1%} used (cleanup above {cfg.disk_max_used_ratio:.0%}): they "
            f"hold messages not consumed yet (from commitlog offset {offset}: {who}); sends "
            f"are refused above {cfg.disk_hard_ratio:.0%}. clean_file_forcibly_enable=true "
            "would delete them, losing those messages"
        )
        now = time.monotonic()
        last_reason, last_at = self._blocked_logged
        if who != last_reason or now - last_at >= BLOCKED_LOG_EVERY_S:
            self._blocked_logged = (who, now)
            log.warning(
                "commitlog_kept_for_consumers",
                first_file=first_file,
                min_needed_offset=offset,
                needed_by=who,
                disk_ratio=round(self.disk_ratio, 3),
            )
        return reason

    async def _follow_commitlog(self) -> None:
        min_phy = self._cl.min_offset
        gone: list[MappedFile] = []
        async with self._flush.cq_lock:
            for cq in list(self._dispatcher.consume_queues.values()):
                gone.extend(cq.expired_files(min_phy))
                cq.correct_min_offset(min_phy)
        # unlink: worker thread (the files are detached, no flush can touch them).
        await trio.to_thread.run_sync(_destroy_all, gone)
        index = self._dispatcher.index
        if index is not None:
            # unlink of index files: worker thread.
            await trio.to_thread.run_sync(index.delete_expired, min_phy)

    async def run(self) -> None:
        """Clean every `clean_resource_interval_ms` until cancelled."""
        while True:
            await trio.sleep(self._cfg.clean_resource_interval_ms / 1000)
            try:
                await self.clean_once()
            except OSError:
                log.exception("cleanup_failed")

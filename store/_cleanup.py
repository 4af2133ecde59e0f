"""Cleanup: delete old commitlog files, then the consume-queue and index files that only point
below the new commitlog min offset.

Files older than `file_reserved_hours` go at the `delete_when` hour(s); when disk usage is above
`disk_max_used_ratio`, the oldest files go at once whatever their age (never the current file).
The clock and the disk-usage function are injectable for tests.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from store._dispatcher import Dispatcher
from store._flush import FlushService
from store._mapped_file import MappedFile
from store.commitlog import CommitLog
from store.config import StoreConfig

__all__ = ["CleanupService", "Clock", "DiskUsage", "disk_usage_ratio"]

log = structlog.get_logger()

Clock = Callable[[], float]
"""Wall-clock seconds since the epoch (``time.time``)."""
DiskUsage = Callable[[Path], float]
"""Used fraction (0..1) of the filesystem holding a path."""

MAX_FILES_PER_RUN = 10


def disk_usage_ratio(path: Path) -> float:
    """Used fraction of the filesystem holding `path`."""
    usage = shutil.disk_usage(path)
    return (usage.total - usage.free) / usage.total if usage.total else 0.0


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
        disk_ratio: Disk usage seen by the last check.
        deleted_files: Commitlog files deleted so far.
    """

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        dispatcher: Dispatcher,
        flush: FlushService,
        *,
        clock: Clock,
        disk_usage: DiskUsage,
    ) -> None:
        self._cfg = config
        self._cl = commitlog
        self._dispatcher = dispatcher
        self._flush = flush
        self._clock = clock
        self._disk_usage = disk_usage
        self._hours = _delete_hours(config.delete_when)
        self.disk_ratio = 0.0
        self.deleted_files = 0

    def check_disk(self) -> float:
        """Refresh and return `disk_ratio`."""
        try:
            self.disk_ratio = self._disk_usage(self._cfg.store_path_root_dir)
        except OSError:
            log.exception("disk_usage_failed")
        return self.disk_ratio

    async def clean_once(self) -> int:
        """One cleanup round. Returns how many commitlog files were deleted."""
        ratio = self.check_disk()
        force = ratio > self._cfg.disk_max_used_ratio
        now = self._clock()
        at_hour = time.localtime(now).tm_hour in self._hours
        deleted = 0
        if force or at_hour:
            deleted = await self._delete_commitlog_files(now, force)
        if deleted:
            await self._follow_commitlog()
        return deleted

    async def _delete_commitlog_files(self, now: float, force: bool) -> int:
        reserved_s = self._cfg.file_reserved_hours * 3600
        deleted = 0
        mfq = self._cl.mfq
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
                gone = mfq.detach_first(1)
            if not expired:
                log.warning(
                    "commitlog_deleted_for_disk_space",
                    file=first.path.name,
                    disk_ratio=round(self.disk_ratio, 3),
                )
            # munmap + unlink of a big file block: worker thread.
            await trio.to_thread.run_sync(_destroy_all, gone)
            deleted += 1
            log.info("commitlog_file_deleted", file=first.path.name, expired=expired)
            if force and not expired and self.check_disk() <= self._cfg.disk_max_used_ratio:
                force = False
        self.deleted_files += deleted
        return deleted

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

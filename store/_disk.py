"""Free space of the store's filesystem, for refusing puts before the disk is full.

The put path never asks the filesystem: it reads `DiskMonitor.refusal`, a cached verdict that
the monitor task refreshes every `disk_check_interval_ms` (statvfs in a worker thread: it can
block on a slow or network filesystem), and at once when a file could not be created for want
of space (`out_of_space`). Puts are refused (SERVICE_NOT_AVAILABLE, "maybe disk full, ...") while

- the filesystem is more than `disk_hard_ratio` used (RocketMQ's 90% guard);
- fewer than `headroom` bytes are free: what the files that are not reserved may still take
  (the index files are sparse and written through a map, so a page of one could fault with
  SIGBUS on a full disk) plus metadata (checkpoint, config files);
- a file could not be created (ENOSPC) and the space it needs is still not free.

Each condition clears by itself once space is freed (cleanup, an operator), at the next check.
The monitor also reserves the blocks of the index file being written (`reserve_file` on its
path; it never changes its contents), so that only the first second of each index file's life
depends on the headroom.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from store._mapped_file import reserve_file
from store.config import StoreConfig

__all__ = ["DiskMonitor", "DiskUsage", "disk_usage_ratio"]

log = structlog.get_logger()

DiskUsage = Callable[[Path], float]
"""Used fraction (0..1) of the filesystem holding a path."""

METADATA_HEADROOM = 1 << 20
"""Bytes kept free for the checkpoint and the broker's config files (written, never mapped)."""


def disk_usage_ratio(path: Path) -> float:
    """Used fraction of the filesystem holding `path`."""
    usage = shutil.disk_usage(path)
    return (usage.total - usage.free) / usage.total if usage.total else 0.0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class DiskMonitor:
    """The cached disk verdict of one store (``nursery.start_soon(monitor.run)``).

    Args:
        root: The store root (its filesystem is measured).
        config: Store configuration (`disk_hard_ratio`, `disk_check_interval_ms`).
        headroom: Bytes that must stay free (see the module docstring).
        disk_usage: Injected used-fraction function (tests); free bytes are then unknown.
        index_files: The index files' paths, newest last (their blocks are reserved).

    Attributes:
        ratio: Used fraction at the last check.
        free: Free bytes at the last check (-1: unknown).
        refusal: Why puts are refused now ("maybe disk full, ..."), None when they are not.
    """

    def __init__(
        self,
        root: Path,
        config: StoreConfig,
        *,
        headroom: int,
        disk_usage: DiskUsage | None = None,
        index_files: Callable[[], list[Path]] | None = None,
    ) -> None:
        self._root = root
        self._cfg = config
        self.headroom = headroom
        self._usage = disk_usage
        self._index_files = index_files
        self._index_reserved: Path | None = None
        self.ratio = 0.0
        self.free = -1
        self.refusal: str | None = None
        # After ENOSPC: bytes that must be free again, and what could not be created.
        self._needed = 0
        self._needed_what = ""
        self._stale = False  # `out_of_space` since the last reading
        self._index_failure: tuple[int, OSError] | None = None  # from `read`'s thread
        self._wake = trio.Event()
        self.checks = 0

    # ------------------------------------------------------------------ readings
    def read(self) -> None:
        """Measure the filesystem now. Blocks (statvfs): worker thread, except in tests."""
        if self._usage is not None:
            self.ratio = self._usage(self._root)
            self.free = -1
        else:
            st = os.statvfs(self._root)
            total = st.f_blocks * st.f_frsize
            avail = st.f_bavail * st.f_frsize
            used = total - st.f_bfree * st.f_frsize
            # As df: used / (used + available to unprivileged writers).
            self.ratio = used / (used + avail) if used + avail else 0.0
            self.free = avail
        self.checks += 1
        self._stale = False
        self._reserve_index()

    def _reserve_index(self) -> None:
        if self._index_files is None:
            return
        files = self._index_files()
        if not files or files[-1] == self._index_reserved:
            return
        path = files[-1]
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            reserve_file(fd, 0, size, path)
            self._index_reserved = path
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self._index_failure = (size, exc)  # handled on the event loop (`evaluate`)
            else:
                log.warning("index_file_not_reserved", path=str(path), error=str(exc))
        finally:
            os.close(fd)

    def check(self) -> str | None:
        """Measure now and update `refusal` (blocking; tests and the first check at open)."""
        self.read()
        return self.evaluate()

    def evaluate(self) -> str | None:
        """Update `refusal` from the last reading; returns it. Event loop."""
        failure, self._index_failure = self._index_failure, None
        if failure is not None:
            self.out_of_space(failure[0], "index", failure[1], wake=False)
        cfg = self._cfg
        where = f"the store's disk ({self._root})"
        reason: str | None = None
        free = self.free
        # Not after `out_of_space`: the last reading is older than the failure.
        free_text = f", {_mib(free)} free" if free >= 0 and not self._stale else ""
        if self._needed and (self._stale or free < self._needed):
            # `free` < 0 (unknown, injected usage): until a reading after the failure.
            if not self._stale and free < 0:
                self._needed = 0
            else:
                reason = (
                    f"maybe disk full, no space on {where} for a new {self._needed_what} file "
                    f"({_mib(self._needed)} needed{free_text})"
                )
        else:
            self._needed = 0
        if reason is None and self.ratio > cfg.disk_hard_ratio:
            reason = (
                f"maybe disk full, {where} is {self.ratio:.1%} used{free_text}, above the "
                f"{cfg.disk_hard_ratio:.0%} limit (disk_hard_ratio)"
            )
        elif reason is None and 0 <= free < self.headroom:
            reason = (
                f"maybe disk full, {where} has {_mib(free)} free, below the "
                f"{_mib(self.headroom)} kept free for the index and metadata files"
            )
        if reason is not None:
            reason += "; sends are refused until space is freed"
        if (reason is None) != (self.refusal is None):
            if reason is None:
                log.info("disk_space_ok", ratio=round(self.ratio, 4), free=free)
            else:
                log.error("disk_full_puts_refused", reason=reason)
        self.refusal = reason
        return reason

    def out_of_space(
        self, needed: int, what: str, exc: BaseException, *, wake: bool = True
    ) -> None:
        """A file of `needed` bytes (a `what` file) could not be created or reserved: refuse
        puts until that much (plus the headroom) is free again, and check soon."""
        self._needed = max(self._needed, needed + self.headroom)
        self._needed_what = what
        self._stale = True  # refuse at least until the next reading
        if self.refusal is None:
            log.warning("disk_out_of_space", what=what, needed=needed, error=str(exc))
        self.evaluate()
        if wake:
            self._wake.set()

    # ------------------------------------------------------------------ task
    async def run(self) -> None:
        """Check every `disk_check_interval_ms`, or sooner after `out_of_space`."""
        while True:
            with trio.move_on_after(self._cfg.disk_check_interval_ms / 1000):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                # statvfs (and the index reservation) can block: worker thread.
                await trio.to_thread.run_sync(self.read)
            except OSError:
                log.exception("disk_check_failed")
                continue
            self.evaluate()

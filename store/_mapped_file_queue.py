"""A directory of same-size `MappedFile`s forming one contiguous offset space.

Used by the commitlog (1 GiB files) and by every consume queue (300000 x 20-byte units).
List changes (roll, truncate, delete) happen on the event loop; the blocking parts (fsync,
unmap, unlink, creating the next file ahead of time) are handed to worker threads by the owners.

Every file created here has its space reserved (`MappedFile`: ``fallocate`` before the map), and
must leave `keep_free` bytes free; a file that cannot be created so raises OSError (ENOSPC).
`prepare` creates the next file before an append needs it, so that a full disk is found before
anything is written rather than in the middle of a batch.
"""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from store._mapped_file import MappedFile
from store.paths import file_name_to_offset, offset_to_file_name

__all__ = ["MappedFileQueue"]

log = structlog.get_logger()


class MappedFileQueue:
    """Files `<dir>/<20-digit start offset>`, each `file_size` bytes, in offset order.

    Attributes:
        directory: Where the files live.
        file_size: Size of every file.
        files: The mapped files, oldest first.
        flushed_where: Global offset up to which data is known durable.
    """

    __slots__ = (
        "_prep_lock",
        "_prepared",
        "directory",
        "file_size",
        "files",
        "flushed_where",
        "keep_free",
    )

    def __init__(self, directory: Path, file_size: int, *, keep_free: int = 0) -> None:
        self.directory = directory
        self.file_size = file_size
        # Bytes a new file must leave free on the filesystem (see `MappedFile`).
        self.keep_free = keep_free
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self._prepared: MappedFile | None = None
        self._prep_lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Map every file of the directory; all are taken as full until recovery says more.

        Files whose name is not a 20-digit offset, or that do not follow the previous one, are
        left alone (logged).
        """
        if not self.directory.is_dir():
            return
        named: list[tuple[int, Path]] = []
        for p in self.directory.iterdir():
            start = file_name_to_offset(p.name)
            if start is None or not p.is_file():
                log.warning("mapped_file_ignored", path=str(p))
                continue
            named.append((start, p))
        named.sort()
        for start, p in named:
            if self.files and start != self.files[-1].file_from_offset + self.file_size:
                log.error("mapped_file_gap", path=str(p), expected=self.files[-1].end_offset)
                break
            if start % self.file_size:
                log.error("mapped_file_misaligned", path=str(p), file_size=self.file_size)
                break
            # Reserved too (a no-op for written files); not strict: a file that cannot be is
            # written through pwrite rather than refused at start.
            mf = MappedFile(p, self.file_size, strict=False)
            mf.wrote_position = mf.flushed_position = self.file_size
            self.files.append(mf)
        if self.files:
            self.flushed_where = self.files[-1].end_offset

    # ------------------------------------------------------------------ offsets
    @property
    def min_offset(self) -> int:
        """Offset of the first byte of the first file (0 when empty)."""
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Offset one past the last written byte (0 when empty)."""
        return self.files[-1].end_offset if self.files else 0

    @property
    def last_file(self) -> MappedFile | None:
        """The newest file, if any."""
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding global `offset`, or None."""
        if not self.files:
            return None
        first = self.files[0].file_from_offset
        if offset < first:
            return None
        idx = (offset - first) // self.file_size
        if idx >= len(self.files):
            return None
        return self.files[idx]

    def next_file(self, mf: MappedFile) -> MappedFile | None:
        """The file after `mf`, if present."""
        return self.find(mf.file_from_offset + self.file_size)

    # ------------------------------------------------------------------ appending
    def file_for_append(self, start_offset: int = 0) -> MappedFile:
        """The last file if it has room, else a new one (at `start_offset` when the queue is
        empty, rounded down to a file boundary).

        Raises:
            OSError: The new file cannot be created.
        """
        last = self.last_file
        if last is not None and not last.is_full:
            return last
        if last is None:
            start = start_offset - start_offset % self.file_size
        else:
            start = last.file_from_offset + self.file_size
        mf = self._take_prepared(start)
        if mf is None:
            # Not prepared ahead (`prepare_next` in a worker thread, `prepare`): created here,
            # on the caller's thread (fallocate of a consume-queue file's size is short).
            mf = self._create(start)
        # No read-ahead over the holes being appended to (`MappedFile.advise_append`); the
        # full file goes back to normal read-ahead for the readers.
        mf.advise_append()
        if last is not None:
            last.advise_read()
        self.files.append(mf)
        if last is None:
            self.flushed_where = start
        return mf

    @property
    def prepared_offset(self) -> int | None:
        """Start offset of the file created ahead of time (`prepare_next`, `prepare`), if
        any."""
        mf = self._prepared
        return None if mf is None else mf.file_from_offset

    def _take_prepared(self, start: int) -> MappedFile | None:
        with self._prep_lock:
            mf, self._prepared = self._prepared, None
        if mf is not None and mf.file_from_offset != start:
            mf.close()
            return None
        return mf

    def _create(self, start: int) -> MappedFile:
        self.directory.mkdir(parents=True, exist_ok=True)
        return MappedFile(
            self.directory / offset_to_file_name(start), self.file_size, keep_free=self.keep_free
        )

    def prepare_next(self, *, first: bool = False) -> bool:
        """Create and map the file after the last one ahead of time. Blocks: worker thread.

        Only when the last file is more than half written, so rolling finds it ready (or, with
        `first`, the file at offset 0 of an empty queue). Returns True when a file was created.

        Raises:
            OSError: the file cannot be created (ENOSPC: no space to reserve it).
        """
        last = self.last_file
        if last is None:
            if not first:
                return False
            start = 0
        elif last.wrote_position < self.file_size // 2:
            return False
        else:
            start = last.file_from_offset + self.file_size
        with self._prep_lock:
            if self._prepared is not None:
                return False
            self._prepared = self._create(start)
        return True

    def room_for(self, nbytes: int, start_offset: int = 0) -> None:
        """Make sure `nbytes` more can be appended without creating a file then: when the
        last file cannot take them, the next one is created now (`prepare`). Cheap when there
        is room (no system call). Raises OSError (ENOSPC, ...) as `MappedFile` does."""
        files = self.files
        if files:
            last = files[-1]
            if last.wrote_position + nbytes <= last.file_size:
                return
            start = last.file_from_offset + self.file_size
        else:
            start = start_offset - start_offset % self.file_size
        self.prepare(start)

    def prepare(self, start: int) -> None:
        """Have the file at `start` created and waiting (as `prepare_next` does in a worker
        thread), unless it is already. On the caller's thread: the event loop calls it only
        when a roll is due and the worker thread has not prepared the file; replica appends
        (`MessageStore.append_replica`) call it in a worker thread.

        Raises:
            OSError: the file cannot be created (ENOSPC: no space to reserve it).
        """
        with self._prep_lock:
            mf = self._prepared
            if mf is not None:
                if mf.file_from_offset == start:
                    return
                self._prepared = None
                mf.close()
            self._prepared = self._create(start)

    # ------------------------------------------------------------------ flushing
    def prefault_ahead(self, ahead: int) -> bool:
        """Fault in for writing the `ahead` bytes from the last file's write position on.

        Blocks: call from a worker thread (see `MappedFile.prefault`); False if the kernel
        cannot. Reads the file list without a lock: a file replaced or closed meanwhile only
        makes the call useless.
        """
        files = self.files
        if not files:
            return True
        mf = files[-1]
        pos = mf.wrote_position
        return mf.prefault(pos, pos + ahead)

    @property
    def dirty_bytes(self) -> int:
        """Bytes written but not known durable."""
        return self.max_offset - self.flushed_where

    def flush_plan(self, target: int) -> list[MappedFile]:
        """Files holding the not-yet-durable bytes below `target` (fsync them, then call
        `flushed_to(target)`)."""
        plan: list[MappedFile] = []
        for mf in self.files:
            if mf.file_from_offset + mf.file_size <= self.flushed_where:
                continue
            if mf.file_from_offset >= target:
                break
            plan.append(mf)
        return plan

    def flush_ranges(self, target: int, lo: int = -1) -> list[tuple[MappedFile, int, int]]:
        """(file, start, end) relative ranges holding the not-yet-durable bytes below
        `target` (from global offset `lo` when given, else from what is durable):
        `MappedFile.sync_range` each, then call `flushed_to(target)`."""
        if lo < 0:
            lo = self.flushed_where
        ranges: list[tuple[MappedFile, int, int]] = []
        # From the newest file back (a SYNC_FLUSH put may ask for every waiting send): the
        # range is almost always in the last file, whatever the number of files.
        for mf in reversed(self.files):
            base = mf.file_from_offset
            if base + mf.file_size <= lo:
                break
            start = max(lo - base, 0)
            end = min(target - base, mf.file_size)
            if end > start:
                ranges.append((mf, start, end))
        ranges.reverse()
        return ranges

    def flushed_to(self, target: int) -> None:
        """Record that everything below `target` is durable."""
        if target <= self.flushed_where:
            return
        self.flushed_where = target
        for mf in self.files:
            rel = min(target - mf.file_from_offset, mf.file_size)
            if rel > mf.flushed_position:
                mf.flushed_position = rel

    # ------------------------------------------------------------------ truncation / deletion
    def truncate_to(self, offset: int) -> list[MappedFile]:
        """Keep bytes below global `offset`: zero the rest of its file and detach every file
        wholly past it. Returns the detached files; the caller destroys them."""
        dropped: list[MappedFile] = []
        kept: list[MappedFile] = []
        for mf in self.files:
            end = mf.file_from_offset + mf.file_size
            if end <= offset:
                kept.append(mf)
            elif mf.file_from_offset < offset or not kept:
                mf.zero_from(max(0, offset - mf.file_from_offset))
                kept.append(mf)
            else:
                dropped.append(mf)
        self.files = kept
        self.flushed_where = min(self.flushed_where, offset)
        if self._prepared is not None:
            with self._prep_lock:
                if self._prepared is not None:
                    dropped.append(self._prepared)
                    self._prepared = None
        return dropped

    def detach_first(self, count: int) -> list[MappedFile]:
        """Remove up to `count` oldest files from the queue (never the last) and return them;
        the caller destroys them in a worker thread."""
        n = max(0, min(count, len(self.files) - 1))
        gone, self.files = self.files[:n], self.files[n:]
        return gone

    def detach_all(self) -> list[MappedFile]:
        """Remove every file from the queue and return them (the caller destroys them)."""
        gone, self.files = self.files, []
        if self._prepared is not None:
            with self._prep_lock:
                if self._prepared is not None:
                    gone.append(self._prepared)
                    self._prepared = None
        self.flushed_where = 0
        return gone

    def close_all(self) -> None:
        """Unmap every file (blocking; at shutdown, from a worker thread)."""
        with self._prep_lock:
            if self._prepared is not None:
                self._prepared.close()
                self._prepared = None
        for mf in self.files:
            mf.close()

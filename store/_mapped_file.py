"""One fixed-size file mapped in memory, named by the offset of its first byte.

Writes go through a shared mmap (MAP_SHARED), so they are in the page cache at once and survive
the death of the process; `fsync` (``os.fdatasync`` on the descriptor, which on Linux writes the
mmap-dirtied pages of a MAP_SHARED mapping too) or `sync_range` (msync of a range) makes them
survive the machine. Reads return
`bytes` copies: no memoryview over the map ever leaves this module, so a file can always be
unmapped (no BufferError).

Staged appends (`stage`, `drain`): the commitlog may keep the records appended within one
synchronous stretch of the event loop in a buffer and write them with one ``pwrite``
(`drain`) instead of one each. Only bytes whose blocks were reserved ahead are staged, so the
write cannot fail for want of space: under ASYNC_FLUSH by `reserve` (``fallocate``, in a worker
thread), under SYNC_FLUSH by `zero_ahead` (zeros written, then synced in a worker thread, so
that the group commit's syncs find the blocks already written). Every accessor that reads or
writes the file on the event loop (`append`, `pwrite_append`, `write_at`, the reads,
`zero_from`, `close`) drains first, so nothing ever sees the file without them, except a `read`
wholly within the staged bytes, which copies them from the buffer; `CommitLog` drains before
the event loop can switch tasks (see `CommitLog.begin_staging`).

Space: a write into a mapped page whose block cannot be allocated (a hole
of a sparse file on a full disk) kills the process with SIGBUS. So a file's blocks are
reserved before it is mapped (`reserve_file`: ``fallocate``; a new file whose space cannot be
reserved is removed and the constructor raises `OSError` with ENOSPC, naming the file and the
bytes). Where the filesystem cannot reserve at all (EOPNOTSUPP), or reserving an existing file
failed at load, the file still maps, but every write to it goes through ``pwrite``
(`mapped_writes` False), which fails with ENOSPC instead of SIGBUS.

Thread rules: `fsync`, `close` and `destroy` block and are called from worker threads by the
owners (flush and cleanup services); everything else is quick and runs on the event loop.
`stage` and `drain` run on the event loop only; `fsync` and `sync_range` never drain (their
ranges are planned on the event loop, where nothing is staged: see `CommitLog`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import struct
from pathlib import Path

import structlog

from store.paths import file_name_to_offset

__all__ = [
    "PWRITE_MIN",
    "ZERO_PIECE",
    "MappedFile",
    "free_bytes",
    "is_out_of_space",
    "reserve_file",
]

log = structlog.get_logger()

PWRITE_MIN = 4096
"""`MappedFile.append` writes at least this many bytes with ``os.pwrite`` instead of the map."""

# Fault pages in for writing without changing their contents (Linux 5.14+; not in every
# Python's mmap module).
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_PAGE = mmap.PAGESIZE

ZERO_PIECE = 256 << 10
"""Bytes of zeros `MappedFile.zero_ahead` writes per call: written on the event loop and synced
alone, so small, to keep both the loop's pause and the sync beside a group-commit round short
(docs/design-notes.md, "Zeroed blocks ahead")."""
_ZEROS = bytes(ZERO_PIECE)

# madvise through ctypes, not `mmap.madvise`: CPython's keeps the GIL across the system call, so
# a populate waiting on the journal would stall the event loop as much as the fault it avoids.
# ctypes releases the GIL around foreign calls.
_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_madvise.restype = ctypes.c_int
# msync through ctypes too (GIL released): `mmap.flush` keeps the GIL for the whole write-back.
_msync = _libc.msync
_msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_msync.restype = ctypes.c_int
_MS_SYNC = getattr(mmap, "MS_SYNC", 4)
# fallocate(2) through ctypes (Python has only posix_fallocate, which glibc emulates by writing
# where the filesystem cannot allocate: staging must know that it cannot reserve instead).
_fallocate = getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
    _fallocate.restype = ctypes.c_int


_OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_CANNOT_RESERVE = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
_warned_unreservable: set[int] = set()  # st_dev of filesystems already warned about


def is_out_of_space(exc: BaseException) -> bool:
    """True for an OSError meaning the disk (or the quota) is full."""
    return isinstance(exc, OSError) and exc.errno in _OUT_OF_SPACE


def free_bytes(fd: int) -> int:
    """Bytes an unprivileged writer may still allocate on the filesystem of `fd` (statvfs)."""
    st = os.fstatvfs(fd)
    return st.f_bavail * st.f_frsize


def reserve_file(fd: int, start: int, length: int, path: object = None) -> bool:
    """Allocate the blocks of [`start`, `start + length`) of `fd` (``fallocate`` mode 0: the
    contents and the size stay as they are). True when reserved; False when this filesystem
    (or platform) cannot reserve (EOPNOTSUPP, ENOSYS, EINVAL; warned once per filesystem).

    ``fallocate`` through ctypes rather than `os.posix_fallocate`: where the filesystem cannot
    allocate, glibc emulates posix_fallocate by writing a byte into every block (262,144 writes
    for a 1 GiB file), and on a copy-on-write filesystem that reserves nothing anyway; the
    caller instead keeps such a file out of mapped writes. Blocks (filesystem metadata, longer
    the larger the range): worker threads, or rare calls on the event loop.

    Raises:
        OSError: the allocation failed otherwise (ENOSPC, EDQUOT, EIO).
    """
    if length <= 0:
        return True
    if _fallocate is None:
        err = errno.ENOSYS
    elif _fallocate(fd, 0, start, length) == 0:
        return True
    else:
        err = ctypes.get_errno()
    if err in _CANNOT_RESERVE:
        dev = os.fstat(fd).st_dev
        if dev not in _warned_unreservable:
            _warned_unreservable.add(dev)
            log.warning(
                "mapped_file_space_not_reserved",
                path=str(path),
                error=os.strerror(err),
                note="this filesystem cannot reserve file space (fallocate); writes to mapped "
                "files go through pwrite, which fails with ENOSPC on a full disk",
            )
        return False
    raise OSError(err, f"cannot reserve {length} bytes: {os.strerror(err)}", str(path))


def _map_address(mm: mmap.mmap) -> int | None:
    """The address of a mapping for ctypes calls, None once it is closed. Only the address:
    the buffer export ends at once, so `mm.close()` never fails because of it."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(mm))
    except (ValueError, TypeError):  # closed
        return None


def populate_for_write(mm: mmap.mmap, start: int, length: int) -> bool:
    """madvise(MADV_POPULATE_WRITE) over [`start`, `start + length`) of a shared mapping.

    Through ctypes, which releases the GIL during the call: `mmap.madvise` keeps it, so a page
    fault waiting on the filesystem journal in a worker thread would stall the event loop too.
    Blocks: call from a worker thread. Returns False when the kernel lacks the advice (EINVAL,
    before Linux 5.14); other failures (a mapping closed or unmapped meanwhile) are ignored.
    """
    base = _map_address(mm)
    if base is None:  # closed
        return True
    if _madvise(base + start, length, _MADV_POPULATE_WRITE) != 0:
        return ctypes.get_errno() != errno.EINVAL
    return True


_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class MappedFile:
    """A mapped file of `file_size` bytes holding the offsets [file_from_offset, +file_size).

    Attributes:
        path: The file.
        file_size: Mapped size in bytes.
        file_from_offset: Global offset of byte 0 (parsed from the 20-digit file name).
        wrote_position: Bytes written so far (relative to the file start).
        flushed_position: Bytes known durable (relative to the file start).
    """

    __slots__ = (
        "_address",
        "_fd",
        "_mapped_writes",
        "_mm",
        "_reserved",
        "_staged",
        "_staged_at",
        "file_from_offset",
        "file_size",
        "flushed_position",
        "path",
        "wrote_position",
    )

    def __init__(
        self,
        path: Path,
        file_size: int,
        *,
        preallocate: bool = True,
        strict: bool = True,
        keep_free: int = 0,
    ) -> None:
        """Open (creating it if missing, or extending it if short), reserve and map `path`.

        Args:
            path: The file (named by its 20-digit start offset).
            file_size: Its size.
            preallocate: Reserve its blocks (`reserve_file`) before mapping it. False (tests
                only) maps it sparse, with writes through ``pwrite``.
            strict: A file that is created or extended here must be reserved: if the space is
                not there, the file is removed and OSError (ENOSPC) raised. Not strict (files
                found at load): a failed reservation is logged, and writes to that file go
                through ``pwrite``.
            keep_free: With `strict`, the bytes that must stay free on the filesystem once the
                file is reserved (what the index's sparse files and the metadata files may
                still need); below that, the new file is given back and ENOSPC raised.

        Raises:
            ValueError: The name is not a 20-digit offset.
            OSError: The file cannot be opened, reserved or mapped.
        """
        start = file_name_to_offset(path.name)
        if start is None:
            raise ValueError(f"not a mapped file name: {path.name!r}")
        self.path = path
        self.file_size = file_size
        self.file_from_offset = start
        self.wrote_position = 0
        self.flushed_position = 0
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            grown = size < file_size
            if grown:
                if size:
                    log.warning("mapped_file_short_extended", path=str(path), size=size)
                os.ftruncate(fd, file_size)
            mapped_writes = False
            if preallocate:
                mapped_writes = self._reserve_at_open(fd, strict and grown, keep_free)
            self._mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if created:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        self._fd = fd
        # Writes through the map only where a missing block can never fault (SIGBUS).
        self._mapped_writes = mapped_writes
        # The mapping's address, fixed while it is mapped (never resized): `sync_plan` hands it
        # to the native fsync worker once per round without taking it through ctypes each time.
        self._address = _map_address(self._mm) or 0
        self._staged: bytearray | None = None
        self._staged_at = 0
        # Bytes from 0 known to have their blocks allocated (`reserve`); -1: cannot reserve.
        self._reserved = 0

    def _reserve_at_open(self, fd: int, strict: bool, keep_free: int) -> bool:
        """Reserve the whole file (see `__init__`); True when its writes may go through the
        map."""
        try:
            if not reserve_file(fd, 0, self.file_size, self.path):
                return False
            free = free_bytes(fd) if strict and keep_free > 0 else keep_free
        except OSError as exc:
            if strict:
                raise OSError(
                    exc.errno,
                    f"cannot create {self.file_size}-byte mapped file: {exc.strerror}",
                    str(self.path),
                ) from exc
            log.warning("mapped_file_not_reserved", path=str(self.path), error=str(exc))
            return False
        if free < keep_free:
            raise OSError(
                errno.ENOSPC,
                f"cannot create {self.file_size}-byte mapped file: only {free} bytes would be "
                f"left free, below the {keep_free} kept free for the index and metadata files",
                str(self.path),
            )
        return True

    @property
    def mapped_writes(self) -> bool:
        """True when the file's blocks are reserved, so writes may go through the map; False:
        every write goes through ``pwrite`` (ENOSPC instead of SIGBUS on a full disk)."""
        return self._mapped_writes

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position})"

    @property
    def closed(self) -> bool:
        """True once `close` ran."""
        return self._mm.closed

    @property
    def remaining(self) -> int:
        """Bytes still free for appends."""
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        """No byte left for appends."""
        return self.wrote_position >= self.file_size

    @property
    def end_offset(self) -> int:
        """Global offset one past the last written byte."""
        return self.file_from_offset + self.wrote_position

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write `data` at the write position and advance it; returns the relative position.

        The caller checks that it fits (`remaining`). Small writes go through the map; from
        `PWRITE_MIN` bytes on, `os.pwrite` into the same page cache is cheaper than faulting
        the map's pages writable one by one while flushes keep cleaning the pages
        (docs/design-notes.md, "Commitlog appends through pwrite").

        Raises:
            OSError: a write of `PWRITE_MIN` bytes or more failed (e.g. ENOSPC); nothing
                moved.
        """
        if self._staged is not None:
            self.drain()
        pos = self.wrote_position
        end = pos + len(data)
        if end - pos < PWRITE_MIN and self._mapped_writes:
            self._mm[pos:end] = data
        else:
            self._pwrite_all(data, pos)
        self.wrote_position = end
        return pos

    def pwrite_append(self, data: bytes | bytearray | memoryview) -> int:
        """`append` through ``os.pwrite`` whatever the size (the commitlog's single records:
        see `CommitLog`).

        Raises:
            OSError: the write failed (e.g. ENOSPC); nothing moved.
        """
        if self._staged is not None:
            self.drain()
        pos = self.wrote_position
        self._pwrite_all(data, pos)
        self.wrote_position = pos + len(data)
        return pos

    @property
    def staged(self) -> bool:
        """True while appended bytes wait in the buffer (`stage`) for `drain`."""
        return self._staged is not None

    def stage(self, data: bytes | bytearray) -> int:
        """`append` into a buffer that `drain` writes with one ``pwrite``; returns the
        relative position. The write position moves at once, and every accessor drains
        first. Only bytes already reserved (`reserve`) are staged, so the drain cannot fail
        for want of space; others are written at once (`pwrite_append`). Event loop only.

        Raises:
            OSError: not reserved, and the write failed (ENOSPC, ...); nothing moved.
        """
        pos = self.wrote_position
        end = pos + len(data)
        if end > self._reserved:
            return self.pwrite_append(data)
        staged = self._staged
        if staged is None:
            self._staged = bytearray(data)
            self._staged_at = pos
        else:
            staged += data
        self.wrote_position = end
        return pos

    def drain(self) -> None:
        """Write the staged bytes (one ``pwrite``). Event loop only.

        Raises:
            OSError: the write failed (EIO, ...). The bytes stay staged, the write position
                stays past them: the caller must stop appending (see `CommitLog.end_staging`).
        """
        staged = self._staged
        if staged is not None:
            self._pwrite_all(staged, self._staged_at)
            self._staged = None

    def reserve(self, end: int) -> bool:
        """Allocate the file's blocks up to relative `end` (clipped to the file) with
        ``fallocate``, so that staged bytes there cannot fail to be written for want of space.
        False when this filesystem (or platform) cannot, and from then on.

        Blocks (filesystem metadata: it may wait on the journal while an fsync commits it):
        call from a worker thread. One caller at a time (the flush service).

        Raises:
            OSError: the allocation failed otherwise (ENOSPC, EIO); nothing more is reserved.
        """
        start = self._reserved
        if start < 0 or _fallocate is None:
            self._reserved = -1
            return False
        stop = min(self.file_size, end)
        if stop <= start:
            return True
        if _fallocate(self._fd, 0, start, stop - start) != 0:
            err = ctypes.get_errno()
            if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                self._reserved = -1
                return False
            raise OSError(err, f"fallocate failed: {os.strerror(err)}", str(self.path))
        self._reserved = stop
        return True

    @property
    def reserved_to(self) -> int:
        """Relative offset up to which blocks are reserved (`reserve`) or zeroed
        (`zero_ahead`); -1 when this filesystem cannot reserve."""
        return self._reserved

    def zero_ahead(self, end: int, piece: int) -> int:
        """Write up to `piece` zero bytes from the reserved mark (or the write position, if
        past it) towards relative `end` (clipped to the file), and reserve them (`stage`
        may use them); returns how many were written (0: nothing left below `end`).

        The commitlog under SYNC_FLUSH (`CommitLog.zero_ahead`): blocks that were never
        written (a hole, or `fallocate`'s unwritten extents) turn into written extents when
        their first data is written back, and the group commit's ``msync`` must then commit
        that metadata through the ext4 journal each round; blocks that already hold synced
        zeros take a data write and a cache flush only. The caller syncs the zeros
        (`sync_range`, in a worker thread) before the appends reach them.
        (docs/design-notes.md, "Zeroed blocks ahead")

        A ``pwrite`` into the page cache on the event loop, like the staged appends, and of
        bytes past everything appended: nothing staged or written there yet (the write
        position only moves on the event loop). Never with `reserve` on the same file.

        Raises:
            OSError: the write failed (ENOSPC, ...); nothing more is reserved.
        """
        if self._reserved < 0:
            return 0
        start = max(self._reserved, self.wrote_position)
        stop = min(self.file_size, end, start + piece)
        if stop <= start:
            return 0
        n = stop - start
        zeros = _ZEROS if n == len(_ZEROS) else bytes(n)
        self._pwrite_all(zeros, start)
        self._reserved = stop
        return n

    def _pwrite_all(self, data: bytes | bytearray | memoryview, pos: int) -> None:
        done = os.pwrite(self._fd, data, pos)
        if done < len(data):  # a regular file only writes short when the disk is full
            with memoryview(data) as view:
                while done < len(view):
                    n = os.pwrite(self._fd, view[done:], pos + done)
                    if n <= 0:
                        raise OSError(errno.ENOSPC, "short write", str(self.path))
                    done += n

    def write_at(self, pos: int, data: bytes | bytearray) -> None:
        """Overwrite bytes at relative `pos` (does not move the write position).

        Raises:
            OSError: written with ``pwrite`` (the file is not reserved) and that failed.
        """
        if self._staged is not None:
            self.drain()
        if self._mapped_writes:
            self._mm[pos : pos + len(data)] = data
        else:
            self._pwrite_all(data, pos)

    def read(self, pos: int, size: int) -> bytes:
        """A copy of `size` bytes at relative `pos` (clipped to the file).

        Bytes that are all still staged are copied from the staging buffer, which stays
        staged: a pull of the same run reads the record without an extra ``pwrite``; the run's
        write happens once, when it ends, before any answer of the run leaves
        (docs/design-notes.md, "Staged commitlog writes"). Any other read writes the staged
        bytes first.
        """
        staged = self._staged
        if staged is not None:
            at = pos - self._staged_at
            if at >= 0 and at + size <= len(staged):
                return bytes(staged[at : at + size])
            self.drain()
        return self._mm[pos : pos + size]

    @property
    def written_position(self) -> int:
        """Bytes from 0 that are in the file (the page cache): the write position less the
        bytes still staged (`stage`)."""
        return self._staged_at if self._staged is not None else self.wrote_position

    def read_written(self, pos: int, size: int) -> bytes:
        """A copy of `size` bytes at relative `pos`, all below `written_position`, from the
        map. Unlike `read` it never drains: staged bytes stay staged (their run writes
        them)."""
        return self._mm[pos : pos + size]

    def read_int32(self, pos: int) -> int:
        """Big-endian int32 at relative `pos`."""
        if self._staged is not None:
            self.drain()
        return int(_I32.unpack_from(self._mm, pos)[0])

    def read_int64(self, pos: int) -> int:
        """Big-endian int64 at relative `pos`."""
        if self._staged is not None:
            self.drain()
        return int(_I64.unpack_from(self._mm, pos)[0])

    def unpack_from(self, fmt: struct.Struct, pos: int) -> tuple[int, ...]:
        """`fmt.unpack_from` over the map at relative `pos` (no buffer escapes)."""
        if self._staged is not None:
            self.drain()
        return fmt.unpack_from(self._mm, pos)

    def zero_from(self, pos: int) -> None:
        """Make every byte from relative `pos` to the end zero and move both positions there.

        Shrinking the file then growing it back punches the tail out (sparse again) instead of
        dirtying every page with zeros.
        """
        if self._staged is not None:
            self.drain()
        os.ftruncate(self._fd, pos)
        self._reserved = min(self._reserved, pos)
        os.ftruncate(self._fd, self.file_size)
        if self._mapped_writes:
            # The punched tail is a hole again: reserve it again, or write by pwrite from now.
            try:
                self._mapped_writes = reserve_file(self._fd, pos, self.file_size - pos, self.path)
            except OSError as exc:
                log.warning("mapped_file_not_reserved", path=str(self.path), error=str(exc))
                self._mapped_writes = False
        self.wrote_position = pos
        self.flushed_position = min(self.flushed_position, pos)
        self.advise_append()  # the write position of a queue's last file after recovery

    def advise_append(self) -> None:
        """Advise random access (no read-ahead) from the write position to the end.

        The pages past the write position are holes. A write fault on a hole page makes the
        kernel "read" it, and read-ahead then zero-fills the whole read-ahead window
        (`read_ahead_kb`) in the faulting thread, the event loop (filemap_fault ->
        page_cache_ra_order -> zero_user_segments). With the advice each fault fills its own
        page. Cheap (VMA flags only): callable on the event loop.
        (docs/design-notes.md, "No read-ahead over appended holes")
        """
        start = self.wrote_position - self.wrote_position % _PAGE
        if start >= self.file_size:
            return
        try:
            self._mm.madvise(mmap.MADV_RANDOM, start, self.file_size - start)
        except (ValueError, OSError):  # closed meanwhile
            pass

    def advise_read(self) -> None:
        """Back to normal read-ahead for the whole file (it is full: only reads follow)."""
        try:
            self._mm.madvise(mmap.MADV_NORMAL)
        except (ValueError, OSError):
            pass

    def fsync(self) -> None:
        """Make everything written so far durable. Blocks: call from a worker thread."""
        os.fdatasync(self._fd)

    def sync_range(self, start: int, end: int) -> None:
        """Make the bytes over relative [`start`, `end`) durable, and only those pages.

        ``msync(MS_SYNC)`` of the range (Linux: ``vfs_fsync_range``, the same data and
        journal guarantees as fdatasync, for the range; it covers bytes written with
        ``pwrite`` too: one page cache). Unlike fdatasync of the whole file it leaves alone
        the dirty pages past `end`: the pages pre-faulted ahead of the write position
        (`prefault`) are not written back as zeros and faulted again before they are filled.
        Through ctypes, so the GIL is released. Blocks: call from a worker thread.

        Raises:
            OSError: msync failed (EIO, ...).
        """
        plan = self.sync_plan(start, end)
        if plan is None:
            return
        address, length, fd = plan
        if not address:  # unmapped: only fdatasync can still help
            os.fdatasync(fd)
            return
        if _msync(address, length, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"msync failed: {os.strerror(err)}", str(self.path))

    def sync_plan(self, start: int, end: int) -> tuple[int, int, int] | None:
        """What `sync_range(start, end)` syncs, for a caller that syncs it itself (the native
        fsync worker): ``(address, length, fd)`` of the page-aligned range to msync, address 0
        when the file is unmapped (fdatasync `fd` then), or None when the range is empty. The
        address is valid while the file stays mapped: only until it is closed."""
        start -= start % _PAGE
        end = min(end, self.file_size)
        if end <= start:
            return None
        if self._mm.closed:
            return 0, 0, self._fd
        return self._address + start, end - start, self._fd

    def prefault(self, start: int, end: int) -> bool:
        """Fault the pages over relative [`start`, `end`) in for writing; contents unchanged.

        Blocks (it may wait on the filesystem journal): call from a worker thread. A write
        fault on a clean page of a MAP_SHARED file runs the filesystem's page_mkwrite, which on
        ext4 allocates the block and updates the file time inside a journal handle, so it waits
        whenever any fsync on the filesystem is committing the journal, on the event loop for
        the append that first touches the page. Done here ahead of the write position,
        those appends are plain memory writes. Safe while the event loop appends to the same
        pages (MADV_POPULATE_WRITE never changes the bytes). The pages become dirty, so the
        next fsync also writes the zero pages not yet appended to (same file contents).

        Returns False when the kernel does not support it (EINVAL: before 5.14); other
        failures (file closed or unmapped meanwhile) are ignored. Appends then fault as before.
        """
        start -= start % _PAGE
        end = min(end, self.file_size)
        if end <= start:
            return True
        # The owners close the active file only after the flush service stopped; a file
        # closed meanwhile (truncated away) makes madvise fail with ENOMEM, which is ignored.
        return populate_for_write(self._mm, start, end - start)

    def mtime(self) -> float:
        """Last modification time of the file (seconds since the epoch)."""
        return os.fstat(self._fd).st_mtime

    def touch(self) -> None:
        """Set the file's modification time to now (appends through mmap may not)."""
        os.utime(self._fd)

    def close(self) -> None:
        """Unmap and close (staged bytes written first). Blocks (munmap of a big map): call
        from a worker thread when hot."""
        if not self._mm.closed:
            if self._staged is not None:
                self.drain()
            self._mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file. Blocks: call from a worker thread when hot."""
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

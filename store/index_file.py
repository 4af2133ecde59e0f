"""RocketMQ's message index: hash files mapping ``topic#key`` to commitlog offsets.

One index file (``index/<yyyyMMddHHmmssSSS>``, local creation time) is laid out as::

    header (40 bytes): beginTimestamp int64 @0, endTimestamp int64 @8,
                       beginPhyOffset int64 @16, endPhyOffset int64 @24,
                       hashSlotCount int32 @32, indexCount int32 @36 (starts at 1)
    slots:   slot_num x int32, the number of the latest entry whose key falls in the slot
    entries: index_num x 20 bytes: keyHash int32, phyOffset int64,
             timeDiff int32 (seconds since beginTimestamp), prevIndex int32 (0 = end of chain)

The slot of a key is ``abs(java hash) % slot_num`` (``Integer.MIN_VALUE`` -> 0). Entry 0 is
never used. A file is full when ``indexCount == index_num``; `IndexService` then starts a new
one. The files are sparse (``ftruncate``) and mapped with `mmap`.

Threading: `IndexService.build_index` and `IndexService.query` run in the event-loop thread;
`flush`, `delete_expired`, `close` and `destroy` do blocking disk work, so the store runs them in
a worker thread. An internal lock keeps the file list and each file's mapping consistent.
"""

from __future__ import annotations

import functools
import mmap
import operator
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import structlog

from common.message import NATIVE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, DispatchRequest
from common.message import java_string_hash as _java_hash

if NATIVE:
    import common.speedups as _sp

__all__ = [
    "ENTRY_SIZE",
    "HEADER_SIZE",
    "SLOT_SIZE",
    "IndexFile",
    "IndexFileError",
    "IndexService",
    "index_file_name",
    "key_hash",
    "uniq_key_hash",
]

log = structlog.get_logger()

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_I32 = struct.Struct(">i")
_NAME_RE = re.compile(r"^\d{17}$")


class IndexFileError(Exception):
    """An index file that cannot be used (wrong size, unreadable)."""


def key_hash(key: str) -> int:
    """The non-negative hash an index stores for `key`: ``abs(hashCode)``, MIN_VALUE -> 0."""
    return _abs32(_java_hash(key))


def _abs32(h: int) -> int:
    if h < 0:
        h = -h
        if h > 0x7FFFFFFF:  # abs(Integer.MIN_VALUE) overflows to itself in Java
            h = 0
    return h


# Hot path: the UNIQ_KEY index key ``topic#<32 hex>``. Its first 20 hex digits (IP, pid, class
# loader id) are the same for every message of a producer, so the Java hash is split:
# h(prefix + tail) = h(prefix) * 31**len(tail) + h(tail) (mod 2**32, ASCII tail), with
# h(prefix) cached. This hashes 12 characters per message instead of ~45.
_TAIL = 12
_POW31_TAIL = pow(31, _TAIL, 1 << 32)
_POW31_REV = tuple(pow(31, _TAIL - 1 - k, 1 << 32) for k in range(_TAIL))
_mul = operator.mul


@functools.lru_cache(maxsize=1024)
def _prefix_hash(prefix: str) -> int:
    return _java_hash(prefix) * _POW31_TAIL


def _py_uniq_key_hash(prefix: str, uniq_key: str) -> int:
    """`key_hash` of ``prefix + uniq_key`` (prefix = ``topic#``), faster for long ASCII keys."""
    if len(uniq_key) <= _TAIL or not uniq_key.isascii():
        return key_hash(prefix + uniq_key)
    cut = len(uniq_key) - _TAIL
    h = _prefix_hash(prefix + uniq_key[:cut])
    h = (h + sum(map(_mul, uniq_key[cut:].encode("ascii"), _POW31_REV))) & 0xFFFFFFFF
    return _abs32(h - 0x100000000 if h & 0x80000000 else h)


uniq_key_hash: Callable[[str, str], int] = _sp.key_hash2 if NATIVE else _py_uniq_key_hash
"""`key_hash` of ``prefix + uniq_key`` (prefix = ``topic#``), without hashing the whole
string in Python."""


def index_file_name(ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of an epoch-ms time, in local time (RocketMQ's index file name)."""
    t = time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


class IndexFile:
    """One mapped index file.

    Args:
        path: the file (created, sparse, when absent).
        slot_num: number of hash slots.
        index_num: number of entries (entry 0 unused, so ``index_num - 1`` keys fit).
        end_phy_offset: for a new file, the end of the previous one (becomes begin and end).
        end_timestamp: likewise for the timestamps.

    Raises:
        IndexFileError: an existing file whose size does not match the slot / index numbers.
    """

    __slots__ = (
        "_dirty",
        "_durable_ts",
        "_entries_pos",
        "_fd",
        "_lock",
        "_mm",
        "begin_phy_offset",
        "begin_timestamp",
        "end_phy_offset",
        "end_timestamp",
        "hash_slot_count",
        "index_count",
        "index_num",
        "path",
        "rebuilding",
        "slot_num",
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        slot_num: int,
        index_num: int,
        end_phy_offset: int = 0,
        end_timestamp: int = 0,
    ) -> None:
        if slot_num <= 0 or index_num <= 1:
            raise ValueError("slot_num must be > 0 and index_num > 1")
        self.path = Path(path)
        self.slot_num = slot_num
        self.index_num = index_num
        self._entries_pos = HEADER_SIZE + slot_num * SLOT_SIZE
        size = self._entries_pos + index_num * ENTRY_SIZE
        self._lock = threading.Lock()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        existing = os.fstat(fd).st_size
        if existing not in (0, size):
            os.close(fd)
            raise IndexFileError(
                f"{self.path}: size {existing} != {size} for slot_num={slot_num}, "
                f"index_num={index_num}"
            )
        try:
            if existing == 0:
                os.ftruncate(fd, size)  # sparse: blocks are allocated as entries are written
            self._mm = mmap.mmap(fd, size)
            # No read-ahead: hash slots are hit at random and entries appended into holes, and
            # a fault on a hole page read-ahead-zeroes the whole window in the faulting
            # thread, the event loop (see MappedFile.advise_append). Lookups are
            # random reads too.
            self._mm.madvise(mmap.MADV_RANDOM)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._dirty = False
        # Written by an `IndexRebuild` that has not finished (see `IndexService.add_rebuild_file`).
        self.rebuilding = False
        if existing == 0:
            self.begin_timestamp = self.end_timestamp = max(end_timestamp, 0)
            self.begin_phy_offset = self.end_phy_offset = max(end_phy_offset, 0)
            self.hash_slot_count = 0
            self.index_count = 1
            self._write_header()
        else:
            (
                self.begin_timestamp,
                self.end_timestamp,
                self.begin_phy_offset,
                self.end_phy_offset,
                self.hash_slot_count,
                self.index_count,
            ) = _HEADER.unpack_from(self._mm, 0)
            if self.index_count == 0 and not any(self._mm[:HEADER_SIZE]):
                # a header that was never written (crash right after creation): empty
                self.index_count = 1
            elif not 1 <= self.index_count <= index_num or (
                self.index_count > 1 and self.begin_phy_offset > self.end_phy_offset
            ):
                self._mm.close()
                os.close(fd)
                raise IndexFileError(
                    f"{self.path}: damaged header (indexCount={self.index_count}, "
                    f"phy=[{self.begin_phy_offset},{self.end_phy_offset}])"
                )
        # Every entry of a record stored before this time (ms) is on disk, as far as this
        # process wrote it (see `durable_ts`).
        self._durable_ts = self.end_timestamp

    @property
    def file_name(self) -> str:
        """The file's name (its creation time)."""
        return self.path.name

    @property
    def is_full(self) -> bool:
        """No room for another entry."""
        return self.index_count >= self.index_num

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._mm.closed

    @property
    def dirty(self) -> bool:
        """Whether entries or the header were written since the last `flush` began."""
        return self._dirty

    @property
    def durable_ts(self) -> int:
        """While `dirty`: the end timestamp when the last `flush` began (the inherited or
        loaded one before any). Entries of records stored before it are on disk; later ones
        may not be (records are indexed in store-time order)."""
        return self._durable_ts

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._mm,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )
        self._dirty = True

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Add an entry for `key`.

        Returns:
            False when the file is full (nothing written).
        """
        return self.put_hash(key_hash(key), phy_offset, store_timestamp)

    def put_hash(
        self, h: int, phy_offset: int, store_timestamp: int, *, write_header: bool = True
    ) -> bool:
        """Add an entry for a key whose `key_hash` is `h` (see `put_key`).

        With ``write_header=False`` the caller writes the header (`write_header`) afterwards.
        """
        count = self.index_count
        if count >= self.index_num:
            return False
        mm = self._mm
        slot_pos = HEADER_SIZE + (h % self.slot_num) * SLOT_SIZE
        (prev,) = _I32.unpack_from(mm, slot_pos)
        if prev <= 0 or prev >= count:
            prev = 0
        if count <= 1:
            # the first entry defines the file's begin (replacing an inherited one): diff 0
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        begin_ts = self.begin_timestamp
        if begin_ts <= 0:
            time_diff = 0
        else:
            time_diff = min(max((store_timestamp - begin_ts) // 1000, 0), 0x7FFFFFFF)
        _ENTRY.pack_into(mm, self._entries_pos + count * ENTRY_SIZE, h, phy_offset, time_diff, prev)
        _I32.pack_into(mm, slot_pos, count)
        if prev == 0:
            self.hash_slot_count += 1
        self.index_count = count + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        if write_header:
            self._write_header()
        else:
            self._dirty = True
        return True

    def put_hashes(
        self, hashes: Sequence[int], phy_offsets: Sequence[int], start: int, ts: int
    ) -> int:
        """`put_hash` entries ``hashes[k]`` -> ``phy_offsets[k]`` for k from `start` on, all
        stored at `ts`, as many as fit; the caller writes the header (`write_header`).

        Returns:
            How many were added (fewer than asked when the file filled up).
        """
        count = self.index_count
        n = min(len(hashes) - start, self.index_num - count)
        if n <= 0:
            return 0
        stop = start + n
        if count <= 1:
            self.begin_phy_offset = phy_offsets[start]
            self.begin_timestamp = ts
        begin_ts = self.begin_timestamp
        time_diff = 0 if begin_ts <= 0 else min(max((ts - begin_ts) // 1000, 0), 0x7FFFFFFF)
        if NATIVE and type(hashes) is list and type(phy_offsets) is list:
            new_slots = _sp.index_put_hashes(
                self._mm,
                self.slot_num,
                self._entries_pos,
                count,
                hashes,
                phy_offsets,
                start,
                stop,
                time_diff,
            )
            count += n
        else:
            new_slots = self._put_hashes_py(hashes, phy_offsets, start, stop, count, time_diff)
            count += n
        self.hash_slot_count += new_slots
        self.index_count = count
        self.end_phy_offset = phy_offsets[stop - 1]
        self.end_timestamp = ts
        self._dirty = True
        return n

    def _put_hashes_py(
        self,
        hashes: Sequence[int],
        phy_offsets: Sequence[int],
        start: int,
        stop: int,
        count: int,
        time_diff: int,
    ) -> int:
        """The entry and slot writes of `put_hashes` (reference of the native version).
        Returns how many slots were empty before."""
        mm = self._mm
        slot_num = self.slot_num
        entries_pos = self._entries_pos
        pack_entry = _ENTRY.pack_into
        pack_i32 = _I32.pack_into
        unpack_i32 = _I32.unpack_from
        new_slots = 0
        for k in range(start, stop):
            h = hashes[k]
            slot_pos = HEADER_SIZE + (h % slot_num) * SLOT_SIZE
            (prev,) = unpack_i32(mm, slot_pos)
            if prev <= 0 or prev >= count:
                prev = 0
                new_slots += 1
            pack_entry(mm, entries_pos + count * ENTRY_SIZE, h, phy_offsets[k], time_diff, prev)
            pack_i32(mm, slot_pos, count)
            count += 1
        return new_slots

    def write_header(self) -> None:
        """Write the header fields into the mapping (after `put_hash(write_header=False)`)."""
        self._write_header()

    def seal(self, end_phy_offset: int) -> None:
        """Mark the file full and lower its end offset (see `IndexService.truncate`)."""
        self.index_count = self.index_num
        self.end_phy_offset = max(min(end_phy_offset, self.end_phy_offset), 0)
        self._write_header()

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether ``[begin_ms, end_ms]`` overlaps this file's time span."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e

    def select_phy_offsets(self, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commitlog offsets of entries for `key` stored within ``[begin_ms, end_ms]``.

        Newest first. Entry times have one-second resolution (begin + whole seconds). Hash
        collisions are possible: callers check the records' keys.
        """
        result: list[int] = []
        count = self.index_count
        if max_num <= 0 or count <= 1:
            return result
        try:
            self._select(result, key, max_num, begin_ms, end_ms, count)
        except ValueError:  # unmapped by a concurrent delete_expired: the file is gone
            pass
        return result

    def _select(
        self, result: list[int], key: str, max_num: int, begin_ms: int, end_ms: int, count: int
    ) -> None:
        mm = self._mm
        h = key_hash(key)
        (nxt,) = _I32.unpack_from(mm, HEADER_SIZE + (h % self.slot_num) * SLOT_SIZE)
        if nxt <= 0 or nxt >= count:
            return
        begin_ts = self.begin_timestamp
        entries = self._entries_pos
        while len(result) < max_num:
            kh, phy, time_diff, prev = _ENTRY.unpack_from(mm, entries + nxt * ENTRY_SIZE)
            if time_diff < 0:
                break
            t = begin_ts + time_diff * 1000
            if kh == h and begin_ms <= t <= end_ms:
                result.append(phy)
            # chains only point back to older entries: anything else is a loop or garbage
            if prev <= 0 or prev >= nxt or t < begin_ms:
                break
            nxt = prev

    def flush(self) -> None:
        """Write the mapping's dirty pages to disk (blocking: the caller runs it in a worker
        thread).

        `os.fdatasync` on the file, never `mmap.flush()`: CPython's mmap.flush (msync) keeps the
        GIL for the whole call, so even from a worker thread it would freeze the broker's event
        loop for the length of the write-back. On Linux the pages of a shared mapping are the
        file's page cache, so fdatasync writes them back, as it does for the commitlog
        (`MappedFile.fsync`) (docs/design-notes.md, "Index write-back").
        """
        with self._lock:
            if self._mm.closed or not self._dirty:
                return
            # What is in the mapping now is covered by the fdatasync below; entries put while
            # it runs (event loop) set `_dirty` again and have timestamps >= this one.
            begun_at = self.end_timestamp
            self._dirty = False
            os.fdatasync(self._fd)
            self._durable_ts = begun_at

    def close(self) -> None:
        """Flush and unmap (blocking)."""
        with self._lock:
            if self._mm.closed:
                return
            if self._dirty:
                os.fdatasync(self._fd)  # not mmap.flush(): see `flush`
                self._dirty = False
            self._mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        """Close without flushing and delete the file (blocking)."""
        with self._lock:
            if not self._mm.closed:
                self._mm.close()
                os.close(self._fd)
            self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return (
            f"IndexFile({self.file_name}, count={self.index_count}/{self.index_num}, "
            f"phy=[{self.begin_phy_offset},{self.end_phy_offset}], "
            f"ts=[{self.begin_timestamp},{self.end_timestamp}])"
        )


class IndexService:
    """The index directory: a list of `IndexFile`, the last one being written.

    Args:
        directory: the ``index`` directory (created when absent).
        slot_num: hash slots per file (RocketMQ: 5,000,000).
        index_num: entries per file (RocketMQ: 20,000,000).
    """

    def __init__(self, directory: str | os.PathLike[str], slot_num: int, index_num: int) -> None:
        self.directory = Path(directory)
        self.slot_num = slot_num
        self.index_num = index_num
        self._files: list[IndexFile] = []
        self._lock = threading.Lock()
        # Files found unusable (and deleted) by the last `load`: the store rebuilds the index.
        self.unusable = 0
        # While an `IndexRebuild` runs: the commitlog offset it indexes up to (the live files
        # index from there on); 0 otherwise.
        self.rebuild_below = 0
        # Set `deferring` and, until `build_deferred`, `build_index` keeps its records in
        # `kept` instead of indexing each at once; `build_deferred` indexes them together, one
        # `build_index_batch` per run of one topic and store time (a store's run of sends,
        # `MessageStore.begin_staging`). Plain attributes, event loop only: the store sets and
        # tests them around every read of the broker's connections, most of which hold no
        # send, and calls `build_deferred` before the event loop can switch tasks, so no other
        # task ever sees the index without the kept records.
        self.deferring = False
        self.kept: list[DispatchRequest] = []

    @property
    def files(self) -> list[IndexFile]:
        """A snapshot of the files, oldest first."""
        with self._lock:
            return list(self._files)

    def load(self) -> None:
        """Open the existing files (blocking: mapping many files).

        Every file is kept, also after an abnormal exit: recovery re-indexes the records stored
        from the checkpoint's index timestamp on (`flush`), in a new file after sealing the one
        they may be half in (`truncate`). RocketMQ instead deletes the files newer than its
        checkpoint, losing the keys of the current file's records stored before recovery's
        scan start. Unusable files (wrong size) are deleted with a warning: the index is
        derived data.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        names = sorted(p.name for p in self.directory.iterdir() if _NAME_RE.match(p.name))
        loaded: list[IndexFile] = []
        self.unusable = 0
        for name in names:
            path = self.directory / name
            try:
                f = IndexFile(path, self.slot_num, self.index_num)
            except (IndexFileError, OSError, ValueError) as exc:
                log.warning("index_file_unusable", file=str(path), error=str(exc))
                path.unlink(missing_ok=True)
                self.unusable += 1
                continue
            loaded.append(f)
        with self._lock:
            self._files = loaded
        log.info("index_loaded", files=len(loaded))

    def _last_file(self) -> IndexFile:
        """The file being written, rolling to a new one when the last is full."""
        with self._lock:
            files = self._files
            if files and not files[-1].is_full and not files[-1].rebuilding:
                return files[-1]
            prev = files[-1] if files else None
            now = int(time.time() * 1000)
            if prev is not None:
                now = max(now, _name_ms_floor(prev.file_name))
            path = self.directory / index_file_name(now)
            while path.exists() or (prev is not None and path.name <= prev.file_name):
                now += 1
                path = self.directory / index_file_name(now)
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.rebuild_below and (prev is None or prev.rebuilding):
                # The first live file while a rebuild runs: records below `rebuild_below` are
                # the rebuild's, the live indexing starts at it.
                inherit_phy, inherit_ts = self.rebuild_below, 0
            elif prev is not None:
                inherit_phy, inherit_ts = prev.end_phy_offset, prev.end_timestamp
            else:
                inherit_phy, inherit_ts = 0, 0
            f = IndexFile(path, self.slot_num, self.index_num, inherit_phy, inherit_ts)
            files.append(f)
            log.info("index_file_created", file=path.name)
            return f

    def _put(self, f: IndexFile, key: str, phy_offset: int, store_timestamp: int) -> IndexFile:
        while not f.put_key(key, phy_offset, store_timestamp):
            f = self._last_file()
        return f

    def _put_hash(self, f: IndexFile, h: int, phy_offset: int, store_timestamp: int) -> IndexFile:
        while not f.put_hash(h, phy_offset, store_timestamp, write_header=False):
            f.write_header()
            f = self._last_file()
        return f

    def build_index(self, req: DispatchRequest) -> None:
        """Index the keys ``topic#UNIQ_KEY`` and ``topic#<each KEYS token>`` of a record.

        ROLLBACK records are skipped, and so are records below the last file's end offset
        (already indexed): re-dispatching after recovery is idempotent.
        """
        if req.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
            return
        uniq = req.uniq_key
        keys = req.keys
        if not uniq and not keys:
            return
        if self.deferring:
            self.kept.append(req)
            return
        self._index_one(req, uniq, keys)

    def _index_one(self, req: DispatchRequest, uniq: str | None, keys: str | None) -> None:
        f = self._last_file()
        end = f.end_phy_offset
        phy = req.commit_log_offset
        # Stricter than RocketMQ's `<`: the record at the end offset itself was indexed too,
        # unless nothing was ever indexed (first file, no entry, no inherited timestamp).
        if phy < end or (phy == end and (f.index_count > 1 or f.end_timestamp > 0)):
            return
        ts = req.store_timestamp
        prefix = req.topic + "#"
        if uniq:
            f = self._put_hash(f, uniq_key_hash(prefix, uniq), phy, ts)
        if keys:
            for key in keys.split(" "):
                if key:
                    f = self._put_hash(f, key_hash(prefix + key), phy, ts)
        f.write_header()

    def build_index_batch(
        self,
        topic: str,
        phy_offsets: Sequence[int],
        uniq_keys: Sequence[str | None],
        keys: Sequence[str | None],
        store_timestamp: int,
    ) -> None:
        """`build_index` for records of one topic stored at one time (none of them ROLLBACK),
        in commitlog order: ``phy_offsets[k]`` has UNIQ_KEY ``uniq_keys[k]`` and KEYS
        ``keys[k]``. The hashes are computed first, then written in one loop per file with
        one header write."""
        if not any(uniq_keys) and not any(keys):
            return
        kept = self.kept
        if kept:  # the records kept before these come first (deferring goes on)
            self.kept = []
            self._index_runs(kept)  # `kept` is empty while it calls back here
        f = self._last_file()
        end = f.end_phy_offset
        indexed = f.index_count > 1 or f.end_timestamp > 0
        prefix = topic + "#"
        if NATIVE:
            hashes, phys = _sp.index_hashes(prefix, phy_offsets, uniq_keys, keys, end, indexed)
        else:
            hashes, phys = _batch_hashes(prefix, phy_offsets, uniq_keys, keys, end, indexed)
        done = 0
        total = len(hashes)
        while done < total:
            done += f.put_hashes(hashes, phys, done, store_timestamp)
            f.write_header()
            if done < total:
                f = self._last_file()

    def build_deferred(self) -> None:
        """Index the records kept since `deferring` was set, and stop deferring.

        Raises:
            OSError / IndexFileError: a new index file could not be created; the records not
                indexed yet are dropped (the index is derived data).
        """
        self.deferring = False
        kept = self.kept
        if kept:
            self.kept = []
            self._index_runs(kept)

    def drop_deferred(self) -> None:
        """Stop deferring, forgetting the records kept (their writes failed)."""
        self.deferring = False
        self.kept = []

    def _index_runs(self, reqs: list[DispatchRequest]) -> None:
        """Index kept records, in order, one batch per run of one topic and store time (a
        single record the way `build_index` does, which costs less than a batch of one)."""
        if len(reqs) == 1:
            req = reqs[0]
            self._index_one(req, req.uniq_key, req.keys)
            return
        i, n = 0, len(reqs)
        while i < n:
            first = reqs[i]
            topic = first.topic
            ts = first.store_timestamp
            j = i + 1
            while j < n and reqs[j].topic == topic and reqs[j].store_timestamp == ts:
                j += 1
            run = reqs[i:j]
            self.build_index_batch(
                topic,
                [r.commit_log_offset for r in run],
                [r.uniq_key for r in run],
                [r.keys for r in run],
                ts,
            )
            i = j

    def put_keys(
        self, topic: str, keys: Iterable[str], phy_offset: int, store_timestamp: int
    ) -> None:
        """Index arbitrary keys for a record (no duplicate check)."""
        f = self._last_file()
        for key in keys:
            f = self._put(f, f"{topic}#{key}", phy_offset, store_timestamp)

    def query(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> tuple[list[int], int, int]:
        """Commitlog offsets of records with `key` in `topic`, newest files first.

        Returns:
            ``(phy_offsets, index_last_update_timestamp, index_last_update_phyoffset)``; the
            last two come from the newest file (0 without files).
        """
        offsets: list[int] = []
        full_key = f"{topic}#{key}"
        files = self.files
        if not files:
            return offsets, 0, 0
        last_ts = files[-1].end_timestamp
        last_phy = files[-1].end_phy_offset
        seen: set[int] = set()
        for f in reversed(files):
            if f.closed:
                continue
            if f.is_time_matched(begin_ms, end_ms):
                # A record re-indexed after a crash is in the sealed file and the next one.
                for phy in f.select_phy_offsets(full_key, max_num - len(offsets), begin_ms, end_ms):
                    if phy not in seen:
                        seen.add(phy)
                        offsets.append(phy)
            if f.begin_timestamp < begin_ms or len(offsets) >= max_num:
                break
        return offsets, last_ts, last_phy

    def flush(self, now_ts: int, *, live: bool = True) -> int:
        """Write back the full files with unwritten changes, and the file being written too
        when `live` (blocking: run in a worker thread).

        The file being written takes its entries at random slot pages: written back every
        second it costs up to a page per message and a burst of kernel work on the event
        loop's CPU. The store writes it back every `flush_interval_index_ms` instead; RocketMQ
        never does (only when it is full) (docs/design-notes.md, "Index write-back").

        Args:
            now_ts: the store timestamp of the newest record indexed before this call (the
                commitlog's last store timestamp when the flush round began).
            live: write back the file being written as well.

        Returns:
            The durable point, for the checkpoint's index timestamp: every record stored
            before it is durably indexed (`now_ts` when nothing is left unwritten). Recovery
            after a crash re-indexes the records from there on. A full file written back as
            it fills keeps RocketMQ's meaning of the field, the end timestamp of the newest
            flushed full file, as a lower bound.
        """
        point = now_ts
        for f in self.files:
            if live or f.is_full:
                f.flush()
            # A rebuild's files are covered by its marker (a start that finds it rebuilds).
            if f.dirty and not f.rebuilding:
                point = min(point, f.durable_ts)
        return point

    def delete_expired(self, min_phy_offset: int) -> int:
        """Delete files whose end offset is below `min_phy_offset`, never the last one.

        Blocking (unlink): run in a worker thread. Returns how many were deleted.
        """
        with self._lock:
            files = self._files
            doomed = [
                f for f in files[:-1] if f.end_phy_offset < min_phy_offset and not f.rebuilding
            ]
            if not doomed:
                return 0
            self._files = [f for f in files if f not in doomed]
        for f in doomed:
            f.destroy()
            log.info("index_file_deleted", file=f.file_name, end_phy_offset=f.end_phy_offset)
        return len(doomed)

    def truncate(self, phy_offset: int) -> int:
        """Forget index entries of records at or beyond `phy_offset` (blocking: may delete).

        For recovery after the commitlog was cut at `phy_offset` (e.g. an OS crash left the
        index flushed further than the commitlog): files that begin at or beyond it are
        deleted; the file straddling it is sealed (marked full, end offset moved just below
        `phy_offset`), so new records there get indexed in a new file instead of being
        skipped as already indexed. Its stale entries stay (queries check the records' keys).

        Returns:
            How many files were deleted.
        """
        with self._lock:
            files = self._files
            doomed = [f for f in files if f.begin_phy_offset >= phy_offset]
            self._files = [f for f in files if f not in doomed]
            last = self._files[-1] if self._files else None
        for f in doomed:
            f.destroy()
            log.warning("index_file_truncated", file=f.file_name, begin=f.begin_phy_offset)
        if last is not None and last.end_phy_offset >= phy_offset:
            last.seal(phy_offset - 1)
            log.warning("index_file_sealed", file=last.file_name, below=phy_offset)
        return len(doomed)

    def add_rebuild_file(self, prev: IndexFile | None, first_ts: int, below: int) -> IndexFile:
        """A new file for an `IndexRebuild` of records below `below` (blocking: creates it).

        Named after `first_ts` (the store time of its first record; after `prev`, the
        rebuild's previous file), so that by name it sorts before the files the live indexing
        created since the start; placed after `prev`, else before the first live file. It is
        marked `rebuilding`: the live indexing never writes it, `delete_expired` keeps it and
        `flush` leaves it out of the durable point, until `finish_rebuild`.
        """
        with self._lock:
            self.rebuild_below = below
            files = self._files
            ms = max(first_ts, 0)
            if prev is not None:
                ms = max(ms, _name_ms_floor(prev.file_name))
            path = self.directory / index_file_name(ms)
            while path.exists() or (prev is not None and path.name <= prev.file_name):
                ms += 1
                path = self.directory / index_file_name(ms)
            self.directory.mkdir(parents=True, exist_ok=True)
            f = IndexFile(
                path,
                self.slot_num,
                self.index_num,
                prev.end_phy_offset if prev is not None else 0,
                prev.end_timestamp if prev is not None else 0,
            )
            f.rebuilding = True
            if prev is not None and prev in files:
                at = files.index(prev) + 1
            else:
                at = next(
                    (
                        i
                        for i, g in enumerate(files)
                        if not g.rebuilding and g.begin_phy_offset >= below
                    ),
                    len(files),
                )
            files.insert(at, f)
            later = [g.file_name for g in files[at + 1 :] if g.file_name <= f.file_name]
        if later:
            log.warning("index_rebuild_file_order", file=f.file_name, later_files=later)
        log.info("index_file_created", file=f.file_name, rebuild=True)
        return f

    def finish_rebuild(self) -> None:
        """Write back the rebuilt files and make them ordinary files (blocking)."""
        for f in self.files:
            if f.rebuilding:
                f.write_header()
                f.flush()
        with self._lock:
            for f in self._files:
                f.rebuilding = False
            self.rebuild_below = 0

    def drop_range(self, begin: int, end: int) -> int:
        """Delete the files whose first record lies in ``[begin, end)`` (an unfinished
        rebuild's files; blocking). Returns how many."""
        with self._lock:
            doomed = [f for f in self._files if begin <= f.begin_phy_offset < end]
            self._files = [f for f in self._files if f not in doomed]
        for f in doomed:
            f.destroy()
        return len(doomed)

    def close(self) -> None:
        """Flush and close every file (blocking)."""
        with self._lock:
            files, self._files = self._files, []
        for f in files:
            f.close()

    def destroy(self) -> None:
        """Delete every file (blocking)."""
        with self._lock:
            files, self._files = self._files, []
        for f in files:
            f.destroy()


def _batch_hashes(
    prefix: str,
    phy_offsets: Sequence[int],
    uniq_keys: Sequence[str | None],
    keys: Sequence[str | None],
    end: int,
    indexed: bool,
) -> tuple[list[int], list[int]]:
    """The (hashes, commitlog offsets) `IndexService.build_index_batch` writes: per record
    not indexed yet, ``prefix + UNIQ_KEY`` then ``prefix + <each KEYS token>`` (reference of
    the native version)."""
    hashes: list[int] = []
    phys: list[int] = []
    # `uniq_key_hash` inlined, with the cached head hash kept while the head repeats (the
    # messages of a batch come from one producer).
    last_head = ""
    head_h = 0
    for phy, uniq, key_list in zip(phy_offsets, uniq_keys, keys, strict=True):
        if not uniq and not key_list:
            continue
        # Offsets only grow, so comparing with the end before this batch is enough.
        if phy < end or (phy == end and indexed):
            continue
        if uniq:
            cut = len(uniq) - _TAIL
            if cut > 0 and uniq.isascii():
                head = uniq[:cut]
                if head != last_head:
                    last_head = head
                    head_h = _prefix_hash(prefix + head)
                h = (head_h + sum(map(_mul, uniq[cut:].encode("ascii"), _POW31_REV))) & 0xFFFFFFFF
                hashes.append(_abs32(h - 0x100000000 if h & 0x80000000 else h))
            else:
                hashes.append(key_hash(prefix + uniq))
            phys.append(phy)
        if key_list:
            for key in key_list.split(" "):
                if key:
                    hashes.append(key_hash(prefix + key))
                    phys.append(phy)
    return hashes, phys


def _name_ms_floor(name: str) -> int:
    """Epoch ms of an index file name (local time), or 0 if it does not parse."""
    try:
        t = time.strptime(name[:14], "%Y%m%d%H%M%S")
    except ValueError:
        return 0
    return int(time.mktime(t)) * 1000 + int(name[14:17])

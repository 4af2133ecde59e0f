"""Crash recovery: find the valid end of the commitlog and repair what depends on it.

`RecordScanner` is sans-IO: it walks the records of one file through a ``read(pos, size)``
callback and stops at the first thing that is not a valid record (END: zeros or nothing,
INVALID: torn write, garbage, bad CRC, a record claiming another offset), or at the BLANK
padding (the file is complete). `FileScanner` goes on past such a stop: it looks for the next
valid record (`find_next_record`: magic code, size, layout, its own offset, body CRC) and
reports the bytes in between as a damaged region. `recover_commitlog` drives it over the files,
re-dispatches every record (consume queues and index skip what they already have), keeps the
damaged regions followed by valid records (damage in the middle: only those bytes are lost) and
truncates what follows the last valid record (a torn tail after a crash). `IndexRebuild`
rebuilds index files from the commitlog, a slice at a time (the store runs it in the
background).
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from common.message import (
    BLANK_MAGIC_CODE,
    BLANK_RECORD_SIZE,
    BORNHOST_V6_FLAG,
    DEFAULT_MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    DispatchRequest,
    DispatchStatus,
    check_record,
    native_scan_records,
)
from store._mapped_file import MappedFile
from store.commitlog import CommitLog
from store.index_file import IndexFile, IndexService, key_hash, uniq_key_hash
from store.paths import offset_to_file_name

__all__ = [
    "CommitLogScan",
    "DamagedRegion",
    "FileScanner",
    "IndexRebuild",
    "RecordScanner",
    "RecoveryReport",
    "choose_scan_start",
    "count_records",
    "find_next_record",
    "has_torn_tail",
    "light_check",
    "load_damaged_regions",
    "recover_commitlog",
    "save_damaged_region",
    "scan_commitlog",
]

log = structlog.get_logger()

_WINDOW = 4 * 1024 * 1024


class _FileScan:
    """What both scanners are given: one file's reader, where it sits and how to check it."""

    __slots__ = ("_check_crc", "_from", "_light", "_max_size", "_read", "file_size", "start")

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        file_from_offset: int,
        file_size: int,
        start: int = 0,
        *,
        check_crc: bool = True,
        max_size: int = DEFAULT_MAX_RECORD_SIZE,
        light: bool = False,
    ) -> None:
        self._read = read
        self._from = file_from_offset
        self.file_size = file_size
        self.start = start
        self._check_crc = check_crc
        self._max_size = max_size
        self._light = light
        self._begin()

    def _begin(self) -> None:
        """Set the scanner's own results to their values before a scan."""


class RecordScanner(_FileScan):
    """Iterate the valid records of one file from relative position `start`.

    After iteration, `end` is the relative position just after the last valid record (or of
    the BLANK padding) and `outcome` says why it stopped: BLANK (file complete), END or INVALID.

    Args:
        read: (relative position, size) -> bytes of the file (shorter at the file end).
        file_from_offset: Global offset of the file's byte 0 (records must claim their own).
        file_size: Size of the file.
        start: Where to begin.
        check_crc: Verify body CRCs.
        max_size: Largest acceptable record.
        light: Validate only the layout (lengths, CRC, offsets, torn tails) and yield requests
            with size, commit_log_offset, store_timestamp and sys_flag only (no properties
            parsing): enough to find the valid end when nothing needs re-dispatching.
    """

    __slots__ = ("end", "outcome")

    def _begin(self) -> None:
        self.end = self.start
        self.outcome = DispatchStatus.END

    def __iter__(self) -> Iterator[DispatchRequest]:
        pos = self.start
        size = self.file_size
        buf = b""
        base = pos
        # Natively (not light): the records of each window at once, with the same checks; the
        # loop below takes the one record at each place where it reads the file again. So the
        # reads and the outcome are the Python loop's (only a first window of fewer than 8
        # bytes is read twice).
        scan = None if self._light else native_scan_records
        if scan is not None and pos + BLANK_RECORD_SIZE <= size:
            buf = self._read(pos, _WINDOW)
        while True:
            if scan is not None:
                reqs, _at, outcome = scan(
                    buf, pos, base, self._from, size, self._check_crc, self._max_size
                )
                for req in reqs:
                    pos += req.size
                    self.end = pos
                    yield req
                if outcome is not None:
                    self.outcome = outcome
                    break
            if pos + BLANK_RECORD_SIZE > size:
                self.outcome = DispatchStatus.END if pos >= size else DispatchStatus.INVALID
                break
            i = pos - base
            if len(buf) - i < BLANK_RECORD_SIZE:
                buf, base, i = self._read(pos, _WINDOW), pos, 0
            total = int.from_bytes(buf[i : i + 4], "big", signed=True)
            magic = int.from_bytes(buf[i + 4 : i + 8], "big")
            if magic == BLANK_MAGIC_CODE:
                # The padding must run exactly to the end of the file.
                ok = pos + total == size and total >= BLANK_RECORD_SIZE
                self.outcome = DispatchStatus.BLANK if ok else DispatchStatus.INVALID
                break
            if 0 < total <= self._max_size and len(buf) - i < total and base + len(buf) < size:
                buf, base, i = self._read(pos, max(_WINDOW, total)), pos, 0
            if self._light:
                req = light_check(buf, i, self._check_crc, self._max_size)
            else:
                req = check_record(buf, i, check_crc=self._check_crc, max_size=self._max_size)
            if req.status is DispatchStatus.OK:
                if (
                    req.commit_log_offset != self._from + pos
                    or pos + req.size > size
                    or has_torn_tail(buf, i, req.size, req.sys_flag)
                ):
                    self.outcome = DispatchStatus.INVALID
                    break
                pos += req.size
                self.end = pos
                yield req
                continue
            self.outcome = (
                DispatchStatus.END if req.status is DispatchStatus.END else DispatchStatus.INVALID
            )
            break
        self.end = pos


_HEAD = struct.Struct(">iIiiiqqi")  # total, magic, crc, queue id, flag, queue off, phy, sys flag
_I64 = struct.Struct(">q")
_LIGHT_INVALID = DispatchRequest(DispatchStatus.INVALID)
_LIGHT_END = DispatchRequest(DispatchStatus.END)


def light_check(buf: bytes, offset: int, check_crc: bool, max_size: int) -> DispatchRequest:
    """Layout-only validation of the message record at `offset` (see `RecordScanner`).

    Checks the magic code, that TOTALSIZE is sane and within `buf`, that body / topic /
    properties lengths add up exactly, and with `check_crc` the body CRC. Never raises.
    """
    end = len(buf)
    if end - offset < MIN_RECORD_SIZE:
        return _LIGHT_END if not any(buf[offset:end]) else _LIGHT_INVALID
    total, magic, crc, _qid, _flag, _qoff, phy, sys_flag = _HEAD.unpack_from(buf, offset)
    if magic != MESSAGE_MAGIC_CODE:
        return _LIGHT_END if total == 0 and magic == 0 else _LIGHT_INVALID
    rec_end = offset + total
    if total < MIN_RECORD_SIZE or total > max_size or rec_end > end:
        return _LIGHT_INVALID
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    body_len_pos = offset + 68 + born + store
    if body_len_pos + 4 > rec_end:
        return _LIGHT_INVALID
    body_len = int.from_bytes(buf[body_len_pos : body_len_pos + 4], "big", signed=True)
    body_start = body_len_pos + 4
    body_end = body_start + body_len
    if body_len < 0 or body_end + 3 > rec_end:
        return _LIGHT_INVALID
    topic_end = body_end + 1 + buf[body_end]
    if topic_end + 2 > rec_end:
        return _LIGHT_INVALID
    props_len = int.from_bytes(buf[topic_end : topic_end + 2], "big", signed=True)
    if props_len < 0 or topic_end + 2 + props_len != rec_end:
        return _LIGHT_INVALID
    if check_crc:
        with memoryview(buf) as view:
            if zlib.crc32(view[body_start:body_end]) & 0x7FFFFFFF != crc:
                return _LIGHT_INVALID
    (store_ts,) = _I64.unpack_from(buf, offset + 48 + born)
    return DispatchRequest(
        DispatchStatus.OK,
        total,
        commit_log_offset=phy,
        store_timestamp=store_ts,
        sys_flag=sys_flag,
    )


def has_torn_tail(buf: bytes, offset: int, size: int, sys_flag: int) -> bool:
    """True when the topic or properties of the record at `offset` contain NUL bytes.

    The body CRC does not cover topic and properties; a write torn inside them leaves zeros
    there (a lost page reads as zeros). Topics never contain NUL and property strings produced by
    clients do not either, so a NUL there means the end of the record never reached the disk.
    """
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    body_len_pos = offset + 68 + born + store
    body_len = int.from_bytes(buf[body_len_pos : body_len_pos + 4], "big", signed=True)
    tail_start = body_len_pos + 4 + body_len + 1  # after the topic length byte
    end = offset + size
    if body_len < 0 or tail_start > end:
        return True
    topic_end = tail_start + buf[tail_start - 1]
    # topic, then the int16 properties length (whose high byte may be 0), then the properties
    return buf.find(b"\0", tail_start, topic_end) >= 0 or buf.find(b"\0", topic_end + 2, end) >= 0


def choose_scan_start(
    files: list[MappedFile],
    *,
    abnormal: bool,
    checkpoint_min_timestamp: int,
    full: bool = False,
) -> int:
    """Index of the file recovery scans from.

    Clean shutdown: the third-last file. After a crash: the last file whose first record is
    valid and was stored at or before the checkpoint's min timestamp (else the first file).
    `full` forces the first file (e.g. the consume queues are gone).
    """
    if not files or full:
        return 0
    if not abnormal:
        return max(0, len(files) - 3)
    for idx in range(len(files) - 1, -1, -1):
        mf = files[idx]
        req = check_record(mf.read(0, 64 * 1024), 0, check_crc=False)
        if (
            req.status is DispatchStatus.OK
            and checkpoint_min_timestamp > 0
            and req.store_timestamp <= checkpoint_min_timestamp
        ):
            return idx
    return 0


_MAGIC = MESSAGE_MAGIC_CODE.to_bytes(4, "big")
_BLANK_MAGIC = BLANK_MAGIC_CODE.to_bytes(4, "big")
_SEARCH_CHUNK = 16 * 1024 * 1024


def _candidate_ok(
    read: Callable[[int, int], bytes],
    file_from_offset: int,
    file_size: int,
    pos: int,
    *,
    check_crc: bool,
    max_size: int,
) -> bool:
    """Whether a whole valid record (or the BLANK padding up to the file end) starts at `pos`."""
    head = read(pos, 8)
    if len(head) < 8:
        return False
    total = int.from_bytes(head[:4], "big", signed=True)
    if head[4:8] == _BLANK_MAGIC:
        return total >= BLANK_RECORD_SIZE and pos + total == file_size
    if not MIN_RECORD_SIZE <= total <= max_size or pos + total > file_size:
        return False
    buf = read(pos, total)
    if len(buf) < total:
        return False
    req = light_check(buf, 0, check_crc, max_size)
    return (
        req.status is DispatchStatus.OK
        and req.size == total
        and req.commit_log_offset == file_from_offset + pos
        and not has_torn_tail(buf, 0, total, req.sys_flag)
    )


def find_next_record(
    read: Callable[[int, int], bytes],
    file_from_offset: int,
    file_size: int,
    start: int,
    *,
    check_crc: bool = True,
    max_size: int = DEFAULT_MAX_RECORD_SIZE,
) -> int | None:
    """Relative position of the first valid record at or after `start`, or None.

    A candidate is any place where the message (or BLANK) magic code sits 4 bytes in; it is
    taken only when its whole structure checks out: TOTALSIZE within the file and the limit,
    body / topic / properties lengths adding up to it exactly, PHYSICALOFFSET equal to the
    candidate's own offset, no NUL in topic or properties, and the body CRC with `check_crc`
    (a BLANK counts when its size runs exactly to the file end). A random match of the magic
    code inside a body fails the offset check with near certainty. Reads `_SEARCH_CHUNK`
    bytes at a time (memchr-speed ``find``: a zeroed tail of a 1 GiB file takes ~0.2 s).
    """
    search = max(start, 0) + 4  # where a candidate's magic code can begin
    while search + 4 <= file_size:
        chunk = read(search, _SEARCH_CHUNK + 3)
        if len(chunk) < 4:
            return None
        i = 0
        while True:
            a = chunk.find(_MAGIC, i)
            b = chunk.find(_BLANK_MAGIC, i)
            if a < 0 and b < 0:
                break
            hit = a if b < 0 or (0 <= a < b) else b
            cand = search + hit - 4
            if _candidate_ok(
                read, file_from_offset, file_size, cand, check_crc=check_crc, max_size=max_size
            ):
                return cand
            i = hit + 1
        search += max(len(chunk) - 3, 1)
    return None


def count_records(read: Callable[[int, int], bytes], start: int, end: int) -> int | None:
    """How many records fill ``[start, end)`` exactly, following each TOTALSIZE from `start`
    (each must carry the message magic code), or None when the chain does not land on `end`
    (a damaged size field: the count is unknown)."""
    pos = start
    n = 0
    while pos < end:
        head = read(pos, 8)
        if len(head) < 8 or head[4:8] != _MAGIC:
            return None
        total = int.from_bytes(head[:4], "big", signed=True)
        if total < MIN_RECORD_SIZE:
            return None
        pos += total
        n += 1
    return n if pos == end else None


class FileScanner(_FileScan):
    """Iterate the valid records of one file, skipping damaged regions.

    Where `RecordScanner` stops short of the file end (no BLANK padding reached), the rest of
    the file is searched for the next valid record (`find_next_record`); when there is one,
    the bytes in between are a damaged region (`gaps`) and the scan goes on from it.

    After iteration: `gaps` holds the damaged regions ``(rel start, rel end)`` that valid
    records (or the BLANK padding) follow, `complete` says whether the BLANK padding was
    reached, `tail_from` is the relative position after the last valid record (the file size
    when complete; what follows it up to the file end holds no valid record), `records`
    counts the records yielded, `last_end` is the relative end of the last one (the start
    when none).

    Args: as `RecordScanner`'s.
    """

    __slots__ = ("complete", "gaps", "last_end", "records", "tail_from")

    def _begin(self) -> None:
        self.gaps: list[tuple[int, int]] = []
        self.complete = False
        self.tail_from = self.start
        self.last_end = self.start
        self.records = 0

    def __iter__(self) -> Iterator[DispatchRequest]:
        pos = self.start
        while True:
            scanner = RecordScanner(
                self._read,
                self._from,
                self.file_size,
                pos,
                check_crc=self._check_crc,
                max_size=self._max_size,
                light=self._light,
            )
            for req in scanner:
                self.records += 1
                self.last_end = scanner.end
                yield req
            if scanner.outcome is DispatchStatus.BLANK:
                self.complete = True
                self.tail_from = self.file_size
                return
            self.tail_from = scanner.end
            if scanner.end >= self.file_size:
                return
            nxt = find_next_record(
                self._read,
                self._from,
                self.file_size,
                scanner.end + 1,
                check_crc=self._check_crc,
                max_size=self._max_size,
            )
            if nxt is None:
                return
            self.gaps.append((scanner.end, nxt))
            pos = nxt


@dataclass(slots=True, frozen=True)
class DamagedRegion:
    """Commitlog bytes between valid records that hold no valid record.

    Attributes:
        offset: Commitlog offset of the first damaged byte.
        length: Bytes up to the next valid record (or the end of its file).
        records: Records lost in it, when the size fields still chain across it; else None.
    """

    offset: int
    length: int
    records: int | None = None

    @property
    def end(self) -> int:
        """Offset just past the region."""
        return self.offset + self.length

    def describe(self) -> str:
        """``offset:length:records`` (records ``?`` when unknown)."""
        return f"{self.offset}:{self.length}:{'?' if self.records is None else self.records}"


@dataclass(slots=True)
class RecoveryReport:
    """What recovery found.

    Attributes:
        scan_from: Physical offset where the scan began.
        valid_end: Physical offset just after the last valid record.
        records: Valid records scanned.
        stop_reason: END, INVALID or BLANK (last file complete) at the stop point.
        truncated_bytes: Non-zero bytes found after `valid_end` (a torn tail: lost data).
        dropped_files: Files wholly past `valid_end`, deleted.
        last_store_timestamp: Store timestamp of the last valid record (0 if none scanned).
        damaged: Damaged regions in the middle (valid records follow them), kept in place and
            skipped; oldest first.
    """

    scan_from: int
    valid_end: int
    records: int
    stop_reason: str
    truncated_bytes: int
    dropped_files: int
    last_store_timestamp: int
    damaged: list[DamagedRegion] = field(default_factory=list)

    @property
    def lost_bytes(self) -> int:
        """Bytes in the damaged regions."""
        return sum(r.length for r in self.damaged)

    @property
    def lost_records(self) -> int:
        """Records known lost in the damaged regions (those with a known count)."""
        return sum(r.records or 0 for r in self.damaged)


def nonzero_extent(read: Callable[[int, int], bytes], start: int, end: int) -> int:
    """Bytes from `start` to the last non-zero byte before `end` (0 when all are zero)."""
    last = -1
    pos = start
    while pos < end:
        chunk = read(pos, min(16 * 1024 * 1024, end - pos))
        if not chunk:
            break
        stripped = len(chunk.rstrip(b"\0"))
        if stripped:
            last = pos + stripped
        pos += len(chunk)
    return max(0, last - start)


@dataclass(slots=True)
class CommitLogScan:
    """What `scan_commitlog` found over a run of files.

    Attributes:
        valid_end: Offset just after the last valid record (or complete file).
        records: Valid records.
        last_store_timestamp: Store timestamp of the last one (0 if none).
        stop_reason: END (zeros or nothing after the last record), INVALID (non-zero bytes
            that are no record) or BLANK (the last file is complete).
        damaged: Damaged regions in the middle, oldest first.
        tail: The invalid stretches after `valid_end`, ``(file index, rel start, non-zero
            bytes)``, each up to its file's end: the torn tail.
        complete: Indexes of the files whose BLANK padding was reached.
    """

    valid_end: int
    records: int = 0
    last_store_timestamp: int = 0
    stop_reason: str = "END"
    damaged: list[DamagedRegion] = field(default_factory=list)
    tail: list[tuple[int, int, int]] = field(default_factory=list)
    complete: list[int] = field(default_factory=list)

    @property
    def tail_bytes(self) -> int:
        """Non-zero bytes of the torn tail."""
        return sum(nz for _i, _rel, nz in self.tail)


def scan_commitlog(
    files: list[tuple[int, int, Callable[[int, int], bytes]]],
    *,
    check_crc: bool,
    max_size: int,
    light: bool,
    on_record: Callable[[DispatchRequest], None] | None = None,
) -> CommitLogScan:
    """Scan consecutive commitlog files ``(from offset, size, read)`` with `FileScanner`.

    A stretch that holds no valid record but is followed by valid records (later in its file
    or in a later file) is a damaged region; what follows the last valid record, with nothing
    valid after it, is the tail (torn by a crash, or damaged: nothing tells them apart).
    """
    out = CommitLogScan(files[0][0] if files else 0)
    pending: list[tuple[int, int, int]] = []
    for i, (file_from, size, read) in enumerate(files):
        fs = FileScanner(
            read, file_from, size, 0, check_crc=check_crc, max_size=max_size, light=light
        )
        for req in fs:
            out.records += 1
            out.last_store_timestamp = req.store_timestamp
            if on_record is not None:
                on_record(req)
        if fs.records > 0 or fs.complete:
            for j, rel, _nz in pending:
                pf, psize, pread = files[j]
                out.damaged.append(_region(pread, pf, rel, psize))
            pending = []
            for a, b in fs.gaps:
                out.damaged.append(_region(read, file_from, a, b))
            out.valid_end = file_from + fs.tail_from
        if fs.complete:
            out.stop_reason = "BLANK"
            out.complete.append(i)
            continue
        nonzero = nonzero_extent(read, fs.tail_from, size)
        out.stop_reason = "INVALID" if nonzero else "END"
        pending.append((i, fs.tail_from, nonzero))
    out.tail = pending
    return out


def recover_commitlog(
    commitlog: CommitLog,
    *,
    abnormal: bool,
    checkpoint_min_timestamp: int,
    full: bool,
    check_crc: bool,
    max_size: int,
    dispatch: Callable[[DispatchRequest], None] | None,
) -> tuple[RecoveryReport, list[MappedFile]]:
    """Scan the commitlog (`scan_commitlog`), dispatch every valid record, truncate after
    the last one.

    Damaged regions in the middle (valid records follow them, in their file or a later one)
    are reported in `RecoveryReport.damaged`, left in place and skipped; every later file is
    kept. What follows the last valid record with nothing valid after it is a torn tail:
    truncated as after a crash.

    `dispatch` is None after a clean shutdown: the consume queues and index were flushed then,
    and re-dispatching would resurrect the queues of deleted topics from their old records.

    Returns the report and the files detached by the truncation (the caller destroys them in a
    worker thread).
    """
    mfq = commitlog.mfq
    files = mfq.files
    if not files:
        return RecoveryReport(0, 0, 0, "EMPTY", 0, 0, 0), []
    idx = choose_scan_start(
        files, abnormal=abnormal, checkpoint_min_timestamp=checkpoint_min_timestamp, full=full
    )
    scanned = files[idx:]
    scan_from = scanned[0].file_from_offset
    scan = scan_commitlog(
        [(mf.file_from_offset, mf.file_size, mf.read) for mf in scanned],
        check_crc=check_crc,
        max_size=max_size,
        light=dispatch is None,
        on_record=dispatch,
    )
    for i in scan.complete:
        scanned[i].wrote_position = scanned[i].file_size
    valid_end = scan.valid_end
    truncated = scan.tail_bytes
    damaged = scan.damaged
    reason = scan.stop_reason
    dropped = mfq.truncate_to(valid_end)
    mfq.flushed_where = valid_end
    for mf in mfq.files:
        mf.flushed_position = mf.wrote_position
    report = RecoveryReport(
        scan_from,
        valid_end,
        scan.records,
        reason,
        truncated,
        len(dropped),
        scan.last_store_timestamp,
        damaged,
    )
    for region in damaged:
        log.error(
            "commitlog_damaged_region",
            offset=region.offset,
            length=region.length,
            records=region.records,
            note="skipped; the records after it are kept",
        )
    if truncated or dropped:
        log.warning(
            "commitlog_truncated",
            from_offset=valid_end,
            lost_bytes=truncated,
            dropped_files=[m.path.name for m in dropped],
            stop_reason=reason,
        )
    log.info(
        "commitlog_recovered",
        abnormal=abnormal,
        redispatched=dispatch is not None,
        scan_from=scan_from,
        valid_end=valid_end,
        records=scan.records,
        stop_reason=reason,
        damaged_regions=len(damaged),
        damaged_bytes=report.lost_bytes,
    )
    if scan.last_store_timestamp:
        commitlog.last_store_timestamp = scan.last_store_timestamp
    return report, dropped


def _region(
    read: Callable[[int, int], bytes], file_from: int, start: int, end: int
) -> DamagedRegion:
    return DamagedRegion(file_from + start, end - start, count_records(read, start, end))


# ---------------------------------------------------------------------- damaged/ directory
DAMAGED_DIR = "damaged"


def save_damaged_region(root: Path, region: DamagedRegion, data: bytes) -> Path:
    """Copy a damaged region's bytes to ``<root>/damaged/<offset>-<length>.bin`` (blocking;
    trailing zeros are not copied). An existing copy is left as it is."""
    d = root / DAMAGED_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{region.offset}-{region.length}.bin"
    if path.exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.rstrip(b"\0"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_damaged_regions(root: Path) -> list[DamagedRegion]:
    """The regions copied aside by earlier starts (``damaged/<offset>-<length>.bin``), so a
    region found once stays skipped after its file leaves the part recovery scans."""
    d = root / DAMAGED_DIR
    out: list[DamagedRegion] = []
    if not d.is_dir():
        return out
    for p in d.iterdir():
        stem = p.name.removesuffix(".bin")
        if not p.name.endswith(".bin") or stem.count("-") != 1:
            continue
        a, b = stem.split("-")
        if a.isdigit() and b.isdigit():
            out.append(DamagedRegion(int(a), int(b)))
    out.sort(key=lambda r: r.offset)
    return out


# ---------------------------------------------------------------------- index rebuild
REBUILD_MARKER = ".rebuild"


class IndexRebuild:
    """Index the commitlog records in ``[start, end)`` into index files of their own (blocking:
    each `step` runs in a worker thread).

    The store's live indexing keeps indexing new records (all at or after `end`, the valid end
    at start) into its own file at the end of the list; the rebuild writes only into files it
    created (`IndexService.add_rebuild_file`, placed before the live files and skipped by the
    live indexing, the durable point of `IndexService.flush` and `delete_expired`), so the
    two never write the same file and `build_index`'s "already indexed" check, which looks at
    the live file only, is never fooled. A marker file ``index/.rebuild`` names the range while
    the rebuild runs; a start that finds it drops the rebuilt files (they may be incomplete)
    and rebuilds the range again.

    The commitlog is read with ``pread`` on its own descriptors (never the store's mappings,
    whose staged appends belong to the event loop); damaged regions are skipped like in
    recovery; a file deleted meanwhile by cleanup is skipped.
    """

    def __init__(
        self,
        index: IndexService,
        commitlog_dir: Path,
        file_size: int,
        start: int,
        end: int,
        *,
        check_crc: bool,
        max_size: int,
    ) -> None:
        self.index = index
        self.dir = commitlog_dir
        self.file_size = file_size
        self.start = start
        self.end = end
        self.pos = start
        self.check_crc = check_crc
        self.max_size = max_size
        self.records = 0
        self.keys = 0
        self.files_created = 0
        self.started_at = time.monotonic()
        self._file: IndexFile | None = None
        self._fd: int | None = None
        self._fd_from = -1

    @property
    def done(self) -> bool:
        """Whether the whole range was indexed."""
        return self.pos >= self.end

    def write_marker(self) -> None:
        """Write ``index/.rebuild`` (blocking, durable) before the first rebuilt file."""
        d = self.index.directory
        d.mkdir(parents=True, exist_ok=True)
        path = d / REBUILD_MARKER
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"from": self.start, "to": self.end}))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(d)

    def _read(self, pos: int, size: int) -> bytes:
        assert self._fd is not None
        return os.pread(self._fd, size, pos)

    def _open(self, file_from: int) -> bool:
        if self._fd_from == file_from and self._fd is not None:
            return True
        self._close_fd()
        try:
            self._fd = os.open(self.dir / offset_to_file_name(file_from), os.O_RDONLY)
        except FileNotFoundError:
            return False
        self._fd_from = file_from
        return True

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._fd_from = -1

    def step(self, max_records: int = 20000) -> bool:
        """Index up to about `max_records` more records (blocking). Returns `done`."""
        budget = max_records
        while budget > 0 and self.pos < self.end:
            file_from = self.pos - self.pos % self.file_size
            if not self._open(file_from):  # deleted by cleanup (or never there): next file
                self.pos = file_from + self.file_size
                continue
            limit = min(self.file_size, self.end - file_from)
            fs = FileScanner(
                self._read,
                file_from,
                limit,
                self.pos - file_from,
                check_crc=self.check_crc,
                max_size=self.max_size,
            )
            for req in fs:
                self._index(req)
                budget -= 1
                if budget <= 0:
                    break
            if budget <= 0 and not fs.complete:
                self.pos = file_from + fs.last_end
            else:
                self.pos = file_from + self.file_size
        if self._file is not None:
            self._file.write_header()
        if self.done:
            self._close_fd()
        return self.done

    def _index(self, req: DispatchRequest) -> None:
        self.records += 1
        if req.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
            return
        uniq = req.uniq_key
        keys = req.keys
        if not uniq and not keys:
            return
        prefix = req.topic + "#"
        hashes: list[int] = []
        if uniq:
            hashes.append(uniq_key_hash(prefix, uniq))
        if keys:
            hashes.extend(key_hash(prefix + k) for k in keys.split(" ") if k)
        phy = req.commit_log_offset
        ts = req.store_timestamp
        for h in hashes:
            f = self._file
            while f is None or not f.put_hash(h, phy, ts, write_header=False):
                if f is not None:
                    f.write_header()
                f = self._file = self.index.add_rebuild_file(f, ts, self.end)
                self.files_created += 1
            self.keys += 1

    def finish(self) -> None:
        """Write back the rebuilt files, mark them ordinary and remove the marker (blocking)."""
        self._close_fd()
        self.index.finish_rebuild()
        d = self.index.directory
        (d / REBUILD_MARKER).unlink(missing_ok=True)
        _fsync_dir(d)

    def close(self) -> None:
        """Release the descriptor (the rebuild stopped before its end; the marker stays)."""
        self._close_fd()


def read_rebuild_marker(index_directory: Path) -> tuple[int, int] | None:
    """The range of an unfinished rebuild (``index/.rebuild``), or None."""
    try:
        data = json.loads((index_directory / REBUILD_MARKER).read_text())
        return int(data["from"]), int(data["to"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return (0, 1 << 62)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Crash recovery: find the valid end of the commitlog and repair what depends on it.

`RecordScanner` is sans-IO: it walks the records of one file through a ``read(pos, size)``
callback and stops at the first thing that is not a valid record (END: zeros or nothing,
INVALID: torn write, garbage, bad CRC, a record claiming another offset), or at the BLANK
padding (the file is complete). `recover_commitlog` drives it over the files, re-dispatches every
record (consume queues and index skip what they already have) and truncates everything after
the last valid record.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import structlog

from store._mapped_file import MappedFile
from store.commitlog import CommitLog
from store.message import (
    BLANK_MAGIC_CODE,
    BLANK_RECORD_SIZE,
    BORNHOST_V6_FLAG,
    DEFAULT_MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    STOREHOSTADDRESS_V6_FLAG,
    DispatchRequest,
    DispatchStatus,
    check_record,
)

__all__ = [
    "RecordScanner",
    "RecoveryReport",
    "choose_scan_start",
    "has_torn_tail",
    "light_check",
    "recover_commitlog",
]

log = structlog.get_logger()

_WINDOW = 4 * 1024 * 1024


class RecordScanner:
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

    __slots__ = (
        "_check_crc",
        "_from",
        "_light",
        "_max_size",
        "_read",
        "end",
        "file_size",
        "outcome",
        "start",
    )

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
        self._light = light
        self._read = read
        self._from = file_from_offset
        self.file_size = file_size
        self.start = start
        self._check_crc = check_crc
        self._max_size = max_size
        self.end = start
        self.outcome = DispatchStatus.END

    def __iter__(self) -> Iterator[DispatchRequest]:
        pos = self.start
        size = self.file_size
        buf = b""
        base = pos
        while True:
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


@dataclass(slots=True)
class RecoveryReport:
    """What recovery found.

    Attributes:
        scan_from: Physical offset where the scan began.
        valid_end: Physical offset just after the last valid record.
        records: Valid records scanned.
        stop_reason: END, INVALID or BLANK (last file complete) at the stop point.
        truncated_bytes: Non-zero bytes found after `valid_end` in its file (lost data).
        dropped_files: Files wholly past `valid_end`, deleted.
        last_store_timestamp: Store timestamp of the last valid record (0 if none scanned).
    """

    scan_from: int
    valid_end: int
    records: int
    stop_reason: str
    truncated_bytes: int
    dropped_files: int
    last_store_timestamp: int


def _nonzero_tail(mf: MappedFile, rel: int) -> int:
    """Bytes from `rel` to the last non-zero byte of the file (what a truncation drops)."""
    last = -1
    pos = rel
    while pos < mf.file_size:
        chunk = mf.read(pos, 16 * 1024 * 1024)
        stripped = len(chunk.rstrip(b"\0"))
        if stripped:
            last = pos + stripped
        pos += len(chunk)
    return max(0, last - rel)


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
    """Scan the commitlog, dispatch every valid record, truncate after the last one.

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
    scan_from = files[idx].file_from_offset
    records = 0
    last_ts = 0
    valid_end = scan_from
    reason = "END"
    stop_file: MappedFile | None = None
    for mf in files[idx:]:
        scanner = RecordScanner(
            mf.read,
            mf.file_from_offset,
            mf.file_size,
            0,
            check_crc=check_crc,
            max_size=max_size,
            light=dispatch is None,
        )
        for req in scanner:
            records += 1
            last_ts = req.store_timestamp
            if dispatch is not None:
                dispatch(req)
        reason = scanner.outcome.name
        if scanner.outcome is DispatchStatus.BLANK:
            valid_end = mf.file_from_offset + mf.file_size
            mf.wrote_position = mf.file_size
            continue
        valid_end = mf.file_from_offset + scanner.end
        stop_file = mf
        break
    truncated = 0
    if stop_file is not None:
        truncated = _nonzero_tail(stop_file, valid_end - stop_file.file_from_offset)
    dropped = mfq.truncate_to(valid_end)
    mfq.flushed_where = valid_end
    for mf in mfq.files:
        mf.flushed_position = mf.wrote_position
    report = RecoveryReport(scan_from, valid_end, records, reason, truncated, len(dropped), last_ts)
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
        records=records,
        stop_reason=reason,
    )
    if last_ts:
        commitlog.last_store_timestamp = last_ts
    return report, dropped

"""The commitlog: every message, one record after another, in fixed-size mapped files.

A record never spans two files: when ``record + 8`` bytes do not fit in what is left of the
current file, the tail is padded with the BLANK record and the next file starts. Appends assign
the physical offset, the per (topic, queue) logical offset and the store timestamp, then hand
the dispatcher one `DispatchBatch` for a batch of plain messages of one queue (the usual case,
one message or many) or a `DispatchRequest` per record otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from common.message import (
    BLANK_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    NATIVE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_POS,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    DispatchRequest,
    DispatchStatus,
    EncodedRecords,
    MessageInner,
    create_offset_msg_id,
    encode_blank,
    encode_records,
    patch_record,
    patch_records,
    store_timestamp_pos,
)
from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.paths import commitlog_dir
from store.results import AppendMessageResult

if NATIVE:
    import common.speedups as _sp

__all__ = ["CommitLog", "DispatchBatch", "is_not_queued"]

log = structlog.get_logger()


def is_not_queued(sys_flag: int) -> bool:
    """Transaction PREPARED and ROLLBACK records get queue offset 0 and no consume-queue unit."""
    t = sys_flag & TRANSACTION_TYPE_MASK
    return t in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


def _dispatch_request(
    msg: MessageInner, size: int, queue_offset: int, phy: int, now_ms: int, sys_flag: int
) -> DispatchRequest:
    """The dispatch request of one record just appended (single sends, and batches that
    cannot take the column-wise `DispatchBatch` path)."""
    props = msg.properties
    return DispatchRequest(
        DispatchStatus.OK,
        size,
        msg.topic,
        msg.queue_id,
        queue_offset,
        phy,
        msg.tags_code,
        now_ms,
        sys_flag,
        props.get(PROPERTY_KEYS, ""),
        props.get(PROPERTY_UNIQ_KEY),
        msg.prepared_transaction_offset,
        props,
        msg.born_timestamp,
    )


RESERVE_AHEAD = 32 << 20
"""`CommitLog.reserve_ahead` reserves this many bytes past the write position (ASYNC_FLUSH
appends ~13 MB per 500 ms flush interval at 20,000 1 KiB sends/s)."""


class CommitLog:
    """The commitlog files and the (topic, queue id) -> next logical offset table.

    Attributes:
        mfq: The mapped files.
        topic_queue_table: Next logical offset per (topic, queue id).
        last_store_timestamp: Store timestamp of the newest appended record.
    """

    __slots__ = (
        "_pwrite_appends",
        "_staged_files",
        "_staging",
        "_zero_blocks",
        "last_store_timestamp",
        "mfq",
        "topic_queue_table",
    )

    def __init__(
        self,
        root: Path,
        file_size: int,
        *,
        pwrite_appends: bool = False,
        zero_blocks: bool = False,
        keep_free: int = 0,
    ) -> None:
        self.mfq = MappedFileQueue(commitlog_dir(root), file_size, keep_free=keep_free)
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        # Single records go through `os.pwrite` instead of the map (the store sets this in both
        # modes). Before a flush writes pages back, every page written through the map must be
        # write-protected (a reverse-map walk and a TLB shootdown to the event loop's CPU),
        # kernel work that preempts the loop; pages written with pwrite never are. Under
        # SYNC_FLUSH pwrite pays only into blocks zeroed ahead (`zero_blocks`, below): into
        # blocks never written the map is the cheaper one.
        # (docs/design-notes.md, "Commitlog appends through pwrite")
        self._pwrite_appends = pwrite_appends
        # Blocks ahead of the write position are zeroed (`zero_ahead`, SYNC_FLUSH) instead of
        # reserved with fallocate (`reserve_ahead`, ASYNC_FLUSH).
        self._zero_blocks = zero_blocks
        self._staging = False
        self._staged_files: list[MappedFile] = []

    # ------------------------------------------------------------------ staging
    @property
    def stages_appends(self) -> bool:
        """True when `begin_staging` stages single records (appends through pwrite)."""
        return self._pwrite_appends

    def begin_staging(self) -> None:
        """From now until `end_staging`, single records appended with pwrite are staged in
        memory (`MappedFile.stage`) and written together by `end_staging`: one ``pwrite``
        for a run of sends instead of one each.

        The caller must call `end_staging` before the event loop can switch tasks (before any
        checkpoint) and before it answers any of the sends: then no other task, no flush plan
        and no answer to a send ever sees a record that is not in the page cache. A pull
        served in between (one of the same run) reads what was staged: from the buffer when
        the read lies wholly within it (`MappedFile.read`), else from the file after a drain;
        its answer leaves with the run's, after the write. Only records within the blocks
        reserved ahead (`reserve_ahead` under ASYNC_FLUSH, `zero_ahead` under SYNC_FLUSH)
        are staged; the others are written at once. Under SYNC_FLUSH the staged records'
        puts wait for the group commit, whose rounds are planned only after the run (no put
        waits within it but the run's own, which wait from its end). No-op unless appends go
        through pwrite.
        """
        if self._pwrite_appends:
            self._staging = True

    def reserve_ahead(self, ahead: int = RESERVE_AHEAD) -> bool:
        """Reserve the blocks of the last file up to `ahead` bytes past its write position
        (`MappedFile.reserve`), for `begin_staging`. Blocks: call from a worker thread (the
        flush service does, every flush interval, under ASYNC_FLUSH). False when the
        filesystem cannot reserve (appends are then written one by one).

        Raises:
            OSError: the reservation failed (ENOSPC, ...).
        """
        files = self.mfq.files
        if not self._pwrite_appends or self._zero_blocks or not files:
            return True
        mf = files[-1]
        return mf.reserve(mf.wrote_position + ahead)

    def zeros_due(self, ahead: int) -> bool:
        """True when the blocks are zeroed (`zero_blocks`) and less than half of `ahead` bytes
        past the last file's write position are zeroed (then `zero_ahead` until None)."""
        files = self.mfq.files
        if not self._zero_blocks or not files:
            return False
        mf = files[-1]
        reserved = mf.reserved_to
        return reserved >= 0 and reserved - mf.wrote_position < ahead // 2

    def zero_ahead(self, ahead: int, piece: int) -> MappedFile | None:
        """Write zeros (`MappedFile.zero_ahead`, at most `piece` bytes) into the last file's
        blocks towards `ahead` bytes past its write position; returns the file written to,
        which the caller must sync (`MappedFile.sync_range`, in a worker thread) for the zeros
        to pay, or None when nothing was left to write. Event loop only (see
        `MappedFile.zero_ahead`); a no-op unless the blocks are zeroed (`zero_blocks`).

        Raises:
            OSError: the write failed (ENOSPC, ...).
        """
        files = self.mfq.files
        if not self._zero_blocks or not files:
            return None
        mf = files[-1]
        return mf if mf.zero_ahead(mf.wrote_position + ahead, piece) else None

    def end_staging(self) -> None:
        """Stop staging and write what was staged (see `begin_staging`).

        Raises:
            OSError: a write failed (EIO, ...; the space was reserved). The records stay
                appended in memory only: the caller must not acknowledge them, and the store
                must refuse further appends (`MessageStore.end_staging` does).
        """
        self._staging = False
        files = self._staged_files
        if files:
            self._staged_files = []
            for mf in files:
                mf.drain()

    @property
    def file_size(self) -> int:
        """Size of every commitlog file."""
        return self.mfq.file_size

    @property
    def min_offset(self) -> int:
        """First physical offset still stored (0 when empty)."""
        return self.mfq.min_offset

    @property
    def max_offset(self) -> int:
        """Physical offset where the next record goes."""
        return self.mfq.max_offset

    # ------------------------------------------------------------------ append
    def room_for(self, nbytes: int) -> None:
        """Before appending `nbytes` of records: when the last file cannot take them (and the
        BLANK record after them), create the next file now (`MappedFileQueue.room_for`; the
        flush service has usually prepared it in a worker thread), so that a full disk refuses
        the put before anything is written. No system call while the last file has room.

        Raises:
            OSError: the next file cannot be created (ENOSPC: no space to reserve it).
        """
        self.mfq.room_for(nbytes + BLANK_RECORD_SIZE)

    def encode(self, msgs: Sequence[MessageInner]) -> EncodedRecords:
        """Encode every message (without offsets) so that nothing is written if one is bad.

        Raises:
            MessageEncodeError / PropertiesSizeExceededError: from the codec.
            ValueError: a record could never fit in one commitlog file.
        """
        out = encode_records(msgs)
        limit = self.file_size - BLANK_RECORD_SIZE
        for size in out.sizes:
            if size > limit:
                raise ValueError(
                    f"record of {size} bytes cannot fit in a {self.file_size}-byte file"
                )
        return out

    def append(
        self, msgs: Sequence[MessageInner], records: EncodedRecords, now_ms: int
    ) -> tuple[AppendMessageResult, list[DispatchRequest | DispatchBatch]]:
        """Append encoded `records` of `msgs` (from `encode`), consecutive queue offsets.

        The records that fit in the current file are patched in the encode buffer and written
        with one copy; a batch of plain messages of one queue is dispatched as one
        `DispatchBatch`, anything else (transaction PREPARED / ROLLBACK records, mixed
        queues) as a `DispatchRequest` per record.

        Raises:
            OSError: a new file could not be created (the records before it stay written).
        """
        n = len(records.sizes)
        if n == 1:
            return self._append_one(msgs[0], records.buf, now_ms)
        if not _plain_batch(msgs):
            return self._append_each(msgs, records, now_ms)
        first = msgs[0]
        key = (first.topic, first.queue_id)
        table = self.topic_queue_table
        first_queue_offset = table.get(key, 0)
        table[key] = first_queue_offset + n
        phy_offsets: list[int] = []
        try:
            self._write(records, first_queue_offset, now_ms, phy_offsets)
        except OSError:
            # Only the records written so far took their queue offsets (as one by one).
            table[key] = first_queue_offset + len(phy_offsets)
            raise
        self.last_store_timestamp = now_ms
        sizes = records.sizes
        result = AppendMessageResult(
            phy_offsets[0],
            sum(sizes),
            _msg_ids(msgs, records.store_host, phy_offsets),
            first_queue_offset,
            n,
            now_ms,
            phy_offsets,
        )
        return result, [DispatchBatch(msgs, first_queue_offset, phy_offsets, sizes, now_ms)]

    def _append_one(
        self, msg: MessageInner, rec: bytearray, now_ms: int
    ) -> tuple[AppendMessageResult, list[DispatchRequest | DispatchBatch]]:
        """`append` of a single message (a send): the record by itself, one request."""
        size = len(rec)
        mfq = self.mfq
        mf = mfq.file_for_append()
        if size + BLANK_RECORD_SIZE > mf.file_size - mf.wrote_position:
            self._pad(mf)
            mf = mfq.file_for_append()
        sys_flag = msg.sys_flag
        key: tuple[str, int] | None = None
        table = self.topic_queue_table
        if sys_flag & TRANSACTION_TYPE_MASK in (
            TRANSACTION_PREPARED_TYPE,
            TRANSACTION_ROLLBACK_TYPE,
        ):
            queue_offset = 0
        else:
            key = (msg.topic, msg.queue_id)
            queue_offset = table.get(key, 0)
            table[key] = queue_offset + 1
        phy = mf.file_from_offset + mf.wrote_position
        patch_record(rec, 0, queue_offset, phy, now_ms)
        try:
            if self._staging:
                mf.stage(rec)
                staged = self._staged_files
                if not staged or staged[-1] is not mf:
                    staged.append(mf)
            elif self._pwrite_appends:
                mf.pwrite_append(rec)
            else:
                mf.append(rec)
        except OSError:
            if key is not None:
                table[key] = queue_offset  # not written: no hole in the queue's offsets
            raise
        self.last_store_timestamp = now_ms
        req = _dispatch_request(msg, size, queue_offset, phy, now_ms, sys_flag)
        result = AppendMessageResult(
            phy,
            size,
            [create_offset_msg_id(msg.store_host, phy)],
            queue_offset,
            1,
            now_ms,
            [phy],
        )
        return result, [req]

    def _append_each(
        self, msgs: Sequence[MessageInner], records: EncodedRecords, now_ms: int
    ) -> tuple[AppendMessageResult, list[DispatchRequest | DispatchBatch]]:
        """`append` record by record: a batch with transaction PREPARED / ROLLBACK records
        or several queues. A `DispatchRequest` per record."""
        table = self.topic_queue_table
        phy_offsets: list[int] = []
        msg_ids: list[str] = []
        requests: list[DispatchRequest | DispatchBatch] = []
        first_queue_offset = -1
        wrote = 0
        mfq = self.mfq
        buf = records.buf
        sizes = records.sizes
        buf_pos = 0
        with memoryview(buf) as view:
            for idx, msg in enumerate(msgs):
                size = sizes[idx]
                mf = mfq.file_for_append()
                if size + BLANK_RECORD_SIZE > mf.file_size - mf.wrote_position:
                    self._pad(mf)
                    mf = mfq.file_for_append()
                sys_flag = msg.sys_flag
                t = sys_flag & TRANSACTION_TYPE_MASK
                if t in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
                    queue_offset = 0
                else:
                    key = (msg.topic, msg.queue_id)
                    queue_offset = table.get(key, 0)
                    table[key] = queue_offset + 1
                if first_queue_offset < 0:
                    first_queue_offset = queue_offset
                phy = mf.file_from_offset + mf.wrote_position
                patch_record(buf, buf_pos, queue_offset, phy, now_ms)
                mf.append(view[buf_pos : buf_pos + size])
                buf_pos += size
                wrote += size
                phy_offsets.append(phy)
                msg_ids.append(create_offset_msg_id(msg.store_host, phy))
                requests.append(_dispatch_request(msg, size, queue_offset, phy, now_ms, sys_flag))
        self.last_store_timestamp = now_ms
        result = AppendMessageResult(
            phy_offsets[0] if phy_offsets else self.max_offset,
            wrote,
            msg_ids,
            max(first_queue_offset, 0),
            len(phy_offsets),
            now_ms,
            phy_offsets,
        )
        return result, requests

    def _write(
        self,
        records: EncodedRecords,
        first_queue_offset: int,
        now_ms: int,
        phy_out: list[int],
    ) -> None:
        """Patch and write the records (consecutive queue offsets from `first_queue_offset`),
        one copy per commitlog file they land in. `phy_out` receives the offsets of the
        records written, also when an OSError (no new file, disk full) stops it."""
        sizes = records.sizes
        n = len(sizes)
        mfq = self.mfq
        buf = records.buf
        i = 0
        buf_pos = 0
        while i < n:
            mf = mfq.file_for_append()
            wrote = mf.wrote_position
            # A record goes in this file only if the BLANK record still fits after it.
            room = mf.file_size - wrote - BLANK_RECORD_SIZE
            j = i
            seg = 0
            while j < n and seg + sizes[j] <= room:
                seg += sizes[j]
                j += 1
            if j == i:
                self._pad(mf)
                continue
            done = len(phy_out)
            patch_records(
                records,
                i,
                j,
                buf_pos,
                first_queue_offset + i,
                mf.file_from_offset + wrote,
                now_ms,
                phy_out,
            )
            try:
                if buf_pos == 0 and j == n:
                    mf.append(buf)
                else:
                    with memoryview(buf) as view:
                        mf.append(view[buf_pos : buf_pos + seg])
            except OSError:
                del phy_out[done:]  # this segment is not written
                raise
            buf_pos += seg
            i = j

    @staticmethod
    def _pad(mf: MappedFile) -> None:
        remaining = mf.remaining
        # The rest of the file is zero already (sparse); only the 8-byte header is written.
        mf.write_at(mf.wrote_position, encode_blank(remaining))
        mf.wrote_position = mf.file_size

    # ------------------------------------------------------------------ read
    def read(self, phy_offset: int, size: int) -> bytes | None:
        """The `size` bytes at `phy_offset`, or None when not (or no longer) stored."""
        mf = self.mfq.find(phy_offset)
        if mf is None or size <= 0:
            return None
        rel = phy_offset - mf.file_from_offset
        if rel + size > mf.wrote_position:
            return None
        return mf.read(rel, size)

    def read_written(self, phy_offset: int, max_bytes: int) -> bytes | None:
        """The bytes from `phy_offset` to the end of what its file holds, at most
        `max_bytes`: staged bytes are left out, and not drained (see
        `MappedFile.written_position`). None when there are none (at or past the max offset,
        or below the min offset)."""
        mf = self.mfq.find(phy_offset)
        if mf is None:
            return None
        rel = phy_offset - mf.file_from_offset
        end = min(mf.written_position, rel + max_bytes)
        if end <= rel:
            return None
        return mf.read_written(rel, end - rel)

    @property
    def empty(self) -> bool:
        """No byte was ever written (no file, or one empty file)."""
        files = self.mfq.files
        return not files or (len(files) == 1 and files[0].wrote_position == 0)

    def record_size_at(self, phy_offset: int) -> int | None:
        """TOTALSIZE of the message record at `phy_offset`, or None if there is none."""
        mf = self.mfq.find(phy_offset)
        if mf is None:
            return None
        rel = phy_offset - mf.file_from_offset
        if rel + MIN_RECORD_SIZE > mf.wrote_position:
            return None
        total = mf.read_int32(rel)
        if mf.read_int32(rel + 4) & 0xFFFFFFFF != MESSAGE_MAGIC_CODE:
            return None
        if total < MIN_RECORD_SIZE or rel + total > mf.wrote_position:
            return None
        return total

    def read_record(self, phy_offset: int) -> bytes | None:
        """The whole message record at `phy_offset`, or None."""
        size = self.record_size_at(phy_offset)
        return None if size is None else self.read(phy_offset, size)

    def store_timestamp_at(self, phy_offset: int, size: int = MIN_RECORD_SIZE) -> int | None:
        """Store timestamp of the record at `phy_offset` (None when gone)."""
        mf = self.mfq.find(phy_offset)
        if mf is None:
            return None
        rel = phy_offset - mf.file_from_offset
        if rel + max(size, MIN_RECORD_SIZE) > mf.wrote_position:
            return None
        sys_flag = mf.read_int32(rel + SYSFLAG_POS)
        return mf.read_int64(rel + store_timestamp_pos(sys_flag))

    def roll_next_file(self, phy_offset: int) -> int:
        """Start offset of the file after the one holding `phy_offset`."""
        return phy_offset + self.file_size - phy_offset % self.file_size


class DispatchBatch:
    """Consecutive records of one queue appended together, for `Dispatcher.dispatch`.

    Column-wise instead of a `DispatchRequest` per record: record ``k`` is ``msgs[k]`` at
    commitlog offset ``commit_log_offsets[k]``, ``sizes[k]`` bytes long, queue offset
    ``first_queue_offset + k``. Every record is a plain (queued, not ROLLBACK) message of
    ``msgs[0]``'s topic and queue.
    """

    __slots__ = ("commit_log_offsets", "first_queue_offset", "msgs", "sizes", "store_timestamp")

    def __init__(
        self,
        msgs: Sequence[MessageInner],
        first_queue_offset: int,
        commit_log_offsets: list[int],
        sizes: list[int],
        store_timestamp: int,
    ) -> None:
        self.msgs = msgs
        self.first_queue_offset = first_queue_offset
        self.commit_log_offsets = commit_log_offsets
        self.sizes = sizes
        self.store_timestamp = store_timestamp

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def topic(self) -> str:
        """Topic of every record."""
        return self.msgs[0].topic

    @property
    def queue_id(self) -> int:
        """Queue id of every record."""
        return self.msgs[0].queue_id


def _plain_batch(msgs: Sequence[MessageInner]) -> bool:
    """One topic and queue, every message queued (not a transaction PREPARED / ROLLBACK)."""
    if not msgs:
        return False
    first = msgs[0]
    topic = first.topic
    qid = first.queue_id
    for m in msgs:
        t = m.sys_flag & TRANSACTION_TYPE_MASK
        if t in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            return False
        if m.queue_id != qid or m.topic != topic:
            return False
    return True


def _msg_ids(
    msgs: Sequence[MessageInner], store_host: tuple[str, int] | None, phys: list[int]
) -> list[str]:
    if store_host is None:
        return [create_offset_msg_id(m.store_host, p) for m, p in zip(msgs, phys, strict=True)]
    host = create_offset_msg_id(store_host, 0)[:-16]
    if NATIVE:
        return _sp.offset_msg_ids(host, phys)
    return [f"{host}{p:016X}" for p in phys]

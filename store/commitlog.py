"""The commitlog: every message, one record after another, in fixed-size mapped files.

A record never spans two files: when ``record + 8`` bytes do not fit in what is left of the
current file, the tail is padded with the BLANK record and the next file starts. Appends assign
the physical offset, the per (topic, queue) logical offset and the store timestamp, then hand a
`DispatchRequest` per record to the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.message import (
    BLANK_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_POS,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    DispatchRequest,
    DispatchStatus,
    MessageInner,
    create_offset_msg_id,
    encode_blank,
    encode_record_template,
    patch_record,
    store_timestamp_pos,
)
from store.paths import commitlog_dir
from store.results import AppendMessageResult

__all__ = ["CommitLog", "is_not_queued"]

log = structlog.get_logger()


def is_not_queued(sys_flag: int) -> bool:
    """Transaction PREPARED and ROLLBACK records get queue offset 0 and no consume-queue unit."""
    t = sys_flag & TRANSACTION_TYPE_MASK
    return t in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


class CommitLog:
    """The commitlog files and the (topic, queue id) -> next logical offset table.

    Attributes:
        mfq: The mapped files.
        topic_queue_table: Next logical offset per (topic, queue id).
        last_store_timestamp: Store timestamp of the newest appended record.
    """

    __slots__ = ("last_store_timestamp", "mfq", "topic_queue_table")

    def __init__(self, root: Path, file_size: int) -> None:
        self.mfq = MappedFileQueue(commitlog_dir(root), file_size)
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0

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
    def encode(self, msgs: Sequence[MessageInner]) -> list[bytearray]:
        """Encode every message (without offsets) so that nothing is written if one is bad.

        Raises:
            MessageEncodeError / PropertiesSizeExceededError: from the codec.
            ValueError: a record could never fit in one commitlog file.
        """
        out = [encode_record_template(m) for m in msgs]
        limit = self.file_size - BLANK_RECORD_SIZE
        for rec in out:
            if len(rec) > limit:
                raise ValueError(
                    f"record of {len(rec)} bytes cannot fit in a {self.file_size}-byte file"
                )
        return out

    def append(
        self, msgs: Sequence[MessageInner], records: Sequence[bytearray], now_ms: int
    ) -> tuple[AppendMessageResult, list[DispatchRequest]]:
        """Append encoded `records` of `msgs` (from `encode`), consecutive queue offsets.

        Raises:
            OSError: a new file could not be created (the records before it stay written).
        """
        table = self.topic_queue_table
        phy_offsets: list[int] = []
        msg_ids: list[str] = []
        requests: list[DispatchRequest] = []
        first_queue_offset = -1
        wrote = 0
        mfq = self.mfq
        ok = DispatchStatus.OK
        for idx, msg in enumerate(msgs):
            rec = records[idx]
            size = len(rec)
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
            patch_record(rec, 0, queue_offset, phy, now_ms)
            mf.append(rec)
            wrote += size
            phy_offsets.append(phy)
            msg_ids.append(create_offset_msg_id(msg.store_host, phy))
            props = msg.properties
            requests.append(
                DispatchRequest(
                    ok,
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
            )
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

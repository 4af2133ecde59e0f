"""Consume queues: per (topic, queue id) arrays of 20-byte units pointing into the commitlog.

Unit = commitlog offset (int64), record size (int32), tags hash code (int64), big-endian. The
logical offset of a unit is its byte offset / 20. A gap filler unit is (0, 2**31 - 1, 0).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import structlog

from common.message import NATIVE
from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.paths import consume_queue_dir

if NATIVE:
    import common.speedups as _sp

__all__ = ["CQ_UNIT_SIZE", "GAP_UNIT_SIZE", "ConsumeQueue"]

log = structlog.get_logger()

CQ_UNIT_SIZE = 20
GAP_UNIT_SIZE = 0x7FFFFFFF
_UNIT = struct.Struct(">qiq")
_GAP = _UNIT.pack(0, GAP_UNIT_SIZE, 0)


def _last_unit_valid(mf: MappedFile) -> bool:
    phy, size, _tags = mf.unpack_from(_UNIT, mf.file_size - CQ_UNIT_SIZE)
    return bool(phy >= 0 and size > 0)


class ConsumeQueue:
    """One consume queue: `consumequeue/<topic>/<queue_id>/<20-digit>` files of units.

    Attributes:
        topic: Topic name.
        queue_id: Queue id.
        mfq: The files.
        min_logic_offset: Byte offset of the first unit still pointing at a live record.
        max_physic_offset: Commitlog offset one past the record of the last unit (-1 if none).
    """

    __slots__ = ("max_physic_offset", "mfq", "min_logic_offset", "queue_id", "topic")

    def __init__(
        self, root: Path, topic: str, queue_id: int, file_size: int, *, keep_free: int = 0
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        size = max(CQ_UNIT_SIZE, file_size - file_size % CQ_UNIT_SIZE)
        self.mfq = MappedFileQueue(
            consume_queue_dir(root, topic, queue_id), size, keep_free=keep_free
        )
        self.min_logic_offset = 0
        self.max_physic_offset = -1

    def __repr__(self) -> str:
        return f"ConsumeQueue({self.topic!r}, {self.queue_id}, max={self.max_offset_in_queue})"

    # ------------------------------------------------------------------ load / recover
    def load(self) -> None:
        """Map the files (all taken as full until `recover`)."""
        self.mfq.load()

    def recover(self) -> None:
        """Find the end of the valid units (the first unit with size <= 0 ends the queue),
        scanning from the third-last file, and set the write position there."""
        files = self.mfq.files
        if not files:
            return
        start_idx = max(0, len(files) - 3)
        # The files before are taken as full (RocketMQ's rule), unless the last unit of one is
        # not valid: with small files a crash can lose more than the last three files' units.
        while start_idx > 0 and not _last_unit_valid(files[start_idx - 1]):
            start_idx -= 1
        end = files[start_idx].file_from_offset
        last_phy = -1
        for mf in files[start_idx:]:
            data = mf.read(0, mf.file_size)
            pos = 0
            for phy, size, _tags in _UNIT.iter_unpack(data):
                if phy < 0 or size <= 0:
                    break
                pos += CQ_UNIT_SIZE
                if size != GAP_UNIT_SIZE:
                    last_phy = phy + size
            end = mf.file_from_offset + pos
            if pos < mf.file_size:
                break
        self._set_end(end)
        self.max_physic_offset = last_phy
        if self.min_logic_offset < self.mfq.min_offset:
            self.min_logic_offset = self.mfq.min_offset

    def _set_end(self, end: int) -> list[MappedFile]:
        dropped = self.mfq.truncate_to(end)
        for mf in dropped:
            mf.destroy()  # small consume-queue files, at recovery time: fine on the loop
        return dropped

    # ------------------------------------------------------------------ offsets
    @property
    def max_offset_in_queue(self) -> int:
        """One past the last logical offset (0 when empty)."""
        return self.mfq.max_offset // CQ_UNIT_SIZE

    @property
    def min_offset_in_queue(self) -> int:
        """First logical offset whose record may still exist."""
        return max(self.min_logic_offset, self.mfq.min_offset) // CQ_UNIT_SIZE

    # ------------------------------------------------------------------ writing
    def room_for(self, queue_offset: int, count: int) -> None:
        """Before the commitlog append of `count` records from logical `queue_offset`: make
        sure their units need no new file, or create it now (`MappedFileQueue.room_for`), so
        that a full disk refuses the put before anything is written. No system call while the
        last file has room.

        Raises:
            OSError: the next file cannot be created (ENOSPC, ...).
        """
        self.mfq.room_for(count * CQ_UNIT_SIZE, queue_offset * CQ_UNIT_SIZE)

    def put(self, phy_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Write the unit for logical `queue_offset`; idempotent.

        Returns False (and writes nothing) when that offset already has a unit. A gap before it
        is filled with gap units (logged).

        Raises:
            OSError: A new file could not be created.
        """
        expected = queue_offset * CQ_UNIT_SIZE
        files = self.mfq.files
        if files:
            # Fast path: the next unit of the last file.
            last = files[-1]
            wrote = last.wrote_position
            if expected == last.file_from_offset + wrote and wrote < last.file_size:
                last.append(_UNIT.pack(phy_offset, size, tags_code))
                self.max_physic_offset = phy_offset + size
                return True
        else:
            mf = self.mfq.file_for_append(expected)
            if expected > mf.file_from_offset:
                log.info(
                    "consume_queue_starts_late",
                    topic=self.topic,
                    queue_id=self.queue_id,
                    queue_offset=queue_offset,
                )
                mf.append(_GAP * ((expected - mf.file_from_offset) // CQ_UNIT_SIZE))
            self.min_logic_offset = expected
        cur = self.mfq.max_offset
        if expected < cur:
            return self._repair(expected, phy_offset, size, tags_code)
        if expected > cur:
            per_file = self.mfq.file_size // CQ_UNIT_SIZE
            if expected - cur > self.mfq.file_size:
                # Far beyond the end: a corrupt queue offset (the body CRC does not cover it),
                # not a gap worth filling with gigabytes of gap units.
                log.error(
                    "consume_queue_offset_implausible",
                    topic=self.topic,
                    queue_id=self.queue_id,
                    queue_offset=queue_offset,
                    max_offset=cur // CQ_UNIT_SIZE,
                    limit=per_file,
                )
                return False
            log.warning(
                "consume_queue_gap_filled",
                topic=self.topic,
                queue_id=self.queue_id,
                from_offset=cur // CQ_UNIT_SIZE,
                to_offset=queue_offset,
            )
            while cur < expected:
                mf = self.mfq.file_for_append()
                n = min(mf.remaining, expected - cur) // CQ_UNIT_SIZE
                mf.append(_GAP * n)
                cur += n * CQ_UNIT_SIZE
        mf = self.mfq.file_for_append()
        mf.append(_UNIT.pack(phy_offset, size, tags_code))
        self.max_physic_offset = phy_offset + size
        return True

    def _repair(self, pos: int, phy_offset: int, size: int, tags_code: int) -> bool:
        """The unit at `pos` (below the end) is written already, unless a crash left it
        zeroed in a file recovery took as full: then write it (recovery's redispatch)."""
        mf = self.mfq.find(pos)
        if mf is None:
            return False
        rel = pos - mf.file_from_offset
        if mf.unpack_from(_UNIT, rel)[1] > 0:
            return False
        log.warning(
            "consume_queue_unit_repaired",
            topic=self.topic,
            queue_id=self.queue_id,
            queue_offset=pos // CQ_UNIT_SIZE,
        )
        mf.write_at(rel, _UNIT.pack(phy_offset, size, tags_code))
        self.max_physic_offset = max(self.max_physic_offset, phy_offset + size)
        return True

    def put_batch(
        self,
        first_queue_offset: int,
        phy_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
    ) -> bool:
        """`put` the units for logical offsets ``first_queue_offset, +1, ...``.

        The usual case (they follow the last unit and fit in the last file) is one write;
        anything else goes unit by unit through `put`.

        Returns:
            Whether any unit was written.

        Raises:
            OSError: A new file could not be created.
        """
        n = len(phy_offsets)
        if n == 0:
            return False
        files = self.mfq.files
        if files:
            last = files[-1]
            wrote = last.wrote_position
            if (
                first_queue_offset * CQ_UNIT_SIZE == last.file_from_offset + wrote
                and wrote + n * CQ_UNIT_SIZE <= last.file_size
            ):
                if NATIVE:
                    units = _sp.pack_cq_units(phy_offsets, sizes, tags_codes)
                else:
                    units = b"".join(map(_UNIT.pack, phy_offsets, sizes, tags_codes))
                last.append(units)
                self.max_physic_offset = phy_offsets[-1] + sizes[-1]
                return True
        wrote_any = False
        for k in range(n):
            if self.put(phy_offsets[k], sizes[k], tags_codes[k], first_queue_offset + k):
                wrote_any = True
        return wrote_any

    # ------------------------------------------------------------------ reading
    def get_unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(commitlog offset, size, tags code) at logical `queue_offset`, or None."""
        pos = queue_offset * CQ_UNIT_SIZE
        if queue_offset < 0 or pos >= self.mfq.max_offset:
            return None
        mf = self.mfq.find(pos)
        if mf is None:
            return None
        phy, size, tags = mf.unpack_from(_UNIT, pos - mf.file_from_offset)
        return phy, size, tags

    def read_units(self, queue_offset: int, max_units: int) -> list[tuple[int, int, int]] | None:
        """Up to `max_units` units from `queue_offset`, within the file holding it (None when
        that file is gone)."""
        pos = queue_offset * CQ_UNIT_SIZE
        mf = self.mfq.find(pos)
        if mf is None or pos >= self.mfq.max_offset:
            return None
        rel = pos - mf.file_from_offset
        n = min(max_units, (mf.wrote_position - rel) // CQ_UNIT_SIZE)
        data = mf.read(rel, n * CQ_UNIT_SIZE)
        return list(_UNIT.iter_unpack(data))

    def iter_units(
        self, queue_offset: int, max_units: int
    ) -> tuple[int, Iterator[tuple[int, int, int]]] | None:
        """Like `read_units`, but ``(count, iterator)``: units are unpacked only as far as the
        caller iterates (a pull of 32 reads ahead 800 units for tag filtering, and usually
        needs the first 32)."""
        pos = queue_offset * CQ_UNIT_SIZE
        mf = self.mfq.find(pos)
        if mf is None or pos >= self.mfq.max_offset:
            return None
        rel = pos - mf.file_from_offset
        n = min(max_units, (mf.wrote_position - rel) // CQ_UNIT_SIZE)
        return n, _UNIT.iter_unpack(mf.read(rel, n * CQ_UNIT_SIZE))

    def roll_next_file(self, queue_offset: int) -> int:
        """Logical offset of the first unit of the file after the one holding `queue_offset`."""
        per_file = self.mfq.file_size // CQ_UNIT_SIZE
        return queue_offset + per_file - queue_offset % per_file

    def offset_by_time(
        self, timestamp_ms: int, store_time: Callable[[int, int], int | None]
    ) -> int:
        """Smallest logical offset whose record's store time is >= `timestamp_ms` (the max
        offset when every record is older, the min offset when every one is newer).

        Args:
            timestamp_ms: The time to look for.
            store_time: (commitlog offset, size) -> the record's store timestamp, or None if
                the record is gone.
        """
        lo = self.min_offset_in_queue
        hi = self.max_offset_in_queue
        # Invariant: every offset < lo is older (or gone); every offset >= hi is newer-or-equal.
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get_unit(mid)
            ts = None if unit is None else store_time(unit[0], unit[1])
            if ts is None or ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------ repair / cleanup
    def truncate_dirty(self, phy_end: int) -> int:
        """Drop every unit pointing at or past commitlog offset `phy_end`. Returns how many."""
        end = self.mfq.max_offset
        new_end = end
        for mf in reversed(self.mfq.files):
            pos = mf.wrote_position - CQ_UNIT_SIZE
            stop = False
            while pos >= 0:
                phy, size, _tags = mf.unpack_from(_UNIT, pos)
                if phy < phy_end or size == GAP_UNIT_SIZE:
                    stop = True
                    break
                new_end = mf.file_from_offset + pos
                pos -= CQ_UNIT_SIZE
            if stop:
                break
        if new_end == end:
            return 0
        self._set_end(new_end)
        self.max_physic_offset = -1
        last = self.get_unit(self.max_offset_in_queue - 1)
        if last is not None and last[1] != GAP_UNIT_SIZE:
            self.max_physic_offset = last[0] + last[1]
        return (end - new_end) // CQ_UNIT_SIZE

    def expired_files(self, commitlog_min: int) -> list[MappedFile]:
        """Detach the oldest files whose every unit points below `commitlog_min` (never the
        last file); the caller destroys them."""
        count = 0
        for mf in self.mfq.files[:-1]:
            phy, size, _ = mf.unpack_from(_UNIT, mf.file_size - CQ_UNIT_SIZE)
            if size != GAP_UNIT_SIZE and phy + size <= commitlog_min:
                count += 1
            else:
                break
        return self.mfq.detach_first(count)

    def correct_min_offset(self, commitlog_min: int) -> None:
        """Move `min_logic_offset` to the first unit whose record starts at or after
        `commitlog_min` (after commitlog files were deleted)."""
        first = self.get_unit(self.min_offset_in_queue)
        if first is not None and first[1] != GAP_UNIT_SIZE and first[0] >= commitlog_min:
            return
        for mf in self.mfq.files:
            data = mf.read(0, mf.wrote_position)
            for i, (phy, size, _tags) in enumerate(_UNIT.iter_unpack(data)):
                if size != GAP_UNIT_SIZE and phy >= commitlog_min:
                    new_min = mf.file_from_offset + i * CQ_UNIT_SIZE
                    if new_min > self.min_logic_offset:
                        self.min_logic_offset = new_min
                    return
        # Everything points below the commitlog: the queue is empty from its end on.
        self.min_logic_offset = max(self.min_logic_offset, self.mfq.max_offset)

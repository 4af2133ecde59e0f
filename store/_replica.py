"""The slave side of master/slave replication (RocketMQ 4.x HA): which records replica bytes
complete.

A master streams raw commitlog bytes (`MessageStore.read_commitlog`): runs of one commitlog
file, records and the BLANK filler that pads the file's end, cut anywhere, so a run may end
inside a record. The slave writes them at the same offsets (`MessageStore.append_replica`), so
its commitlog files are byte for byte the master's, and dispatches each record once all its
bytes are there. `scan_replica` finds those records with recovery's `RecordScanner` (the same
checks: layout, body CRC, the record's own offset, torn tails) and tells a record cut short
by the end of the bytes (wait for the rest) from bytes that are no record (refused).
`ReplicaCursor` is where the slave's dispatch stands between runs. Sans-IO: the store reads
and writes the files.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from common.message import (
    BLANK_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    DispatchRequest,
    DispatchStatus,
)
from store._recovery import RecordScanner
from store.errors import ReplicaDataError

__all__ = ["ReplicaCursor", "ReplicaScan", "scan_replica"]

_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE


class ReplicaCursor:
    """Where a slave's dispatch stands.

    Between two appends: every record below `pos` is dispatched, and the bytes in
    [`pos`, `end`) are the beginning of one record or of the BLANK filler (nothing when
    equal); `need` is how many bytes from `pos` complete it (0: not known, scan again).
    `end` is the commitlog's max offset after the last append: when the max offset is
    anything else, something else wrote the commitlog (recovery at open, puts) and the
    cursor starts again from the max offset, which is then a record boundary.
    """

    __slots__ = ("end", "need", "pos")

    def __init__(self) -> None:
        self.pos = -1
        self.end = -1
        self.need = 0

    def reset(self, pos: int) -> None:
        """Start from commitlog offset `pos` (a record boundary), nothing pending."""
        self.pos = pos
        self.end = pos
        self.need = 0


@dataclass(slots=True)
class ReplicaScan:
    """What `scan_replica` found.

    Attributes:
        records: The complete records, in order.
        next_pos: Commitlog offset just after the last of them; the next file's start once
            the BLANK filler has all arrived.
        need: Bytes from `next_pos` that the record (or filler) begun there needs; 0 when
            nothing is begun there.
    """

    next_pos: int
    need: int = 0
    records: list[DispatchRequest] = field(default_factory=list)


def scan_replica(
    buf: bytes, buf_from: int, file_from: int, file_size: int, *, max_size: int
) -> ReplicaScan:
    """The complete records in `buf`, the bytes of one commitlog file from commitlog offset
    `buf_from` (a record boundary) on.

    The bytes after the last complete record must be the beginning of a record (a header
    not yet whole, or a sane TOTALSIZE and the message magic code with fewer bytes than
    TOTALSIZE) or of the BLANK filler; the filler counts once it runs to the file's end.

    Raises:
        ReplicaDataError: bytes that are no record: garbage, a record failing recovery's
            checks (body CRC, its own offset, lengths), one larger than `max_size`, or one
            that could not fit in the file.
    """
    rel0 = buf_from - file_from
    stop = rel0 + len(buf)  # relative end of the bytes there are

    def read(pos: int, size: int) -> bytes:
        i = pos - rel0
        return buf[i : i + size]

    scanner = RecordScanner(read, file_from, file_size, rel0, check_crc=True, max_size=max_size)
    out = ReplicaScan(buf_from, records=list(scanner))
    end = scanner.end
    out.next_pos = file_from + end
    if scanner.outcome is DispatchStatus.BLANK:
        # The filler's header is whole; it is complete once its bytes reach the file end.
        if stop == file_size:
            out.next_pos = file_from + file_size
        else:
            out.need = file_size - end
        return out
    avail = stop - end
    if avail == 0:
        return out
    # Every record leaves room for the BLANK filler's header after it.
    if avail < BLANK_RECORD_SIZE:
        if end + BLANK_RECORD_SIZE <= file_size:
            out.need = BLANK_RECORD_SIZE
            return out
    else:
        total, magic = _HEAD.unpack_from(buf, end - rel0)
        if (
            magic == MESSAGE_MAGIC_CODE
            and MIN_RECORD_SIZE <= total <= max_size
            and avail < total
            and end + total + BLANK_RECORD_SIZE <= file_size
        ):
            out.need = total
            return out
    raise ReplicaDataError(
        f"the replica bytes at commitlog offset {file_from + end} are not a record "
        f"({scanner.outcome.name}; {avail} bytes there)"
    )

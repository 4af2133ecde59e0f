"""The store checkpoint file: how far the commitlog, consume queues and index are durable.

Layout (RocketMQ's ``checkpoint``, a 4096-byte file, big-endian int64 ms):
physicMsgTimestamp @0, logicsMsgTimestamp @8, indexMsgTimestamp @16; the rest is zero.

`StoreCheckpoint.flush` rewrites the file atomically (temp file + fsync + rename + directory
fsync), so a crash leaves either the old or the new checkpoint, never a torn one.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import structlog

__all__ = ["CHECKPOINT_FILE_SIZE", "StoreCheckpoint"]

log = structlog.get_logger()

CHECKPOINT_FILE_SIZE = 4096
_LAYOUT = struct.Struct(">qqq")
_MIN_TIMESTAMP_SLACK_MS = 3000


class StoreCheckpoint:
    """The checkpoint of one store.

    Loading is a small read, done in the constructor; `flush` and `close` block on fsync and
    are meant to be run in a worker thread (``trio.to_thread.run_sync``).

    Args:
        path: the checkpoint file; a missing or short file reads as zeros.

    Attributes:
        physic_msg_timestamp: store time of the last commitlog record known durable.
        logics_msg_timestamp: store time of the last record dispatched to a durable consume queue.
        index_msg_timestamp: end time of the last full, flushed index file.
    """

    __slots__ = ("index_msg_timestamp", "logics_msg_timestamp", "path", "physic_msg_timestamp")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if len(data) >= _LAYOUT.size:
            (
                self.physic_msg_timestamp,
                self.logics_msg_timestamp,
                self.index_msg_timestamp,
            ) = _LAYOUT.unpack_from(data, 0)
        else:
            log.warning("checkpoint_short", path=str(self.path), size=len(data))

    def min_timestamp(self) -> int:
        """``min(physic, logics) - 3000`` ms (never negative): where abnormal recovery starts."""
        return max(
            min(self.physic_msg_timestamp, self.logics_msg_timestamp) - _MIN_TIMESTAMP_SLACK_MS, 0
        )

    def min_timestamp_index(self) -> int:
        """Like `min_timestamp`, also bounded by the index timestamp (when the index is on)."""
        return min(self.min_timestamp(), max(self.index_msg_timestamp, 0))

    def to_bytes(self) -> bytes:
        """The 4096-byte file image."""
        head = _LAYOUT.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp
        )
        return head + bytes(CHECKPOINT_FILE_SIZE - len(head))

    def flush(self) -> None:
        """Write the file atomically and durably (blocking: temp + fsync + rename + dir fsync)."""
        data = self.to_bytes()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        """Flush (blocking)."""
        self.flush()

    def __repr__(self) -> str:
        return (
            f"StoreCheckpoint(physic={self.physic_msg_timestamp}, "
            f"logics={self.logics_msg_timestamp}, index={self.index_msg_timestamp})"
        )

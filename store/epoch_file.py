"""The epoch file: which master epoch wrote which part of the commitlog (RocketMQ 5.x's
`epochFileCheckpoint`, `EpochFileCache`).

Each entry is (epoch, start offset): from that offset on, the commitlog was written by the
master of that epoch, up to the next entry's start (the last entry: up to the max offset).
A replica that was master and comes back compares its entries with the current master's to
find the last offset both logs agree on (`consistent_point`) and truncates after it: what it
wrote after that was never acknowledged by the group.

File format, as RocketMQ writes it (text lines): the entry count; the CRC32 of the entry
lines (each with its newline) & 0x7FFFFFFF; then `epoch-startOffset` per entry, e.g.
`2\\n773307083\\n7-7000\\n8-8000\\n`. It is replaced through a `.tmp` file and the previous
one kept as `.bak` (read when the file is missing or damaged). An empty list is never written.
The file is small; writes fsync, so callers on the event loop run `save` in a thread.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.fileio import write_atomically

__all__ = ["EpochEntry", "EpochFile", "EpochFileError", "consistent_point"]


class EpochFileError(ValueError):
    """A refused entry, or a file that cannot be read."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


def _lines(entries: Sequence[EpochEntry]) -> str:
    return "".join(f"{e.epoch}-{e.start_offset}\n" for e in entries)


def encode(entries: Sequence[EpochEntry]) -> bytes:
    body = _lines(entries)
    crc = zlib.crc32(body.encode()) & 0x7FFFFFFF
    return f"{len(entries)}\n{crc}\n{body}".encode()


def decode(data: bytes) -> list[EpochEntry]:
    """Raises EpochFileError on a damaged file (count, CRC or an entry line)."""
    try:
        text = data.decode()
        count_s, crc_s, *rest = text.split("\n")
        count, crc = int(count_s), int(crc_s)
        rows = rest[:count]
        if len(rows) != count or any(r for r in rest[count:]):
            raise EpochFileError(f"{count} entries announced, {len(rows)} found")
        entries = []
        for row in rows:
            epoch_s, sep, start_s = row.partition("-")
            if not sep:
                raise EpochFileError(f"bad entry {row!r}")
            entries.append(EpochEntry(int(epoch_s), int(start_s)))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EpochFileError(f"damaged epoch file: {exc}") from exc
    if crc != 0 and zlib.crc32(_lines(entries).encode()) & 0x7FFFFFFF != crc:
        raise EpochFileError("damaged epoch file: CRC mismatch")
    return entries


class EpochFile:
    """The entries of one store's epoch file, in memory, saved on change.

    Args:
        path: `<store root>/epochFileCheckpoint`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[EpochEntry] = []

    def load(self) -> None:
        """Read the file, else its `.bak`; neither: no entries. Blocking (small file).

        Raises:
            EpochFileError: both are damaged.
        """
        errors = []
        for candidate in (self.path, self.path.with_name(self.path.name + ".bak")):
            try:
                data = candidate.read_bytes()
            except FileNotFoundError:
                continue
            try:
                self.entries = decode(data)
            except EpochFileError as exc:
                errors.append(f"{candidate.name}: {exc}")
                continue
            return
        if errors:
            raise EpochFileError("; ".join(errors))
        self.entries = []

    def save(self) -> None:
        """Write the entries (fsync, blocking): `.tmp`, the old file to `.bak`, rename."""
        if self.entries:
            write_atomically(self.path, encode(self.entries), keep_backup=True)

    @property
    def last(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    def append(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` writes from `start_offset` on; False when it is the last entry
        already (the same epoch and start).

        Raises:
            EpochFileError: not a larger epoch, or a start before the last entry's.
        """
        last = self.last
        if last is not None:
            if last == EpochEntry(epoch, start_offset):
                return False
            if epoch <= last.epoch or start_offset < last.start_offset:
                raise EpochFileError(
                    f"entry {epoch}-{start_offset} does not follow {last.epoch}-{last.start_offset}"
                )
        self.entries.append(EpochEntry(epoch, start_offset))
        return True

    def truncate_from(self, offset: int) -> None:
        """Drop entries that start at or after `offset` (the log is cut there)."""
        self.entries = [e for e in self.entries if e.start_offset < offset]


def consistent_point(
    local: Sequence[EpochEntry],
    local_max: int,
    master: Sequence[EpochEntry],
    master_max: int,
) -> int | None:
    """The offset up to which the local log and the master's agree (RocketMQ's
    `findConsistentPoint`): walking the local epochs newest first, the first one the master
    has with the same start ends the agreement at the smaller of the two ends (an entry ends
    at the next entry's start, the last at its log's max offset). None when no local epoch
    is the master's (nothing can be kept by this rule; RocketMQ retries later).
    """
    theirs = {e.epoch: (e, end) for e, end in _with_ends(master, master_max)}
    for entry, end in reversed(_with_ends(local, local_max)):
        found = theirs.get(entry.epoch)
        if found is not None and found[0].start_offset == entry.start_offset:
            return min(end, found[1])
    return None


def _with_ends(entries: Sequence[EpochEntry], max_offset: int) -> list[tuple[EpochEntry, int]]:
    return [
        (e, entries[i + 1].start_offset if i + 1 < len(entries) else max_offset)
        for i, e in enumerate(entries)
    ]

"""Errors raised by the store. Puts and gets report problems as statuses; these are for
open/close and misuse."""

from __future__ import annotations

__all__ = [
    "ReplicaDataError",
    "ReplicaOffsetError",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StorePathError",
]


class StoreError(Exception):
    """Base class of every store error."""


class StoreLockedError(StoreError):
    """Another process (or another `MessageStore` in this one) has the store directory open."""


class StoreClosedError(StoreError):
    """The store is not open."""


class StorePathError(StoreError, ValueError):
    """A name (a topic, a queue id) cannot be a path inside the store: empty, `.` or `..`, a
    separator or NUL in it, longer than a file name may be, or a negative queue id."""


class ReplicaOffsetError(StoreError, ValueError):
    """Replica bytes (`MessageStore.append_replica`) that do not start where the store's
    commitlog ends (or, in an empty store, not at the start of a commitlog file). Nothing was
    changed.

    Attributes:
        offset: Where the refused bytes start.
        expected: The store's max phy offset (where the next bytes must start).
    """

    def __init__(self, offset: int, expected: int, detail: str = "") -> None:
        self.offset = offset
        self.expected = expected
        msg = (
            f"replica data at commitlog offset {offset}, "
            f"but the store's max phy offset is {expected}"
        )
        super().__init__(f"{msg}: {detail}" if detail else msg)


class ReplicaDataError(StoreError, ValueError):
    """Replica bytes the store cannot take: they run past the end of their commitlog file, or
    they are not commitlog records (garbage, a bad CRC, a record claiming another offset, a
    record larger than this store accepts). Nothing was changed."""

"""Errors raised by the store. Puts and gets report problems as statuses; these are for
open/close and misuse."""

from __future__ import annotations

__all__ = ["StoreClosedError", "StoreError", "StoreLockedError", "StorePathError"]


class StoreError(Exception):
    """Base class of every store error."""


class StoreLockedError(StoreError):
    """Another process (or another `MessageStore` in this one) has the store directory open."""


class StoreClosedError(StoreError):
    """The store is not open."""


class StorePathError(StoreError, ValueError):
    """A name (a topic, a queue id) cannot be a path inside the store: empty, `.` or `..`, a
    separator or NUL in it, longer than a file name may be, or a negative queue id."""

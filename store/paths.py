"""Every on-disk name of the store, in one place (RocketMQ's `StorePathConfigHelper`)."""

from __future__ import annotations

from pathlib import Path

from store.errors import StorePathError

__all__ = [
    "abort_path",
    "check_path_component",
    "checkpoint_path",
    "commitlog_dir",
    "consume_queue_dir",
    "consume_queue_root",
    "file_name_to_offset",
    "index_dir",
    "lock_path",
    "offset_to_file_name",
]


def offset_to_file_name(offset: int) -> str:
    """The 20-digit zero-padded name of a mapped file starting at `offset`."""
    return f"{offset:020d}"


def file_name_to_offset(name: str) -> int | None:
    """The start offset encoded in a mapped file name, or None if `name` is not one."""
    if len(name) != 20 or not name.isdigit():
        return None
    return int(name)


def commitlog_dir(root: Path) -> Path:
    """`<root>/commitlog`."""
    return root / "commitlog"


def consume_queue_root(root: Path) -> Path:
    """`<root>/consumequeue`."""
    return root / "consumequeue"


# A topic becomes one directory name: at most NAME_MAX (255) bytes on Linux file systems.
_NAME_MAX = 255


def check_path_component(name: str) -> str:
    """`name` if it is one plain file name (no separator, not `.`/`..`, no NUL, at most 255
    bytes), else StorePathError: a name never leads a path outside its directory."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or len(name.encode("utf-8", "surrogatepass")) > _NAME_MAX
    ):
        raise StorePathError(f"{name[:80]!r} cannot be a file name in the store")
    return name


def consume_queue_dir(root: Path, topic: str, queue_id: int) -> Path:
    """`<root>/consumequeue/<topic>/<queue_id>`.

    Raises:
        StorePathError: `topic` is not one plain file name, or `queue_id` is negative.
    """
    if queue_id < 0:
        raise StorePathError(f"queue id {queue_id} is negative")
    return root / "consumequeue" / check_path_component(topic) / str(queue_id)


def index_dir(root: Path) -> Path:
    """`<root>/index`."""
    return root / "index"


def checkpoint_path(root: Path) -> Path:
    """`<root>/checkpoint`."""
    return root / "checkpoint"


def abort_path(root: Path) -> Path:
    """`<root>/abort`: exists while a store is open; present at open means it crashed."""
    return root / "abort"


def lock_path(root: Path) -> Path:
    """`<root>/lock`: flock'ed by the process that has the store open."""
    return root / "lock"

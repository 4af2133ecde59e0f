"""Durable file replacement shared by broker metadata, the client's local offsets and the store's
small files (blocking: call from a worker thread in async code)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: Path, data: bytes, *, keep_backup: bool = False) -> None:
    """Replace `path` with `data` durably: `<name>.tmp` written and fsynced, (with
    `keep_backup`) the current file copied to `<name>.bak`, the temp file renamed over the
    name, the directory fsynced. A crash between the steps leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if keep_backup and path.exists():
        shutil.copyfile(path, path.with_name(path.name + ".bak"))
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

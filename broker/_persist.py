"""Crash-safe JSON config files (`config/topics.json`, `consumerOffset.json`, ...).

A write goes to `<name>.tmp`, is fsynced, the current file is copied to `<name>.bak`, the temp
file is renamed over the name, and the directory is fsynced. A reader takes the file, or the
`.bak` when the file is missing or unreadable (a crash between the steps never loses both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from common import fileio
from remoting.protocol.bodies import loads_tolerant

log = structlog.get_logger()

CONFIG_DIR = "config"
TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` durably, the old file kept as `.bak` (blocking: call from a
    worker thread in async code)."""
    fileio.write_atomically(path, data, keep_backup=True)


def read_json_file(path: Path) -> Any | None:
    """The parsed file (fastjson quirks allowed), its `.bak` if the file is bad, or None."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            data = candidate.read_bytes()
        except FileNotFoundError:
            continue
        if not data.strip():
            continue
        try:
            return loads_tolerant(data)
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("config_file_unreadable", path=str(candidate), error=str(exc))
    return None

"""What this machine's disk can do: sequential MB/s with fdatasync, 1 KiB fsyncs per second."""

from __future__ import annotations

import os
import time
from pathlib import Path


def sequential_mb_per_s(directory: Path, total_mb: int, sync_every_mb: int = 8) -> float:
    """Write `total_mb` MiB in 1 MiB blocks, fdatasync every `sync_every_mb` MiB and at the end."""
    path = directory / "disk-seq.bin"
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for i in range(1, total_mb + 1):
            os.write(fd, block)
            if i % sync_every_mb == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        secs = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return total_mb * 1.048576 / secs


def fsyncs_per_s(directory: Path, count: int, max_seconds: float = 5.0) -> float:
    """Append 1 KiB then fdatasync, `count` times (or until `max_seconds`): syncs per second."""
    path = directory / "disk-fsync.bin"
    rec = os.urandom(1024)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        done = 0
        while done < count and time.perf_counter() < deadline:
            os.write(fd, rec)
            os.fdatasync(fd)
            done += 1
        secs = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return done / secs

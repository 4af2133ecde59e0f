"""Verify a stopped store's files, read-only: ``python -m store.check <store dir>``.

Scans every commitlog file the way recovery does (`store._recovery.scan_commitlog`: magic code,
size, layout, each record's own offset, body CRC; past a damaged region to the next valid
record) and prints what a start would report: damaged regions in the middle (offset, bytes,
records when known, consume-queue units pointing into them), a torn tail, and the state of the
index (missing, unusable files, an unfinished rebuild). Nothing is written; a store open in a
broker (its ``lock`` held) is refused.

Exit status: 0 clean, 1 damage found, 2 usage error (no such store, store in use).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from common.message import DEFAULT_MAX_RECORD_SIZE
from store._recovery import REBUILD_MARKER, DamagedRegion, scan_commitlog
from store.consume_queue import CQ_UNIT_SIZE, GAP_UNIT_SIZE
from store.index_file import HEADER_SIZE
from store.paths import (
    abort_path,
    commitlog_dir,
    consume_queue_root,
    file_name_to_offset,
    index_dir,
    lock_path,
)

__all__ = ["check_store", "main"]

_INDEX_NAME = re.compile(r"^\d{17}$")
_INDEX_HEADER = struct.Struct(">qqqqii")
_UNIT = struct.Struct(">qiq")


class UsageError(Exception):
    """The store cannot be checked (missing, in use)."""


@contextlib.contextmanager
def _opened(paths: Sequence[Path]) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        fds.extend(os.open(p, os.O_RDONLY) for p in paths)
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _reader(fd: int) -> Callable[[int, int], bytes]:
    return lambda pos, size: os.pread(fd, size, pos)


def _check_not_open(root: Path) -> None:
    path = lock_path(root)
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(f"{root} is open in a running broker; stop it first") from None
    finally:
        os.close(fd)  # closing releases the shared lock


def check_store(
    root: Path, *, check_crc: bool = True, max_size: int = DEFAULT_MAX_RECORD_SIZE
) -> dict[str, Any]:
    """The report (a JSON-able dict) on the store at `root`.

    Raises:
        UsageError: not a store directory, or a broker has it open.
    """
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    _check_not_open(root)
    problems: list[str] = []
    cl_dir = commitlog_dir(root)
    names = sorted(
        (off, p)
        for p in (cl_dir.iterdir() if cl_dir.is_dir() else [])
        if (off := file_name_to_offset(p.name)) is not None and p.is_file()
    )
    files: list[tuple[int, int, Path]] = []
    for off, p in names:
        size = p.stat().st_size
        if files and off != files[-1][0] + files[-1][1]:
            problems.append(f"commitlog file {p.name} does not follow the previous one")
            break
        files.append((off, size, p))
    report: dict[str, Any] = {
        "store": str(root),
        "last_stop": "crash (abort marker present)" if abort_path(root).exists() else "clean",
        "commitlog_files": len(files),
        "min_offset": files[0][0] if files else 0,
        "records": 0,
        "valid_end": 0,
        "damaged": [],
        "damaged_bytes": 0,
        "damaged_queue_units": 0,
        "torn_tail_bytes": 0,
        "torn_tail_from": None,
        "index": {},
        "problems": problems,
    }
    with _opened([p for _o, _s, p in files]) as fds:
        scan = scan_commitlog(
            [(off, size, _reader(fd)) for (off, size, _p), fd in zip(files, fds, strict=True)],
            check_crc=check_crc,
            max_size=max_size,
            light=True,
        )
    report["records"] = scan.records
    report["valid_end"] = scan.valid_end
    report["damaged"] = [
        {"offset": r.offset, "length": r.length, "records": r.records} for r in scan.damaged
    ]
    report["damaged_bytes"] = sum(r.length for r in scan.damaged)
    if scan.damaged:
        problems.append(f"{len(scan.damaged)} damaged commitlog region(s)")
        report["damaged_queue_units"] = _units_into(root, scan.damaged)
    if scan.tail_bytes:
        report["torn_tail_bytes"] = scan.tail_bytes
        report["torn_tail_from"] = scan.valid_end
        problems.append(
            f"{scan.tail_bytes} non-zero bytes after the last valid record (a start truncates them)"
        )
    report["index"] = _check_index(root, bool(scan.records), problems)
    return report


def _units_into(root: Path, regions: list[DamagedRegion]) -> int:
    """Consume-queue units pointing into the regions (queued messages lost)."""
    cq_root = consume_queue_root(root)
    if not cq_root.is_dir():
        return 0
    n = 0
    for path in cq_root.glob("*/*/*"):
        if not path.is_file() or file_name_to_offset(path.name) is None:
            continue
        data = path.read_bytes()
        data = data[: len(data) - len(data) % CQ_UNIT_SIZE]
        for phy, size, _tags in _UNIT.iter_unpack(data):
            if size <= 0:
                break
            if size != GAP_UNIT_SIZE and any(r.offset <= phy < r.end for r in regions):
                n += 1
    return n


def _check_index(root: Path, has_records: bool, problems: list[str]) -> dict[str, Any]:
    d = index_dir(root)
    out: dict[str, Any] = {"files": 0, "unusable": [], "rebuild_unfinished": False}
    paths = sorted(p for p in d.iterdir() if _INDEX_NAME.match(p.name)) if d.is_dir() else []
    out["files"] = len(paths)
    for p in paths:
        with p.open("rb") as f:
            head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            out["unusable"].append(p.name)
            continue
        _bt, _et, begin, end, _slots, count = _INDEX_HEADER.unpack(head)
        if count < 0 or (count > 1 and begin > end) or (count == 0 and any(head)):
            out["unusable"].append(p.name)
    if out["unusable"]:
        problems.append(f"unusable index file(s) {out['unusable']} (a start rebuilds the index)")
    if (d / REBUILD_MARKER).exists():
        out["rebuild_unfinished"] = True
        problems.append("an index rebuild did not finish (a start does it again)")
    if has_records and not paths:
        problems.append("the index is missing (a start rebuilds it from the commitlog)")
    return out


def _print_text(report: dict[str, Any]) -> None:
    print(f"store {report['store']}: last stop {report['last_stop']}")
    print(
        f"commitlog: {report['commitlog_files']} file(s) from offset {report['min_offset']}, "
        f"{report['records']} valid record(s), valid end {report['valid_end']}"
    )
    for r in report["damaged"]:
        recs = "unknown number of records" if r["records"] is None else f"{r['records']} record(s)"
        print(f"damaged region: offset {r['offset']}, {r['length']} bytes, {recs}")
    if report["damaged"]:
        print(
            f"damaged: {report['damaged_bytes']} bytes in {len(report['damaged'])} region(s); "
            f"{report['damaged_queue_units']} consume-queue unit(s) point into them"
        )
    if report["torn_tail_bytes"]:
        print(
            f"torn tail: {report['torn_tail_bytes']} bytes after offset {report['torn_tail_from']}"
        )
    idx = report["index"]
    print(
        f"index: {idx['files']} file(s), unusable {len(idx['unusable'])}, "
        f"unfinished rebuild: {'yes' if idx['rebuild_unfinished'] else 'no'}"
    )
    if report["problems"]:
        for p in report["problems"]:
            print(f"PROBLEM: {p}")
    else:
        print("clean: no damage found")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m store.check", description="Verify a stopped store's files (read-only)."
    )
    parser.add_argument("store_dir", type=Path, help="the store root (holds commitlog/)")
    parser.add_argument("--no-crc", action="store_true", help="skip the body CRC check")
    parser.add_argument(
        "--max-size", type=int, default=DEFAULT_MAX_RECORD_SIZE, help="largest record accepted"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        report = check_store(args.store_dir, check_crc=not args.no_crc, max_size=args.max_size)
    except (UsageError, OSError) as exc:
        print(f"store.check: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())

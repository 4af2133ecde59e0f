"""Recovery's record checks: the Python reference against `common.speedups`, per record.

20,000 W1-sized records (topic "Bench", a 1 KiB random body, the UNIQ_KEY property mqbench's
producer sends, IPv4 hosts: 1,161 bytes each) back to back in one commitlog file, scanned
three ways, each with the Python loop (`check_record` = `_py_check_record`, no native scan)
and natively (what runs unless TRIMQ_NO_NATIVE=1):

  recovery  `RecordScanner` over the whole file (4 MiB reads), as `recover_commitlog` runs it
  replica   `scan_replica` over the bytes in runs of 8,500 (about 7.3 records; stop 32's slave
            got 2,350 frames per 20,000 W1 messages), each run joined to the bytes of the
            record the previous one cut, as `MessageStore._scan_replica` does
  check     `check_record` once per record, on the whole buffer
  slave     `MessageStore.append_replica` of those bytes in runs of 8,500 into an empty store
            (64 MiB commitlog files, ASYNC_FLUSH): the slave's whole store path (the scan,
            the commitlog write, consume queues, index), CPU time of the process per record

Before timing, both give the same requests. Times: best of `--repeats` runs, microseconds per
record (per call for "check"); then the host's speed (`bench.peers._cpu.interp_ns`).

Usage: python -m bench.record_scan [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from unittest import mock

import structlog
import trio
from rich.console import Console
from rich.table import Table

import store._recovery as rec
from bench.peers._cpu import interp_ns
from common import message as m
from common.message import DispatchRequest, MessageInner, encode_blank, encode_record
from store import MessageStore, StoreConfig
from store._recovery import RecordScanner
from store._replica import scan_replica

FROM = 0
RUN = 8500  # replica bytes per run (one HA frame's worth)
MAX_SIZE = 4 * 1024 * 1024 + 64 * 1024


def w1_file(count: int) -> tuple[bytes, int]:
    """`count` W1 records and the BLANK padding after them: (file bytes, file size)."""
    out = bytearray()
    for i in range(count):
        msg = MessageInner(
            "Bench",
            os.urandom(1024),
            queue_id=i % 8,
            properties={"UNIQ_KEY": os.urandom(16).hex().upper()},
            born_timestamp=1_764_300_000_000 + i,
            born_host=("127.0.0.1", 54321),
            store_host=("127.0.0.1", 10911),
        )
        out += encode_record(msg, i // 8, FROM + len(out), 1_764_300_000_000 + i)
    size = len(out) + 64
    out += encode_blank(64)
    return bytes(out) + bytes(56), size


def implementation(native: bool) -> AbstractContextManager[Any]:
    """The store's record checks on one implementation."""
    return mock.patch.multiple(
        rec,
        native_scan_records=m._native_scan_records if native else None,
        check_record=m._native_check_record if native else m._py_check_record,
    )


# Each path hands its requests to `take`, one at a time (the store dispatches each and drops
# it): a list while checking the results, a no-op while timing.
Take = Callable[[DispatchRequest], object]


def recovery(data: bytes, size: int, take: Take) -> None:
    def read(pos: int, n: int) -> bytes:
        return data[pos : pos + n]

    for req in RecordScanner(read, FROM, size, 0, check_crc=True, max_size=MAX_SIZE):
        take(req)


def replica(data: bytes, size: int, take: Take) -> None:
    pos = FROM  # the cursor: everything before it dispatched
    at = 0
    while at < len(data):
        chunk_end = min(at + RUN, len(data))
        buf = data[pos - FROM : chunk_end]  # the pending record's bytes, then the run
        scan = scan_replica(buf, pos, FROM, size, max_size=MAX_SIZE)
        for req in scan.records:
            take(req)
        pos = scan.next_pos
        at = chunk_end


def checks(data: bytes, starts: list[int], take: Take) -> None:
    check = vars(rec)["check_record"]
    for s in starts:
        take(check(data, s, check_crc=True, max_size=MAX_SIZE))


FILE = 64 * 1024 * 1024


async def _slave(data: bytes, root: Path) -> float:
    cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commitlog=FILE)
    async with MessageStore(cfg) as store:
        at = 0
        t0 = time.process_time()
        while at < len(data):
            n = min(RUN, len(data) - at)
            await store.append_replica(FROM + at, data[at : at + n])
            at += n
        return time.process_time() - t0


def slave(data: bytes) -> float:
    """CPU seconds of `append_replica` of `data` (the records only) into an empty store."""
    with tempfile.TemporaryDirectory(prefix="record_scan-") as tmp:
        return trio.run(_slave, data, Path(tmp))


def _drop(req: DispatchRequest) -> None:
    """What timing hands each request to: nothing kept."""


def best(fn: Callable[[Take], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(_drop)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 records, 3 repeats")
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    opts = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    count, repeats = (2000, 3) if opts.quick else (opts.count, opts.repeats)
    if not m.NATIVE:
        raise SystemExit("the accelerators are not in use (not built, or TRIMQ_NO_NATIVE set)")
    data, size = w1_file(count)
    ref: list[DispatchRequest] = []
    with implementation(False):
        recovery(data, size, ref.append)
    starts = [r.commit_log_offset - FROM for r in ref]
    assert len(ref) == count
    rows = []
    cases: list[tuple[str, Callable[[Take], None]]] = [
        ("recovery", lambda take: recovery(data, size, take)),
        ("replica", lambda take: replica(data, size, take)),
        ("check", lambda take: checks(data, starts, take)),
    ]
    for name, fn in cases:
        us = []
        for native in (False, True):
            with implementation(native):
                got: list[DispatchRequest] = []
                fn(got.append)
                assert got == ref, (name, native)
                us.append(best(fn, repeats) / count * 1e6)
        rows.append((name, us[0], us[1]))
    records = data[: sum(r.size for r in ref)]
    us = []
    for native in (False, True):
        with implementation(native):
            us.append(min(slave(records) for _ in range(max(1, repeats // 2))) / count * 1e6)
    rows.append(("slave", us[0], us[1]))
    table = Table(title=f"{count:,} W1 records of {ref[0].size:,} bytes")
    for col in ("path", "python us/record", "native us/record", "ratio"):
        table.add_column(col, justify="right")
    for name, py, nat in rows:
        table.add_row(name, f"{py:.2f}", f"{nat:.2f}", f"{py / nat:.1f}x")
    Console().print(table)
    print(f"host: {interp_ns():.1f} ns per iteration of bench.peers' reference Python loop")


if __name__ == "__main__":
    main()

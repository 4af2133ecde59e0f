"""Store append/read benchmark: MessageStore vs a plain file with the same fsync policy.

1 KiB messages, single puts and batches of 32, ASYNC_FLUSH and SYNC_FLUSH, 1 / 16 / 128
concurrent writer tasks. For each case the same bytes are also written to a plain file: no fsync
for ASYNC, and for SYNC the same group commit (writers append, one flusher fdatasyncs in a worker
thread for everyone waiting), into a sparse 1 GiB file like a commitlog file.
Printed: messages/s, MB/s and the ratio store/raw. Then reads:
messages/s of `get_message` with 32-message pulls; and the cost of one msync (mmap.flush) vs one
fdatasync after a 1 KiB write through a shared mapping.

Usage: python bench/store_append.py [--quick]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path

import structlog
import trio
from rich.console import Console
from rich.table import Table

from common.message import MessageInner, encode_record
from store import MessageStore, PutMessageStatus, StoreConfig

BODY = b"x" * 1024
TOPIC = "Bench"


def _msg(queue_id: int) -> MessageInner:
    return MessageInner(
        TOPIC,
        BODY,
        queue_id=queue_id,
        properties={"KEYS": "bench", "UNIQ_KEY": "0" * 32},
        born_host=("127.0.0.1", 5555),
        store_host=("127.0.0.1", 10911),
    )


RECORD_SIZE = len(encode_record(_msg(0), 0, 0, 0))


async def bench_store(
    root: Path, flush: str, writers: int, batch: int, seconds: float
) -> tuple[int, float]:
    cfg = StoreConfig(store_path_root_dir=root, flush_disk_type=flush)  # type: ignore[arg-type]
    count = 0
    async with MessageStore(cfg) as store:
        deadline = trio.current_time() + seconds

        async def writer(i: int) -> None:
            nonlocal count
            msgs = [_msg(i % 8) for _ in range(batch)]
            while trio.current_time() < deadline:
                if batch == 1:
                    r = await store.put_message(msgs[0])
                else:
                    r = await store.put_messages(msgs)
                if r.status is not PutMessageStatus.PUT_OK:
                    raise RuntimeError(r)
                count += batch
                await trio.lowlevel.checkpoint()

        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            for i in range(writers):
                n.start_soon(writer, i)
        elapsed = time.perf_counter() - t0
    return count, elapsed


async def bench_raw(
    root: Path, sync: bool, writers: int, batch: int, seconds: float
) -> tuple[int, float]:
    path = root / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    # Same layout as a commitlog file: one big sparse file written at increasing offsets.
    os.ftruncate(fd, 1 << 30)
    payload = b"r" * (RECORD_SIZE * batch)
    written = 0
    flushed = 0
    waiters: deque[tuple[int, trio.Event]] = deque()
    wake = trio.Event()
    count = 0
    deadline = trio.current_time() + seconds

    async def flusher() -> None:
        nonlocal flushed, wake
        while True:
            await wake.wait()
            wake = trio.Event()
            target = written
            await trio.to_thread.run_sync(os.fdatasync, fd)
            flushed = target
            while waiters and waiters[0][0] <= flushed:
                waiters.popleft()[1].set()

    async def writer() -> None:
        nonlocal written, count
        while trio.current_time() < deadline:
            if written + len(payload) > 1 << 30:
                break
            os.pwrite(fd, payload, written)
            written += len(payload)
            if sync:
                ev = trio.Event()
                waiters.append((written, ev))
                wake.set()
                await ev.wait()
            count += batch
            await trio.lowlevel.checkpoint()

    t0 = time.perf_counter()
    async with trio.open_nursery() as outer:
        outer.start_soon(flusher)
        async with trio.open_nursery() as n:
            for _ in range(writers):
                n.start_soon(writer)
        elapsed = time.perf_counter() - t0
        outer.cancel_scope.cancel()
    os.close(fd)
    return count, elapsed


async def bench_read(root: Path, total: int) -> tuple[int, float]:
    cfg = StoreConfig(store_path_root_dir=root)
    async with MessageStore(cfg) as store:
        msgs = [_msg(0) for _ in range(32)]
        for _ in range(total // 32):
            await store.put_messages(msgs)
        got = 0
        t0 = time.perf_counter()
        off = 0
        while True:
            res = await store.get_message("g", TOPIC, 0, off, 32, 1 << 20)
            if not res.message_count:
                break
            got += res.message_count
            off = res.next_begin_offset
        elapsed = time.perf_counter() - t0
    return got, elapsed


def bench_msync_vs_fdatasync(root: Path, rounds: int) -> tuple[float, float]:
    """Mean seconds per msync and per fdatasync after writing 1 KiB through a shared map."""
    size = 64 * 1024 * 1024
    path = root / "map.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
    try:
        pos = 0
        t0 = time.perf_counter()
        for _ in range(rounds):
            mm[pos : pos + 1024] = BODY
            pos += 1024
            mm.flush()
        t_msync = (time.perf_counter() - t0) / rounds
        t0 = time.perf_counter()
        for _ in range(rounds):
            mm[pos : pos + 1024] = BODY
            pos += 1024
            os.fdatasync(fd)
        t_fdatasync = (time.perf_counter() - t0) / rounds
    finally:
        mm.close()
        os.close(fd)
    return t_msync, t_fdatasync


async def main(quick: bool) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    seconds = 0.4 if quick else 3.0
    console = Console()
    base = Path(tempfile.mkdtemp(prefix="trimq-bench-"))
    table = Table(title=f"store append, {len(BODY)} B bodies ({RECORD_SIZE} B records)")
    for col in ("flush", "batch", "writers", "msgs/s", "MB/s", "raw MB/s", "store/raw"):
        table.add_column(col, justify="right")
    try:
        for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            for batch in (1, 32):
                for writers in (1, 16, 128):
                    d = base / f"{flush}-{batch}-{writers}"
                    d.mkdir()
                    n, el = await bench_store(d / "store", flush, writers, batch, seconds)
                    rn, rel = await bench_raw(d, flush == "SYNC_FLUSH", writers, batch, seconds)
                    shutil.rmtree(d)
                    mbs = n * RECORD_SIZE / el / 1e6
                    raw_mbs = rn * RECORD_SIZE / rel / 1e6
                    table.add_row(
                        flush,
                        str(batch),
                        str(writers),
                        f"{n / el:,.0f}",
                        f"{mbs:,.1f}",
                        f"{raw_mbs:,.1f}",
                        f"{mbs / raw_mbs:.2f}",
                    )
        console.print(table)
        d = base / "read"
        d.mkdir()
        total = 20_000 if quick else 200_000
        got, el = await bench_read(d, total)
        console.print(f"get_message, 32-message pulls: {got / el:,.0f} msgs/s ({got} messages)")
        ms, fds = bench_msync_vs_fdatasync(base, 50 if quick else 500)
        console.print(
            f"1 KiB write + msync: {ms * 1e6:,.0f} us; + fdatasync: {fds * 1e6:,.0f} us per call"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (< 20 s)")
    args = parser.parse_args()
    trio.run(main, args.quick)

"""The native fsync worker (`common.speedups.FsyncWorker`) and SYNC_FLUSH group commit on it
(`store._flush._NativeFsyncThread`): the thread that syncs rounds without the GIL."""

from __future__ import annotations

import errno
import mmap
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import store._flush as flush_module
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store.paths import offset_to_file_name
from tests.unit.store.test_sync_flush_group_commit import cfg as flush_cfg
from tests.unit.store.test_sync_flush_group_commit import msg

pytestmark = pytest.mark.skipif(
    flush_module._native is None or not hasattr(flush_module._native, "FsyncWorker"),
    reason="the native accelerators are not built",
)

PAGE = 4096


def cfg(root: Path) -> StoreConfig:
    return flush_cfg(root, "SYNC_FLUSH")


def native_threads() -> int:
    """Threads of this process named trimq-fsync (the native worker names its thread)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                count += fh.read().strip() == "trimq-fsync"
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            pass
    return count


def wait_threads(expected: int) -> int:
    deadline = time.monotonic() + 5
    while native_threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return native_threads()


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(address, fd) of a dirty 64 KiB shared mapping of a file."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 64 * 1024)
    mm = mmap.mmap(fd, 64 * 1024)
    mm[:100] = b"y" * 100
    import ctypes

    address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    yield address, fd
    mm.close()
    os.close(fd)


def collect(worker: Any, count: int) -> list[tuple[int, int]]:
    """Results until `count` rounds are reported (at most 5 s), waiting on the eventfd."""
    done: list[tuple[int, int]] = []
    deadline = time.monotonic() + 5
    while len(done) < count and time.monotonic() < deadline:
        select.select([worker.fileno()], [], [], 0.1)
        done += worker.collect()
    return done


def test_rounds_are_synced_in_submission_order_each_with_its_errno(
    mapped: tuple[int, int],
) -> None:
    address, fd = mapped
    worker = flush_module._native.FsyncWorker()
    worker.submit(1, [(address, 2 * PAGE, fd)])
    worker.submit(2, [(0, 0, fd)])  # address 0: fdatasync
    worker.submit(3, [(address + 1, PAGE, fd)])  # msync refuses an unaligned address
    worker.submit(4, [(address, PAGE, fd), (address + PAGE, PAGE, fd)])
    worker.submit(5, [])
    worker.start()
    try:
        assert collect(worker, 5) == [(1, 0), (2, 0), (3, errno.EINVAL), (4, 0), (5, 0)]
        # The last round's eventfd write may land after the collect that took its result:
        # one more collect (nothing left) resets it, and then nothing more comes.
        assert worker.collect() == []
        assert select.select([worker.fileno()], [], [], 0)[0] == []
        assert worker.collect() == []
    finally:
        worker.stop()


def test_a_round_is_extended_only_until_the_thread_takes_it(mapped: tuple[int, int]) -> None:
    address, fd = mapped
    worker = flush_module._native.FsyncWorker()
    worker.submit(1, [(address, PAGE, fd)])
    # Not started: nothing is taken yet. The new ranges replace the old (the unaligned one
    # makes the round fail, which shows which ranges ran).
    assert worker.extend(1, [(address + 1, PAGE, fd)]) is True
    assert worker.extend(2, [(address, PAGE, fd)]) is False  # no such round
    worker.start()
    try:
        assert collect(worker, 1) == [(1, errno.EINVAL)]
        assert worker.extend(1, [(address, PAGE, fd)]) is False  # done: taken long ago
    finally:
        worker.stop()


def test_stop_lets_the_queued_rounds_finish_then_the_thread_ends(
    mapped: tuple[int, int],
) -> None:
    address, fd = mapped
    before = native_threads()
    worker = flush_module._native.FsyncWorker()
    for rid in range(1, 4):
        worker.submit(rid, [(address, PAGE, fd)])
    worker.start()
    assert native_threads() == before + 1
    with pytest.raises(RuntimeError, match="started already"):
        worker.start()
    worker.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        worker.submit(4, [(address, PAGE, fd)])
    assert collect(worker, 3) == [(1, 0), (2, 0), (3, 0)]
    assert wait_threads(before) == before
    # Dropped while its thread may still run: the thread keeps what it uses alive.
    worker = flush_module._native.FsyncWorker()
    worker.submit(1, [(address, PAGE, fd)])
    worker.start()
    del worker
    assert wait_threads(before) == before


def test_ranges_must_be_address_length_fd_tuples() -> None:
    worker = flush_module._native.FsyncWorker()
    with pytest.raises(TypeError):
        worker.submit(1, [(1, 2)])
    with pytest.raises(TypeError):
        worker.submit(1, [[0, 0, 1]])
    with pytest.raises(TypeError):
        worker.submit(1, 5)
    with pytest.raises(TypeError):
        worker.extend(1, [("a", 0, 1)])
    assert worker.collect() == []


def test_sync_plan_is_the_page_aligned_range_within_the_file(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / offset_to_file_name(0), 4 * PAGE)
    try:
        plan = mf.sync_plan(PAGE + 10, 3 * PAGE)
        assert plan is not None
        address, length, fd = plan
        base = mf.sync_plan(0, 1)
        assert base is not None
        assert address == base[0] + PAGE
        assert length == 2 * PAGE
        assert fd == base[2]
        assert mf.sync_plan(PAGE, PAGE) is None
        assert mf.sync_plan(10, 10) == (base[0], 10, fd)  # the start goes down to its page
        assert mf.sync_plan(5 * PAGE, 6 * PAGE) is None  # past the end of the file
        assert mf.sync_plan(3 * PAGE, 9 * PAGE) == (base[0] + 3 * PAGE, PAGE, fd)
    finally:
        mf.close()


async def test_the_store_runs_its_sync_flush_rounds_on_the_native_thread(
    tmp_path: Path,
) -> None:
    before = native_threads()
    async with MessageStore(cfg(tmp_path)) as store:
        assert isinstance(store.flush_service._fsync_thread, flush_module._NativeFsyncThread)
        assert native_threads() == before + 1
        rounds = store.flush_service.flush_rounds
        for _ in range(5):
            assert (await store.put_message(msg())).status is PutMessageStatus.PUT_OK
        assert store.commitlog.mfq.flushed_where == store.max_phy_offset
        assert store.flush_service.flush_rounds > rounds
    with trio.fail_after(5):
        while native_threads() > before:
            await trio.sleep(0.01)


async def test_an_msync_error_reaches_the_flusher_and_later_rounds_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = MappedFile.sync_plan
    calls = [0]

    def unaligned_once(self: MappedFile, start: int, end: int) -> tuple[int, int, int] | None:
        plan = real(self, start, end)
        calls[0] += 1
        if calls[0] == 1 and plan is not None:
            return plan[0] + 1, plan[1], plan[2]  # msync fails: EINVAL
        return plan

    async with MessageStore(cfg(tmp_path)) as store:
        result, flush_end = store.put_messages_nowait([msg()])
        assert flush_end >= 0
        monkeypatch.setattr(MappedFile, "sync_plan", unaligned_once)
        with pytest.raises(OSError, match="msync failed") as caught:
            await store.flush_service.flush_commitlog()
        assert caught.value.errno == errno.EINVAL
        assert not store.flush_service.is_flushed(flush_end)
        final = await store.wait_put_durable(result, flush_end)
        assert final.status is PutMessageStatus.PUT_OK
        assert store.flush_service.is_flushed(flush_end)


async def test_two_tasks_may_wait_for_rounds_at_once(tmp_path: Path) -> None:
    # Rounds are waited for one at a time in the store (under the commitlog lock); two
    # waiters must still not wait on the eventfd together (trio refuses that).
    mf = MappedFile(tmp_path / offset_to_file_name(0), 4 * PAGE)
    mf.append(b"z" * 100)
    thread = flush_module._NativeFsyncThread(flush_module._native)
    thread.start()
    try:
        rounds = [thread.submit([(mf, 0, PAGE)]) for _ in range(4)]
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for rnd in rounds:
                    nursery.start_soon(rnd.wait)
        assert all(rnd.done.is_set() and rnd.box == [None] for rnd in rounds)
    finally:
        thread.stop()
        mf.close()

"""SYNC_FLUSH group commit on the dedicated fsync thread (`store._flush._FsyncThread`)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

import store._flush as flush_module
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store.message import MessageInner


def cfg(root: Path, flush: str) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 64 * 1024,
            "mapped_file_size_consume_queue": 100 * 20,
            "flush_disk_type": flush,
        }
    )


def msg() -> MessageInner:
    return MessageInner(
        "T",
        b"x" * 100,
        queue_id=0,
        born_timestamp=1,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )


def fsync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trimq-fsync"]


async def test_sync_flush_rounds_run_on_one_thread_that_stops_with_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[str] = set()
    real = flush_module._sync_ranges

    def spy(ranges: list[tuple[MappedFile, int, int]]) -> None:
        threads.add(threading.current_thread().name)
        real(ranges)

    monkeypatch.setattr(flush_module, "_sync_ranges", spy)
    before = len(fsync_threads())
    async with MessageStore(cfg(tmp_path, "SYNC_FLUSH")) as store:
        assert len(fsync_threads()) == before + 1
        for _ in range(5):
            assert (await store.put_message(msg())).status is PutMessageStatus.PUT_OK
        assert store.commitlog.mfq.flushed_where == store.max_phy_offset
    # Group commit rounds ran on the dedicated thread (the close-time flush may not).
    assert "trimq-fsync" in threads
    with trio.fail_after(5):
        while len(fsync_threads()) > before:
            await trio.sleep(0.01)


async def test_async_flush_starts_no_fsync_thread(tmp_path: Path) -> None:
    before = len(fsync_threads())
    async with MessageStore(cfg(tmp_path, "ASYNC_FLUSH")) as store:
        await store.put_message(msg())
        assert len(fsync_threads()) == before


async def test_fsync_error_reaches_the_flusher_and_the_thread_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = flush_module._sync_ranges
    calls = [0]

    def failing_once(ranges: list[tuple[MappedFile, int, int]]) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise OSError(5, "simulated EIO")
        real(ranges)

    async with MessageStore(cfg(tmp_path, "SYNC_FLUSH")) as store:
        result, flush_end = store.put_messages_nowait([msg()])
        assert flush_end >= 0
        monkeypatch.setattr(flush_module, "_sync_ranges", failing_once)
        with pytest.raises(OSError, match="simulated EIO"):
            await store.flush_service.flush_commitlog()
        assert not store.flush_service.is_flushed(flush_end)
        final = await store.wait_put_durable(result, flush_end)
        assert final.status is PutMessageStatus.PUT_OK
        assert store.flush_service.is_flushed(flush_end)


async def test_one_timer_expires_every_waiter_and_rearms(tmp_path: Path) -> None:
    config = StoreConfig.model_validate(
        {
            "store_path_root_dir": tmp_path,
            "mapped_file_size_commitlog": 64 * 1024,
            "mapped_file_size_consume_queue": 100 * 20,
            "flush_disk_type": "SYNC_FLUSH",
            "sync_flush_timeout_ms": 50,
        }
    )
    async with MessageStore(config) as store:
        statuses: list[PutMessageStatus] = []

        async def put() -> None:
            statuses.append((await store.put_message(msg())).status)

        for _ in range(2):
            # The flusher cannot run while the lock is held: every waiter times out.
            async with store.flush_service.commitlog_lock, trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(put)
            assert statuses == [PutMessageStatus.FLUSH_DISK_TIMEOUT] * 3
            statuses.clear()
            # And once it can, puts are durable again.
            await put()
            assert statuses == [PutMessageStatus.PUT_OK]
            statuses.clear()


async def test_the_next_round_starts_before_the_last_rounds_waiters_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Round 1 (put A) is held in the thread until put B has appended and waits too. When A's
    # waiter is answered, B's round must already be with the thread: the disk works while the
    # loop answers.
    real = flush_module._sync_ranges
    gate = threading.Event()
    held = [False]

    def hold_first(ranges: list[tuple[MappedFile, int, int]]) -> None:
        if not held[0]:
            held[0] = True
            gate.wait(10)
        real(ranges)

    real_submit = flush_module._FsyncThread.submit
    submitted: list[int] = []

    def spy_submit(
        self: flush_module._FsyncThread, ranges: list[tuple[MappedFile, int, int]]
    ) -> flush_module._Round:
        submitted.append(sum(end - start for _, start, end in ranges))
        return real_submit(self, ranges)

    monkeypatch.setattr(flush_module, "_sync_ranges", hold_first)
    monkeypatch.setattr(flush_module._FsyncThread, "submit", spy_submit)
    answered_a: list[tuple[PutMessageStatus, int]] = []
    b_durable = trio.Event()
    async with MessageStore(cfg(tmp_path, "SYNC_FLUSH")) as store:
        result_a, end_a = store.put_messages_nowait([msg()])
        assert end_a >= 0
        store.when_put_durable(
            result_a, end_a, lambda final: answered_a.append((final.status, len(submitted)))
        )
        with trio.fail_after(5):
            while not held[0]:  # round 1 is in the thread
                await trio.sleep(0.001)
        result_b, end_b = store.put_messages_nowait([msg()])
        store.when_put_durable(result_b, end_b, lambda final: b_durable.set())
        gate.set()
        with trio.fail_after(5):
            await b_durable.wait()
        assert store.flush_service.is_flushed(end_b)
        rounds = len(submitted)
    assert answered_a == [(PutMessageStatus.PUT_OK, 2)]
    assert rounds == 2
    assert submitted == [end_a, end_b - end_a]

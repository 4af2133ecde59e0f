"""SYNC_FLUSH group commit on the dedicated fsync thread.

The tests that hold or fail a round from inside the thread (by patching `_sync_ranges`) run
the Python thread (`store._flush._FsyncThread`, used when the native accelerators are not);
the group commit logic around it is the same for the native one, which
`test_native_fsync_thread.py` covers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

import store._flush as flush_module
from common.message import MessageInner
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile


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


@pytest.fixture
def python_fsync_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's SYNC_FLUSH rounds go to the Python fsync thread."""
    monkeypatch.setattr(flush_module, "_native", None)


def fsync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trimq-fsync"]


async def test_sync_flush_rounds_run_on_one_thread_that_stops_with_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_fsync_thread: None
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_fsync_thread: None
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_fsync_thread: None
) -> None:
    # Round 1 (put A) is held in the thread until put B has appended and waits too. When A's
    # waiter is answered, B's round must already be with the thread: the disk works while the
    # loop answers.
    gate = threading.Event()
    synced, _ = _ranges_synced(monkeypatch, gate)
    real_submit = flush_module._FsyncThread.submit
    submitted: list[int] = []

    def spy_submit(
        self: flush_module._FsyncThread, ranges: list[tuple[MappedFile, int, int]], *args: int
    ) -> flush_module._Round:
        submitted.append(sum(end - start for _, start, end in ranges))
        return real_submit(self, ranges, *args)

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
            while not synced:  # round 1 is in the thread
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


def _ranges_synced(
    monkeypatch: pytest.MonkeyPatch, hold: threading.Event, fail_first: bool = False
) -> tuple[list[tuple[int, int]], threading.Event]:
    """Record each synced range as global (start, end); the first round waits for `hold` (and
    fails with EIO if `fail_first`); the returned event is set when a second round starts."""
    real = flush_module._sync_ranges
    synced: list[tuple[int, int]] = []
    second = threading.Event()

    def spy(ranges: list[tuple[MappedFile, int, int]]) -> None:
        first = not synced
        synced.append(
            (
                ranges[0][0].file_from_offset + ranges[0][1],
                ranges[-1][0].file_from_offset + ranges[-1][2],
            )
        )
        if first:
            hold.wait(10)
            if fail_first:
                raise OSError(5, "simulated EIO")
        else:
            second.set()
        real(ranges)

    monkeypatch.setattr(flush_module, "_sync_ranges", spy)
    return synced, second


async def test_puts_waiting_during_a_round_share_the_next_which_the_thread_starts_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_fsync_thread: None
) -> None:
    # Round 1 (put A) is held in the thread. B and C then wait: B queues round 2, C extends
    # it (the thread has not taken it). Once round 1 ends, the thread starts round 2 without
    # the event loop, which is blocked meanwhile (with the loop starting each round, round 2
    # would never start while it is).
    hold = threading.Event()
    synced, second = _ranges_synced(monkeypatch, hold)
    done: list[str] = []
    async with MessageStore(cfg(tmp_path, "SYNC_FLUSH")) as store:
        start = store.max_phy_offset
        result_a, end_a = store.put_messages_nowait([msg()])
        store.when_put_durable(result_a, end_a, lambda final: done.append("a"))
        with trio.fail_after(5):
            while not synced:  # round 1 is in the thread
                await trio.sleep(0.001)
        result_b, end_b = store.put_messages_nowait([msg()])
        store.when_put_durable(result_b, end_b, lambda final: done.append("b"))
        result_c, end_c = store.put_messages_nowait([msg()])
        store.when_put_durable(result_c, end_c, lambda final: done.append("c"))
        hold.set()
        assert second.wait(5), "the thread did not start round 2 while the loop was busy"
        with trio.fail_after(5):
            while len(done) < 3:
                await trio.sleep(0.001)
        assert store.flush_service.is_flushed(end_c)
    assert done == ["a", "b", "c"]
    assert synced[:2] == [(start, end_a), (end_a, end_c)]


async def test_a_failed_round_leaves_the_rounds_after_it_not_durable_until_synced_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_fsync_thread: None
) -> None:
    hold = threading.Event()
    synced, second = _ranges_synced(monkeypatch, hold, fail_first=True)
    durable_when_answered: list[bool] = []
    async with MessageStore(cfg(tmp_path, "SYNC_FLUSH")) as store:
        flush = store.flush_service
        start = store.max_phy_offset
        result_a, end_a = store.put_messages_nowait([msg()])
        store.when_put_durable(result_a, end_a, lambda final: None)
        with trio.fail_after(5):
            while not synced:
                await trio.sleep(0.001)
        result_b, end_b = store.put_messages_nowait([msg()])
        answered = trio.Event()

        def on_b(final: object) -> None:
            durable_when_answered.append(flush.is_flushed(end_b))
            answered.set()

        store.when_put_durable(result_b, end_b, on_b)
        hold.set()
        assert second.wait(5)
        # Round 2 ([end_a, end_b)) succeeded, round 1 failed: nothing below end_b is durable.
        await trio.sleep(0.05)
        assert not flush.is_flushed(end_a)
        with trio.fail_after(5):
            await answered.wait()
        assert flush.is_flushed(end_b)
    assert durable_when_answered == [True]
    # The retry synced again from the first byte that was not durable.
    assert synced[:3] == [(start, end_a), (end_a, end_b), (start, end_b)]

"""Staged appends (ASYNC_FLUSH): the sends between `begin_staging` and `end_staging` are written
with one pwrite per file, leave the same files as sends written one by one, are readable before
the write, and a write that fails refuses every later append instead of acknowledging it."""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path
from typing import Literal

import pytest
import trio

from common.message import MessageInner, decode_record
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store.commitlog import RESERVE_AHEAD
from store.consume_queue import CQ_UNIT_SIZE
from store.paths import offset_to_file_name
from store.results import AppendMessageResult
from tests.unit.store.test_batch_append import COMMITLOG_FILE, NOW, _tree

pytestmark = pytest.mark.unit


def _msg(i: int, queue_id: int = 0) -> MessageInner:
    return MessageInner(
        "T",
        bytes([i % 251]) * (60 + (i * 37) % 300),
        queue_id=queue_id,
        properties={"UNIQ_KEY": f"7F0000011F9018B4AAC2{i:012X}", "KEYS": f"k{i}"},
        born_timestamp=1_000 + i,
        born_host=("192.0.2.5", 40000 + i),
        store_host=("192.0.2.9", 10911),
    )


def _cfg(root: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"] = "ASYNC_FLUSH") -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commitlog=COMMITLOG_FILE,
        mapped_file_size_consume_queue=10 * CQ_UNIT_SIZE,
        max_hash_slot_num=16,
        max_index_num=64,
        flush_disk_type=flush,
    )


def record_pwrites(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the pwrites of mapped files (`MappedFile._pwrite_all`), in order."""
    sizes: list[int] = []
    real = MappedFile._pwrite_all

    def recording(self: MappedFile, data: bytes | bytearray | memoryview, pos: int) -> None:
        sizes.append(len(data))
        real(self, data, pos)

    monkeypatch.setattr(MappedFile, "_pwrite_all", recording)
    return sizes


def _staged(mf: MappedFile) -> bool:
    return mf.staged


def _put(store: MessageStore, m: MessageInner) -> AppendMessageResult:
    result, flush_end = store.put_messages_nowait([m])
    assert result.status is PutMessageStatus.PUT_OK, result.remark
    assert flush_end < 0
    assert result.append is not None
    return result.append


RUNS = [(0, 7, 0), (7, 1, 1), (8, 9, 2), (17, 9, 0)]  # (first message, count, queue id)


async def test_a_run_is_one_pwrite_and_the_files_match_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of sends, one crossing a commitlog file end (padded, then the next file): each run
    writes its records in the reserved file with one pwrite at `end_staging`; the records in
    the new file, not reserved yet, are written one by one at once. Commitlog and consume
    queues equal those of the same sends put one by one."""
    pwrites = record_pwrites(monkeypatch)
    crossed = False
    async with MessageStore(_cfg(tmp_path / "staged"), clock=lambda: NOW / 1000) as store:
        assert store.commitlog.stages_appends
        _put(store, _msg(99))  # the first file exists: it can be reserved
        for first, count, queue_id in RUNS:
            assert await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
            reserved = store.commitlog.mfq.files[-1].file_from_offset // COMMITLOG_FILE
            before = len(pwrites)
            store.begin_staging()
            appends = [_put(store, _msg(i, queue_id)) for i in range(first, first + count)]
            files = [a.wrote_offset // COMMITLOG_FILE for a in appends]
            in_new_file = sum(f != reserved for f in files)
            staged = len(files) > in_new_file
            # Inside the run only the file end (the pad drains the full file) and the records
            # of the unreserved new file were written.
            assert len(pwrites) - before == int(staged and in_new_file > 0) + in_new_file
            store.end_staging()
            written = pwrites[before:]
            assert len(written) == int(staged) + in_new_file
            assert sum(written) == sum(a.wrote_bytes for a in appends)
            crossed |= staged and in_new_file > 0
    assert crossed, "no run crossed a commitlog file end: make the runs longer"
    monkeypatch.undo()
    async with MessageStore(_cfg(tmp_path / "plain"), clock=lambda: NOW / 1000) as store:
        assert (await store.put_messages([_msg(99)])).status is PutMessageStatus.PUT_OK
        for first, count, queue_id in RUNS:
            for i in range(first, first + count):
                assert (await store.put_messages([_msg(i, queue_id)])).status.name == "PUT_OK"
    for sub in ("commitlog", "consumequeue"):
        assert _tree(tmp_path / "staged", sub) == _tree(tmp_path / "plain", sub)


async def test_staged_records_are_readable_before_the_run_ends(tmp_path: Path) -> None:
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        _put(store, _msg(99))
        await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
        store.begin_staging()
        appends = [_put(store, _msg(i)) for i in range(3)]
        assert store.commitlog.mfq.files[-1].staged
        raw = store.commitlog.read_record(appends[1].wrote_offset)
        assert raw is not None
        assert decode_record(raw, check_crc=True).body == _msg(1).body
        # The read wrote what was staged: the file holds all three records already.
        path = tmp_path / "commitlog" / offset_to_file_name(0)
        data = path.read_bytes()
        end = appends[2].wrote_offset + appends[2].wrote_bytes
        assert data[appends[2].wrote_offset : end] == store.commitlog.read(
            appends[2].wrote_offset, appends[2].wrote_bytes
        )
        assert data[end : end + 8] == bytes(8)
        store.end_staging()


async def test_a_read_of_staged_records_only_leaves_them_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that falls wholly within the staged bytes (a pull woken by a send of the run:
    its queue unit gives offset and size) copies them from the buffer, without the run's
    pwrite; one reaching into what was written before the run writes them first."""
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        before = _put(store, _msg(99))
        await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
        pwrites = record_pwrites(monkeypatch)
        store.begin_staging()
        appends = [_put(store, _msg(i)) for i in range(3)]
        mf = store.commitlog.mfq.files[-1]

        def staged() -> bool:  # a call, so that mypy does not narrow it between the asserts
            return mf.staged

        for i, a in enumerate(appends):
            raw = store.commitlog.read(a.wrote_offset, a.wrote_bytes)
            assert raw is not None
            assert decode_record(raw, check_crc=True).body == _msg(i).body
        both = store.commitlog.read(appends[0].wrote_offset, 2 * 1024)  # past the staged end
        assert pwrites == []
        assert staged()
        assert both is None  # beyond what is written, as without staging
        end = appends[0].wrote_offset + appends[0].wrote_bytes
        span = store.commitlog.read(before.wrote_offset, end - before.wrote_offset)
        assert span is not None
        assert pwrites == [sum(a.wrote_bytes for a in appends)]  # the run, written first
        assert not staged()
        assert decode_record(span[before.wrote_bytes :], check_crc=True).body == _msg(0).body
        store.end_staging()
        assert len(pwrites) == 1


async def test_sync_flush_stages_within_the_zeroed_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SYNC_FLUSH stages too, within the blocks zeroed ahead (`CommitLog.zero_ahead`), never
    the fallocate reservation; the run is one pwrite, and the put still waits for the group
    commit."""
    async with MessageStore(_cfg(tmp_path, "SYNC_FLUSH"), clock=lambda: NOW / 1000) as store:
        cl = store.commitlog
        assert cl.stages_appends
        _put_sync = store.put_messages_nowait
        first, end = _put_sync([_msg(0)])  # outside a run, nothing zeroed: written at once
        assert first.status is PutMessageStatus.PUT_OK
        assert end > 0
        mf = cl.mfq.files[-1]
        assert await trio.to_thread.run_sync(cl.reserve_ahead)
        assert mf.reserved_to == 0  # no fallocate under SYNC_FLUSH
        assert cl.zeros_due(4096)
        assert cl.zero_ahead(4096, 1024) is mf
        assert mf.reserved_to == mf.wrote_position + 1024
        pwrites = record_pwrites(monkeypatch)
        store.begin_staging()
        result, end = _put_sync([_msg(1)])
        assert result.status is PutMessageStatus.PUT_OK
        assert end > 0
        assert mf.staged
        assert pwrites == []
        store.end_staging()
        assert pwrites == [result.append.wrote_bytes if result.append else -1]
        assert await store.wait_put_durable(result, end) is result
        assert store.flush_service.is_flushed(end)


async def test_a_failed_staged_write_refuses_every_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        _put(store, _msg(0))  # outside a run: written at once
        await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
        store.begin_staging()
        _put(store, _msg(1))
        assert store.commitlog.mfq.files[-1].staged

        def broken(self: MappedFile, data: object, pos: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(MappedFile, "_pwrite_all", broken)
        with pytest.raises(OSError, match="Input/output"):
            store.end_staging()
        monkeypatch.undo()
        refused, _ = store.put_messages_nowait([_msg(2)])
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "commitlog write failed" in refused.remark
        assert (await store.put_messages([_msg(3)])).status is (
            PutMessageStatus.SERVICE_NOT_AVAILABLE
        )


async def test_unreserved_appends_are_written_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records past the reserved blocks are written at once, also inside a run (a staged
    write could otherwise fail after the send was answered): before the flush service
    reserved, on a filesystem that cannot (EOPNOTSUPP), and after a failed reservation."""
    pwrites = record_pwrites(monkeypatch)
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        store.begin_staging()
        appends = [_put(store, _msg(i)) for i in range(2)]  # nothing reserved yet
        assert pwrites == [a.wrote_bytes for a in appends]
        store.end_staging()
        mf = store.commitlog.mfq.files[-1]

        def fallocate_failing(err: int) -> object:
            def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
                ctypes.set_errno(err)
                return -1

            return fallocate

        monkeypatch.setattr("store._mapped_file._fallocate", fallocate_failing(errno.ENOSPC))
        with pytest.raises(OSError, match="No space left"):
            store.commitlog.reserve_ahead()
        monkeypatch.setattr("store._mapped_file._fallocate", fallocate_failing(errno.EOPNOTSUPP))
        assert not store.commitlog.reserve_ahead()
        assert not store.commitlog.reserve_ahead()  # and from then on
        pwrites.clear()
        store.begin_staging()
        appends = [_put(store, _msg(i)) for i in range(2, 4)]
        assert pwrites == [a.wrote_bytes for a in appends]
        assert not mf.staged
        store.end_staging()


def test_reserve_clips_to_the_file_and_zero_from_gives_it_back(tmp_path: Path) -> None:
    """`reserve` allocates up to its end (clipped to the file); only reserved bytes are staged;
    cutting the file back (`zero_from`, recovery) gives the reservation back with the blocks."""
    size = 64 * 1024
    mf = MappedFile(tmp_path / offset_to_file_name(0), size)
    try:
        assert mf.reserve(100)
        mf.stage(b"x" * 100)
        assert _staged(mf)
        mf.stage(b"y" * 10)  # past the reservation: drained, then written at once
        assert not _staged(mf)
        assert mf.reserve(10 * size)
        assert mf._reserved == size
        mf.stage(b"z" * 10)
        assert _staged(mf)
        assert mf.read(0, 3) == b"xxx"  # the read drained
        assert mf.read(110, 10) == b"z" * 10
        mf.zero_from(50)
        assert mf._reserved == 50
        assert mf.read(40, 20) == b"x" * 10 + bytes(10)
        mf.stage(b"w" * 10)  # not reserved again yet
        assert not _staged(mf)
        assert mf.read(50, 10) == b"w" * 10
    finally:
        mf.close()


async def test_the_flush_service_reserves_ahead(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path).model_copy(
        update={"mapped_file_size_commitlog": 64 << 20, "flush_interval_commitlog_ms": 20}
    )
    async with MessageStore(cfg, clock=lambda: NOW / 1000) as store:
        _put(store, _msg(0))
        mf = store.commitlog.mfq.files[-1]
        with trio.fail_after(10):
            while mf._reserved < mf.wrote_position + RESERVE_AHEAD:
                await trio.sleep(0.01)

"""Zeroing ahead (SYNC_FLUSH): the commitlog blocks past the write position are written with
zeros and synced before appends reach them (`MappedFile.zero_ahead`, `CommitLog.zero_ahead`,
the flush service's zero loop). Zeros never land on an appended byte, and a store whose last
file was zeroed ahead recovers exactly what was appended."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio

from store import MessageStore, PutMessageStatus
from store._mapped_file import MappedFile
from store.commitlog import CommitLog
from store.paths import offset_to_file_name
from tests.unit.store.test_batch_append import COMMITLOG_FILE, NOW
from tests.unit.store.test_staged_appends import _cfg, _msg, _staged

pytestmark = pytest.mark.unit


def _file(tmp_path: Path, size: int = 16384) -> MappedFile:
    return MappedFile(tmp_path / offset_to_file_name(0), size)


def test_zeros_start_past_every_appended_byte(tmp_path: Path) -> None:
    mf = _file(tmp_path)
    try:
        data = bytes(range(256)) * 12  # 3,072 bytes, no run of zeros to hide a bug
        mf.pwrite_append(data)
        assert mf.zero_ahead(8192, 1024) == 1024
        assert mf.reserved_to == 3072 + 1024
        assert mf.read(0, 3072) == data
        # Appended past the zeroed blocks (written at once): the next zeros start after it.
        more = b"\xab" * 2000
        assert mf.stage(more) == 3072
        assert not _staged(mf)  # 3,072 + 2,000 > 4,096: not within the zeroed blocks
        assert mf.zero_ahead(8192, 1024) == 1024
        assert mf.reserved_to == 5072 + 1024
        assert mf.read(0, 5072) == data + more
        # Within the zeroed blocks: staged, and zeros never written over the buffer.
        assert mf.stage(b"\xcd" * 100) == 5072
        assert _staged(mf)
        mf.drain()
        assert mf.read(5072, 100) == b"\xcd" * 100
        assert mf.read(5172, 6096 - 5172) == bytes(6096 - 5172)
    finally:
        mf.close()


def test_zeros_stop_at_the_end_asked_for_and_at_the_file_end(tmp_path: Path) -> None:
    mf = _file(tmp_path, 4096)
    try:
        assert mf.zero_ahead(1000, 4096) == 1000
        assert mf.zero_ahead(1000, 4096) == 0
        assert mf.zero_ahead(1 << 20, 1 << 20) == 4096 - 1000
        assert mf.reserved_to == 4096
        assert mf.zero_ahead(1 << 20, 1 << 20) == 0
    finally:
        mf.close()


def test_no_zeros_where_reserving_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import store._mapped_file as mod

    mf = _file(tmp_path)
    try:

        def unsupported(fd: int, mode: int, offset: int, length: int) -> int:
            import ctypes

            ctypes.set_errno(errno.EOPNOTSUPP)
            return -1

        monkeypatch.setattr(mod, "_fallocate", unsupported)
        assert not mf.reserve(4096)
        assert mf.reserved_to == -1
        assert mf.zero_ahead(4096, 1024) == 0
    finally:
        mf.close()


def test_commitlog_zeros_only_when_asked_and_refills_below_half(tmp_path: Path) -> None:
    plain = CommitLog(tmp_path / "plain", COMMITLOG_FILE, pwrite_appends=True)
    msgs = [_msg(0)]
    plain.append(msgs, plain.encode(msgs), NOW)
    assert not plain.zeros_due(4096)
    assert plain.zero_ahead(4096, 1024) is None
    assert plain.mfq.files[-1].reserved_to == 0

    cl = CommitLog(tmp_path / "zeroed", COMMITLOG_FILE, pwrite_appends=True, zero_blocks=True)
    assert not cl.zeros_due(4096)  # no file yet
    cl.append(msgs, cl.encode(msgs), NOW)
    mf = cl.mfq.files[-1]
    pos = mf.wrote_position
    assert cl.zeros_due(4096)
    while cl.zero_ahead(4096, 1024) is not None:
        pass
    assert mf.reserved_to == pos + 4096
    assert not cl.zeros_due(4096)
    # Appends eat into the zeroed blocks; more zeros once less than half is left.
    while mf.reserved_to - mf.wrote_position >= 2048:
        more = [_msg(mf.wrote_position)]
        cl.append(more, cl.encode(more), NOW)
    assert cl.zeros_due(4096)


async def test_the_flush_service_zeroes_ahead_and_recovery_keeps_every_record(
    tmp_path: Path,
) -> None:
    """Under SYNC_FLUSH the zero loop zeroes the last file's blocks (here the whole small file)
    and a new file's after the roll; reopening finds exactly the appended records."""
    cfg = _cfg(tmp_path, "SYNC_FLUSH")
    offsets: list[int] = []
    async with MessageStore(cfg, clock=lambda: NOW / 1000) as store:
        cl = store.commitlog
        for i in range(3):
            result = await store.put_messages([_msg(i)])
            assert result.status is PutMessageStatus.PUT_OK
            assert result.append is not None
            offsets.append(result.append.wrote_offset)
        first = cl.mfq.files[-1]
        with trio.fail_after(10):
            while first.reserved_to < COMMITLOG_FILE:
                await trio.sleep(0.01)
        # Fill the first file, roll to the second: it is zeroed in turn.
        i = 3
        while len(cl.mfq.files) < 2:
            result = await store.put_messages([_msg(i)])
            assert result.status is PutMessageStatus.PUT_OK
            assert result.append is not None
            offsets.append(result.append.wrote_offset)
            i += 1
        second = cl.mfq.files[-1]
        with trio.fail_after(10):
            while second.reserved_to < COMMITLOG_FILE:
                await trio.sleep(0.01)
        end = cl.max_offset
    async with MessageStore(cfg, clock=lambda: NOW / 1000) as store:
        assert store.commitlog.max_offset == end
        for n, offset in enumerate(offsets):
            got = store.commitlog.read_record(offset)
            assert got is not None, n
        cq = store.dispatcher.find_cq("T", 0)
        assert cq is not None
        assert cq.max_offset_in_queue == len(offsets)


async def test_a_failed_zero_write_is_logged_and_appends_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def full(self: MappedFile, end: int, piece: int) -> int:
        calls.append(end)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(MappedFile, "zero_ahead", full)
    async with MessageStore(_cfg(tmp_path, "SYNC_FLUSH"), clock=lambda: NOW / 1000) as store:
        first = await store.put_messages([_msg(0)])
        assert first.status is PutMessageStatus.PUT_OK
        with trio.fail_after(10):
            while not calls:
                await trio.sleep(0.01)
        again = await store.put_messages([_msg(1)])
        assert again.status is PutMessageStatus.PUT_OK

"""Pre-faulting the commitlog pages ahead of the write position (`MappedFile.prefault`,
`MappedFileQueue.prefault_ahead`, the flush service's prefault loop when
`warm_mapped_file_enable` is set; off by default)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

import store._flush as flush_module
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.message import MessageInner
from store.paths import offset_to_file_name

SIZE = 64 * 1024


def mapped(tmp_path: Path) -> MappedFile:
    return MappedFile(tmp_path / offset_to_file_name(0), SIZE)


def allocated(mf: MappedFile) -> int:
    """Bytes of disk blocks the file holds once written back."""
    mf.fsync()
    return os.stat(mf.path).st_blocks * 512


def test_prefault_allocates_the_pages_ahead_without_changing_any_byte(tmp_path: Path) -> None:
    mf = mapped(tmp_path)
    mf.append(b"a" * 100)
    assert allocated(mf) <= 8192
    if not mf.prefault(mf.wrote_position, mf.wrote_position + 32 * 1024):
        pytest.skip("kernel without MADV_POPULATE_WRITE")
    # The pages were faulted in for writing (dirty), so write-back allocated their blocks.
    assert allocated(mf) >= 32 * 1024
    assert mf.wrote_position == 100
    assert mf.read(0, SIZE) == b"a" * 100 + bytes(SIZE - 100)
    mf.close()
    assert (tmp_path / offset_to_file_name(0)).read_bytes() == b"a" * 100 + bytes(SIZE - 100)


def test_prefault_clips_to_the_file_and_ignores_a_closed_one(tmp_path: Path) -> None:
    mf = mapped(tmp_path)
    assert mf.prefault(SIZE - 10, SIZE + 10 * 4096)  # past the end: clipped
    assert mf.prefault(SIZE, SIZE + 4096)  # nothing left
    mf.close()
    assert mf.prefault(0, 4096)  # closed meanwhile: nothing to do, not "unsupported"


def test_prefault_ahead_covers_the_last_files_write_position(tmp_path: Path) -> None:
    mfq = MappedFileQueue(tmp_path, SIZE)
    assert mfq.prefault_ahead(8192)  # no file yet
    mf = mfq.file_for_append()
    mf.append(b"b" * 5000)
    if not mfq.prefault_ahead(16 * 1024):
        pytest.skip("kernel without MADV_POPULATE_WRITE")
    # The page holding the write position and the 16 KiB after it.
    assert allocated(mf) >= 16 * 1024
    assert mf.read(0, 5001) == b"b" * 5000 + b"\0"
    mfq.close_all()


async def test_the_flush_service_prefaults_the_commitlog_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = MappedFileQueue.prefault_ahead

    def spy(self: MappedFileQueue, ahead: int) -> bool:
        calls.append(ahead)
        return real(self, ahead)

    monkeypatch.setattr(MappedFileQueue, "prefault_ahead", spy)
    monkeypatch.setattr(flush_module, "PREFAULT_INTERVAL_S", 0.001)
    config = StoreConfig.model_validate(
        {
            "store_path_root_dir": tmp_path,
            "mapped_file_size_commitlog": SIZE,
            "mapped_file_size_consume_queue": 100 * 20,
            "warm_mapped_file_enable": True,
        }
    )
    msg = MessageInner(
        "T",
        b"x" * 100,
        queue_id=0,
        born_timestamp=1,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )
    async with MessageStore(config) as store:
        assert (await store.put_message(msg)).status is PutMessageStatus.PUT_OK
        with trio.fail_after(5):
            while len(calls) < 2:
                await trio.sleep(0.005)
    assert set(calls) == {flush_module.PREFAULT_AHEAD}


async def test_no_prefault_loop_unless_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def spy(self: MappedFileQueue, ahead: int) -> bool:
        calls.append(ahead)
        return True

    monkeypatch.setattr(MappedFileQueue, "prefault_ahead", spy)
    monkeypatch.setattr(flush_module, "PREFAULT_INTERVAL_S", 0.001)
    config = StoreConfig.model_validate(
        {"store_path_root_dir": tmp_path, "mapped_file_size_commitlog": SIZE}
    )
    async with MessageStore(config):
        await trio.sleep(0.05)
    assert calls == []

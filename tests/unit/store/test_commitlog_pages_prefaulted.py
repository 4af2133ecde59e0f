"""Pre-faulting the commitlog pages ahead of the write position (`MappedFile.prefault`,
`MappedFileQueue.prefault_ahead`, the flush service's prefault loop when
`warm_mapped_file_enable` is set; off by default)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest
import trio

import store._flush as flush_module
from common.message import MessageInner
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.paths import offset_to_file_name

SIZE = 64 * 1024


def mapped(tmp_path: Path) -> MappedFile:
    # Sparse (no reservation), so that the blocks the prefault allocates can be seen.
    return MappedFile(tmp_path / offset_to_file_name(0), SIZE, preallocate=False)


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


def dirty_bytes(mf: MappedFile) -> int:
    """Dirty bytes of the file's mapping in this process (/proc/self/smaps)."""
    base = ctypes.addressof(ctypes.c_char.from_buffer(mf._mm))
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{base:x}":
            total = 0
            for field in lines[i + 1 : i + 24]:
                name, _, value = field.partition(":")
                if name in ("Shared_Dirty", "Private_Dirty"):
                    total += int(value.split()[0]) * 1024
            return total
    raise AssertionError("mapping not found in /proc/self/smaps")


def test_sync_range_writes_back_only_its_range(tmp_path: Path) -> None:
    """The commitlog flush syncs [flushed, written): the pages pre-faulted ahead stay dirty
    (an fdatasync of the file would write them back as zeros and clean them)."""
    mf = mapped(tmp_path)
    mf.append(b"c" * 100)
    if not mf.prefault(0, 32 * 1024):
        pytest.skip("kernel without MADV_POPULATE_WRITE")
    assert dirty_bytes(mf) >= 32 * 1024
    mf.sync_range(0, mf.wrote_position)
    assert dirty_bytes(mf) >= 28 * 1024  # only the first page was written back
    mf.sync_range(8192, 8192)  # empty: nothing
    assert dirty_bytes(mf) >= 28 * 1024
    mf.fsync()
    assert dirty_bytes(mf) == 0
    mf.close()
    assert (tmp_path / offset_to_file_name(0)).read_bytes() == b"c" * 100 + bytes(SIZE - 100)


def test_flush_ranges_cover_what_is_not_durable_across_files(tmp_path: Path) -> None:
    mfq = MappedFileQueue(tmp_path, SIZE)
    first = mfq.file_for_append()
    first.append(b"d" * (SIZE - 10))
    mfq.flushed_to(1000)
    first.append(b"e" * 10)
    second = mfq.file_for_append()
    second.append(b"f" * 300)
    target = mfq.max_offset
    assert mfq.flush_ranges(target) == [(first, 1000, SIZE), (second, 0, 300)]
    for mf, start, end in mfq.flush_ranges(target):
        mf.sync_range(start, end)
    mfq.flushed_to(target)
    assert mfq.flush_ranges(target) == []
    mfq.close_all()


_libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(mm: mmap.mmap, start: int, length: int) -> int:
    """Pages of [start, start + length) of a file mapping in the page cache (mincore)."""
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    pages = (length + 4095) // 4096
    vec = (ctypes.c_ubyte * pages)()
    _libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert _libc.mincore(base + start, length, vec) == 0, os.strerror(ctypes.get_errno())
    return sum(b & 1 for b in vec)


def test_appends_into_holes_fault_their_own_page_not_a_read_ahead_window(tmp_path: Path) -> None:
    """A write fault on a hole page reads it, and read-ahead zero-fills the window around it
    in the appending thread (8 MiB on this machine: ~25 ms of memset on the event loop).
    The file being appended to is advised random access, so only the touched page comes in;
    a full file goes back to normal read-ahead."""
    size = 16 << 20
    mfq = MappedFileQueue(tmp_path, size)
    mf = mfq.file_for_append()
    mf.append(b"x" * 100)  # through the map: one write fault on page 0
    assert resident_pages(mf._mm, 0, size) <= 2
    mf.append(b"y" * 100)
    mf.write_at(5 * 4096, b"z")  # another hole page, far from the first
    assert resident_pages(mf._mm, 0, size) <= 3
    # Recovery moves the write position back: the advice covers the new tail too.
    mf.zero_from(100)
    mf.write_at(9 * 4096, b"w")
    assert resident_pages(mf._mm, 8 * 4096, 4 * 4096) == 1
    mfq.close_all()


def test_index_file_slots_fault_their_own_page(tmp_path: Path) -> None:
    """Hash slots land on random pages of a sparse index file: each put brings in its own
    pages, not a read-ahead window."""
    from store.index_file import IndexFile

    f = IndexFile(tmp_path / "20260101000000000", 500_000, 2_000_000, 0, 0)
    for k in range(8):
        f.put_key(f"key-{k}", 1000 + k, 1_700_000_000_000 + k)
    # header + up to 8 slot pages + the entries' first page
    assert resident_pages(f._mm, 0, len(f._mm)) <= 10
    f.close()

"""Mapped files and file queues: naming, roll-over, truncation, reads that never pin the map."""

from __future__ import annotations

from pathlib import Path

import pytest

from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.paths import file_name_to_offset, offset_to_file_name


def test_file_names_are_20_digit_offsets() -> None:
    assert offset_to_file_name(1073741824) == "00000000001073741824"
    assert file_name_to_offset("00000000001073741824") == 1073741824
    assert file_name_to_offset("abc") is None
    assert file_name_to_offset("0000000000107374182x") is None


def test_mapped_file_is_sparse_and_reads_copies(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / offset_to_file_name(4096), 4096)
    assert mf.file_from_offset == 4096
    assert (tmp_path / offset_to_file_name(4096)).stat().st_size == 4096
    pos = mf.append(b"hello")
    assert pos == 0
    assert mf.end_offset == 4096 + 5
    data = mf.read(0, 5)
    assert isinstance(data, bytes)
    assert data == b"hello"
    mf.fsync()
    mf.destroy()  # no BufferError: nothing exported
    assert not (tmp_path / offset_to_file_name(4096)).exists()
    with pytest.raises(ValueError):
        MappedFile(tmp_path / "notanumber", 4096)


def test_short_file_is_extended(tmp_path: Path) -> None:
    p = tmp_path / offset_to_file_name(0)
    p.write_bytes(b"abc")
    mf = MappedFile(p, 8192)
    assert p.stat().st_size == 8192
    assert mf.read(0, 4) == b"abc\0"
    mf.close()


def test_zero_from_punches_tail(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / offset_to_file_name(0), 8192)
    mf.append(b"x" * 6000)
    mf.zero_from(100)
    assert mf.wrote_position == 100
    assert mf.read(0, 100) == b"x" * 100
    assert mf.read(100, 8092) == b"\0" * 8092
    mf.close()


def test_queue_rolls_loads_and_truncates(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "q", 4096)
    for _ in range(10):
        mf = q.file_for_append()
        mf.append(b"a" * 1024)
    assert [m.file_from_offset for m in q.files] == [0, 4096, 8192]
    assert q.max_offset == 10 * 1024
    assert q.find(5000) is q.files[1]
    assert q.find(20000) is None
    plan = q.flush_plan(q.max_offset)
    for m in plan:
        m.fsync()
    q.flushed_to(q.max_offset)
    assert q.dirty_bytes == 0
    q.close_all()

    q2 = MappedFileQueue(tmp_path / "q", 4096)
    q2.load()
    assert len(q2.files) == 3
    dropped = q2.truncate_to(5000)
    assert [m.file_from_offset for m in dropped] == [8192]
    for m in dropped:
        m.destroy()
    assert q2.max_offset == 5000
    assert q2.files[1].read(5000 - 4096, 8) == b"\0" * 8
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == [
        offset_to_file_name(0),
        offset_to_file_name(4096),
    ]
    gone = q2.detach_first(5)
    assert [m.file_from_offset for m in gone] == [0]  # never the last file
    for m in gone:
        m.destroy()
    assert q2.min_offset == 4096
    q2.close_all()


def test_prepare_next_is_used_on_roll(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "q", 4096)
    q.file_for_append().append(b"a" * 3000)
    q.prepare_next()
    prepared = q._prepared
    assert prepared is not None
    q.files[-1].append(b"b" * 1096)
    mf = q.file_for_append()
    assert mf is prepared
    assert mf.file_from_offset == 4096
    q.close_all()

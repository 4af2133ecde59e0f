"""Consume queues: 20-byte units, roll-over, idempotent puts, gaps, truncation, cleanup."""

from __future__ import annotations

import struct
from pathlib import Path

from store.consume_queue import CQ_UNIT_SIZE, GAP_UNIT_SIZE, ConsumeQueue
from store.paths import consume_queue_dir, offset_to_file_name


def _cq(root: Path, size: int = 5 * CQ_UNIT_SIZE) -> ConsumeQueue:
    return ConsumeQueue(root, "T", 1, size)


def test_units_are_rocketmq_layout_and_files_roll(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    for i in range(12):
        assert cq.put(i * 100, 100, 2598919, i)
    assert cq.max_offset_in_queue == 12
    assert cq.min_offset_in_queue == 0
    d = consume_queue_dir(tmp_path, "T", 1)
    names = sorted(p.name for p in d.iterdir())
    assert names == [offset_to_file_name(0), offset_to_file_name(100), offset_to_file_name(200)]
    raw = (d / offset_to_file_name(0)).read_bytes()[:20]
    assert raw == struct.pack(">qiq", 0, 100, 2598919)
    assert cq.get_unit(7) == (700, 100, 2598919)
    assert cq.get_unit(12) is None
    # read_units stays within one file
    assert [u[0] for u in cq.read_units(3, 32) or []] == [300, 400]
    assert cq.roll_next_file(3) == 5
    # idempotent
    assert not cq.put(500, 100, 0, 5)
    assert cq.max_offset_in_queue == 12
    cq.mfq.close_all()


def test_recover_finds_end_and_gap_fill(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    for i in range(7):
        cq.put(i * 100, 100, 0, i)
    cq.mfq.close_all()
    cq2 = _cq(tmp_path)
    cq2.load()
    cq2.recover()
    assert cq2.max_offset_in_queue == 7
    assert cq2.max_physic_offset == 700
    # a gap is filled with gap units
    assert cq2.put(900, 100, 0, 9)
    assert cq2.get_unit(7) == (0, GAP_UNIT_SIZE, 0)
    assert cq2.max_offset_in_queue == 10
    cq2.mfq.close_all()


def test_late_start_sets_min_offset(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    assert cq.put(10_000, 50, 0, 7)
    assert cq.min_offset_in_queue == 7
    assert cq.max_offset_in_queue == 8
    assert cq.mfq.files[0].file_from_offset == 5 * CQ_UNIT_SIZE
    cq.mfq.close_all()


def test_truncate_dirty_and_expired_files(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    for i in range(12):
        cq.put(i * 100, 100, 0, i)
    assert cq.truncate_dirty(750) == 4  # units at 800..1100 dropped
    assert cq.max_offset_in_queue == 8
    assert cq.max_physic_offset == 800
    assert len(cq.mfq.files) == 2
    gone = cq.expired_files(600)  # file 0 holds 0..400 -> all below 600
    assert [m.file_from_offset for m in gone] == [0]
    for m in gone:
        m.destroy()
    cq.correct_min_offset(600)
    assert cq.min_offset_in_queue == 6
    cq.mfq.close_all()


def test_offset_by_time(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    times = {i * 100: 1000 + 10 * i for i in range(12)}
    for i in range(12):
        cq.put(i * 100, 100, 0, i)

    def store_time(phy: int, size: int) -> int | None:
        return times.get(phy)

    assert cq.offset_by_time(0, store_time) == 0
    assert cq.offset_by_time(1000, store_time) == 0
    assert cq.offset_by_time(1001, store_time) == 1
    assert cq.offset_by_time(1050, store_time) == 5
    assert cq.offset_by_time(1110, store_time) == 11
    assert cq.offset_by_time(5000, store_time) == 12
    cq.mfq.close_all()

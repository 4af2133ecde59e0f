"""store.index_file: RocketMQ's hash index files and the index service."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from common.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    DispatchRequest,
    DispatchStatus,
    java_string_hash,
)
from store.index_file import (
    ENTRY_SIZE,
    HEADER_SIZE,
    IndexFile,
    IndexFileError,
    IndexService,
    index_file_name,
    key_hash,
)

T0 = 1_700_000_000_000


def _req(
    phy: int,
    ts: int,
    *,
    topic: str = "T",
    uniq: str | None = None,
    keys: str = "",
    sys_flag: int = 0,
) -> DispatchRequest:
    return DispatchRequest(
        DispatchStatus.OK,
        size=100,
        topic=topic,
        commit_log_offset=phy,
        store_timestamp=ts,
        sys_flag=sys_flag,
        keys=keys,
        uniq_key=uniq,
    )


def test_key_hash() -> None:
    assert key_hash("TagA") == 2598919
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert key_hash("polygenelubricants") == 0  # abs(MIN_VALUE) -> 0
    assert java_string_hash("TopicTest#KEY1") == -1656969516  # negative: abs() path
    assert key_hash("TopicTest#KEY1") == 1656969516


def test_index_file_name() -> None:
    ms = int(time.mktime((2024, 3, 5, 7, 8, 9, 0, 0, -1))) * 1000 + 42
    assert index_file_name(ms) == "20240305070809042"


def test_file_layout_and_header(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = IndexFile(path, slot_num=7, index_num=10)
    assert path.stat().st_size == HEADER_SIZE + 7 * 4 + 10 * ENTRY_SIZE
    assert f.index_count == 1
    assert f.put_key("T#k", 1000, T0)
    assert f.put_key("T#k", 2000, T0 + 3500)
    f.flush()
    data = path.read_bytes()
    header = struct.unpack_from(">qqqqii", data, 0)
    assert header == (T0, T0 + 3500, 1000, 2000, 1, 3)
    h = key_hash("T#k")
    slot = h % 7
    assert struct.unpack_from(">i", data, HEADER_SIZE + slot * 4)[0] == 2
    entries = HEADER_SIZE + 7 * 4
    assert struct.unpack_from(">iqii", data, entries + 1 * ENTRY_SIZE) == (h, 1000, 0, 0)
    assert struct.unpack_from(">iqii", data, entries + 2 * ENTRY_SIZE) == (h, 2000, 3, 1)
    f.close()


def test_put_select_with_collisions(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_num=3, index_num=400)
    expected: dict[str, list[int]] = {}
    for i in range(300):
        key = f"T#key{i % 17}"
        assert f.put_key(key, i * 100, T0 + i * 1000)
        expected.setdefault(key, []).append(i * 100)
    assert f.hash_slot_count <= 3
    for key, offsets in expected.items():
        got = f.select_phy_offsets(key, 1000, 0, 2**62)
        assert got == offsets[::-1]  # newest first
        assert f.select_phy_offsets(key, 2, 0, 2**62) == offsets[::-1][:2]
    assert f.select_phy_offsets("T#absent", 10, 0, 2**62) == []
    assert f.select_phy_offsets("T#key1", 0, 0, 2**62) == []
    f.close()


def test_true_hash_collision_returns_both(tmp_path: Path) -> None:
    # "Aa" and "BB" have the same Java hash: the index cannot tell them apart
    assert java_string_hash("T#Aa") == java_string_hash("T#BB")
    f = IndexFile(tmp_path / "idx", slot_num=100, index_num=10)
    f.put_key("T#Aa", 1, T0)
    f.put_key("T#BB", 2, T0)
    assert f.select_phy_offsets("T#Aa", 10, 0, 2**62) == [2, 1]
    f.close()


def test_time_range_filtering(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_num=5, index_num=100)
    for i in range(10):
        f.put_key("T#k", i, T0 + i * 1000)
    assert f.select_phy_offsets("T#k", 100, T0 + 3000, T0 + 6000) == [6, 5, 4, 3]
    assert f.select_phy_offsets("T#k", 100, T0 + 9001, T0 + 20000) == []
    assert f.select_phy_offsets("T#k", 100, 0, T0 - 1) == []
    assert f.select_phy_offsets("T#k", 2, T0 + 3000, T0 + 6000) == [6, 5]
    # one-second resolution: 1.5 s after the first entry reads back as +1 s
    g = IndexFile(tmp_path / "idx2", slot_num=5, index_num=100)
    g.put_key("T#k", 0, T0)
    g.put_key("T#k", 1, T0 + 1500)
    assert g.select_phy_offsets("T#k", 10, T0 + 1000, T0 + 1000) == [1]
    assert f.is_time_matched(T0 + 1000, T0 + 2000)
    assert f.is_time_matched(0, 2**62)
    assert not f.is_time_matched(T0 + 10_000, T0 + 20_000)
    f.close()
    g.close()


def test_full_file(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_num=2, index_num=5)
    assert [f.put_key(f"T#{i}", i, T0) for i in range(5)] == [True, True, True, True, False]
    assert f.is_full
    assert f.index_count == 5
    assert f.select_phy_offsets("T#3", 10, 0, 2**62) == [3]
    f.close()


def test_reopen_gives_same_answers(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = IndexFile(path, slot_num=11, index_num=200)
    for i in range(150):
        f.put_key(f"T#k{i % 13}", i * 7, T0 + i * 1000)
    before = {k: f.select_phy_offsets(f"T#k{k}", 500, 0, 2**62) for k in range(13)}
    header = (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset)
    counts = (f.hash_slot_count, f.index_count)
    f.close()
    assert f.closed
    assert f.select_phy_offsets("T#k0", 10, 0, 2**62) == []  # unmapped: nothing, no error
    g = IndexFile(path, slot_num=11, index_num=200)
    assert (g.begin_timestamp, g.end_timestamp, g.begin_phy_offset, g.end_phy_offset) == header
    assert (g.hash_slot_count, g.index_count) == counts
    after = {k: g.select_phy_offsets(f"T#k{k}", 500, 0, 2**62) for k in range(13)}
    assert after == before
    assert g.put_key("T#k0", 99999, T0 + 200_000)
    assert g.select_phy_offsets("T#k0", 1, 0, 2**62) == [99999]
    g.close()
    with pytest.raises(IndexFileError):
        IndexFile(path, slot_num=12, index_num=200)


def test_corrupt_chains_terminate(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = IndexFile(path, slot_num=1, index_num=10)
    for i in range(5):  # entries 1..5 hold offsets 0..4
        f.put_key("T#k", i, T0)
    assert f.select_phy_offsets("T#k", 100, 0, 2**62) == [4, 3, 2, 1, 0]
    f.close()
    entries = HEADER_SIZE + 4
    with path.open("r+b") as fh:
        # entry 3 points forward to 5 (the slot head): a loop 5 -> 4 -> 3 -> 5
        fh.seek(entries + 3 * ENTRY_SIZE + 16)
        fh.write(struct.pack(">i", 5))
    g = IndexFile(path, slot_num=1, index_num=10)
    assert g.select_phy_offsets("T#k", 100, 0, 2**62) == [4, 3, 2]
    g.close()
    with path.open("r+b") as fh:
        fh.seek(HEADER_SIZE)  # slot head beyond the index count
        fh.write(struct.pack(">i", 9))
    g = IndexFile(path, slot_num=1, index_num=10)
    assert g.select_phy_offsets("T#k", 100, 0, 2**62) == []
    g.close()


def test_new_file_inherits_previous_end(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "idx", slot_num=3, index_num=10, end_phy_offset=500, end_timestamp=T0)
    assert (f.begin_phy_offset, f.end_phy_offset) == (500, 500)
    assert (f.begin_timestamp, f.end_timestamp) == (T0, T0)
    f.put_key("T#a", 600, T0 + 2000)
    assert f.begin_phy_offset == 600
    assert f.begin_timestamp == T0 + 2000
    # the first entry's time is the new begin (diff 0), so an exact range finds it
    assert f.select_phy_offsets("T#a", 10, T0 + 2000, T0 + 2000) == [600]
    f.destroy()
    assert not (tmp_path / "idx").exists()


# --- IndexService -------------------------------------------------------------------------


def _fill(svc: IndexService, n: int, start_phy: int = 0) -> None:
    for i in range(n):
        svc.build_index(
            _req(start_phy + i * 100, T0 + i * 1000, uniq=f"U{i:04d}", keys=f"order{i % 5} k{i}")
        )


def test_service_build_and_query(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index", slot_num=5, index_num=10)
    svc.load()
    _fill(svc, 30)  # 3 keys per record, 9 entries per file -> many files
    files = svc.files
    assert len(files) == 10
    assert all(f.is_full for f in files[:-1])
    assert [f.file_name for f in files] == sorted(f.file_name for f in files)
    assert all(len(f.file_name) == 17 for f in files)
    offsets, last_ts, last_phy = svc.query("T", "U0007", 10, 0, 2**62)
    assert offsets == [700]
    assert (last_ts, last_phy) == (T0 + 29_000, 2900)
    offsets, _, _ = svc.query("T", "order2", 100, 0, 2**62)
    assert offsets == [2700, 2200, 1700, 1200, 700, 200]
    assert svc.query("T", "order2", 3, 0, 2**62)[0] == [2700, 2200, 1700]
    assert svc.query("T", "order2", 100, T0 + 7000, T0 + 17_000)[0] == [1700, 1200, 700]
    assert svc.query("T", "order2", 100, T0 + 7001, T0 + 16_999)[0] == [1200]
    assert svc.query("Other", "order2", 100, 0, 2**62)[0] == []
    assert svc.query("T", "k13", 10, 0, 2**62)[0] == [1300]
    svc.close()


def test_service_skips_rollback_and_reindexing(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index", slot_num=5, index_num=100)
    svc.load()
    svc.build_index(_req(0, T0, uniq="U0"))
    svc.build_index(_req(100, T0, uniq="U1", sys_flag=TRANSACTION_ROLLBACK_TYPE))
    svc.build_index(_req(200, T0, uniq="U2", sys_flag=TRANSACTION_PREPARED_TYPE))
    svc.build_index(_req(300, T0, uniq="U3", sys_flag=TRANSACTION_COMMIT_TYPE))
    assert svc.query("T", "U0", 10, 0, 2**62)[0] == [0]
    assert svc.query("T", "U1", 10, 0, 2**62)[0] == []
    assert svc.query("T", "U2", 10, 0, 2**62)[0] == [200]
    assert svc.query("T", "U3", 10, 0, 2**62)[0] == [300]
    # re-dispatch after recovery: everything up to and including the last indexed record
    count = svc.files[-1].index_count
    for phy, uniq in [(0, "U0"), (200, "U2"), (300, "U3")]:
        svc.build_index(_req(phy, T0, uniq=uniq))
    assert svc.files[-1].index_count == count
    assert svc.query("T", "U3", 10, 0, 2**62)[0] == [300]
    svc.build_index(_req(400, T0, keys="a  b"))  # empty KEYS tokens are skipped
    assert svc.query("T", "a", 10, 0, 2**62)[0] == [400]
    assert svc.query("T", "b", 10, 0, 2**62)[0] == [400]
    assert svc.query("T", "", 10, 0, 2**62)[0] == []
    svc.close()


def test_service_reopen_and_flush_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = IndexService(d, slot_num=5, index_num=10)
    svc.load()
    _fill(svc, 7)  # 21 entries: two full files (9 each) + 3 in the third
    now = T0 + 6000
    assert svc.flush(now) == now  # everything written back: durable up to now
    assert not any(f.dirty for f in svc.files)
    answers = {k: svc.query("T", k, 50, 0, 2**62)[0] for k in ("U0003", "order1", "k6")}
    svc.close()
    svc2 = IndexService(d, slot_num=5, index_num=10)
    svc2.load()  # every file is kept, also the one being written
    assert len(svc2.files) == 3
    assert {k: svc2.query("T", k, 50, 0, 2**62)[0] for k in answers} == answers
    svc2.close()


def test_flush_writes_the_live_file_back_only_when_asked(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index", slot_num=5, index_num=10)
    svc.load()
    _fill(svc, 7)  # records i at T0 + i s; files: 0-2, 3-5 (full), 6 (being written)
    # Full files are written back at once; the live one is left dirty, and the durable point
    # is where it began (inherited from the previous file's end: record 5).
    assert svc.flush(T0 + 6000, live=False) == T0 + 5000
    assert [f.dirty for f in svc.files] == [False, False, True]
    assert svc.flush(T0 + 6000, live=True) == T0 + 6000
    assert [f.dirty for f in svc.files] == [False, False, False]
    svc.build_index(_req(700, T0 + 7000, uniq="U0007"))
    # Dirty again: durable up to the end timestamp when its last write-back began.
    assert svc.flush(T0 + 7000, live=False) == T0 + 6000
    assert svc.flush(T0 + 7000) == T0 + 7000
    svc.close()


def test_truncate_seals_and_queries_drop_the_duplicates(tmp_path: Path) -> None:
    # Abnormal recovery cuts the index at the first record not known to be written back and
    # indexes it and the later ones again, in a new file: after a process crash they are in
    # both files, and a query answers each offset once.
    svc = IndexService(tmp_path / "index", slot_num=5, index_num=100)
    svc.load()
    _fill(svc, 6)
    assert svc.truncate(300) == 0
    sealed = svc.files[-1]
    assert sealed.is_full
    assert sealed.end_phy_offset == 299
    for i in range(3, 8):
        svc.build_index(_req(i * 100, T0 + i * 1000, uniq=f"U{i:04d}", keys=f"order{i % 5}"))
    assert len(svc.files) == 2
    assert svc.query("T", "U0004", 10, 0, 2**62)[0] == [400]
    assert svc.query("T", "order2", 10, 0, 2**62)[0] == [700, 200]
    assert svc.query("T", "order3", 10, 0, 2**62)[0] == [300]
    svc.close()


def test_delete_expired_never_the_last(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = IndexService(d, slot_num=5, index_num=10)
    svc.load()
    _fill(svc, 10)  # 4 files, end offsets 200, 500, 800, 900
    assert [f.end_phy_offset for f in svc.files] == [200, 500, 800, 900]
    assert svc.delete_expired(501) == 2
    assert [f.end_phy_offset for f in svc.files] == [800, 900]
    assert len(os.listdir(d)) == 2
    assert svc.query("T", "U0001", 10, 0, 2**62)[0] == []
    assert svc.query("T", "U0009", 10, 0, 2**62)[0] == [900]
    assert svc.delete_expired(10**9) == 1
    assert len(svc.files) == 1
    svc.destroy()
    assert os.listdir(d) == []


def test_load_deletes_unusable_and_ignores_foreign_files(tmp_path: Path) -> None:
    d = tmp_path / "index"
    d.mkdir()
    (d / "20240101000000000").write_bytes(b"short")
    (d / "README").write_text("not an index file")
    svc = IndexService(d, slot_num=5, index_num=10)
    svc.load()
    assert svc.files == []
    assert sorted(os.listdir(d)) == ["README"]
    svc.build_index(_req(0, T0, uniq="U"))
    assert svc.query("T", "U", 1, 0, 2**62)[0] == [0]
    svc.close()


def test_truncate_after_commitlog_cut(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = IndexService(d, slot_num=5, index_num=10)
    svc.load()
    _fill(svc, 7)  # files: records 0-2 (end 200), 3-5 (end 500), 6 (begin 600)
    assert [(f.begin_phy_offset, f.end_phy_offset) for f in svc.files] == [
        (0, 200),
        (300, 500),
        (600, 600),
    ]
    # the commitlog was cut at 450: the record at 500 and everything after is gone
    assert svc.truncate(450) == 1
    files = svc.files
    assert len(files) == 2
    assert files[-1].is_full
    assert files[-1].end_phy_offset == 449
    # new records from 450 on are indexed (not skipped as "already indexed")
    svc.build_index(_req(450, T0 + 60_000, uniq="NEW1"))
    svc.build_index(_req(550, T0 + 61_000, uniq="NEW2", keys="order0"))
    assert len(svc.files) == 3
    assert svc.query("T", "NEW1", 10, 0, 2**62)[0] == [450]
    assert svc.query("T", "NEW2", 10, 0, 2**62)[0] == [550]
    assert svc.query("T", "U0004", 10, 0, 2**62)[0] == [400]
    assert svc.query("T", "U0006", 10, 0, 2**62)[0] == []
    # re-dispatching the new records again is still idempotent
    count = svc.files[-1].index_count
    svc.build_index(_req(550, T0 + 61_000, uniq="NEW2", keys="order0"))
    assert svc.files[-1].index_count == count
    svc.close()
    svc2 = IndexService(d, slot_num=5, index_num=10)
    svc2.load()
    assert [f.is_full for f in svc2.files] == [True, True, False]
    assert svc2.query("T", "NEW1", 10, 0, 2**62)[0] == [450]
    assert svc2.truncate(0) == 3
    assert svc2.files == []
    svc2.close()


def test_flush_and_delete_in_a_thread_while_indexing(tmp_path: Path) -> None:
    import threading

    svc = IndexService(tmp_path / "index", slot_num=7, index_num=50)
    svc.load()
    stop = threading.Event()
    errors: list[BaseException] = []

    def background() -> None:
        try:
            while not stop.is_set():
                svc.flush(T0)
                svc.delete_expired(0)  # nothing is below offset 0: exercises the lock only
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=background)
    t.start()
    try:
        _fill(svc, 400)
    finally:
        stop.set()
        t.join()
    assert errors == []
    assert svc.query("T", "U0399", 10, 0, 2**62)[0] == [39900]
    assert svc.query("T", "U0000", 10, 0, 2**62)[0] == [0]
    assert svc.delete_expired(20_000) > 0
    assert svc.query("T", "U0000", 10, 0, 2**62)[0] == []
    assert svc.query("T", "U0399", 10, 0, 2**62)[0] == [39900]
    svc.close()


def test_flush_and_close_use_fdatasync_not_msync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CPython's mmap.flush() (msync) keeps the GIL for the whole write-back, which froze the
    # broker's event loop although the flush ran in a worker thread; fdatasync releases it.

    synced: list[int] = []
    real = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    path = tmp_path / "idx"
    f = IndexFile(path, slot_num=7, index_num=10)
    f.flush()  # a new file's header
    synced.clear()
    f.flush()
    assert synced == []  # nothing dirty, nothing to write
    assert f.put_key("T#k", 1000, T0)
    f.flush()
    assert len(synced) == 1
    assert struct.unpack_from(">ii", path.read_bytes(), 32) == (1, 2)  # slot and index counts
    assert f.put_key("T#k2", 2000, T0)
    f.close()
    assert len(synced) == 2
    assert synced[0] == synced[1]

"""Damaged and torn store files, recovered without processes.

Defect 7: a damaged record in the middle of the commitlog costs only itself. The scanner finds
the next valid record (magic code, size, layout, its own offset, body CRC), recovery keeps every
later record and file, copies the damaged bytes aside, reports them, and pulls and lookups skip
the units pointing into them. A torn tail (nothing valid after it) is still truncated.

Defect 8: a missing or damaged index is rebuilt from the commitlog in the background, alongside
the live indexing of new records.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from common.message import MessageInner, decode_records, encode_blank, encode_record
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig
from store._recovery import (
    DamagedRegion,
    FileScanner,
    count_records,
    find_next_record,
    scan_commitlog,
)
from store.check import main as check_main
from store.paths import abort_path, commitlog_dir, consume_queue_root, index_dir

FILE = 4096


def cfg(root: Path) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commitlog=FILE,
        mapped_file_size_consume_queue=8 * 20,
        max_hash_slot_num=64,
        max_index_num=64,  # a handful of files per rebuild
    )


def mk(i: int, body: bytes | None = None) -> MessageInner:
    return MessageInner(
        "T",
        body if body is not None else f"body-{i}-".encode() * (5 + i % 7),
        queue_id=i % 3,
        properties={"KEYS": f"key{i}"},
        born_timestamp=1000 + i,
        store_host=("127.0.0.1", 10911),
    )


# ---------------------------------------------------------------------- scanner (sans-IO)
def _file(records: list[bytes], size: int, *, blank: bool = False) -> bytearray:
    buf = bytearray(size)
    pos = 0
    for r in records:
        buf[pos : pos + len(r)] = r
        pos += len(r)
    if blank:
        buf[pos : pos + 8] = encode_blank(size - pos)
    return buf


def _records(n: int, start_phy: int = 0, body: bytes | None = None) -> list[bytes]:
    out = []
    phy = start_phy
    for i in range(n):
        rec = bytes(encode_record(mk(i, body), i, phy, 5 + i))
        out.append(rec)
        phy += len(rec)
    return out


def _reader(buf: bytearray) -> Callable[[int, int], bytes]:
    return lambda p, n: bytes(buf[p : p + n])


def test_scanner_skips_a_record_with_a_flipped_body_byte() -> None:
    recs = _records(10)
    buf = _file(recs, 4096)
    victim = sum(map(len, recs[:4]))
    buf[victim + len(recs[4]) - 30] ^= 0xFF  # in the body: the CRC fails
    fs = FileScanner(_reader(buf), 0, len(buf))
    got = [r.queue_offset for r in fs]
    assert got == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert fs.gaps == [(victim, victim + len(recs[4]))]
    assert not fs.complete
    assert fs.tail_from == sum(map(len, recs))
    assert count_records(_reader(buf), victim, victim + len(recs[4])) == 1


def test_scanner_skips_a_damaged_size_field_and_counts_unknown() -> None:
    recs = _records(10)
    buf = _file(recs, 4096, blank=True)
    victim = sum(map(len, recs[:2]))
    buf[victim + 2] ^= 0x40  # TOTALSIZE: the record chain breaks here
    fs = FileScanner(_reader(buf), 0, len(buf))
    assert [r.queue_offset for r in fs] == [0, 1, 3, 4, 5, 6, 7, 8, 9]
    assert fs.gaps == [(victim, victim + len(recs[2]))]
    assert fs.complete  # the BLANK padding was reached after the gap
    assert count_records(_reader(buf), victim, victim + len(recs[2])) is None


def test_a_magic_code_inside_a_body_is_not_taken_for_a_record() -> None:
    # Bodies full of magic codes and offsets; only whole valid structures count.
    trap = (b"\x00\x00\x00\x80\xda\xa3\x20\xa7" + bytes(20)) * 6
    recs = _records(6, body=trap)
    buf = _file(recs, 4096)
    first = len(recs[0])
    buf[first + 4] ^= 0x01  # record 1's magic code
    fs = FileScanner(_reader(buf), 0, len(buf))
    assert [r.queue_offset for r in fs] == [0, 2, 3, 4, 5]
    assert fs.gaps == [(first, first + len(recs[1]))]


def test_find_next_record_checks_offset_and_crc() -> None:
    rec = bytes(encode_record(mk(1), 0, 500, 5))  # claims offset 500
    buf = bytearray(2048)
    buf[100 : 100 + len(rec)] = rec
    assert find_next_record(_reader(buf), 0, len(buf), 0) is None  # sits at 100, not 500
    assert find_next_record(_reader(buf), 400, len(buf), 0) == 100  # file starting at 400
    buf[100 + len(rec) - 30] ^= 1
    assert find_next_record(_reader(buf), 400, len(buf), 0) is None
    assert find_next_record(_reader(buf), 400, len(buf), 0, check_crc=False) == 100


def test_scan_commitlog_tells_a_torn_tail_from_damage_in_the_middle() -> None:
    a = _records(5)
    a_end = sum(map(len, a))
    f0 = _file(a, 2048, blank=True)
    b = _records(5, start_phy=2048)
    f1 = _file(b, 2048)
    # garbage in the middle of file 0 (record 2 on): the rest of file 0 is unreadable
    start = len(a[0]) + len(a[1])
    f0[start:2048] = random.Random(3).randbytes(2048 - start)
    scan = scan_commitlog(
        [(0, 2048, _reader(f0)), (2048, 2048, _reader(f1))],
        check_crc=True,
        max_size=1 << 20,
        light=True,
    )
    assert scan.records == 2 + 5
    assert scan.damaged == [DamagedRegion(start, 2048 - start, None)]
    assert scan.valid_end == 2048 + sum(map(len, b))
    assert scan.tail_bytes == 0
    assert scan.stop_reason == "END"
    # the same garbage with nothing valid after it: a torn tail
    scan = scan_commitlog([(0, 2048, _reader(f0))], check_crc=True, max_size=1 << 20, light=True)
    assert scan.damaged == []
    assert scan.valid_end == start
    assert scan.tail_bytes == 2048 - start
    assert scan.stop_reason == "INVALID"
    assert a_end > start


# ---------------------------------------------------------------------- store level
async def _write(root: Path, n: int, *, crash: bool = False) -> list[tuple[int, int, int]]:
    out = []
    async with MessageStore(cfg(root)) as store:
        for i in range(n):
            r = await store.put_message(mk(i))
            assert r.status is PutMessageStatus.PUT_OK
            assert r.append is not None
            out.append((r.append.wrote_offset, r.append.wrote_bytes, i))
        if crash:
            store.simulate_crash()
    return out


def _flip(root: Path, phy: int, delta: int) -> None:
    start = phy - phy % FILE
    path = commitlog_dir(root) / f"{start:020d}"
    with path.open("r+b") as f:
        f.seek(phy - start + delta)
        b = f.read(1)
        f.seek(phy - start + delta)
        f.write(bytes([b[0] ^ 0xFF]))


async def _pull_all(store: MessageStore) -> list[int]:
    seen: list[int] = []
    for q in range(3):
        off = 0
        for _ in range(1000):
            res = await store.get_message("g", "T", q, off, 7, 1 << 24)
            if res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE:
                break
            assert res.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE)
            seen.extend(int((m.keys or "key-1")[3:]) for m in decode_records(b"".join(res.buffers)))
            off = res.next_begin_offset
    return sorted(seen)


@pytest.mark.parametrize("mode", ["clean", "crash", "queues_deleted"])
async def test_a_flipped_byte_in_the_first_file_costs_one_record(tmp_path: Path, mode: str) -> None:
    # Three files: a start after a clean stop scans the last three (damage in older files is
    # found by `python -m store.check`, or by a start after a crash from the checkpoint on).
    n = 60
    recs = await _write(tmp_path, n, crash=mode == "crash")
    files = sorted(commitlog_dir(tmp_path).iterdir())
    assert len(files) == 3
    victim_phy, victim_size, victim = next(r for r in recs if r[0] > FILE // 2)
    assert victim_phy < FILE
    _flip(tmp_path, victim_phy, victim_size - 30)  # a body byte
    if mode == "queues_deleted":
        shutil.rmtree(consume_queue_root(tmp_path))
    async with MessageStore(cfg(tmp_path)) as store:
        assert store.recovery is not None
        assert store.recovery.damaged == [DamagedRegion(victim_phy, victim_size, 1)]
        assert store.recovery.truncated_bytes == 0
        assert store.recovery.dropped_files == 0
        assert sorted(commitlog_dir(tmp_path).iterdir()) == files
        assert await _pull_all(store) == [i for i in range(n) if i != victim]
        assert store.query_message("T", f"key{victim}", 4, 0, 2**62).buffers == []
        assert store.read_record(victim_phy) is None
        for i in (victim - 1, victim + 1, n - 1):
            assert len(store.query_message("T", f"key{i}", 4, 0, 2**62).buffers) == 1
        info = store.runtime_info()
        assert info["recoveryDamagedRegions"] == f"{victim_phy}:{victim_size}:1"
        assert info["recoveryDamagedBytes"] == str(victim_size)
        assert info["recoveryDamagedRecords"] == "1"
        r = await store.put_message(mk(n))
        assert r.status is PutMessageStatus.PUT_OK
    copy = tmp_path / "damaged" / f"{victim_phy}-{victim_size}.bin"
    assert copy.exists()
    assert len(copy.read_bytes()) == victim_size
    # A later start still knows (and skips) the region.
    async with MessageStore(cfg(tmp_path)) as store:
        assert [r.offset for r in store.damaged_regions] == [victim_phy]
        assert await _pull_all(store) == [i for i in range(n + 1) if i != victim]


async def test_a_torn_tail_is_still_truncated(tmp_path: Path) -> None:
    recs = await _write(tmp_path, 40, crash=True)
    phy, size, _i = recs[-1]
    _flip(tmp_path, phy, size - 30)
    async with MessageStore(cfg(tmp_path)) as store:
        assert store.recovery is not None
        assert store.recovery.damaged == []
        assert store.recovery.valid_end == phy
        assert await _pull_all(store) == list(range(39))
    assert not (tmp_path / "damaged").exists()


# ---------------------------------------------------------------------- index rebuild
async def _wait_rebuilt(store: MessageStore) -> None:
    with trio.fail_after(20):
        while store.index_rebuild_state not in ("done", "none"):
            await trio.sleep(0.01)
    assert store.index_rebuild_state in ("done", "none")


def _found(store: MessageStore, keys: range) -> int:
    return sum(len(store.query_message("T", f"key{i}", 4, 0, 2**62).buffers) == 1 for i in keys)


@pytest.mark.parametrize("damage", ["deleted", "damaged_file"])
async def test_a_missing_or_damaged_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    n = 150
    await _write(tmp_path, n)
    idx = index_dir(tmp_path)
    if damage == "deleted":
        shutil.rmtree(idx)
    else:
        victim = sorted(idx.iterdir())[1]
        with victim.open("r+b") as f:
            f.seek(36)
            f.write(b"\x7f\x00\x00\x00")  # indexCount far beyond the file
    async with MessageStore(cfg(tmp_path)) as store:
        # new records are indexed live while the rebuild fills in the old ones
        for i in range(n, n + 10):
            await store.put_message(mk(i))
        assert store.index_rebuild is not None
        await _wait_rebuilt(store)
        assert _found(store, range(n + 10)) == n + 10
        assert not (idx / ".rebuild").exists()
        assert store.runtime_info()["indexRebuild"] == "done"
        assert store.index_rebuild.records == n
    # After a restart the rebuilt files sort before the live ones and still answer.
    async with MessageStore(cfg(tmp_path)) as store:
        assert store.index_rebuild is None
        assert _found(store, range(n + 10)) == n + 10
        await store.put_message(mk(n + 10))
        assert _found(store, range(n + 11)) == n + 11


async def test_an_unfinished_rebuild_is_done_again(tmp_path: Path) -> None:
    n = 150
    recs = await _write(tmp_path, n)
    shutil.rmtree(index_dir(tmp_path))
    async with MessageStore(cfg(tmp_path)) as store:
        await _wait_rebuilt(store)
    # As if the process had died mid-rebuild: the marker is back, the files half written.
    end = recs[-1][0] + recs[-1][1]
    (index_dir(tmp_path) / ".rebuild").write_text(json.dumps({"from": 0, "to": end}))
    for p in sorted(index_dir(tmp_path).iterdir())[2:]:
        if p.name != ".rebuild":
            p.unlink()
    abort_path(tmp_path).touch()
    async with MessageStore(cfg(tmp_path)) as store:
        assert store.index_rebuild is not None
        assert (store.index_rebuild.start, store.index_rebuild.end) == (0, end)
        await _wait_rebuilt(store)
        assert _found(store, range(n)) == n


async def test_the_rebuild_stops_with_the_store_and_resumes_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store._recovery import IndexRebuild

    n = 150
    await _write(tmp_path, n)
    shutil.rmtree(index_dir(tmp_path))
    step = IndexRebuild.step

    def slow_step(self: IndexRebuild) -> bool:
        time.sleep(0.02)  # a worker thread
        return step(self, 5)

    monkeypatch.setattr(IndexRebuild, "step", slow_step)
    async with MessageStore(cfg(tmp_path)) as store:
        await trio.sleep(0.05)
        assert store.index_rebuild_state == "running"
        assert 0 < _found(store, range(n)) < n  # queries answer what is indexed so far
    assert (index_dir(tmp_path) / ".rebuild").exists()
    monkeypatch.setattr(IndexRebuild, "step", step)
    async with MessageStore(cfg(tmp_path)) as store:
        await _wait_rebuilt(store)
        assert _found(store, range(n)) == n


# ---------------------------------------------------------------------- python -m store.check
def _contents(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def test_check_tool_reports_what_recovery_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recs = await _write(tmp_path, 120)  # five files: the check scans them all
    assert check_main([str(tmp_path)]) == 0
    assert "clean" in capsys.readouterr().out
    victim_phy, victim_size, _ = next(r for r in recs if r[0] > FILE // 2)
    _flip(tmp_path, victim_phy, victim_size - 30)
    before = _contents(tmp_path)
    assert check_main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"offset {victim_phy}, {victim_size} bytes, 1 record" in out
    assert _contents(tmp_path) == before  # read-only
    assert check_main([str(tmp_path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["damaged"] == [{"offset": victim_phy, "length": victim_size, "records": 1}]
    assert check_main([str(tmp_path / "nope")]) == 2

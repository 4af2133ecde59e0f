"""Crash simulation without processes: write, stop uncleanly, damage the last file, reopen.

Recovery must keep exactly the valid prefix; consume queues and index must agree with it; appends
continue right after it with the right queue offsets.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog.testing

from common.message import DispatchStatus, MessageInner, decode_records, encode_record
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig
from store._recovery import RecordScanner, RecoveryReport
from store.index_file import HEADER_SIZE
from store.paths import abort_path, commitlog_dir, consume_queue_root, offset_to_file_name

FILE = 4096


def cfg(root: Path) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commitlog=FILE,
        mapped_file_size_consume_queue=8 * 20,
        max_hash_slot_num=64,
        max_index_num=512,
    )


@dataclass
class Rec:
    phy: int
    size: int
    queue_id: int
    queue_offset: int
    body: bytes
    key: str


def mk(i: int) -> MessageInner:
    return MessageInner(
        "T",
        f"body-{i}-".encode() * (5 + i % 7),
        queue_id=i % 3,
        properties={"KEYS": f"key{i}"},
        born_timestamp=1000 + i,
        store_host=("127.0.0.1", 10911),
    )


async def write(root: Path, n: int) -> list[Rec]:
    store = MessageStore(cfg(root))
    recs: list[Rec] = []
    async with store:
        for i in range(n):
            m = mk(i)
            r = await store.put_message(m)
            assert r.status is PutMessageStatus.PUT_OK
            assert r.append is not None
            recs.append(
                Rec(
                    r.append.wrote_offset,
                    r.append.wrote_bytes,
                    m.queue_id,
                    r.append.queue_offset,
                    m.body,
                    f"key{i}",
                )
            )
        store.simulate_crash()
    assert abort_path(root).exists()
    return recs


def file_of(root: Path, phy: int) -> tuple[Path, int]:
    start = phy - phy % FILE
    return commitlog_dir(root) / offset_to_file_name(start), phy - start


async def pull_all(store: MessageStore, q: int) -> list[bytes]:
    out: list[bytes] = []
    off = 0
    for _ in range(1000):
        res = await store.get_message("g", "T", q, off, 1000, 1 << 24)
        if res.status is not GetMessageStatus.FOUND:
            break
        out.extend(res.buffers)
        off = res.next_begin_offset
    return out


async def check_prefix(root: Path, recs: list[Rec], keep: int) -> RecoveryReport:
    """Reopen and check that exactly recs[:keep] survive, then append more."""
    kept = recs[:keep]
    lost = recs[keep:]
    expected_end = kept[-1].phy + kept[-1].size if kept else 0
    async with MessageStore(cfg(root)) as store:
        assert store.recovery is not None
        assert store.recovery.valid_end == expected_end
        report = store.recovery
        assert store.max_phy_offset == expected_end
        for q in range(3):
            mine = [r for r in kept if r.queue_id == q]
            assert store.get_max_offset_in_queue("T", q) == len(mine)
            bufs = await pull_all(store, q)
            msgs = decode_records(b"".join(bufs))
            if mine:
                assert [m.body for m in msgs] == [r.body for r in mine]
                assert [m.queue_offset for m in msgs] == [r.queue_offset for r in mine]
                assert [m.commit_log_offset for m in msgs] == [r.phy for r in mine]
            else:
                assert msgs == []
        for r in kept[-3:]:
            qr = store.query_message("T", r.key, 10, 0, 2**62)
            assert len(qr.buffers) == 1
        for r in lost:
            assert store.query_message("T", r.key, 10, 0, 2**62).buffers == []
            assert store.read_record(r.phy) is None or r.phy < expected_end
        # appends continue right after the valid prefix, with the right queue offsets
        for i in range(3):
            m = mk(1000 + i)
            m.queue_id = i
            res2 = await store.put_message(m)
            assert res2.append is not None
            assert res2.append.queue_offset == len([r for r in kept if r.queue_id == i])
        first = await store.put_message(mk(2000))
        assert first.append is not None
    # and a clean restart keeps all of it
    async with MessageStore(cfg(root)) as store:
        assert store.max_phy_offset >= expected_end
        assert (
            store.get_max_offset_in_queue("T", 0) == len([r for r in kept if r.queue_id == 0]) + 1
        )
        assert (
            store.get_max_offset_in_queue("T", 2) == len([r for r in kept if r.queue_id == 2]) + 2
        )
        assert store.recovery is not None
        assert store.recovery.truncated_bytes == 0
    return report


N = 60


async def test_unclean_close_without_damage_keeps_everything(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    await check_prefix(tmp_path, recs, N)


async def test_cut_mid_header(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    path, rel = file_of(tmp_path, recs[-1].phy)
    os.truncate(path, rel + 10)
    report = await check_prefix(tmp_path, recs, N - 1)
    assert report.truncated_bytes == 10


async def test_cut_mid_body(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    path, rel = file_of(tmp_path, recs[-1].phy)
    os.truncate(path, rel + recs[-1].size - 20)
    await check_prefix(tmp_path, recs, N - 1)


async def test_zeroed_tail(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    # zero the last two records (which may sit in the same file)
    target = recs[-2]
    path, rel = file_of(tmp_path, target.phy)
    if file_of(tmp_path, recs[-1].phy)[0] != path:
        target = recs[-1]
        path, rel = file_of(tmp_path, target.phy)
    keep = recs.index(target)
    with path.open("r+b") as f:
        f.seek(rel)
        f.write(b"\0" * (FILE - rel))
    await check_prefix(tmp_path, recs, keep)


async def test_garbage_tail(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    end = recs[-1].phy + recs[-1].size
    path, rel = file_of(tmp_path, end)
    with path.open("r+b") as f:
        f.seek(rel)
        f.write(random.Random(1).randbytes(min(300, FILE - rel)))
    report = await check_prefix(tmp_path, recs, N)
    assert report.truncated_bytes == min(300, FILE - rel)
    assert report.stop_reason == "INVALID"


async def test_flipped_body_byte_in_the_last_record(tmp_path: Path) -> None:
    """Nothing valid follows the damaged record: a torn tail, truncated. (Damage followed by
    valid records costs only itself: tests/unit/store/test_recovery_damage.py.)"""
    back = 1
    recs = await write(tmp_path, N)
    victim = recs[-back]
    same_file = [r for r in recs if r.phy // FILE == victim.phy // FILE]
    assert victim in same_file
    path, rel = file_of(tmp_path, victim.phy)
    with path.open("r+b") as f:
        f.seek(rel + victim.size - 30)  # inside the body (topic + props are short)
        b = f.read(1)
        f.seek(rel + victim.size - 30)
        f.write(bytes([b[0] ^ 0xFF]))
    # CRC fails at the victim: it is the tail, dropped
    await check_prefix(tmp_path, recs, N - back)


async def test_garbage_next_file_is_dropped(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    end = recs[-1].phy + recs[-1].size
    nxt = commitlog_dir(tmp_path) / offset_to_file_name(end - end % FILE + FILE)
    nxt.write_bytes(random.Random(2).randbytes(FILE))
    await check_prefix(tmp_path, recs, N)


async def test_consume_queues_deleted_are_rebuilt(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    async with MessageStore(cfg(tmp_path)):
        pass  # clean close
    shutil.rmtree(consume_queue_root(tmp_path))
    async with MessageStore(cfg(tmp_path)) as store:
        for q in range(3):
            mine = [r for r in recs if r.queue_id == q]
            bufs = await pull_all(store, q)
            assert [m.body for m in decode_records(b"".join(bufs))] == [r.body for r in mine]
    await check_prefix(tmp_path, recs, N)


async def test_consume_queue_tail_lost_is_redispatched(tmp_path: Path) -> None:
    recs = await write(tmp_path, N)
    # zero the last consume-queue file of queue 0 (as if its pages never reached disk)
    qdir = consume_queue_root(tmp_path) / "T" / "0"
    last = sorted(qdir.iterdir())[-1]
    last.write_bytes(b"\0" * last.stat().st_size)
    await check_prefix(tmp_path, recs, N)


@pytest.mark.parametrize("damage", ["zeroed", "truncated"])
async def test_consume_queue_files_lost_beyond_the_last_three_are_redispatched(
    tmp_path: Path, damage: str
) -> None:
    """Recovery takes every consume-queue file before the last three as full (RocketMQ's
    rule). With small files a crash can lose more than those: the units of every file of
    queue 0 are gone here (zeroed, or the files cut to nothing, as a power cut leaves
    files whose pages never reached the disk), and all of them come back from the
    commitlog."""
    recs = await write(tmp_path, 2 * N)
    qdir = consume_queue_root(tmp_path) / "T" / "0"
    files = sorted(qdir.iterdir())
    assert len(files) >= 5
    for f in files:
        if damage == "zeroed":
            f.write_bytes(b"\0" * f.stat().st_size)
        else:
            os.truncate(f, 0)
    with structlog.testing.capture_logs() as logs:
        await check_prefix(tmp_path, recs, 2 * N)
    # Recovery put the queue's end before the lost units (not past them, to be repaired).
    assert not [e for e in logs if e["event"] == "consume_queue_unit_repaired"]


async def test_a_zeroed_unit_in_a_file_taken_as_full_is_written_again(tmp_path: Path) -> None:
    """A unit zeroed in the middle of an older file, which recovery takes as full: the
    redispatch writes it again instead of skipping it as already there."""
    recs = await write(tmp_path, 2 * N)
    first = sorted((consume_queue_root(tmp_path) / "T" / "0").iterdir())[0]
    data = bytearray(first.read_bytes())
    data[20:40] = bytes(20)  # queue offset 1
    first.write_bytes(bytes(data))
    with structlog.testing.capture_logs() as logs:
        await check_prefix(tmp_path, recs, 2 * N)
    repaired = [e for e in logs if e["event"] == "consume_queue_unit_repaired"]
    assert [(e["queue_id"], e["queue_offset"]) for e in repaired] == [(0, 1)]


def test_scanner_statuses() -> None:
    m = mk(1)
    rec = bytes(encode_record(m, 0, 0, 5))
    buf = bytearray(1024)
    buf[: len(rec)] = rec
    rec2 = bytes(encode_record(m, 1, len(rec), 6))
    buf[len(rec) : len(rec) + len(rec2)] = rec2
    s = RecordScanner(lambda p, n: bytes(buf[p : p + n]), 0, len(buf))
    assert [r.queue_offset for r in s] == [0, 1]
    assert s.outcome is DispatchStatus.END
    assert s.end == len(rec) + len(rec2)
    # a record claiming another physical offset is invalid
    bad = bytes(encode_record(m, 0, 999, 5))
    s2 = RecordScanner(lambda p, n: bad[p : p + n] + bytes(1024), 0, 1024)
    assert list(s2) == []
    assert s2.outcome is DispatchStatus.INVALID


def test_light_check_agrees_with_check_record() -> None:
    from common.message import check_record
    from store._recovery import has_torn_tail, light_check

    m = mk(3)
    rec = bytes(encode_record(m, 7, 4096, 5))
    cases = {
        "ok": rec,
        "crc": rec[:100] + bytes([rec[100] ^ 1]) + rec[101:],
        "short": rec[:-5],
        "zeros": bytes(200),
        "garbage": b"\x7f" * 200,
    }
    for name, buf in cases.items():
        full = check_record(buf, 0)
        light = light_check(buf, 0, True, 1 << 20)
        assert light.status is full.status, name
        if full.status is DispatchStatus.OK:
            assert (light.size, light.commit_log_offset, light.store_timestamp) == (
                full.size,
                4096,
                5,
            )
    # a torn (zeroed) end of the properties passes the lengths but not the torn-tail check
    torn = rec[:-3] + b"\0\0\0"
    assert light_check(torn, 0, True, 1 << 20).status is DispatchStatus.OK
    assert has_torn_tail(torn, 0, len(torn), 0)
    assert not has_torn_tail(rec, 0, len(rec), 0)


async def test_abnormal_recovery_starts_from_checkpoint_file(tmp_path: Path) -> None:
    """After a crash, the scan starts at the last file whose first record is older than the
    checkpoint (minus 3 s), not at the first file."""
    now = [1_700_000_000.0]
    config = cfg(tmp_path)
    async with MessageStore(config, clock=lambda: now[0]) as store:
        for i in range(60):
            now[0] += 10  # 10 s between messages: each file starts well apart
            await store.put_message(mk(i))
        await store.flush_service.flush_commitlog()
        await store.flush_service.flush_consume_queues()  # writes the checkpoint
        for i in range(60, 70):
            now[0] += 10
            await store.put_message(mk(i))
        store.simulate_crash()
    async with MessageStore(config, clock=lambda: now[0]) as store:
        assert store.recovery is not None
        assert store.recovery.scan_from > 0
        assert store.recovery.records < 70
        assert store.get_max_offset_in_queue("T", 0) == len([i for i in range(70) if i % 3 == 0])


async def test_abnormal_recovery_reindexes_what_the_index_had_not_written_back(
    tmp_path: Path,
) -> None:
    """The index file being written is written back every flush_interval_index_ms, not every
    flush round: after an OS crash it may hold only what its last write-back wrote. Recovery
    scans from the checkpoint's index timestamp (older than the commitlog's and consume
    queues') and indexes every record from there again, even when the header page reached
    the disk later than the entries (it claims records indexed whose entries were lost)."""
    now = [1_700_000_000.0]
    config = cfg(tmp_path)
    idx_dir = tmp_path / "index"
    async with MessageStore(config, clock=lambda: now[0]) as store:
        for i in range(30):
            now[0] += 10
            await store.put_message(mk(i))
        await store.flush_service.flush_commitlog()
        await store.flush_service.flush_consume_queues()  # the first round writes the index back
        on_disk = {p.name: p.read_bytes() for p in idx_dir.iterdir()}
        for i in range(30, 60):
            now[0] += 10
            await store.put_message(mk(i))
        await store.flush_service.flush_commitlog()
        await store.flush_service.flush_consume_queues()  # within 10 s: index not written back
        ckpt = store.checkpoint
        assert ckpt.index_msg_timestamp < ckpt.logics_msg_timestamp - 3000
        store.simulate_crash()
    # The OS lost every index page not written back, except the header page.
    for p in idx_dir.iterdir():
        if p.name not in on_disk:
            p.unlink()
            continue
        header = p.read_bytes()[:HEADER_SIZE]
        p.write_bytes(header + on_disk[p.name][HEADER_SIZE:])
    async with MessageStore(config, clock=lambda: now[0]) as store:
        for i in range(60):
            assert len(store.query_message("T", f"key{i}", 10, 0, 2**62).buffers) == 1, i
        now[0] += 10
        await store.put_message(mk(60))
    async with MessageStore(config, clock=lambda: now[0]) as store:
        for i in range(61):
            assert len(store.query_message("T", f"key{i}", 10, 0, 2**62).buffers) == 1, i

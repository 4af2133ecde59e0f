"""`MessageStore.truncate_commitlog`: a store cut online at a record boundary ends exactly
there (consume queues, index, checkpoint, flush positions, replica cursor), with the bytes
past the cut gone from disk when the call returns, so that a crash right after recovers to
the cut; appends (replica bytes or puts) continue from there, and a reopen gives the same
store. Offsets that are no boundary, or out of range, change nothing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.message import MessageInner, decode_record, decode_records
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig
from store.checkpoint import StoreCheckpoint
from store.paths import (
    abort_path,
    checkpoint_path,
    commitlog_dir,
    consume_queue_dir,
    offset_to_file_name,
)

pytestmark = pytest.mark.unit

FILE = 4096
N = 100
QUEUES = 3


def cfg(root: Path, **kw: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path_root_dir": root,
        "mapped_file_size_commitlog": FILE,
        "mapped_file_size_consume_queue": 8 * 20,
        "max_hash_slot_num": 64,
        "max_index_num": 64,  # several index files
    }
    base.update(kw)
    return StoreConfig.model_validate(base)


@dataclass
class Rec:
    phy: int
    size: int
    queue_id: int
    queue_offset: int
    body: bytes
    key: str
    ts: int

    @property
    def end(self) -> int:
        return self.phy + self.size


class Clock:
    """One second per message, so that every record has its own store time."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def mk(i: int, tag: bytes = b"body") -> MessageInner:
    return MessageInner(
        "T",
        tag + f"-{i}-".encode() * (5 + i % 7),
        queue_id=i % QUEUES,
        properties={"KEYS": f"key{i}"},
        born_timestamp=1000 + i,
        store_host=("127.0.0.1", 10911),
    )


async def put(
    store: MessageStore, first: int, n: int, clock: Clock, tag: bytes = b"body"
) -> list[Rec]:
    out: list[Rec] = []
    for i in range(first, first + n):
        clock.now += 1
        m = mk(i, tag)
        r = await store.put_message(m)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        out.append(
            Rec(
                r.append.wrote_offset,
                r.append.wrote_bytes,
                m.queue_id,
                r.append.queue_offset,
                m.body,
                f"key{i}",
                r.append.store_timestamp,
            )
        )
    return out


def cut_points(recs: list[Rec]) -> dict[str, int]:
    """Boundaries of each kind: a record in the middle of the last file, one in the middle
    of an early file (several files after it), the first record of a file (a file start,
    the previous file ending with its BLANK filler), the BLANK filler's start (the end of a
    file's last record), and the first offset (an empty log)."""
    files = sorted({r.phy // FILE for r in recs})
    assert len(files) >= 4, files
    last_file = [r for r in recs if r.phy // FILE == files[-1]]
    second = [r for r in recs if r.phy // FILE == files[1]]
    return {
        "mid_last_file": last_file[len(last_file) // 2].phy,
        "mid_early_file": second[len(second) // 2].phy,
        "file_start": next(r.phy for r in recs if r.phy // FILE == files[2]),
        "blank": second[-1].end,
        "min": 0,
    }


def after_cut(offset: int, size: int) -> int:
    """Where a record of `size` bytes put after a cut at `offset` goes: there, or at the
    next file's start when it does not fit before the BLANK filler's header (a cut at the
    filler's start)."""
    room = FILE - offset % FILE
    return offset if size + 8 <= room else offset + room


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


async def assert_holds(
    store: MessageStore, kept: list[Rec], cut: list[Rec], end: int | None = None
) -> None:
    """The store holds exactly `kept`: max offset (`end`, by default the last record's
    end), queues, pulls, lookups, index."""
    if end is None:
        end = kept[-1].end if kept else store.min_phy_offset
    assert store.max_phy_offset == end
    assert store.read_commitlog(end, 1 << 16) is None
    for q in range(QUEUES):
        mine = [r for r in kept if r.queue_id == q]
        assert store.get_max_offset_in_queue("T", q) == len(mine)
        msgs = decode_records(b"".join(await pull_all(store, q)))
        assert [m.body for m in msgs] == [r.body for r in mine]
        assert [m.queue_offset for m in msgs] == [r.queue_offset for r in mine]
        assert [m.commit_log_offset for m in msgs] == [r.phy for r in mine]
        res = await store.get_message("g", "T", q, len(mine), 32, 1 << 24)
        if mine:
            assert res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        else:
            assert res.status in (
                GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
            )
        assert res.buffers == []
    for r in kept:
        found = store.query_message("T", r.key, 10, 0, 2**62).buffers
        assert [decode_record(b).body for b in found] == [r.body], r.key
    for r in cut:
        assert store.query_message("T", r.key, 10, 0, 2**62).buffers == [], r.key
        raw = store.read_record(r.phy)  # None, or a record written there since
        assert raw is None or decode_record(raw).body != r.body


def assert_cut_on_disk(root: Path, offset: int) -> None:
    """No byte past `offset` is left in the commitlog files: the one holding it is zero from
    there, the later ones are gone (or all zeros: a file prepared ahead since)."""
    for path in sorted(commitlog_dir(root).iterdir()):
        start = int(path.name)
        data = path.read_bytes()
        if start + FILE <= offset:
            continue
        rel = max(0, offset - start)
        assert not any(data[rel:]), (path.name, rel)


def snapshot(store: MessageStore, root: Path) -> object:
    files = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(commitlog_dir(root).iterdir())
    }
    queues = {
        key: (cq.min_offset_in_queue, cq.max_offset_in_queue, cq.max_physic_offset)
        for key, cq in store.dispatcher.consume_queues.items()
    }
    return (
        store.min_phy_offset,
        store.max_phy_offset,
        [(mf.path.name, mf.wrote_position) for mf in store.commitlog.mfq.files],
        files,
        queues,
        dict(store.commitlog.topic_queue_table),
        store.commitlog.last_store_timestamp,
        [f.file_name for f in store.dispatcher.index.files] if store.dispatcher.index else [],
    )


@pytest.mark.parametrize("where", ["mid_last_file", "mid_early_file", "file_start", "blank", "min"])
async def test_truncate_then_put_and_reopen(tmp_path: Path, where: str) -> None:
    clock = Clock()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        recs = await put(store, 0, N, clock)
        offset = cut_points(recs)[where]
        kept = [r for r in recs if r.phy < offset]
        cut = [r for r in recs if r.phy >= offset]
        assert cut
        before = store.max_phy_offset
        cq_files = {
            q: len(list(consume_queue_dir(tmp_path, "T", q).iterdir())) for q in range(QUEUES)
        }

        assert await store.truncate_commitlog(offset) == before - offset

        assert_cut_on_disk(tmp_path, offset)
        await assert_holds(store, kept, cut, offset)
        mfq = store.commitlog.mfq
        assert mfq.flushed_where <= offset
        assert all(mf.flushed_position <= mf.wrote_position for mf in mfq.files)
        assert store.commitlog.last_store_timestamp <= (kept[-1].ts if kept else 0)
        if where == "mid_early_file":  # the queues' files past the cut are gone too
            for q in range(QUEUES):
                left = len(list(consume_queue_dir(tmp_path, "T", q).iterdir()))
                assert left < cq_files[q]
        # Puts go on from the cut, with the queue offsets that follow the kept records.
        more = await put(store, N, 30, clock, tag=b"again")
        assert more[0].phy == after_cut(offset, more[0].size)
        for q in range(QUEUES):
            first = len([r for r in kept if r.queue_id == q])
            offsets = [r.queue_offset for r in more if r.queue_id == q]
            assert offsets == list(range(first, first + len(offsets)))
        await assert_holds(store, kept + more, cut)
        state = snapshot(store, tmp_path)
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        assert store.recovery is not None
        assert store.recovery.truncated_bytes == 0
        await assert_holds(store, kept + more, cut)
        assert snapshot(store, tmp_path) == state


@pytest.mark.parametrize("where", ["mid_last_file", "mid_early_file", "file_start", "blank", "min"])
async def test_crash_right_after_truncation_recovers_to_the_cut(tmp_path: Path, where: str) -> None:
    clock = Clock()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        recs = await put(store, 0, N, clock)
        # Everything durable and checkpointed first: nothing but the cut may take it away.
        await store.flush_service.flush_all()
        assert StoreCheckpoint(checkpoint_path(tmp_path)).physic_msg_timestamp == recs[-1].ts
        offset = cut_points(recs)[where]
        kept = [r for r in recs if r.phy < offset]
        cut = [r for r in recs if r.phy >= offset]
        await store.truncate_commitlog(offset)
        # The checkpoint on disk names no store time past the last record kept.
        cp = StoreCheckpoint(checkpoint_path(tmp_path))
        limit = kept[-1].ts if kept else 0
        assert cp.physic_msg_timestamp <= limit
        assert cp.logics_msg_timestamp <= limit
        assert cp.index_msg_timestamp <= limit
        store.simulate_crash()
    assert abort_path(tmp_path).exists()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        assert not store.last_exit_ok
        assert store.recovery is not None
        assert store.recovery.valid_end == offset
        assert store.recovery.truncated_bytes == 0
        await assert_holds(store, kept, cut, offset)
        more = await put(store, N, 10, clock, tag=b"after")
        assert more[0].phy == after_cut(offset, more[0].size)
        store.simulate_crash()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        await assert_holds(store, kept + more, cut)


async def test_offsets_that_are_no_boundary_or_out_of_range_change_nothing(
    tmp_path: Path,
) -> None:
    clock = Clock()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        recs = await put(store, 0, N, clock)
        points = cut_points(recs)
        mid = recs[len(recs) // 2]
        state = snapshot(store, tmp_path)
        bad = {
            "inside a record": mid.phy + 1,
            "inside a record's body": mid.end - 3,
            "one byte before a record": mid.phy - 1,
            "inside the BLANK filler": points["blank"] + 8,
            "last byte of a file with a filler": points["file_start"] - 1,
        }
        for what, offset in bad.items():
            with pytest.raises(ValueError, match="not a record boundary"):
                await store.truncate_commitlog(offset)
            assert snapshot(store, tmp_path) == state, what
        for offset in (-1, store.max_phy_offset + 1, store.max_phy_offset + FILE):
            with pytest.raises(ValueError, match="outside the stored range"):
                await store.truncate_commitlog(offset)
            assert snapshot(store, tmp_path) == state, offset
        # At the max offset: nothing to drop, nothing changes.
        assert await store.truncate_commitlog(store.max_phy_offset) == 0
        assert snapshot(store, tmp_path) == state
        await assert_holds(store, recs, [])
        # The store still takes puts right after its records.
        more = await put(store, N, 3, clock)
        assert more[0].phy == recs[-1].end


async def test_the_same_keys_put_again_are_found_once_with_their_new_bodies(
    tmp_path: Path,
) -> None:
    """Index entries of cut records stay in the file sealed at the cut; a query never
    returns a cut record, and finds the new record of the same key exactly once."""
    clock = Clock()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        recs = await put(store, 0, N, clock)
        offset = cut_points(recs)["mid_early_file"]
        kept = [r for r in recs if r.phy < offset]
        await store.truncate_commitlog(offset)
        again = await put(store, len(kept), N - len(kept), clock, tag=b"second")
        assert [r.key for r in again] == [r.key for r in recs[len(kept) :]]
        await assert_holds(store, kept + again, [])
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        await assert_holds(store, kept + again, [])


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_flush_positions_follow_the_cut(tmp_path: Path, flush: str) -> None:
    clock = Clock()
    config = cfg(tmp_path, flush_disk_type=flush)
    async with MessageStore(config, clock=clock) as store:
        recs = await put(store, 0, N, clock)
        await store.flush_service.flush_commitlog()
        mfq = store.commitlog.mfq
        assert mfq.flushed_where == recs[-1].end
        offset = cut_points(recs)["mid_last_file"]
        await store.truncate_commitlog(offset)
        assert mfq.flushed_where == offset
        last = mfq.last_file
        assert last is not None
        assert last.wrote_position == last.flushed_position == offset - last.file_from_offset
        more = await put(store, N, 5, clock)  # SYNC_FLUSH: each waits for its own fsync
        if flush == "SYNC_FLUSH":
            assert mfq.flushed_where == more[-1].end
        else:
            assert offset <= mfq.flushed_where <= more[-1].end
        await store.flush_service.flush_commitlog()
        assert mfq.flushed_where == more[-1].end
        kept = [r for r in recs if r.phy < offset]
        await assert_holds(store, kept + more, [r for r in recs if r.phy >= offset])


async def stream(master: MessageStore, slave: MessageStore, chunk: int) -> None:
    """What an HA connection does: the slave's max offset -> the master's bytes -> slave."""
    while True:
        at = slave.max_phy_offset
        data = master.read_commitlog(at, chunk)
        if data is None:
            return
        await slave.append_replica(at, data)


def commitlog_bytes(store: MessageStore) -> dict[str, bytes]:
    return {mf.path.name: mf.path.read_bytes() for mf in store.commitlog.mfq.files}


async def test_a_replaced_master_cuts_its_tail_and_follows_the_new_master(
    tmp_path: Path,
) -> None:
    """The old master took records its group never acknowledged; the new master has the
    acknowledged prefix and records of its own after it. The old master cuts at the end of
    the common prefix and replicates the new master's bytes from there: both end byte for
    byte the same, queues and index included, also after a reopen."""
    clock = Clock()
    async with (
        MessageStore(cfg(tmp_path / "old"), clock=clock) as old,
        MessageStore(cfg(tmp_path / "new"), clock=clock) as new,
    ):
        recs = await put(old, 0, N, clock)
        common = cut_points(recs)["mid_early_file"]
        # The new master got the prefix, in frames that leave records incomplete between them.
        while new.max_phy_offset < common:
            at = new.max_phy_offset
            data = old.read_commitlog(at, min(97, common - at))
            assert data is not None
            await new.append_replica(at, data)
        theirs = await put(new, 1000, 60, clock, tag=b"new-master")
        kept = [r for r in recs if r.phy < common]
        cut = [r for r in recs if r.phy >= common]

        assert await old.truncate_commitlog(common) == recs[-1].end - common
        await stream(new, old, 113)

        assert old.max_phy_offset == new.max_phy_offset
        assert commitlog_bytes(old) == commitlog_bytes(new)
        await assert_holds(old, kept + theirs, cut)
        await assert_holds(new, kept + theirs, cut)
        for q in range(QUEUES):
            assert old.get_max_offset_in_queue("T", q) == new.get_max_offset_in_queue("T", q)
        state = snapshot(old, tmp_path / "old")
    async with MessageStore(cfg(tmp_path / "old"), clock=clock) as old:
        await assert_holds(old, kept + theirs, cut)
        assert snapshot(old, tmp_path / "old") == state
        # Later the old master becomes master again: puts follow the replicated records.
        more = await put(old, 2000, 5, clock)
        assert more[0].phy == theirs[-1].end
        assert next(r.queue_offset for r in more if r.queue_id == 0) == len(
            [r for r in kept + theirs if r.queue_id == 0]
        )


async def test_a_slave_cuts_a_record_still_incomplete_and_takes_it_again(
    tmp_path: Path,
) -> None:
    """A replica append left a record incomplete (its max offset is inside it): a cut at
    its start drops the partial bytes and the cursor's pending state; the bytes sent again
    from there complete it."""
    clock = Clock()
    async with (
        MessageStore(cfg(tmp_path / "m"), clock=clock) as master,
        MessageStore(cfg(tmp_path / "s"), clock=clock) as slave,
    ):
        recs = await put(master, 0, 40, clock)
        target = recs[25]
        while slave.max_phy_offset < target.phy + 10:
            at = slave.max_phy_offset
            data = master.read_commitlog(at, min(300, target.phy + 10 - at))
            assert data is not None
            await slave.append_replica(at, data)
        assert slave.max_phy_offset == target.phy + 10  # 10 bytes of recs[25]
        await assert_holds_queues(slave, recs[:25])
        with pytest.raises(ValueError, match="not a record boundary"):
            await slave.truncate_commitlog(target.phy + 5)
        assert await slave.truncate_commitlog(target.phy) == 10
        assert slave.max_phy_offset == target.phy
        await stream(master, slave, 333)
        assert commitlog_bytes(slave) == commitlog_bytes(master)
        await assert_holds(slave, recs, [])


async def assert_holds_queues(store: MessageStore, recs: list[Rec]) -> None:
    for q in range(QUEUES):
        assert store.get_max_offset_in_queue("T", q) == len([r for r in recs if r.queue_id == q])


async def test_a_slave_that_begins_past_zero_cuts_down_to_its_first_offset(
    tmp_path: Path,
) -> None:
    """A slave whose log begins at a later file of its master (its min offset is not 0) cut
    to its min offset is empty, refuses offsets below it, and takes the master's bytes from
    there again."""
    clock = Clock()
    async with (
        MessageStore(cfg(tmp_path / "m"), clock=clock) as master,
        MessageStore(cfg(tmp_path / "s"), clock=clock) as slave,
    ):
        recs = await put(master, 0, N, clock)
        start = 2 * FILE
        data = master.read_commitlog(start, FILE)
        assert data is not None
        await slave.append_replica(start, data)
        await stream(master, slave, 1000)
        assert slave.min_phy_offset == start
        assert slave.max_phy_offset == master.max_phy_offset
        state = snapshot(slave, tmp_path / "s")
        for offset in (0, FILE, start - 1):
            with pytest.raises(ValueError, match="outside the stored range"):
                await slave.truncate_commitlog(offset)
        assert snapshot(slave, tmp_path / "s") == state

        assert await slave.truncate_commitlog(start) == master.max_phy_offset - start
        assert slave.min_phy_offset == slave.max_phy_offset == start
        assert_cut_on_disk(tmp_path / "s", start)
        for q in range(QUEUES):
            cq = slave.dispatcher.find_cq("T", q)
            assert cq is None or cq.max_offset_in_queue == cq.min_offset_in_queue
        ours = [r for r in recs if r.phy >= start]
        for r in ours:
            assert slave.query_message("T", r.key, 10, 0, 2**62).buffers == []

        await stream(master, slave, 1000)
        assert slave.max_phy_offset == master.max_phy_offset
        assert commitlog_bytes(slave) == {
            k: v for k, v in commitlog_bytes(master).items() if int(k) >= start
        }
        for r in ours:
            found = slave.query_message("T", r.key, 10, 0, 2**62).buffers
            assert [decode_record(b).body for b in found] == [r.body]
    async with MessageStore(cfg(tmp_path / "s"), clock=clock) as slave:
        assert slave.min_phy_offset == start
        assert slave.max_phy_offset == recs[-1].end


async def test_damaged_regions_past_the_cut_are_not_carried_over(tmp_path: Path) -> None:
    """A damaged region found by recovery lies past the cut: records written there later
    are served, also after a reopen (the region's copy is not read back as damage)."""
    clock = Clock()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        recs = await put(store, 0, 60, clock)
        store.simulate_crash()
    victim = next(r for r in recs if r.phy > FILE // 2)
    assert victim.phy < FILE
    path = commitlog_dir(tmp_path) / offset_to_file_name(0)
    data = bytearray(path.read_bytes())
    data[victim.end - 30] ^= 0xFF  # a body byte: the CRC fails
    path.write_bytes(bytes(data))
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        assert [(r.offset, r.length) for r in store.damaged_regions] == [(victim.phy, victim.size)]
        with pytest.raises(ValueError, match="not a record boundary"):
            await store.truncate_commitlog(victim.phy + 4)
        kept = [r for r in recs if r.phy < victim.phy]
        await store.truncate_commitlog(victim.phy)
        more = await put(store, 100, 40, clock, tag=b"fresh")
        assert more[0].phy == victim.phy
        await assert_holds(store, kept + more, [r for r in recs if r.phy > victim.phy])
    assert not (tmp_path / "damaged" / f"{victim.phy}-{victim.size}.bin").exists()
    async with MessageStore(cfg(tmp_path), clock=clock) as store:
        await assert_holds(store, kept + more, [r for r in recs if r.phy > victim.phy])

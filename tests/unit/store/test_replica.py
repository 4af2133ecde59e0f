"""Master/slave replication in the store: `read_commitlog` on a master, `append_replica` on a
slave. The slave must end byte for byte the master's commitlog, with the same consume queues,
a working index and its arrival listeners told, whatever the frame sizes (records split
across frames, BLANK fillers), across restarts, and refusing what does not fit."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from pathlib import Path

import pytest

from common.message import (
    BLANK_MAGIC_CODE,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_PREPARED_TYPE,
    DispatchRequest,
    MessageInner,
    decode_record,
)
from common.schedule import SCHEDULE_TOPIC, level_delivery_ms, parse_delay_levels
from store import (
    MessageStore,
    PutMessageStatus,
    ReplicaDataError,
    ReplicaOffsetError,
    StoreClosedError,
    StoreConfig,
)
from store.checkpoint import StoreCheckpoint
from store.paths import checkpoint_path, commitlog_dir, offset_to_file_name
from tests.helpers import StagingGuard, wait_until

FILE = 64 * 1024
TOPICS = ("TopicA", "TopicB")
BODY_SIZES = (0, 1, 17, 120, 400, 900, 2500, 9000)


def cfg(root: Path, **kw: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path_root_dir": root,
        "mapped_file_size_commitlog": FILE,
        "mapped_file_size_consume_queue": 32 * 20,
        "max_hash_slot_num": 64,
        "max_index_num": 256,
    }
    base.update(kw)
    return StoreConfig.model_validate(base)


def _msg(i: int, topic: str, qid: int, size: int, **props: str) -> MessageInner:
    return MessageInner(
        topic,
        bytes((i + k) % 251 for k in range(size)),
        queue_id=qid,
        properties={
            PROPERTY_KEYS: f"k{i} shared",
            PROPERTY_TAGS: f"tag{i % 3}",
            PROPERTY_UNIQ_KEY: f"U{i:08d}",
            **props,
        },
        born_timestamp=1_700_000_000_000 + i,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )


async def fill(store: MessageStore, count: int, seed: int = 1, first: int = 0) -> None:
    """`count` messages of varied sizes: single puts, batches, transaction PREPARED records
    (no consume-queue unit) and delay-level records."""
    rng = random.Random(seed)
    i = first
    end = first + count
    while i < end:
        topic = rng.choice(TOPICS)
        qid = rng.randrange(4)
        kind = rng.random()
        if kind < 0.2:
            n = min(rng.randint(2, 6), end - i)
            msgs = [_msg(i + k, topic, qid, rng.choice(BODY_SIZES)) for k in range(n)]
            r = await store.put_messages(msgs)
            i += n
        elif kind < 0.25:
            m = _msg(i, topic, qid, rng.choice(BODY_SIZES))
            m.sys_flag = TRANSACTION_PREPARED_TYPE
            r = await store.put_message(m)
            i += 1
        elif kind < 0.3:
            level = rng.randint(1, 4)
            m = _msg(i, SCHEDULE_TOPIC, level - 1, 50, **{PROPERTY_DELAY: str(level)})
            m.tags_code = 1_700_000_000_000 + i  # what the broker's clock gives; not replicated
            r = await store.put_message(m)
            i += 1
        else:
            r = await store.put_message(_msg(i, topic, qid, rng.choice(BODY_SIZES)))
            i += 1
        assert r.status is PutMessageStatus.PUT_OK, r


async def stream(
    master: MessageStore,
    slave: MessageStore,
    chunks: Iterable[int],
    *,
    until: int | None = None,
) -> int:
    """What an HA connection does: the slave's max offset -> the master's bytes from there
    -> the slave, frame sizes taken in turn from `chunks`, up to `until` (default: the
    master's max offset). Returns the number of frames."""
    frames = 0
    sizes = itertools.cycle(chunks)
    while True:
        at = slave.max_phy_offset
        limit = next(sizes) if until is None else min(next(sizes), until - at)
        if limit <= 0:
            return frames
        data = master.read_commitlog(at, limit)
        if data is None:
            return frames
        await slave.append_replica(at, data)
        frames += 1


class Arrivals:
    def __init__(self, store: MessageStore) -> None:
        self.last: dict[tuple[str, int], int] = {}
        self.calls = 0
        store.add_arrival_listener(self)

    def __call__(self, topic: str, queue_id: int, new_max: int) -> None:
        self.calls += 1
        self.last[(topic, queue_id)] = new_max


def commitlog_files(store: MessageStore) -> dict[str, bytes]:
    return {mf.path.name: mf.path.read_bytes() for mf in store.commitlog.mfq.files}


def queue_units(store: MessageStore, topic: str, qid: int) -> list[tuple[int, int, int]]:
    cq = store.dispatcher.find_cq(topic, qid)
    assert cq is not None
    units = []
    for off in range(cq.min_offset_in_queue, cq.max_offset_in_queue):
        unit = cq.get_unit(off)
        assert unit is not None
        units.append(unit)
    return units


async def assert_same(
    master: MessageStore, slave: MessageStore, arrivals: Arrivals | None = None
) -> None:
    """The slave holds what the master holds from the slave's first file on."""
    assert slave.max_phy_offset == master.max_phy_offset
    start = slave.min_phy_offset
    ours = commitlog_files(slave)
    theirs = {k: v for k, v in commitlog_files(master).items() if int(k) >= start}
    assert sorted(ours) == sorted(theirs)
    for name, data in theirs.items():
        assert ours[name] == data, name  # byte for byte, BLANK fillers included
    delays = parse_delay_levels(master.config.message_delay_level)
    queues = 0
    for (topic, qid), mcq in master.dispatcher.consume_queues.items():
        scq = slave.dispatcher.find_cq(topic, qid)
        mine = [u for u in queue_units(master, topic, qid) if u[0] >= start]
        if not mine:
            assert scq is None or scq.max_offset_in_queue == scq.min_offset_in_queue
            continue
        queues += 1
        assert scq is not None, (topic, qid)
        first = mcq.max_offset_in_queue - len(mine)
        assert scq.min_offset_in_queue == first
        assert scq.max_offset_in_queue == mcq.max_offset_in_queue
        units = queue_units(slave, topic, qid)
        assert [u[:2] for u in units] == [u[:2] for u in mine]
        if topic == SCHEDULE_TOPIC:
            # Delivery time from the record's store time (as the master's recovery has it).
            for phy, size, tags in units:
                raw = slave.read_record(phy, size)
                assert raw is not None
                m = decode_record(raw)
                level = int(m.properties[PROPERTY_DELAY])
                assert tags == level_delivery_ms(m.store_timestamp, level, delays)
        else:
            assert units == mine
        got_m = await master.get_message("g", topic, qid, first, 10_000, 1 << 30)
        got_s = await slave.get_message("g", topic, qid, first, 10_000, 1 << 30)
        assert got_s.status == got_m.status
        assert got_s.buffers == got_m.buffers
        assert got_s.queue_offsets == got_m.queue_offsets
        assert got_s.next_begin_offset == got_m.next_begin_offset
        if arrivals is not None:
            assert arrivals.last[(topic, qid)] == scq.max_offset_in_queue
    assert queues > 0
    # The index finds keys on the slave: a unique key and a key shared by every message.
    found = 0
    for (topic, qid), cq in slave.dispatcher.consume_queues.items():
        if topic not in TOPICS or cq.max_offset_in_queue == cq.min_offset_in_queue:
            continue
        units = queue_units(slave, topic, qid)
        for phy, size, _tags in units[:: max(1, len(units) // 3)]:
            raw = slave.read_record(phy, size)
            assert raw is not None
            uniq = decode_record(raw).properties[PROPERTY_UNIQ_KEY]
            res = slave.query_message(topic, uniq, 10, 0, 1 << 62)
            assert res.buffers == [raw]
            found += 1
    for topic in TOPICS:
        shared_m = master.query_message(topic, "shared", 10_000, 0, 1 << 62)
        shared_s = slave.query_message(topic, "shared", 10_000, 0, 1 << 62)
        assert sorted(shared_s.buffers) == sorted(
            b for b in shared_m.buffers if decode_record(b).commit_log_offset >= start
        )
    assert found > 0


async def test_read_commitlog_stops_at_file_and_write_position(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as master:
        assert master.read_commitlog(0, 100) is None  # empty
        await fill(master, 200)
        end = master.max_phy_offset
        assert end > 2 * FILE
        assert master.read_commitlog(end, 100) is None
        assert master.read_commitlog(end + FILE, 100) is None
        whole = master.read_commitlog(0, 1 << 20)
        assert whole is not None
        assert len(whole) == FILE
        assert master.read_commitlog(FILE - 10, 32768) == whole[-10:]
        last = end - end % FILE
        tail = master.read_commitlog(last, 1 << 20)
        assert tail is not None
        assert len(tail) == end - last
        assert master.read_commitlog(end - 3, 100) == tail[-3:]
        assert master.read_commitlog(5, 7) == whole[5:12]
        # The first file ends with the BLANK filler: its header, then zeros.
        size = master.commitlog.record_size_at(0)
        pos = 0
        while size is not None:
            pos += size
            size = master.commitlog.record_size_at(pos)
        blank = int.from_bytes(whole[pos + 4 : pos + 8], "big")
        assert blank == BLANK_MAGIC_CODE
        assert int.from_bytes(whole[pos : pos + 4], "big") == FILE - pos
        assert not any(whole[pos + 8 :])
        with pytest.raises(ValueError, match="max_bytes"):
            master.read_commitlog(0, 0)


async def test_read_commitlog_leaves_staged_bytes_out(
    tmp_path: Path, staging_guard: StagingGuard
) -> None:
    async with MessageStore(cfg(tmp_path)) as master:
        await fill(master, 5)
        before = master.max_phy_offset
        master.commitlog.reserve_ahead()  # the flush service does it every interval
        master.begin_staging()
        result, _ = master.put_messages_nowait([_msg(99, "TopicA", 0, 300)])
        assert result.status is PutMessageStatus.PUT_OK
        last = master.commitlog.mfq.last_file
        assert last is not None
        assert last.staged
        assert master.max_phy_offset > before
        assert before < FILE
        assert master.read_commitlog(before, 32768) is None  # not written yet
        written = master.read_commitlog(0, FILE)
        assert written is not None
        assert len(written) == before
        assert last.staged  # nothing drained
        master.end_staging()
        data = master.read_commitlog(before, 32768)
        assert data is not None
        assert len(data) == master.max_phy_offset - before
    assert staging_guard.runs == 1


CHUNKS = {
    "tiny": (7,),
    "32k": (32768,),
    "mixed": (7, 13, 91, 1000, 4099, 1, 32768, 200, 8),
}


@pytest.mark.parametrize("chunks", list(CHUNKS), ids=list(CHUNKS))
async def test_slave_becomes_byte_identical(tmp_path: Path, chunks: str) -> None:
    async with (
        MessageStore(cfg(tmp_path / "m")) as master,
        MessageStore(cfg(tmp_path / "s")) as slave,
    ):
        await fill(master, 400)
        assert len(master.commitlog.mfq.files) >= 5
        arrivals = Arrivals(slave)
        frames = await stream(master, slave, CHUNKS[chunks])
        assert frames >= master.max_phy_offset // max(CHUNKS[chunks])
        await assert_same(master, slave, arrivals)
        # More on the master: the slave follows from where it is.
        await fill(master, 40, seed=2, first=1000)
        await stream(master, slave, CHUNKS[chunks])
        await assert_same(master, slave, arrivals)


async def test_written_is_told_once_the_bytes_are_held_before_dispatch(tmp_path: Path) -> None:
    async with (
        MessageStore(cfg(tmp_path / "m")) as master,
        MessageStore(cfg(tmp_path / "s")) as slave,
    ):
        await fill(master, 60)
        arrivals = Arrivals(slave)
        seen: list[tuple[int, int, int]] = []
        at = 0
        while (data := master.read_commitlog(at, 3000)) is not None:

            def written(at: int = at, size: int = len(data)) -> None:
                # The commitlog holds the bytes; no record of them is dispatched yet.
                seen.append((at + size, slave.max_phy_offset, arrivals.calls))

            calls = arrivals.calls
            await slave.append_replica(at, data, written)
            assert seen[-1] == (at + len(data), at + len(data), calls)
            at += len(data)
        assert len(seen) >= 3
        # Refused bytes are not told.
        with pytest.raises(ReplicaOffsetError):
            await slave.append_replica(at + 1, b"x", lambda: seen.append((-1, -1, -1)))
        assert seen[-1][0] == at
        await assert_same(master, slave, arrivals)


async def test_slave_flushes_and_checkpoints(tmp_path: Path) -> None:
    fast = {
        "flush_interval_commitlog_ms": 10,
        "flush_commitlog_least_pages": 0,
        "flush_interval_consume_queue_ms": 10,
    }
    async with (
        MessageStore(cfg(tmp_path / "m")) as master,
        MessageStore(cfg(tmp_path / "s", **fast)) as slave,
    ):
        await fill(master, 120)
        await stream(master, slave, (5000,))
        mfq = slave.commitlog.mfq
        await wait_until(lambda: mfq.flushed_where == slave.max_phy_offset, what="flushed")
        ts = master.commitlog.last_store_timestamp
        assert slave.commitlog.last_store_timestamp == ts
        cp = slave.checkpoint
        await wait_until(
            lambda: cp.physic_msg_timestamp == ts and cp.logics_msg_timestamp == ts,
            what="checkpoint",
        )
        await wait_until(
            lambda: StoreCheckpoint(checkpoint_path(tmp_path / "s")).logics_msg_timestamp == ts,
            what="checkpoint file",
        )


def _record_end(store: MessageStore, at: int) -> int:
    size = store.commitlog.record_size_at(at)
    assert size is not None
    return at + size


def _boundary_after(store: MessageStore, offset: int) -> int:
    """The first record boundary at or after `offset` (within its file)."""
    pos = offset - offset % FILE
    while pos < offset:
        pos = _record_end(store, pos)
    return pos


async def test_offset_and_data_errors_change_nothing(tmp_path: Path) -> None:
    async with (
        MessageStore(cfg(tmp_path / "m")) as master,
        MessageStore(cfg(tmp_path / "s")) as slave,
    ):
        await fill(master, 150)
        first = master.read_commitlog(0, 100)
        assert first is not None
        for bad in (1, FILE // 2, FILE + 8, -FILE):
            with pytest.raises(ReplicaOffsetError) as info:
                await slave.append_replica(bad, first)
            assert str(bad) in str(info.value)
            assert info.value.expected == 0
        assert slave.commitlog.empty
        # A record split: its beginning arrives.
        at = _boundary_after(master, FILE + 3000)
        while _record_end(master, at) - at < 400:  # a record with a body of some size
            at = _record_end(master, at)
        await stream(master, slave, (1000,), until=at)
        assert slave.max_phy_offset == at
        rec_end = _record_end(master, at)
        await stream(master, slave, (7,), until=at + 40)
        assert slave.max_phy_offset == at + 40
        arrivals = Arrivals(slave)
        before = commitlog_files(slave)
        maxes = {k: cq.max_offset_in_queue for k, cq in slave.dispatcher.consume_queues.items()}
        rest = master.read_commitlog(at + 40, rec_end - at - 40)
        assert rest is not None
        for bad in (at + 39, at + 41, at, 0, at + 40 + FILE):
            with pytest.raises(ReplicaOffsetError) as info:
                await slave.append_replica(bad, rest)
            assert info.value.offset == bad
            assert info.value.expected == at + 40
            assert str(bad) in str(info.value)
            assert str(at + 40) in str(info.value)
        # Past the end of the file.
        with pytest.raises(ReplicaDataError, match="past the end"):
            await slave.append_replica(at + 40, bytes(2 * FILE))
        # The rest of the record, one body byte changed: the CRC fails.
        broken = bytearray(rest)
        broken[88 - 40 + 5] ^= 0xFF  # the body starts 88 bytes into a record
        with pytest.raises(ReplicaDataError, match="not a record"):
            await slave.append_replica(at + 40, bytes(broken))
        # Garbage after the record.
        nxt = master.read_commitlog(rec_end, 300)
        assert nxt is not None
        with pytest.raises(ReplicaDataError, match="not a record"):
            await slave.append_replica(at + 40, rest + b"\x00\x00\x01\x00garbage" + nxt)
        # A record claiming another offset (the record at `at` again, after itself).
        again = master.read_commitlog(at, rec_end - at)
        assert again is not None
        with pytest.raises(ReplicaDataError, match="not a record"):
            await slave.append_replica(at + 40, rest + again)
        assert slave.max_phy_offset == at + 40
        assert commitlog_files(slave) == before
        assert {
            k: cq.max_offset_in_queue for k, cq in slave.dispatcher.consume_queues.items()
        } == maxes
        assert arrivals.calls == 0
        await stream(master, slave, (32768,))
        await assert_same(master, slave)


@pytest.mark.parametrize("reopened", [False, True], ids=["fresh", "reopened"])
async def test_empty_slave_starts_at_the_masters_last_file(tmp_path: Path, reopened: bool) -> None:
    if reopened:
        # An empty slave that ran before: an empty file at 0 on disk.
        async with MessageStore(cfg(tmp_path / "s")):
            pass
        assert (commitlog_dir(tmp_path / "s") / offset_to_file_name(0)).exists()
    async with MessageStore(cfg(tmp_path / "m")) as master:
        await fill(master, 200)
        files = len(master.commitlog.mfq.files)
        assert files >= 4
        start = master.max_phy_offset - master.max_phy_offset % FILE
        async with MessageStore(cfg(tmp_path / "s")) as slave:
            arrivals = Arrivals(slave)
            data = master.read_commitlog(start, 32768)
            assert data is not None
            await slave.append_replica(start, data)
            assert slave.min_phy_offset == start
            await stream(master, slave, (999,))
            await assert_same(master, slave, arrivals)
            await fill(master, 200, seed=3, first=5000)
            await stream(master, slave, (32768,))
            await assert_same(master, slave, arrivals)
            assert slave.read_commitlog(0, 100) is None  # below the min offset
        names = sorted(p.name for p in commitlog_dir(tmp_path / "s").iterdir())
        assert offset_to_file_name(0) not in names
        async with MessageStore(cfg(tmp_path / "s")) as slave:
            assert slave.min_phy_offset == start
            await assert_same(master, slave)


def _blank_at(master: MessageStore, file_index: int) -> int:
    """Offset of the BLANK filler ending a file of the master."""
    pos = file_index * FILE
    size = master.commitlog.record_size_at(pos)
    while size is not None:
        pos += size
        size = master.commitlog.record_size_at(pos)
    head = master.read_commitlog(pos, 8)
    assert head is not None
    assert int.from_bytes(head[4:], "big") == BLANK_MAGIC_CODE
    return pos


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
@pytest.mark.parametrize("cut", ["header", "body", "blank_header", "blank_filler", "boundary"])
async def test_restart_mid_stream(tmp_path: Path, crash: bool, cut: str) -> None:
    async with MessageStore(cfg(tmp_path / "m")) as master:
        await fill(master, 250)
        slave = MessageStore(cfg(tmp_path / "s"))
        async with slave:
            arrivals = Arrivals(slave)
            if cut.startswith("blank"):
                blank = _blank_at(master, 1)
                await stream(master, slave, (1000,), until=blank)
                at = blank
                extra = 5 if cut == "blank_header" else 8 + 100
                expected = blank if cut == "blank_header" else 2 * FILE
            else:
                at = _boundary_after(master, FILE + 5000)
                await stream(master, slave, (1000,), until=at)
                size = _record_end(master, at) - at
                extra = {"header": 5, "body": size // 2, "boundary": 0}[cut]
                expected = at
            await stream(master, slave, (7,), until=at + extra)
            assert slave.max_phy_offset == at + extra
            told = arrivals.calls
            if crash:
                slave.simulate_crash()
        assert told > 0
        async with MessageStore(cfg(tmp_path / "s")) as slave:
            # Recovery ends the commitlog at the last complete record (or complete file).
            assert slave.max_phy_offset == expected
            arrivals = Arrivals(slave)
            await stream(master, slave, (7, 3000))
            await assert_same(master, slave)
            assert arrivals.calls > 0
        async with MessageStore(cfg(tmp_path / "s")) as slave:
            await assert_same(master, slave)


async def test_dispatch_failure_is_dispatched_by_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        MessageStore(cfg(tmp_path / "m")) as master,
        MessageStore(cfg(tmp_path / "s")) as slave,
    ):
        await fill(master, 150)
        blank = _blank_at(master, 0)
        # The last record of the first file: its frame also ends the file.
        pos, last = 0, 0
        while pos < blank:
            last, pos = pos, _record_end(master, pos)
        real = slave.dispatcher.replicated
        failed: list[int] = []

        def replicated(req: DispatchRequest) -> None:
            if req.commit_log_offset == last and not failed:
                failed.append(last)
                raise OSError(28, "No space left on device")
            real(req)

        monkeypatch.setattr(slave.dispatcher, "replicated", replicated)
        with pytest.raises(OSError, match="No space"):
            await stream(master, slave, (32768,))
        assert failed == [last]
        assert slave.max_phy_offset == FILE  # the bytes are written
        await stream(master, slave, (32768,))
        await assert_same(master, slave)


async def test_closed_store_refuses(tmp_path: Path) -> None:
    slave = MessageStore(cfg(tmp_path))
    async with slave:
        pass
    with pytest.raises(StoreClosedError):
        await slave.append_replica(0, b"x")
    with pytest.raises(StoreClosedError):
        slave.read_commitlog(0, 1)

"""MessageStore facade: puts, roll-over, gets with every status, lookups, index, listeners."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from common.message import (
    BLANK_MAGIC_CODE,
    TRANSACTION_PREPARED_TYPE,
    MessageInner,
    decode_record,
    decode_records,
    tags_code,
)
from store import (
    GetMessageStatus,
    MessageStore,
    PutMessageStatus,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
)
from store.paths import commitlog_dir, offset_to_file_name


def cfg(root: Path, **kw: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path_root_dir": root,
        "mapped_file_size_commitlog": 4096,
        "mapped_file_size_consume_queue": 10 * 20,
        "max_hash_slot_num": 64,
        "max_index_num": 256,
        "max_message_size": 2048,
    }
    base.update(kw)
    return StoreConfig.model_validate(base)


def msg(topic: str = "T", qid: int = 0, body: bytes = b"x" * 100, **props: str) -> MessageInner:
    return MessageInner(
        topic,
        body,
        queue_id=qid,
        properties=dict(props),
        born_timestamp=1,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )


async def test_put_get_roll_over(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        offs = []
        for i in range(40):
            r = await store.put_message(msg(body=f"m{i}".encode() * 80))
            assert r.status is PutMessageStatus.PUT_OK, r
            assert r.append is not None
            assert r.append.queue_offset == i
            offs.append(r.append.wrote_offset)
        files = sorted(p.name for p in commitlog_dir(tmp_path).iterdir())
        assert len(files) > 2
        assert files[0] == offset_to_file_name(0)
        # records never span files; each file ends with a BLANK record
        for a in offs:
            rec = store.read_record(a)
            assert rec is not None
            assert a // 4096 == (a + len(rec) - 1) // 4096
        first_file = (commitlog_dir(tmp_path) / files[0]).read_bytes()
        last_rec_end = max(a + len(store.read_record(a) or b"") for a in offs if a < 4096)
        assert int.from_bytes(first_file[last_rec_end + 4 : last_rec_end + 8]) == BLANK_MAGIC_CODE
        assert store.get_max_offset_in_queue("T", 0) == 40
        got = []
        off = 0
        while True:
            res = await store.get_message("g", "T", 0, off, 7, 1 << 20)
            if res.status is not GetMessageStatus.FOUND:
                assert res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
                break
            got.extend(decode_records(b"".join(res.buffers)))
            assert res.queue_offsets == list(range(off, off + res.message_count))
            off = res.next_begin_offset
        assert [m.body for m in got] == [f"m{i}".encode() * 80 for i in range(40)]
        assert [m.queue_offset for m in got] == list(range(40))
        assert [m.commit_log_offset for m in got] == offs
        info = store.runtime_info()
        assert info["putMessageTotalTimes"] == "40"
        assert int(info["commitLogMaxOffset"]) == store.max_phy_offset


async def test_batch_consecutive_offsets_and_ids(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        await store.put_message(msg(qid=2))
        r = await store.put_messages([msg(qid=2, body=bytes([i]) * 300) for i in range(20)])
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append is not None
        assert r.append.queue_offset == 1
        assert r.append.msg_num == 20
        assert len(r.append.msg_ids) == 20
        for i, phy in enumerate(r.append.phy_offsets):
            m = store.look_message_by_offset(phy)
            assert m is not None
            assert m.queue_offset == 1 + i
            assert m.body == bytes([i]) * 300
            assert m.msg_id == r.append.msg_ids[i]
        bad = await store.put_messages([msg(qid=2), msg(qid=3)])
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL


async def test_size_limits(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        r = await store.put_message(msg(body=b"x" * 2049))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "2049" in r.remark
        r = await store.put_message(msg(big="y" * 33000))
        assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        assert store.max_phy_offset == 0  # nothing written


async def test_get_statuses(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        res = await store.get_message("g", "NOPE", 0, 0, 32, 1 << 20)
        assert res.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        assert res.next_begin_offset == 0
        for i in range(5):
            await store.put_message(msg(TAGS="A" if i % 2 == 0 else "B"))
        res = await store.get_message("g", "T", 0, 5, 32, 1 << 20)
        assert res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert res.next_begin_offset == 5
        res = await store.get_message("g", "T", 0, 9, 32, 1 << 20)
        assert res.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert res.next_begin_offset == 0  # RocketMQ: min when min == 0
        code_b = tags_code("B")
        res = await store.get_message("g", "T", 0, 0, 32, 1 << 20, lambda c: c == code_b)
        assert res.status is GetMessageStatus.FOUND
        assert res.queue_offsets == [1, 3]
        assert [m.tags for m in decode_records(b"".join(res.buffers))] == ["B", "B"]
        assert res.next_begin_offset == 5
        res = await store.get_message("g", "T", 0, 0, 32, 1 << 20, lambda c: False)
        assert res.status is GetMessageStatus.NO_MATCHED_MESSAGE
        assert res.next_begin_offset == 5
        # max_bytes: at least one record, then stop before passing the limit
        res = await store.get_message("g", "T", 0, 0, 32, 10)
        assert res.message_count == 1
        assert res.next_begin_offset == 1
        # an empty queue that exists
        store.dispatcher.get_cq("E", 0)
        res = await store.get_message("g", "E", 0, 3, 32, 1 << 20)
        assert res.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
        assert res.next_begin_offset == 0


async def test_transaction_prepared_not_queued(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        await store.put_message(msg())
        m = msg()
        m.sys_flag = TRANSACTION_PREPARED_TYPE
        r = await store.put_message(m)
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append is not None
        assert r.append.queue_offset == 0
        r2 = await store.put_message(msg())
        assert r2.append is not None
        assert r2.append.queue_offset == 1
        assert store.get_max_offset_in_queue("T", 0) == 2
        looked = store.look_message_by_offset(r.append.wrote_offset)
        assert looked is not None
        assert looked.sys_flag & 0xC == TRANSACTION_PREPARED_TYPE


async def test_query_and_times_and_listeners(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    arrivals: list[tuple[str, int, int]] = []
    async with MessageStore(cfg(tmp_path), clock=lambda: now[0]) as store:
        store.add_arrival_listener(lambda t, q, m: arrivals.append((t, q, m)))
        for i in range(10):
            now[0] += 1
            await store.put_message(msg(KEYS=f"k{i} common", UNIQ_KEY=f"U{i:030d}"))
        assert arrivals == [("T", 0, i + 1) for i in range(10)]
        base = 1_700_000_000_000
        assert store.get_earliest_message_time("T", 0) == base + 1000
        assert store.get_message_store_timestamp("T", 0, 4) == base + 5000
        assert store.get_message_store_timestamp("T", 0, 99) == -1
        assert store.get_offset_in_queue_by_time("T", 0, base + 5000) == 4
        assert store.get_offset_in_queue_by_time("T", 0, base + 5500) == 5
        assert store.get_offset_in_queue_by_time("T", 0, 0) == 0
        assert store.get_offset_in_queue_by_time("T", 0, base + 99_000) == 10
        q = store.query_message("T", "k3", 32, 0, base + 99_000)
        assert [decode_record(b).body for b in q.buffers] == [b"x" * 100]
        assert decode_record(q.buffers[0]).keys == "k3 common"
        q = store.query_message("T", "common", 32, 0, base + 99_000)
        assert len(q.buffers) == 10
        q = store.query_message("T", "common", 3, 0, base + 99_000)
        assert len(q.buffers) == 3
        q = store.query_message("T", f"U{7:030d}", 32, 0, base + 99_000)
        assert len(q.buffers) == 1
        assert store.query_message("OTHER", "k3", 32, 0, base + 99_000).buffers == []


async def test_lock_and_refusal_after_close(tmp_path: Path) -> None:
    store = MessageStore(cfg(tmp_path))
    async with store:
        with pytest.raises(StoreLockedError):
            async with MessageStore(cfg(tmp_path)):
                pass
        assert (tmp_path / "abort").exists()
    assert not (tmp_path / "abort").exists()
    r = await store.put_message(msg())
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert "not running" in r.remark
    with pytest.raises(StoreClosedError):
        await store.get_message("g", "T", 0, 0, 1, 1024)
    with pytest.raises(StoreClosedError):
        store.read_record(0)


async def test_sync_flush_group_commit(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        results = []

        async def put(i: int) -> None:
            results.append(await store.put_message(msg(body=bytes([i]) * 200)))

        async with trio.open_nursery() as n:
            for i in range(50):
                n.start_soon(put, i)
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert store.commitlog.mfq.flushed_where == store.max_phy_offset
        # group commit: far fewer fsync rounds than puts
        assert store.flush_service.flush_rounds < 50


async def test_delete_topics(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        for q in range(3):
            await store.put_message(msg("D", q))
        await store.put_message(msg("K", 0))
        store.delete_topics(["D"])
        assert store.get_max_offset_in_queue("D", 0) == 0
        res = await store.get_message("g", "D", 0, 0, 32, 1 << 20)
        assert res.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        r = await store.put_message(msg("D", 0))
        assert r.append is not None
        assert r.append.queue_offset == 0
        assert store.get_max_offset_in_queue("K", 0) == 1


async def test_flush_disk_timeout_keeps_data(tmp_path: Path) -> None:
    config = cfg(tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=50)
    async with MessageStore(config) as store:
        # While the flusher cannot run, a SYNC_FLUSH put times out but stays written.
        async with store.flush_service.commitlog_lock:
            r = await store.put_message(msg(body=b"late"))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert r.append is not None
        looked = store.look_message_by_offset(r.append.wrote_offset)
        assert looked is not None
        assert looked.body == b"late"
        # WAIT=false does not wait at all
        async with store.flush_service.commitlog_lock:
            r2 = await store.put_message(msg(body=b"nowait", WAIT="false"))
        assert r2.status is PutMessageStatus.PUT_OK
        r3 = await store.put_message(msg(body=b"after"))
        assert r3.status is PutMessageStatus.PUT_OK


async def test_message_was_removing(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        for i in range(40):
            await store.put_message(msg(body=bytes([i]) * 300))
        # the first commitlog file disappears before the consume queue is corrected
        for mf in store.commitlog.mfq.detach_first(1):
            mf.destroy()
        res = await store.get_message("g", "T", 0, 0, 4, 1 << 20)
        assert res.status is GetMessageStatus.MESSAGE_WAS_REMOVING
        assert res.message_count == 0
        # the records in later files are still served on the next pull
        res2 = await store.get_message("g", "T", 0, res.next_begin_offset, 32, 1 << 20)
        assert res2.status is GetMessageStatus.FOUND


async def test_deleted_topic_stays_deleted_after_restart(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        for _ in range(5):
            await store.put_message(msg("D", 0))
        store.delete_topics(["D"])
        r = await store.put_message(msg("D", 0, body=b"new"))
        assert r.append is not None
        assert r.append.queue_offset == 0
    async with MessageStore(cfg(tmp_path)) as store:
        assert store.get_max_offset_in_queue("D", 0) == 1
        res = await store.get_message("g", "D", 0, 0, 32, 1 << 20)
        assert [m.body for m in decode_records(b"".join(res.buffers))] == [b"new"]


async def test_async_flush_and_checkpoint_in_background(tmp_path: Path) -> None:
    from store.checkpoint import StoreCheckpoint
    from tests.helpers import wait_until

    config = cfg(
        tmp_path,
        flush_commitlog_least_pages=0,
        flush_interval_commitlog_ms=20,
        flush_interval_consume_queue_ms=20,
    )
    async with MessageStore(config) as store:
        r = await store.put_message(msg())
        assert r.status is PutMessageStatus.PUT_OK
        await wait_until(
            lambda: store.commitlog.mfq.flushed_where == store.max_phy_offset,
            what="async commitlog flush",
        )
        cq = store.dispatcher.find_cq("T", 0)
        assert cq is not None
        await wait_until(lambda: cq.mfq.flushed_where == cq.mfq.max_offset, what="cq flush")
        await wait_until(
            lambda: StoreCheckpoint(tmp_path / "checkpoint").logics_msg_timestamp > 0,
            what="checkpoint written",
        )
        assert store.flush_service.flush_rounds >= 1


async def test_index_file_being_written_is_written_back_every_interval(tmp_path: Path) -> None:
    # The consume-queue round writes back full index files at once, the one being written at
    # the first round and then every flush_interval_index_ms; the checkpoint's index timestamp
    # says up to where the index is durable, and a clean close writes everything back.
    from store.checkpoint import StoreCheckpoint

    now = [1_700_000_000.0]
    hour = 3_600_000
    config = cfg(
        tmp_path,
        flush_interval_commitlog_ms=hour,
        flush_interval_consume_queue_ms=hour,
        flush_interval_index_ms=hour,
    )
    async with MessageStore(config, clock=lambda: now[0]) as store:
        index = store.dispatcher.index
        assert index is not None
        ckpt = store.checkpoint
        await store.put_message(msg(KEYS="a"))
        first = store.commitlog.last_store_timestamp
        await store.flush_service.flush_consume_queues()
        assert [f.dirty for f in index.files] == [False]
        assert ckpt.index_msg_timestamp == first
        now[0] += 5
        await store.put_message(msg(KEYS="b"))
        await store.flush_service.flush_consume_queues()  # within the interval: left dirty
        assert [f.dirty for f in index.files] == [True]
        assert (ckpt.logics_msg_timestamp, ckpt.index_msg_timestamp) == (first + 5000, first)
        store.config.flush_interval_index_ms = 0
        await store.flush_service.flush_consume_queues()
        assert [f.dirty for f in index.files] == [False]
        assert ckpt.index_msg_timestamp == first + 5000
        now[0] += 5
        await store.put_message(msg(KEYS="c"))
    again = StoreCheckpoint(tmp_path / "checkpoint")
    assert again.index_msg_timestamp == again.logics_msg_timestamp == first + 10_000

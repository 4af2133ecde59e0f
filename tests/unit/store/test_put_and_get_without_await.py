"""`MessageStore.put_messages_nowait` / `wait_put_durable` and `get_message_nowait`: the
synchronous cores that inline broker handlers call from the event loop."""

from __future__ import annotations

from pathlib import Path

from common.message import MessageInner
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig


def cfg(root: Path, **kw: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path_root_dir": root,
        "mapped_file_size_commitlog": 64 * 1024,
        "mapped_file_size_consume_queue": 100 * 20,
        "max_hash_slot_num": 64,
        "max_index_num": 256,
    }
    base.update(kw)
    return StoreConfig.model_validate(base)


def msg(body: bytes = b"x" * 100, **props: str) -> MessageInner:
    return MessageInner(
        "T",
        body,
        queue_id=0,
        properties=dict(props),
        born_timestamp=1,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )


async def test_async_flush_put_is_final_at_once(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        result, flush_end = store.put_messages_nowait([msg()])
        assert flush_end < 0
        assert result.status is PutMessageStatus.PUT_OK
        assert result.append is not None
        assert store.get_max_offset_in_queue("T", 0) == 1


async def test_sync_flush_put_needs_the_wait(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        result, flush_end = store.put_messages_nowait([msg(), msg()])
        assert flush_end == store.max_phy_offset
        # Written and dispatched already, not yet durable.
        assert store.get_max_offset_in_queue("T", 0) == 2
        assert store.commitlog.mfq.flushed_where < flush_end
        final = await store.wait_put_durable(result, flush_end)
        assert final.status is PutMessageStatus.PUT_OK
        assert final.append is result.append
        assert store.commitlog.mfq.flushed_where >= flush_end
        # WAIT=false: final at once under SYNC_FLUSH too.
        _, flush_end = store.put_messages_nowait([msg(WAIT="false")])
        assert flush_end < 0


async def test_sync_flush_wait_times_out_but_keeps_the_record(tmp_path: Path) -> None:
    config = cfg(tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=50)
    async with MessageStore(config) as store:
        async with store.flush_service.commitlog_lock:
            result, flush_end = store.put_messages_nowait([msg(body=b"late")])
            assert flush_end >= 0
            final = await store.wait_put_durable(result, flush_end)
        assert final.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert final.append is result.append


async def test_refused_and_illegal_puts_are_final(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path, flush_disk_type="SYNC_FLUSH")) as store:
        result, flush_end = store.put_messages_nowait([])
        assert (result.status, flush_end) == (PutMessageStatus.MESSAGE_ILLEGAL, -1)
        other = msg()
        other.queue_id = 1
        result, flush_end = store.put_messages_nowait([msg(), other])
        assert (result.status, flush_end) == (PutMessageStatus.MESSAGE_ILLEGAL, -1)


async def test_get_message_nowait_matches_get_message(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        for i in range(5):
            await store.put_message(msg(body=bytes([65 + i]) * 50))
        now = store.get_message_nowait("g", "T", 0, 1, 3, 1 << 20)
        later = await store.get_message("g", "T", 0, 1, 3, 1 << 20)
        assert now.status is later.status is GetMessageStatus.FOUND
        assert now.buffers == later.buffers
        assert now.queue_offsets == [1, 2, 3]
        assert now.next_begin_offset == 4


async def test_a_read_behind_the_cached_tail_suggests_a_slave(tmp_path: Path) -> None:
    # Ratio 0: nothing counts as cached, so any record before the end is "behind".
    async with MessageStore(cfg(tmp_path / "a", access_message_in_memory_max_ratio=0)) as store:
        store.put_messages_nowait([msg(), msg()])
        got = store.get_message_nowait("G", "T", 0, 0, 1, 1 << 20)
        assert got.message_count == 1
        assert got.suggest_pulling_from_slave
        none = store.get_message_nowait("G", "T", 0, 2, 1, 1 << 20)
        assert none.message_count == 0
        assert not none.suggest_pulling_from_slave
    # The default (40 % of memory) covers a small store entirely.
    async with MessageStore(cfg(tmp_path / "b")) as store:
        store.put_messages_nowait([msg(), msg()])
        got = store.get_message_nowait("G", "T", 0, 0, 1, 1 << 20)
        assert got.message_count == 1
        assert not got.suggest_pulling_from_slave

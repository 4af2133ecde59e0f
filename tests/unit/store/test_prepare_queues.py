"""`MessageStore.prepare_queues`: a new topic's consume-queue files are created (first page
faulted in off the event loop) before its first message, without changing what the queues
read as, and existing queues are left alone."""

from __future__ import annotations

from pathlib import Path

from common.message import MessageInner, decode_records
from store import GetMessageStatus, MessageStore, StoreConfig
from store.paths import consume_queue_dir


def cfg(root: Path) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 64 * 1024,
            "mapped_file_size_consume_queue": 100 * 20,
            "max_hash_slot_num": 64,
            "max_index_num": 256,
        }
    )


def msg(topic: str, queue_id: int, body: bytes) -> MessageInner:
    return MessageInner(
        topic,
        body,
        queue_id=queue_id,
        properties={},
        born_timestamp=1,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )


def cq_files(root: Path, topic: str, queue_id: int) -> list[str]:
    d = consume_queue_dir(root, topic, queue_id)
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


async def test_prepared_queues_have_their_file_and_read_as_empty(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        assert await store.prepare_queues("T", range(4)) == 4
        for q in range(4):
            assert cq_files(tmp_path, "T", q) == ["0" * 20]
            assert store.get_max_offset_in_queue("T", q) == 0
            assert store.get_min_offset_in_queue("T", q) == 0
            got = store.get_message_nowait("g", "T", q, 0, 32, 1 << 20)
            assert got.status is not GetMessageStatus.FOUND
        # The first put of a prepared queue goes to offset 0 of the prepared file.
        for q in range(4):
            result, _ = store.put_messages_nowait([msg("T", q, b"m%d" % q)])
            assert result.append is not None
            assert result.append.queue_offset == 0
            assert cq_files(tmp_path, "T", q) == ["0" * 20]
        got = store.get_message_nowait("g", "T", 2, 0, 32, 1 << 20)
        assert got.status is GetMessageStatus.FOUND
        assert [m.body for m in decode_records(b"".join(got.buffers))] == [b"m2"]
    # After a restart the queues hold what was put, and a prepared but unused queue is empty.
    async with MessageStore(cfg(tmp_path)) as store:
        assert [store.get_max_offset_in_queue("T", q) for q in range(4)] == [1, 1, 1, 1]
        assert await store.prepare_queues("U", [0]) == 1
    async with MessageStore(cfg(tmp_path)) as store:
        assert store.get_max_offset_in_queue("U", 0) == 0
        result, _ = store.put_messages_nowait([msg("U", 0, b"u")])
        assert result.append is not None
        assert result.append.queue_offset == 0


async def test_existing_queues_are_left_alone(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path)) as store:
        for i in range(3):
            store.put_messages_nowait([msg("T", 1, b"x%d" % i)])
        assert await store.prepare_queues("T", range(3)) == 2  # queues 0 and 2 only
        assert store.get_max_offset_in_queue("T", 1) == 3
        assert await store.prepare_queues("T", range(3)) == 0  # all exist now
        result, _ = store.put_messages_nowait([msg("T", 1, b"x3")])
        assert result.append is not None
        assert result.append.queue_offset == 3

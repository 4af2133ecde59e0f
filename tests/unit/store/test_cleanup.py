"""Cleanup by age (injected clock) and by disk ratio (injected usage); OFFSET_TOO_SMALL after."""

from __future__ import annotations

import time
from pathlib import Path

from common.message import MessageInner
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig
from store.paths import commitlog_dir, consume_queue_dir


def cfg(root: Path, hour: int = 4) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commitlog=4096,
        mapped_file_size_consume_queue=5 * 20,
        max_hash_slot_num=64,
        max_index_num=64,
        file_reserved_hours=72,
        delete_when=f"{hour:02d}",
        clean_resource_interval_ms=3_600_000,  # rounds are driven by the test
    )


def msg(i: int) -> MessageInner:
    return MessageInner("T", bytes([i % 256]) * 500, properties={"KEYS": f"k{i}"})


def files(root: Path) -> list[str]:
    return sorted(p.name for p in commitlog_dir(root).iterdir())


async def fill(store: MessageStore, n: int = 40) -> None:
    for i in range(n):
        r = await store.put_message(msg(i))
        assert r.status is PutMessageStatus.PUT_OK


async def test_cleanup_by_age_at_delete_hour(tmp_path: Path) -> None:
    now = [time.time()]
    hour = time.localtime(now[0] + 73 * 3600).tm_hour
    other_hour = (hour + 1) % 24
    # Not the delete hour: nothing goes even though everything is old.
    async with MessageStore(
        cfg(tmp_path, other_hour), clock=lambda: now[0], disk_usage=lambda p: 0.1
    ) as store:
        await fill(store)
        n_files = len(files(tmp_path))
        assert n_files > 3
        now[0] += 73 * 3600
        assert await store.cleanup_service.clean_once() == 0
    now[0] -= 73 * 3600
    async with MessageStore(
        cfg(tmp_path, hour), clock=lambda: now[0], disk_usage=lambda p: 0.1
    ) as store:
        # Young files stay at the delete hour.
        assert await store.cleanup_service.clean_once() == 0
        assert store.min_phy_offset == 0
        now[0] += 73 * 3600
        deleted = await store.cleanup_service.clean_once()
        assert deleted == n_files - 1  # the current file always stays
        assert len(files(tmp_path)) == 1
        min_phy = store.min_phy_offset
        assert min_phy > 0
        assert store.read_record(0) is None
        assert store.look_message_by_offset(0) is None
        qmin = store.get_min_offset_in_queue("T", 0)
        assert qmin > 0
        res = await store.get_message("g", "T", 0, 0, 32, 1 << 20)
        assert res.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert res.next_begin_offset == qmin
        res = await store.get_message("g", "T", 0, qmin, 32, 1 << 20)
        assert res.status is GetMessageStatus.FOUND
        assert res.queue_offsets[0] == qmin
        # consume-queue files that only pointed below the commitlog min are gone
        cq_files = sorted(consume_queue_dir(tmp_path, "T", 0).iterdir())
        assert len(cq_files) < 40 // 5
        # keys of deleted records no longer resolve
        assert store.query_message("T", "k0", 10, 0, 2**62).buffers == []
        assert store.runtime_info()["commitLogFilesDeleted"] == str(deleted)
    # restart keeps the corrected min offsets
    async with MessageStore(cfg(tmp_path, hour), clock=lambda: now[0]) as store:
        assert store.get_min_offset_in_queue("T", 0) == qmin
        assert store.min_phy_offset == min_phy


async def test_cleanup_by_disk_ratio_at_once(tmp_path: Path) -> None:
    hour = (time.localtime().tm_hour + 12) % 24  # never the delete hour during this test
    state = {"files_left_ok": 3}

    def usage(p: Path) -> float:
        return 0.8 if len(files(tmp_path)) > state["files_left_ok"] else 0.5

    async with MessageStore(cfg(tmp_path, hour), disk_usage=usage) as store:
        await fill(store)
        assert len(files(tmp_path)) > 3
        deleted = await store.cleanup_service.clean_once()
        assert deleted > 0
        assert len(files(tmp_path)) == 3  # deleted oldest-first until usage fell
        res = await store.get_message("g", "T", 0, 0, 32, 1 << 20)
        assert res.status is GetMessageStatus.OFFSET_TOO_SMALL


async def test_hard_disk_limit_refuses_puts_with_reason(tmp_path: Path) -> None:
    ratio = [0.5]
    async with MessageStore(cfg(tmp_path), disk_usage=lambda p: ratio[0]) as store:
        assert (await store.put_message(msg(1))).status is PutMessageStatus.PUT_OK
        ratio[0] = 0.95
        store.cleanup_service.check_disk()
        r = await store.put_message(msg(2))
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in r.remark
        assert "95.0%" in r.remark
        assert store.runtime_info()["diskFull"] == "true"
        ratio[0] = 0.5
        store.cleanup_service.check_disk()
        assert (await store.put_message(msg(3))).status is PutMessageStatus.PUT_OK

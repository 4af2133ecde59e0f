"""Disk space, in process: mapped files are reserved before they are
mapped, a file that cannot be reserved is refused with ENOSPC, puts are refused (and nothing is
written) when a file they need cannot be created and resume once space is back, and cleanup
under disk pressure keeps the files consumers still need unless forced."""

from __future__ import annotations

import ctypes
import errno
import os
import time
from pathlib import Path

import pytest

import store._mapped_file as mapped_module
from common.message import MessageInner
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store.paths import commitlog_dir, offset_to_file_name

SIZE = 64 * 1024


def _failing(err: int) -> object:
    def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(err)
        return -1

    return fallocate


def test_a_new_file_is_reserved_before_it_is_mapped(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / offset_to_file_name(0), SIZE)
    try:
        assert mf.mapped_writes
        assert os.stat(mf.path).st_blocks * 512 >= SIZE  # every block allocated up front
        mf.append(b"a" * 100)
        assert mf.read(0, 101) == b"a" * 100 + b"\0"
    finally:
        mf.close()


def test_a_file_that_cannot_be_reserved_is_refused_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / offset_to_file_name(0)
    monkeypatch.setattr(mapped_module, "_fallocate", _failing(errno.ENOSPC))
    with pytest.raises(OSError, match="cannot create 65536-byte mapped file") as info:
        MappedFile(path, SIZE)
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(path)
    assert not path.exists()  # never mapped sparse


def test_keep_free_refuses_a_file_that_would_leave_too_little(tmp_path: Path) -> None:
    path = tmp_path / offset_to_file_name(0)
    with pytest.raises(OSError, match="kept free") as info:
        MappedFile(path, SIZE, keep_free=1 << 62)
    assert info.value.errno == errno.ENOSPC
    assert not path.exists()


def test_where_nothing_can_be_reserved_writes_go_through_pwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mapped_module, "_fallocate", _failing(errno.EOPNOTSUPP))
    mf = MappedFile(tmp_path / offset_to_file_name(0), SIZE)
    try:
        assert not mf.mapped_writes
        writes: list[int] = []
        real = MappedFile._pwrite_all

        def spy(self: MappedFile, data: bytes, pos: int) -> None:
            writes.append(len(data))
            real(self, data, pos)

        monkeypatch.setattr(MappedFile, "_pwrite_all", spy)
        mf.append(b"u" * 20)  # a consume-queue unit: pwrite (ENOSPC), never the map (SIGBUS)
        mf.write_at(0, b"v")
        assert writes == [20, 1]
        assert mf.read(0, 20) == b"v" + b"u" * 19
    finally:
        mf.close()


def test_an_existing_file_that_cannot_be_reserved_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / offset_to_file_name(0)
    path.write_bytes(b"x" * 10 + bytes(SIZE - 10))
    monkeypatch.setattr(mapped_module, "_fallocate", _failing(errno.ENOSPC))
    mf = MappedFile(path, SIZE, strict=False)  # what `MappedFileQueue.load` does
    try:
        assert not mf.mapped_writes
        assert mf.read(0, 10) == b"x" * 10
    finally:
        mf.close()


def cfg(root: Path, **kw: object) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 4096,
            "mapped_file_size_consume_queue": 5 * 20,
            "max_hash_slot_num": 64,
            "max_index_num": 64,
            "delete_when": f"{(time.localtime().tm_hour + 12) % 24:02d}",  # never now
            "clean_resource_interval_ms": 3_600_000,  # rounds are driven by the test
            "disk_check_interval_ms": 3_600_000,
            **kw,
        }
    )


def msg(i: int) -> MessageInner:
    return MessageInner("T", bytes([i % 256]) * 500, properties={"KEYS": f"k{i}"})


async def test_no_space_for_a_new_file_refuses_the_put_whole_then_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = cfg(tmp_path, mapped_file_size_consume_queue=1000 * 20)
    async with MessageStore(config, disk_usage=lambda p: 0.5) as store:
        i = 0
        mfq = store.commitlog.mfq
        while not mfq.files or mfq.files[-1].remaining > 1500:
            assert (await store.put_message(msg(i))).status is PutMessageStatus.PUT_OK
            i += 1
        with mfq._prep_lock:
            mfq._prepared = None  # as if the flush service could not prepare it either
        before = (store.max_phy_offset, store.get_max_offset_in_queue("T", 0))
        monkeypatch.setattr(mapped_module, "_fallocate", _failing(errno.ENOSPC))
        refused = 0
        for _ in range(5):
            r = await store.put_message(msg(i))
            if r.status is PutMessageStatus.PUT_OK:
                continue  # still room in the current file
            assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert r.remark.startswith("maybe disk full, no space"), r.remark
            assert "new commitlog file" in r.remark
            refused += 1
        assert refused
        assert store.runtime_info()["diskFull"] == "true"
        assert store.runtime_info()["putRefusedReason"].startswith("maybe disk full")
        # Nothing half-written: the commitlog and the queue end where the last PUT_OK left them.
        assert store.get_max_offset_in_queue("T", 0) - before[1] == 5 - refused
        monkeypatch.undo()
        # Still refused until the disk is measured again (the monitor's next round)...
        assert (await store.put_message(msg(i))).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        store.disk.check()
        # ... then taken again, by itself.
        assert (await store.put_message(msg(i))).status is PutMessageStatus.PUT_OK
        assert store.runtime_info()["diskFull"] == "false"


async def test_no_space_for_a_consume_queue_file_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MessageStore(cfg(tmp_path), disk_usage=lambda p: 0.5) as store:
        for i in range(5):  # exactly one full consume-queue file
            assert (await store.put_message(msg(i))).status is PutMessageStatus.PUT_OK
        phy = store.max_phy_offset
        monkeypatch.setattr(mapped_module, "_fallocate", _failing(errno.ENOSPC))
        r = await store.put_message(msg(5))
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "new consume queue file" in r.remark
        assert store.max_phy_offset == phy  # refused before the commitlog append
        monkeypatch.undo()
        store.disk.check()
        r = await store.put_message(msg(5))
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append is not None
        assert r.append.queue_offset == 5


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in commitlog_dir(root).iterdir())


async def test_pressure_cleanup_keeps_what_consumers_still_need(tmp_path: Path) -> None:
    needed: list[tuple[int, str] | None] = [(0, "group G, topic T, queue 0 at offset 0 of 40")]
    async with MessageStore(
        cfg(tmp_path), disk_usage=lambda p: 0.8, needed_offset=lambda: needed[0]
    ) as store:
        for i in range(40):
            assert (await store.put_message(msg(i))).status is PutMessageStatus.PUT_OK
        n_files = len(store.commitlog.mfq.files)
        assert n_files > 4
        # 80% used, above disk_max_used_ratio: but G has consumed nothing. Nothing goes.
        assert await store.cleanup_service.clean_once() == 0
        info = store.runtime_info()
        assert "not consumed yet" in info["commitLogCleanBlocked"]
        assert "group G, topic T" in info["commitLogCleanBlocked"]
        assert "clean_file_forcibly_enable" in info["commitLogCleanBlocked"]
        assert info["cleanFileForciblyEnable"] == "false"
        assert store.min_phy_offset == 0
        # G consumed up to the third file: the two files before it go, not more.
        third = store.commitlog.mfq.files[2].file_from_offset
        needed[0] = (third + 10, "group G, topic T, queue 0 at offset 17 of 40")
        assert await store.cleanup_service.clean_once() == 2
        assert store.min_phy_offset == third
        # Everything consumed: the disk pressure deletes the rest (never the current file).
        needed[0] = None
        left = len(store.commitlog.mfq.files)
        assert await store.cleanup_service.clean_once() == left - 1
        assert store.runtime_info()["commitLogCleanBlocked"] == ""


async def test_clean_file_forcibly_enable_deletes_unconsumed_messages(tmp_path: Path) -> None:
    async with MessageStore(
        cfg(tmp_path, clean_file_forcibly_enable=True),
        disk_usage=lambda p: 0.8,
        needed_offset=lambda: (0, "group G"),
    ) as store:
        for i in range(40):
            assert (await store.put_message(msg(i))).status is PutMessageStatus.PUT_OK
        assert await store.cleanup_service.clean_once() > 0  # RocketMQ's forced deletion
        assert store.min_phy_offset > 0


async def test_commit_log_offset_in_queue(tmp_path: Path) -> None:
    async with MessageStore(cfg(tmp_path), disk_usage=lambda p: 0.5) as store:
        phys = []
        for i in range(7):
            r = await store.put_message(msg(i))
            assert r.append is not None
            phys.append(r.append.wrote_offset)
        assert store.get_commit_log_offset_in_queue("T", 0, 0) == phys[0]
        assert store.get_commit_log_offset_in_queue("T", 0, 6) == phys[6]
        assert store.get_commit_log_offset_in_queue("T", 0, 7) is None  # all consumed
        assert store.get_commit_log_offset_in_queue("T", 1, 0) is None  # no queue
        assert store.get_commit_log_offset_in_queue("U", 0, 0) is None

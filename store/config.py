"""`StoreConfig`: every knob of the message store, one pydantic model.

Defaults follow RocketMQ 4.9.8's `MessageStoreConfig`. Tests shrink the mapped file sizes so files
roll after a few records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from common.schedule import DEFAULT_MESSAGE_DELAY_LEVEL

__all__ = ["StoreConfig"]


class StoreConfig(BaseModel):
    """Configuration of one `MessageStore`.

    Attributes:
        store_path_root_dir: Root directory; commitlog, consumequeue, index, checkpoint, abort
            and lock live under it (see `store.paths`).
        mapped_file_size_commitlog: Bytes per commitlog file (1 GiB).
        mapped_file_size_consume_queue: Bytes per consume-queue file (300000 units of 20 bytes).
        max_message_size: Largest body accepted (MESSAGE_ILLEGAL above it).
        flush_disk_type: "ASYNC_FLUSH" (ack after append) or "SYNC_FLUSH" (ack once durable).
        flush_interval_commitlog_ms: Async commitlog flush period.
        flush_commitlog_least_pages: Dirty 4 KiB pages needed before an async flush.
        flush_commitlog_thorough_interval_ms: Flush whatever is dirty at least this often.
        flush_interval_consume_queue_ms: Consume-queue (and checkpoint) flush period.
        flush_interval_index_ms: Write-back period of the index file being written (full
            files are written back when they fill up). Its entries hit random slot pages, so
            every write-back costs up to a page per message indexed since the last one; after
            a crash, recovery re-indexes the records stored since the last write-back. Keep it
            below the kernel's dirty expiry (vm.dirty_expire_centisecs, 30 s), or the kernel
            writes the pages back on its own.
        warm_mapped_file_enable: Pre-fault the commitlog pages ahead of the write position in a
            worker thread (RocketMQ's name for its page warming, also off by default). Appends
            then never take the first-write page fault that waits on the ext4 journal, but pages
            faulted ahead and written back before they are filled are written twice and faulted
            again, which costs batch throughput (docs/design-notes.md, "Page pre-faulting").
        sync_flush_timeout_ms: How long a SYNC_FLUSH put waits before FLUSH_DISK_TIMEOUT.
        file_reserved_hours: Age after which commitlog files may be deleted.
        delete_when: Local hour(s) ("04", or "03;04") at which expired files are deleted.
        disk_max_used_ratio: Above this disk usage, commitlog files are deleted before their
            age, oldest first, as long as no consumer still needs their messages (see
            `clean_file_forcibly_enable`).
        disk_hard_ratio: Above this disk usage, puts are refused with SERVICE_NOT_AVAILABLE.
        disk_check_interval_ms: How often the free space of the store's filesystem is read
            (statvfs, in a worker thread) for the put refusal; also read after a file could not
            be created for want of space.
        clean_file_forcibly_enable: Under disk pressure (above `disk_max_used_ratio`), delete
            the oldest commitlog files even when they hold messages a consumer group has not
            consumed yet (RocketMQ's cleanFileForciblyEnable). Loses those messages, which
            were acknowledged to their producers. Off by default: such files are deleted only
            by age (`file_reserved_hours`), and sends are refused once the disk is full.
        clean_resource_interval_ms: Period of the cleanup service.
        max_hash_slot_num: Index hash slots per index file.
        max_index_num: Index entries per index file.
        message_index_enable: Build the key index at all.
        check_crc_on_recover: Verify body CRCs while recovering.
        message_delay_level: Delay levels (for SCHEDULE_TOPIC_XXXX tags codes on recovery),
            in `common.schedule.parse_delay_levels`'s format.
        access_message_in_memory_max_ratio: Percent of physical memory the commitlog tail
            is assumed to keep in the page cache: a read further behind the commitlog's end
            than that is marked `suggest_pulling_from_slave` (a broker with slave reads
            enabled sends the consumer to a slave).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    store_path_root_dir: Path = Field(default_factory=lambda: Path.home() / "store")
    mapped_file_size_commitlog: int = Field(default=1024 * 1024 * 1024, ge=4096)
    mapped_file_size_consume_queue: int = Field(default=300_000 * 20, ge=20)
    max_message_size: int = Field(default=4 * 1024 * 1024, ge=1)
    flush_disk_type: Literal["ASYNC_FLUSH", "SYNC_FLUSH"] = "ASYNC_FLUSH"
    flush_interval_commitlog_ms: int = Field(default=500, ge=1)
    flush_commitlog_least_pages: int = Field(default=4, ge=0)
    flush_commitlog_thorough_interval_ms: int = Field(default=10_000, ge=1)
    flush_interval_consume_queue_ms: int = Field(default=1000, ge=1)
    flush_interval_index_ms: int = Field(default=10_000, ge=0)
    warm_mapped_file_enable: bool = False
    access_message_in_memory_max_ratio: int = Field(default=40, ge=0, le=100)
    sync_flush_timeout_ms: int = Field(default=5000, ge=1)
    file_reserved_hours: float = Field(default=72, ge=0)
    delete_when: str = "04"
    disk_max_used_ratio: float = Field(default=0.75, gt=0, le=1)
    disk_hard_ratio: float = Field(default=0.90, gt=0, le=1)
    disk_check_interval_ms: int = Field(default=1000, ge=10)
    clean_file_forcibly_enable: bool = False
    clean_resource_interval_ms: int = Field(default=10_000, ge=1)
    max_hash_slot_num: int = Field(default=5_000_000, ge=1)
    max_index_num: int = Field(default=20_000_000, ge=1)
    message_index_enable: bool = True
    check_crc_on_recover: bool = True
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL

"""Where a consumer group's progress lives.

`RemoteOffsetStore` (clustering) keeps offsets in memory and persists them to
the broker that owns each queue; `LocalFileOffsetStore` (broadcasting) keeps
them in a JSON file written atomically. The network side is a small Protocol
(`OffsetBackend`) so both stores are testable without sockets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Protocol

import structlog
import trio

from client.message import MessageQueue
from common.fileio import write_atomically

log = structlog.get_logger()


class ReadOffsetType(Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetBackend(Protocol):
    """The broker calls a remote offset store needs."""

    async def fetch_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        """The stored offset, or -1 when the broker has none."""
        ...

    async def store_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None: ...


class OffsetStore(Protocol):
    async def load(self) -> None: ...
    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None: ...
    async def read(self, mq: MessageQueue, how: ReadOffsetType) -> int: ...
    async def persist(self, mq: MessageQueue) -> None: ...
    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...
    def remove(self, mq: MessageQueue) -> None: ...
    def table(self) -> dict[MessageQueue, int]: ...


class _MemoryTable:
    def __init__(self) -> None:
        self._table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        if offset < 0:
            return
        old = self._table.get(mq)
        if old is None or not increase_only or offset > old:
            self._table[mq] = offset

    def remove(self, mq: MessageQueue) -> None:
        self._table.pop(mq, None)

    def table(self) -> dict[MessageQueue, int]:
        return dict(self._table)


class RemoteOffsetStore(_MemoryTable):
    """Offsets of a clustering group, persisted to the brokers.

    Args:
        group: the consumer group.
        backend: the broker calls (the client API).
    """

    def __init__(self, group: str, backend: OffsetBackend) -> None:
        super().__init__()
        self.group = group
        self._backend = backend

    async def load(self) -> None:
        return None

    async def read(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        if how is not ReadOffsetType.READ_FROM_STORE:
            got = self._table.get(mq)
            if got is not None or how is ReadOffsetType.READ_FROM_MEMORY:
                return -1 if got is None else got
        offset = await self._backend.fetch_consumer_offset(self.group, mq)
        if offset >= 0:
            self.update(mq, offset)
        return offset

    async def persist(self, mq: MessageQueue) -> None:
        offset = self._table.get(mq)
        if offset is not None:
            await self._backend.store_consumer_offset(self.group, mq, offset)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = set(mqs)
        for mq, offset in list(self._table.items()):
            if mq not in wanted:
                continue
            try:
                await self._backend.store_consumer_offset(self.group, mq, offset)
            except Exception as exc:
                log.warning("offset_persist_failed", mq=str(mq), error=str(exc))
        # Offsets of queues we no longer own are stale: forget them.
        for mq in list(self._table):
            if mq not in wanted:
                self._table.pop(mq, None)


def encode_offsets(table: dict[MessageQueue, int]) -> bytes:
    entries = [
        {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
        for mq, off in sorted(table.items())
    ]
    return json.dumps({"offsetTable": entries}, indent=1).encode()


def decode_offsets(data: bytes) -> dict[MessageQueue, int]:
    doc = json.loads(data)
    return {
        MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"])): int(e["offset"])
        for e in doc.get("offsetTable", [])
    }


class LocalFileOffsetStore(_MemoryTable):
    """Offsets of a broadcasting consumer, in `<dir>/<instance>/<group>/offsets.json`.

    Writes go to a temporary file that is fsynced and renamed over the old
    one, so a crash leaves either the old or the new table.
    """

    def __init__(self, base_dir: str | os.PathLike[str], instance_name: str, group: str) -> None:
        super().__init__()
        self.group = group
        self.path = Path(base_dir) / instance_name / group / "offsets.json"
        self._last_written: bytes | None = None

    async def load(self) -> None:
        # Small file read off the event loop: the disk may be slow.
        data = await trio.to_thread.run_sync(self._read_file)
        if data is None:
            return
        try:
            loaded = decode_offsets(data)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("offset_file_unreadable", path=str(self.path), error=str(exc))
            return
        for mq, off in loaded.items():
            self.update(mq, off)

    def _read_file(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    async def read(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        if how is ReadOffsetType.READ_FROM_STORE:
            data = await trio.to_thread.run_sync(self._read_file)  # disk read, see load()
            if data is None:
                return -1
            off = decode_offsets(data).get(mq, -1)
            if off >= 0:
                self.update(mq, off)
            return off
        return self._table.get(mq, -1)

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all(self._table)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = set(mqs)
        table = {mq: off for mq, off in self._table.items() if mq in wanted}
        if not table:
            return
        data = encode_offsets(table)
        if data == self._last_written:
            return
        # fsync + rename + directory fsync block: run them in a worker thread.
        await trio.to_thread.run_sync(write_atomically, self.path, data)
        self._last_written = data

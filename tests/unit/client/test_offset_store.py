"""Offset stores: remote (through a recording backend) and local JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from client.consumer.offset_store import (
    LocalFileOffsetStore,
    ReadOffsetType,
    RemoteOffsetStore,
)
from client.message import MessageQueue

MQ0 = MessageQueue("T", "b", 0)
MQ1 = MessageQueue("T", "b", 1)


class Backend:
    def __init__(self) -> None:
        self.stored: dict[MessageQueue, int] = {MQ1: 42}
        self.writes: list[tuple[MessageQueue, int]] = []

    async def fetch_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        assert group == "g"
        return self.stored.get(mq, -1)

    async def store_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        self.writes.append((mq, offset))
        self.stored[mq] = offset


async def test_remote_store() -> None:
    be = Backend()
    st = RemoteOffsetStore("g", be)
    assert await st.read(MQ0, ReadOffsetType.MEMORY_FIRST_THEN_STORE) == -1
    assert await st.read(MQ1, ReadOffsetType.READ_FROM_MEMORY) == -1
    assert await st.read(MQ1, ReadOffsetType.MEMORY_FIRST_THEN_STORE) == 42
    assert await st.read(MQ1, ReadOffsetType.READ_FROM_MEMORY) == 42
    st.update(MQ0, 10)
    st.update(MQ0, 5, increase_only=True)
    assert st.table()[MQ0] == 10
    st.update(MQ0, 7)
    assert st.table()[MQ0] == 7
    await st.persist_all([MQ0])
    assert be.writes == [(MQ0, 7)]
    # MQ1 was not in the persisted set: it is forgotten locally.
    assert MQ1 not in st.table()
    await st.persist(MQ0)
    assert be.writes[-1] == (MQ0, 7)


async def test_local_store_round_trip(tmp_path: Path) -> None:
    st = LocalFileOffsetStore(tmp_path, "inst", "g")
    await st.load()
    assert await st.read(MQ0, ReadOffsetType.READ_FROM_STORE) == -1
    st.update(MQ0, 3)
    st.update(MQ1, 9)
    await st.persist_all([MQ0, MQ1])
    doc = json.loads(st.path.read_text())
    assert {e["queueId"]: e["offset"] for e in doc["offsetTable"]} == {0: 3, 1: 9}
    assert not st.path.with_name("offsets.json.tmp").exists()
    again = LocalFileOffsetStore(tmp_path, "inst", "g")
    await again.load()
    assert again.table() == {MQ0: 3, MQ1: 9}
    assert await again.read(MQ1, ReadOffsetType.READ_FROM_MEMORY) == 9


async def test_local_store_ignores_garbage(tmp_path: Path) -> None:
    st = LocalFileOffsetStore(tmp_path, "inst", "g")
    st.path.parent.mkdir(parents=True)
    st.path.write_text("{not json")
    await st.load()
    assert st.table() == {}


async def test_local_store_skips_unchanged_writes(tmp_path: Path) -> None:
    st = LocalFileOffsetStore(tmp_path, "inst", "g")
    st.update(MQ0, 1)
    await st.persist_all([MQ0])
    st.path.write_text("sentinel")  # a rewrite would replace this
    await st.persist_all([MQ0])
    assert st.path.read_text() == "sentinel"
    st.update(MQ0, 2)
    await st.persist_all([MQ0])
    assert json.loads(st.path.read_text())["offsetTable"][0]["offset"] == 2


def test_broadcasting_offsets_dir_survives_restarts() -> None:
    from client import ClientConfig, MessageModel, PushConsumer

    default = PushConsumer("g", ClientConfig(), message_model=MessageModel.BROADCASTING)
    again = PushConsumer("g", ClientConfig(), message_model=MessageModel.BROADCASTING)
    # Each process-local client gets a unique instance name (client id) ...
    assert default.config.instance_name != again.config.instance_name
    # ... but the offsets file path is stable: "DEFAULT", or the name the user chose.
    assert default._offsets_dir_name == again._offsets_dir_name == "DEFAULT"
    named = PushConsumer("g", ClientConfig(instance_name="svc-1"))
    assert named._offsets_dir_name == "svc-1"
    assert named.config.instance_name == "svc-1"

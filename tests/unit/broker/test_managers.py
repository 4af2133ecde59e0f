"""Broker managers: topics, offsets, subscription groups, consumers, producers; persistence."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from broker.consumer_manager import ClientChannelInfo, ConsumerManager
from broker.offset_manager import OffsetManager
from broker.producer_manager import ProducerManager
from broker.subscription_manager import SubscriptionManager
from broker.topic_manager import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    TopicManager,
    validate_topic,
)
from remoting.protocol.bodies import SubscriptionData
from remoting.protocol.route import TopicConfig


@dataclass(eq=False)
class FakeChannel:
    id: int
    remote_address: str = "127.0.0.1:1"


def test_system_topics_with_auto_create_on(tmp_path: Path) -> None:
    tm = TopicManager(tmp_path, cluster_name="C1", broker_name="b1", default_topic_queue_nums=8)
    tbw = tm.get("TBW102")
    assert tbw is not None
    assert (tbw.perm, tbw.read_queue_nums, tbw.write_queue_nums) == (7, 8, 8)
    for name in ("SELF_TEST_TOPIC", "C1", "b1", "OFFSET_MOVED_EVENT"):
        assert name in tm
        assert tm.is_system_topic(name)
    assert not tm.is_system_topic("T")
    assert "TBW102" not in TopicManager(tmp_path, auto_create_topic_enable=False)


def test_auto_create_from_template_follows_reference(tmp_path: Path) -> None:
    tm = TopicManager(tmp_path)
    v0 = tm.data_version.counter
    cfg = tm.create_in_send("NewTopic", "TBW102", 4)
    assert cfg == TopicConfig("NewTopic", 4, 4, PERM_READ | PERM_WRITE)
    assert tm.data_version.counter == v0 + 1
    assert tm.dirty
    # Capped by the template's write queues.
    big = tm.create_in_send("Big", "TBW102", 64)
    assert big is not None
    assert big.write_queue_nums == 8
    # Existing topics are returned unchanged, no version bump.
    v1 = tm.data_version.counter
    assert tm.create_in_send("NewTopic", "TBW102", 2) == cfg
    assert tm.data_version.counter == v1
    # A non-inheritable template does not create.
    assert tm.create_in_send("X", "NewTopic", 4) is None
    assert tm.create_in_send("X", "Missing", 4) is None
    off = TopicManager(tmp_path / "off", auto_create_topic_enable=False)
    assert off.create_in_send("Y", "TBW102", 4) is None
    retry = tm.create_in_send_back("%RETRY%G", 1)
    assert (retry.read_queue_nums, retry.write_queue_nums, retry.perm) == (1, 1, 6)


def test_topic_table_persists_in_rocketmq_shape(tmp_path: Path) -> None:
    tm = TopicManager(tmp_path)
    tm.update(TopicConfig("T1", 3, 5, PERM_READ | PERM_WRITE, "MULTI_TAG", 0, True))
    tm.persist()
    raw = json.loads((tmp_path / "config" / "topics.json").read_bytes())
    assert raw["dataVersion"]["counter"] == tm.data_version.counter
    assert raw["topicConfigTable"]["T1"] == {
        "attributes": {},
        "order": True,
        "perm": 6,
        "readQueueNums": 3,
        "topicFilterType": "MULTI_TAG",
        "topicName": "T1",
        "topicSysFlag": 0,
        "writeQueueNums": 5,
    }
    tm.delete("TBW102")
    tm.persist()
    assert (tmp_path / "config" / "topics.json.bak").exists()
    again = TopicManager(tmp_path)
    again.load()
    assert again.get("T1") == tm.get("T1")
    assert again.data_version.counter == tm.data_version.counter
    assert "TBW102" in again  # built-in system topics come back


def test_topic_load_survives_a_torn_main_file(tmp_path: Path) -> None:
    tm = TopicManager(tmp_path)
    tm.update(TopicConfig("Keep", 2, 2))
    tm.persist()
    tm.update(TopicConfig("Keep2", 2, 2))
    tm.persist()  # .bak now holds the first version
    path = tmp_path / "config" / "topics.json"
    path.write_bytes(path.read_bytes()[:20])  # torn write
    again = TopicManager(tmp_path)
    again.load()
    assert again.get("Keep") == TopicConfig("Keep", 2, 2)


def test_topic_load_accepts_old_topic_syn_flag(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "topics.json").write_text(
        '{"dataVersion":{"counter":7,"timestamp":1},"topicConfigTable":{"Old":{"perm":6,'
        '"readQueueNums":2,"topicFilterType":"SINGLE_TAG","topicName":"Old","topicSynFlag":3,'
        '"writeQueueNums":2}}}'
    )
    tm = TopicManager(tmp_path)
    tm.load()
    assert tm.get("Old") == TopicConfig("Old", 2, 2, 6, topic_sys_flag=3)
    assert tm.data_version.counter == 7


def test_validate_topic() -> None:
    assert validate_topic("Topic_A-1%|x") is None
    assert validate_topic("a" * 127) is None
    assert validate_topic("a" * 128) is not None
    assert validate_topic("") is not None
    assert validate_topic("bad topic") is not None
    assert validate_topic("bad/topic") is not None
    assert PERM_INHERIT == 1


def test_offsets_round_trip_and_read_rocketmq_unquoted_keys(tmp_path: Path) -> None:
    om = OffsetManager(tmp_path)
    assert om.query("G", "T", 0) == -1
    om.commit("G", "T", 0, 12)
    om.commit("G", "T", 1, 7)
    dirty_before = om.dirty
    om.persist()
    assert (dirty_before, om.dirty) == (True, False)
    raw = json.loads((tmp_path / "config" / "consumerOffset.json").read_bytes())
    assert raw == {"offsetTable": {"T@G": {"0": 12, "1": 7}}}
    again = OffsetManager(tmp_path)
    again.load()
    assert again.query("G", "T", 1) == 7
    assert again.query_table("G", "T") == {0: 12, 1: 7}
    # A file written by Apache RocketMQ (fastjson: integer keys unquoted).
    d = tmp_path / "rmq"
    (d / "config").mkdir(parents=True)
    (d / "config" / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"%RETRY%G@G":{0:0},\n\t\t"T@G":{0:12,1:7,2:0}\n\t}\n}'
    )
    rmq = OffsetManager(d)
    rmq.load()
    assert rmq.query("G", "T", 1) == 7
    assert rmq.query("G", "%RETRY%G", 0) == 0
    assert rmq.topics_of_group("G") == {"T", "%RETRY%G"}
    rmq.remove_topics(["T"])
    assert rmq.query("G", "T", 1) == -1


def test_offset_persist_is_crash_safe(tmp_path: Path) -> None:
    om = OffsetManager(tmp_path)
    om.commit("G", "T", 0, 1)
    om.persist()
    om.commit("G", "T", 0, 2)
    om.persist()
    path = tmp_path / "config" / "consumerOffset.json"
    # A crash that left the main file empty: the .bak (previous version) is used.
    path.write_bytes(b"")
    again = OffsetManager(tmp_path)
    again.load()
    assert again.query("G", "T", 0) == 1
    assert not path.with_name("consumerOffset.json.tmp").exists()


def test_subscription_groups(tmp_path: Path) -> None:
    sm = SubscriptionManager(tmp_path)
    assert sm.get("G") is None
    cfg = sm.find_or_create("G")
    assert cfg is not None
    assert cfg.retry_max_times == 16
    sm.persist()
    again = SubscriptionManager(tmp_path)
    again.load()
    assert again.get("G") == cfg
    raw = json.loads((tmp_path / "config" / "subscriptionGroup.json").read_bytes())
    assert raw["subscriptionGroupTable"]["G"]["retryQueueNums"] == 1
    assert SubscriptionManager(tmp_path, auto_create=False).find_or_create("H") is None


def test_consumer_membership_changes_and_expiry() -> None:
    cm = ConsumerManager()
    a, b = FakeChannel(1), FakeChannel(2)
    sub = SubscriptionData("T", "*", sub_version=1)
    kw = {
        "consume_type": "CONSUME_PASSIVELY",
        "message_model": "CLUSTERING",
        "consume_from_where": "CONSUME_FROM_LAST_OFFSET",
    }
    assert cm.register("G", ClientChannelInfo(a, "c1"), subscriptions=[sub], now_ms=0, **kw)
    # A repeated heartbeat is not a change.
    assert not cm.register("G", ClientChannelInfo(a, "c1"), subscriptions=[sub], now_ms=10, **kw)
    assert cm.register("G", ClientChannelInfo(b, "c2"), subscriptions=[sub], now_ms=20, **kw)
    info = cm.get("G")
    assert info is not None
    assert info.client_ids() == ["c1", "c2"]
    assert cm.find_subscription("G", "T") == sub
    # An older subVersion does not replace a newer subscription.
    older = SubscriptionData("T", "x", sub_version=0)
    cm.register("G", ClientChannelInfo(a, "c1"), subscriptions=[older], now_ms=30, **kw)
    assert cm.find_subscription("G", "T") == sub
    assert cm.remove_channel(b) == ["G"]
    assert cm.get("G") is not None
    assert cm.scan_idle(120_000, now_ms=30 + 120_000) == []
    assert cm.scan_idle(120_000, now_ms=30 + 120_001) == [("G", a)]
    assert cm.get("G") is None
    assert not cm.unregister("G", "c1")


def test_producer_manager() -> None:
    pm = ProducerManager()
    ch = FakeChannel(1)
    pm.register("PG", ClientChannelInfo(ch, "p1"), now_ms=0)
    assert [m.client_id for m in pm.members("PG")] == ["p1"]
    assert pm.scan_idle(100, now_ms=50) == []
    pm.remove_channel(ch)
    assert pm.groups() == []
    pm.register("PG", ClientChannelInfo(ch, "p1"), now_ms=0)
    assert pm.unregister("PG", "p1")
    assert not pm.unregister("PG", "p1")


def test_queue_locks_expire_and_renew() -> None:
    from broker.queue_locks import QueueLockManager
    from remoting.protocol.bodies import MessageQueue

    locks = QueueLockManager(lock_max_live_ms=60_000)
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert locks.try_lock_batch("G", [q0, q1], "c1", now=0) == {q0, q1}
    assert locks.try_lock_batch("G", [q0, q1], "c2", now=10) == set()
    assert locks.try_lock_batch("G", [q0], "c1", now=50_000) == {q0}  # renewal
    # q1 was not renewed: free for c2 after 60 s; q0 still c1's.
    assert locks.try_lock_batch("G", [q0, q1], "c2", now=60_001) == {q1}
    assert locks.is_locked("G", q0, "c1", now=60_001)
    locks.unlock_batch("G", [q0], "c2")  # not the holder: no effect
    assert locks.is_locked("G", q0, "c1", now=60_001)
    locks.unlock_batch("G", [q0], "c1")
    assert locks.try_lock_batch("G", [q0], "c2", now=60_002) == {q0}
    # Groups are independent.
    assert locks.try_lock_batch("H", [q0], "c1", now=60_002) == {q0}

"""JSON bodies: exact field names, round trips, and fastjson's non-standard keys."""

from __future__ import annotations

import json

import pytest

from remoting.protocol.bodies import (
    ConnectionInfo,
    ConsumerConnection,
    ConsumerData,
    ConsumerListBody,
    ConsumeStats,
    ConsumeStatsList,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetWrapper,
    ProducerData,
    ResetOffsetBody,
    SubscriptionData,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicOffset,
    TopicStatsTable,
    UnlockBatchRequestBody,
    loads_tolerant,
)

# A heartbeat as a Java 5.x push consumer sends it (fastjson: alphabetical keys; 4.9 has no
# heartbeatFingerprint / withoutSub).
JAVA_HEARTBEAT = (
    b'{"clientID":"192.0.2.7@1234#5678","consumerDataSet":[{"consumeFromWhere":'
    b'"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"CG",'
    b'"messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":false,'
    b'"codeSet":[2598919,2598920],"expressionType":"TAG","subString":"TagA || TagB",'
    b'"subVersion":1700000000000,"tagsSet":["TagA","TagB"],"topic":"T"},'
    b'{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*",'
    b'"subVersion":1700000000001,"tagsSet":[],"topic":"%RETRY%CG"}],"unitMode":false}],'
    b'"heartbeatFingerprint":0,'
    b'"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],"withoutSub":false}'
)


def test_heartbeat_parses_java_bytes_and_writes_them_back_identically() -> None:
    hb = HeartbeatData.from_json(JAVA_HEARTBEAT)
    assert hb.client_id == "192.0.2.7@1234#5678"
    assert [p.group_name for p in hb.producer_data_set] == ["CLIENT_INNER_PRODUCER"]
    (cd,) = hb.consumer_data_set
    assert (cd.group_name, cd.consume_type, cd.message_model) == (
        "CG",
        "CONSUME_PASSIVELY",
        "CLUSTERING",
    )
    sub = cd.subscription_data_set[0]
    assert sub.topic == "T"
    assert sub.sub_string == "TagA || TagB"
    assert sub.tags_set == ["TagA", "TagB"]
    assert sub.code_set == [2598919, 2598920]
    assert sub.sub_version == 1700000000000
    assert hb.to_json() == JAVA_HEARTBEAT


def test_heartbeat_tolerates_missing_optional_fields() -> None:
    hb = HeartbeatData.from_json(b'{"clientID":"c1"}')
    assert hb == HeartbeatData("c1")
    with pytest.raises(ValueError, match="clientID"):
        HeartbeatData.from_json(b'{"consumerDataSet":[]}')
    with pytest.raises(ValueError):
        HeartbeatData.from_json(b"[1,2]")
    with pytest.raises(ValueError):
        HeartbeatData.from_json(b"not json")


def test_unquoted_integer_keys_and_object_keys_are_accepted() -> None:
    raw = loads_tolerant(b'{"offsetTable":{"T@G":{0:12,1:7,-1:3}}}')
    assert raw == {"offsetTable": {"T@G": {"0": 12, "1": 7, "-1": 3}}}
    # A string value that looks like a key stays untouched.
    raw = loads_tolerant(b'{"a":"{0:1}",1:"x,2:y"}')
    assert raw == {"a": "{0:1}", "1": "x,2:y"}
    # Object keys as fastjson writes Map<MessageQueue, ...>.
    text = (
        b'{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:5,'
        b'{"brokerName":"b","queueId":0,"topic":"T"}:4}}'
    )
    body = ResetOffsetBody.from_json(text)
    assert body.offset_table == {MessageQueue("T", "b", 1): 5, MessageQueue("T", "b", 0): 4}


def test_message_queue_keyed_maps_round_trip_in_fastjson_form() -> None:
    mq0, mq1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    stats = ConsumeStats({mq1: OffsetWrapper(10, 4, 99), mq0: OffsetWrapper(3, 3, 0)}, 1.5)
    data = stats.to_json()
    assert data == (
        b'{"consumeTps":1.5,"offsetTable":{'
        b'{"brokerName":"b","queueId":0,"topic":"T"}:'
        b'{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":0,"pullOffset":0},'
        b'{"brokerName":"b","queueId":1,"topic":"T"}:'
        b'{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":99,"pullOffset":0}}}'
    )
    assert ConsumeStats.from_json(data) == stats
    table = TopicStatsTable({mq0: TopicOffset(0, 8, 1700000000000)})
    assert TopicStatsTable.from_json(table.to_json()) == table
    assert b'"lastUpdateTimestamp":1700000000000,"maxOffset":8,"minOffset":0' in table.to_json()


def test_consume_stats_list_nests_groups_and_their_stats() -> None:
    mq = MessageQueue("T", "b", 0)
    body = ConsumeStatsList(
        "127.0.0.1:10911",
        [{"G": [ConsumeStats({mq: OffsetWrapper(7, 4, 99, 4)}, 0.5)]}, {"Idle": []}],
        3,
    )
    data = body.to_json()
    assert data == (
        b'{"brokerAddr":"127.0.0.1:10911","consumeStatsList":[{"G":[{"consumeTps":0.5,'
        b'"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"brokerOffset":7,'
        b'"consumerOffset":4,"lastTimestamp":99,"pullOffset":4}}}]},{"Idle":[]}],"totalDiff":3}'
    )
    assert ConsumeStatsList.from_json(data) == body
    # Entries that are not maps (a broker's bug or a stranger's bytes) are skipped.
    odd = ConsumeStatsList.from_json(b'{"consumeStatsList":[1,"x",{"G":[]}],"totalDiff":"2"}')
    assert odd.consume_stats_list == [{"G": []}]
    assert odd.total_diff == 2


def test_exact_field_names_of_small_bodies() -> None:
    assert ConsumerListBody(["a", "b"]).to_json() == b'{"consumerIdList":["a","b"]}'
    assert KVTable({"b": "2", "a": "1"}).to_json() == b'{"table":{"a":"1","b":"2"}}'
    assert ProducerData("PG").to_json() == b'{"groupName":"PG"}'
    lock = LockBatchRequestBody("CG", "cid", [MessageQueue("T", "b", 2)])
    assert lock.to_json() == (
        b'{"clientId":"cid","consumerGroup":"CG",'
        b'"mqSet":[{"brokerName":"b","queueId":2,"topic":"T"}],"onlyThisBroker":false}'
    )
    assert LockBatchRequestBody.from_json(lock.to_json()) == lock
    unlock = UnlockBatchRequestBody("CG", "cid", [MessageQueue("T", "b", 2)])
    assert UnlockBatchRequestBody.from_json(unlock.to_json()) == unlock
    resp = LockBatchResponseBody([MessageQueue("T", "b", 0)])
    assert resp.to_json() == b'{"lockOKMQSet":[{"brokerName":"b","queueId":0,"topic":"T"}]}'
    assert LockBatchResponseBody.from_json(resp.to_json()) == resp


def test_consumer_connection_round_trip() -> None:
    cc = ConsumerConnection(
        [ConnectionInfo("cid", "127.0.0.1:5555", "JAVA", 409)],
        {"T": SubscriptionData("T", "*", sub_version=5)},
        "CONSUME_PASSIVELY",
        "CLUSTERING",
        "CONSUME_FROM_LAST_OFFSET",
    )
    raw = json.loads(cc.to_json())
    assert raw["connectionSet"] == [
        {"clientAddr": "127.0.0.1:5555", "clientId": "cid", "language": "JAVA", "version": 409}
    ]
    assert raw["subscriptionTable"]["T"]["subVersion"] == 5
    assert ConsumerConnection.from_json(cc.to_json()) == cc


def test_subscription_group_wrapper_matches_rocketmq_file_shape() -> None:
    w = SubscriptionGroupWrapper(
        {"G": SubscriptionGroupConfig("G")}, {"counter": 2, "stateVersion": 0, "timestamp": 7}
    )
    raw = json.loads(w.to_json())
    assert raw == {
        "dataVersion": {"counter": 2, "stateVersion": 0, "timestamp": 7},
        "forbiddenTable": {},
        "subscriptionGroupTable": {
            "G": {
                "attributes": {},
                "brokerId": 0,
                "consumeBroadcastEnable": True,
                "consumeEnable": True,
                "consumeFromMinEnable": True,
                "consumeMessageOrderly": False,
                "consumeTimeoutMinute": 15,
                "groupName": "G",
                "groupRetryPolicy": {"type": "CUSTOMIZED"},
                "groupSysFlag": 0,
                "notifyConsumerIdsChangedEnable": True,
                "retryMaxTimes": 16,
                "retryQueueNums": 1,
                "whichBrokerWhenConsumeSlowly": 1,
            }
        },
    }
    assert SubscriptionGroupWrapper.from_json(w.to_json()) == w


def test_consumer_data_defaults_round_trip() -> None:
    cd = ConsumerData("G", subscription_data_set=[SubscriptionData("T", "a || b", ["a", "b"])])
    assert ConsumerData.from_json(cd.to_json()) == cd

"""Answer bodies against Apache RocketMQ 5.x's shapes (docs/protocol.md, "Answer bodies").

Each literal below is written the way Apache 5.x's fastjson writes the body: bean properties in
alphabetical order, null fields left out, primitives always present, `Map<Long/Integer, ..>`
keys as bare numbers where the plain encoder is used, `Map<MessageQueue, ..>` keys as objects.
trimq must write the 5.x shape (4.x clients ignore the extra fields) and read all of it back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from namesrv.kv_config import KVConfig
from namesrv.processors import NamesrvProcessors
from namesrv.route_table import RouteTable
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol.bodies import (
    ConnectionInfo,
    ConsumerConnection,
    ConsumerListBody,
    ConsumeStats,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetWrapper,
    ProducerConnection,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicOffset,
    TopicStatsTable,
    UnlockBatchRequestBody,
)
from remoting.protocol.route import (
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicQueueMappingInfo,
    TopicRouteData,
)

# The NameServer processors read nothing of the connection for these codes.
NO_CONN: Any = None

# -- GET_ROUTEINFO_BY_TOPIC (105) -------------------------------------------------------------

# What Apache 5.x's NameServer answers a client older than V4_9_4 that does not ask for standard
# JSON: plain fastjson, so `brokerAddrs` keys are bare numbers.
APACHE_ROUTE_FASTJSON = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false},'
    b'{"brokerAddrs":{1:"127.0.0.1:10941"},"brokerName":"broker-b","cluster":"DefaultCluster",'
    b'"enableActingMaster":true,"zoneName":"zone-1"}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
    b'"writeQueueNums":4},{"brokerName":"broker-b","perm":4,"readQueueNums":2,'
    b'"topicSysFlag":0,"writeQueueNums":2}]}'
)

# A static topic's route (5.x only): `topicQueueMappingByBroker`, with `currIdMap` keyed by
# bare logical queue ids; plus a property trimq does not know.
APACHE_STATIC_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"c","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[],'
    b'"someFutureField":[1,2],"topicQueueMappingByBroker":{"broker-a":{"bname":"broker-a",'
    b'"currIdMap":{0:0,1:1},"dirty":false,"epoch":1700000000000,"scope":"__global__",'
    b'"topic":"ST","totalQueues":2}}}'
)


def test_route_written_in_5x_shape() -> None:
    route = TopicRouteData(
        queue_datas=[QueueData("broker-a", 4, 4, 6, 0)],
        broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})],
    )
    assert route.to_json() == (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},'
        b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
        b'"writeQueueNums":4}]}'
    )
    # zoneName only when set (Apache leaves the null out); the mapping only for static topics.
    route.broker_datas[0].zone_name = "z"
    route.broker_datas[0].enable_acting_master = True
    assert b'"enableActingMaster":true,"zoneName":"z"}' in route.to_json()
    assert b"topicQueueMappingByBroker" not in route.to_json()


def test_route_read_from_apache_fastjson() -> None:
    route = TopicRouteData.from_json(APACHE_ROUTE_FASTJSON)
    a, b = route.broker_datas
    assert a == BrokerData(
        "DefaultCluster", "broker-a", {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
    )
    assert (b.enable_acting_master, b.zone_name, b.broker_addrs) == (
        True,
        "zone-1",
        {1: "127.0.0.1:10941"},
    )
    assert [q.broker_name for q in route.queue_datas] == ["broker-a", "broker-b"]
    assert route.topic_queue_mapping_by_broker is None
    # Round trip: trimq writes standard JSON (quoted keys), otherwise the same.
    again = TopicRouteData.from_json(route.to_json())
    assert again == route


def test_static_topic_route_read_and_kept() -> None:
    route = TopicRouteData.from_json(APACHE_STATIC_ROUTE)
    assert route.topic_queue_mapping_by_broker == {
        "broker-a": TopicQueueMappingInfo(
            topic="ST",
            bname="broker-a",
            total_queues=2,
            epoch=1700000000000,
            dirty=False,
            scope="__global__",
            curr_id_map={0: 0, 1: 1},
        )
    }
    text = route.to_json()
    assert text.endswith(
        b'"topicQueueMappingByBroker":{"broker-a":{"bname":"broker-a","currIdMap":{"0":0,"1":1},'
        b'"dirty":false,"epoch":1700000000000,"scope":"__global__","topic":"ST",'
        b'"totalQueues":2}}}'
    )
    assert TopicRouteData.from_json(text) == route


def test_route_missing_optional_fields_default() -> None:
    route = TopicRouteData.from_json(
        b'{"brokerDatas":[{"brokerName":"b","cluster":"c"}],"queueDatas":null}'
    )
    assert route.broker_datas == [BrokerData("c", "b", {}, False, None)]
    assert route.queue_datas == []
    assert route.filter_server_table == {}


async def test_namesrv_route_carries_5x_broker_fields() -> None:
    p = NamesrvProcessors(RouteTable(), KVConfig(), now_ms=lambda: 0)
    handlers = p.handlers()
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper({"T": TopicConfig("T", 4, 4, 6)}, DataVersion(1, 1, 0))
    ).to_json()
    fields = {
        "brokerName": "broker-a",
        "brokerAddr": "127.0.0.1:10911",
        "clusterName": "DefaultCluster",
        "haServerAddr": "127.0.0.1:10912",
        "brokerId": "0",
    }

    async def route() -> dict[str, object]:
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        resp = await handlers[cmd.code](NO_CONN, cmd)
        assert resp is not None
        assert resp.code == ResponseCode.SUCCESS
        doc = json.loads(resp.body_bytes())
        assert isinstance(doc, dict)
        return dict(doc["brokerDatas"][0])

    # A 4.x broker (no enableActingMaster header field): false, no zoneName.
    reg = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
    assert (await handlers[reg.code](NO_CONN, reg)).code == ResponseCode.SUCCESS  # type: ignore[union-attr]
    assert await route() == {
        "brokerAddrs": {"0": "127.0.0.1:10911"},
        "brokerName": "broker-a",
        "cluster": "DefaultCluster",
        "enableActingMaster": False,
    }
    # A 5.x broker with acting master on and a zone.
    fields5 = dict(fields, enableActingMaster="true", __ZONE_NAME="zone-1")
    reg = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields5, body)
    assert (await handlers[reg.code](NO_CONN, reg)).code == ResponseCode.SUCCESS  # type: ignore[union-attr]
    got = await route()
    assert (got["enableActingMaster"], got["zoneName"]) == (True, "zone-1")
    # GET_BROKER_CLUSTER_INFO shows the same BrokerData.
    cmd = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
    resp = await handlers[cmd.code](NO_CONN, cmd)
    assert resp is not None
    ci = ClusterInfo.from_json(resp.body_bytes())
    assert ci.broker_addr_table["broker-a"].zone_name == "zone-1"


# -- GET_BROKER_CLUSTER_INFO (106), topic lists (206, 224), KV list --------------------------

APACHE_CLUSTER_INFO = (
    b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}},'
    b'"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
)


def test_cluster_info_both_ways() -> None:
    ci = ClusterInfo.from_json(APACHE_CLUSTER_INFO)
    assert ci.broker_addr_table["broker-a"].broker_addrs == {0: "127.0.0.1:10911"}
    assert ci.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
    assert ci.to_json() == APACHE_CLUSTER_INFO.replace(b"{0:", b'{"0":')


def test_topic_list_and_kv_table_from_apache() -> None:
    assert TopicList.from_json(b'{"topicList":["A","%RETRY%G"]}').topic_list == ["A", "%RETRY%G"]
    tl = TopicList.from_json(b'{"brokerAddr":"127.0.0.1:10911","topicList":[]}')
    assert tl.broker_addr == "127.0.0.1:10911"
    assert KVTable.from_json(b'{"table":{"brokerVersion":"479","x":"1"}}').table == {
        "brokerVersion": "479",
        "x": "1",
    }


# -- heartbeat (34), consumer list (38), locks (41, 42) ----------------------------------------


def test_heartbeat_5x_fields() -> None:
    hb = HeartbeatData("cid")
    assert hb.to_json() == (
        b'{"clientID":"cid","consumerDataSet":[],"heartbeatFingerprint":0,'
        b'"producerDataSet":[],"withoutSub":false}'
    )
    v2 = HeartbeatData.from_json(
        b'{"clientID":"cid","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[]}],'
        b'"heartbeatFingerprint":-12345,"producerDataSet":[],"withoutSub":true}'
    )
    assert (v2.heartbeat_fingerprint, v2.without_sub) == (-12345, True)
    # Some non-Java clients spell the property after the Java field.
    assert HeartbeatData.from_json(b'{"clientID":"c","isWithoutSub":true}').without_sub
    # 4.x form: both default.
    old = HeartbeatData.from_json(b'{"clientID":"c","producerDataSet":[{"groupName":"P"}]}')
    assert (old.heartbeat_fingerprint, old.without_sub) == (0, False)


def test_consumer_list_from_apache() -> None:
    body = ConsumerListBody.from_json(b'{"consumerIdList":["127.0.0.1@1#2","127.0.0.1@3#4"]}')
    assert body.consumer_id_list == ["127.0.0.1@1#2", "127.0.0.1@3#4"]
    assert ConsumerListBody.from_json(b"{}").consumer_id_list == []


def test_lock_bodies_5x() -> None:
    mq = MessageQueue("T", "broker-a", 3)
    req = LockBatchRequestBody.from_json(
        b'{"clientId":"cid","consumerGroup":"G","mqSet":[{"brokerName":"broker-a",'
        b'"queueId":3,"topic":"T"}],"onlyThisBroker":true}'
    )
    assert req == LockBatchRequestBody("G", "cid", [mq], only_this_broker=True)
    assert UnlockBatchRequestBody("G", "cid", [mq]).to_json() == (
        b'{"clientId":"cid","consumerGroup":"G","mqSet":[{"brokerName":"broker-a",'
        b'"queueId":3,"topic":"T"}],"onlyThisBroker":false}'
    )
    resp = LockBatchResponseBody.from_json(
        b'{"lockOKMQSet":[{"brokerName":"broker-a","queueId":3,"topic":"T"}]}'
    )
    assert resp.lock_ok_mq_set == [mq]
    assert LockBatchResponseBody.from_json(b"{}").lock_ok_mq_set == []


# -- admin: consume stats (208), topic stats (202), connections (203, 204), groups (201) --------

APACHE_CONSUME_STATS = (
    b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
    b'{"brokerOffset":10,"consumerOffset":7,"lastTimestamp":1700000000000,"pullOffset":9}}}'
)


def test_consume_stats_both_ways() -> None:
    stats = ConsumeStats.from_json(APACHE_CONSUME_STATS)
    mq = MessageQueue("T", "broker-a", 0)
    assert stats.offset_table == {mq: OffsetWrapper(10, 7, 1700000000000, 9)}
    assert stats.consume_tps == 0.0
    assert stats.to_json() == APACHE_CONSUME_STATS
    # 4.x form (no pullOffset) still reads.
    old = ConsumeStats.from_json(
        b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
        b'{"brokerOffset":3,"consumerOffset":2,"lastTimestamp":0}}}'
    )
    assert old.offset_table[MessageQueue("T", "b", 1)].pull_offset == 0


def test_topic_stats_table_both_ways() -> None:
    text = (
        b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
        b'{"lastUpdateTimestamp":1700000000000,"maxOffset":8,"minOffset":0}},"topicPutTps":0.0}'
    )
    table = TopicStatsTable.from_json(text)
    assert table.offset_table == {
        MessageQueue("T", "broker-a", 0): TopicOffset(0, 8, 1700000000000)
    }
    assert table.to_json() == text
    assert TopicStatsTable.from_json(b'{"offsetTable":{}}').topic_put_tps == 0.0


def test_connections_both_ways() -> None:
    pc = ProducerConnection([ConnectionInfo("cid", "127.0.0.1:50000", "JAVA", 479)])
    text = (
        b'{"connectionSet":[{"clientAddr":"127.0.0.1:50000","clientId":"cid",'
        b'"language":"JAVA","version":479}]}'
    )
    assert pc.to_json() == text
    assert ProducerConnection.from_json(text) == pc
    cc = ConsumerConnection.from_json(
        b'{"connectionSet":[{"clientAddr":"127.0.0.1:50000","clientId":"cid",'
        b'"language":"CPP","version":63}],"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
        b'"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","subscriptionTable":'
        b'{"T":{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*",'
        b'"subVersion":1700000000000,"tagsSet":[],"topic":"T"}}}'
    )
    assert cc.connection_set == [ConnectionInfo("cid", "127.0.0.1:50000", "CPP", 63)]
    assert cc.subscription_table["T"].sub_version == 1700000000000


APACHE_GROUP = (
    b'{"attributes":{},"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,'
    b'"consumeFromMinEnable":true,"consumeMessageOrderly":true,"consumeTimeoutMinute":30,'
    b'"groupName":"G","groupRetryPolicy":{"exponentialRetryPolicy":{"initial":1000,'
    b'"max":60000,"multiplier":2},"type":"EXPONENTIAL"},"groupSysFlag":0,'
    b'"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":3,"retryQueueNums":1,'
    b'"subscriptionDataSet":[{"expressionType":"TAG","topic":"T"}],'
    b'"whichBrokerWhenConsumeSlowly":1}'
)


def test_subscription_group_5x_fields_kept() -> None:
    cfg = SubscriptionGroupConfig.from_json(APACHE_GROUP)
    assert (cfg.retry_max_times, cfg.consume_message_orderly, cfg.consume_timeout_minute) == (
        3,
        True,
        30,
    )
    assert cfg.group_retry_policy["type"] == "EXPONENTIAL"
    assert cfg.to_json() == APACHE_GROUP
    # The default as Apache 5.x writes it (subscriptionDataSet null: left out).
    assert SubscriptionGroupConfig("G").to_json() == (
        b'{"attributes":{},"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,'
        b'"consumeFromMinEnable":true,"consumeMessageOrderly":false,"consumeTimeoutMinute":15,'
        b'"groupName":"G","groupRetryPolicy":{"type":"CUSTOMIZED"},"groupSysFlag":0,'
        b'"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":16,"retryQueueNums":1,'
        b'"whichBrokerWhenConsumeSlowly":1}'
    )
    # Booleans as fastjson also accepts them.
    assert not SubscriptionGroupConfig.from_json(
        b'{"groupName":"G","consumeEnable":"false"}'
    ).consume_enable


def test_subscription_group_wrapper_from_apache() -> None:
    text = (
        b'{"dataVersion":{"counter":5,"stateVersion":2,"timestamp":1700000000000},'
        b'"forbiddenTable":{"G":{"T":1}},"subscriptionGroupTable":{"G":' + APACHE_GROUP + b"}}"
    )
    w = SubscriptionGroupWrapper.from_json(text)
    assert w.data_version == {"counter": 5, "stateVersion": 2, "timestamp": 1700000000000}
    assert w.forbidden_table == {"G": {"T": 1}}
    assert w.to_json() == text


# -- GET_ALL_TOPIC_CONFIG (21) and the register body's topic text --------------------------------


def test_topic_config_wrapper_from_apache_5x() -> None:
    # 5.x answers TopicConfigAndMappingSerializeWrapper: the mapping maps are ignored.
    text = (
        b'{"dataVersion":{"counter":2,"stateVersion":0,"timestamp":1700000000000},'
        b'"mappingDataVersion":{"counter":0,"stateVersion":0,"timestamp":1700000000000},'
        b'"topicConfigTable":{"T":{"attributes":{"+message.type":"FIFO"},"order":false,'
        b'"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T",'
        b'"topicSysFlag":0,"writeQueueNums":4}},"topicQueueMappingDetailMap":{},'
        b'"topicQueueMappingInfoMap":{}}'
    )
    w = TopicConfigSerializeWrapper.from_json(text)
    tc = w.topic_config_table["T"]
    assert tc.attributes == {"+message.type": "FIFO"}
    assert w.data_version == DataVersion(1700000000000, 2, 0)
    assert tc.to_json() == (
        b'{"attributes":{"+message.type":"FIFO"},"order":false,"perm":6,"readQueueNums":4,'
        b'"topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,"writeQueueNums":4}'
    )


@pytest.mark.parametrize(
    ("text", "attributes"),
    [
        ("T 4 4 6 SINGLE_TAG", {}),
        ("T 4 4 6 SINGLE_TAG {}", {}),
        ('T 4 4 6 SINGLE_TAG {"+message.type":"NORMAL"}', {"+message.type": "NORMAL"}),
        ('T 4 4 6 SINGLE_TAG {"a b":"c d"}', {"a b": "c d"}),
        ("T 4 4 6 SINGLE_TAG not-json", {}),
    ],
)
def test_topic_config_text_5x_sixth_field(text: str, attributes: dict[str, str]) -> None:
    tc = TopicConfig.decode_text(text)
    assert (tc.topic_name, tc.read_queue_nums, tc.perm, tc.attributes) == ("T", 4, 6, attributes)
    # Written in 4.x's five-field form (4.x NameServers refuse a sixth).
    assert tc.encode_text() == "T 4 4 6 SINGLE_TAG"

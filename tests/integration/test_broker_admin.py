"""Broker admin requests, client notifications and the in-process controller."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.message import decode_offset_msg_id, decode_records
from remoting import (
    Connection,
    RemotingClient,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from remoting.protocol.bodies import (
    ConsumerConnection,
    ConsumerData,
    ConsumeStats,
    HeartbeatData,
    MessageQueue,
    SubscriptionData,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicStatsTable,
)
from remoting.protocol.route import TopicConfigSerializeWrapper, TopicRouteData
from tests.helpers import free_port, json_request, wait_until
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_broker_process import (
    SMALL_STORE,
    StartBroker,
    pull_request,
    send_request,
)

# Every in-process store here keeps the staging rule (the test fails otherwise).
pytestmark = pytest.mark.usefixtures("staging_guard")


async def test_admin_topic_lifecycle_and_queries(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker: BrokerProc = start_broker(namesrv.addr, env=SMALL_STORE)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:

        async def call(cmd: RemotingCommand, addr: str = broker.addr) -> RemotingCommand:
            return await client.invoke(addr, cmd)

        create = {
            "topic": "AdminT",
            "defaultTopic": "TBW102",
            "readQueueNums": "2",
            "writeQueueNums": "2",
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
        }
        resp = await call(json_request(RequestCode.UPDATE_AND_CREATE_TOPIC, create))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        for bad in ({"readQueueNums": "0"}, {"topic": "bad name"}, {"perm": "99"}):
            resp = await call(json_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {**create, **bad}))
            assert resp.code == ResponseCode.SYSTEM_ERROR, bad
        resp = await call(json_request(RequestCode.GET_ALL_TOPIC_CONFIG))
        table = TopicConfigSerializeWrapper.from_json(resp.body_bytes()).topic_config_table
        assert table["AdminT"].read_queue_nums == 2

        async def routed() -> bool:
            r = await call(
                json_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "AdminT"}), namesrv.addr
            )
            return r.code == ResponseCode.SUCCESS

        await wait_until(routed, what="route of the created topic")
        r = await call(
            json_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "AdminT"}), namesrv.addr
        )
        assert TopicRouteData.from_json(r.body_bytes()).queue_datas[0].write_queue_nums == 2

        # Messages with keys, then offset and lookup queries.
        t0 = int(time.time() * 1000)
        ids = []
        for i in range(3):
            resp = await call(send_request("AdminT", f"m{i}".encode(), props={"KEYS": f"key{i}"}))
            assert resp.code == ResponseCode.SUCCESS
            ids.append((resp.ext_fields or {})["msgId"])
        q = {"topic": "AdminT", "queueId": "0"}
        resp = await call(json_request(RequestCode.GET_MAX_OFFSET, q))
        assert (resp.ext_fields or {})["offset"] == "3"
        resp = await call(json_request(RequestCode.GET_MIN_OFFSET, q))
        assert (resp.ext_fields or {})["offset"] == "0"
        resp = await call(json_request(RequestCode.GET_EARLIEST_MSG_STORETIME, q))
        assert int((resp.ext_fields or {})["timestamp"]) >= t0 - 1000
        resp = await call(
            json_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": "0"})
        )
        assert resp.code == ResponseCode.SUCCESS
        assert (resp.ext_fields or {})["offset"] == "0"
        _, phy = decode_offset_msg_id(ids[1])
        resp = await call(json_request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(phy)}))
        assert resp.code == ResponseCode.SUCCESS
        assert decode_records(resp.body_bytes())[0].body == b"m1"

        async def found_by_key() -> bool:
            r = await call(
                json_request(
                    RequestCode.QUERY_MESSAGE,
                    {
                        "topic": "AdminT",
                        "key": "key2",
                        "maxNum": "32",
                        "beginTimestamp": "0",
                        "endTimestamp": str(2**62),
                    },
                )
            )
            return r.code == ResponseCode.SUCCESS and [
                m.body for m in decode_records(r.body_bytes())
            ] == [b"m2"]

        await wait_until(found_by_key, what="message by key")
        resp = await call(json_request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "AdminT"}))
        stats = TopicStatsTable.from_json(resp.body_bytes())
        assert stats.offset_table[MessageQueue("AdminT", "broker-a", 0)].max_offset == 3
        resp = await call(json_request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Nope"}))
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST

        # Consume stats after a commit.
        await call(
            json_request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "AG", "topic": "AdminT", "queueId": "0", "commitOffset": "2"},
            )
        )
        resp = await call(json_request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "AG"}))
        cs = ConsumeStats.from_json(resp.body_bytes())
        ow = cs.offset_table[MessageQueue("AdminT", "broker-a", 0)]
        assert (ow.broker_offset, ow.consumer_offset) == (3, 2)

        # Subscription groups.
        body = SubscriptionGroupConfig("SG1", retry_max_times=3).to_json()
        resp = await call(json_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body))
        assert resp.code == ResponseCode.SUCCESS
        resp = await call(json_request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
        groups = SubscriptionGroupWrapper.from_json(resp.body_bytes()).subscription_group_table
        assert groups["SG1"].retry_max_times == 3

        resp = await call(json_request(RequestCode.GET_BROKER_CONFIG))
        text = resp.body_bytes().decode()
        assert "brokerName=broker-a" in text
        assert "brokerClusterName=DefaultCluster" in text

        # Delete: the topic, its offsets and its route go.
        resp = await call(json_request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "AdminT"}))
        assert resp.code == ResponseCode.SUCCESS
        resp = await call(pull_request("AdminT", 0))
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        resp = await call(json_request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TBW102"}))
        assert resp.code == ResponseCode.SYSTEM_ERROR


def _heartbeat(client_id: str, group: str) -> RemotingCommand:
    hb = HeartbeatData(
        client_id,
        consumer_data_set=[
            ConsumerData(group, subscription_data_set=[SubscriptionData("NotifyT", "*")])
        ],
    )
    return json_request(RequestCode.HEART_BEAT, None, hb.to_json())


async def test_consumer_ids_changed_notifications(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker: BrokerProc = start_broker(namesrv.addr, env=SMALL_STORE)
    notified: list[str] = []

    async def on_notify(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        assert cmd.is_oneway
        notified.append((cmd.ext_fields or {})["consumerGroup"])
        return None

    async with (
        RemotingClient(serialize_type=SerializeType.JSON) as c1,
        RemotingClient(serialize_type=SerializeType.MSGPACK) as c2,
    ):
        c1.processors.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
        resp = await c1.invoke(broker.addr, _heartbeat("c1", "NG"))
        assert resp.code == ResponseCode.SUCCESS
        await wait_until(lambda: notified == ["NG"], what="notify after own join")
        resp = await c2.invoke(broker.addr, _heartbeat("c2", "NG"))
        await wait_until(lambda: notified == ["NG", "NG"], what="notify when c2 joins")
        # A repeated heartbeat changes nothing.
        await c2.invoke(broker.addr, _heartbeat("c2", "NG"))
        resp = await c1.invoke(
            broker.addr,
            json_request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "NG"}),
        )
        conns = ConsumerConnection.from_json(resp.body_bytes())
        assert sorted(c.client_id for c in conns.connection_set) == ["c1", "c2"]
        assert "NotifyT" in conns.subscription_table
        # c2's connection closes: c1 is told at once.
        await c2.close_connection(broker.addr)
        await wait_until(lambda: len(notified) == 3, what="notify when c2 leaves")
        resp = await c1.invoke(
            broker.addr,
            json_request(RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "NG"}),
        )
        assert resp.code == ResponseCode.SUCCESS
        resp = await c1.invoke(
            broker.addr,
            json_request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "NG"}),
        )
        assert resp.code == ResponseCode.CONSUMER_NOT_ONLINE


async def test_idle_client_dropped(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    env = {
        **SMALL_STORE,
        "TRIMQ_CHANNEL_IDLE_TIMEOUT_MS": "500",
        "TRIMQ_CLIENT_SCAN_INTERVAL_MS": "200",
    }
    broker: BrokerProc = start_broker(namesrv.addr, env=env)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        await client.invoke(broker.addr, _heartbeat("idle", "IG"))
        assert client.connection(broker.addr) is not None
        await wait_until(
            lambda: client.connection(broker.addr) is None, what="idle connection closed"
        )
        resp = await client.invoke(
            broker.addr,
            json_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "IG"}),
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR


async def test_in_process_controller_async_with(tmp_path: Path) -> None:
    port = free_port()
    cfg = BrokerConfig(
        listen=f"127.0.0.1:{port}",
        store_dir=str(tmp_path / "store"),
        mapped_file_size_commitlog=1024 * 1024,
        mapped_file_size_consume_queue=20_000,
    )
    async with BrokerController(cfg) as ctrl:
        assert ctrl.port == port
        async with RemotingClient() as client:
            resp = await client.invoke(f"127.0.0.1:{port}", send_request("InProc", b"x"))
            assert resp.code == ResponseCode.SUCCESS
            await client.invoke(
                f"127.0.0.1:{port}",
                json_request(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {"consumerGroup": "G", "topic": "InProc", "queueId": "0", "commitOffset": "1"},
                ),
            )
    # Clean stop: offsets and topics written, abort marker gone.
    assert (tmp_path / "store" / "config" / "consumerOffset.json").exists()
    assert b"InProc" in (tmp_path / "store" / "config" / "topics.json").read_bytes()
    assert not (tmp_path / "store" / "abort").exists()
    with trio.fail_after(30):
        async with BrokerController(cfg) as again:
            assert again.offsets.query("G", "InProc", 0) == 1
            assert again.store.get_max_offset_in_queue("InProc", 0) == 1


async def test_lock_and_unlock_batch(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    from remoting.protocol.bodies import (
        LockBatchRequestBody,
        LockBatchResponseBody,
        UnlockBatchRequestBody,
    )

    broker: BrokerProc = start_broker(namesrv.addr, env=SMALL_STORE)
    mqs = [MessageQueue("LockT", "broker-a", i) for i in range(2)]
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:

        async def lock(cid: str) -> list[MessageQueue]:
            body = LockBatchRequestBody("LG", cid, mqs).to_json()
            resp = await client.invoke(
                broker.addr, json_request(RequestCode.LOCK_BATCH_MQ, None, body)
            )
            assert resp.code == ResponseCode.SUCCESS
            return LockBatchResponseBody.from_json(resp.body_bytes()).lock_ok_mq_set

        assert await lock("c1") == mqs
        assert await lock("c2") == []
        body = UnlockBatchRequestBody("LG", "c1", mqs[:1]).to_json()
        resp = await client.invoke(
            broker.addr, json_request(RequestCode.UNLOCK_BATCH_MQ, None, body)
        )
        assert resp.code == ResponseCode.SUCCESS
        assert await lock("c2") == mqs[:1]


async def test_two_namesrvs_fed_and_auto_create_off(
    start_namesrv: Callable[..., NamesrvProc], start_broker: StartBroker
) -> None:
    ns1: NamesrvProc = start_namesrv()
    ns2: NamesrvProc = start_namesrv()
    broker = start_broker(f"{ns1.addr};{ns2.addr}", env=SMALL_STORE, auto_create_topic=False)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        resp = await client.invoke(broker.addr, send_request("NoAuto", b"x"))
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        assert resp.ext_fields is not None
        assert resp.ext_fields["TRACE_ON"] == "true"
        create = {
            "topic": "Made",
            "defaultTopic": "TBW102",
            "readQueueNums": "3",
            "writeQueueNums": "3",
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
        }
        resp = await client.invoke(
            broker.addr, json_request(RequestCode.UPDATE_AND_CREATE_TOPIC, create)
        )
        assert resp.code == ResponseCode.SUCCESS
        for ns in (ns1, ns2):

            async def routed(addr: str = ns.addr) -> bool:
                r = await client.invoke(
                    addr, json_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Made"})
                )
                return r.code == ResponseCode.SUCCESS

            await wait_until(routed, what=f"route at {ns.addr}")
            r = await client.invoke(
                ns.addr, json_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
            )
            assert r.code == ResponseCode.TOPIC_NOT_EXIST  # auto-create is off
        resp = await client.invoke(broker.addr, send_request("Made", b"x", queue_id=2))
        assert resp.code == ResponseCode.SUCCESS
    # SIGTERM: the broker unregisters from both NameServers.
    assert await trio.to_thread.run_sync(broker.stop) == 0
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        for ns in (ns1, ns2):
            r = await client.invoke(
                ns.addr, json_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Made"})
            )
            assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert "broker_stopped" in broker.log_text()


async def test_broker_tolerates_a_namesrv_that_is_down(
    start_namesrv: Callable[..., NamesrvProc], start_broker: StartBroker
) -> None:
    ns_port = free_port()
    env = {**SMALL_STORE, "TRIMQ_REGISTER_NAME_SERVER_PERIOD_MS": "300"}
    broker = start_broker(f"127.0.0.1:{ns_port}", env=env)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        resp = await client.invoke(broker.addr, send_request("Early", b"x"))
        assert resp.code == ResponseCode.SUCCESS
        ns = start_namesrv(port=ns_port)

        async def routed() -> bool:
            r = await client.invoke(
                ns.addr, json_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Early"})
            )
            return r.code == ResponseCode.SUCCESS

        await wait_until(routed, what="registration once the NameServer is up")
    assert "register_broker_failed" in broker.log_text()


async def test_reset_offset_by_time_commits_and_tells_consumers(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    from remoting.protocol.bodies import ResetOffsetBody

    broker = start_broker(namesrv.addr, env=SMALL_STORE)
    told: list[ResetOffsetBody] = []

    async def on_reset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        assert (cmd.ext_fields or {})["group"] == "RG"
        told.append(ResetOffsetBody.from_json(cmd.body_bytes()))
        return None

    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        client.processors.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, on_reset)
        for _ in range(3):
            await client.invoke(broker.addr, send_request("ResetT", b"x", queue_id=0))
        hb = HeartbeatData(
            "rc1",
            consumer_data_set=[
                ConsumerData("RG", subscription_data_set=[SubscriptionData("ResetT")])
            ],
        )
        await client.invoke(broker.addr, json_request(RequestCode.HEART_BEAT, None, hb.to_json()))
        await client.invoke(
            broker.addr,
            json_request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "RG", "topic": "ResetT", "queueId": "0", "commitOffset": "3"},
            ),
        )
        fields = {"topic": "ResetT", "group": "RG", "timestamp": "0", "isForce": "true"}
        resp = await client.invoke(
            broker.addr, json_request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        table = ResetOffsetBody.from_json(resp.body_bytes()).offset_table
        assert table[MessageQueue("ResetT", "broker-a", 0)] == 0
        await wait_until(
            lambda: len(told) == 1, what="RESET_CONSUMER_CLIENT_OFFSET to the consumer"
        )
        assert told[0].offset_table == table
        r = await client.invoke(
            broker.addr,
            json_request(
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": "RG", "topic": "ResetT", "queueId": "0"},
            ),
        )
        assert (r.ext_fields or {})["offset"] == "0"
        # To the end (-1), without force: only moves backwards, so it stays at 0.
        fields = {**fields, "timestamp": "-1", "isForce": "false"}
        resp = await client.invoke(
            broker.addr, json_request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
        )
        table = ResetOffsetBody.from_json(resp.body_bytes()).offset_table
        assert table[MessageQueue("ResetT", "broker-a", 0)] == 0
        resp = await client.invoke(
            broker.addr,
            json_request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {**fields, "isForce": "true"}),
        )
        table = ResetOffsetBody.from_json(resp.body_bytes()).offset_table
        assert table[MessageQueue("ResetT", "broker-a", 0)] == 3

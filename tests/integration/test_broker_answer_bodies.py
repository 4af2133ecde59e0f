"""Broker answers in Apache 5.x's shape: heartbeat v2 bodies, producer connections, stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from remoting import RemotingClient, RequestCode, ResponseCode, SerializeType
from remoting.protocol.bodies import (
    ConsumerConnection,
    ConsumeStats,
    MessageQueue,
    ProducerConnection,
)
from tests.helpers import free_port, json_request
from tests.integration.test_broker_process import send_request

# Every in-process store here keeps the staging rule (the test fails otherwise).
pytestmark = pytest.mark.usefixtures("staging_guard")

# A Java 5.x client's full heartbeat (v2 fingerprint set), then its v2 heartbeat without
# subscriptions: the broker must keep the subscriptions of the first.
FULL_HEARTBEAT = (
    b'{"clientID":"127.0.0.1@1#2","consumerDataSet":[{"consumeFromWhere":'
    b'"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"HG",'
    b'"messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],'
    b'"expressionType":"TAG","subString":"*","subVersion":1700000000000,"tagsSet":[],'
    b'"topic":"HT"}],"unitMode":false}],"heartbeatFingerprint":123456,'
    b'"producerDataSet":[{"groupName":"HP"},{"groupName":"CLIENT_INNER_PRODUCER"}],'
    b'"withoutSub":false}'
)
V2_HEARTBEAT = (
    b'{"clientID":"127.0.0.1@1#2","consumerDataSet":[{"consumeFromWhere":'
    b'"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"HG",'
    b'"messageModel":"CLUSTERING","subscriptionDataSet":[],"unitMode":false}],'
    b'"heartbeatFingerprint":123456,"producerDataSet":[{"groupName":"HP"}],"withoutSub":true}'
)


def _small_broker(tmp_path: Path) -> tuple[BrokerConfig, str]:
    """An in-process broker's config on a free loopback port with small files, and its address."""
    port = free_port()
    cfg = BrokerConfig(
        listen=f"127.0.0.1:{port}",
        store_dir=str(tmp_path / "store"),
        mapped_file_size_commitlog=1024 * 1024,
        mapped_file_size_consume_queue=20_000,
    )
    return cfg, f"127.0.0.1:{port}"


async def test_heartbeat_v2_producer_connections_and_stats(tmp_path: Path) -> None:
    cfg, addr = _small_broker(tmp_path)
    async with BrokerController(cfg), RemotingClient(serialize_type=SerializeType.JSON) as client:
        for body in (FULL_HEARTBEAT, V2_HEARTBEAT):
            resp = await client.invoke(addr, json_request(RequestCode.HEART_BEAT, None, body))
            assert resp.code == ResponseCode.SUCCESS
            # No IS_SUPPORT_HEART_BEAT_V2: 5.x clients keep sending full heartbeats.
            assert "IS_SUPPORT_HEART_BEAT_V2" not in (resp.ext_fields or {})
        resp = await client.invoke(
            addr, json_request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "HG"})
        )
        assert resp.code == ResponseCode.SUCCESS
        cc = ConsumerConnection.from_json(resp.body_bytes())
        assert list(cc.subscription_table) == ["HT"]  # kept through the v2 heartbeat

        resp = await client.invoke(
            addr, json_request(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "HP"})
        )
        assert resp.code == ResponseCode.SUCCESS
        raw = json.loads(resp.body_bytes())
        assert list(raw) == ["connectionSet"]
        (conn,) = raw["connectionSet"]
        assert list(conn) == ["clientAddr", "clientId", "language", "version"]
        assert conn["clientId"] == "127.0.0.1@1#2"
        assert conn["language"] == "PYTHON"  # the enum name of the request's language
        pc = ProducerConnection.from_json(resp.body_bytes())
        assert pc.connection_set[0].client_id == "127.0.0.1@1#2"
        resp = await client.invoke(
            addr,
            json_request(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "Nobody"}),
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark == "the producer group[Nobody] not exist"

        # GET_CONSUME_STATS: OffsetWrapper with 5.x's pullOffset.
        resp = await client.invoke(addr, send_request("HT", b"x"))
        assert resp.code == ResponseCode.SUCCESS
        await client.invoke(
            addr,
            json_request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "HG", "topic": "HT", "queueId": "0", "commitOffset": "1"},
            ),
        )
        resp = await client.invoke(
            addr,
            json_request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "HG", "topic": "HT"}),
        )
        assert resp.code == ResponseCode.SUCCESS
        stats = ConsumeStats.from_json(resp.body_bytes())
        wrapper = stats.offset_table[MessageQueue("HT", "broker-a", 0)]
        assert (wrapper.broker_offset, wrapper.consumer_offset, wrapper.pull_offset) == (1, 1, 1)
        assert b'"lastTimestamp":' in resp.body_bytes()
        assert b'"pullOffset":1}' in resp.body_bytes()


async def test_query_consumer_offset_set_zero_if_not_found(tmp_path: Path) -> None:
    cfg, addr = _small_broker(tmp_path)
    async with BrokerController(cfg), RemotingClient(serialize_type=SerializeType.JSON) as client:
        resp = await client.invoke(addr, send_request("ZT", b"x"))
        assert resp.code == ResponseCode.SUCCESS
        fields = {"consumerGroup": "ZG", "topic": "ZT", "queueId": "0"}
        # No committed offset, first message still there: 0 (4.x and 5.x alike) ...
        for extra in ({}, {"setZeroIfNotFound": "true"}):
            resp = await client.invoke(
                addr, json_request(RequestCode.QUERY_CONSUMER_OFFSET, fields | extra)
            )
            assert resp.code == ResponseCode.SUCCESS
            assert (resp.ext_fields or {}).get("offset") == "0"
        # ... unless a 5.x client asks not to be given 0.
        resp = await client.invoke(
            addr,
            json_request(
                RequestCode.QUERY_CONSUMER_OFFSET, fields | {"setZeroIfNotFound": "false"}
            ),
        )
        assert resp.code == ResponseCode.QUERY_NOT_FOUND

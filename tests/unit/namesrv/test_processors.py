"""NameServer processors called directly with RemotingCommands (no sockets)."""

from __future__ import annotations

import json
import zlib
from typing import cast

from namesrv.kv_config import KVConfig
from namesrv.processors import ATTR_BROKER_ADDRS, NamesrvProcessors
from namesrv.route_table import RouteTable
from remoting import Connection, RemotingCommand
from remoting.codes import RequestCode, ResponseCode, SerializeType
from remoting.protocol.route import (
    ClusterInfo,
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
)


class FakeConn:
    def __init__(self, cid: int) -> None:
        self.id = cid
        self.attributes: dict[str, object] = {}
        self.remote_address = f"127.0.0.1:{40000 + cid}"


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _setup(order: bool = False) -> tuple[NamesrvProcessors, Clock]:
    clock = Clock()
    return NamesrvProcessors(
        RouteTable(), KVConfig(), order_message_enable=order, now_ms=clock
    ), clock


async def _call(p: NamesrvProcessors, conn: FakeConn, cmd: RemotingCommand) -> RemotingCommand:
    cmd.opaque = 77
    resp = await p.handlers()[cmd.code](cast(Connection, conn), cmd)
    assert resp is not None
    assert resp.opaque == 77
    assert resp.is_response
    return resp


def _register_cmd(
    topics: dict[str, int],
    *,
    name: str = "broker-a",
    addr: str = "127.0.0.1:10911",
    bid: int = 0,
    dv: DataVersion | None = None,
    compressed: bool = False,
    crc: int | None = None,
) -> RemotingCommand:
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(
            {t: TopicConfig(t, n, n, 6) for t, n in topics.items()}, dv or DataVersion(1, 1)
        ),
        [],
    ).encode(compressed=compressed)
    fields = {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": "DefaultCluster",
        "haServerAddr": "127.0.0.1:10912",
        "brokerId": str(bid),
        "compressed": "true" if compressed else "false",
        "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF if crc is None else crc),
    }
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)


async def test_register_then_route_query() -> None:
    p, _ = _setup()
    conn = FakeConn(1)
    resp = await _call(p, conn, _register_cmd({"T": 4}))
    assert resp.code == ResponseCode.SUCCESS
    assert conn.attributes[ATTR_BROKER_ADDRS] == {"127.0.0.1:10911"}
    q = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    resp = await _call(p, conn, q)
    assert resp.code == ResponseCode.SUCCESS
    route = TopicRouteData.from_json(resp.body_bytes())
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
    assert route.queue_datas[0].write_queue_nums == 4
    assert resp.serialize_type == SerializeType.MSGPACK  # follows the request


async def test_compressed_register_and_crc_checks() -> None:
    p, _ = _setup()
    resp = await _call(p, FakeConn(1), _register_cmd({"T": 4, "U": 2}, compressed=True))
    assert resp.code == ResponseCode.SUCCESS
    assert sorted(p.route_table.all_topics()) == ["T", "U"]
    bad = await _call(p, FakeConn(2), _register_cmd({"X": 1}, addr="b:1", name="b", crc=12345))
    assert bad.code == ResponseCode.SYSTEM_ERROR
    assert bad.remark == "crc32 not match"
    assert "X" not in p.route_table.all_topics()
    # crc 0 skips the check.
    ok = await _call(p, FakeConn(3), _register_cmd({"X": 1}, addr="b:1", name="b", crc=0))
    assert ok.code == ResponseCode.SUCCESS


async def test_slave_registration_gets_master_and_ha_addr() -> None:
    p, _ = _setup()
    await _call(p, FakeConn(1), _register_cmd({"T": 4}))
    resp = await _call(p, FakeConn(2), _register_cmd({"T": 4}, addr="127.0.0.1:20911", bid=1))
    assert resp.ext_fields == {"masterAddr": "127.0.0.1:10911", "haServerAddr": "127.0.0.1:10912"}


async def test_bad_header_and_body_answer_system_error() -> None:
    p, _ = _setup()
    cmd = _register_cmd({"T": 4})
    assert cmd.ext_fields is not None
    del cmd.ext_fields["brokerAddr"]
    resp = await _call(p, FakeConn(1), cmd)
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert resp.remark is not None
    assert "brokerAddr" in resp.remark
    cmd = _register_cmd({"T": 4})
    cmd.body = b"{garbage"
    assert cmd.ext_fields is not None
    cmd.ext_fields["bodyCrc32"] = "0"
    resp = await _call(p, FakeConn(1), cmd)
    assert resp.code == ResponseCode.SYSTEM_ERROR
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {})
    resp = await _call(p, FakeConn(1), cmd)
    assert resp.code == ResponseCode.SYSTEM_ERROR


async def test_unknown_topic_is_17_with_remark() -> None:
    p, _ = _setup()
    q = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
    resp = await _call(p, FakeConn(1), q)
    assert resp.code == 17
    assert resp.remark == "No topic route info in name server for the topic: Nope"


async def test_cluster_info_topic_lists_delete_topic() -> None:
    p, _ = _setup()
    await _call(p, FakeConn(1), _register_cmd({"T": 4, "U": 1}))
    resp = await _call(p, FakeConn(1), RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    ci = ClusterInfo.from_json(resp.body_bytes())
    assert ci.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
    resp = await _call(
        p, FakeConn(1), RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    )
    assert sorted(TopicList.from_json(resp.body_bytes()).topic_list) == ["T", "U"]
    resp = await _call(
        p,
        FakeConn(1),
        RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}),
    )
    assert sorted(TopicList.from_json(resp.body_bytes()).topic_list) == ["T", "U"]
    resp = await _call(
        p, FakeConn(1), RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "U"})
    )
    assert resp.code == ResponseCode.SUCCESS
    assert p.route_table.all_topics() == ["T"]


async def test_unregister_and_query_data_version() -> None:
    p, clock = _setup()
    await _call(p, FakeConn(1), _register_cmd({"T": 4}, dv=DataVersion(9, 3)))
    fields = {
        "brokerName": "broker-a",
        "brokerAddr": "127.0.0.1:10911",
        "clusterName": "DefaultCluster",
        "brokerId": "0",
    }
    clock.now = 5000
    resp = await _call(
        p,
        FakeConn(1),
        RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION, fields, DataVersion(9, 3).to_json()
        ),
    )
    assert resp.ext_fields == {"changed": "false"}
    assert DataVersion.from_json(resp.body_bytes()) == DataVersion(9, 3)
    assert p.route_table.broker_live_table["127.0.0.1:10911"].last_update_ms == 5000
    resp = await _call(
        p,
        FakeConn(1),
        RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION, fields, DataVersion(9, 4).to_json()
        ),
    )
    assert resp.ext_fields == {"changed": "true"}
    resp = await _call(
        p, FakeConn(1), RemotingCommand.request(RequestCode.UNREGISTER_BROKER, fields)
    )
    assert resp.code == ResponseCode.SUCCESS
    assert p.route_table.pick_route("T") is None


async def test_kv_config_and_order_topic_conf() -> None:
    p, _ = _setup(order=True)
    conn = FakeConn(1)
    get = RemotingCommand.request(
        RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"}
    )
    resp = await _call(p, conn, get)
    assert resp.code == 22
    put = RemotingCommand.request(
        RequestCode.PUT_KV_CONFIG,
        {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "broker-a:4"},
    )
    assert (await _call(p, conn, put)).code == ResponseCode.SUCCESS
    resp = await _call(p, conn, get)
    assert resp.code == ResponseCode.SUCCESS
    assert resp.ext_fields == {"value": "broker-a:4"}
    # Registration answers the ORDER_TOPIC_CONFIG namespace as a KVTable body.
    resp = await _call(p, conn, _register_cmd({"T": 4}))
    assert json.loads(resp.body_bytes()) == {"table": {"T": "broker-a:4"}}
    resp = await _call(
        p, conn, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    )
    assert TopicRouteData.from_json(resp.body_bytes()).order_topic_conf == "broker-a:4"
    resp = await _call(
        p,
        conn,
        RemotingCommand.request(
            RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"}
        ),
    )
    assert json.loads(resp.body_bytes()) == {"table": {"T": "broker-a:4"}}
    delete = RemotingCommand.request(
        RequestCode.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"}
    )
    assert (await _call(p, conn, delete)).code == ResponseCode.SUCCESS
    assert (await _call(p, conn, get)).code == ResponseCode.QUERY_NOT_FOUND
    resp = await _call(
        p, conn, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    )
    assert b"orderTopicConf" not in resp.body_bytes()


async def test_route_body_is_standard_json_for_json_requests() -> None:
    p, _ = _setup()
    await _call(p, FakeConn(1), _register_cmd({"T": 4}))
    q = RemotingCommand.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, serialize_type=SerializeType.JSON
    )
    resp = await _call(p, FakeConn(1), q)
    assert resp.serialize_type == SerializeType.JSON
    assert json.loads(resp.body_bytes())["brokerDatas"][0]["brokerAddrs"] == {
        "0": "127.0.0.1:10911"
    }


async def test_wipe_and_add_write_perm() -> None:
    p, _ = _setup()
    await _call(p, FakeConn(1), _register_cmd({"T": 4, "U": 2}))
    await _call(p, FakeConn(2), _register_cmd({"T": 4}, name="broker-b", addr="b:1"))
    resp = await _call(
        p,
        FakeConn(1),
        RemotingCommand.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
    )
    assert resp.ext_fields == {"wipeTopicCount": "2"}
    route = p.route_table.pick_route("T")
    assert route is not None
    perms = {q.broker_name: q.perm for q in route.queue_datas}
    assert perms == {"broker-a": 4, "broker-b": 6}
    resp = await _call(
        p,
        FakeConn(1),
        RemotingCommand.request(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
    )
    assert resp.ext_fields == {"addTopicCount": "2"}
    route = p.route_table.pick_route("U")
    assert route is not None
    assert route.queue_datas[0].perm == 6

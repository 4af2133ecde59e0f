"""A real `mqnamesrv` process, driven by a bare RemotingClient (as a broker) and raw sockets."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable

import pytest
import trio

from remoting import RemotingClient, RemotingCommand
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
from tests.helpers import wait_until
from tests.integration.procs import NamesrvProc

FAKE_BROKER = "127.0.0.1:10911"

StartNamesrv = Callable[..., NamesrvProc]

# Reference section 9, example A: GET_ROUTEINFO_BY_TOPIC, JSON header, topic "T", opaque 1,
# version 409 (131 bytes).
FRAME_A = bytes.fromhex(
    "0000007f0000007b7b22636f6465223a"
    "3130352c226578744669656c6473223a"
    "7b22746f706963223a2254227d2c2266"
    "6c6167223a302c226c616e6775616765"
    "223a224a415641222c226f7061717565"
    "223a312c2273657269616c697a655479"
    "706543757272656e74525043223a224a"
    "534f4e222c2276657273696f6e223a34"
    "30397d"
)

# Reference section 9, example B: the same request with the ROCKETMQ binary header (41 bytes).
FRAME_B = bytes.fromhex(
    "000000250100002100690001990000000100000000000000000000000c0005746f7069630000000154"
)


def register_cmd(
    topics: dict[str, int],
    *,
    name: str = "broker-a",
    addr: str = FAKE_BROKER,
    broker_id: int = 0,
    dv: DataVersion | None = None,
    compressed: bool = False,
) -> RemotingCommand:
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(
            {t: TopicConfig(t, n, n, 6) for t, n in topics.items()}, dv or DataVersion(1, 1)
        ),
        [],
    ).encode(compressed=compressed)
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": "DefaultCluster",
            "haServerAddr": addr.rsplit(":", 1)[0] + ":10912",
            "brokerId": str(broker_id),
            "compressed": "true" if compressed else "false",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
        },
        body,
    )


def route_cmd(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


async def get_route(client: RemotingClient, addr: str, topic: str) -> TopicRouteData | None:
    resp = await client.invoke(addr, route_cmd(topic))
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    resp.raise_for_code()
    return TopicRouteData.from_json(resp.body_bytes())


async def read_frame(stream: trio.SocketStream) -> bytes | None:
    """One whole frame (with its length prefix), or None if the peer closed first."""
    buf = b""
    with trio.fail_after(10):
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return None
            buf += chunk
    return buf


async def test_register_then_route_query(namesrv: NamesrvProc) -> None:
    async with RemotingClient() as client:
        resp = await client.invoke(namesrv.addr, register_cmd({"T": 4, "U": 2}))
        assert resp.code == ResponseCode.SUCCESS
        route = await get_route(client, namesrv.addr, "T")
        assert route is not None
        assert route.broker_datas[0].broker_addrs == {0: FAKE_BROKER}
        assert route.broker_datas[0].broker_name == "broker-a"
        assert route.broker_datas[0].cluster == "DefaultCluster"
        assert [
            (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
            for q in route.queue_datas
        ] == [("broker-a", 4, 4, 6)]
        resp = await client.invoke(
            namesrv.addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        ci = ClusterInfo.from_json(resp.raise_for_code().body_bytes())
        assert ci.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
        resp = await client.invoke(
            namesrv.addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        )
        assert sorted(TopicList.from_json(resp.raise_for_code().body_bytes()).topic_list) == [
            "T",
            "U",
        ]
        # Compressed registration of a second broker group.
        resp = await client.invoke(
            namesrv.addr,
            register_cmd({"T": 8}, name="broker-b", addr="127.0.0.1:20911", compressed=True),
        )
        assert resp.code == ResponseCode.SUCCESS
        route = await get_route(client, namesrv.addr, "T")
        assert route is not None
        assert sorted(b.broker_name for b in route.broker_datas) == ["broker-a", "broker-b"]
    assert "namesrv_broker_registered" in namesrv.log_text()


async def test_unknown_topic_is_17_with_remark(namesrv: NamesrvProc) -> None:
    async with RemotingClient() as client:
        resp = await client.invoke(namesrv.addr, route_cmd("NoSuchTopic"))
        assert resp.code == 17
        assert resp.remark == "No topic route info in name server for the topic: NoSuchTopic"
        # An unknown request code gets REQUEST_CODE_NOT_SUPPORTED, and the connection lives on.
        resp = await client.invoke(namesrv.addr, RemotingCommand.request(9999))
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        resp = await client.invoke(
            namesrv.addr,
            RemotingCommand.request(
                RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "NoSuchTopic"}
            ),
        )
        assert resp.code == ResponseCode.QUERY_NOT_FOUND


@pytest.mark.slow
async def test_expiry_after_silence(start_namesrv: StartNamesrv) -> None:
    ns: NamesrvProc = start_namesrv(
        env={
            "TRIMQ_BROKER_CHANNEL_EXPIRED_TIME_MS": "1500",
            "TRIMQ_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "200",
        }
    )
    # The "broker" and the route queries on separate connections, as in a cluster: the
    # NameServer closes an expired broker's connection, and a query in flight on that same
    # connection would fail with it.
    async with RemotingClient() as broker, RemotingClient() as client:
        (await broker.invoke(ns.addr, register_cmd({"T": 4}))).raise_for_code()
        registered_at = trio.current_time()
        assert await get_route(client, ns.addr, "T") is not None

        async def gone() -> bool:
            return await get_route(client, ns.addr, "T") is None

        await wait_until(gone, total=15, interval=0.1, what="broker expiry")
        # Removed by the expiry scan, not at once (generous bound).
        assert trio.current_time() - registered_at >= 1.0
        assert "namesrv_broker_expired" in ns.log_text()
        # A heartbeat (on a new connection: the NameServer closed the old one) brings it back.
        (await broker.invoke(ns.addr, register_cmd({"T": 4}))).raise_for_code()
        assert await get_route(client, ns.addr, "T") is not None


@pytest.mark.slow
async def test_heartbeats_keep_broker_alive(start_namesrv: StartNamesrv) -> None:
    ns: NamesrvProc = start_namesrv(
        env={
            "TRIMQ_BROKER_CHANNEL_EXPIRED_TIME_MS": "1500",
            "TRIMQ_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "200",
        }
    )
    async with RemotingClient() as client:
        end = trio.current_time() + 3.5
        while trio.current_time() < end:
            (await client.invoke(ns.addr, register_cmd({"T": 4}))).raise_for_code()
            assert await get_route(client, ns.addr, "T") is not None
            await trio.sleep(0.3)
    assert "namesrv_broker_expired" not in ns.log_text()


async def test_removed_when_connection_closes(namesrv: NamesrvProc) -> None:
    # Default expiry is 120 s: removal within seconds can only come from the close.
    async with RemotingClient() as broker, RemotingClient() as client:
        (await broker.invoke(namesrv.addr, register_cmd({"T": 4}))).raise_for_code()
        assert await get_route(client, namesrv.addr, "T") is not None
        await broker.close_connection(namesrv.addr)

        async def gone() -> bool:
            return await get_route(client, namesrv.addr, "T") is None

        await wait_until(gone, total=10, interval=0.05, what="removal on close")
    assert "namesrv_broker_channel_closed" in namesrv.log_text()


async def test_two_nameservers_fed_by_one_broker(start_namesrv: StartNamesrv) -> None:
    ns1: NamesrvProc = start_namesrv()
    ns2: NamesrvProc = start_namesrv()
    assert ns1.port != ns2.port
    async with RemotingClient() as broker, RemotingClient() as client:
        for ns in (ns1, ns2):
            (await broker.invoke(ns.addr, register_cmd({"T": 4}))).raise_for_code()
        r1 = await get_route(client, ns1.addr, "T")
        r2 = await get_route(client, ns2.addr, "T")
        assert r1 is not None
        assert r1 == r2
        # One NameServer going away leaves the other serving.
        ns1.stop()
        assert await get_route(client, ns2.addr, "T") is not None


async def test_restarted_namesrv_full_again_after_one_round(namesrv: NamesrvProc) -> None:
    async with RemotingClient() as broker, RemotingClient() as client:
        (await broker.invoke(namesrv.addr, register_cmd({"T": 4, "U": 1}))).raise_for_code()
        assert await get_route(client, namesrv.addr, "T") is not None
        assert namesrv.stop() == 0  # clean exit on SIGTERM
        assert "namesrv_stopped" in namesrv.log_text()
        await trio.to_thread.run_sync(namesrv.start)
        # Connections to the old process are dead; drop them before the next calls.
        await client.close_connection(namesrv.addr)
        await broker.close_connection(namesrv.addr)
        assert await get_route(client, namesrv.addr, "T") is None  # empty after restart
        # One registration round (same data version as before) fills it again.
        (await broker.invoke(namesrv.addr, register_cmd({"T": 4, "U": 1}))).raise_for_code()
        assert await get_route(client, namesrv.addr, "T") is not None
        assert await get_route(client, namesrv.addr, "U") is not None


async def test_json_request_gets_json_response_with_standard_body(namesrv: NamesrvProc) -> None:
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        (await client.invoke(namesrv.addr, register_cmd({"T": 4}))).raise_for_code()
        resp = await client.invoke(namesrv.addr, route_cmd("T"))
        assert resp.code == ResponseCode.SUCCESS
        assert resp.serialize_type == SerializeType.JSON
        body = json.loads(resp.body_bytes())  # standard JSON: quoted integer keys
        assert body["brokerDatas"][0]["brokerAddrs"] == {"0": FAKE_BROKER}
        assert list(body) == sorted(body)


async def test_reference_frame_a_over_raw_socket(namesrv: NamesrvProc) -> None:
    async with RemotingClient() as broker:
        (await broker.invoke(namesrv.addr, register_cmd({"T": 4}))).raise_for_code()
        stream = await trio.open_tcp_stream("127.0.0.1", namesrv.port)
        async with stream:
            assert len(FRAME_A) == 131
            await stream.send_all(FRAME_A)
            frame = await read_frame(stream)
            assert frame is not None
            (length, word) = struct.unpack(">II", frame[:8])
            assert length == len(frame) - 4
            assert word >> 24 == 0  # JSON, as the request
            header_len = word & 0xFFFFFF
            header = json.loads(frame[8 : 8 + header_len])
            assert header["code"] == 0
            assert header["opaque"] == 1
            assert header["flag"] & 1 == 1
            route = TopicRouteData.from_json(frame[8 + header_len :])
            assert route.broker_datas[0].broker_addrs == {0: FAKE_BROKER}

            # Example B (ROCKETMQ binary header) on the same connection.
            await stream.send_all(FRAME_B)
            frame = await read_frame(stream)
            assert frame is not None
            (length, word) = struct.unpack(">II", frame[:8])
            assert word >> 24 == 1
            header_len = word & 0xFFFFFF
            code, _lang, _ver, opaque, flag = struct.unpack(">hBhii", frame[8:21])
            assert (code, opaque, flag & 1) == (0, 1, 1)
            assert TopicRouteData.from_json(frame[8 + header_len :]) == route


async def test_garbage_frame_closes_only_that_connection(namesrv: NamesrvProc) -> None:
    async with RemotingClient() as broker:
        (await broker.invoke(namesrv.addr, register_cmd({"T": 4}))).raise_for_code()
        bad = await trio.open_tcp_stream("127.0.0.1", namesrv.port)
        async with bad:
            # Header length (0xFFFFF0) larger than the whole frame (12): undecodable.
            await bad.send_all(struct.pack(">II", 12, 0x00FFFFF0) + b"\x00" * 8)
            assert await read_frame(bad) is None  # the server closed it
        # The broker's connection and its registration are untouched.
        conn = broker.connection(namesrv.addr)
        assert conn is not None
        assert not conn.closed
        route = await get_route(broker, namesrv.addr, "T")
        assert route is not None
        # And new connections still work.
        async with RemotingClient() as client:
            assert await get_route(client, namesrv.addr, "T") is not None


async def test_many_brokers_register_concurrently(namesrv: NamesrvProc) -> None:
    brokers = 20
    topics = {f"Topic{i}": 8 for i in range(100)}

    async with RemotingClient() as client:

        async def one(i: int) -> None:
            async with RemotingClient() as broker:
                cmd = register_cmd(
                    topics, name=f"broker-{i}", addr=f"127.0.1.{i}:10911", compressed=i % 2 == 0
                )
                (await broker.invoke(namesrv.addr, cmd)).raise_for_code()
                # Keep the connection (and so the registration) until every broker is checked.
                await done.wait()

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            for i in range(brokers):
                nursery.start_soon(one, i)

            async def all_in() -> bool:
                resp = await client.invoke(
                    namesrv.addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                ci = ClusterInfo.from_json(resp.raise_for_code().body_bytes())
                return len(ci.broker_addr_table) == brokers

            await wait_until(all_in, total=20, what="all brokers registered")
            route = await get_route(client, namesrv.addr, "Topic99")
            assert route is not None
            assert len(route.queue_datas) == brokers
            assert {q.write_queue_nums for q in route.queue_datas} == {8}
            done.set()

        # Every broker's connection closed: all gone.
        async def none_left() -> bool:
            return await get_route(client, namesrv.addr, "Topic0") is None

        await wait_until(none_left, total=20, what="all brokers removed")

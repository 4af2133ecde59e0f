"""A real `mqbroker` (and `mqnamesrv`) driven through a bare RemotingClient and raw sockets."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio

from common.message import (
    BatchItem,
    create_offset_msg_id,
    decode_offset_msg_id,
    decode_records,
    encode_batch_body,
    encode_properties,
    java_string_hash,
)
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode, SerializeType
from remoting.protocol.bodies import (
    ConsumerData,
    ConsumerListBody,
    HeartbeatData,
    KVTable,
    ProducerData,
    SubscriptionData,
)
from remoting.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from remoting.protocol.route import TopicRouteData
from tests.integration.procs import BrokerProc, NamesrvProc

# Small files so tests stay light (the store rolls files at these sizes).
SMALL_STORE = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(1024 * 1024),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(1000 * 20),
    "TRIMQ_CONSUMER_OFFSET_PERSIST_INTERVAL_MS": "500",
}

PULL_COMMIT = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4


def send_request(
    topic: str,
    body: bytes,
    *,
    queue_id: int = 0,
    tags: str | None = None,
    props: dict[str, str] | None = None,
    code: int = RequestCode.SEND_MESSAGE_V2,
    serialize_type: int = SerializeType.JSON,
    default_topic: str = "TBW102",
) -> RemotingCommand:
    p = dict(props or {})
    if tags is not None:
        p["TAGS"] = tags
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic=default_topic,
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties(p) if p else None,
        batch=code == RequestCode.SEND_BATCH_MESSAGE,
    )
    fields = hdr.to_fields() if code == RequestCode.SEND_MESSAGE else hdr.to_fields_v2()
    return RemotingCommand.request(code, fields, body, serialize_type=serialize_type)


def pull_request(
    topic: str,
    offset: int,
    *,
    group: str = "CG",
    queue_id: int = 0,
    max_msgs: int = 32,
    sys_flag: int = PULL_SUBSCRIPTION,
    subscription: str = "*",
    suspend_ms: int = 1000,
    commit_offset: int = 0,
) -> RemotingCommand:
    hdr = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=max_msgs,
        sys_flag=sys_flag,
        commit_offset=commit_offset,
        suspend_timeout_millis=suspend_ms,
        subscription=subscription if sys_flag & PULL_SUBSCRIPTION else None,
        sub_version=0,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr.to_fields())


StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def broker(namesrv: NamesrvProc, start_broker: StartBroker) -> BrokerProc:
    return start_broker(namesrv.addr, env=SMALL_STORE)


@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.MSGPACK])
async def test_send_and_pull_round_trip(broker: BrokerProc, st: int) -> None:
    topic = f"RoundTrip{st}"
    async with RemotingClient(serialize_type=st) as client:
        acks = []
        for i in range(3):
            resp = await client.invoke(
                broker.addr, send_request(topic, f"body-{i}".encode(), tags="TagA")
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert resp.serialize_type == st
            ext = resp.ext_fields or {}
            assert ext["MSG_REGION"] == "DefaultRegion"
            assert ext["TRACE_ON"] == "true"
            assert ext["queueId"] == "0"
            assert ext["queueOffset"] == str(i)
            (host, port), _phy = decode_offset_msg_id(ext["msgId"])
            assert (host, port) == ("127.0.0.1", broker.port)
            acks.append(ext["msgId"])
        resp = await client.invoke(broker.addr, pull_request(topic, 0))
        assert resp.code == ResponseCode.SUCCESS
        assert resp.remark == "FOUND"
        ext = resp.ext_fields or {}
        assert (ext["nextBeginOffset"], ext["minOffset"], ext["maxOffset"]) == ("3", "0", "3")
        msgs = decode_records(resp.body_bytes())
        assert [m.body for m in msgs] == [b"body-0", b"body-1", b"body-2"]
        assert [m.queue_offset for m in msgs] == [0, 1, 2]
        assert [create_offset_msg_id(m.store_host, m.commit_log_offset) for m in msgs] == acks
        assert msgs[0].properties["CLUSTER"] == "DefaultCluster"
        assert msgs[0].tags == "TagA"
        # Caught up: PULL_NOT_FOUND with the offsets.
        resp = await client.invoke(broker.addr, pull_request(topic, 3))
        assert resp.code == ResponseCode.PULL_NOT_FOUND
        assert (resp.ext_fields or {})["nextBeginOffset"] == "3"
        # Far beyond the end: offset moved; RocketMQ corrects to min when min is 0.
        resp = await client.invoke(broker.addr, pull_request(topic, 50))
        assert resp.code == ResponseCode.PULL_OFFSET_MOVED
        assert (resp.ext_fields or {})["nextBeginOffset"] == "0"


async def test_send_v1_header_and_wait_property_not_stored(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        req = send_request(
            "V1Topic", b"x", code=RequestCode.SEND_MESSAGE, props={"WAIT": "true", "KEYS": "k1"}
        )
        resp = await client.invoke(broker.addr, req)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        resp = await client.invoke(broker.addr, pull_request("V1Topic", 0))
        (msg,) = decode_records(resp.body_bytes())
        assert "WAIT" not in msg.properties
        assert msg.keys == "k1"


async def test_batch_send(broker: BrokerProc) -> None:
    items = [
        BatchItem(0, f"m{i}".encode(), encode_properties({"UNIQ_KEY": f"U{i}", "TAGS": "B"}))
        for i in range(5)
    ]
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        req = send_request(
            "BatchT",
            encode_batch_body(items),
            code=RequestCode.SEND_BATCH_MESSAGE,
            props={"WAIT": "true"},
            queue_id=1,
        )
        resp = await client.invoke(broker.addr, req)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        ext = resp.ext_fields or {}
        ids = ext["msgId"].split(",")
        assert len(ids) == 5
        assert (ext["queueId"], ext["queueOffset"]) == ("1", "0")
        resp = await client.invoke(broker.addr, pull_request("BatchT", 0, queue_id=1))
        msgs = decode_records(resp.body_bytes())
        assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(5)]
        assert [m.queue_offset for m in msgs] == list(range(5))
        assert [m.uniq_key for m in msgs] == [f"U{i}" for i in range(5)]
        assert all(m.properties["CLUSTER"] == "DefaultCluster" for m in msgs)
        assert all("WAIT" not in m.properties for m in msgs)
        assert [create_offset_msg_id(m.store_host, m.commit_log_offset) for m in msgs] == ids


async def test_tag_filter_by_request_and_by_heartbeat(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        for tag in ["TagA", "TagB", "TagA", "TagC", "TagB"]:
            resp = await client.invoke(broker.addr, send_request("Tags", tag.encode(), tags=tag))
            assert resp.code == ResponseCode.SUCCESS
        resp = await client.invoke(
            broker.addr, pull_request("Tags", 0, subscription="TagA || TagC")
        )
        assert [m.body for m in decode_records(resp.body_bytes())] == [b"TagA", b"TagA", b"TagC"]
        # Without the SUBSCRIPTION flag and without a heartbeat: SUBSCRIPTION_NOT_EXIST.
        resp = await client.invoke(broker.addr, pull_request("Tags", 0, group="HB", sys_flag=0))
        assert resp.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
        hb = HeartbeatData(
            "127.0.0.1@test",
            [ProducerData("PG")],
            [
                ConsumerData(
                    "HB",
                    subscription_data_set=[
                        SubscriptionData(
                            "Tags", "TagB", ["TagB"], [java_string_hash("TagB")], sub_version=1
                        )
                    ],
                )
            ],
        )
        resp = await client.invoke(
            broker.addr, RemotingCommand.request(RequestCode.HEART_BEAT, None, hb.to_json())
        )
        assert resp.code == ResponseCode.SUCCESS
        resp = await client.invoke(broker.addr, pull_request("Tags", 0, group="HB", sys_flag=0))
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_records(resp.body_bytes())] == [b"TagB", b"TagB"]
        # Only non-matching messages left past offset 2: retry immediately, moved forward.
        resp = await client.invoke(broker.addr, pull_request("Tags", 4, subscription="TagA"))
        assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
        assert (resp.ext_fields or {})["nextBeginOffset"] == "5"
        resp = await client.invoke(
            broker.addr,
            RemotingCommand.request(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HB"}
            ),
        )
        assert ConsumerListBody.from_json(resp.body_bytes()).consumer_id_list == ["127.0.0.1@test"]


async def _query_offset(client: RemotingClient, addr: str, topic: str, qid: int) -> int:
    resp = await client.invoke(
        addr,
        RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": "OG", "topic": topic, "queueId": str(qid)},
        ),
    )
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return -1
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int((resp.ext_fields or {})["offset"])


async def test_offsets_commit_and_survive_restart(broker: BrokerProc) -> None:
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        for i in range(4):
            await client.invoke(broker.addr, send_request("OffT", b"x", queue_id=i % 2))
        # Oneway update, as real clients send it.
        await client.invoke_oneway(
            broker.addr,
            RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "OG", "topic": "OffT", "queueId": "0", "commitOffset": "2"},
                oneway=True,
            ),
        )
        # Commit through a pull.
        resp = await client.invoke(
            broker.addr,
            pull_request(
                "OffT",
                1,
                group="OG",
                queue_id=1,
                sys_flag=PULL_SUBSCRIPTION | PULL_COMMIT,
                commit_offset=1,
            ),
        )
        assert resp.code == ResponseCode.SUCCESS

        async def committed() -> bool:
            return await _query_offset(client, broker.addr, "OffT", 0) == 2

        from tests.helpers import wait_until

        await wait_until(committed, what="oneway offset update")
        assert await _query_offset(client, broker.addr, "OffT", 1) == 1
    await trio.to_thread.run_sync(broker.restart)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        assert await _query_offset(client, broker.addr, "OffT", 0) == 2
        assert await _query_offset(client, broker.addr, "OffT", 1) == 1
        resp = await client.invoke(broker.addr, pull_request("OffT", 0))
        assert len(decode_records(resp.body_bytes())) == 2  # messages survived too


@pytest.mark.slow
async def test_long_polling_wakes_on_arrival_and_times_out(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        await client.invoke(broker.addr, send_request("LP", b"first"))
        results: dict[str, Any] = {}

        async def parked_pull() -> None:
            start = time.monotonic()
            resp = await client.invoke(
                broker.addr,
                pull_request("LP", 1, sys_flag=PULL_SUBSCRIPTION | PULL_SUSPEND, suspend_ms=15000),
                timeout_ms=30000,
            )
            results["resp"] = resp
            results["elapsed"] = time.monotonic() - start

        async with trio.open_nursery() as nursery:
            nursery.start_soon(parked_pull)
            await trio.sleep(0.5)
            assert "resp" not in results  # still parked
            await client.invoke(broker.addr, send_request("LP", b"second"))
        resp = results["resp"]
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_records(resp.body_bytes())] == [b"second"]
        # Answered at the arrival, far inside the 15 s suspend time.
        assert results["elapsed"] < 5
        # Nothing arrives: PULL_NOT_FOUND at the suspend deadline, not at once.
        start = time.monotonic()
        resp = await client.invoke(
            broker.addr,
            pull_request("LP", 2, sys_flag=PULL_SUBSCRIPTION | PULL_SUSPEND, suspend_ms=1500),
            timeout_ms=30000,
        )
        elapsed = time.monotonic() - start
        assert resp.code == ResponseCode.PULL_NOT_FOUND
        assert 1.2 < elapsed < 10


async def test_bad_input_gets_error_codes_and_broker_keeps_serving(broker: BrokerProc) -> None:
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:

        async def send(req: RemotingCommand) -> RemotingCommand:
            return await client.invoke(broker.addr, req)

        for bad in ["bad topic", "a/b", "x" * 128]:
            resp = await send(send_request(bad, b"x"))
            assert resp.code == ResponseCode.SYSTEM_ERROR, bad
            assert resp.ext_fields is not None
            assert resp.ext_fields["MSG_REGION"] == "DefaultRegion"
        resp = await send(send_request("SCHEDULE_TOPIC_XXXX", b"x"))
        assert resp.code == ResponseCode.NO_PERMISSION
        resp = await send(send_request("Good", b""))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        resp = await send(send_request("Good", b"x" * (4 * 1024 * 1024 + 1)))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        resp = await send(send_request("Good", b"x", queue_id=99))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "queueId" in (resp.remark or "")
        # A missing required header field names the field.
        req = send_request("Good", b"x")
        assert req.ext_fields is not None
        del req.ext_fields["b"]
        resp = await send(req)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert "'b'" in (resp.remark or "")
        assert (resp.ext_fields or {}).get("MSG_REGION") == "DefaultRegion"
        resp = await send(RemotingCommand.request(9999, {"x": "y"}))
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        resp = await send(pull_request("NoSuchTopic", 0))
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        resp = await send(pull_request("Good", 0, queue_id=77))
        assert resp.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.TOPIC_NOT_EXIST)
        # CONSUME_MESSAGE_DIRECTLY: a bad id, an offset past the log, a client not online.
        stored = await send(send_request("Good", b"direct"))
        assert stored.ext_fields is not None
        stored_id = stored.ext_fields["msgId"]
        (host, _), _ = decode_offset_msg_id(stored_id)
        for msg_id, remark in (
            ("", "bad msgId"),
            ("zz" * 16, "bad msgId"),
            (create_offset_msg_id((host, broker.port), 2**40), "can not find message"),
            (stored_id, "The Consumer <nobody> Not Online"),
        ):
            resp = await send(
                RemotingCommand.request(
                    RequestCode.CONSUME_MESSAGE_DIRECTLY,
                    {"consumerGroup": "G", "clientId": "nobody", "msgId": msg_id},
                )
            )
            assert resp.code == ResponseCode.SYSTEM_ERROR, msg_id
            assert remark in (resp.remark or ""), resp.remark
        # Garbage frames on raw sockets: those connections close, the broker stays up.
        for garbage in [b"\xff" * 64, struct.pack(">ii", 12, 0x00000050) + b"{not json}!!"]:
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
                sock.sendall(garbage)
                sock.settimeout(5)
                try:
                    while sock.recv(4096):
                        pass
                except (ConnectionResetError, TimeoutError):
                    pass
        resp = await send(send_request("Good", b"still alive"))
        assert resp.code == ResponseCode.SUCCESS
        assert broker.running


# Reference section 9, example C: SEND_MESSAGE_V2 exactly as a Java 4.9.8 client frames it.
EXAMPLE_C_HEADER = (
    b'{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"0","f":"0",'
    b'"g":"1700000000000","h":"0","i":"WAIT\\u0001true\\u0002TAGS\\u0001TagA","j":"0",'
    b'"k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":2,'
    b'"serializeTypeCurrentRPC":"JSON","version":409}'
)


def _read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    def read_exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    (length,) = struct.unpack(">i", read_exact(4))
    data = read_exact(length)
    (word,) = struct.unpack(">i", data[:4])
    assert word >> 24 == 0  # answered in JSON, like the request
    hlen = word & 0xFFFFFF
    return json.loads(data[4 : 4 + hlen]), data[4 + hlen :]


def test_raw_json_frame_example_c(broker: BrokerProc) -> None:
    assert len(EXAMPLE_C_HEADER) == 281
    frame = struct.pack(">ii", 4 + 281 + 2, 281) + EXAMPLE_C_HEADER + b"hi"
    assert frame[:8] == bytes.fromhex("0000011f00000119")
    assert len(frame) == 291
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(frame)
        header, body = _read_frame(sock)
    assert header["code"] == 0
    assert header["opaque"] == 2
    assert header["flag"] & 1
    ext = header["extFields"]
    assert ext["MSG_REGION"] == "DefaultRegion"
    assert ext["TRACE_ON"] == "true"
    assert ext["queueId"] == "0"
    assert ext["queueOffset"] == "0"
    assert len(ext["msgId"]) == 32
    assert body == b""


async def test_auto_created_topic_route_appears_at_namesrv(
    namesrv: NamesrvProc, broker: BrokerProc
) -> None:
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        route_req = RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "AutoRouteT"}
        )
        resp = await client.invoke(namesrv.addr, route_req)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        resp = await client.invoke(broker.addr, send_request("AutoRouteT", b"x"))
        assert resp.code == ResponseCode.SUCCESS

        async def routed() -> bool:
            r = await client.invoke(
                namesrv.addr,
                RemotingCommand.request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "AutoRouteT"}
                ),
            )
            return r.code == ResponseCode.SUCCESS

        from tests.helpers import wait_until

        await wait_until(routed, total=10, what="route of the auto-created topic")
        resp = await client.invoke(namesrv.addr, route_req)
        route = TopicRouteData.from_json(resp.body_bytes())
        (qd,) = route.queue_datas
        assert (qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, qd.perm) == (
            "broker-a",
            4,
            4,
            6,
        )
        assert route.broker_datas[0].broker_addrs[0] == broker.addr
        # The TBW102 route is served while auto-create is on.
        resp = await client.invoke(
            namesrv.addr,
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}),
        )
        assert resp.code == ResponseCode.SUCCESS
        # Runtime info is a KVTable.
        resp = await client.invoke(
            broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, None)
        )
        table = KVTable.from_json(resp.body_bytes()).table
        assert table["brokerVersion"] == "409"
        assert int(table["commitLogMaxOffset"]) > 0


@pytest.mark.slow
async def test_sigkill_under_sync_flush_load_loses_no_acknowledged_message(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    # Default persist interval (5 s): the auto-created topic must be on disk before the kill
    # because the broker writes topics.json at once after a change.
    env = {k: v for k, v in SMALL_STORE.items() if "PERSIST" not in k}
    broker = start_broker(namesrv.addr, env=env, flush="sync")
    acked: dict[tuple[int, int], bytes] = {}
    stop = trio.Event()

    async def producer(worker: int) -> None:
        async with RemotingClient() as client:
            i = 0
            while not stop.is_set():
                body = f"w{worker}-{i}".encode() + b"." * 200
                qid = i % 4
                try:
                    resp = await client.invoke(
                        broker.addr, send_request("CrashT", body, queue_id=qid), timeout_ms=3000
                    )
                except Exception:
                    return  # the broker died under us
                if resp.code == ResponseCode.SUCCESS:
                    ext = resp.ext_fields or {}
                    key = (int(ext["queueId"]), int(ext["queueOffset"]))
                    assert key not in acked
                    acked[key] = body
                i += 1

    async with trio.open_nursery() as nursery:
        for w in range(4):
            nursery.start_soon(producer, w)
        await trio.sleep(2.0)
        await trio.to_thread.run_sync(broker.kill)
        stop.set()
    assert len(acked) > 50, "the load was too light to mean anything"
    print(f"acknowledged before SIGKILL: {len(acked)}")
    await trio.to_thread.run_sync(broker.start)
    pulled: dict[tuple[int, int], bytes] = {}
    async with RemotingClient() as client:
        for qid in range(4):
            offset = 0
            while True:
                resp = await client.invoke(
                    broker.addr, pull_request("CrashT", offset, queue_id=qid, max_msgs=500)
                )
                if resp.code != ResponseCode.SUCCESS:
                    break
                for m in decode_records(resp.body_bytes()):
                    assert (qid, m.queue_offset) not in pulled
                    pulled[(qid, m.queue_offset)] = m.body or b""
                offset = int((resp.ext_fields or {})["nextBeginOffset"])
    for key, body in acked.items():
        got = pulled.get(key)
        assert got == body, f"acknowledged message {key} lost or changed"
    bodies = list(pulled.values())
    assert len(bodies) == len(set(bodies)), "a message was stored twice"


async def test_one_pull_returns_1000_messages_of_1kib(broker: BrokerProc) -> None:
    body = b"k" * 1024
    async with RemotingClient() as client:
        for _ in range(10):
            items = [BatchItem(0, body, "") for _ in range(100)]
            req = send_request("Big", encode_batch_body(items), code=RequestCode.SEND_BATCH_MESSAGE)
            resp = await client.invoke(broker.addr, req)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        resp = await client.invoke(broker.addr, pull_request("Big", 0, max_msgs=1000))
        assert resp.code == ResponseCode.SUCCESS
        msgs = decode_records(resp.body_bytes())
        assert len(msgs) == 1000
        assert [m.queue_offset for m in msgs] == list(range(1000))
        assert (resp.ext_fields or {})["nextBeginOffset"] == "1000"


async def test_long_poll_skips_non_matching_arrivals(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        await client.invoke(broker.addr, send_request("LPF", b"old", tags="TagB"))
        results: dict[str, Any] = {}

        async def parked_pull() -> None:
            resp = await client.invoke(
                broker.addr,
                pull_request(
                    "LPF",
                    1,
                    sys_flag=PULL_SUBSCRIPTION | PULL_SUSPEND,
                    subscription="TagA",
                    suspend_ms=15000,
                ),
                timeout_ms=30000,
            )
            results["resp"] = resp

        async with trio.open_nursery() as nursery:
            nursery.start_soon(parked_pull)
            await trio.sleep(0.3)
            await client.invoke(broker.addr, send_request("LPF", b"b1", tags="TagB"))
            await trio.sleep(0.5)
            assert "resp" not in results  # a non-matching arrival does not answer the pull
            await client.invoke(broker.addr, send_request("LPF", b"a1", tags="TagA"))
        resp = results["resp"]
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_records(resp.body_bytes())] == [b"a1"]
        assert (resp.ext_fields or {})["nextBeginOffset"] == "3"


def test_raw_json_frame_with_int_language_and_acl_fields(broker: BrokerProc) -> None:
    header = {
        "code": 310,
        "extFields": {
            "a": "PG",
            "b": "AclT",
            "c": "TBW102",
            "d": "4",
            "e": "-1",
            "f": "0",
            "g": "1700000000000",
            "h": "0",
            "i": "TAGS\u0001TagA",
            "AccessKey": "",
            "Signature": "sig",
            "OnsChannel": "ALIYUN",
            "bname": "broker-a",
        },
        "flag": 0,
        "language": 3,
        "opaque": 7,
        "serializeTypeCurrentRPC": "JSON",
        "version": 1,
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    frame = struct.pack(">ii", 4 + len(raw) + 1, len(raw)) + raw + b"z"
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(frame)
        resp, _ = _read_frame(sock)
    assert resp["code"] == 0, resp
    assert resp["opaque"] == 7
    assert 0 <= int(resp["extFields"]["queueId"]) < 4  # e=-1: the broker picked a queue

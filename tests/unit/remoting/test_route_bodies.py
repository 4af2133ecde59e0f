"""Route bodies: exact JSON text, round trips, fastjson quirks, compressed register body."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remoting.protocol.route import (
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    RouteDecodeError,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    loads_tolerant,
    quote_numeric_keys,
)

# The TopicRouteData example of the RocketMQ 4.x reference (section 3) in Apache 5.x's form:
# each BrokerData also carries `enableActingMaster` (a 5.x NameServer always writes it).
ROUTE_JSON = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"ip:10911","1":"ip2:10911"},"brokerName":"b",'
    b'"cluster":"c","enableActingMaster":false}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"b","perm":6,'
    b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
)

# 5.x's TopicConfig adds `attributes`, its DataVersion `stateVersion`.
REGISTER_JSON = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,'
    b'"stateVersion":0,"timestamp":1700000000000},"topicConfigTable":{"T":{"attributes":{},'
    b'"order":false,"perm":6,'
    b'"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,'
    b'"writeQueueNums":4}}}}'
)


def _route() -> TopicRouteData:
    return TopicRouteData(
        queue_datas=[QueueData("b", read_queue_nums=4, write_queue_nums=4, perm=6)],
        broker_datas=[BrokerData("c", "b", {1: "ip2:10911", 0: "ip:10911"})],
    )


def test_route_exact_json_text() -> None:
    assert _route().to_json() == ROUTE_JSON


def test_route_json_round_trip() -> None:
    route = TopicRouteData.from_json(ROUTE_JSON)
    assert route == TopicRouteData(
        queue_datas=[QueueData("b", 4, 4, 6, 0)],
        broker_datas=[BrokerData("c", "b", {0: "ip:10911", 1: "ip2:10911"})],
        filter_server_table={},
        order_topic_conf=None,
    )
    assert route.to_json() == ROUTE_JSON


def test_route_with_order_topic_conf_and_filter_servers() -> None:
    route = _route()
    route.order_topic_conf = "b:4"
    route.filter_server_table = {"ip:10911": ["ip:30000"]}
    text = route.to_json()
    # Keys stay alphabetical with the optional field in place.
    assert list(json.loads(text)) == [
        "brokerDatas",
        "filterServerTable",
        "orderTopicConf",
        "queueDatas",
    ]
    assert TopicRouteData.from_json(text) == route


def test_fastjson_unquoted_integer_keys() -> None:
    fastjson = (
        b'{"brokerDatas":[{"brokerAddrs":{0:"192.0.2.1:10911",1:"192.0.2.2:10911"},'
        b'"brokerName":"b","cluster":"c"}],"filterServerTable":{},"queueDatas":[]}'
    )
    route = TopicRouteData.from_json(fastjson)
    assert route.broker_datas[0].broker_addrs == {0: "192.0.2.1:10911", 1: "192.0.2.2:10911"}


def test_quote_numeric_keys_leaves_strings_and_values_alone() -> None:
    text = '{0:"a,1:b",  -1 : [1, 2], "k":{12:{3:"x\\"4:"}}, "n": 5}'
    quoted = quote_numeric_keys(text)
    assert json.loads(quoted) == {"0": "a,1:b", "-1": [1, 2], "k": {"12": {"3": 'x"4:'}}, "n": 5}
    # Standard JSON passes through unchanged.
    std = '{"a":[1,2,{"3":4}],"b":"{5:6}"}'
    assert quote_numeric_keys(std) == std


def test_loads_tolerant_rejects_garbage() -> None:
    with pytest.raises(RouteDecodeError):
        loads_tolerant(b"{not json")
    with pytest.raises(RouteDecodeError):
        loads_tolerant(b"\xff\xfe")
    with pytest.raises(RouteDecodeError):
        TopicRouteData.from_json(b"[1,2]")


def test_topic_syn_flag_pre_49_spelling() -> None:
    qd = QueueData.from_json(
        b'{"brokerName":"b","perm":6,"readQueueNums":8,"topicSynFlag":3,"writeQueueNums":8}'
    )
    assert qd.topic_sys_flag == 3
    assert b'"topicSysFlag":3' in qd.to_json()
    tc = TopicConfig.from_json(b'{"topicName":"T","topicSynFlag":2}')
    assert tc.topic_sys_flag == 2


def test_register_body_exact_json_and_round_trip() -> None:
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(
            {"T": TopicConfig("T", 4, 4, 6, "SINGLE_TAG", 0, False)},
            DataVersion(timestamp=1700000000000, counter=3),
        ),
        [],
    )
    assert body.to_json() == REGISTER_JSON
    assert RegisterBrokerBody.from_json(REGISTER_JSON) == body
    assert RegisterBrokerBody.decode(body.encode(), compressed=False) == body


def test_register_body_compressed_round_trip() -> None:
    table = {
        f"Topic{i}": TopicConfig(f"Topic{i}", 8, 4, 6 if i % 2 else 2, "MULTI_TAG")
        for i in range(50)
    }
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(table, DataVersion(1700000000123, 42)), ["1.2.3.4:30000"]
    )
    packed = body.encode(compressed=True)
    assert len(packed) < len(body.to_json())
    back = RegisterBrokerBody.decode(packed, compressed=True)
    assert back == body


def test_register_body_compressed_layout_and_lost_fields() -> None:
    tc = TopicConfig("T", 4, 2, 6, "SINGLE_TAG", topic_sys_flag=1, order=True)
    body = RegisterBrokerBody(TopicConfigSerializeWrapper({"T": tc}, DataVersion(5, 6)), [])
    raw = zlib.decompress(body.encode_compressed())
    dv = b'{"counter":6,"stateVersion":0,"timestamp":5}'
    text = b"T 4 2 6 SINGLE_TAG"
    expected = (
        struct.pack(">i", len(dv)) + dv + struct.pack(">i", 1)
        + struct.pack(">i", len(text)) + text + struct.pack(">i", 2) + b"[]"
    )  # fmt: skip
    assert raw == expected
    back = RegisterBrokerBody.decode(body.encode_compressed(), compressed=True)
    got = back.topic_config_serialize_wrapper.topic_config_table["T"]
    assert (got.topic_sys_flag, got.order) == (0, False)  # the compressed form drops them


def test_register_body_compressed_garbage() -> None:
    with pytest.raises(RouteDecodeError):
        RegisterBrokerBody.decode(b"not zlib", compressed=True)
    with pytest.raises(RouteDecodeError):
        RegisterBrokerBody.decode(zlib.compress(struct.pack(">i", 100) + b"{}"), compressed=True)
    with pytest.raises(RouteDecodeError):
        TopicConfig.decode_text("T 4 4 6")


def test_cluster_info_and_topic_list() -> None:
    ci = ClusterInfo(
        {"b": BrokerData("c", "b", {0: "127.0.0.1:10911"})},
        {"c": ["b"]},
    )
    text = ci.to_json()
    assert text == (
        b'{"brokerAddrTable":{"b":{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"b",'
        b'"cluster":"c","enableActingMaster":false}},"clusterAddrTable":{"c":["b"]}}'
    )
    assert ClusterInfo.from_json(text) == ci
    tl = TopicList(["A", "B"])
    assert tl.to_json() == b'{"topicList":["A","B"]}'
    assert TopicList.from_json(tl.to_json()) == tl
    tl2 = TopicList(["A"], broker_addr="x:1")
    assert tl2.to_json() == b'{"brokerAddr":"x:1","topicList":["A"]}'
    assert TopicList.from_json(tl2.to_json()) == tl2


def test_data_version_json() -> None:
    dv = DataVersion(1700000000000, 7)
    assert dv.to_json() == b'{"counter":7,"stateVersion":0,"timestamp":1700000000000}'
    assert DataVersion.from_json(dv.to_json()) == dv
    # 5.x's stateVersion is kept; a 4.x DataVersion (without it) reads as 0.
    assert DataVersion.from_json(b'{"counter":1,"stateVersion":4,"timestamp":2}') == DataVersion(
        2, 1, 4
    )
    assert DataVersion.from_json(b'{"counter":1,"timestamp":2}') == DataVersion(2, 1, 0)


def test_non_ascii_topic_written_as_utf8() -> None:
    tl = TopicList(["tópico"])
    assert tl.to_json() == '{"topicList":["tópico"]}'.encode()
    assert TopicList.from_json(tl.to_json()) == tl


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_json_values)
def test_quote_numeric_keys_is_identity_on_standard_json(value: object) -> None:
    for text in (json.dumps(value), json.dumps(value, separators=(",", ":"))):
        assert quote_numeric_keys(text) == text


def _fastjson(value: object) -> str:
    """Render like fastjson does for Map<Integer, ...>: integer keys unquoted."""
    if isinstance(value, dict):
        items = ",".join(
            f"{k}:{_fastjson(v)}" if isinstance(k, int) else f"{json.dumps(k)}:{_fastjson(v)}"
            for k, v in value.items()
        )
        return "{" + items + "}"
    if isinstance(value, list):
        return "[" + ",".join(_fastjson(v) for v in value) + "]"
    return json.dumps(value)


@given(
    st.dictionaries(
        st.integers(min_value=-(2**40), max_value=2**40),
        st.text(max_size=8)
        | st.integers()
        | st.dictionaries(st.integers(0, 99), st.text(max_size=4)),
        max_size=6,
    )
)
def test_loads_tolerant_reads_fastjson_integer_keys(value: dict[int, object]) -> None:
    def stringify(v: object) -> object:
        if isinstance(v, dict):
            return {str(k): stringify(x) for k, x in v.items()}
        return v

    assert loads_tolerant(_fastjson(value)) == stringify(value)

"""Typed custom headers: field names, conversions, required fields, the V2 send header."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import remoting.protocol as protocol
import remoting.protocol.headers as headers_module
from remoting import HeaderError, RemotingCommand, RequestCode
from remoting.protocol import (
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    RegisterBrokerRequestHeader,
    ResetOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UnregisterClientRequestHeader,
)
from remoting.protocol.headers import INT32, INT64

HEADER_CLASSES = [getattr(protocol, name) for name in protocol.__all__]

# The classes and Java field names docs/internal-apis.md promises (RocketMQ 4.9 spelling).
EXPECTED_WIRE_NAMES = {
    "SendMessageRequestHeader": [
        "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
        "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
        "batch", "brokerName",
    ],
    "SendMessageResponseHeader": ["msgId", "queueId", "queueOffset", "transactionId"],
    "PullMessageRequestHeader": [
        "consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag",
        "commitOffset", "suspendTimeoutMillis", "subscription", "subVersion", "expressionType",
    ],
    "PullMessageResponseHeader": [
        "suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset",
    ],
    "ConsumerSendMsgBackRequestHeader": [
        "offset", "group", "delayLevel", "originMsgId", "originTopic", "unitMode",
        "maxReconsumeTimes",
    ],
    "EndTransactionRequestHeader": [
        "producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback",
        "fromTransactionCheck", "msgId", "transactionId",
    ],
    "CheckTransactionStateRequestHeader": [
        "tranStateTableOffset", "commitLogOffset", "msgId", "transactionId", "offsetMsgId",
    ],
    "QueryConsumerOffsetRequestHeader": [
        "consumerGroup", "topic", "queueId", "setZeroIfNotFound",
    ],
    "QueryConsumerOffsetResponseHeader": ["offset"],
    "UpdateConsumerOffsetRequestHeader": ["consumerGroup", "topic", "queueId", "commitOffset"],
    "GetMaxOffsetRequestHeader": ["topic", "queueId"],
    "GetMaxOffsetResponseHeader": ["offset"],
    "GetMinOffsetRequestHeader": ["topic", "queueId"],
    # 5.x controller mode.
    "BrokerHeartbeatRequestHeader": [
        "clusterName", "brokerAddr", "brokerName", "brokerId", "epoch", "maxOffset",
        "confirmOffset", "heartbeatTimeoutMills", "electionPriority",
    ],
    "AlterSyncStateSetRequestHeader": ["brokerName", "masterBrokerId", "masterEpoch", "invokeTime"],
    "AlterSyncStateSetResponseHeader": ["newSyncStateSetEpoch"],
    "ElectMasterRequestHeader": [
        "clusterName", "brokerName", "brokerId", "designateElect", "invokeTime",
    ],
    "ElectMasterResponseHeader": [
        "masterBrokerId", "masterAddress", "masterEpoch", "syncStateSetEpoch",
    ],
    "RegisterBrokerToControllerRequestHeader": [
        "clusterName", "brokerName", "brokerId", "brokerAddress", "invokeTime",
    ],
    "RegisterBrokerToControllerResponseHeader": [
        "clusterName", "brokerName", "masterBrokerId", "masterAddress", "masterEpoch",
        "syncStateSetEpoch",
    ],
    "GetReplicaInfoRequestHeader": ["brokerName"],
    "GetReplicaInfoResponseHeader": ["masterBrokerId", "masterAddress", "masterEpoch"],
    "GetMetaDataResponseHeader": [
        "group", "controllerLeaderId", "controllerLeaderAddress", "isLeader", "peers",
    ],
    "GetNextBrokerIdRequestHeader": ["clusterName", "brokerName"],
    "GetNextBrokerIdResponseHeader": ["clusterName", "brokerName", "nextBrokerId"],
    "ApplyBrokerIdRequestHeader": [
        "clusterName", "brokerName", "appliedBrokerId", "registerCheckCode",
    ],
    "ApplyBrokerIdResponseHeader": ["clusterName", "brokerName"],
    "NotifyBrokerRoleChangedRequestHeader": [
        "masterAddress", "masterEpoch", "syncStateSetEpoch", "masterBrokerId",
    ],
    # trimq's own (READ_COMMITLOG, docs/protocol.md).
    "ReadCommitlogRequestHeader": ["offset", "maxBytes"],
    "ReadCommitlogResponseHeader": ["minOffset", "maxOffset"],
    "GetMinOffsetResponseHeader": ["offset"],
    "GetEarliestMsgStoretimeRequestHeader": ["topic", "queueId"],
    "GetEarliestMsgStoretimeResponseHeader": ["timestamp"],
    "SearchOffsetRequestHeader": ["topic", "queueId", "timestamp"],
    "SearchOffsetResponseHeader": ["offset"],
    "ViewMessageRequestHeader": ["offset"],
    "QueryMessageRequestHeader": ["topic", "key", "maxNum", "beginTimestamp", "endTimestamp"],
    "QueryMessageResponseHeader": ["indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"],
    "GetConsumerListByGroupRequestHeader": ["consumerGroup"],
    "NotifyConsumerIdsChangedRequestHeader": ["consumerGroup"],
    "UnregisterClientRequestHeader": ["clientID", "producerGroup", "consumerGroup"],
    "CreateTopicRequestHeader": [
        "topic", "defaultTopic", "readQueueNums", "writeQueueNums", "perm", "topicFilterType",
        "topicSysFlag", "order",
    ],
    "DeleteTopicRequestHeader": ["topic"],
    "DeleteTopicFromNamesrvRequestHeader": ["topic", "clusterName"],
    "GetRouteInfoRequestHeader": ["topic", "acceptStandardJsonOnly"],
    "RegisterBrokerRequestHeader": [
        "brokerName", "brokerAddr", "clusterName", "haServerAddr", "brokerId", "compressed",
        "bodyCrc32",
    ],
    "RegisterBrokerResponseHeader": ["haServerAddr", "masterAddr"],
    "UnRegisterBrokerRequestHeader": ["brokerName", "brokerAddr", "clusterName", "brokerId"],
    "QueryDataVersionRequestHeader": ["brokerName", "brokerAddr", "clusterName", "brokerId"],
    "QueryDataVersionResponseHeader": ["changed"],
    "GetTopicStatsInfoRequestHeader": ["topic"],
    "GetConsumeStatsRequestHeader": ["consumerGroup", "topic"],
    "GetConsumerConnectionListRequestHeader": ["consumerGroup"],
    "ResetOffsetRequestHeader": ["topic", "group", "timestamp", "isForce"],
    "GetTopicsByClusterRequestHeader": ["cluster"],
}  # fmt: skip


def test_every_promised_class_exists_with_java_field_names() -> None:
    assert sorted(EXPECTED_WIRE_NAMES) == sorted(c.__name__ for c in HEADER_CLASSES)
    for cls in HEADER_CLASSES:
        assert [wire for _, wire, _, _ in cls.FIELDS] == EXPECTED_WIRE_NAMES[cls.__name__]
        assert not hasattr(cls(**_sample(cls)), "__dict__"), f"{cls.__name__} is not slotted"


def _sample(cls: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for attr, _, kind, required in cls.FIELDS:
        if required:
            values[attr] = {str: "x", INT32: 1, INT64: 1, bool: True}[kind]
    return values


_VALUES = {
    str: st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
    INT32: st.integers(-(2**31), 2**31 - 1),
    INT64: st.integers(-(2**63), 2**63 - 1),
    bool: st.booleans(),
}


@st.composite
def headers(draw: st.DrawFn, classes: list[Any] = HEADER_CLASSES) -> Any:
    cls = draw(st.sampled_from(classes))
    kwargs: dict[str, Any] = {}
    for attr, _, kind, required in cls.FIELDS:
        if required:
            kwargs[attr] = draw(_VALUES[kind])
        else:
            value = draw(st.one_of(st.none(), _VALUES[kind]))
            if value is not None:
                kwargs[attr] = value
    return cls(**kwargs)


@settings(max_examples=400)
@given(headers())
def test_round_trip_every_header(header: Any) -> None:
    fields = header.to_fields()
    assert all(type(k) is str and type(v) is str for k, v in fields.items())
    assert type(header).from_fields(fields) == header


@settings(max_examples=200)
@given(headers([SendMessageRequestHeader]))
def test_send_header_v2_round_trip(header: SendMessageRequestHeader) -> None:
    v2 = header.to_fields_v2()
    assert set(v2) <= set("abcdefghijklmn")
    assert SendMessageRequestHeader.from_fields_v2(v2) == header
    for code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, 325):
        cmd = RemotingCommand(code, ext_fields=v2)
        assert SendMessageRequestHeader.from_command(cmd) == header
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=header.to_fields())
    assert SendMessageRequestHeader.from_command(cmd) == header


def test_v2_short_name_mapping() -> None:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic="T",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=3,
        sys_flag=1,
        born_timestamp=1700000000000,
        flag=7,
        properties="TAGS\x01A",
        reconsume_times=2,
        unit_mode=True,
        max_reconsume_times=16,
        batch=True,
        broker_name="broker-a",
    )
    assert header.to_fields_v2() == {
        "a": "PG",
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "3",
        "f": "1",
        "g": "1700000000000",
        "h": "7",
        "i": "TAGS\x01A",
        "j": "2",
        "k": "true",
        "l": "16",
        "m": "true",
        "n": "broker-a",
    }


def test_to_fields_formats_and_leaves_out_none() -> None:
    header = SendMessageResponseHeader(msg_id="ABC", queue_id=0, queue_offset=12)
    assert header.to_fields() == {"msgId": "ABC", "queueId": "0", "queueOffset": "12"}
    assert UnregisterClientRequestHeader(client_id="1.2.3.4@1").to_fields() == {
        "clientID": "1.2.3.4@1"
    }
    reg = RegisterBrokerRequestHeader(
        broker_name="b", broker_addr="a:1", cluster_name="c", ha_server_addr="a:2", broker_id=0
    )
    # Java primitives (boolean compressed, Integer bodyCrc32 = 0) are always sent.
    assert reg.to_fields()["compressed"] == "false"
    assert reg.to_fields()["bodyCrc32"] == "0"


def test_missing_required_field_names_the_field() -> None:
    fields = {
        "consumerGroup": "g",
        "topic": "T",
        "queueId": "0",
        "queueOffset": "5",
        "maxMsgNums": "32",
        "sysFlag": "2",
        "commitOffset": "0",
        "suspendTimeoutMillis": "15000",
        "subVersion": "1",
    }
    header = PullMessageRequestHeader.from_fields(fields)
    assert header.queue_offset == 5
    assert header.subscription is None
    for name in fields:
        partial = {k: v for k, v in fields.items() if k != name}
        with pytest.raises(HeaderError) as info:
            PullMessageRequestHeader.from_fields(partial)
        assert info.value.field == name
        assert name in str(info.value)
    with pytest.raises(HeaderError) as info:
        PullMessageRequestHeader.from_fields(None)
    assert info.value.field == "consumerGroup"


def test_v2_missing_field_is_named_by_its_short_name() -> None:
    with pytest.raises(HeaderError) as info:
        SendMessageRequestHeader.from_fields_v2(
            {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "h": "0"}
        )
    assert info.value.field == "g"


@pytest.mark.parametrize("bad", ["", "x", "1.5", "0x10", "9" * 5000])
def test_unparsable_number_is_a_header_error(bad: str) -> None:
    with pytest.raises(HeaderError) as info:
        ResetOffsetRequestHeader.from_fields(
            {"topic": "T", "group": "g", "timestamp": bad, "isForce": "true"}
        )
    assert info.value.field == "timestamp"


def test_booleans_parse_like_java_and_defaults_apply() -> None:
    base = {
        "producerGroup": "PG",
        "tranStateTableOffset": "1",
        "commitLogOffset": "2",
        "commitOrRollback": "8",
        "msgId": "M",
    }
    header = EndTransactionRequestHeader.from_fields(base)
    assert header.from_transaction_check is False
    assert header.transaction_id is None
    for text, value in [("true", True), ("TRUE", True), ("false", False), ("yes", False)]:
        parsed = EndTransactionRequestHeader.from_fields({**base, "fromTransactionCheck": text})
        assert parsed.from_transaction_check is value


def test_unknown_ext_fields_are_ignored() -> None:
    header = ResetOffsetRequestHeader.from_fields(
        {"topic": "T", "group": "g", "timestamp": "5", "isForce": "false", "bname": "b"}
    )
    assert header == ResetOffsetRequestHeader(topic="T", group="g", timestamp=5, is_force=False)


# Java's type of every number field (Apache RocketMQ's remoting/protocol/header classes):
# `Integer`/`int` -> int32, `Long`/`long` -> int64. Every other number field is int64.
INT32_FIELDS = {
    "SendMessageRequestHeader": {
        "defaultTopicQueueNums", "queueId", "sysFlag", "flag", "reconsumeTimes",
        "maxReconsumeTimes",
    },
    "SendMessageResponseHeader": {"queueId"},
    "PullMessageRequestHeader": {"queueId", "maxMsgNums", "sysFlag"},
    "ConsumerSendMsgBackRequestHeader": {"delayLevel", "maxReconsumeTimes"},
    "EndTransactionRequestHeader": {"commitOrRollback"},
    "QueryConsumerOffsetRequestHeader": {"queueId"},
    "UpdateConsumerOffsetRequestHeader": {"queueId"},
    "GetMaxOffsetRequestHeader": {"queueId"},
    "GetMinOffsetRequestHeader": {"queueId"},
    "ReadCommitlogRequestHeader": {"maxBytes"},
    "BrokerHeartbeatRequestHeader": {"epoch", "electionPriority"},
    "AlterSyncStateSetRequestHeader": {"masterEpoch"},
    "AlterSyncStateSetResponseHeader": {"newSyncStateSetEpoch"},
    "ElectMasterResponseHeader": {"masterEpoch", "syncStateSetEpoch"},
    "RegisterBrokerToControllerResponseHeader": {"masterEpoch", "syncStateSetEpoch"},
    "GetReplicaInfoResponseHeader": {"masterEpoch"},
    "NotifyBrokerRoleChangedRequestHeader": {"masterEpoch", "syncStateSetEpoch"},
    "GetEarliestMsgStoretimeRequestHeader": {"queueId"},
    "SearchOffsetRequestHeader": {"queueId"},
    "QueryMessageRequestHeader": {"maxNum"},
    "CreateTopicRequestHeader": {"readQueueNums", "writeQueueNums", "perm", "topicSysFlag"},
    "RegisterBrokerRequestHeader": {"bodyCrc32"},
}  # fmt: skip


def test_every_number_field_has_its_java_width() -> None:
    for cls in HEADER_CLASSES:
        int32 = {wire for _, wire, kind, _ in cls.FIELDS if kind is INT32}
        int64 = {wire for _, wire, kind, _ in cls.FIELDS if kind is INT64}
        assert int32 == INT32_FIELDS.get(cls.__name__, set()), cls.__name__
        assert all(kind in (str, bool, INT32, INT64) for _, _, kind, _ in cls.FIELDS)
        assert not int32 & int64


def test_a_bare_int_annotation_is_refused() -> None:
    with pytest.raises(TypeError, match="Int32 or Int64"):

        @headers_module._header
        class Loose(headers_module._Header):
            queue_id: int


_PULL = {
    "consumerGroup": "g",
    "topic": "T",
    "queueId": "0",
    "queueOffset": "0",
    "maxMsgNums": "32",
    "sysFlag": "2",
    "commitOffset": "0",
    "suspendTimeoutMillis": "15000",
    "subVersion": "1",
}

# Values seen from hostile peers and the edges of both types.
_OUT_OF_RANGE = [
    ("queueId", "-2147483649"),
    ("queueId", "2147483648"),
    ("maxMsgNums", "99999999999"),
    ("sysFlag", "-" + "9" * 30),
    ("queueOffset", "9223372036854775808"),
    ("commitOffset", "-9223372036854775809"),
    ("suspendTimeoutMillis", "1" + "0" * 40),
    ("subVersion", "18446744073709551616"),
]
_AT_THE_EDGES = [
    ("queueId", "-2147483648", -(2**31)),
    ("queueId", "2147483647", 2**31 - 1),
    ("maxMsgNums", "+0002147483647", 2**31 - 1),
    ("queueOffset", "9223372036854775807", 2**63 - 1),
    ("commitOffset", "-9223372036854775808", -(2**63)),
    ("suspendTimeoutMillis", "-0000000000000000000001", -1),
]


@pytest.mark.parametrize(("wire", "text"), _OUT_OF_RANGE)
def test_a_number_outside_its_java_type_is_a_header_error(wire: str, text: str) -> None:
    with pytest.raises(HeaderError) as info:
        PullMessageRequestHeader.from_fields({**_PULL, wire: text})
    assert info.value.field == wire
    width = "int32" if wire in INT32_FIELDS["PullMessageRequestHeader"] else "int64"
    assert f"outside {width}" in info.value.reason
    assert text[:40] in info.value.reason


@pytest.mark.parametrize(("wire", "text", "value"), _AT_THE_EDGES)
def test_the_edges_of_each_type_are_accepted(wire: str, text: str, value: int) -> None:
    header = PullMessageRequestHeader.from_fields({**_PULL, wire: text})
    attr = {w: a for a, w, _, _ in PullMessageRequestHeader.FIELDS}[wire]
    assert getattr(header, attr) == value


def test_ranges_apply_to_optional_fields_and_to_the_v2_short_names() -> None:
    v2 = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0"}
    assert SendMessageRequestHeader.from_fields_v2(v2).queue_id == 0
    for short, text in [("e", "-2147483649"), ("j", "2147483648"), ("g", "9" * 19)]:
        with pytest.raises(HeaderError) as info:
            SendMessageRequestHeader.from_fields_v2({**v2, short: text})
        assert info.value.field == short
    back = {"offset": "1", "group": "g", "delayLevel": "0", "maxReconsumeTimes": "-2147483649"}
    with pytest.raises(HeaderError, match="maxReconsumeTimes"):
        ConsumerSendMsgBackRequestHeader.from_fields(back)
    create = {
        "topic": "T",
        "defaultTopic": "TBW102",
        "readQueueNums": "4",
        "writeQueueNums": "4294967300",
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
    }
    with pytest.raises(HeaderError, match="writeQueueNums"):
        CreateTopicRequestHeader.from_fields(create)

"""JSON bodies exchanged between clients and the broker (heartbeats, consumer lists, admin stats).

Each class is named after RocketMQ's Java class and carries the snake_case form of its fields.
`to_json()` writes what fastjson writes: compact JSON, keys in alphabetical order, null fields
left out. `from_json()` is tolerant of what Java peers write: unquoted integer map keys
(`{0:12}`) and `MessageQueue` map keys written as JSON objects
(`{{"brokerName":"b","queueId":0,"topic":"T"}:5}`); `loads_tolerant` is `_fastjson`'s, shared
with `route`.

`MessageQueue` is `common.message_queue.MessageQueue` (a NamedTuple, the client's type too),
re-exported here; its JSON form, `{"brokerName":..,"queueId":..,"topic":..}`, is written and
read here. Maps keyed by it (TopicStatsTable, ConsumeStats, ResetOffsetBody) are written in
fastjson's object-key form, because that is what Java admin tools parse; it is not standard
JSON, so read them back with `from_json` (or `loads_tolerant`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from common.message_queue import MessageQueue as MessageQueue
from remoting.protocol._fastjson import loads_tolerant as loads_tolerant

__all__ = [
    "ConnectionInfo",
    "ConsumeStats",
    "ConsumerConnection",
    "ConsumerData",
    "ConsumerListBody",
    "HAClientRuntimeInfo",
    "HAConnectionRuntimeInfo",
    "HARuntimeInfo",
    "HeartbeatData",
    "KVTable",
    "LockBatchRequestBody",
    "LockBatchResponseBody",
    "MessageQueue",
    "OffsetWrapper",
    "ProducerConnection",
    "ProducerData",
    "ResetOffsetBody",
    "SubscriptionData",
    "SubscriptionGroupConfig",
    "SubscriptionGroupWrapper",
    "TopicOffset",
    "TopicStatsTable",
    "UnlockBatchRequestBody",
    "dumps",
    "loads_tolerant",
]

# -- JSON helpers -------------------------------------------------------------------------


def _dump_key(key: object) -> str:
    if isinstance(key, MessageQueue):
        return _dump(_mq_to_dict(key))
    if isinstance(key, str):
        return json.dumps(key, ensure_ascii=False)
    if isinstance(key, bool):
        return json.dumps("true" if key else "false")
    if isinstance(key, int):
        return json.dumps(str(key))
    raise TypeError(f"unsupported map key {key!r}")


def _sort_key(key: object) -> tuple[int, str]:
    if isinstance(key, MessageQueue):
        return (0, f"{key.broker_name}\x00{key.queue_id:012d}\x00{key.topic}")
    if isinstance(key, int) and not isinstance(key, bool):
        return (0, f"{key:+021d}")
    return (0, str(key))


def _dump(value: object) -> str:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: _sort_key(kv[0]))
        return "{" + ",".join(f"{_dump_key(k)}:{_dump(v)}" for k, v in items) + "}"
    if isinstance(value, MessageQueue):  # a tuple, but written as an object
        return _dump(_mq_to_dict(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + ",".join(_dump(v) for v in seq) + "]"
    if isinstance(value, _Body):
        return _dump(value.to_dict())
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def dumps(value: object) -> bytes:
    """Compact JSON with keys in alphabetical order, as fastjson writes it.

    Dicts may have str, int (written quoted) or MessageQueue keys (written as objects).
    """
    return _dump(value).encode()


def _int_map(raw: Mapping[str, Any] | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in (raw or {}).items()}


def _mq_map(raw: Mapping[str, Any] | None, conv: Callable[[Any], Any]) -> dict[MessageQueue, Any]:
    return {_mq_from_key(k): conv(v) for k, v in (raw or {}).items()}


class _Body:
    """Shared JSON plumbing: subclasses define to_dict/from_dict."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        raise NotImplementedError

    def to_json(self) -> bytes:
        return dumps(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> Self:
        """Parse a body.

        Raises:
            ValueError: not JSON, or not an object of the expected shape.
        """
        raw = loads_tolerant(data)
        if not isinstance(raw, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object")  # noqa: TRY004
        try:
            return cls.from_dict(raw)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{cls.__name__}: bad field {exc}") from exc


def _bool(value: Any, default: bool = False) -> bool:
    """A JSON boolean (fastjson also accepts the strings "true"/"false" and 0/1)."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# -- message queue ------------------------------------------------------------------------


def _mq_to_dict(mq: MessageQueue) -> dict[str, Any]:
    """A MessageQueue's JSON object, with fastjson's field names."""
    return {"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic}


def _mq_from_dict(raw: Mapping[str, Any]) -> MessageQueue:
    """A MessageQueue from its JSON object.

    Raises:
        KeyError: a field is missing.
        TypeError: `raw` is not a mapping, or `queueId` is not a number.
        ValueError: `queueId` is a string that is not an integer.
    """
    return MessageQueue(str(raw["topic"]), str(raw["brokerName"]), int(raw["queueId"]))


def _mq_from_key(key: str) -> MessageQueue:
    """A MessageQueue from a map key (the JSON text of its object, see `_fastjson`).

    Raises:
        ValueError: the key is not the JSON text of an object.
        KeyError: a field is missing.
        TypeError: `queueId` is not a number.
    """
    raw = json.loads(key)
    if not isinstance(raw, dict):
        raise ValueError(f"not a MessageQueue key: {key!r}")  # noqa: TRY004
    return _mq_from_dict(raw)


# -- heartbeat ----------------------------------------------------------------------------


@dataclass(slots=True)
class SubscriptionData(_Body):
    """One topic subscription of a consumer group (`subString` is `*` or `a || b`)."""

    topic: str
    sub_string: str = "*"
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "classFilterMode": self.class_filter_mode,
            "codeSet": list(self.code_set),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": list(self.tags_set),
            "topic": self.topic,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            topic=str(raw["topic"]),
            sub_string=str(raw.get("subString") or "*"),
            tags_set=[str(t) for t in raw.get("tagsSet") or ()],
            code_set=[int(c) for c in raw.get("codeSet") or ()],
            sub_version=int(raw.get("subVersion") or 0),
            expression_type=str(raw.get("expressionType") or "TAG"),
            class_filter_mode=_bool(raw.get("classFilterMode")),
        )


@dataclass(slots=True)
class ConsumerData(_Body):
    """A consumer group as reported in a heartbeat."""

    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscription_data_set: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumeFromWhere": self.consume_from_where,
            "consumeType": self.consume_type,
            "groupName": self.group_name,
            "messageModel": self.message_model,
            "subscriptionDataSet": [s.to_dict() for s in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            group_name=str(raw["groupName"]),
            consume_type=str(raw.get("consumeType") or "CONSUME_PASSIVELY"),
            message_model=str(raw.get("messageModel") or "CLUSTERING"),
            consume_from_where=str(raw.get("consumeFromWhere") or "CONSUME_FROM_LAST_OFFSET"),
            subscription_data_set=[
                SubscriptionData.from_dict(s) for s in raw.get("subscriptionDataSet") or ()
            ],
            unit_mode=_bool(raw.get("unitMode")),
        )


@dataclass(slots=True)
class ProducerData(_Body):
    """A producer group as reported in a heartbeat."""

    group_name: str

    def to_dict(self) -> dict[str, Any]:
        return {"groupName": self.group_name}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(str(raw["groupName"]))


@dataclass(slots=True)
class HeartbeatData(_Body):
    """HEART_BEAT (34) body: one client instance's producer and consumer groups.

    `heartbeat_fingerprint` and `without_sub` are 5.x's heartbeat v2 fields, written as Apache
    5.x clients write them (0 / false: a full heartbeat, which every broker reads). A v2
    heartbeat with `without_sub` true carries no subscriptions: the broker keeps the ones it
    has. (fastjson names the property of `isWithoutSub()` "withoutSub"; "isWithoutSub" is
    read too.)
    """

    client_id: str
    producer_data_set: list[ProducerData] = field(default_factory=list)
    consumer_data_set: list[ConsumerData] = field(default_factory=list)
    heartbeat_fingerprint: int = 0
    without_sub: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "clientID": self.client_id,
            "consumerDataSet": [c.to_dict() for c in self.consumer_data_set],
            "heartbeatFingerprint": self.heartbeat_fingerprint,
            "producerDataSet": [p.to_dict() for p in self.producer_data_set],
            "withoutSub": self.without_sub,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        without = raw.get("withoutSub")
        if without is None:
            without = raw.get("isWithoutSub")
        return cls(
            client_id=str(raw["clientID"]),
            producer_data_set=[ProducerData.from_dict(p) for p in raw.get("producerDataSet") or ()],
            consumer_data_set=[ConsumerData.from_dict(c) for c in raw.get("consumerDataSet") or ()],
            heartbeat_fingerprint=int(raw.get("heartbeatFingerprint") or 0),
            without_sub=_bool(without),
        )


# -- consumer lists and connections -------------------------------------------------------


@dataclass(slots=True)
class ConsumerListBody(_Body):
    """GET_CONSUMER_LIST_BY_GROUP (38) response body."""

    consumer_id_list: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"consumerIdList": list(self.consumer_id_list)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls([str(c) for c in raw.get("consumerIdList") or ()])


@dataclass(slots=True)
class ConnectionInfo(_Body):
    """RocketMQ's `Connection` body element: one client connection of a group."""

    client_id: str
    client_addr: str
    language: str = "JAVA"
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "clientAddr": self.client_addr,
            "clientId": self.client_id,
            "language": self.language,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            client_id=str(raw.get("clientId", "")),
            client_addr=str(raw.get("clientAddr", "")),
            language=str(raw.get("language", "JAVA")),
            version=int(raw.get("version") or 0),
        )


@dataclass(slots=True)
class ConsumerConnection(_Body):
    """GET_CONSUMER_CONNECTION_LIST (203) response body."""

    connection_set: list[ConnectionInfo] = field(default_factory=list)
    subscription_table: dict[str, SubscriptionData] = field(default_factory=dict)
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(
            {
                "connectionSet": [c.to_dict() for c in self.connection_set],
                "consumeFromWhere": self.consume_from_where,
                "consumeType": self.consume_type,
                "messageModel": self.message_model,
                "subscriptionTable": {k: v.to_dict() for k, v in self.subscription_table.items()},
            }
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            connection_set=[ConnectionInfo.from_dict(c) for c in raw.get("connectionSet") or ()],
            subscription_table={
                str(k): SubscriptionData.from_dict(v)
                for k, v in (raw.get("subscriptionTable") or {}).items()
            },
            consume_type=raw.get("consumeType"),
            message_model=raw.get("messageModel"),
            consume_from_where=raw.get("consumeFromWhere"),
        )


@dataclass(slots=True)
class ProducerConnection(_Body):
    """GET_PRODUCER_CONNECTION_LIST (204) response body."""

    connection_set: list[ConnectionInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"connectionSet": [c.to_dict() for c in self.connection_set]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls([ConnectionInfo.from_dict(c) for c in raw.get("connectionSet") or ()])


# -- queue locks --------------------------------------------------------------------------


@dataclass(slots=True)
class LockBatchRequestBody(_Body):
    """LOCK_BATCH_MQ (41) request body.

    `only_this_broker` is 5.x's (false from clients: a 5.x broker in strict lock mode then
    also locks on its replicas); trimq's broker reads and ignores it.
    """

    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = field(default_factory=list)
    only_this_broker: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "clientId": self.client_id,
            "consumerGroup": self.consumer_group,
            "mqSet": [_mq_to_dict(m) for m in sorted(self.mq_set)],
            "onlyThisBroker": self.only_this_broker,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            consumer_group=str(raw["consumerGroup"]),
            client_id=str(raw["clientId"]),
            mq_set=[_mq_from_dict(m) for m in raw.get("mqSet") or ()],
            only_this_broker=_bool(raw.get("onlyThisBroker")),
        )


@dataclass(slots=True)
class UnlockBatchRequestBody(LockBatchRequestBody):
    """UNLOCK_BATCH_MQ (42) request body (same fields as the lock request)."""


@dataclass(slots=True)
class LockBatchResponseBody(_Body):
    """LOCK_BATCH_MQ (41) response body: the queues now locked by the caller."""

    lock_ok_mq_set: list[MessageQueue] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"lockOKMQSet": [_mq_to_dict(m) for m in sorted(self.lock_ok_mq_set)]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls([_mq_from_dict(m) for m in raw.get("lockOKMQSet") or ()])


# -- admin bodies -------------------------------------------------------------------------


@dataclass(slots=True)
class KVTable(_Body):
    """GET_BROKER_RUNTIME_INFO (28) body: `{"table": {k: v}}`."""

    table: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"table": dict(self.table)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls({str(k): str(v) for k, v in (raw.get("table") or {}).items()})


@dataclass(slots=True)
class HAConnectionRuntimeInfo(_Body):
    """One slave connection in an HARuntimeInfo (master side)."""

    addr: str = ""
    slave_ack_offset: int = 0
    diff: int = 0
    in_sync: bool = False
    transferred_byte_in_second: int = 0
    transfer_from_where: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "addr": self.addr,
            "diff": self.diff,
            "inSync": self.in_sync,
            "slaveAckOffset": self.slave_ack_offset,
            "transferFromWhere": self.transfer_from_where,
            "transferredByteInSecond": self.transferred_byte_in_second,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            str(raw.get("addr") or ""),
            int(raw.get("slaveAckOffset") or 0),
            int(raw.get("diff") or 0),
            _bool(raw.get("inSync")),
            int(raw.get("transferredByteInSecond") or 0),
            int(raw.get("transferFromWhere") or 0),
        )


@dataclass(slots=True)
class HAClientRuntimeInfo(_Body):
    """A slave's HA client in an HARuntimeInfo."""

    master_addr: str | None = None
    transferred_byte_in_second: int = 0
    max_offset: int = 0
    last_read_timestamp: int = 0
    last_write_timestamp: int = 0
    master_flush_offset: int = 0
    activated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(
            {
                "activated": self.activated,
                "lastReadTimestamp": self.last_read_timestamp,
                "lastWriteTimestamp": self.last_write_timestamp,
                "masterAddr": self.master_addr,
                "masterFlushOffset": self.master_flush_offset,
                "maxOffset": self.max_offset,
                "transferredByteInSecond": self.transferred_byte_in_second,
            }
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        addr = raw.get("masterAddr")
        return cls(
            str(addr) if addr is not None else None,
            int(raw.get("transferredByteInSecond") or 0),
            int(raw.get("maxOffset") or 0),
            int(raw.get("lastReadTimestamp") or 0),
            int(raw.get("lastWriteTimestamp") or 0),
            int(raw.get("masterFlushOffset") or 0),
            _bool(raw.get("activated")),
        )


@dataclass(slots=True)
class HARuntimeInfo(_Body):
    """GET_BROKER_HA_STATUS (907) body: a master's slave connections or a slave's client."""

    master: bool = True
    master_commit_log_max_offset: int = 0
    in_sync_slave_nums: int = 0
    ha_connection_info: list[HAConnectionRuntimeInfo] = field(default_factory=list)
    ha_client_runtime_info: HAClientRuntimeInfo = field(default_factory=HAClientRuntimeInfo)

    def to_dict(self) -> dict[str, Any]:
        return {
            "haClientRuntimeInfo": self.ha_client_runtime_info.to_dict(),
            "haConnectionInfo": [c.to_dict() for c in self.ha_connection_info],
            "inSyncSlaveNums": self.in_sync_slave_nums,
            "master": self.master,
            "masterCommitLogMaxOffset": self.master_commit_log_max_offset,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        conns = raw.get("haConnectionInfo") or []
        client = raw.get("haClientRuntimeInfo") or {}
        return cls(
            _bool(raw.get("master"), True),
            int(raw.get("masterCommitLogMaxOffset") or 0),
            int(raw.get("inSyncSlaveNums") or 0),
            [HAConnectionRuntimeInfo.from_dict(c) for c in conns],
            HAClientRuntimeInfo.from_dict(client),
        )


@dataclass(slots=True)
class TopicOffset(_Body):
    """One queue's min/max offsets in a TopicStatsTable."""

    min_offset: int = 0
    max_offset: int = 0
    last_update_timestamp: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "lastUpdateTimestamp": self.last_update_timestamp,
            "maxOffset": self.max_offset,
            "minOffset": self.min_offset,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            min_offset=int(raw.get("minOffset") or 0),
            max_offset=int(raw.get("maxOffset") or 0),
            last_update_timestamp=int(raw.get("lastUpdateTimestamp") or 0),
        )


@dataclass(slots=True)
class TopicStatsTable(_Body):
    """GET_TOPIC_STATS_INFO (202) body."""

    offset_table: dict[MessageQueue, TopicOffset] = field(default_factory=dict)
    topic_put_tps: float = 0.0  # 5.x

    def to_dict(self) -> dict[str, Any]:
        return {
            "offsetTable": {k: v.to_dict() for k, v in self.offset_table.items()},
            "topicPutTps": self.topic_put_tps,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            _mq_map(raw.get("offsetTable"), TopicOffset.from_dict),
            float(raw.get("topicPutTps") or 0.0),
        )


@dataclass(slots=True)
class OffsetWrapper(_Body):
    """One queue's broker and consumer offsets in ConsumeStats."""

    broker_offset: int = 0
    consumer_offset: int = 0
    last_timestamp: int = 0
    pull_offset: int = 0  # 5.x: the group's pull position (at least the consumer offset)

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerOffset": self.broker_offset,
            "consumerOffset": self.consumer_offset,
            "lastTimestamp": self.last_timestamp,
            "pullOffset": self.pull_offset,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            broker_offset=int(raw.get("brokerOffset") or 0),
            consumer_offset=int(raw.get("consumerOffset") or 0),
            last_timestamp=int(raw.get("lastTimestamp") or 0),
            pull_offset=int(raw.get("pullOffset") or 0),
        )


@dataclass(slots=True)
class ConsumeStats(_Body):
    """GET_CONSUME_STATS (208) body."""

    offset_table: dict[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumeTps": self.consume_tps,
            "offsetTable": {k: v.to_dict() for k, v in self.offset_table.items()},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(
            offset_table=_mq_map(raw.get("offsetTable"), OffsetWrapper.from_dict),
            consume_tps=float(raw.get("consumeTps") or 0.0),
        )


@dataclass(slots=True)
class ConsumeStatsList(_Body):
    """GET_BROKER_CONSUME_STATS (317) body: one broker's ConsumeStats of every subscription
    group, per topic it has offsets of (`consumeStatsList`: a list of one-key maps, group ->
    [ConsumeStats]), and the sum of their backlogs (`totalDiff`)."""

    broker_addr: str = ""
    consume_stats_list: list[dict[str, list[ConsumeStats]]] = field(default_factory=list)
    total_diff: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerAddr": self.broker_addr,
            "consumeStatsList": [
                {group: [s.to_dict() for s in stats] for group, stats in entry.items()}
                for entry in self.consume_stats_list
            ],
            "totalDiff": self.total_diff,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        entries = [
            {
                str(group): [ConsumeStats.from_dict(s) for s in stats or []]
                for group, stats in entry.items()
            }
            for entry in raw.get("consumeStatsList") or []
            if isinstance(entry, Mapping)
        ]
        return cls(
            broker_addr=str(raw.get("brokerAddr") or ""),
            consume_stats_list=entries,
            total_diff=int(raw.get("totalDiff") or 0),
        )


@dataclass(slots=True)
class ResetOffsetBody(_Body):
    """RESET_CONSUMER_CLIENT_OFFSET (220) body: queue -> new offset."""

    offset_table: dict[MessageQueue, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"offsetTable": dict(self.offset_table)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        return cls(_mq_map(raw.get("offsetTable"), int))


@dataclass(slots=True)
class SubscriptionGroupConfig(_Body):
    """A subscription (consumer) group's broker-side settings.

    The fields after `notify_consumer_ids_changed_enable` are 5.x's: written with Apache 5.x's
    defaults and kept through an update and the file, but not acted on by trimq's broker.
    `group_retry_policy` and `subscription_data_set` are kept as the JSON they came in.
    """

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    group_retry_policy: dict[str, Any] = field(default_factory=lambda: {"type": "CUSTOMIZED"})
    subscription_data_set: list[Any] | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(
            {
                "attributes": dict(self.attributes),
                "brokerId": self.broker_id,
                "consumeBroadcastEnable": self.consume_broadcast_enable,
                "consumeEnable": self.consume_enable,
                "consumeFromMinEnable": self.consume_from_min_enable,
                "consumeMessageOrderly": self.consume_message_orderly,
                "consumeTimeoutMinute": self.consume_timeout_minute,
                "groupName": self.group_name,
                "groupRetryPolicy": dict(self.group_retry_policy),
                "groupSysFlag": self.group_sys_flag,
                "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
                "retryMaxTimes": self.retry_max_times,
                "retryQueueNums": self.retry_queue_nums,
                "subscriptionDataSet": self.subscription_data_set,
                "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
            }
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        policy = raw.get("groupRetryPolicy")
        subs = raw.get("subscriptionDataSet")
        return cls(
            group_name=str(raw["groupName"]),
            consume_enable=_bool(raw.get("consumeEnable"), True),
            consume_from_min_enable=_bool(raw.get("consumeFromMinEnable"), True),
            consume_broadcast_enable=_bool(raw.get("consumeBroadcastEnable"), True),
            retry_queue_nums=int(raw.get("retryQueueNums", 1)),
            retry_max_times=int(raw.get("retryMaxTimes", 16)),
            broker_id=int(raw.get("brokerId", 0)),
            which_broker_when_consume_slowly=int(raw.get("whichBrokerWhenConsumeSlowly", 1)),
            notify_consumer_ids_changed_enable=_bool(
                raw.get("notifyConsumerIdsChangedEnable"), True
            ),
            consume_message_orderly=_bool(raw.get("consumeMessageOrderly")),
            group_sys_flag=int(raw.get("groupSysFlag") or 0),
            consume_timeout_minute=int(raw.get("consumeTimeoutMinute", 15)),
            group_retry_policy=(
                dict(policy) if isinstance(policy, dict) else {"type": "CUSTOMIZED"}
            ),
            subscription_data_set=list(subs) if isinstance(subs, list) else None,
            attributes={str(k): str(v) for k, v in (raw.get("attributes") or {}).items()},
        )


@dataclass(slots=True)
class SubscriptionGroupWrapper(_Body):
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) body and `config/subscriptionGroup.json`.

    `forbidden_table` (5.x: group -> topic -> forbidden bits) is kept, not acted on.
    """

    subscription_group_table: dict[str, SubscriptionGroupConfig] = field(default_factory=dict)
    data_version: dict[str, int] = field(
        default_factory=lambda: {"counter": 0, "stateVersion": 0, "timestamp": 0}
    )
    forbidden_table: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataVersion": dict(self.data_version),
            "forbiddenTable": {k: dict(v) for k, v in self.forbidden_table.items()},
            "subscriptionGroupTable": {
                k: v.to_dict() for k, v in self.subscription_group_table.items()
            },
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        dv = raw.get("dataVersion") or {}
        return cls(
            subscription_group_table={
                str(k): SubscriptionGroupConfig.from_dict(v)
                for k, v in (raw.get("subscriptionGroupTable") or {}).items()
            },
            data_version={
                "counter": int(dv.get("counter", 0)),
                "stateVersion": int(dv.get("stateVersion", 0)),
                "timestamp": int(dv.get("timestamp", 0)),
            },
            forbidden_table={
                str(g): {str(t): int(v) for t, v in (topics or {}).items()}
                for g, topics in (raw.get("forbiddenTable") or {}).items()
            },
        )


def int_map(raw: Mapping[str, Any] | None) -> dict[int, int]:
    """`{"0": 5}` or `{0: 5}` (after `loads_tolerant`) -> `{0: 5}`."""
    return _int_map(raw)

"""Route bodies of the NameServer protocol (RocketMQ's `TopicRouteData` family) as JSON.

Every class is a plain slotted dataclass; nothing here does I/O. `to_json()`
writes *standard* JSON (quoted keys, compact separators) with fastjson's field
names and fastjson's alphabetical key order, leaving out fields that are None.
`from_json()` accepts what a Java peer writes, including fastjson's unquoted
integer map keys (`{0:"1.2.3.4:10911"}`; parsed by `_fastjson`, shared with
`bodies`) and the pre-4.9 spelling `topicSynFlag` of `QueueData.topicSysFlag`.

`RegisterBrokerBody` also has RocketMQ's compressed form (`compressed=true` on
REGISTER_BROKER): a zlib stream of length-prefixed parts; see `encode_compressed`.

The queue lists a route gives producers and consumers are the client's (`client.route`).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from remoting.protocol import _fastjson
from remoting.protocol._fastjson import quote_keys as quote_numeric_keys

# PermName bits.
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

MASTER_ID = 0

_SEPARATORS = (",", ":")


class RouteDecodeError(ValueError):
    """A route body is not valid JSON of the expected shape."""


# -- JSON helpers -----------------------------------------------------------------


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=_SEPARATORS, ensure_ascii=False).encode("utf-8")


def loads_tolerant(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON written by fastjson (bare integer or object map keys) or a standard encoder.

    `_fastjson.loads_tolerant`, raising this module's error.

    Raises:
        RouteDecodeError: the bytes are not UTF-8, the text is not JSON even after quoting
            fastjson's keys, or it nests too deeply.
    """
    return _fastjson.loads_tolerant(data, RouteDecodeError)


class _Json:
    """`to_json` / `from_json` over a subclass's `to_dict` / `from_dict`."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        raise NotImplementedError

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> Self:
        """Parse a body.

        Raises:
            RouteDecodeError: not JSON of the expected shape.
        """
        return cls.from_dict(loads_tolerant(data))


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RouteDecodeError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def _int(d: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise RouteDecodeError(f"{key}: expected an integer, got {v!r}")
    try:
        return int(v)
    except ValueError:
        raise RouteDecodeError(f"{key}: expected an integer, got {v!r}") from None


def _str(d: Mapping[str, Any], key: str, default: str = "") -> str:
    v = d.get(key, default)
    if v is None:
        return default
    if not isinstance(v, str):
        raise RouteDecodeError(f"{key}: expected a string, got {v!r}")
    return v


def _bool(d: Mapping[str, Any], key: str, default: bool = False) -> bool:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, str):
        return v.lower() == "true"
    return bool(v)


# -- value classes ----------------------------------------------------------------


@dataclass(slots=True)
class DataVersion(_Json):
    """A broker's topic-config version: changes whenever its topic table changes."""

    timestamp: int = 0
    counter: int = 0
    state_version: int = 0  # 5.x: the master epoch in controller mode, else 0

    def copy(self) -> DataVersion:
        return DataVersion(self.timestamp, self.counter, self.state_version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "counter": self.counter,
            "stateVersion": self.state_version,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "DataVersion")
        return cls(
            timestamp=_int(d, "timestamp"),
            counter=_int(d, "counter"),
            state_version=_int(d, "stateVersion"),
        )


@dataclass(slots=True)
class QueueData(_Json):
    """One broker's queues of one topic."""

    broker_name: str
    read_queue_nums: int = 0
    write_queue_nums: int = 0
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "QueueData")
        flag_key = "topicSysFlag" if "topicSysFlag" in d else "topicSynFlag"
        return cls(
            broker_name=_str(d, "brokerName"),
            read_queue_nums=_int(d, "readQueueNums"),
            write_queue_nums=_int(d, "writeQueueNums"),
            perm=_int(d, "perm"),
            topic_sys_flag=_int(d, flag_key),
        )


@dataclass(slots=True)
class BrokerData(_Json):
    """A broker group: its cluster, its name and the address of each member (0 = master)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)
    # 5.x fields: written as Apache 5.x writes them (`enableActingMaster` always, `zoneName`
    # only when set); 4.x clients ignore them, 5.x clients (Rust among them) require the first.
    enable_acting_master: bool = False
    zone_name: str | None = None

    def master_addr(self) -> str | None:
        """The master's address, or None when the group has no live master."""
        return self.broker_addrs.get(MASTER_ID)

    def copy(self) -> BrokerData:
        return BrokerData(
            self.cluster,
            self.broker_name,
            dict(self.broker_addrs),
            self.enable_acting_master,
            self.zone_name,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
            "enableActingMaster": self.enable_acting_master,
        }
        if self.zone_name is not None:
            d["zoneName"] = self.zone_name
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "BrokerData")
        addrs_raw = _obj(d.get("brokerAddrs") or {}, "brokerAddrs")
        try:
            addrs = {int(k): str(v) for k, v in addrs_raw.items()}
        except ValueError:
            raise RouteDecodeError(f"brokerAddrs: non-integer broker id in {addrs_raw!r}") from None
        zone = d.get("zoneName")
        return cls(
            cluster=_str(d, "cluster"),
            broker_name=_str(d, "brokerName"),
            broker_addrs=addrs,
            enable_acting_master=_bool(d, "enableActingMaster"),
            zone_name=str(zone) if zone is not None else None,
        )


@dataclass(slots=True)
class TopicQueueMappingInfo:
    """A static topic's logical-to-physical queue mapping on one broker (5.x).

    Only Apache 5.x NameServers send it (`topicQueueMappingByBroker`, for static topics); trimq
    has no static topics and never writes one, but its decoder keeps what it reads.
    """

    topic: str | None = None
    bname: str | None = None
    total_queues: int = 0
    epoch: int = 0
    dirty: bool = False
    scope: str | None = "__global__"
    curr_id_map: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.bname is not None:
            d["bname"] = self.bname
        d["currIdMap"] = {str(k): v for k, v in sorted(self.curr_id_map.items())}
        d["dirty"] = self.dirty
        d["epoch"] = self.epoch
        if self.scope is not None:
            d["scope"] = self.scope
        if self.topic is not None:
            d["topic"] = self.topic
        d["totalQueues"] = self.total_queues
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "TopicQueueMappingInfo")
        ids = _obj(d.get("currIdMap") or {}, "currIdMap")
        try:
            curr = {int(k): int(v) for k, v in ids.items()}
        except (TypeError, ValueError):
            raise RouteDecodeError(f"currIdMap: non-integer queue id in {ids!r}") from None
        topic, bname, scope = d.get("topic"), d.get("bname"), d.get("scope")
        return cls(
            topic=str(topic) if topic is not None else None,
            bname=str(bname) if bname is not None else None,
            total_queues=_int(d, "totalQueues"),
            epoch=_int(d, "epoch"),
            dirty=_bool(d, "dirty"),
            scope=str(scope) if scope is not None else None,
            curr_id_map=curr,
        )


@dataclass(slots=True)
class TopicRouteData(_Json):
    """The answer to GET_ROUTEINFO_BY_TOPIC.

    `topic_queue_mapping_by_broker` (5.x, static topics only) is None for every other topic
    and then left out, as Apache 5.x's NameServer leaves it out.
    """

    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)
    order_topic_conf: str | None = None
    topic_queue_mapping_by_broker: dict[str, TopicQueueMappingInfo] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "brokerDatas": [b.to_dict() for b in self.broker_datas],
            "filterServerTable": {k: list(v) for k, v in self.filter_server_table.items()},
        }
        if self.order_topic_conf is not None:
            d["orderTopicConf"] = self.order_topic_conf
        d["queueDatas"] = [q.to_dict() for q in self.queue_datas]
        if self.topic_queue_mapping_by_broker is not None:
            d["topicQueueMappingByBroker"] = {
                k: v.to_dict() for k, v in sorted(self.topic_queue_mapping_by_broker.items())
            }
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "TopicRouteData")
        fst = _obj(d.get("filterServerTable") or {}, "filterServerTable")
        conf = d.get("orderTopicConf")
        mapping_raw = d.get("topicQueueMappingByBroker")
        mapping = None
        if mapping_raw is not None:
            mapping = {
                str(k): TopicQueueMappingInfo.from_dict(v)
                for k, v in _obj(mapping_raw, "topicQueueMappingByBroker").items()
            }
        return cls(
            queue_datas=[QueueData.from_dict(q) for q in d.get("queueDatas") or []],
            broker_datas=[BrokerData.from_dict(b) for b in d.get("brokerDatas") or []],
            filter_server_table={str(k): [str(x) for x in (v or [])] for k, v in fst.items()},
            order_topic_conf=str(conf) if conf is not None else None,
            topic_queue_mapping_by_broker=mapping,
        )


@dataclass(slots=True)
class ClusterInfo(_Json):
    """The answer to GET_BROKER_CLUSTER_INFO."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {k: v.to_dict() for k, v in self.broker_addr_table.items()},
            "clusterAddrTable": {k: list(v) for k, v in self.cluster_addr_table.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "ClusterInfo")
        bat = _obj(d.get("brokerAddrTable") or {}, "brokerAddrTable")
        cat = _obj(d.get("clusterAddrTable") or {}, "clusterAddrTable")
        return cls(
            broker_addr_table={str(k): BrokerData.from_dict(v) for k, v in bat.items()},
            cluster_addr_table={str(k): [str(x) for x in (v or [])] for k, v in cat.items()},
        )


@dataclass(slots=True)
class TopicConfig(_Json):
    """A broker's configuration of one topic."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    # 5.x: topic attributes (e.g. "+message.type" -> "NORMAL"); written as Apache 5.x does,
    # kept through trimq, not acted on.
    attributes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attributes": dict(sorted(self.attributes.items())),
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "TopicConfig")
        flag_key = "topicSysFlag" if "topicSysFlag" in d else "topicSynFlag"
        return cls(
            topic_name=_str(d, "topicName"),
            read_queue_nums=_int(d, "readQueueNums", 16),
            write_queue_nums=_int(d, "writeQueueNums", 16),
            perm=_int(d, "perm", PERM_READ | PERM_WRITE),
            topic_filter_type=_str(d, "topicFilterType", "SINGLE_TAG"),
            topic_sys_flag=_int(d, flag_key),
            order=_bool(d, "order"),
            attributes={
                str(k): str(v) for k, v in _obj(d.get("attributes") or {}, "attributes").items()
            },
        )

    def encode_text(self) -> str:
        """RocketMQ's space-separated form used in the compressed register body.

        Only name, read/write queue numbers, perm and filter type travel;
        `topic_sys_flag`, `order` and `attributes` are lost, as in RocketMQ 4.x (5.x appends
        the attributes as a sixth field, which 4.x NameServers refuse, so trimq writes five).
        """
        return (
            f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums}"
            f" {self.perm} {self.topic_filter_type}"
        )

    @classmethod
    def decode_text(cls, text: str) -> Self:
        """Parse `encode_text`'s output.

        Apache 5.x brokers append a sixth field, the attributes as JSON (`{}` when none); it
        is read when it parses as a JSON object of strings and ignored otherwise, as 5.x does.

        Raises:
            RouteDecodeError: fewer than five space-separated fields.
        """
        parts = text.split(" ")
        if len(parts) < 5:
            raise RouteDecodeError(f"topic config text needs 5 fields, got {text!r}")
        attributes: dict[str, str] = {}
        if len(parts) > 5:
            try:
                raw = json.loads(" ".join(parts[5:]))
            except ValueError:
                raw = None
            if isinstance(raw, dict):
                attributes = {str(k): str(v) for k, v in raw.items()}
        try:
            return cls(
                topic_name=parts[0],
                read_queue_nums=int(parts[1]),
                write_queue_nums=int(parts[2]),
                perm=int(parts[3]),
                topic_filter_type=parts[4],
                attributes=attributes,
            )
        except ValueError:
            raise RouteDecodeError(f"bad number in topic config text {text!r}") from None


@dataclass(slots=True)
class TopicConfigSerializeWrapper(_Json):
    """A broker's whole topic table with its data version."""

    topic_config_table: dict[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_dict(),
            "topicConfigTable": {k: v.to_dict() for k, v in self.topic_config_table.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "TopicConfigSerializeWrapper")
        table = _obj(d.get("topicConfigTable") or {}, "topicConfigTable")
        dv = d.get("dataVersion")
        return cls(
            topic_config_table={str(k): TopicConfig.from_dict(v) for k, v in table.items()},
            data_version=DataVersion.from_dict(dv) if dv is not None else DataVersion(),
        )


_I32 = struct.Struct(">i")


@dataclass(slots=True)
class RegisterBrokerBody(_Json):
    """The body of REGISTER_BROKER: the broker's topic table and filter servers."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = field(
        default_factory=TopicConfigSerializeWrapper
    )
    filter_server_list: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "filterServerList": list(self.filter_server_list),
            "topicConfigSerializeWrapper": self.topic_config_serialize_wrapper.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "RegisterBrokerBody")
        w = d.get("topicConfigSerializeWrapper")
        return cls(
            topic_config_serialize_wrapper=(
                TopicConfigSerializeWrapper.from_dict(w)
                if w is not None
                else TopicConfigSerializeWrapper()
            ),
            filter_server_list=[str(x) for x in d.get("filterServerList") or []],
        )

    def encode_compressed(self) -> bytes:
        """The compressed form: zlib (best compression) over length-prefixed parts.

        Layout before compression: int32 length + DataVersion JSON; int32 topic
        count; per topic int32 length + `TopicConfig.encode_text()`; int32
        length + filter server list JSON. Integers are big-endian.
        """
        parts: list[bytes] = []
        dv = self.topic_config_serialize_wrapper.data_version.to_json()
        parts += [_I32.pack(len(dv)), dv]
        table = self.topic_config_serialize_wrapper.topic_config_table
        parts.append(_I32.pack(len(table)))
        for tc in table.values():
            text = tc.encode_text().encode("utf-8")
            parts += [_I32.pack(len(text)), text]
        fsl = _dumps(list(self.filter_server_list))
        parts += [_I32.pack(len(fsl)), fsl]
        return zlib.compress(b"".join(parts), 9)

    def encode(self, *, compressed: bool = False) -> bytes:
        """JSON or compressed form, as the REGISTER_BROKER header's `compressed` says."""
        return self.encode_compressed() if compressed else self.to_json()

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, *, compressed: bool = False) -> Self:
        """Parse either form.

        Raises:
            RouteDecodeError: malformed body.
        """
        if not compressed:
            return cls.from_json(data)
        try:
            raw = zlib.decompress(bytes(data))
        except zlib.error as exc:
            raise RouteDecodeError(f"compressed register body: {exc}") from None
        pos = 0

        def take_int() -> int:
            nonlocal pos
            if pos + 4 > len(raw):
                raise RouteDecodeError("compressed register body: truncated")
            (v,) = _I32.unpack_from(raw, pos)
            pos += 4
            return int(v)

        def take_bytes() -> bytes:
            nonlocal pos
            n = take_int()
            if n < 0 or pos + n > len(raw):
                raise RouteDecodeError("compressed register body: truncated")
            b = raw[pos : pos + n]
            pos += n
            return b

        dv = DataVersion.from_json(take_bytes())
        count = take_int()
        if count < 0:
            raise RouteDecodeError("compressed register body: negative topic count")
        table: dict[str, TopicConfig] = {}
        for _ in range(count):
            try:
                text = take_bytes().decode("utf-8")
            except UnicodeDecodeError:
                raise RouteDecodeError("compressed register body: topic not UTF-8") from None
            tc = TopicConfig.decode_text(text)
            table[tc.topic_name] = tc
        fsl = loads_tolerant(take_bytes())
        if not isinstance(fsl, list):
            raise RouteDecodeError("compressed register body: filter server list not a list")
        return cls(
            topic_config_serialize_wrapper=TopicConfigSerializeWrapper(table, dv),
            filter_server_list=[str(x) for x in fsl],
        )


@dataclass(slots=True)
class TopicList(_Json):
    """The answer to GET_ALL_TOPIC_LIST_FROM_NAMESERVER and GET_TOPICS_BY_CLUSTER."""

    topic_list: list[str] = field(default_factory=list)
    broker_addr: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.broker_addr is not None:
            d["brokerAddr"] = self.broker_addr
        d["topicList"] = list(self.topic_list)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        d = _obj(d, "TopicList")
        ba = d.get("brokerAddr")
        return cls(
            topic_list=[str(x) for x in d.get("topicList") or []],
            broker_addr=str(ba) if ba is not None else None,
        )


# -- queue lists ------------------------------------------------------------------


__all__ = [
    "MASTER_ID",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "BrokerData",
    "ClusterInfo",
    "DataVersion",
    "QueueData",
    "RegisterBrokerBody",
    "RouteDecodeError",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicList",
    "TopicQueueMappingInfo",
    "TopicRouteData",
    "loads_tolerant",
    "quote_numeric_keys",
]

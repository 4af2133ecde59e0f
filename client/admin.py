"""`Admin`: topic, cluster, consumer-group and message administration (RocketMQ's MQAdminExt)."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import structlog

from client._api import PullStatus
from client._util import close_stack
from client.config import ClientConfig
from client.errors import ClientClosedError, MQClientError, NoRouteError
from client.instance import ClientInstance, unique_instance_name
from client.message import (
    DLQ_GROUP_TOPIC_PREFIX,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    check_topic,
)
from client.producer import Producer
from client.route import master_addr, subscribe_queues
from common.message import (
    PROPERTY_CONSUME_START_TIMESTAMP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_MIN_OFFSET,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
    MessageDecodeError,
    decode_offset_msg_id,
)
from common.pull import PULL_FLAG_SUBSCRIPTION
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemoteError
from remoting.protocol import bodies
from remoting.protocol.headers import PullMessageRequestHeader
from remoting.protocol.route import MASTER_ID, ClusterInfo, TopicRouteData, loads_tolerant

log = structlog.get_logger()

# The group RocketMQ's tools pull as (nothing is committed for it).
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"


@dataclass(frozen=True, slots=True)
class BrokerStatsItem:
    """One window of a BrokerStatsData: the counter's `sum`, per second (`tps`), per call
    (`avgpt`)."""

    sum: int
    tps: float
    avgpt: float

    @classmethod
    def from_dict(cls, raw: Any) -> BrokerStatsItem:
        if not isinstance(raw, dict):
            return cls(0, 0.0, 0.0)
        return cls(
            int(raw.get("sum") or 0), float(raw.get("tps") or 0), float(raw.get("avgpt") or 0)
        )

    def to_json(self) -> dict[str, Any]:
        return {"sum": self.sum, "tps": self.tps, "avgpt": self.avgpt}


@dataclass(frozen=True, slots=True)
class BrokerStatsData:
    """VIEW_BROKER_STATS_DATA's answer: the last minute, hour and day."""

    minute: BrokerStatsItem
    hour: BrokerStatsItem
    day: BrokerStatsItem

    @classmethod
    def from_json(cls, body: bytes) -> BrokerStatsData:
        raw = json.loads(body.decode("utf-8")) if body else {}
        if not isinstance(raw, dict):
            raw = {}
        return cls(
            BrokerStatsItem.from_dict(raw.get("statsMinute")),
            BrokerStatsItem.from_dict(raw.get("statsHour")),
            BrokerStatsItem.from_dict(raw.get("statsDay")),
        )

    def sum_24h(self) -> int:
        """RocketMQ's statsAll 24-hour figure: the day's sum, else the hour's, else the
        minute's (a young broker's day ring may hold nothing yet)."""
        for item in (self.day, self.hour, self.minute):
            if item.sum != 0:
                return item.sum
        return 0


@dataclass(slots=True, frozen=True)
class TopicQueueStatus:
    """One queue of `topic_status`."""

    mq: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(slots=True, frozen=True)
class QueueProgress:
    """One queue of `consumer_progress`."""

    mq: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def diff(self) -> int:
        return self.broker_offset - self.consumer_offset


@dataclass(slots=True, frozen=True)
class BrokerRow:
    """One broker of `cluster_list`."""

    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    runtime: dict[str, str]
    ha: bodies.HARuntimeInfo | None = None

    @property
    def role(self) -> str:
        """The broker's role as it reports it (`brokerRole`), else by id."""
        role = self.runtime.get("brokerRole")
        if role:
            return role
        return "MASTER" if self.broker_id == 0 else "SLAVE"

    @property
    def ha_offset(self) -> int | None:
        """The commitlog max offset this broker reported."""
        raw = self.runtime.get("commitLogMaxOffset")
        return int(raw) if raw and raw.lstrip("-").isdigit() else None


def replication_lag(rows: list[BrokerRow], row: BrokerRow) -> int | None:
    """Bytes `row` is behind: a master's slowest connected slave (its HA status), a slave's
    distance to its master's max offset (both reported at the time of the listing)."""
    if row.broker_id == 0:
        if row.ha is None or not row.ha.ha_connection_info:
            return None
        return max(c.diff for c in row.ha.ha_connection_info)
    mine = row.ha_offset
    for other in rows:
        if other.broker_name == row.broker_name and other.broker_id == 0:
            theirs = other.ha_offset
            if mine is None or theirs is None:
                return None
            return max(0, theirs - mine)
    return None


class Admin:
    """Administration calls against the NameServer(s) and brokers.

    Args:
        config: client options (namesrv_addr...).
        instance: a started ClientInstance to share (default: its own).

    Usage::

        async with Admin(ClientConfig(namesrv_addr="127.0.0.1:9876")) as admin:
            await admin.create_topic("TopicTest", cluster="DefaultCluster", queue_nums=8)
    """

    def __init__(
        self, config: ClientConfig | None = None, *, instance: ClientInstance | None = None
    ) -> None:
        self.config = config or (instance.config if instance else ClientConfig())
        if instance is None and "instance_name" not in self.config.model_fields_set:
            self.config = self.config.model_copy(update={"instance_name": unique_instance_name()})
        self._instance = instance
        self._stack = AsyncExitStack()

    @property
    def instance(self) -> ClientInstance:
        if self._instance is None or not self._instance.running:
            raise ClientClosedError("admin is not started (use `async with Admin(...)`)")
        return self._instance

    async def __aenter__(self) -> Self:
        if self._instance is None:
            self._instance = await self._stack.enter_async_context(ClientInstance(self.config))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await close_stack(self._stack, exc_type, exc, tb)

    # -- cluster ----------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        return await self.instance.api.get_broker_cluster_info()

    async def master_addrs(self, cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address (of one cluster, or all).

        Raises:
            MQClientError: the cluster is unknown.
        """
        info = await self.cluster_info()
        if cluster is not None:
            if cluster not in info.cluster_addr_table:
                raise MQClientError(
                    f"cluster {cluster!r} not found; known: {sorted(info.cluster_addr_table)}"
                )
            names = set(info.cluster_addr_table[cluster])
        else:
            names = set(info.broker_addr_table)
        out = {}
        for name in sorted(names):
            bd = info.broker_addr_table.get(name)
            addr = master_addr(bd) if bd is not None else None
            if addr:
                out[name] = addr
        return out

    async def cluster_list(self) -> list[BrokerRow]:
        """Every broker with its runtime info (empty when unreachable)."""
        info = await self.cluster_info()
        rows = []
        for cluster, names in sorted(info.cluster_addr_table.items()):
            for name in sorted(names):
                bd = info.broker_addr_table.get(name)
                if bd is None:
                    continue
                for bid, addr in sorted(bd.broker_addrs.items()):
                    try:
                        runtime = await self.instance.api.get_broker_runtime_info(addr)
                    except Exception as exc:
                        log.warning("broker_runtime_failed", addr=addr, error=str(exc))
                        runtime = {}
                    ha = None
                    if runtime:
                        try:
                            ha = await self.instance.api.get_broker_ha_status(addr)
                        except Exception as exc:  # no HA service, or an older broker
                            log.debug("broker_ha_status_failed", addr=addr, error=str(exc))
                    rows.append(BrokerRow(cluster, name, int(bid), addr, runtime, ha))
        return rows

    async def ha_status(self, addr: str) -> bodies.HARuntimeInfo:
        """A broker's replication status (GET_BROKER_HA_STATUS)."""
        return await self.instance.api.get_broker_ha_status(addr)

    async def broker_epoch(self, addr: str) -> dict[str, Any]:
        """A controller-mode broker's epoch entries (GET_BROKER_EPOCH_CACHE)."""
        return await self.instance.api.get_broker_epoch_cache(addr)

    async def broker_status(self, addr: str) -> dict[str, str]:
        """A broker's runtime info (GET_BROKER_RUNTIME_INFO)."""
        return await self.instance.api.get_broker_runtime_info(addr)

    # -- topics -------------------------------------------------------------------------
    async def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = 6,
        order: bool = False,
    ) -> list[str]:
        """Create or update a topic on one broker or on every master of a cluster.

        Returns:
            The broker addresses the topic was created on.

        Raises:
            MQClientError: neither cluster nor broker given, or no broker found.
        """
        check_topic(topic)
        if broker_addr:
            addrs = [broker_addr]
        elif cluster:
            addrs = list((await self.master_addrs(cluster)).values())
        else:
            raise MQClientError("give a cluster (-c) or a broker address (-b)")
        if not addrs:
            raise MQClientError(f"no master broker in cluster {cluster!r}")
        for addr in addrs:
            await self.instance.api.create_topic(
                addr,
                topic,
                read_queue_nums=read_queue_nums,
                write_queue_nums=write_queue_nums,
                perm=perm,
                order=order,
            )
        return addrs

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        """Delete a topic from the brokers (of a cluster, or all) and the NameServers."""
        addrs = list((await self.master_addrs(cluster)).values())
        for addr in addrs:
            await self.instance.api.delete_topic_in_broker(addr, topic)
        await self.instance.api.delete_topic_in_namesrv(topic, cluster)
        return addrs

    async def topic_list(self) -> list[str]:
        return await self.instance.api.get_topic_list_from_namesrv()

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The route the NameServer gives for a topic.

        Raises:
            NoRouteError: unknown topic.
        """
        route = await self.instance.api.get_topic_route(topic)
        if route is None:
            raise NoRouteError(topic)
        return route

    async def topic_status(self, topic: str) -> list[TopicQueueStatus]:
        """Min/max offsets and last update time of every queue of a topic."""
        route = await self.topic_route(topic)
        rows: list[TopicQueueStatus] = []
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = master_addr(bd)
            if addr is None:
                continue
            stats = await self.instance.api.get_topic_stats_info(addr, topic)
            for mq, off in stats.offset_table.items():
                rows.append(
                    TopicQueueStatus(
                        MessageQueue(mq.topic, mq.broker_name, mq.queue_id),
                        off.min_offset,
                        off.max_offset,
                        off.last_update_timestamp,
                    )
                )
        return sorted(rows, key=lambda r: r.mq)

    # -- consumer groups ----------------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Broker offset, consumer offset and lag of every queue the group consumes."""
        if topic is not None:
            route = await self.topic_route(topic)
            addrs = [a for a in (master_addr(b) for b in route.broker_datas) if a]
        else:
            addrs = list((await self.master_addrs()).values())
        rows: list[QueueProgress] = []
        for addr in addrs:
            try:
                stats = await self.instance.api.get_consume_stats(addr, group, topic)
            except RemoteError as exc:
                log.debug("consume_stats_failed", addr=addr, code=exc.code, remark=exc.remark)
                continue
            for mq, w in stats.offset_table.items():
                rows.append(
                    QueueProgress(
                        MessageQueue(mq.topic, mq.broker_name, mq.queue_id),
                        w.broker_offset,
                        w.consumer_offset,
                        w.last_timestamp,
                    )
                )
        return sorted(rows, key=lambda r: r.mq)

    async def consumer_connection(self, group: str) -> bodies.ConsumerConnection:
        """The group's connected clients and subscriptions (from the first broker that knows).

        Raises:
            MQClientError: no broker knows the group (no consumer online).
        """
        _addr, conn = await self.consumer_connection_at(group)
        return conn

    async def consumer_connection_at(
        self, group: str, addrs: list[str] | None = None
    ) -> tuple[str, bodies.ConsumerConnection]:
        """The first broker (of `addrs`, default every master) that has connections of the
        group's clients, and those connections: the broker to ask the clients through.

        Raises:
            MQClientError: no broker knows the group (no consumer online).
        """
        last: Exception | None = None
        if addrs is None:
            addrs = list((await self.master_addrs()).values())
        for addr in addrs:
            try:
                conn = await self.instance.api.get_consumer_connection_list(addr, group)
            except RemoteError as exc:
                last = exc
                continue
            if conn.connection_set:
                return addr, conn
        raise MQClientError(
            f"the consumer group {group} is not online"
            + (f" ({last.remark})" if isinstance(last, RemoteError) else "")
        )

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int
    ) -> dict[MessageQueue, int]:
        """Move the group's offsets of every queue of `topic` to the first message at/after a time.

        Online consumers overwrite the stored offsets with their own unless
        the broker can tell them (INVOKE_BROKER_TO_RESET_OFFSET); stop them
        first if the broker lacks it.
        """
        route = await self.topic_route(topic)
        result: dict[MessageQueue, int] = {}
        for bd in route.broker_datas:
            addr = master_addr(bd)
            if addr is None:
                continue
            try:
                result.update(
                    await self.instance.api.invoke_broker_to_reset_offset(
                        addr, topic, group, timestamp_ms
                    )
                )
                continue
            except RemoteError as exc:
                if exc.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    raise
            for mq in subscribe_queues(topic, route):
                if mq.broker_name != bd.broker_name:
                    continue
                off = await self.instance.api.search_offset(addr, mq, timestamp_ms)
                await self.instance.api.update_consumer_offset(addr, group, mq, off)
                result[mq] = off
        return dict(sorted(result.items()))

    # -- messages -------------------------------------------------------------------------
    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """The message with this offset id (store host + commitlog offset).

        Raises:
            MQClientError: not an offset id, or nothing there.
        """
        try:
            (ip, port), offset = decode_offset_msg_id(offset_msg_id)
        except MessageDecodeError as exc:
            raise MQClientError(str(exc)) from None
        msg = await self.instance.api.view_message(f"{ip}:{port}", offset)
        msg.broker_name = await self._broker_name_of(f"{ip}:{port}")
        return msg

    async def _broker_name_of(self, addr: str) -> str:
        try:
            info = await self.cluster_info()
        except Exception:
            return ""
        for name, bd in info.broker_addr_table.items():
            if addr in bd.broker_addrs.values():
                return name
        return ""

    async def query_msg_by_id(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """By unique id (UNIQ_KEY) within `topic` when given, else by offset id.

        Raises:
            MQClientError: nothing found, or not an offset id and no topic given.
        """
        if topic is not None:
            found = await self.query_msg_by_key(topic, msg_id, unique_key=True)
            found = [m for m in found if m.msg_id == msg_id] or found
            if found:
                return found
        try:
            (_, port), _ = decode_offset_msg_id(msg_id)
        except MessageDecodeError as exc:
            raise MQClientError(f"{msg_id} is not an offset message id: {exc}") from None
        if not 0 < port < 65536:
            raise MQClientError(
                f"{msg_id} is not an offset message id (port {port}); "
                "give the topic (-t) to look it up as a unique key"
            )
        return [await self.view_message(msg_id)]

    async def query_msg_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = 64,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        unique_key: bool = False,
    ) -> list[MessageExt]:
        """Messages of `topic` indexed under `key`, from every broker of the topic."""
        route = await self.topic_route(topic)
        found: list[MessageExt] = []
        for bd in route.broker_datas:
            addr = bd.broker_addrs.get(MASTER_ID) or next(iter(bd.broker_addrs.values()), None)
            if addr is None:
                continue
            msgs = await self.instance.api.query_message(
                addr,
                topic,
                key,
                max_num=max_num,
                begin_ms=begin_ms,
                end_ms=end_ms,
                unique_key=unique_key,
            )
            for m in msgs:
                m.broker_name = bd.broker_name
            found.extend(msgs)
        return found[:max_num]

    async def max_offsets(self, topic: str) -> dict[MessageQueue, int]:
        route = await self.topic_route(topic)
        out = {}
        addrs = {b.broker_name: master_addr(b) for b in route.broker_datas}
        for mq in subscribe_queues(topic, route):
            addr = addrs.get(mq.broker_name)
            if addr:
                out[mq] = await self.instance.api.get_max_offset(addr, mq)
        return out

    # -- dead-letter queues ------------------------------------------------------------
    async def dlq_messages(self, group: str, *, max_num: int = 1000) -> list[MessageExt]:
        """The messages in `%DLQ%<group>` (oldest first, at most `max_num`).

        A DLQ is created write-only (perm 2); like RocketMQ's dashboard this first
        raises its perm to read-write (6) on every broker that has it, then pulls it.

        Raises:
            NoRouteError: the group has no DLQ.
        """
        topic = DLQ_GROUP_TOPIC_PREFIX + group
        route = await self.topic_route(topic)
        api = self.instance.api
        out: list[MessageExt] = []
        for b in route.broker_datas:
            addr = master_addr(b)
            if addr is None:
                continue
            await api.create_topic(addr, topic, read_queue_nums=1, write_queue_nums=1, perm=6)
            for qid in range(max(1, _read_queues(route, b.broker_name))):
                mq = MessageQueue(topic, b.broker_name, qid)
                offset = await api.get_min_offset(addr, mq)
                while len(out) < max_num:
                    header = PullMessageRequestHeader(
                        consumer_group=DLQ_READER_GROUP,
                        topic=topic,
                        queue_id=qid,
                        queue_offset=offset,
                        max_msg_nums=min(32, max_num - len(out)),
                        sys_flag=PULL_FLAG_SUBSCRIPTION,
                        commit_offset=0,
                        suspend_timeout_millis=0,
                        subscription="*",
                        sub_version=0,
                    )
                    res = await api.pull_message(
                        addr, b.broker_name, header, self.config.mq_client_api_timeout_ms
                    )
                    if res.status is not PullStatus.FOUND or not res.messages:
                        break
                    out.extend(res.messages)
                    offset = res.next_begin_offset
        return out[:max_num]

    async def resend_dlq_message(self, group: str, msg_id: str) -> tuple[MessageExt, SendResult]:
        """Send a copy of a dead-lettered message to its original topic.

        `msg_id` may be the message's unique id, its offset id in the DLQ, or its
        ORIGIN_MESSAGE_ID. Routing properties (retry topic, delay, reconsume counters) are
        dropped; keys, tags and user properties are kept.

        Raises:
            MQClientError: no such message in the DLQ.
        """
        for m in await self.dlq_messages(group):
            ids = {m.msg_id, m.offset_msg_id, m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID)}
            if msg_id not in ids:
                continue
            original = m.properties.get(PROPERTY_RETRY_TOPIC) or m.topic
            copy = Message(original, m.body, flag=m.flag)
            copy.properties.update(
                {k: v for k, v in m.properties.items() if k not in _RESEND_DROPPED}
            )
            async with Producer(DLQ_RESEND_GROUP, self.config, instance=self.instance) as p:
                return m, await p.send(copy)
        raise MQClientError(f"message {msg_id} not found in {DLQ_GROUP_TOPIC_PREFIX}{group}")

    # -- raw calls ---------------------------------------------------------------------
    async def call(
        self,
        addr: str,
        code: int,
        fields: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout_ms: int | None = None,
    ) -> RemotingCommand:
        """One request to a broker (or NameServer) at `addr`; the response when SUCCESS.

        Raises:
            RemoteError: any other response code (with the server's remark).
        """
        cmd = RemotingCommand.request(code, fields, body)
        api = self.instance.api
        resp = await api.transport.invoke(addr, cmd, timeout_ms or api.timeout_ms)
        return resp.raise_for_code()

    def namesrv_addrs(self) -> list[str]:
        return list(self.instance.api.namesrv_addrs)

    # -- subscription groups -----------------------------------------------------------
    async def update_subscription_group(
        self, addr: str, cfg: bodies.SubscriptionGroupConfig
    ) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) on one broker."""
        await self.call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=cfg.to_json())

    async def delete_subscription_group(
        self, addr: str, group: str, *, remove_offset: bool = False
    ) -> None:
        """DELETE_SUBSCRIPTIONGROUP (207) on one broker."""
        fields = {"groupName": group, "removeOffset": str(remove_offset).lower()}
        await self.call(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, fields)

    # -- statistics --------------------------------------------------------------------
    async def view_broker_stats_data(self, addr: str, name: str, key: str) -> BrokerStatsData:
        """VIEW_BROKER_STATS_DATA (315): one broker's figures of stats `name` (TOPIC_PUT_NUMS,
        GROUP_GET_NUMS, ...) for `key` (a topic, `topic@group`, the cluster name).

        Raises:
            RemoteError: the broker has no such stats (SYSTEM_ERROR, its remark says which).
        """
        resp = await self.call(
            addr, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key}
        )
        return BrokerStatsData.from_json(resp.body_bytes())

    # -- configuration -----------------------------------------------------------------
    async def get_broker_config(self, addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG (26): the broker's settings by RocketMQ-style name."""
        resp = await self.call(addr, RequestCode.GET_BROKER_CONFIG)
        return parse_properties(resp.body_bytes().decode("utf-8", "replace"))

    async def update_broker_config(self, addr: str, key: str, value: str) -> str | None:
        """UPDATE_BROKER_CONFIG (25). Returns the broker's remark (set when it could not
        persist the change)."""
        check_config_pair(key, value)
        resp = await self.call(
            addr, RequestCode.UPDATE_BROKER_CONFIG, body=f"{key}={value}\n".encode()
        )
        return resp.remark

    async def get_namesrv_config(self, addr: str) -> dict[str, str]:
        """GET_NAMESRV_CONFIG (319) of one NameServer."""
        resp = await self.call(addr, RequestCode.GET_NAMESRV_CONFIG)
        return parse_properties(resp.body_bytes().decode("utf-8", "replace"))

    async def update_namesrv_config(self, addr: str, key: str, value: str) -> None:
        """UPDATE_NAMESRV_CONFIG (318) on one NameServer."""
        check_config_pair(key, value)
        await self.call(addr, RequestCode.UPDATE_NAMESRV_CONFIG, body=f"{key}={value}\n".encode())

    # -- write permission (NameServer) ---------------------------------------------------
    async def wipe_write_perm(self, ns_addr: str, broker_name: str) -> int:
        """WIPE_WRITE_PERM_OF_BROKER (205) on one NameServer: the number of topics changed."""
        resp = await self.call(
            ns_addr, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": broker_name}
        )
        return int(resp.field("wipeTopicCount") or 0)

    async def add_write_perm(self, ns_addr: str, broker_name: str) -> int:
        """ADD_WRITE_PERM_OF_BROKER (327) on one NameServer: the number of topics changed."""
        resp = await self.call(
            ns_addr, RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": broker_name}
        )
        return int(resp.field("addTopicCount") or 0)

    # -- KV config (NameServer) ------------------------------------------------------------
    async def put_kv(self, namespace: str, key: str, value: str) -> None:
        """PUT_KV_CONFIG (100) on every NameServer."""
        for ns in self.namesrv_addrs():
            await self.call(
                ns, RequestCode.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value}
            )

    async def get_kv(self, namespace: str, key: str) -> str | None:
        """GET_KV_CONFIG (101) from the NameServers (the first that has it), or None."""
        for ns in self.namesrv_addrs():
            try:
                resp = await self.call(
                    ns, RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}
                )
            except RemoteError as exc:
                if exc.code == ResponseCode.QUERY_NOT_FOUND:
                    continue
                raise
            return resp.field("value")
        return None

    async def delete_kv(self, namespace: str, key: str) -> None:
        """DELETE_KV_CONFIG (102) on every NameServer."""
        for ns in self.namesrv_addrs():
            await self.call(ns, RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key})

    # -- files ---------------------------------------------------------------------------
    async def clean_expired_consume_queue(self, addr: str) -> None:
        """CLEAN_EXPIRED_CONSUMEQUEUE (306) on one broker."""
        await self.call(addr, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, timeout_ms=30_000)

    async def delete_expired_commitlog(self, addr: str) -> int:
        """DELETE_EXPIRED_COMMITLOG (329) on one broker: commitlog files deleted."""
        resp = await self.call(addr, RequestCode.DELETE_EXPIRED_COMMITLOG, timeout_ms=30_000)
        return int(resp.field("deletedFiles") or 0)

    # -- clients -------------------------------------------------------------------------
    async def producer_connection(self, addr: str, group: str) -> bodies.ProducerConnection:
        """GET_PRODUCER_CONNECTION_LIST (204) of one broker."""
        resp = await self.call(
            addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group}
        )
        return bodies.ProducerConnection.from_json(resp.body_bytes())

    async def consumer_running_info(
        self, addr: str, group: str, client_id: str, *, jstack: bool = False
    ) -> dict[str, Any]:
        """GET_CONSUMER_RUNNING_INFO (307): the client's ConsumerRunningInfo, asked through
        the broker at `addr` (which forwards it over the client's connection)."""
        fields = {
            "consumerGroup": group,
            "clientId": client_id,
            "jstackEnable": str(jstack).lower(),
        }
        resp = await self.call(
            addr, RequestCode.GET_CONSUMER_RUNNING_INFO, fields, timeout_ms=15_000
        )
        raw = loads_tolerant(resp.body_bytes())
        if not isinstance(raw, dict):
            raise MQClientError(f"bad ConsumerRunningInfo from {addr}")
        return raw

    async def broker_consume_stats(
        self, addr: str, *, order_only: bool = False, timeout_ms: int = 50_000
    ) -> bodies.ConsumeStatsList:
        """GET_BROKER_CONSUME_STATS (317): every subscription group's offsets and backlog per
        topic on the broker at `addr` (`order_only`: the orderly topics only)."""
        resp = await self.call(
            addr,
            RequestCode.GET_BROKER_CONSUME_STATS,
            {"isOrder": str(order_only).lower()},
            timeout_ms=timeout_ms,
        )
        raw = loads_tolerant(resp.body_bytes())
        if not isinstance(raw, dict):
            raise MQClientError(f"bad ConsumeStatsList from {addr}")
        return bodies.ConsumeStatsList.from_dict(raw)

    async def consume_message_directly(
        self, group: str, client_id: str, topic: str, broker_name: str, offset_msg_id: str
    ) -> dict[str, Any]:
        """CONSUME_MESSAGE_DIRECTLY (309): the client `client_id` of `group` consumes the
        message `offset_msg_id` of `topic` once with its listener, asked through the broker
        `broker_name` that stores it. Returns the ConsumeMessageDirectlyResult."""
        route = await self.topic_route(topic)
        addrs = next((b.broker_addrs for b in route.broker_datas
                      if b.broker_name == broker_name), {})  # fmt: skip
        addr = addrs.get(MASTER_ID) or next(iter(addrs.values()), None)
        if addr is None:
            raise MQClientError(f"broker {broker_name} is not in the route of {topic}")
        fields = {"consumerGroup": group, "clientId": client_id, "msgId": offset_msg_id}
        resp = await self.call(
            addr, RequestCode.CONSUME_MESSAGE_DIRECTLY, fields, timeout_ms=15_000
        )
        raw = loads_tolerant(resp.body_bytes())
        if not isinstance(raw, dict) or "consumeResult" not in raw:
            raise MQClientError(f"bad ConsumeMessageDirectlyResult from {addr}")
        return raw

    async def topic_consumed_by(self, addr: str, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO (300) of one broker: the groups of the topic."""
        resp = await self.call(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic})
        raw = loads_tolerant(resp.body_bytes())
        groups = raw.get("groupList") if isinstance(raw, dict) else None
        return sorted(str(g) for g in groups or [])

    # -- messages by position --------------------------------------------------------------
    async def pull_range(
        self,
        mq: MessageQueue,
        begin: int,
        end: int,
        *,
        max_num: int,
        group: str = TOOLS_CONSUMER_GROUP,
        subscription: str = "*",
    ) -> list[MessageExt]:
        """The messages of `mq` from offset `begin` up to (not including) `end`, at most
        `max_num`, read with pulls that commit nothing."""
        route = await self.topic_route(mq.topic)
        bd = next((b for b in route.broker_datas if b.broker_name == mq.broker_name), None)
        addr = master_addr(bd) if bd is not None else None
        if addr is None:
            raise MQClientError(f"broker {mq.broker_name} has no master serving {mq.topic}")
        out: list[MessageExt] = []
        offset = begin
        # Bounded: each round either moves `offset` on or stops.
        while offset < end and len(out) < max_num:
            header = PullMessageRequestHeader(
                consumer_group=group,
                topic=mq.topic,
                queue_id=mq.queue_id,
                queue_offset=offset,
                max_msg_nums=min(32, max_num - len(out), end - offset),
                sys_flag=PULL_FLAG_SUBSCRIPTION,
                commit_offset=0,
                suspend_timeout_millis=0,
                subscription=subscription,
                sub_version=0,
            )
            res = await self.instance.api.pull_message(
                addr, mq.broker_name, header, self.config.mq_client_api_timeout_ms
            )
            if res.status is PullStatus.FOUND:
                out.extend(m for m in res.messages if m.queue_offset < end)
            elif res.status is not PullStatus.NO_MATCHED_MSG:
                break
            if res.next_begin_offset <= offset:
                break
            offset = res.next_begin_offset
        return out[:max_num]

    async def queue_offsets(self, mq: MessageQueue) -> tuple[int, int]:
        """(min offset, max offset) of a queue."""
        addr = await self._master_of(mq)
        api = self.instance.api
        return await api.get_min_offset(addr, mq), await api.get_max_offset(addr, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self.instance.api.search_offset(await self._master_of(mq), mq, timestamp_ms)

    async def _master_of(self, mq: MessageQueue) -> str:
        route = await self.topic_route(mq.topic)
        bd = next((b for b in route.broker_datas if b.broker_name == mq.broker_name), None)
        addr = master_addr(bd) if bd is not None else None
        if addr is None:
            raise MQClientError(f"the topic {mq.topic} has no broker named {mq.broker_name}")
        return addr

    async def message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues (as consumers see them)."""
        return sorted(subscribe_queues(topic, await self.topic_route(topic)))


MAX_CONFIG_TEXT = 4096


def check_config_pair(key: str, value: str) -> None:
    """A setting name and value that fit one `key=value` line.

    Raises:
        MQClientError: empty key, a separator or line break in it, a line break in the value,
            or too long.
    """
    if not key.strip() or any(c in key for c in "=:\r\n#!") or key != key.strip():
        raise MQClientError(f"bad setting name {key!r}")
    if "\n" in value or "\r" in value:
        raise MQClientError("a setting value cannot hold a line break")
    if len(key) + len(value) > MAX_CONFIG_TEXT:
        raise MQClientError("the setting is too long")


def parse_properties(text: str) -> dict[str, str]:
    """`key=value` lines as a dict (blank and `#` lines skipped)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


DLQ_READER_GROUP = "mqadmin_dlq_reader"
DLQ_RESEND_GROUP = "mqadmin_dlq_resend"
_RESEND_DROPPED = frozenset(
    {
        PROPERTY_RETRY_TOPIC,
        PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_CONSUME_START_TIMESTAMP,
        PROPERTY_UNIQ_KEY,
        PROPERTY_WAIT,
    }
)


def _read_queues(route: TopicRouteData, broker_name: str) -> int:
    return max(
        (q.read_queue_nums for q in route.queue_datas if q.broker_name == broker_name), default=1
    )

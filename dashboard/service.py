"""What the pages show: the admin client's answers shaped into rows, with input checks.

Everything a stranger types (topic and group names, offsets, times, counts) is checked here and
refused with `BadInput` (shown on the page), before any call reaches a broker.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import trio

from client.admin import Admin, BrokerRow
from client.errors import MessageValidationError, MQClientError, NoRouteError
from client.message import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    check_group,
    check_topic,
)
from client.producer import Producer
from client.route import master_addr
from client.running_info import figure
from client.trace import TraceView, trace_views
from common.pull import PULL_FLAG_SUBSCRIPTION
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemoteError, RemotingError
from remoting.protocol import bodies
from remoting.protocol.headers import PullMessageRequestHeader

# Bounds on what one page asks for and shows.
MAX_MESSAGES = 32
MAX_TOPICS_SHOWN = 500
MAX_GROUPS_SHOWN = 200
MAX_BODY_PREVIEW = 4096
MAX_TEST_BODY = 64 * 1024
MAX_QUEUES = 1024
# Online clients whose running info a group page asks for, and how long each may take.
MAX_CLIENTS_ASKED = 16
CLIENT_ANSWER_S = 6.0
# Groups the dashboard itself pulls and sends with (pulls commit nothing).
READER_GROUP = "mqdashboard_reader"
SENDER_GROUP = "mqdashboard_sender"
# RocketMQ's own groups and topics, marked as "system" on the pages.
SYSTEM_GROUP_PREFIXES = ("CID_RMQ_SYS_", "CID_SYS_RMQ_", "CID_ONSAPI_", "CID_ONS-HTTP-PROXY")
SYSTEM_GROUPS = frozenset(
    {
        "TOOLS_CONSUMER",
        "FILTERSRV_CONSUMER",
        "__MONITOR_CONSUMER",
        "CLIENT_INNER_PRODUCER",
        "SELF_TEST_P_GROUP",
        "SELF_TEST_C_GROUP",
        "mqadmin_dlq_reader",
        "mqadmin_dlq_resend",
        READER_GROUP,
        SENDER_GROUP,
    }
)
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
    }
)


class BadInput(ValueError):
    """Input refused before any call: the message is shown on the page."""


# -- input ------------------------------------------------------------------------------------
def topic_name(raw: str | None) -> str:
    name = (raw or "").strip()
    try:
        check_topic(name)
    except MessageValidationError as exc:
        raise BadInput(str(exc)) from None
    return name


def lookup_topic_name(raw: str | None) -> str:
    """A topic to look at: also `%RETRY%` / `%DLQ%` ones (check_topic allows `%`)."""
    return topic_name(raw)


def client_id(raw: str | None) -> str:
    """A client id as clients register it (`ip@instance`...): 1 to 255 visible characters."""
    value = (raw or "").strip()
    if not value:
        raise BadInput("give the client id (the group page lists the online ones)")
    if len(value) > 255 or not value.isprintable() or any(c.isspace() for c in value):
        raise BadInput("a client id is 1 to 255 visible characters without spaces")
    return value


def group_name(raw: str | None) -> str:
    name = (raw or "").strip()
    try:
        check_group(name)
    except MessageValidationError as exc:
        raise BadInput(f"group: {exc}") from None
    return name


def int_field(raw: str | None, what: str, *, lo: int, hi: int, default: int | None = None) -> int:
    text = (raw or "").strip()
    if not text:
        if default is None:
            raise BadInput(f"{what} is required")
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise BadInput(f"{what} must be a whole number, not {text[:40]!r}") from None
    if not lo <= value <= hi:
        raise BadInput(f"{what} must be between {lo} and {hi}, not {value}")
    return value


def timestamp_ms(raw: str | None, *, now_ms: int | None = None) -> int:
    """A point in time: epoch milliseconds, or `YYYY-MM-DD HH:MM[:SS]` / ISO 8601 (UTC unless
    it names a zone), or `now`.

    Raises:
        BadInput: none of those, or before 1970 / after 9999.
    """
    text = (raw or "").strip()
    if not text:
        raise BadInput("a time is required (epoch milliseconds or YYYY-MM-DD HH:MM:SS UTC)")
    if text.lower() == "now":
        return now_ms if now_ms is not None else int(time.time() * 1000)
    if text.isdigit():
        if len(text) > 15:
            raise BadInput(f"time {text[:40]!r} is out of range")
        return int(text)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(
            f"time {text[:40]!r}: give epoch milliseconds or YYYY-MM-DD HH:MM:SS (UTC)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    ms = int(dt.timestamp() * 1000)
    if ms < 0:
        raise BadInput(f"time {text[:40]!r} is before 1970")
    return ms


def fmt_time(ms: int) -> str:
    if ms <= 0:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ms)


def is_system_group(name: str) -> bool:
    return name in SYSTEM_GROUPS or name.startswith(SYSTEM_GROUP_PREFIXES)


def is_system_topic(name: str) -> bool:
    return name in SYSTEM_TOPICS or name.startswith(
        ("rmq_sys_", "RMQ_SYS_", RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
    )


# -- cluster -----------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class BrokerView:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    role: str
    version: str
    disk_ratio: float | None
    tps_in: float | None
    tps_out: float | None
    put_today: int | None
    get_today: int | None
    reachable: bool


def _first_float(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return float(raw.split()[0])
    except (ValueError, IndexError):
        return None


def _int_or_none(raw: str | None) -> int | None:
    if raw is None or not raw.lstrip("-").isdigit():
        return None
    return int(raw)


def broker_view(row: BrokerRow) -> BrokerView:
    rt = row.runtime
    return BrokerView(
        cluster=row.cluster,
        broker_name=row.broker_name,
        broker_id=row.broker_id,
        addr=row.addr,
        role=row.role,
        version=rt.get("brokerVersionDesc") or rt.get("brokerVersion") or "-",
        disk_ratio=_first_float(rt.get("commitLogDiskRatio")),
        tps_in=_first_float(rt.get("putTps")),
        tps_out=_first_float(rt.get("getTransferedTps")),
        put_today=_int_or_none(rt.get("msgPutTotalTodayNow")),
        get_today=_int_or_none(rt.get("msgGetTotalTodayNow")),
        reachable=bool(rt),
    )


async def brokers(admin: Admin) -> list[BrokerView]:
    return [broker_view(r) for r in await admin.cluster_list()]


async def clusters(admin: Admin) -> list[str]:
    return sorted((await admin.cluster_info()).cluster_addr_table)


# -- topics ------------------------------------------------------------------------------------
@dataclass(slots=True)
class TopicList:
    names: list[str]
    total: int
    truncated: bool


async def topics(admin: Admin, query: str = "", *, system: bool = False) -> TopicList:
    q = query.strip().lower()
    found = sorted(
        t
        for t in await admin.topic_list()
        if (not q or q in t.lower()) and (system or not is_system_topic(t))
    )
    return TopicList(found[:MAX_TOPICS_SHOWN], len(found), len(found) > MAX_TOPICS_SHOWN)


async def wait_for_route(admin: Admin, topic: str, *, timeout_s: float = 5.0) -> bool:
    """Whether the NameServer lists `topic` within `timeout_s` (a broker registers a new topic
    with it just after creating it)."""
    with trio.move_on_after(timeout_s):
        while True:
            try:
                await admin.topic_route(topic)
                return True
            except NoRouteError:
                await trio.sleep(0.2)
    return False


async def send_test_message(
    admin: Admin, topic: str, body: str, *, tags: str = "", keys: str = ""
) -> SendResult:
    data = body.encode()
    if len(data) > MAX_TEST_BODY:
        raise BadInput(f"the body is {len(data)} bytes; at most {MAX_TEST_BODY} here")
    if any(c.isspace() for c in tags) or "||" in tags:
        raise BadInput("a tag has no spaces and no '||'")
    msg = Message(topic, data, tags=tags or None, keys=keys.split() or None)
    try:
        async with Producer(SENDER_GROUP, admin.config, instance=admin.instance) as p:
            return await p.send(msg)
    except MessageValidationError as exc:
        raise BadInput(str(exc)) from None


# -- consumer groups ---------------------------------------------------------------------------
async def group_names(admin: Admin) -> list[str]:
    """The groups any master knows (subscription groups and groups with stored offsets)."""
    api = admin.instance.api
    names: set[str] = set()
    for addr in (await admin.master_addrs()).values():
        resp = await api.transport.invoke(
            addr,
            RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}),
            api.timeout_ms,
        )
        resp.raise_for_code()
        wrapper = bodies.SubscriptionGroupWrapper.from_json(resp.body_bytes())
        names.update(wrapper.subscription_group_table)
        resp = await api.transport.invoke(
            addr,
            RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET, {}),
            api.timeout_ms,
        )
        if resp.code == ResponseCode.SUCCESS:
            names.update(_offset_table_groups(resp.body_bytes()))
    return sorted(names)


def _offset_table_groups(body: bytes) -> set[str]:
    """Groups of a `consumerOffset.json` body (`{"offsetTable": {"topic@group": {...}}}`)."""
    try:
        raw = json.loads(body or b"{}")
    except ValueError:
        return set()
    table = raw.get("offsetTable") if isinstance(raw, dict) else None
    if not isinstance(table, dict):
        return set()
    return {k.split("@", 1)[1] for k in table if isinstance(k, str) and "@" in k}


@dataclass(slots=True, frozen=True)
class QueueLag:
    mq: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)


@dataclass(slots=True)
class GroupStats:
    group: str
    queues: list[QueueLag] = field(default_factory=list)
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


async def group_stats(admin: Admin, group: str, addrs: list[str] | None = None) -> GroupStats:
    """Lag per queue (every topic the group has offsets of) and consume TPS, summed over the
    masters (`addrs`, default: asked of the NameServer); a master that does not know the group
    is skipped."""
    api = admin.instance.api
    out = GroupStats(group)
    if addrs is None:
        addrs = list((await admin.master_addrs()).values())
    for addr in addrs:
        try:
            stats = await api.get_consume_stats(addr, group)
        except RemoteError:
            continue
        out.consume_tps += stats.consume_tps
        for mq, w in stats.offset_table.items():
            out.queues.append(
                QueueLag(
                    MessageQueue(mq.topic, mq.broker_name, mq.queue_id),
                    w.broker_offset,
                    w.consumer_offset,
                    w.last_timestamp,
                )
            )
    out.queues.sort(key=lambda q: q.mq)
    return out


async def group_connection(
    admin: Admin, group: str
) -> tuple[str, bodies.ConsumerConnection] | None:
    """The group's online clients and the broker that has their connections (to ask them
    through), None when none is online."""
    try:
        return await admin.consumer_connection_at(group)
    except MQClientError:
        return None


@dataclass(frozen=True, slots=True)
class ClientTopicStatus:
    """One online client's pull and consume figures for one topic (its running info's
    statusTable, RocketMQ's ConsumeStatus)."""

    client_id: str
    topic: str
    pull_rt: float
    pull_tps: float
    consume_rt: float
    consume_ok_tps: float
    consume_failed_tps: float
    consume_failed_msgs: int


async def client_statuses(
    admin: Admin, group: str, via: str, client_ids: list[str]
) -> tuple[list[ClientTopicStatus], list[str]]:
    """The running-info figures of up to MAX_CLIENTS_ASKED of the group's online clients
    (GET_CONSUMER_RUNNING_INFO through `via`, a broker that has their connections, asked at
    once, each bounded by CLIENT_ANSWER_S), and one note per client that gave none."""
    rows: list[ClientTopicStatus] = []
    notes: list[str] = []
    asked = sorted(client_ids)[:MAX_CLIENTS_ASKED]
    if len(client_ids) > len(asked):
        notes.append(f"{len(client_ids) - len(asked)} more clients not asked")

    async def ask(client_id: str) -> None:
        info = None
        with trio.move_on_after(CLIENT_ANSWER_S):
            try:
                info = await admin.consumer_running_info(via, group, client_id)
            except (RemotingError, MQClientError) as exc:
                notes.append(f"{client_id}: {exc}")
                return
        if info is None:
            notes.append(f"{client_id}: no answer within {CLIENT_ANSWER_S:.0f} s")
            return
        table = info.get("statusTable")
        for topic, st in sorted(table.items()) if isinstance(table, dict) else ():
            if isinstance(st, dict):
                rows.append(
                    ClientTopicStatus(
                        client_id, str(topic), figure(st.get("pullRT")),
                        figure(st.get("pullTPS")), figure(st.get("consumeRT")),
                        figure(st.get("consumeOKTPS")), figure(st.get("consumeFailedTPS")),
                        int(figure(st.get("consumeFailedMsgs"))),
                    )
                )  # fmt: skip

    async with trio.open_nursery() as nursery:
        for client_id in asked:
            nursery.start_soon(ask, client_id)
    rows.sort(key=lambda r: (r.client_id, r.topic))
    notes.sort()
    return rows, notes


async def delete_group(admin: Admin, group: str) -> list[str]:
    """DELETE_SUBSCRIPTIONGROUP (207) on every master, offsets removed too (RocketMQ's
    `deleteSubGroup -r`).

    Raises:
        RemoteError: a broker refused (e.g. it does not implement the request).
    """
    api = admin.instance.api
    addrs = list((await admin.master_addrs()).values())
    for addr in addrs:
        resp = await api.transport.invoke(
            addr,
            RemotingCommand.request(
                RequestCode.DELETE_SUBSCRIPTIONGROUP,
                {"groupName": group, "cleanOffset": "true"},
            ),
            api.timeout_ms,
        )
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            raise BadInput(
                f"broker {addr} cannot delete groups (it does not implement "
                "DELETE_SUBSCRIPTIONGROUP, request 207)"
            )
        resp.raise_for_code()
    return addrs


# -- messages ----------------------------------------------------------------------------------
async def messages_at(
    admin: Admin, topic: str, broker_name: str, queue_id: int, offset: int, count: int
) -> list[MessageExt]:
    """Up to `count` messages of one queue from `offset` (a pull that commits nothing)."""
    route = await admin.topic_route(topic)
    bd = next((b for b in route.broker_datas if b.broker_name == broker_name), None)
    if bd is None:
        known = sorted(b.broker_name for b in route.broker_datas)
        raise BadInput(f"topic {topic} is not on broker {broker_name!r}; it is on {known}")
    addr = master_addr(bd) or next(iter(bd.broker_addrs.values()), None)
    if addr is None:
        raise BadInput(f"broker {broker_name} has no address")
    header = PullMessageRequestHeader(
        consumer_group=READER_GROUP,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=count,
        sys_flag=PULL_FLAG_SUBSCRIPTION,
        commit_offset=0,
        suspend_timeout_millis=0,
        subscription="*",
        sub_version=0,
    )
    res = await admin.instance.api.pull_message(
        addr, broker_name, header, admin.config.mq_client_api_timeout_ms
    )
    return res.messages[:count]


@dataclass(slots=True, frozen=True)
class BodyPreview:
    kind: str  # "text", "hex" or "empty"
    text: str
    size: int
    truncated: bool


def body_preview(body: bytes, limit: int = MAX_BODY_PREVIEW) -> BodyPreview:
    """Text when the body is UTF-8 with no control characters but tab/newline, else a hex
    dump; at most `limit` bytes of it."""
    if not body:
        return BodyPreview("empty", "", 0, False)
    head = body[:limit]
    truncated = len(body) > limit
    try:
        text = head.decode()
    except UnicodeDecodeError as exc:
        # A cut inside the last character is still text.
        text = head[: exc.start].decode() if truncated and exc.start >= len(head) - 3 else ""
        if not text:
            return BodyPreview("hex", hex_dump(head), len(body), truncated)
    if all(c.isprintable() or c in "\t\n\r" for c in text):
        return BodyPreview("text", text, len(body), truncated)
    return BodyPreview("hex", hex_dump(head), len(body), truncated)


def hex_dump(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


# -- traces ------------------------------------------------------------------------------------
MAX_TRACE_MESSAGES = 64
MAX_TRACE_ROWS = 200


async def message_trace(admin: Admin, msg_id: str, trace_topic: str) -> tuple[list[TraceView], int]:
    """The trace records of `msg_id` in `trace_topic` (at most 200, oldest first) and the number
    of unreadable records, as `mqadmin queryMsgTraceById` reads them.

    Raises:
        BadInput: the trace topic does not exist (nothing was ever traced).
    """
    try:
        msgs = await admin.query_msg_by_key(trace_topic, msg_id, max_num=MAX_TRACE_MESSAGES)
    except NoRouteError:
        raise BadInput(f"no trace topic {trace_topic}: no client has traced messages") from None
    views, bad = trace_views(msg_id, msgs)
    return views[:MAX_TRACE_ROWS], bad

"""Message trace: RocketMQ's trace records, their batched asynchronous writer, and the reader.

A client with `ClientConfig.enable_trace` writes what happens to each message to a trace topic
(`RMQ_SYS_TRACE_TOPIC` by default): a `Pub` record per message sent, a `SubBefore` and a
`SubAfter` record per message consumed. The records are RocketMQ's text format (its
`TraceDataEncoder`): fields separated by `\\x01`, each record ended by `\\x02`, several records
in one message body, `null` for a missing value. The trace message's KEYS are every traced
message id plus the message's own keys, so a QUERY_MESSAGE by message id on the trace topic
finds it (`mqadmin queryMsgTraceById`). docs/trace.md has the design.

`TraceDispatcher` writes them: `append` never waits and never fails (a full queue drops the
record and counts it); a task batches records and sends them through the dispatcher's own
producer (never traced itself).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from types import TracebackType
from typing import TYPE_CHECKING, Self

import structlog
import trio

from common.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MSG_REGION,
    PROPERTY_TRACE_SWITCH,
    PROPERTY_TRANSACTION_PREPARED,
    UniqKeyGenerator,
)

if TYPE_CHECKING:
    from client.config import ClientConfig
    from client.instance import ClientInstance
    from client.message import Message, MessageExt, SendResult
    from client.producer import Producer

log = structlog.get_logger()

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
DEFAULT_REGION = "DefaultRegion"
TRACE_GROUP_PREFIX = "_INNER_TRACE_PRODUCER"
# RocketMQ 4.9's AsyncTraceDispatcher: a queue of 1024 records; a batch is sent when its data
# reaches 118000 characters (128000 - 10000) or 500 ms after its first record.
DEFAULT_QUEUE_SIZE = 1024
FLUSH_INTERVAL_S = 0.5
MAX_BATCH_CHARS = 118_000
TRACE_MAX_MESSAGE_SIZE = 128_000
TRACE_SEND_TIMEOUT_MS = 5000
# The trace message's KEYS property: the broker refuses properties over 32767 bytes, so a
# batch also ends before its keys pass this many characters (a record's own keys included).
MAX_BATCH_KEY_CHARS = 16_000
MAX_SENDS_IN_FLIGHT = 4
CLOSE_TIMEOUT_S = 5.0

_counter = itertools.count(1)


class TraceType(Enum):
    """Record types, named as RocketMQ writes them."""

    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class TraceMessageType(IntEnum):
    """RocketMQ's `MessageType`; the record holds the ordinal."""

    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3


class ConsumeReturnType(IntEnum):
    """RocketMQ's `ConsumeReturnType`: a SubAfter record's context code."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


@dataclass(slots=True)
class TraceBean:
    """One message's part of a record (RocketMQ's `TraceBean`); None is written `null`."""

    topic: str | None = ""
    msg_id: str | None = ""
    offset_msg_id: str | None = ""
    tags: str | None = ""
    keys: str | None = ""
    store_host: str | None = ""
    client_host: str | None = None
    retry_times: int = 0
    body_length: int = 0
    msg_type: TraceMessageType = TraceMessageType.Normal_Msg
    transaction_id: str | None = None
    transaction_state: str = "UNKNOW"
    from_transaction_check: bool = False


_request_ids: UniqKeyGenerator | None = None


def new_request_id() -> str:
    """A fresh request id (RocketMQ's createUniqID): pairs a SubBefore with its SubAfter."""
    global _request_ids
    if _request_ids is None:
        _request_ids = UniqKeyGenerator()
    return _request_ids.next()


@dataclass(slots=True)
class TraceContext:
    """One traced event (RocketMQ's `TraceContext`): a send, or a consume of a batch."""

    trace_type: TraceType
    time_stamp: int = field(default_factory=lambda: int(time.time() * 1000))
    region_id: str | None = ""
    group_name: str | None = ""
    cost_time: int = 0
    success: bool = True
    request_id: str | None = field(default_factory=new_request_id)
    context_code: int = 0
    beans: list[TraceBean] = field(default_factory=list)


@dataclass(slots=True)
class TraceTransfer:
    """An encoded context: its records and the keys it adds to the trace message."""

    data: str
    keys: list[str]


def _s(value: object) -> str:
    """A field as Java's StringBuilder appends it: null, true/false, numbers in decimal. The
    two separators inside a text (a key or tag could hold them) become spaces, or the record
    would not read back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, IntEnum):
        return str(int(value))
    text = str(value)
    if CONTENT_SPLITOR in text or FIELD_SPLITOR in text:
        text = text.replace(CONTENT_SPLITOR, " ").replace(FIELD_SPLITOR, " ")
    return text


def _record(fields: Sequence[object]) -> str:
    return CONTENT_SPLITOR.join(map(_s, fields)) + FIELD_SPLITOR


def encode_context(ctx: TraceContext) -> TraceTransfer:
    """The records of `ctx` in RocketMQ 4.9's layout (`TraceDataEncoder.encoderFromContextBean`).

    Pub: type, timeStamp, regionId, groupName, topic, msgId, tags, keys, storeHost,
    bodyLength, costTime, msgType ordinal, offsetMsgId, success (first bean only).
    SubBefore (one per bean): type, timeStamp, regionId, groupName, requestId, msgId,
    retryTimes, keys. SubAfter (one per bean): type, requestId, msgId, costTime, success, keys,
    contextCode, timeStamp, groupName. EndTransaction: type, timeStamp, regionId, groupName,
    topic, msgId, tags, keys, storeHost, msgType ordinal, transactionId, transactionState,
    fromTransactionCheck.
    """
    parts: list[str] = []
    t = ctx.trace_type
    if t is TraceType.Pub and ctx.beans:
        b = ctx.beans[0]
        parts.append(
            _record(
                (
                    t.value,
                    ctx.time_stamp,
                    ctx.region_id,
                    ctx.group_name,
                    b.topic,
                    b.msg_id,
                    b.tags,
                    b.keys,
                    b.store_host,
                    b.body_length,
                    ctx.cost_time,
                    b.msg_type,
                    b.offset_msg_id,
                    ctx.success,
                )
            )
        )
    elif t is TraceType.SubBefore:
        parts.extend(
            _record(
                (
                    t.value,
                    ctx.time_stamp,
                    ctx.region_id,
                    ctx.group_name,
                    ctx.request_id,
                    b.msg_id,
                    b.retry_times,
                    b.keys or None,  # last field: empty would be dropped by Java's split
                )
            )
            for b in ctx.beans
        )
    elif t is TraceType.SubAfter:
        parts.extend(
            _record(
                (
                    t.value,
                    ctx.request_id,
                    b.msg_id,
                    ctx.cost_time,
                    ctx.success,
                    b.keys,
                    ctx.context_code,
                    ctx.time_stamp,
                    ctx.group_name,
                )
            )
            for b in ctx.beans
        )
    elif t is TraceType.EndTransaction and ctx.beans:
        b = ctx.beans[0]
        parts.append(
            _record(
                (
                    t.value,
                    ctx.time_stamp,
                    ctx.region_id,
                    ctx.group_name,
                    b.topic,
                    b.msg_id,
                    b.tags,
                    b.keys,
                    b.store_host,
                    b.msg_type,
                    b.transaction_id,
                    b.transaction_state,
                    b.from_transaction_check,
                )
            )
        )
    keys: list[str] = []
    for b in ctx.beans:
        keys.append(_s(b.msg_id))
        if b.keys:
            keys.extend(k for k in b.keys.split(KEY_SEPARATOR) if k)
    return TraceTransfer("".join(parts), keys)


def _java_split(text: str, sep: str) -> list[str]:
    """Java's `String.split` with a one-character separator: trailing empty strings dropped
    (a non-empty text of separators only gives [])."""
    if not text:
        return [""]
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _null(text: str) -> str | None:
    return None if text == "null" else text


def _bool(text: str) -> bool:
    return text.lower() == "true"  # Java's Boolean.parseBoolean


def _decode_record(line: list[str]) -> TraceContext | None:
    """One record as RocketMQ 4.9's decoder reads it; None for another type.

    Raises:
        ValueError / IndexError: a field missing or not a number (as Java's decoder throws).
    """
    kind = line[0]
    if kind == TraceType.Pub.value:
        ctx = TraceContext(TraceType.Pub, int(line[1]), _null(line[2]), _null(line[3]))
        bean = TraceBean(
            topic=_null(line[4]),
            msg_id=_null(line[5]),
            tags=_null(line[6]),
            keys=_null(line[7]),
            store_host=_null(line[8]),
            body_length=int(line[9]),
            msg_type=TraceMessageType(int(line[11])),
        )
        ctx.cost_time = int(line[10])
        if len(line) == 13:
            ctx.success = _bool(line[12])
        elif len(line) >= 14:
            bean.offset_msg_id = _null(line[12])
            ctx.success = _bool(line[13])
            if len(line) >= 15:
                bean.client_host = _null(line[14])
        ctx.beans.append(bean)
        return ctx
    if kind == TraceType.SubBefore.value:
        ctx = TraceContext(TraceType.SubBefore, int(line[1]), _null(line[2]), _null(line[3]))
        ctx.request_id = _null(line[4])
        ctx.beans.append(
            TraceBean(msg_id=_null(line[5]), retry_times=int(line[6]), keys=_null(line[7]))
        )
        return ctx
    if kind == TraceType.SubAfter.value:
        ctx = TraceContext(TraceType.SubAfter, 0, None, None)
        ctx.request_id = _null(line[1])
        ctx.beans.append(TraceBean(msg_id=_null(line[2]), keys=_null(line[5])))
        ctx.cost_time = int(line[3])
        ctx.success = _bool(line[4])
        if len(line) >= 7:
            ctx.context_code = int(line[6])
        if len(line) >= 9:
            ctx.time_stamp = int(line[7])
            ctx.group_name = _null(line[8])
        return ctx
    if kind == TraceType.EndTransaction.value:
        ctx = TraceContext(TraceType.EndTransaction, int(line[1]), _null(line[2]), _null(line[3]))
        ctx.beans.append(
            TraceBean(
                topic=_null(line[4]),
                msg_id=_null(line[5]),
                tags=_null(line[6]),
                keys=_null(line[7]),
                store_host=_null(line[8]),
                msg_type=TraceMessageType(int(line[9])),
                transaction_id=_null(line[10]),
                transaction_state=line[11],
                from_transaction_check=_bool(line[12]),
            )
        )
        return ctx
    return None


def decode_trace_data(text: str) -> tuple[list[TraceContext], int]:
    """The records of a trace message body (RocketMQ's `decoderFromTraceDataString`).

    Returns:
        ``(contexts, bad)``: one context per record of a known type, in order, and how many
        records could not be read (a missing field, a number that is not one): RocketMQ's
        decoder throws on those; the trace topic takes any producer's messages, so they are
        skipped and counted here.
    """
    out: list[TraceContext] = []
    bad = 0
    if not text:
        return out, bad
    for record in _java_split(text, FIELD_SPLITOR):
        line = _java_split(record, CONTENT_SPLITOR)
        if not line:
            continue
        try:
            ctx = _decode_record(line)
        except (ValueError, IndexError):
            bad += 1
            continue
        if ctx is not None:
            out.append(ctx)
    return out, bad


# -- building records from client events --------------------------------------------------
def message_type(msg: Message) -> TraceMessageType:
    """The trace's message type of a message about to be sent."""
    props = msg.properties
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return TraceMessageType.Trans_Msg_Half
    if props.get(PROPERTY_DELAY_TIME_LEVEL, "0") not in ("", "0"):
        return TraceMessageType.Delay_Msg
    return TraceMessageType.Normal_Msg


def pub_context(
    group: str,
    msg: Message,
    msg_id: str,
    offset_msg_id: str,
    store_host: str | None,
    region_id: str,
    started_ms: int,
    cost_ms: int,
    success: bool,
) -> TraceContext:
    """The Pub record of one message sent (RocketMQ's SendMessageTraceHookImpl)."""
    bean = TraceBean(
        topic=msg.topic,
        msg_id=msg_id,
        offset_msg_id=offset_msg_id,
        tags=msg.tags,
        keys=msg.keys,
        store_host=store_host,
        body_length=len(msg.body),
        msg_type=message_type(msg),
    )
    return TraceContext(
        TraceType.Pub,
        started_ms,
        region_id,
        group,
        cost_time=max(0, cost_ms),
        success=success,
        beans=[bean],
    )


def pub_contexts(
    group: str,
    msgs: Sequence[Message],
    result: SendResult,
    store_host: str | None,
    region_id: str,
    started_ms: int,
    cost_ms: int,
) -> list[TraceContext]:
    """One Pub record per message of a batch sent as `result` (its msg ids and offset ids are
    comma-joined in the batch's order); the batch's cost is each message's."""
    from client.message import SendStatus

    ids = result.msg_id.split(",")
    offset_ids = result.offset_msg_id.split(",")
    ok = result.status is SendStatus.SEND_OK
    out = []
    for i, m in enumerate(msgs):
        mid = m.uniq_key or (ids[i] if i < len(ids) else "")
        oid = offset_ids[i] if i < len(offset_ids) else ""
        out.append(pub_context(group, m, mid, oid, store_host, region_id, started_ms, cost_ms, ok))
    return out


def end_transaction_context(
    group: str,
    msg: Message,
    msg_id: str,
    store_host: str | None,
    transaction_id: str | None,
    state: str,
    from_transaction_check: bool,
) -> TraceContext:
    """The EndTransaction record of a transaction's end (RocketMQ's
    EndTransactionTraceHookImpl): msgType is always Trans_msg_Commit there, whatever the state;
    `state` is COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW."""
    bean = TraceBean(
        topic=msg.topic,
        msg_id=msg_id,
        tags=msg.tags,
        keys=msg.keys,
        store_host=store_host,
        msg_type=TraceMessageType.Trans_msg_Commit,
        transaction_id=transaction_id,
        transaction_state=state,
        from_transaction_check=from_transaction_check,
    )
    region = msg.properties.get(PROPERTY_MSG_REGION) or DEFAULT_REGION
    return TraceContext(TraceType.EndTransaction, region_id=region, group_name=group, beans=[bean])


def sub_before(group: str, msgs: Iterable[MessageExt], trace_topic: str) -> TraceContext | None:
    """The SubBefore context of a batch handed to a listener (RocketMQ's
    ConsumeMessageTraceHookImpl): the messages not sent with TRACE_ON=false, and not trace
    messages themselves (tracing their consumption would feed itself). None when none is left."""
    beans = []
    region = None
    for m in msgs:
        if m.topic == trace_topic:
            continue
        props = m.properties
        if props.get(PROPERTY_TRACE_SWITCH) == "false":
            continue
        region = props.get(PROPERTY_MSG_REGION) or region
        beans.append(
            TraceBean(
                topic=m.topic,
                msg_id=m.msg_id,
                tags=m.tags,
                keys=m.keys,
                body_length=m.store_size,
                retry_times=m.reconsume_times,
            )
        )
    if not beans:
        return None
    return TraceContext(
        TraceType.SubBefore, region_id=region or DEFAULT_REGION, group_name=group, beans=beans
    )


def sub_after(
    before: TraceContext, batch_size: int, success: bool, return_type: ConsumeReturnType
) -> TraceContext:
    """The SubAfter context paired with `before` (same request id and beans); the cost is the
    batch's time divided by its size, as RocketMQ's."""
    now = int(time.time() * 1000)
    return TraceContext(
        TraceType.SubAfter,
        now,
        before.region_id,
        before.group_name,
        cost_time=max(0, now - before.time_stamp) // max(1, batch_size),
        success=success,
        request_id=before.request_id,
        context_code=int(return_type),
        beans=before.beans,
    )


# -- reading ----------------------------------------------------------------------------------
@dataclass(slots=True)
class TraceView:
    """One record about one message, as `queryMsgTraceById` shows it (RocketMQ's TraceView).

    `client_host` is the trace message's born host (the traced client's address);
    `retry_times` comes from the SubBefore record of the same request (SubAfter has none).
    """

    trace_type: str
    msg_id: str
    group_name: str
    client_host: str
    time_stamp: int
    cost_time: int
    status: str
    topic: str | None = None
    tags: str | None = None
    keys: str | None = None
    store_host: str | None = None
    offset_msg_id: str | None = None
    msg_type: str | None = None
    region_id: str | None = None
    request_id: str | None = None
    retry_times: int | None = None
    context_code: int | None = None
    transaction_state: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}


def trace_views(msg_id: str, trace_messages: Iterable[MessageExt]) -> tuple[list[TraceView], int]:
    """The records about `msg_id` in these trace messages, oldest first, and the number of
    records that could not be read."""
    views: list[TraceView] = []
    retries: dict[str | None, int] = {}
    bad_total = 0
    for tm in trace_messages:
        try:
            text = tm.body.decode("utf-8")
        except UnicodeDecodeError:
            bad_total += 1
            continue
        contexts, bad = decode_trace_data(text)
        bad_total += bad
        for ctx in contexts:
            bean = ctx.beans[0]
            if bean.msg_id != msg_id:
                continue
            if ctx.trace_type is TraceType.SubBefore:
                retries[ctx.request_id] = bean.retry_times
            views.append(
                TraceView(
                    trace_type=ctx.trace_type.value,
                    msg_id=msg_id,
                    group_name=ctx.group_name or "",
                    client_host=tm.born_host,
                    time_stamp=ctx.time_stamp,
                    cost_time=ctx.cost_time,
                    status="success" if ctx.success else "failed",
                    topic=bean.topic or None,
                    tags=bean.tags,
                    keys=bean.keys,
                    store_host=bean.store_host or None,
                    offset_msg_id=bean.offset_msg_id or None,
                    msg_type=(
                        bean.msg_type.name
                        if ctx.trace_type in (TraceType.Pub, TraceType.EndTransaction)
                        else None
                    ),
                    region_id=ctx.region_id,
                    request_id=ctx.request_id,
                    context_code=(
                        ctx.context_code if ctx.trace_type is TraceType.SubAfter else None
                    ),
                    transaction_state=(
                        bean.transaction_state
                        if ctx.trace_type is TraceType.EndTransaction
                        else None
                    ),
                )
            )
    for v in views:
        if v.trace_type in (TraceType.SubBefore.value, TraceType.SubAfter.value):
            v.retry_times = retries.get(v.request_id)
    views.sort(key=lambda v: v.time_stamp)
    return views, bad_total


# -- writing ------------------------------------------------------------------------------------
# Brokers take group names of up to 248 characters (room for `%RETRY%`/`%DLQ%` in a file name).
MAX_TRACE_GROUP_LENGTH = 248


def trace_group_name(group: str, kind: str, n: int) -> str:
    """The trace producer's group, RocketMQ's `_INNER_TRACE_PRODUCER-<group>-<kind>-<n>`, the
    traced group cut so that the name stays a valid group name."""
    tail = f"-{kind}-{n}"
    room = MAX_TRACE_GROUP_LENGTH - len(TRACE_GROUP_PREFIX) - 1 - len(tail)
    return f"{TRACE_GROUP_PREFIX}-{group[:room]}{tail}"


class TraceDispatcher:
    """Batches trace records and sends them to the trace topic (RocketMQ's AsyncTraceDispatcher).

    Args:
        instance: the traced client's running instance; the dispatcher's producer
            (group `_INNER_TRACE_PRODUCER-<group>-<kind>-<n>`) runs on it.
        config: the traced client's options (`trace_topic`, credentials...).
        group: the traced client's group.
        kind: "PRODUCER" or "CONSUMER" (in the producer's group name, as RocketMQ's).
        queue_size: records waiting to be sent; `append` drops (and counts) past it.
        flush_interval_s: a batch goes out this long after its first record at the latest.

    Use as an async context manager: leaving it sends what is queued (bounded by
    `CLOSE_TIMEOUT_S`) and stops its producer.
    """

    def __init__(
        self,
        instance: ClientInstance,
        config: ClientConfig,
        group: str,
        kind: str,
        *,
        queue_size: int | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        max_batch_chars: int = MAX_BATCH_CHARS,
    ) -> None:
        self.topic = config.trace_topic
        self._instance = instance
        self._config = config
        self.group_name = trace_group_name(group, kind, next(_counter))
        self.flush_interval_s = flush_interval_s
        self.max_batch_chars = max_batch_chars
        self._send_ch, self._recv_ch = trio.open_memory_channel[TraceContext](
            queue_size if queue_size is not None else config.trace_queue_size
        )
        self._stack = AsyncExitStack()
        self._producer: Producer | None = None
        self._nursery: trio.Nursery | None = None
        self._closed = True
        self._run_done = trio.Event()
        self._stop_producer = trio.Event()
        # Counters (records, except `sent_messages`).
        self.appended = 0
        self.dropped = 0
        self.sent_records = 0
        self.failed_records = 0
        self.sent_messages = 0

    # -- the traced client's side ------------------------------------------------------
    def append(self, ctx: TraceContext) -> bool:
        """Queue a context; never waits. False (and counted in `dropped`) when the queue is
        full or the dispatcher is not running."""
        if self._closed:
            self.dropped += 1
            return False
        try:
            self._send_ch.send_nowait(ctx)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("trace_queue_full", group=self.group_name, dropped=self.dropped)
            return False
        self.appended += 1
        return True

    # -- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        from client.producer import Producer

        cfg = self._config.model_copy(
            update={
                "enable_trace": False,  # the trace producer is never traced
                "send_timeout_ms": TRACE_SEND_TIMEOUT_MS,
                "max_message_size": TRACE_MAX_MESSAGE_SIZE,
            }
        )
        producer = Producer(self.group_name, cfg, instance=self._instance)
        try:
            nursery = self._nursery = await self._stack.enter_async_context(trio.open_nursery())

            async def host(task_status: trio.TaskStatus[None]) -> None:
                # A producer's nursery must be left by the task that entered it.
                async with producer:
                    task_status.started()
                    await self._stop_producer.wait()

            await nursery.start(host)
            self._producer = producer
            self._closed = False
            nursery.start_soon(self._run)
        except BaseException:
            self._stop_producer.set()
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                await self._send_ch.aclose()
                await self._run_done.wait()
            if scope.cancelled_caught:
                log.warning("trace_flush_timeout", group=self.group_name)
                if self._nursery is not None:
                    self._nursery.cancel_scope.cancel()  # the sends still under way
        self._stop_producer.set()
        # Outside the scopes above: the stack's nursery was opened outside them.
        return await self._stack.__aexit__(exc_type, exc, tb)

    # -- the sending task -----------------------------------------------------------------
    async def _run(self) -> None:
        limiter = trio.Semaphore(MAX_SENDS_IN_FLIGHT)
        try:
            async with trio.open_nursery() as sends:
                batch: list[TraceTransfer] = []
                chars = key_chars = 0
                deadline = float("inf")
                while True:
                    ctx: TraceContext | None = None
                    ended = False
                    # Only the wait is bounded by the batch's deadline: a record taken is
                    # always added (the flush below may wait for a free send slot).
                    with trio.move_on_at(deadline):
                        try:
                            ctx = await self._recv_ch.receive()
                        except trio.EndOfChannel:
                            ended = True
                    if ctx is not None:
                        try:
                            transfer = encode_context(ctx)
                        except Exception as exc:  # a bad record must not stop the writer
                            self.failed_records += 1
                            log.warning("trace_encode_failed", error=repr(exc))
                            continue
                        n_key_chars = sum(len(k) + 1 for k in transfer.keys)
                        if batch and key_chars + n_key_chars > MAX_BATCH_KEY_CHARS:
                            await self._flush(sends, limiter, batch)
                            batch, chars, key_chars = [], 0, 0
                        if not batch:
                            deadline = trio.current_time() + self.flush_interval_s
                        batch.append(transfer)
                        chars += len(transfer.data)
                        key_chars += n_key_chars
                    if batch and (
                        ended or chars >= self.max_batch_chars or trio.current_time() >= deadline
                    ):
                        await self._flush(sends, limiter, batch)
                        batch, chars, key_chars = [], 0, 0
                    if not batch:
                        deadline = float("inf")
                    if ended:
                        break
        finally:
            self._run_done.set()

    async def _flush(
        self, sends: trio.Nursery, limiter: trio.Semaphore, batch: list[TraceTransfer]
    ) -> None:
        """Start sending `batch` as one trace message; waits only while `MAX_SENDS_IN_FLIGHT`
        sends are under way (the queue then fills and `append` drops)."""
        await limiter.acquire()
        sends.start_soon(self._send, limiter, list(batch))

    async def _send(self, limiter: trio.Semaphore, batch: list[TraceTransfer]) -> None:
        from client.message import Message

        try:
            keys: dict[str, None] = {}
            for t in batch:
                keys.update(dict.fromkeys(t.keys))
            body = "".join(t.data for t in batch).encode("utf-8")
            msg = Message(self.topic, body, keys=[k for k in keys if k])
            assert self._producer is not None
            try:
                await self._producer.send(msg, timeout_ms=TRACE_SEND_TIMEOUT_MS)
            except Exception as exc:
                self.failed_records += len(batch)
                log.warning(
                    "trace_send_failed", topic=self.topic, records=len(batch), error=str(exc)
                )
                return
            self.sent_records += len(batch)
            self.sent_messages += 1
        finally:
            limiter.release()

"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

Checks, in RocketMQ's order: header, broker write permission, topic name, producer-forbidden
system topics, topic config (auto-created from the template `c` when allowed), topic write
permission, queue id, body and properties size; then %RETRY% -> %DLQ% routing, MULTI_TAG flag,
CLUSTER property, WAIT stripped from the stored properties, and the put. The response always
carries extFields with MSG_REGION and TRACE_ON, plus msgId/queueId/queueOffset once stored.

`SendProcessor.route_special` then reroutes, in this order: TRAN_MSG=true -> half message
(`broker.transaction`); an exact delivery time (TIMER_DELIVER_MS and friends) -> the timer
topic; DELAY > 0 -> SCHEDULE_TOPIC_XXXX (`broker.schedule`). Batches are never rerouted.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import structlog

from broker.processors._common import guarded_send, split_addr
from broker.schedule import TIMER_PROPERTIES, exact_delivery_ms, strip_timer_properties
from broker.topic_manager import (
    DLQ_GROUP_TOPIC_PREFIX,
    NOT_ALLOWED_SEND_TOPICS,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    is_writeable,
    validate_topic,
)
from broker.transaction import is_transactional, prepare
from common.message import (
    MULTI_TAGS_FLAG,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY,
    PROPERTY_SEPARATOR,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageDecodeError,
    MessageInner,
    decode_batch_body,
    decode_properties,
    encode_properties,
    native_build_batch_messages,
)
from remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import SendMessageRequestHeader
from remoting.protocol.route import TopicConfig
from store.results import PutMessageResult, PutMessageStatus

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()

_STATUS_CODES: dict[PutMessageStatus, tuple[int, str | None]] = {
    PutMessageStatus.PUT_OK: (ResponseCode.SUCCESS, None),
    PutMessageStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, None),
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: (ResponseCode.FLUSH_SLAVE_TIMEOUT, None),
    PutMessageStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, None),
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: (
        ResponseCode.SYSTEM_ERROR,
        "create mapped file failed, server is busy or broken",
    ),
    PutMessageStatus.MESSAGE_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL, "the message is illegal"),
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: (
        ResponseCode.MESSAGE_ILLEGAL,
        "the message properties are too long",
    ),
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (
        ResponseCode.SERVICE_NOT_AVAILABLE,
        # RocketMQ's words; the store's reason follows ("maybe disk full, ..." and the figures,
        # or that the store is stopping).
        "service not available now",
    ),
    PutMessageStatus.OS_PAGECACHE_BUSY: (
        ResponseCode.SYSTEM_ERROR,
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    ),
    PutMessageStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
    PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: (
        ResponseCode.SYSTEM_ERROR,
        "in-sync replicas not enough",
    ),
}

_ATTR_BORN_HOST = "send.born_host"

# A message with none of these properties is never rerouted (`route_special` returns at once).
_SPECIAL_PROPERTIES = frozenset((PROPERTY_TRANSACTION_PREPARED, PROPERTY_DELAY, *TIMER_PROPERTIES))

# Codes after which a Java producer treats the message as stored (it reads the ext fields).
_STORED_CODES = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    }
)


def reuse_properties(raw: str, props: Mapping[str, str], suffix: str) -> str | None:
    """The stored properties string built from the producer's own text: `raw` without its
    WAIT entry, then `suffix` (the encoded entries the broker adds, which `props` must not
    hold), or None when that could differ from `encode_properties` of the merged dict.

    `props` is `decode_properties(raw)`. When it holds one entry per separator-split segment
    of `raw`, every segment was a valid, distinct ``name\x01value``, so re-encoding the dict
    would give `raw` back: the encoding is skipped (docs/design-notes.md, "Send path shortcuts").
    """
    if not raw:
        return suffix
    if len(props) != raw.count(PROPERTY_SEPARATOR) + 1:
        return None  # a malformed or duplicate entry: the dict decides
    wait = props.get(PROPERTY_WAIT)
    if wait is not None:
        # Values hold no separator, so a match bounded by separators is the WAIT entry.
        wrapped = f"{PROPERTY_SEPARATOR}{raw}{PROPERTY_SEPARATOR}"
        entry = (
            f"{PROPERTY_SEPARATOR}{PROPERTY_WAIT}{NAME_VALUE_SEPARATOR}{wait}{PROPERTY_SEPARATOR}"
        )
        at = wrapped.find(entry)
        if at < 0:
            return None
        raw = (wrapped[:at] + wrapped[at + len(entry) - 1 :])[1:-1]
        if not raw:
            return suffix
    return f"{raw}{PROPERTY_SEPARATOR}{suffix}"


_EMPTY_BODY = 1
_PROPERTIES_TOO_LONG = 2


def _py_build_batch_messages(
    items: Sequence[tuple[int, bytes, str]],
    msg_type: type[MessageInner],
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_host: tuple[str, int],
    batch_props: dict[str, str],
    override: set[str] | frozenset[str],
    suffix: str,
    max_props: int,
    reuse: Callable[[str, dict[str, str], str], str | None],
) -> tuple[list[MessageInner], int, int]:
    """`SendProcessor.send_batch`'s per-message loop (reference of the native version).

    Each item's properties are its own decoded text updated with `batch_props`; its stored
    properties string is its own text plus `suffix` when that equals the dict's encoding
    (see `reuse_properties`), else None (the caller encodes the dict).

    Returns:
        ``(messages, error_index, error_kind)``: the loop stops at the first item with an
        empty body (kind `_EMPTY_BODY`, the message not built) or with a stored properties
        string longer than `max_props` bytes (kind `_PROPERTIES_TOO_LONG`, the message is the
        last one returned); ``(messages, -1, 0)`` without error.
    """
    separator = PROPERTY_SEPARATOR
    sep_suffix = separator + suffix
    wait_key = PROPERTY_WAIT
    msgs: list[MessageInner] = []
    add = msgs.append
    for i, (flag, item_body, raw) in enumerate(items):
        if not item_body:
            return msgs, i, _EMPTY_BODY
        stored: str | None
        if raw:
            props = decode_properties(raw)
            if not override.isdisjoint(props):
                stored = None
            elif wait_key not in props and len(props) == raw.count(separator) + 1:
                # `reuse_properties`' common case inline: distinct valid entries, no WAIT.
                stored = raw + sep_suffix
            else:
                stored = reuse(raw, props, suffix)
        else:
            props = {}
            stored = suffix
        props.update(batch_props)
        msg = msg_type(
            topic,
            item_body,
            queue_id=queue_id,
            flag=flag,
            properties=props,
            properties_string=stored,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp,
            born_host=born_host,
            store_host=store_host,
        )
        add(msg)
        if stored is not None:
            size = len(stored) if stored.isascii() else len(stored.encode())
            if size > max_props:
                return msgs, i, _PROPERTIES_TOO_LONG
    return msgs, -1, 0


build_batch_messages: Callable[..., tuple[list[MessageInner], int, int]] = (
    native_build_batch_messages or _py_build_batch_messages
)


def _text_size(text: str) -> int:
    """UTF-8 size of `text` (ASCII, the usual case, without encoding it)."""
    return len(text) if text.isascii() else len(text.encode())


def _born_host(conn: Connection) -> tuple[str, int]:
    """The producer's (ip, port), parsed once per connection."""
    host = conn.attributes.get(_ATTR_BORN_HOST)
    if host is None:
        host = conn.attributes[_ATTR_BORN_HOST] = split_addr(conn.remote_address)
    return cast("tuple[str, int]", host)


class SendProcessor:
    """Handlers for the send codes."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl
        # Read on every send: set at start, changed by the broker on a role switch
        # (controller mode).
        self.is_slave = ctrl.config.is_slave

    def region_fields(self) -> dict[str, str]:
        """extFields of every send response (Java producers read them without a null check)."""
        cfg = self.ctrl.config
        return {"MSG_REGION": cfg.region_id, "TRACE_ON": "true" if cfg.trace_on else "false"}

    def _response(
        self, cmd: RemotingCommand, code: int, remark: str | None = None
    ) -> RemotingCommand:
        return cmd.make_response(code, remark, ext_fields=self.region_fields())

    # -- checks shared by single and batch sends ---------------------------------------------
    def _check(
        self, cmd: RemotingCommand, hdr: SendMessageRequestHeader
    ) -> tuple[TopicConfig | None, RemotingCommand | None]:
        """Validate and resolve the topic. Returns (config, None) or (None, error response)."""
        ctrl = self.ctrl
        if not is_writeable(ctrl.config.broker_permission):
            return None, self._response(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"the broker[{ctrl.addr}] sending message is forbidden",
            )
        reason = validate_topic(hdr.topic)
        if reason is not None:
            return None, self._response(cmd, ResponseCode.SYSTEM_ERROR, reason)
        if hdr.topic in NOT_ALLOWED_SEND_TOPICS:
            return None, self._response(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"sending message to topic[{hdr.topic}] is forbidden",
            )
        topic_cfg = ctrl.topics.get(hdr.topic)
        if topic_cfg is None:
            if hdr.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                group = ctrl.subscriptions.find_or_create(
                    hdr.topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
                )
                if group is not None:
                    topic_cfg = ctrl.topics.create_in_send_back(hdr.topic, group.retry_queue_nums)
            else:
                topic_cfg = ctrl.topics.create_in_send(
                    hdr.topic, hdr.default_topic, hdr.default_topic_queue_nums
                )
            if topic_cfg is not None:
                ctrl.on_topics_changed()
        if topic_cfg is None:
            return None, self._response(
                cmd,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{hdr.topic}] not exist, apply first please!",
            )
        if not is_writeable(topic_cfg.perm):
            return None, self._response(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"the topic[{hdr.topic}] sending message is forbidden",
            )
        if hdr.queue_id >= max(topic_cfg.read_queue_nums, topic_cfg.write_queue_nums):
            return None, self._response(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{hdr.queue_id}] is illegal, topic {hdr.topic} has "
                f"{topic_cfg.write_queue_nums} write queues",
            )
        return topic_cfg, None

    def _pick_queue(self, hdr: SendMessageRequestHeader, topic_cfg: TopicConfig) -> int:
        if hdr.queue_id < 0:
            return random.randrange(max(1, topic_cfg.write_queue_nums))
        return hdr.queue_id

    def _properties(self, raw: str | None) -> dict[str, str]:
        props = decode_properties(raw) if raw else {}
        props[PROPERTY_CLUSTER] = self.ctrl.config.broker_cluster_name
        return props

    @staticmethod
    def _finish(msg: MessageInner) -> int:
        """Encode the stored properties string; returns its size in bytes.

        WAIT stays in `msg.properties` (the store reads it to decide whether a SYNC_FLUSH put
        waits) but, as in RocketMQ 4.9.3+, is not stored.
        """
        props = msg.properties
        if PROPERTY_WAIT in props:
            props = {k: v for k, v in props.items() if k != PROPERTY_WAIT}
        msg.properties_string = encode_properties(props)
        return len(msg.properties_string.encode())

    finish = _finish

    def _retry_or_dlq(
        self, cmd: RemotingCommand, hdr: SendMessageRequestHeader, msg: MessageInner
    ) -> RemotingCommand | None:
        """A %RETRY% message consumed too often goes to %DLQ%<group> queue 0."""
        if not msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        group_name = msg.topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        group = self.ctrl.subscriptions.find_or_create(group_name)
        if group is None:
            return self._response(
                cmd,
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group_name}",
            )
        max_times = group.retry_max_times
        if hdr.max_reconsume_times is not None and hdr.max_reconsume_times >= 0:
            max_times = hdr.max_reconsume_times
        if (hdr.reconsume_times or 0) >= max_times:
            dlq = DLQ_GROUP_TOPIC_PREFIX + group_name
            if self.ctrl.topics.get(dlq) is None:
                # Write-only, as RocketMQ's DLQs (perm 6 via updateTopic to read them).
                self.ctrl.topics.create_in_send_back(dlq, 1, PERM_WRITE)
                self.ctrl.on_topics_changed()
            msg.topic = dlq
            msg.queue_id = 0
        return None

    def route_special(self, msg: MessageInner) -> str | None:
        """Reroute a transactional, timed or delayed message (in place).

        Returns:
            None, or why the message is illegal (answered MESSAGE_ILLEGAL).
        """
        props = msg.properties
        if _SPECIAL_PROPERTIES.isdisjoint(props):
            return None  # the common case, a plain message: one set test, no property lookups
        tran_type = msg.sys_flag & TRANSACTION_TYPE_MASK
        if is_transactional(props):
            prepare(msg)
            return None
        if tran_type == TRANSACTION_ROLLBACK_TYPE:
            return None
        schedule = self.ctrl.schedule
        now = schedule.now_ms()
        try:
            deliver_ms = exact_delivery_ms(props, now)
        except ValueError:
            return "the delivery time property is not an integer"
        if deliver_ms is not None:
            ahead = deliver_ms - now
            limit = self.ctrl.config.max_delay_timestamp_ahead_ms
            if ahead > limit:
                return f"the delivery time is {ahead} ms ahead, more than the {limit} ms allowed"
            if ahead > 0:
                schedule.route_timer(msg, deliver_ms)
                return None
            strip_timer_properties(props)  # due already: deliver now
            msg.properties_string = None
        schedule.route_delay(msg)
        return None

    # -- processors -----------------------------------------------------------------------
    # Both are inline processors (registered with `inline=True`): everything up to and
    # including the append runs in the connection's reader, and the answer is ready at once,
    # except when the put must wait for the group commit: the commit ticket answers it then.
    @guarded_send
    async def send_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """SEND_MESSAGE (10) and SEND_MESSAGE_V2 (310); 320 goes to `send_batch`."""
        if cmd.code == RequestCode.SEND_BATCH_MESSAGE:
            return self._send_batch(conn, cmd)
        hdr = SendMessageRequestHeader.from_command(cmd)
        if hdr.batch:
            return self._send_batch(conn, cmd)
        ctrl = self.ctrl
        topic_cfg, err = self._check(cmd, hdr)
        if err is not None:
            return err
        assert topic_cfg is not None
        body = cmd.body_bytes()
        if not body:
            return self._response(cmd, ResponseCode.MESSAGE_ILLEGAL, "the message body is empty")
        if len(body) > ctrl.config.max_message_size:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {len(body)} exceeds the limit "
                f"{ctrl.config.max_message_size}",
            )
        if hdr.properties and len(hdr.properties.encode()) > ctrl.config.max_properties_size:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message properties exceed {ctrl.config.max_properties_size} bytes",
            )
        raw = hdr.properties
        props = decode_properties(raw) if raw else {}
        cluster = ctrl.config.broker_cluster_name
        stored = (
            None
            if PROPERTY_CLUSTER in props
            else reuse_properties(
                raw or "", props, f"{PROPERTY_CLUSTER}{NAME_VALUE_SEPARATOR}{cluster}"
            )
        )
        props[PROPERTY_CLUSTER] = cluster
        sys_flag = hdr.sys_flag
        if topic_cfg.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        msg = MessageInner(
            hdr.topic,
            body,
            queue_id=self._pick_queue(hdr, topic_cfg),
            flag=hdr.flag,
            properties=props,
            sys_flag=sys_flag,
            born_timestamp=hdr.born_timestamp,
            born_host=_born_host(conn),
            store_host=ctrl.store_host,
            reconsume_times=hdr.reconsume_times or 0,
        )
        err = self._retry_or_dlq(cmd, hdr, msg)
        if err is not None:
            return err
        if stored is not None and _SPECIAL_PROPERTIES.isdisjoint(props):
            # A plain message (never rerouted): the producer's text plus CLUSTER.
            msg.properties_string = stored
            size = _text_size(stored)
        else:
            reason = self.route_special(msg)
            if reason is not None:
                return self._response(cmd, ResponseCode.MESSAGE_ILLEGAL, reason)
            size = self._finish(msg)
        if size > ctrl.config.max_properties_size:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message properties exceed {ctrl.config.max_properties_size} bytes",
            )
        return self._put(conn, cmd, (msg,), msg.queue_id)

    @guarded_send
    async def send_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """SEND_BATCH_MESSAGE (320): many messages of one topic and queue, one put."""
        return self._send_batch(conn, cmd)

    def _send_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        hdr = SendMessageRequestHeader.from_command(cmd)
        ctrl = self.ctrl
        if hdr.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return self._response(
                cmd, ResponseCode.MESSAGE_ILLEGAL, "batch messages do not support retry topics"
            )
        topic_cfg, err = self._check(cmd, hdr)
        if err is not None:
            return err
        assert topic_cfg is not None
        body = cmd.body_bytes()
        if not body:
            return self._response(cmd, ResponseCode.MESSAGE_ILLEGAL, "the batch body is empty")
        if len(body) > ctrl.config.max_message_size:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the batch body size {len(body)} exceeds the limit {ctrl.config.max_message_size}",
            )
        try:
            items = decode_batch_body(body)
        except MessageDecodeError as exc:
            return self._response(cmd, ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}")
        if not items:
            return self._response(cmd, ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
        batch_props = self._properties(hdr.properties)
        # What the broker adds to each message's own properties, encoded once. The batch's
        # WAIT is never stored, so only the other batch keys (CLUSTER, the header's own) keep
        # a message's text from being reused: a message's own WAIT (Java producers send
        # WAIT=true in each) is cut out of its text by `reuse_properties`.
        override = batch_props.keys() - {PROPERTY_WAIT}
        suffix = encode_properties({k: v for k, v in batch_props.items() if k != PROPERTY_WAIT})
        queue_id = self._pick_queue(hdr, topic_cfg)
        sys_flag = hdr.sys_flag
        if topic_cfg.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        max_props = ctrl.config.max_properties_size
        msgs, err_index, err_kind = build_batch_messages(
            items,
            MessageInner,
            hdr.topic,
            queue_id,
            sys_flag,
            hdr.born_timestamp,
            _born_host(conn),
            ctrl.store_host,
            batch_props,
            override,
            suffix,
            max_props,
            reuse_properties,
        )
        # Messages whose stored properties come from their dict are encoded here, in order,
        # before the error the loop stopped at (the first error wins, as one loop would).
        for i, msg in enumerate(msgs):
            if msg.properties_string is None and self._finish(msg) > max_props:
                return self._response(
                    cmd,
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"batch message {i}: properties exceed {max_props} bytes",
                )
        if err_kind == _EMPTY_BODY:
            return self._response(
                cmd, ResponseCode.MESSAGE_ILLEGAL, f"batch message {err_index} has an empty body"
            )
        if err_kind == _PROPERTIES_TOO_LONG:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch message {err_index}: properties exceed {max_props} bytes",
            )
        return self._put(conn, cmd, msgs, queue_id)

    def _put(
        self, conn: Connection, cmd: RemotingCommand, msgs: Sequence[MessageInner], queue_id: int
    ) -> RemotingCommand | None:
        """Append `msgs`: the answer now, or None when the commit ticket answers it later."""
        if self.is_slave:
            return self._response(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, self._slave_remark())
        ticket = self.ctrl.commits.append(msgs)
        topic = msgs[0].topic
        if ticket.settled:
            return self._put_response(cmd, ticket.result, queue_id, topic)
        ticket.reply(
            conn.defer(cmd),
            lambda final: self._durable_response(conn, cmd, final, queue_id, topic),
        )
        return None

    def _slave_remark(self) -> str:
        """RocketMQ's answer to a send on a slave (with the disk use it reports)."""
        used = f"{self.ctrl.store.disk.ratio:.2f}"
        return (
            "service not available now. It may be caused by one of the following reasons: "
            f"the broker's disk is full [{used}], messages are put to the slave, message store "
            "has been shut down, etc."
        )

    def _durable_response(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        final: PutMessageResult,
        queue_id: int,
        topic: str,
    ) -> RemotingCommand:
        """The answer to a send that waited for the group commit, from its final result; a
        SYSTEM_ERROR answer if building it fails (the request must still get one)."""
        try:
            return self._put_response(cmd, final, queue_id, topic)
        except Exception as exc:
            log.exception("send_response_failed", peer=conn.remote_address)
            return self._response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    def _put_response(
        self, cmd: RemotingCommand, result: PutMessageResult, queue_id: int, topic: str
    ) -> RemotingCommand:
        """The answer to a put of `topic`'s records; a stored put is counted (stats and, with
        metrics on, `broker.metrics.Traffic`; always `broker.stats`: one call each per put, a
        batch's records together)."""
        append = result.append
        if result.status is PutMessageStatus.PUT_OK and append is not None:
            # The common case in one dict literal (no status table lookup: an Enum member's
            # hash is a Python-level call).
            cfg = self.ctrl.config
            self.ctrl.stats.put_count += append.msg_num
            self.ctrl.table_stats.count_put(topic, append.msg_num, append.wrote_bytes)
            traffic = self.ctrl.traffic
            if traffic is not None:
                traffic.count_in(topic, append.msg_num, append.wrote_bytes)
            return cmd.make_response(
                ResponseCode.SUCCESS,
                None,
                ext_fields={
                    "MSG_REGION": cfg.region_id,
                    "TRACE_ON": "true" if cfg.trace_on else "false",
                    "msgId": ",".join(append.msg_ids),
                    "queueId": str(queue_id),
                    "queueOffset": str(append.queue_offset),
                },
            )
        code, remark = _STATUS_CODES.get(result.status, (ResponseCode.SYSTEM_ERROR, None))
        if code not in _STORED_CODES or append is None:
            text = remark or result.status.name
            if result.remark:
                sep = ", " if code == ResponseCode.SERVICE_NOT_AVAILABLE else ": "
                text = f"{text}{sep}{result.remark}"
            return self._response(cmd, code, text)
        resp = self._response(
            cmd, code, None if code == ResponseCode.SUCCESS else result.status.name
        )
        assert resp.ext_fields is not None
        resp.ext_fields["msgId"] = ",".join(append.msg_ids)
        resp.ext_fields["queueId"] = str(queue_id)
        resp.ext_fields["queueOffset"] = str(append.queue_offset)
        self.ctrl.stats.put_count += append.msg_num
        self.ctrl.table_stats.count_put(topic, append.msg_num, append.wrote_bytes)
        traffic = self.ctrl.traffic
        if traffic is not None:
            traffic.count_in(topic, append.msg_num, append.wrote_bytes)
        return resp

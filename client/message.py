"""Messages as users build them, and as consumers receive them.

Plain slotted classes: these are created once per message on the hot path, so
no pydantic here. Property names and validation rules are RocketMQ 4.x's.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from client.errors import MessageValidationError
from common.message import (
    KEY_SEPARATOR,
    MAX_PROPERTIES_SIZE,
    PROPERTY_CONSUME_START_TIMESTAMP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_MIN_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    decode_properties,
    decode_records,
    decode_records_into,
    offset_msg_id,
    unpack_ip,
)
from common.message import MessageExt as StoreMessageExt
from common.message_queue import MessageQueue as MessageQueue
from common.schedule import SCHEDULE_TOPIC

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"

# Properties the system sets; user properties may not use these names.
SYSTEM_PROPERTIES = frozenset(
    {
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        PROPERTY_WAIT_STORE_MSG_OK,
        PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
        PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_CONSUME_START_TIMESTAMP,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_PRODUCER_GROUP,
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "MSG_REGION",
        "TRACE_ON",
        "CLUSTER",
        "BUYER_ID",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "MSG_TYPE",
    }
)

DEFAULT_TOPIC = "TBW102"
TOPIC_MAX_LENGTH = 127
MAX_DELAY_LEVEL = 18
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# Topics producers may not send to (the broker answers NO_PERMISSION).
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"


def check_topic(topic: str) -> None:
    """Validate a topic name as RocketMQ's `Validators.checkTopic` does.

    Raises:
        MessageValidationError: the name is empty, too long, has characters
            outside `[%|a-zA-Z0-9_-]`, or is the auto-create template.
    """
    if not topic or not topic.strip():
        raise MessageValidationError("The specified topic is blank")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise MessageValidationError(
            f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH}"
        )
    if not _TOPIC_RE.match(topic):
        raise MessageValidationError(
            f"The specified topic[{topic}] contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    if topic == DEFAULT_TOPIC:
        raise MessageValidationError(
            f"The topic[{topic}] is conflict with AUTO_CREATE_TOPIC_KEY_TOPIC"
        )


def check_group(group: str) -> None:
    """Validate a producer or consumer group name (same character rules as topics)."""
    if not group or not group.strip():
        raise MessageValidationError("The specified group is blank")
    if len(group) > 255:
        raise MessageValidationError("The specified group is longer than group max length 255")
    if not _TOPIC_RE.match(group):
        raise MessageValidationError(
            f"The specified group[{group}] contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )


class Message:
    """A message to send.

    Args:
        topic: the topic.
        body: the payload (bytes; a str is encoded as UTF-8).
        tags: one tag used for broker-side filtering.
        keys: one key or several (space-separated on the wire), indexed by the broker.
        flag: an application integer stored with the message.
        delay_time_level: 1..18 for RocketMQ's delay levels (0 = none).
        properties: user properties (names may not be system properties).
        wait_store_msg_ok: ask the broker to answer only once stored (WAIT).
    """

    __slots__ = ("body", "flag", "properties", "topic")

    def __init__(
        self,
        topic: str,
        body: bytes | bytearray | memoryview | str = b"",
        *,
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        flag: int = 0,
        delay_time_level: int = 0,
        properties: Mapping[str, str] | None = None,
        wait_store_msg_ok: bool = True,
    ) -> None:
        self.topic = topic
        if type(body) is not bytes:
            body = body.encode() if isinstance(body, str) else bytes(body)
        self.body = body
        self.flag = flag
        self.properties: dict[str, str] = {}
        if properties:
            for k, v in properties.items():
                self.put_user_property(k, v)
        if tags:
            self.properties[PROPERTY_TAGS] = tags
        if keys:
            self.keys = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        if delay_time_level:
            self.delay_time_level = delay_time_level
        if not wait_store_msg_ok:
            self.properties[PROPERTY_WAIT_STORE_MSG_OK] = "false"

    # -- properties -----------------------------------------------------
    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @tags.setter
    def tags(self, value: str | None) -> None:
        if value:
            self.properties[PROPERTY_TAGS] = value
        else:
            self.properties.pop(PROPERTY_TAGS, None)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @keys.setter
    def keys(self, value: str | Iterable[str] | None) -> None:
        if value is None:
            self.properties.pop(PROPERTY_KEYS, None)
            return
        joined = value if isinstance(value, str) else KEY_SEPARATOR.join(value)
        if joined:
            self.properties[PROPERTY_KEYS] = joined
        else:
            self.properties.pop(PROPERTY_KEYS, None)

    @property
    def key_list(self) -> list[str]:
        keys = self.keys
        return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []

    @property
    def delay_time_level(self) -> int:
        v = self.properties.get(PROPERTY_DELAY_TIME_LEVEL)
        return int(v) if v else 0

    @delay_time_level.setter
    def delay_time_level(self, level: int) -> None:
        if level:
            self.properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        else:
            self.properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)

    @property
    def wait_store_msg_ok(self) -> bool:
        return self.properties.get(PROPERTY_WAIT_STORE_MSG_OK, "true") != "false"

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    def put_user_property(self, name: str, value: str) -> None:
        """Set a user property.

        Raises:
            MessageValidationError: the name is empty or reserved by the system.
        """
        if not name or value is None:
            raise MessageValidationError("The name or value of property can not be null or blank")
        if name in SYSTEM_PROPERTIES:
            raise MessageValidationError(
                f"The Property<{name}> is used by system, input another please"
            )
        self.properties[name] = str(value)

    def get_property(self, name: str) -> str | None:
        return self.properties.get(name)

    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTIES}

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, tags={self.tags!r}, keys={self.keys!r}, "
            f"flag={self.flag}, body={len(self.body)}B)"
        )


def validate_message(msg: Message, max_message_size: int) -> None:
    """Check a message before any network call (RocketMQ's `Validators.checkMessage`).

    Raises:
        MessageValidationError: bad topic, empty body, body over the limit,
            system topic, or delay level out of range.
    """
    check_topic(msg.topic)
    if msg.topic in NOT_ALLOWED_SEND_TOPICS:
        raise MessageValidationError(f"Sending message to topic[{msg.topic}] is forbidden.")
    if not msg.body:
        raise MessageValidationError("the message body length is zero")
    if len(msg.body) > max_message_size:
        raise MessageValidationError(
            f"the message body size over max value, MAX: {max_message_size}"
        )
    level = msg.properties.get(PROPERTY_DELAY_TIME_LEVEL)
    if level is not None:
        try:
            lv = int(level)
        except ValueError:
            raise MessageValidationError(f"bad delay level {level!r}") from None
        if lv < 0 or lv > MAX_DELAY_LEVEL:
            raise MessageValidationError(f"delay level {lv} out of range 0..{MAX_DELAY_LEVEL}")


class MessageExt(Message):
    """A message as a consumer receives it (RocketMQ's `MessageExt`).

    `msg_id` is the producer's unique id (UNIQ_KEY) when present, else the
    offset id; `offset_msg_id` is the broker's store-address-plus-offset id.
    The body is already decompressed.

    Messages decoded from a pull body (`decode_pull_body`) parse their properties, the
    host strings and the offset id only when first read: a consumer that looks at the body
    alone never pays for them.
    """

    __slots__ = (
        "_born_host",
        "_born_ip",
        "_born_port",
        "_offset_msg_id",
        "_pending",
        "_props",
        "_props_raw",
        "_store_host",
        "_store_ip",
        "_store_port",
        "born_timestamp",
        "broker_name",
        "commit_log_offset",
        "prepared_transaction_offset",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "store_size",
        "store_timestamp",
        "sys_flag",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        *,
        properties: dict[str, str],
        flag: int = 0,
        queue_id: int = 0,
        queue_offset: int = 0,
        commit_log_offset: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: str = "",
        store_timestamp: int = 0,
        store_host: str = "",
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        store_size: int = 0,
        offset_msg_id: str = "",
        broker_name: str = "",
    ) -> None:
        # Built from decoded records: skip Message.__init__'s validation work.
        self.topic = topic
        self.body = body
        self.flag = flag
        self._props: dict[str, str] | None = properties
        self._props_raw = b""
        self._pending: tuple[tuple[str, str], ...] | None = None
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self._born_host: str | None = born_host
        self._born_ip = b""
        self._born_port = 0
        self.store_timestamp = store_timestamp
        self._store_host: str | None = store_host
        self._store_ip = b""
        self._store_port = 0
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.store_size = store_size
        self._offset_msg_id: str | None = offset_msg_id
        self.broker_name = broker_name

    @classmethod
    def from_store(cls, ext: StoreMessageExt, broker_name: str = "") -> MessageExt:
        """The consumer view of a decoded record (body inflated if compressed).

        Raises:
            common.message.MessageDecodeError: corrupt or unsupported compressed body.
        """
        born_ip, born_port = ext.born_host
        store_ip, store_port = ext.store_host
        return cls(
            ext.topic,
            ext.decompressed_body() or b"",
            properties=ext.properties,
            flag=ext.flag,
            queue_id=ext.queue_id,
            queue_offset=ext.queue_offset,
            commit_log_offset=ext.commit_log_offset,
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=f"{born_ip}:{born_port}",
            store_timestamp=ext.store_timestamp,
            store_host=f"{store_ip}:{store_port}",
            reconsume_times=ext.reconsume_times,
            prepared_transaction_offset=ext.prepared_transaction_offset,
            store_size=ext.store_size,
            offset_msg_id=ext.msg_id,
            broker_name=broker_name,
        )

    # -- lazily decoded fields --------------------------------------------------
    @property
    def properties(self) -> dict[str, str]:
        """The properties (parsed on first access; changes to the dict are kept)."""
        p = self._props
        if p is None:
            p = self._props = decode_properties(self._props_raw.decode("utf-8"))
            pending = self._pending
            if pending is not None:
                p.update(pending)
                self._pending = None
        return p

    @properties.setter
    def properties(self, value: dict[str, str]) -> None:
        self._props = value
        self._pending = None

    @property
    def born_host(self) -> str:
        """``ip:port`` of the producer."""
        h = self._born_host
        if h is None:
            h = self._born_host = f"{unpack_ip(self._born_ip)}:{self._born_port}"
        return h

    @born_host.setter
    def born_host(self, value: str) -> None:
        self._born_host = value

    @property
    def store_host(self) -> str:
        """``ip:port`` of the broker that stored the message."""
        h = self._store_host
        if h is None:
            h = self._store_host = f"{unpack_ip(self._store_ip)}:{self._store_port}"
        return h

    @store_host.setter
    def store_host(self, value: str) -> None:
        self._store_host = value

    @property
    def offset_msg_id(self) -> str:
        """The broker's id: store IP + port + commitlog offset, uppercase hex."""
        m = self._offset_msg_id
        if m is None:
            m = self._offset_msg_id = offset_msg_id(
                self._store_ip, self._store_port, self.commit_log_offset
            )
        return m

    @offset_msg_id.setter
    def offset_msg_id(self, value: str) -> None:
        self._offset_msg_id = value

    @property
    def msg_id(self) -> str:
        return self.uniq_key or self.offset_msg_id

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, msg_id={self.msg_id!r}, tags={self.tags!r}, "
            f"body={len(self.body)}B)"
        )


def put_properties_lazily(msgs: Iterable[MessageExt], items: tuple[tuple[str, str], ...]) -> None:
    """Set the same properties on every message without forcing their parse.

    Messages whose properties are still raw keep `items` aside (one tuple shared by the
    messages of a batch) and apply them when the properties are first read, so the consumer
    can stamp MIN_OFFSET / MAX_OFFSET / CONSUME_START_TIME on every message for a few
    tens of nanoseconds each.
    """
    prev: tuple[tuple[str, str], ...] | None = None
    merged = items
    for m in msgs:
        p = m._props
        if p is not None:
            p.update(items)
            continue
        pending = m._pending
        if pending is None:
            m._pending = items
        else:
            if pending is not prev:
                prev = pending
                merged = pending + items
            m._pending = merged


def decode_pull_body(
    body: bytes | bytearray | memoryview, broker_name: str = ""
) -> list[MessageExt]:
    """The records of a pull/query/view body as consumer messages.

    Same result as ``[MessageExt.from_store(e, broker_name) for e in decode_records(body)]``
    (bodies inflated, same checks, same errors); natively, each record becomes a `MessageExt`
    directly (no intermediate store object; properties, hosts and the offset id decoded only
    when read).

    Raises:
        common.message.MessageDecodeError: malformed records or a bad compressed body.
    """
    if type(body) is not bytes:
        body = bytes(body)
    # The common case natively (None: no accelerators, IPv6 hosts, compressed bodies,
    # anything odd); otherwise the reference decoder, which also raises the exact errors.
    msgs = decode_records_into(body, MessageExt, broker_name)
    if msgs is not None:
        return msgs
    return [MessageExt.from_store(e, broker_name) for e in decode_records(body)]


# --- batches (Producer.send_batch) ---------------------------------------------------------------
_BATCH_ITEM_HEAD = struct.Struct(">iiiii")  # total, magic (0), body crc (0), flag, body length
_PROPS_LEN = struct.Struct(">h")
_join_props = "\x02".join
_join_name_value = "\x01".join


def encode_batch_chunks(
    msgs: Sequence[Message], new_keys: Iterator[str], limit: int
) -> list[tuple[bytes, str]] | None:
    """Encode a checked batch as SEND_BATCH_MESSAGE bodies, split at `limit` bytes.

    Sets each message's UNIQ_KEY (the next of `new_keys` when it has none) and returns
    ``(body, comma-joined UNIQ_KEYs)`` per chunk: the bytes `encode_batch_body` gives for
    `Producer.split_batch`'s chunks, in one pass (properties encoded once, no BatchItem).

    Returns None when the batch needs the reference path: a message over `limit`, properties
    over 32767 bytes, or a property that is not a str (None values are skipped there).
    """
    chunks: list[tuple[bytes, str]] = []
    parts: list[bytes] = []
    ids: list[str] = []
    size = 0
    uniq_name = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
    pack_head = _BATCH_ITEM_HEAD.pack
    pack_len = _PROPS_LEN.pack
    join_props, join_nv = _join_props, _join_name_value
    add, add_id = parts.extend, ids.append
    for m in msgs:
        props = m.properties
        uniq = props.get(uniq_name)
        if not uniq:
            uniq = props[uniq_name] = next(new_keys)
        try:
            encoded = join_props(map(join_nv, props.items())).encode()
        except TypeError:  # a non-str name or value (maybe None): the reference path decides
            return None
        body = m.body
        body_len = len(body)
        props_len = len(encoded)
        total = 22 + body_len + props_len
        if total > limit or props_len > MAX_PROPERTIES_SIZE:
            return None
        if size + total > limit and parts:
            chunks.append((b"".join(parts), ",".join(ids)))
            parts, ids, size = [], [], 0
            add, add_id = parts.extend, ids.append
        add((pack_head(total, 0, 0, m.flag, body_len), body, pack_len(props_len), encoded))
        add_id(uniq)
        size += total
    if parts:
        chunks.append((b"".join(parts), ",".join(ids)))
    return chunks


class SendStatus(Enum):
    """How the broker stored a sent message."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True, frozen=True)
class SendResult:
    """The outcome of a send.

    Attributes:
        status: the store status.
        msg_id: the client's unique id (UNIQ_KEY; comma-joined for a batch).
        offset_msg_id: the broker's offset id(s).
        message_queue: the queue the message went to.
        queue_offset: the message's (the batch's first) offset in the queue.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None


# SendResult's slot setters: a frozen dataclass's __init__ calls object.__setattr__ once per
# field; setting the slots through their descriptors gives the same object for less. One
# SendResult per send (docs/design-notes.md, "Send path shortcuts").
_SR_FIELDS = (
    "status",
    "msg_id",
    "offset_msg_id",
    "message_queue",
    "queue_offset",
    "transaction_id",
)
if tuple(SendResult.__dataclass_fields__) != _SR_FIELDS:  # pragma: no cover
    raise AssertionError("new_send_result must set every SendResult field")
_SR_SETTERS = tuple(SendResult.__dict__[f].__set__ for f in _SR_FIELDS)


def new_send_result(
    status: SendStatus,
    msg_id: str,
    offset_msg_id: str,
    message_queue: MessageQueue,
    queue_offset: int,
    transaction_id: str | None,
    _new: Callable[[type[SendResult]], SendResult] = object.__new__,
    _set: tuple[Callable[[SendResult, object], None], ...] = _SR_SETTERS,
) -> SendResult:
    """`SendResult(status, msg_id, ...)` (equal to it, same fields), built faster."""
    result = _new(SendResult)
    _set[0](result, status)
    _set[1](result, msg_id)
    _set[2](result, offset_msg_id)
    _set[3](result, message_queue)
    _set[4](result, queue_offset)
    _set[5](result, transaction_id)
    return result

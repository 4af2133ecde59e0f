"""RocketMQ 4.x message record codec (commitlog record = pull / view / query body).

Pure, importing only the stdlib and `common`: the broker's store and the client library both import
this module.

Record layout (V1, big-endian; positions for IPv4 hosts)::

    0  TOTALSIZE int32          48 BORNHOST 4+4 (16+4 if sys flag 0x10)
    4  MAGICCODE int32          56 STORETIMESTAMP int64
    8  BODYCRC int32            64 STOREHOST 4+4 (16+4 if sys flag 0x20)
    12 QUEUEID int32            72 RECONSUMETIMES int32
    16 FLAG int32               76 PREPAREDTRANSACTIONOFFSET int64
    20 QUEUEOFFSET int64        84 BODY int32 length + bytes
    28 PHYSICALOFFSET int64        TOPIC int8 length + bytes (<= 127)
    36 SYSFLAG int32               PROPERTIES int16 length + UTF-8 (<= 32767)
    40 BORNTIMESTAMP int64

A record with two IPv4 hosts is ``91 + len(body) + len(topic) + len(properties)`` bytes. The end
of a commitlog file is padded with a blank record ``[int32 remaining][int32 BLANK_MAGIC_CODE]``.
"""

from __future__ import annotations

import enum
import functools
import os
import random
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar

import common.hashing

__all__ = [
    "BLANK_MAGIC_CODE",
    "BLANK_RECORD_SIZE",
    "BODY_CRC_POS",
    "BORNHOST_V6_FLAG",
    "BORN_HOST_POS",
    "BORN_TIMESTAMP_POS",
    "COMPRESSED_FLAG",
    "COMPRESSION_LZ4",
    "COMPRESSION_TYPE_MASK",
    "COMPRESSION_ZLIB",
    "COMPRESSION_ZSTD",
    "DEFAULT_MAX_RECORD_SIZE",
    "FLAG_POS",
    "INNER_BATCH_FLAG",
    "KEY_SEPARATOR",
    "MAGIC_CODE_POS",
    "MAX_PROPERTIES_SIZE",
    "MAX_TOPIC_SIZE",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "MIN_RECORD_SIZE",
    "MULTI_TAGS_FLAG",
    "NAME_VALUE_SEPARATOR",
    "NATIVE",
    "NEED_UNWRAP_FLAG",
    "PHYSICAL_OFFSET_POS",
    "PROPERTY_BUYER_ID",
    "PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS",
    "PROPERTY_CLUSTER",
    "PROPERTY_CONSUME_START_TIMESTAMP",
    "PROPERTY_CORRECTION_FLAG",
    "PROPERTY_CORRELATION_ID",
    "PROPERTY_DELAY",
    "PROPERTY_DELAY_TIME_LEVEL",
    "PROPERTY_INNER_MULTI_DISPATCH",
    "PROPERTY_INNER_MULTI_QUEUE_OFFSET",
    "PROPERTY_INSTANCE_ID",
    "PROPERTY_KEYS",
    "PROPERTY_MAX_OFFSET",
    "PROPERTY_MAX_RECONSUME_TIMES",
    "PROPERTY_MESSAGE_REPLY_TO_CLIENT",
    "PROPERTY_MESSAGE_TTL",
    "PROPERTY_MESSAGE_TYPE",
    "PROPERTY_MIN_OFFSET",
    "PROPERTY_MQ2_FLAG",
    "PROPERTY_MSG_REGION",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_PUSH_REPLY_TIME",
    "PROPERTY_REAL_QID",
    "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_REPLY_MESSAGE_ARRIVE_TIME",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_SEPARATOR",
    "PROPERTY_START_DELIVER_TIME",
    "PROPERTY_TAGS",
    "PROPERTY_TRACE_SWITCH",
    "PROPERTY_TRANSACTION_CHECK_TIMES",
    "PROPERTY_TRANSACTION_PREPARED",
    "PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET",
    "PROPERTY_TRANSFER_FLAG",
    "PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX",
    "PROPERTY_UNIQ_KEY",
    "PROPERTY_WAIT",
    "PROPERTY_WAIT_STORE_MSG_OK",
    "QUEUE_ID_POS",
    "QUEUE_OFFSET_POS",
    "RECORD_FIXED_STRUCTS",
    "STOREHOSTADDRESS_V6_FLAG",
    "STORE_TIMESTAMP_POS_V4",
    "STORE_TIMESTAMP_POS_V6",
    "SYSFLAG_POS",
    "TOTAL_SIZE_POS",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "TRANSACTION_TYPE_MASK",
    "BatchItem",
    "Buffer",
    "DispatchRequest",
    "DispatchStatus",
    "EncodedRecords",
    "MessageDecodeError",
    "MessageEncodeError",
    "MessageExt",
    "MessageInner",
    "PropertiesSizeExceededError",
    "RecordColumns",
    "UniqKeyGenerator",
    "body_crc",
    "check_record",
    "create_offset_msg_id",
    "decode_batch_body",
    "decode_offset_msg_id",
    "decode_properties",
    "decode_record",
    "decode_records",
    "decode_records_columns",
    "decode_uniq_key",
    "decompress_record_body",
    "encode_batch_body",
    "encode_blank",
    "encode_properties",
    "encode_record",
    "encode_record_template",
    "encode_records",
    "iter_records",
    "java_string_hash",
    "month_start_ms",
    "native_build_batch_messages",
    "native_scan_records",
    "patch_record",
    "patch_records",
    "store_timestamp_pos",
    "tags_code",
]

# --- magic codes --------------------------------------------------------------------------
MESSAGE_MAGIC_CODE = 0xDAA320A7
"""V1 record magic (Java int -626843481); the only one trimq writes."""
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
"""5.x record magic (2-byte topic length); decoded by `decode_record`, never written."""
BLANK_MAGIC_CODE = 0xCBD43194
"""End-of-file padding record magic (Java int -875286124)."""

# --- sys flags ----------------------------------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_TYPE_MASK = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300

# --- property names -----------------------------------------------------------------------
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_WAIT = PROPERTY_WAIT_STORE_MSG_OK
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_DELAY = PROPERTY_DELAY_TIME_LEVEL
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_REAL_QID = PROPERTY_REAL_QUEUE_ID
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_BUYER_ID = "BUYER_ID"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_TRANSFER_FLAG = "TRANSFER_FLAG"
PROPERTY_CORRECTION_FLAG = "CORRECTION_FLAG"
PROPERTY_MQ2_FLAG = "MQ2_FLAG"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_UNIQ_KEY = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_INSTANCE_ID = "INSTANCE_ID"
PROPERTY_CORRELATION_ID = "CORRELATION_ID"
PROPERTY_MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
PROPERTY_MESSAGE_TTL = "TTL"
PROPERTY_REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
PROPERTY_PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_MESSAGE_TYPE = "MSG_TYPE"
PROPERTY_INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
PROPERTY_INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"

KEY_SEPARATOR = " "

# --- layout -------------------------------------------------------------------------------
TOTAL_SIZE_POS = 0
MAGIC_CODE_POS = 4
BODY_CRC_POS = 8
QUEUE_ID_POS = 12
FLAG_POS = 16
QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
SYSFLAG_POS = 36
BORN_TIMESTAMP_POS = 40
BORN_HOST_POS = 48
STORE_TIMESTAMP_POS_V4 = 56
"""Store timestamp position when the born host is IPv4."""
STORE_TIMESTAMP_POS_V6 = 68
"""Store timestamp position when the born host is IPv6 (sys flag 0x10)."""

MIN_RECORD_SIZE = 91
"""Size of a record with IPv4 hosts and empty body, topic and properties."""
MAX_TOPIC_SIZE = 127
MAX_PROPERTIES_SIZE = 32767
DEFAULT_MAX_RECORD_SIZE = 64 * 1024 * 1024
"""Default sanity bound for `check_record` (the store passes its own limit)."""
BLANK_RECORD_SIZE = 8

# Fixed part up to and including the body length, one Struct per host width combination.
# Fields: total, magic, crc, queue_id, flag, queue_offset, phy_offset, sys_flag, born_ts,
# born_ip, born_port, store_ts, store_ip, store_port, reconsume, prepared_offset, body_len.
_FIXED: dict[int, struct.Struct] = {
    0: struct.Struct(">iIiiiqqiq4siq4siiqi"),
    BORNHOST_V6_FLAG: struct.Struct(">iIiiiqqiq16siq4siiqi"),
    STOREHOSTADDRESS_V6_FLAG: struct.Struct(">iIiiiqqiq4siq16siiqi"),
    BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG: struct.Struct(">iIiiiqqiq16siq16siiqi"),
}
_FIXED_V4 = _FIXED[0]
_HOST_MASK = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_HEAD8 = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_U8 = struct.Struct(">B")
_PATCH_V4 = struct.Struct(">qq")  # queue offset, physical offset (contiguous at 20)


def _native_wanted() -> bool:
    """Whether to try `common.speedups` (native versions of the store's loops): unless the
    environment variable TRIMQ_NO_NATIVE is set to anything but "" or "0"."""
    flag = os.environ.get("TRIMQ_NO_NATIVE", "")
    return not flag or flag == "0"


NATIVE = _native_wanted()
"""Whether the native accelerators are in use: wanted (see `_native_wanted`) and built. The
store's modules use `common.speedups` only when this is true."""
if NATIVE:
    try:
        import common.speedups as _native
    except ImportError:
        NATIVE = False
_crc32: Callable[..., int] = _native.crc32 if NATIVE else zlib.crc32
"""zlib.crc32, natively computed when available (same results)."""


class MessageDecodeError(ValueError):
    """Bytes that are not a valid record / batch body / message id."""


class MessageEncodeError(ValueError):
    """A message that cannot be laid out as a V1 record (topic or properties too long...)."""


class PropertiesSizeExceededError(MessageEncodeError):
    """The encoded properties are longer than 32767 bytes (PROPERTIES_SIZE_EXCEEDED)."""


# --- properties -----------------------------------------------------------------------------
def encode_properties(properties: Mapping[str, str]) -> str:
    """Encode properties as RocketMQ's ``name\\x01value`` entries joined by ``\\x02``.

    Args:
        properties: property names to values; ``None`` values are skipped as Java does.

    Returns:
        The properties string (no trailing separator).
    """
    return PROPERTY_SEPARATOR.join(
        [f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items() if v is not None]
    )


def _py_decode_properties(text: str) -> dict[str, str]:
    """Parse a properties string with RocketMQ's rules.

    A ``\\x02``-separated segment is kept only if it has at least 3 characters and its first
    ``\\x01`` is neither its first nor its last character; that ``\\x01`` splits name and value.

    Args:
        text: the properties string.

    Returns:
        The properties as a dict (a later duplicate name wins).
    """
    result: dict[str, str] = {}
    if not text:
        return result
    for seg in text.split(PROPERTY_SEPARATOR):
        # name non-empty and value non-empty <=> >= 3 chars with the first \x01 inside
        name, _, value = seg.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            result[name] = value
    return result


decode_properties: Callable[[str], dict[str, str]] = (
    _native.decode_properties if NATIVE else _py_decode_properties
)


def _decode_properties_bytes(raw: bytes) -> dict[str, str]:
    try:
        return decode_properties(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MessageDecodeError(f"properties are not UTF-8: {exc}") from None


# --- hashes -------------------------------------------------------------------------------
_py_java_string_hash = common.hashing.java_string_hash
"""The Python fallback of `java_string_hash` (the native tests compare against it)."""
java_string_hash: Callable[[str], int] = (
    _native.java_string_hash if NATIVE else _py_java_string_hash
)
"""Java's ``String.hashCode()`` as an int32: `common.hashing.java_string_hash`, computed natively
when available (same results)."""


@functools.lru_cache(maxsize=4096)
def _tags_code_cached(tags: str) -> int:
    return java_string_hash(tags)


def tags_code(tags: str | None) -> int:
    """The consume-queue tags code of a TAGS value: its Java hash, or 0 without tags."""
    if not tags:
        return 0
    return _tags_code_cached(tags)


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """RocketMQ's body CRC: ``crc32(body) & 0x7FFFFFFF``."""
    return _crc32(body) & 0x7FFFFFFF


# --- hosts --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _pack_ip(ip: str) -> bytes:
    try:
        if ":" in ip:
            return socket.inet_pton(socket.AF_INET6, ip)
        return socket.inet_pton(socket.AF_INET, ip)
    except OSError:
        raise MessageEncodeError(f"not an IP address: {ip!r}") from None


@functools.lru_cache(maxsize=1024)
def unpack_ip(raw: bytes) -> str:
    """A packed IPv4 (4 bytes) or IPv6 (16 bytes) address as text."""
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    return socket.inet_ntop(socket.AF_INET6, raw)


# --- MessageInner / encode -------------------------------------------------------------------
class MessageInner:
    """A message the broker asks the store to append.

    ``properties_string`` caches the encoded properties; set it to ``None`` after changing
    ``properties`` (or set it directly, e.g. to the string the producer sent). ``tags_code``
    is what the consume queue stores; it defaults to the Java hash of the TAGS property (the
    broker sets the delivery time instead for SCHEDULE_TOPIC_XXXX). Host IPv6-ness is taken
    from the addresses: `encode_record` sets or clears sys flags 0x10/0x20 accordingly.
    """

    __slots__ = (
        "body",
        "born_host",
        "born_timestamp",
        "flag",
        "prepared_transaction_offset",
        "properties",
        "properties_string",
        "queue_id",
        "reconsume_times",
        "store_host",
        "sys_flag",
        "tags_code",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        flag: int = 0,
        properties: dict[str, str] | None = None,
        properties_string: str | None = None,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        store_host: tuple[str, int] = ("127.0.0.1", 0),
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        tags_code: int | None = None,
    ) -> None:
        if properties is None:
            properties = decode_properties(properties_string) if properties_string else {}
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.flag = flag
        self.properties = properties
        self.properties_string = properties_string
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.tags_code = (
            tags_code if tags_code is not None else _tags_of(properties.get(PROPERTY_TAGS))
        )

    @property
    def tags(self) -> str | None:
        """The TAGS property."""
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        """The KEYS property (space separated)."""
        return self.properties.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        """The UNIQ_KEY property (the client-side message id)."""
        return self.properties.get(PROPERTY_UNIQ_KEY)

    def encoded_properties(self) -> str:
        """The properties string, computed once and cached in ``properties_string``."""
        s = self.properties_string
        if s is None:
            s = self.properties_string = encode_properties(self.properties)
        return s

    def __repr__(self) -> str:
        return (
            f"MessageInner(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"body_len={len(self.body)}, properties={self.properties!r})"
        )


def _tags_of(tags: str | None) -> int:
    return tags_code(tags)


def store_timestamp_pos(sys_flag: int) -> int:
    """Position of STORETIMESTAMP in a record with this sys flag (56, or 68 for a v6 born host)."""
    return STORE_TIMESTAMP_POS_V6 if sys_flag & BORNHOST_V6_FLAG else STORE_TIMESTAMP_POS_V4


def encode_record_template(msg: MessageInner) -> bytearray:
    """Encode `msg` with queue offset, physical offset and store timestamp left at 0.

    Fill them in with `patch_record` (which is all `encode_record` adds); this lets the store
    do the expensive part (CRC, properties, copying) before taking its append position.

    Raises:
        MessageEncodeError: topic longer than 127 bytes or a bad host address.
        PropertiesSizeExceededError: properties longer than 32767 bytes.
    """
    return _encode(msg, 0, 0, 0)


def _encode(msg: MessageInner, queue_offset: int, physical_offset: int, store_ts: int) -> bytearray:
    topic_b = msg.topic.encode("utf-8")
    topic_len = len(topic_b)
    if topic_len > MAX_TOPIC_SIZE:
        raise MessageEncodeError(f"topic is {topic_len} bytes, V1 records allow 127")
    props_b = msg.encoded_properties().encode("utf-8")
    props_len = len(props_b)
    if props_len > MAX_PROPERTIES_SIZE:
        raise PropertiesSizeExceededError(
            f"properties are {props_len} bytes, the limit is {MAX_PROPERTIES_SIZE}"
        )
    body = msg.body
    born_ip, born_port = msg.born_host
    store_ip, store_port = msg.store_host
    born_raw = _pack_ip(born_ip)
    store_raw = _pack_ip(store_ip)
    sys_flag = msg.sys_flag & ~_HOST_MASK
    if len(born_raw) == 16:
        sys_flag |= BORNHOST_V6_FLAG
    if len(store_raw) == 16:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
    fixed = _FIXED[sys_flag & _HOST_MASK]
    body_len = len(body)
    pos = fixed.size
    end = pos + body_len
    total = end + 3 + topic_len + props_len
    buf = bytearray(total)
    try:
        fixed.pack_into(
            buf,
            0,
            total,
            MESSAGE_MAGIC_CODE,
            zlib.crc32(body) & 0x7FFFFFFF,
            msg.queue_id,
            msg.flag,
            queue_offset,
            physical_offset,
            sys_flag,
            msg.born_timestamp,
            born_raw,
            born_port,
            store_ts,
            store_raw,
            store_port,
            msg.reconsume_times,
            msg.prepared_transaction_offset,
            body_len,
        )
    except struct.error as exc:
        raise MessageEncodeError(f"field out of range: {exc}") from None
    buf[pos:end] = body
    buf[end] = topic_len
    end += 1
    buf[end : end + topic_len] = topic_b
    end += topic_len
    _I16.pack_into(buf, end, props_len)
    buf[end + 2 :] = props_b
    return buf


def patch_record(
    buf: bytearray | memoryview,
    pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
) -> None:
    """Write queue offset, physical offset and store timestamp into an encoded record.

    Args:
        buf: a writable buffer holding the record at `pos` (a template, or the mapped file).
        pos: where the record starts in `buf`.
        queue_offset: the consume-queue index.
        physical_offset: the commitlog byte offset of the record.
        store_timestamp: ms.
    """
    _PATCH_V4.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset, physical_offset)
    (sys_flag,) = _I32.unpack_from(buf, pos + SYSFLAG_POS)
    _I64.pack_into(buf, pos + store_timestamp_pos(sys_flag), store_timestamp)


def encode_record(
    msg: MessageInner, queue_offset: int, physical_offset: int, store_timestamp: int
) -> bytearray:
    """Encode `msg` as a V1 commitlog record.

    Args:
        msg: the message.
        queue_offset: its consume-queue index.
        physical_offset: its commitlog byte offset.
        store_timestamp: ms.

    Returns:
        The record bytes (TOTALSIZE = ``len(result)``).

    Raises:
        MessageEncodeError: topic longer than 127 bytes or a bad host address.
        PropertiesSizeExceededError: properties longer than 32767 bytes.
    """
    return _encode(msg, queue_offset, physical_offset, store_timestamp)


class EncodedRecords:
    """Several records laid out back to back in one buffer (see `encode_records`).

    Queue offset, physical offset and store timestamp are still 0: `patch_records` fills them
    in once the store has taken its append position.

    Attributes:
        buf: The records, in message order.
        sizes: TOTALSIZE of each record.
        ts_positions: Where each record's STORETIMESTAMP is (56, or 68 after a v6 born host);
            None when every record has it at 56.
        store_host: The store host of every message, or None when they differ.
    """

    __slots__ = ("buf", "sizes", "store_host", "ts_positions")

    def __init__(
        self,
        buf: bytearray,
        sizes: list[int],
        ts_positions: list[int] | None,
        store_host: tuple[str, int] | None,
    ) -> None:
        self.buf = buf
        self.sizes = sizes
        self.ts_positions = ts_positions
        self.store_host = store_host

    def __len__(self) -> int:
        return len(self.sizes)


_pack_i16 = _I16.pack


def _py_encode_records(msgs: Sequence[MessageInner]) -> EncodedRecords:
    """Encode `msgs` like `encode_record_template`, all into one buffer, in one pass.

    Byte for byte the concatenation of the templates. Cheaper per message: one buffer (no
    per-record allocation), and the topic bytes, host addresses and fixed-part layout are
    reused while consecutive messages share them (a batch always does).

    Raises:
        MessageEncodeError: topic longer than 127 bytes, a bad host address or a field out
            of range.
        PropertiesSizeExceededError: properties longer than 32767 bytes.
    """
    if len(msgs) == 1:
        # A single send: the plain encoder has less set-up than the loop below.
        msg = msgs[0]
        rec = _encode(msg, 0, 0, 0)
        # `_pack_ip` takes an address with a colon as IPv6 (a v6 born host moves the time).
        ts_pos = [STORE_TIMESTAMP_POS_V6] if ":" in msg.born_host[0] else None
        return EncodedRecords(rec, [len(rec)], ts_pos, msg.store_host)
    buf = bytearray()
    sizes: list[int] = []
    add_size = sizes.append
    ts_positions: list[int] | None = None
    crc32 = zlib.crc32
    magic = MESSAGE_MAGIC_CODE
    last_topic: str | None = None
    last_born: tuple[str, int] | None = None
    last_store: tuple[str, int] | None = None
    last_sys = -1
    same_store = True
    # Bound before first use (the first message always misses both caches).
    topic_tail = b""
    fixed_len = 0
    sys_flag = 0
    born_raw = store_raw = b""
    pack = _FIXED_V4.pack
    try:
        for msg in msgs:
            topic = msg.topic
            if topic != last_topic:
                topic_b = topic.encode("utf-8")
                if len(topic_b) > MAX_TOPIC_SIZE:
                    raise MessageEncodeError(f"topic is {len(topic_b)} bytes, V1 records allow 127")
                topic_tail = bytes((len(topic_b),)) + topic_b
                last_topic = topic
            props_s = msg.properties_string
            if props_s is None:
                props_s = msg.encoded_properties()
            props_b = props_s.encode("utf-8")
            props_len = len(props_b)
            if props_len > MAX_PROPERTIES_SIZE:
                raise PropertiesSizeExceededError(
                    f"properties are {props_len} bytes, the limit is {MAX_PROPERTIES_SIZE}"
                )
            born = msg.born_host
            store = msg.store_host
            if born != last_born or store != last_store or msg.sys_flag != last_sys:
                if last_store is not None and store != last_store:
                    same_store = False
                last_born, last_store, last_sys = born, store, msg.sys_flag
                born_raw = _pack_ip(born[0])
                store_raw = _pack_ip(store[0])
                sys_flag = last_sys & ~_HOST_MASK
                if len(born_raw) == 16:
                    sys_flag |= BORNHOST_V6_FLAG
                if len(store_raw) == 16:
                    sys_flag |= STOREHOSTADDRESS_V6_FLAG
                fixed = _FIXED[sys_flag & _HOST_MASK]
                pack = fixed.pack
                fixed_len = fixed.size
                if sys_flag & BORNHOST_V6_FLAG and ts_positions is None:
                    ts_positions = [STORE_TIMESTAMP_POS_V4] * len(sizes)
            body = msg.body
            body_len = len(body)
            # fixed part + body + topic length byte + topic + properties length + properties
            # (the topic's length is read per record: a topic change alone keeps `fixed_len`)
            total = fixed_len + body_len + len(topic_tail) + 2 + props_len
            buf += pack(
                total,
                magic,
                crc32(body) & 0x7FFFFFFF,
                msg.queue_id,
                msg.flag,
                0,
                0,
                sys_flag,
                msg.born_timestamp,
                born_raw,
                born[1],
                0,
                store_raw,
                store[1],
                msg.reconsume_times,
                msg.prepared_transaction_offset,
                body_len,
            )
            buf += body
            buf += topic_tail
            buf += _pack_i16(props_len)
            buf += props_b
            add_size(total)
            if ts_positions is not None:
                ts_positions.append(store_timestamp_pos(sys_flag))
    except struct.error as exc:
        raise MessageEncodeError(f"field out of range: {exc}") from None
    return EncodedRecords(buf, sizes, ts_positions, last_store if same_store else None)


def _native_encode_records(msgs: Sequence[MessageInner]) -> EncodedRecords:
    buf, sizes, ts_positions, store_host = _native.encode_records(
        msgs, _pack_ip, MessageEncodeError, PropertiesSizeExceededError
    )
    return EncodedRecords(buf, sizes, ts_positions, store_host)


encode_records: Callable[[Sequence[MessageInner]], EncodedRecords] = (
    _native_encode_records if NATIVE else _py_encode_records
)


def _py_patch_records(
    records: EncodedRecords,
    start: int,
    stop: int,
    buf_pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    phy_out: list[int],
) -> None:
    """`patch_record` for records ``start..stop-1`` of `records`, laid out back to back from
    `physical_offset` with consecutive queue offsets from `queue_offset`.

    Args:
        buf_pos: Where record `start` begins in ``records.buf``.
        phy_out: Receives each record's physical offset.
    """
    buf = records.buf
    sizes = records.sizes
    ts_pos = records.ts_positions
    pack_qp = _PATCH_V4.pack_into
    pack_ts = _I64.pack_into
    add = phy_out.append
    phy = physical_offset
    pos = buf_pos
    qo = queue_offset
    for k in range(start, stop):
        pack_qp(buf, pos + QUEUE_OFFSET_POS, qo, phy)
        pack_ts(
            buf, pos + (STORE_TIMESTAMP_POS_V4 if ts_pos is None else ts_pos[k]), store_timestamp
        )
        add(phy)
        size = sizes[k]
        pos += size
        phy += size
        qo += 1


def _native_patch_records(
    records: EncodedRecords,
    start: int,
    stop: int,
    buf_pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    phy_out: list[int],
) -> None:
    _native.patch_records(
        records.buf,
        records.sizes,
        records.ts_positions,
        start,
        stop,
        buf_pos,
        queue_offset,
        physical_offset,
        store_timestamp,
        phy_out,
    )


patch_records = _native_patch_records if NATIVE else _py_patch_records


def encode_blank(remaining: int) -> bytes:
    """The end-of-file blank record: ``[int32 remaining][BLANK_MAGIC_CODE]`` (8 bytes)."""
    return _HEAD8.pack(remaining, BLANK_MAGIC_CODE)


# --- message ids --------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _host_hex(ip: str, port: int) -> str:
    return (_pack_ip(ip) + _U32.pack(port & 0xFFFFFFFF)).hex().upper()


def create_offset_msg_id(store_host: tuple[str, int], phy_offset: int) -> str:
    """The offset message id: store IP + port int32 + commitlog offset int64, uppercase hex.

    Returns:
        32 hex characters for an IPv4 host, 56 for IPv6.
    """
    return f"{_host_hex(store_host[0], store_host[1])}{phy_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def offset_msg_id(store_ip: bytes, store_port: int, commit_log_offset: int) -> str:
    """`create_offset_msg_id` from the packed store IP (as a record holds it)."""
    return (
        f"{(store_ip + _U32.pack(store_port & 0xFFFFFFFF)).hex().upper()}"
        f"{commit_log_offset & 0xFFFFFFFFFFFFFFFF:016X}"
    )


def decode_offset_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """Split an offset message id into ``((ip, port), commitlog offset)``.

    Raises:
        MessageDecodeError: not 32 or 56 hex characters.
    """
    if len(msg_id) not in (32, 56):
        raise MessageDecodeError(f"offset message id must be 32 or 56 hex chars: {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageDecodeError(f"offset message id is not hex: {msg_id!r}") from None
    ip_len = len(raw) - 12
    ip = unpack_ip(raw[:ip_len])
    (port,) = _I32.unpack_from(raw, ip_len)
    (offset,) = _I64.unpack_from(raw, ip_len + 4)
    return (ip, port), offset


# --- MessageExt / decode ---------------------------------------------------------------------
class MessageExt:
    """A decoded record. Properties, hosts and the message id are decoded on first access.

    ``body`` is the stored body (still compressed when sys flag 0x1 is set: see
    `decompressed_body`), or ``None`` when decoded with ``read_body=False``.
    """

    __slots__ = (
        "_born_ip",
        "_msg_id",
        "_properties",
        "_properties_raw",
        "_store_ip",
        "body",
        "body_crc",
        "born_port",
        "born_timestamp",
        "commit_log_offset",
        "flag",
        "prepared_transaction_offset",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "store_port",
        "store_size",
        "store_timestamp",
        "sys_flag",
        "topic",
    )

    def __init__(
        self,
        store_size: int,
        body_crc: int,
        queue_id: int,
        flag: int,
        queue_offset: int,
        commit_log_offset: int,
        sys_flag: int,
        born_timestamp: int,
        born_ip: bytes,
        born_port: int,
        store_timestamp: int,
        store_ip: bytes,
        store_port: int,
        reconsume_times: int,
        prepared_transaction_offset: int,
        body: bytes | None,
        topic: str,
        properties_raw: bytes,
    ) -> None:
        self.store_size = store_size
        self.body_crc = body_crc
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self._born_ip = born_ip
        self.born_port = born_port
        self.store_timestamp = store_timestamp
        self._store_ip = store_ip
        self.store_port = store_port
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.body = body
        self.topic = topic
        self._properties_raw = properties_raw
        self._properties: dict[str, str] | None = None
        self._msg_id: str | None = None

    @property
    def properties(self) -> dict[str, str]:
        """The properties dict (parsed once; changes to it are kept on this object).

        Raises:
            MessageDecodeError: the stored properties are not UTF-8.
        """
        p = self._properties
        if p is None:
            p = self._properties = _decode_properties_bytes(self._properties_raw)
        return p

    @property
    def properties_string(self) -> str:
        """The properties as encoded (re-encoded if `properties` was changed)."""
        if self._properties is not None:
            return encode_properties(self._properties)
        return self._properties_raw.decode("utf-8", "replace")

    @property
    def born_host(self) -> tuple[str, int]:
        """``(ip, port)`` of the producer."""
        return unpack_ip(self._born_ip), self.born_port

    @property
    def store_host(self) -> tuple[str, int]:
        """``(ip, port)`` of the broker that stored the record."""
        return unpack_ip(self._store_ip), self.store_port

    @property
    def msg_id(self) -> str:
        """The offset message id (store host + commitlog offset)."""
        m = self._msg_id
        if m is None:
            m = self._msg_id = offset_msg_id(
                self._store_ip, self.store_port, self.commit_log_offset
            )
        return m

    @property
    def tags(self) -> str | None:
        """The TAGS property."""
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        """The KEYS property (space separated)."""
        return self.properties.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        """The UNIQ_KEY property (client-side message id), if present."""
        return self.properties.get(PROPERTY_UNIQ_KEY)

    def decompressed_body(self, max_size: int = DEFAULT_MAX_RECORD_SIZE) -> bytes | None:
        """The body, inflated when sys flag 0x1 (COMPRESSED) is set.

        Compression type bits 0x700: 0 (4.9.0-4.9.3 clients) or 0x300 mean zlib.

        Args:
            max_size: refuse to inflate beyond this many bytes.

        Raises:
            MessageDecodeError: LZ4/ZSTD bodies (not supported), corrupt data or too large.
        """
        body = self.body
        if body is None or not self.sys_flag & COMPRESSED_FLAG:
            return body
        return decompress_record_body(body, self.sys_flag, max_size)

    def to_inner(self) -> MessageInner:
        """A `MessageInner` with this record's fields (for re-storing, e.g. retries)."""
        return MessageInner(
            self.topic,
            self.body if self.body is not None else b"",
            queue_id=self.queue_id,
            flag=self.flag,
            properties=dict(self.properties),
            sys_flag=self.sys_flag,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            store_host=self.store_host,
            reconsume_times=self.reconsume_times,
            prepared_transaction_offset=self.prepared_transaction_offset,
        )

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, commit_log_offset={self.commit_log_offset}, "
            f"store_size={self.store_size}, properties={self.properties!r})"
        )


Buffer = bytes | bytearray | memoryview
_new_object = object.__new__

RECORD_FIXED_STRUCTS: Mapping[int, struct.Struct] = _FIXED
"""The record's fixed part (total size .. body length) by host flags ``sys_flag & 0x30``.

Fields: total, magic, crc, queue_id, flag, queue_offset, phy_offset, sys_flag, born_ts,
born_ip, born_port, store_ts, store_ip, store_port, reconsume, prepared_offset, body_len.
For decoders outside this module (the client decodes pull bodies straight into its own
message objects)."""


def decompress_record_body(
    body: bytes, sys_flag: int, max_size: int = DEFAULT_MAX_RECORD_SIZE
) -> bytes:
    """Inflate a stored body whose sys flag has COMPRESSED (0x1) set.

    Compression type bits 0x700: 0 (4.9.0-4.9.3 clients) or 0x300 mean zlib.

    Raises:
        MessageDecodeError: LZ4/ZSTD bodies (not supported), corrupt data or larger than
            `max_size`.
    """
    ctype = sys_flag & COMPRESSION_TYPE_MASK
    if ctype not in (0, COMPRESSION_ZLIB):
        name = {COMPRESSION_LZ4: "LZ4", COMPRESSION_ZSTD: "ZSTD"}.get(ctype, hex(ctype))
        raise MessageDecodeError(f"{name} compressed bodies are not supported (zlib only)")
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, max_size)
    except zlib.error as exc:
        raise MessageDecodeError(f"corrupt zlib body: {exc}") from None
    if d.unconsumed_tail:
        raise MessageDecodeError(f"decompressed body exceeds {max_size} bytes")
    return out


def _decode_one(
    buf: Buffer,
    offset: int,
    end: int,
    read_body: bool,
    check_crc: bool,
    topics: dict[bytes, str] | None = None,
) -> MessageExt:
    """Decode the record at `offset` of `buf[:end]` (its end is ``offset + store_size``).

    `topics` caches topic bytes -> str across the records of one buffer.
    """
    if offset < 0 or end - offset < MIN_RECORD_SIZE:
        raise MessageDecodeError(f"truncated record at {offset}: {max(end - offset, 0)} bytes")
    fields = _FIXED_V4.unpack_from(buf, offset)
    sys_flag = fields[7]
    if sys_flag & _HOST_MASK:
        fixed = _FIXED[sys_flag & _HOST_MASK]
        if end - offset < fixed.size + 3:
            raise MessageDecodeError(f"truncated record at {offset}")
        fields = fixed.unpack_from(buf, offset)
        pos = offset + fixed.size
    else:
        pos = offset + 88
    (
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        phy_offset,
        _,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
        body_len,
    ) = fields
    rec_end = offset + total
    if total < MIN_RECORD_SIZE or rec_end > end:
        raise MessageDecodeError(f"record at {offset}: bad total size {total}")
    if body_len < 0 or pos + body_len + 3 > rec_end:
        raise MessageDecodeError(f"record at {offset}: bad body length {body_len}")
    body_end = pos + body_len
    if check_crc and _crc32(buf[pos:body_end]) & 0x7FFFFFFF != crc:
        raise MessageDecodeError(f"record at {offset}: body CRC mismatch")
    body = bytes(buf[pos:body_end]) if read_body else None
    pos = body_end
    if magic == MESSAGE_MAGIC_CODE:
        topic_len = buf[pos]
        pos += 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        (topic_len,) = _U16.unpack_from(buf, pos)
        pos += 2
    else:
        raise MessageDecodeError(f"record at {offset}: bad magic code {magic:#010x}")
    topic_end = pos + topic_len
    if topic_end + 2 > rec_end:
        raise MessageDecodeError(f"record at {offset}: bad topic length {topic_len}")
    raw_topic = bytes(buf[pos:topic_end])
    topic = topics.get(raw_topic) if topics is not None else None
    if topic is None:
        try:
            topic = str(raw_topic, "utf-8")
        except UnicodeDecodeError:
            raise MessageDecodeError(f"record at {offset}: topic is not UTF-8") from None
        if topics is not None:
            topics[raw_topic] = topic
    (props_len,) = _I16.unpack_from(buf, topic_end)
    pos = topic_end + 2
    if props_len < 0 or pos + props_len != rec_end:
        raise MessageDecodeError(
            f"record at {offset}: properties length {props_len} does not match total {total}"
        )
    # Slots set here rather than through __init__: one Python frame less per record.
    m = _new_object(MessageExt)
    m.store_size = total
    m.body_crc = crc
    m.queue_id = queue_id
    m.flag = flag
    m.queue_offset = queue_offset
    m.commit_log_offset = phy_offset
    m.sys_flag = sys_flag
    m.born_timestamp = born_ts
    m._born_ip = born_ip
    m.born_port = born_port
    m.store_timestamp = store_ts
    m._store_ip = store_ip
    m.store_port = store_port
    m.reconsume_times = reconsume
    m.prepared_transaction_offset = prepared
    m.body = body
    m.topic = topic
    m._properties_raw = bytes(buf[pos:rec_end])
    m._properties = None
    m._msg_id = None
    return m


def decode_record(
    buf: Buffer, offset: int = 0, *, read_body: bool = True, check_crc: bool = False
) -> MessageExt:
    """Decode one record (V1, or 5.x V2) starting at `offset`.

    Args:
        buf: bytes, bytearray or memoryview (e.g. of a mapped file).
        offset: where the record starts.
        read_body: copy the body (else ``MessageExt.body`` is ``None``).
        check_crc: verify the body CRC.

    Raises:
        MessageDecodeError: truncated or malformed bytes, a blank record or a CRC mismatch.
    """
    try:
        return _decode_one(buf, offset, len(buf), read_body, check_crc)
    except (struct.error, IndexError, TypeError) as exc:
        raise MessageDecodeError(f"malformed record at {offset}: {exc}") from None


def iter_records(
    buf: Buffer, *, read_body: bool = True, check_crc: bool = False
) -> Iterator[MessageExt]:
    """Yield the records of a buffer of consecutive records (a pull / query body).

    Raises:
        MessageDecodeError: when the bytes stop being a valid record (after yielding the
            good ones before it).
    """
    if isinstance(buf, memoryview) and not buf.c_contiguous:
        buf = buf.tobytes()
    end = len(buf)
    offset = 0
    topics: dict[bytes, str] = {}
    try:
        while offset < end:
            msg = _decode_one(buf, offset, end, read_body, check_crc, topics)
            offset += msg.store_size
            yield msg
    except (struct.error, IndexError, TypeError) as exc:
        raise MessageDecodeError(f"malformed record at {offset}: {exc}") from None


_T = TypeVar("_T")


def decode_records_into(buf: bytes, cls: type[_T], broker_name: str) -> list[_T] | None:
    """The records of a pull body as new `cls` objects, natively; None when the caller must
    decode in Python: no native accelerators, a `cls` without the plain slots this fills, or a
    body with anything but the common case in it (IPv6 hosts, a compressed body, non-ASCII
    properties, a record that fails a check). Nothing is raised for a bad body: the caller's
    decoder raises the exact error.

    Each object gets, without `__init__`: ``topic``, ``body``, ``flag``, ``queue_id``,
    ``queue_offset``, ``commit_log_offset``, ``sys_flag``, ``born_timestamp``,
    ``store_timestamp``, ``reconsume_times``, ``prepared_transaction_offset``, ``store_size``,
    ``broker_name``; the raw ``_props_raw`` bytes, ``_born_ip`` / ``_store_ip`` (4 bytes) and
    ``_born_port`` / ``_store_port``; and None in ``_props``, ``_pending``, ``_born_host``,
    ``_store_host``, ``_offset_msg_id`` (decoded when read: `client.message.MessageExt`).
    """
    if not NATIVE:
        return None
    return _native.decode_records_into(buf, cls, broker_name)


RecordColumns = tuple[
    int,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
]
"""`decode_records_columns`' answer: the row count, then little-endian Arrow buffers."""


def decode_records_columns(buf: bytes, end: int) -> RecordColumns | None:
    """The records of a pull body with a queue offset below `end`, as Arrow column buffers,
    natively; None when the caller must decode in Python (no native accelerators, IPv6 hosts, a
    compressed body, properties that are not ASCII or repeat a name, a record that fails a
    check). Nothing is raised for a bad body: the Python decoder raises the exact error.

    Returns ``(n, queue_offsets, born_us, store_us, body_offsets, bodies, msg_id_offsets,
    msg_ids, keys_validity, keys_offsets, keys, tags_validity, tags_offsets, tags,
    properties_offsets, name_offsets, names, value_offsets, values)``: int64 queue offsets and
    timestamps (microseconds), int32 offsets into each string/binary column's data, validity
    bitmaps for KEYS and TAGS, and the properties as a map (entry offsets per row). The message
    id is UNIQ_KEY, else the offset message id, as `MessageExt`.
    """
    if not NATIVE:
        return None
    cols: RecordColumns | None = _native.decode_records_columns(buf, end)
    return cols


def decode_records(
    buf: Buffer, *, read_body: bool = True, check_crc: bool = False
) -> list[MessageExt]:
    """Decode all records of a pull body.

    Raises:
        MessageDecodeError: truncated or malformed bytes anywhere in `buf`.
    """
    if isinstance(buf, memoryview) and not buf.c_contiguous:
        buf = buf.tobytes()
    end = len(buf)
    offset = 0
    topics: dict[bytes, str] = {}
    out: list[MessageExt] = []
    append = out.append
    try:
        while offset < end:
            msg = _decode_one(buf, offset, end, read_body, check_crc, topics)
            offset += msg.store_size
            append(msg)
    except (struct.error, IndexError, TypeError) as exc:
        raise MessageDecodeError(f"malformed record at {offset}: {exc}") from None
    return out


# --- check_record (recovery / dispatch) --------------------------------------------------------
class DispatchStatus(enum.IntEnum):
    """Result of `check_record`."""

    OK = 0
    """A valid message record; `DispatchRequest.size` is its length."""
    BLANK = 1
    """The end-of-file padding record; `size` is the padding length: go to the next file."""
    END = 2
    """No record here: end of the buffer or a zeroed header."""
    INVALID = 3
    """Garbage or a torn write: recovery stops here."""


class DispatchRequest(NamedTuple):
    """What recovery and the dispatcher need to know about one record.

    `common.speedups` builds these item by item (its REQ_FIELDS): a new field goes there too.
    """

    status: DispatchStatus
    size: int = 0
    topic: str = ""
    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    tags_code: int = 0
    store_timestamp: int = 0
    sys_flag: int = 0
    keys: str = ""
    uniq_key: str | None = None
    prepared_transaction_offset: int = 0
    properties: dict[str, str] | None = None
    born_timestamp: int = 0
    body_crc: int = 0


_END = DispatchRequest(DispatchStatus.END)
_INVALID = DispatchRequest(DispatchStatus.INVALID)


def _py_check_record(
    buf: Buffer,
    offset: int = 0,
    *,
    check_crc: bool = True,
    max_size: int = DEFAULT_MAX_RECORD_SIZE,
) -> DispatchRequest:
    """Validate the record at `offset` and extract what the consume queue and index need.

    The reference of `check_record` (the native one when the accelerators are in use).

    Never raises. It checks the magic code, that TOTALSIZE is within ``[91, max_size]`` and
    within `buf`, that the body / topic / properties lengths add up exactly to TOTALSIZE,
    that topic and properties are UTF-8 and, with `check_crc`, the body CRC.

    ``tags_code`` is the Java hash of TAGS (0 without); for SCHEDULE_TOPIC_XXXX the broker's
    delivery time must be computed by the caller from ``properties`` and ``store_timestamp``.

    Args:
        buf: the file contents (bytes / bytearray / memoryview of a mapped file).
        offset: where to look.
        check_crc: verify the body CRC (recovery does; the dispatcher of fresh appends needn't).
        max_size: the largest acceptable record.

    Returns:
        A `DispatchRequest` whose status is OK, BLANK (padding of ``size`` bytes), END (no
        bytes left, or a zeroed header) or INVALID.
    """
    try:
        return _check(buf, offset, check_crc, max_size)
    except Exception:  # never raise: any surprise means the bytes are not a record
        return _INVALID


_STATUSES = tuple(DispatchStatus)  # by value: OK, BLANK, END, INVALID


def _native_check_record(
    buf: Buffer,
    offset: int = 0,
    *,
    check_crc: bool = True,
    max_size: int = DEFAULT_MAX_RECORD_SIZE,
) -> DispatchRequest:
    """`_py_check_record`, natively: the same request for the same bytes. Bytes that are no
    record never raise; a failed allocation raises MemoryError where the reference says INVALID
    (recovery must not cut the commitlog for want of memory)."""
    return _native.check_record(buf, offset, check_crc, max_size, DispatchRequest, _STATUSES)


check_record = _native_check_record if NATIVE else _py_check_record


def _native_scan_records(
    buf: bytes, pos: int, base: int, file_from: int, file_size: int, check_crc: bool, max_size: int
) -> tuple[list[DispatchRequest], int, DispatchStatus | None]:
    return _native.scan_records(
        buf, pos, base, file_from, file_size, check_crc, max_size, DispatchRequest, _STATUSES
    )


native_scan_records: (
    Callable[
        [bytes, int, int, int, int, bool, int],
        tuple[list[DispatchRequest], int, DispatchStatus | None],
    ]
    | None
) = _native_scan_records if NATIVE else None
"""`common.speedups.scan_records` (store._recovery.RecordScanner's loop over one buffer), or
None when the accelerators are not in use."""


def _check(buf: Buffer, offset: int, check_crc: bool, max_size: int) -> DispatchRequest:
    end = len(buf)
    avail = end - offset
    if offset < 0:
        return _INVALID
    if avail <= 0:
        return _END
    if avail < 8:
        return _END if not any(buf[offset:end]) else _INVALID
    total, magic = _HEAD8.unpack_from(buf, offset)
    if magic == BLANK_MAGIC_CODE:
        if total < BLANK_RECORD_SIZE or total > avail:
            return _INVALID
        return DispatchRequest(DispatchStatus.BLANK, total)
    if magic != MESSAGE_MAGIC_CODE:
        if total == 0 and magic == 0:
            return _END
        return _INVALID
    if total < MIN_RECORD_SIZE or total > max_size or total > avail:
        return _INVALID
    fields = _FIXED_V4.unpack_from(buf, offset)
    sys_flag = fields[7]
    pos = offset + 88
    if sys_flag & _HOST_MASK:
        fixed = _FIXED[sys_flag & _HOST_MASK]
        if total < fixed.size + 3:
            return _INVALID
        fields = fixed.unpack_from(buf, offset)
        pos = offset + fixed.size
    body_len = fields[16]
    rec_end = offset + total
    body_end = pos + body_len
    if body_len < 0 or body_end + 3 > rec_end:
        return _INVALID
    if check_crc and _crc32(buf[pos:body_end]) & 0x7FFFFFFF != fields[2]:
        return _INVALID
    topic_end = body_end + 1 + buf[body_end]
    if topic_end + 2 > rec_end:
        return _INVALID
    (props_len,) = _I16.unpack_from(buf, topic_end)
    if props_len < 0 or topic_end + 2 + props_len != rec_end:
        return _INVALID
    # a non-UTF-8 topic or properties raises UnicodeDecodeError: INVALID via check_record
    topic = str(buf[body_end + 1 : topic_end], "utf-8")
    props = decode_properties(str(buf[topic_end + 2 : rec_end], "utf-8"))
    get = props.get
    return DispatchRequest(
        DispatchStatus.OK,
        total,
        topic,
        fields[3],
        fields[5],
        fields[6],
        tags_code(get(PROPERTY_TAGS)),
        fields[11],
        sys_flag,
        get(PROPERTY_KEYS, ""),
        get(PROPERTY_UNIQ_KEY),
        fields[15],
        props,
        fields[8],
        fields[2],
    )


# --- SEND_BATCH_MESSAGE body ---------------------------------------------------------------------
class BatchItem(NamedTuple):
    """One message of a SEND_BATCH_MESSAGE body."""

    flag: int
    body: bytes
    properties: str


_BATCH_HEAD = struct.Struct(">iiiii")  # total, magic (0), body crc (0), flag, body length


def encode_batch_body(items: Iterable[BatchItem]) -> bytes:
    """Encode messages as a SEND_BATCH_MESSAGE body (what a producer sends).

    Each item is ``[int32 total][int32 0][int32 0][int32 flag][int32 bodyLen][body]
    [int16 propsLen][props]``.

    Raises:
        PropertiesSizeExceededError: an item's properties exceed 32767 bytes.
    """
    parts: list[bytes] = []
    for item in items:
        props = item.properties.encode("utf-8")
        if len(props) > MAX_PROPERTIES_SIZE:
            raise PropertiesSizeExceededError(
                f"properties are {len(props)} bytes, the limit is {MAX_PROPERTIES_SIZE}"
            )
        total = 22 + len(item.body) + len(props)
        parts.append(_BATCH_HEAD.pack(total, 0, 0, item.flag, len(item.body)))
        parts.append(item.body)
        parts.append(_I16.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def _py_decode_batch_body(body: Buffer) -> list[BatchItem]:
    """Split a SEND_BATCH_MESSAGE body into its messages.

    Raises:
        MessageDecodeError: truncated input, lengths that do not add up, or non-UTF-8
            properties.
    """
    items: list[BatchItem] = []
    add = items.append
    unpack_head = _BATCH_HEAD.unpack_from
    unpack_i16 = _I16.unpack_from
    new_item = _new_batch_item
    # One bytes object (the request body already is one): its slices are the item bodies
    # and `.decode()` reads the properties, with no per-item bytes()/str() calls.
    data = body if type(body) is bytes else bytes(body)
    end = len(data)
    pos = 0
    while pos < end:
        if end - pos < 22:
            raise MessageDecodeError(f"truncated batch item at {pos}")
        total, _magic, _crc, flag, body_len = unpack_head(data, pos)
        if body_len < 0:
            raise MessageDecodeError(f"batch item at {pos}: lengths do not add up")
        b_start = pos + 20
        b_end = b_start + body_len
        if b_end + 2 > end:
            raise MessageDecodeError(f"truncated batch item at {pos}")
        (props_len,) = unpack_i16(data, b_end)
        if props_len < 0:
            raise MessageDecodeError(f"batch item at {pos}: negative properties length")
        if total != 22 + body_len + props_len:
            raise MessageDecodeError(f"batch item at {pos}: lengths do not add up")
        item_end = pos + total
        if item_end > end:
            raise MessageDecodeError(f"truncated batch item at {pos}")
        try:
            props = data[b_end + 2 : item_end].decode()
        except UnicodeDecodeError:
            raise MessageDecodeError(f"batch item at {pos}: properties are not UTF-8") from None
        add(new_item(BatchItem, (flag, data[b_start:b_end], props)))
        pos = item_end
    return items


def _native_decode_batch_body(body: Buffer) -> list[BatchItem]:
    items: list[BatchItem] = _native.decode_batch_body(body, BatchItem, MessageDecodeError)
    return items


decode_batch_body: Callable[[Buffer], list[BatchItem]] = (
    _native_decode_batch_body if NATIVE else _py_decode_batch_body
)


native_build_batch_messages: Callable[..., tuple[list[MessageInner], int, int]] | None = (
    _native.build_batch_messages if NATIVE else None
)
"""The broker's batch-send loop in C (`broker.processors.send._py_build_batch_messages` is its
reference), or None without the native accelerators (the broker may not import the store's
private modules, so it gets it from here)."""


# `BatchItem(...)` goes through a generated Python `__new__`; this is the tuple constructor
# it ends in.
_new_batch_item = tuple.__new__


# --- UNIQ_KEY ---------------------------------------------------------------------------------
def month_start_ms(now_ms: int) -> tuple[int, int]:
    """(start of the current local month, start of the next one), in epoch ms."""
    t = time.localtime(now_ms / 1000)
    start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    nxt = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
    return int(start * 1000), int(nxt * 1000)


def _default_ip() -> bytes:
    try:
        return socket.inet_pton(socket.AF_INET, socket.gethostbyname(socket.gethostname()))
    except OSError:
        return b"\x7f\x00\x00\x01"


class UniqKeyGenerator:
    """Generates RocketMQ UNIQ_KEY message ids.

    Layout: client IP (4 bytes, or 16 for IPv6) + pid int16 + random int32 (Java uses the
    class loader's hash) + ms since the start of the current local month (low 32 bits) +
    counter int16, as uppercase hex (32 or 56 chars). The fixed prefix is computed once.
    Uniqueness: a (time, counter) pair is never reused by one generator; when the 65536
    counter values of one millisecond are used up, the time field moves one ms ahead.
    Thread safe.

    With the wall clock (`time.time`, the default) and the native accelerators, the state and
    `next` / `next_many` are `common.speedups.UniqKeys` (the same keys for the same clock
    readings; key generation is a producer's largest single cost per send after the
    transport): the Python code below is its reference, and runs for any other clock.
    (docs/design-notes.md, "Native accelerators")
    """

    __slots__ = (
        "_clock",
        "_count_in_t",
        "_counter",
        "_last_t",
        "_lock",
        "_month_end",
        "_month_start",
        "_native_keys",
        "_prefix",
    )

    def __init__(
        self,
        ip: str | None = None,
        *,
        pid: int | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Args:
        ip: the client's IP (default: the host name's address, else 127.0.0.1).
        pid: process id (default ``os.getpid()``).
        seed: the random int32 (default: random).
        clock: wall clock in seconds (for tests).
        """
        self._clock = clock
        raw_ip = _pack_ip(ip) if ip is not None else _default_ip()
        pid = os.getpid() if pid is None else pid
        rnd = random.getrandbits(32) if seed is None else seed & 0xFFFFFFFF
        self._prefix = (raw_ip + struct.pack(">HI", pid & 0xFFFF, rnd)).hex().upper()
        self._lock = threading.Lock()
        self._month_start, self._month_end = month_start_ms(int(clock() * 1000))
        self._last_t = -1
        self._count_in_t = 0
        self._counter = random.getrandbits(16)
        self._native_keys: _native.UniqKeys | None = None
        if NATIVE and clock is time.time:
            self._native_keys = _native.UniqKeys(
                self._prefix, self._month_start, self._month_end, self._counter
            )

    @property
    def prefix(self) -> str:
        """The fixed hex prefix (IP, pid, random)."""
        return self._prefix

    def next(self) -> str:
        """A new UNIQ_KEY."""
        keys = self._native_keys
        if keys is not None:
            key: str | None = keys.next()
            while key is None:  # the clock left the month (bounded: the month is now's)
                keys.set_month(*month_start_ms(int(time.time() * 1000)))
                key = keys.next()
            return key
        now = int(self._clock() * 1000)
        with self._lock:
            if now >= self._month_end or now < self._month_start:
                self._month_start, self._month_end = month_start_ms(now)
                self._last_t = -1
            t = now - self._month_start
            if t > self._last_t:
                self._last_t = t
                self._count_in_t = 0
            else:
                t = self._last_t
                if self._count_in_t >= 0x10000:
                    t = self._last_t = t + 1
                    self._count_in_t = 0
            self._count_in_t += 1
            c = self._counter
            self._counter = (c + 1) & 0xFFFF
        # One format operation: time (32 bits) and counter (16 bits) as 12 hex digits.
        return f"{self._prefix}{(t & 0xFFFFFFFF) << 16 | c:012X}"

    def next_many(self, n: int) -> list[str]:
        """`n` new UNIQ_KEYs: the same keys as `n` calls of `next()` within one millisecond.

        One clock read and one lock per batch, one format per key: cheaper per key than
        `next()`.
        """
        native_keys = self._native_keys
        if native_keys is not None:
            keys: list[str] | None = native_keys.next_many(n)
            while keys is None:  # as in `next`
                native_keys.set_month(*month_start_ms(int(time.time() * 1000)))
                keys = native_keys.next_many(n)
            return keys
        now = int(self._clock() * 1000)
        prefix = self._prefix
        out: list[str] = []
        with self._lock:
            if now >= self._month_end or now < self._month_start:
                self._month_start, self._month_end = month_start_ms(now)
                self._last_t = -1
            t = now - self._month_start
            if t > self._last_t:
                count = 0
            else:
                t = self._last_t
                count = self._count_in_t
            c = self._counter
            left = n
            while left > 0:
                if count >= 0x10000:  # this millisecond's counter values are used up
                    t += 1
                    count = 0
                k = min(left, 0x10000 - count)
                base = (t & 0xFFFFFFFF) << 16
                out += [f"{prefix}{base | ((c + i) & 0xFFFF):012X}" for i in range(k)]
                c = (c + k) & 0xFFFF
                count += k
                left -= k
            self._last_t = t
            self._count_in_t = count
            self._counter = c
        return out


def decode_uniq_key(key: str) -> tuple[str, int, int, int]:
    """Split a UNIQ_KEY into ``(ip, pid, ms since month start, counter)``.

    Raises:
        MessageDecodeError: not 32 or 56 hex characters.
    """
    if len(key) not in (32, 56):
        raise MessageDecodeError(f"UNIQ_KEY must be 32 or 56 hex chars: {key!r}")
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise MessageDecodeError(f"UNIQ_KEY is not hex: {key!r}") from None
    ip_len = len(raw) - 12
    pid, _rnd, t, counter = struct.unpack_from(">HIIH", raw, ip_len)
    return unpack_ip(raw[:ip_len]), pid, t, counter

"""What puts and gets answer: RocketMQ's statuses and result holders."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "AppendMessageResult",
    "GetMessageResult",
    "GetMessageStatus",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
]


class PutMessageStatus(enum.Enum):
    """Outcome of a put (RocketMQ's `PutMessageStatus`)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"


class GetMessageStatus(enum.Enum):
    """Outcome of a pull from the store (RocketMQ's `GetMessageStatus`)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class AppendMessageResult:
    """Where an append landed.

    Attributes:
        wrote_offset: Commitlog offset of the first record.
        wrote_bytes: Bytes written, records only (not the BLANK padding).
        msg_ids: Offset message ids, one per record.
        queue_offset: Consume-queue offset of the first record.
        msg_num: Number of records.
        store_timestamp: Store timestamp (ms) given to the records.
        phy_offsets: Commitlog offset of each record.
    """

    wrote_offset: int
    wrote_bytes: int
    msg_ids: list[str]
    queue_offset: int
    msg_num: int
    store_timestamp: int
    phy_offsets: list[int] = field(default_factory=list)


@dataclass(slots=True)
class PutMessageResult:
    """Status of a put, the append when there was one, and a human reason when refused.

    Attributes:
        status: The outcome.
        append: Where the records went (None if nothing was written).
        remark: Why a put was refused (SERVICE_NOT_AVAILABLE, MESSAGE_ILLEGAL, ...), else "".
    """

    status: PutMessageStatus
    append: AppendMessageResult | None = None
    remark: str = ""

    @property
    def ok(self) -> bool:
        """True for PUT_OK."""
        return self.status is PutMessageStatus.PUT_OK


@dataclass(slots=True)
class GetMessageResult:
    """Answer of `MessageStore.get_message`.

    Attributes:
        status: The outcome.
        next_begin_offset: Where the consumer should pull next.
        min_offset: The queue's min logical offset.
        max_offset: The queue's max logical offset (one past the last message).
        buffers: Raw commitlog records; the pull body is their concatenation.
        message_count: len(buffers).
        buffer_total_size: Sum of the buffer sizes.
        queue_offsets: Logical offset of each buffer.
        suggest_pulling_from_slave: The last record read lies further behind the
            commitlog's end than the page cache is assumed to hold
            (`access_message_in_memory_max_ratio`).
    """

    status: GetMessageStatus
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    buffers: list[bytes] = field(default_factory=list)
    message_count: int = 0
    buffer_total_size: int = 0
    queue_offsets: list[int] = field(default_factory=list)
    suggest_pulling_from_slave: bool = False


@dataclass(slots=True)
class QueryMessageResult:
    """Answer of `MessageStore.query_message` (key index lookup).

    Attributes:
        buffers: Raw records of the matches.
        index_last_update_timestamp: Store timestamp of the newest indexed record.
        index_last_update_phyoffset: Commitlog offset of the newest indexed record.
    """

    buffers: list[bytes] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0

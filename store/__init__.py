"""trimq's message store: commitlog, consume queues, index, recovery, flush and cleanup.

The broker uses `MessageStore` (``async with MessageStore(StoreConfig(...)) as store``), the
result types of `store.results` and the record codec of `store.message`.
"""

from store.config import StoreConfig
from store.errors import StoreClosedError, StoreError, StoreLockedError
from store.message_store import MessageStore
from store.results import (
    AppendMessageResult,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

__all__ = [
    "AppendMessageResult",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "StoreLockedError",
]

"""trimq's message store: commitlog, consume queues, index, recovery, flush and cleanup.

The broker uses `MessageStore` (``async with MessageStore(StoreConfig(...)) as store``), the
result types of `store.results` and the record codec of `common.message`.

The names below are imported on first use (PEP 562): importing a submodule runs this file
first, so eager imports here would load the whole engine (pydantic config, trio, structlog: a
slow import) into every tool that needs one store module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store.config import StoreConfig
    from store.errors import (
        ReplicaDataError,
        ReplicaOffsetError,
        StoreClosedError,
        StoreError,
        StoreLockedError,
    )
    from store.message_store import MessageStore
    from store.results import (
        AppendMessageResult,
        GetMessageResult,
        GetMessageStatus,
        PutMessageResult,
        PutMessageStatus,
        QueryMessageResult,
    )

_HOMES = {
    "AppendMessageResult": "store.results",
    "GetMessageResult": "store.results",
    "GetMessageStatus": "store.results",
    "MessageStore": "store.message_store",
    "PutMessageResult": "store.results",
    "PutMessageStatus": "store.results",
    "QueryMessageResult": "store.results",
    "ReplicaDataError": "store.errors",
    "ReplicaOffsetError": "store.errors",
    "StoreClosedError": "store.errors",
    "StoreConfig": "store.config",
    "StoreError": "store.errors",
    "StoreLockedError": "store.errors",
}

__all__ = [
    "AppendMessageResult",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
    "ReplicaDataError",
    "ReplicaOffsetError",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "StoreLockedError",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value

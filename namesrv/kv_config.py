"""The NameServer's KV configuration table (PUT/GET/DELETE_KV_CONFIG), held in memory.

Namespaces hold string keys and values. Real clients ask for namespace
`ORDER_TOPIC_CONFIG` (topic -> "brokerA:4;brokerB:4") when sending orderly.
"""

from __future__ import annotations

import json

NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KVConfig:
    """namespace -> key -> value."""

    __slots__ = ("_table",)

    def __init__(self) -> None:
        self._table: dict[str, dict[str, str]] = {}

    def put(self, namespace: str, key: str, value: str) -> None:
        self._table.setdefault(namespace, {})[key] = value

    def get(self, namespace: str, key: str) -> str | None:
        ns = self._table.get(namespace)
        return None if ns is None else ns.get(key)

    def delete(self, namespace: str, key: str) -> bool:
        ns = self._table.get(namespace)
        if ns is None or key not in ns:
            return False
        del ns[key]
        if not ns:
            del self._table[namespace]
        return True

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace, or None when it has no keys."""
        ns = self._table.get(namespace)
        return None if ns is None else dict(ns)

    def kv_table_json(self, namespace: str) -> bytes | None:
        """The namespace as RocketMQ's KVTable JSON (`{"table":{...}}`), or None when empty."""
        ns = self._table.get(namespace)
        if not ns:
            return None
        return json.dumps({"table": ns}, separators=(",", ":"), ensure_ascii=False).encode()

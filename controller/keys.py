"""Where the controller keeps things in etcd: every key under one root (docs/controller.md).

    <root>/leader                  the elected controller (leased; value: its id/address)
    <root>/groups/<brokerName>     one broker group's state (`controller.replicas.GroupState`
                                   JSON, which names the cluster too)

Names are percent-encoded (nothing kept but letters, digits and `-._~`), so a name holding
`/` or `%` cannot reach another key, and decoding a key gives the name back exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

__all__ = ["DEFAULT_ROOT", "KeyLayout"]

DEFAULT_ROOT = "/trimq/controller"


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The keys of one controller deployment (several can share an etcd with other roots)."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or self.root.endswith("/") or "//" in self.root:
            raise ValueError(
                f"root must be /-separated, start with / and not end with it: {self.root!r}"
            )

    @property
    def leader(self) -> bytes:
        return f"{self.root}/leader".encode()

    @property
    def groups_prefix(self) -> bytes:
        """Prefix of every group key (for `EtcdClient.get_prefix`)."""
        return f"{self.root}/groups/".encode()

    def group(self, broker_name: str) -> bytes:
        if not broker_name:
            raise ValueError("empty broker name")
        return self.groups_prefix + quote(broker_name, safe="").encode("ascii")

    def broker_name_of(self, key: bytes) -> str:
        """The broker name of a group key.

        Raises:
            ValueError: not a group key of this layout.
        """
        prefix = self.groups_prefix
        if not key.startswith(prefix) or len(key) == len(prefix):
            raise ValueError(f"not a group key under {prefix!r}: {key!r}")
        encoded = key[len(prefix) :].decode("ascii")
        if "/" in encoded:
            raise ValueError(f"not a group key under {prefix!r}: {key!r}")
        return unquote(encoded, errors="strict")

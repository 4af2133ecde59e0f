"""Subscription (consumer) group configs, persisted in `config/subscriptionGroup.json`."""

from __future__ import annotations

from pathlib import Path

import structlog

from broker._persist import CONFIG_DIR, SUBSCRIPTION_GROUP_FILE, read_json_file, write_atomically
from broker.topic_manager import MAX_QUEUE_NUMS, bump, now_ms, validate_group
from remoting.protocol.bodies import SubscriptionGroupConfig, SubscriptionGroupWrapper
from remoting.protocol.route import DataVersion

log = structlog.get_logger()

# Groups RocketMQ brokers create at start.
SYSTEM_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
    "CID_SYS_RMQ_TRANS",
)


class SubscriptionManager:
    """Group name -> SubscriptionGroupConfig."""

    def __init__(
        self, store_dir: Path, *, auto_create: bool = True, max_queue_nums: int = MAX_QUEUE_NUMS
    ) -> None:
        self.path = store_dir / CONFIG_DIR / SUBSCRIPTION_GROUP_FILE
        self.auto_create = auto_create
        self.max_queue_nums = max_queue_nums
        self.data_version = DataVersion(timestamp=now_ms(), counter=0)
        self._table: dict[str, SubscriptionGroupConfig] = {
            g: SubscriptionGroupConfig(g) for g in SYSTEM_GROUPS
        }
        self._forbidden: dict[str, dict[str, int]] = {}
        self.dirty = False

    def load(self) -> None:
        raw = read_json_file(self.path)
        if not isinstance(raw, dict):
            return
        try:
            wrapper = SubscriptionGroupWrapper.from_dict(raw)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("subscription_groups_unreadable", error=str(exc))
            return
        self._table.update(wrapper.subscription_group_table)
        self.data_version = DataVersion(
            timestamp=wrapper.data_version.get("timestamp", 0),
            counter=wrapper.data_version.get("counter", 0),
            state_version=wrapper.data_version.get("stateVersion", 0),
        )
        self._forbidden = wrapper.forbidden_table

    def wrapper(self) -> SubscriptionGroupWrapper:
        return SubscriptionGroupWrapper(
            dict(self._table), self.data_version.to_dict(), dict(self._forbidden)
        )

    def encode(self) -> bytes:
        return self.wrapper().to_json()

    def snapshot(self) -> bytes:
        """The file contents now; clears `dirty` (encode on the event loop, write elsewhere)."""
        self.dirty = False
        return self.encode()

    def persist(self) -> None:
        """Write the table now (blocking: from async code, write `snapshot()` in a thread)."""
        write_atomically(self.path, self.snapshot())

    def take_master(self, wrapper: SubscriptionGroupWrapper) -> bool:
        """A slave takes its master's groups when the master's data version differs; True
        when it did."""
        dv = wrapper.data_version
        version = DataVersion(
            timestamp=dv.get("timestamp", 0),
            counter=dv.get("counter", 0),
            state_version=dv.get("stateVersion", 0),
        )
        if version == self.data_version:
            return False
        self._table = dict(wrapper.subscription_group_table)
        self._forbidden = dict(wrapper.forbidden_table)
        self.data_version = version
        self.dirty = True
        return True

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._table.get(group)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config, created with defaults when auto-create is on (and the name is
        valid: it becomes the name of the group's retry and DLQ topics)."""
        cfg = self._table.get(group)
        if cfg is None and self.auto_create and validate_group(group) is None:
            cfg = SubscriptionGroupConfig(group)
            self.update(cfg)
            log.info("subscription_group_created", group=group)
        return cfg

    def check(self, cfg: SubscriptionGroupConfig) -> None:
        """Raise ValueError (the reason) unless `cfg` may be stored."""
        reason = validate_group(cfg.group_name)
        if reason is not None:
            raise ValueError(reason)
        if not 0 <= cfg.retry_queue_nums <= self.max_queue_nums:
            raise ValueError(
                f"retryQueueNums {cfg.retry_queue_nums} must be between 0 and {self.max_queue_nums}"
            )
        if cfg.retry_max_times < -1:
            raise ValueError(f"retryMaxTimes {cfg.retry_max_times} must be at least -1")

    def update(self, cfg: SubscriptionGroupConfig) -> None:
        """Create or replace a group.

        Raises:
            ValueError: a name or count the broker refuses (see `check`).
        """
        self.check(cfg)
        self._table[cfg.group_name] = cfg
        bump(self.data_version)
        self.dirty = True

    def add_missing(self, wrapper: SubscriptionGroupWrapper) -> list[str]:
        """Create the groups of `wrapper` this broker lacks (a master taking back what its
        slave kept); refused ones are logged and skipped. Returns the names created."""
        added = []
        for name, cfg in wrapper.subscription_group_table.items():
            if name in self._table:
                continue
            try:
                self.update(cfg)
            except ValueError as exc:
                log.warning("group_not_taken", group=name, error=str(exc))
                continue
            added.append(name)
        return added

    def delete(self, group: str) -> bool:
        if self._table.pop(group, None) is None:
            return False
        bump(self.data_version)
        self.dirty = True
        return True

    def groups(self) -> list[str]:
        return list(self._table)

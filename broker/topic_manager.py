"""Topic configurations of one broker: system topics, create/update/delete, auto-create on send.

Persisted in `config/topics.json` in RocketMQ's shape:
`{"dataVersion":{"counter":N,"timestamp":ms},"topicConfigTable":{name: TopicConfig}}`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import structlog

from broker._persist import CONFIG_DIR, TOPICS_FILE, read_json_file, write_atomically
from common.schedule import SCHEDULE_TOPIC
from remoting.protocol.bodies import dumps
from remoting.protocol.route import DataVersion, TopicConfig

REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"


def reply_topic(cluster: str) -> str:
    """The cluster's reply topic (request-reply), created by every broker at start."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


log = structlog.get_logger()

# PermName bits.
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

AUTO_CREATE_TOPIC_KEY = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TIMER_TOPIC = "rmq_sys_trimq_timer"  # exact delivery timestamps (broker.schedule)
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # message trace records (docs/trace.md)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"

# Topics a producer may not send to (NO_PERMISSION).
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
        TIMER_TOPIC,
    }
)

TOPIC_MAX_LENGTH = 127
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def _check_name(what: str, name: str | None, max_length: int) -> str | None:
    """None when `name` has RocketMQ's characters and at most `max_length` of them, else the
    reason (naming `what`)."""
    if not name:
        return f"the {what} name is empty"
    if len(name) > max_length:
        return f"the {what} name is longer than {max_length} characters"
    if not _TOPIC_RE.match(name):
        return f"the {what} name {name[:80]!r} contains characters outside [%|a-zA-Z0-9_-]"
    return None


def validate_topic(topic: str | None) -> str | None:
    """None when `topic` is a valid name for a client's topic, else the reason."""
    return _check_name("topic", topic, TOPIC_MAX_LENGTH)


# RocketMQ allows group names of 255 characters; trimq allows 248 so that the group's retry
# and DLQ topics (`%RETRY%<group>`, `%DLQ%<group>`) still fit one 255-byte file name.
GROUP_MAX_LENGTH = 248
# Default bound on the queues of one topic (broker setting `max_topic_queue_nums`).
MAX_QUEUE_NUMS = 1024


def validate_group(group: str | None) -> str | None:
    """None when `group` is a valid consumer or producer group name, else the reason."""
    return _check_name("group", group, GROUP_MAX_LENGTH)


def validate_offset_key(group: str | None, topic: str | None) -> str | None:
    """None when a consumer offset may be kept for (`group`, `topic`): both valid names, so
    the `topic@group` key of consumerOffset.json reads back as the same pair."""
    return validate_group(group) or validate_internal_topic(topic or "")


def validate_internal_topic(topic: str) -> str | None:
    """None when a topic the broker makes itself (`%RETRY%<group>`, ...) is a valid name:
    RocketMQ's characters, and short enough for a file name (not the 127 of a client's)."""
    return _check_name("topic", topic, GROUP_MAX_LENGTH + len("%RETRY%"))


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def now_ms() -> int:
    return int(time.time() * 1000)


def bump(dv: DataVersion) -> None:
    """Next data version: counter + 1, timestamp = now (NameServers compare it)."""
    dv.counter += 1
    dv.timestamp = now_ms()


def max_queue_nums(cfg: TopicConfig) -> int:
    return max(cfg.read_queue_nums, cfg.write_queue_nums)


class TopicManager:
    """The broker's topic table.

    Mutating methods return True (or the new config) when something changed; the caller then
    persists (`persist`) and re-registers with the NameServers. `changed` counts changes since
    the last persist.
    """

    def __init__(
        self,
        store_dir: Path,
        *,
        cluster_name: str = "DefaultCluster",
        broker_name: str = "broker-a",
        auto_create_topic_enable: bool = True,
        default_topic_queue_nums: int = 8,
        cluster_topic_enable: bool = True,
        broker_topic_enable: bool = True,
        max_queue_nums: int = MAX_QUEUE_NUMS,
        trace_topic_enable: bool = False,
    ) -> None:
        self.path = store_dir / CONFIG_DIR / TOPICS_FILE
        self.max_queue_nums = max_queue_nums
        self.auto_create_topic_enable = auto_create_topic_enable
        self.data_version = DataVersion(timestamp=now_ms(), counter=0)
        self._table: dict[str, TopicConfig] = {}
        self._system: set[str] = set()
        self.dirty = False
        self._add_system(TopicConfig(SELF_TEST_TOPIC, 1, 1))
        if auto_create_topic_enable:
            self._add_system(
                TopicConfig(
                    AUTO_CREATE_TOPIC_KEY,
                    default_topic_queue_nums,
                    default_topic_queue_nums,
                    PERM_INHERIT | PERM_READ | PERM_WRITE,
                )
            )
        cluster_perm = PERM_INHERIT | (PERM_READ | PERM_WRITE if cluster_topic_enable else 0)
        self._add_system(TopicConfig(cluster_name, 16, 16, cluster_perm))
        broker_perm = PERM_INHERIT | (PERM_READ | PERM_WRITE if broker_topic_enable else 0)
        self._add_system(TopicConfig(broker_name, 1, 1, broker_perm))
        self._add_system(TopicConfig(OFFSET_MOVED_EVENT, 1, 1))
        self._add_system(TopicConfig(SCHEDULE_TOPIC, 18, 18))
        # Half, op and timer records are the broker's own: write-only, so no consumer can
        # pull them (the broker reads them from the store directly).
        self._add_system(TopicConfig(TRANS_HALF_TOPIC, 1, 1, PERM_WRITE))
        self._add_system(TopicConfig(TRANS_OP_HALF_TOPIC, 1, 1, PERM_WRITE))
        self._add_system(TopicConfig(TIMER_TOPIC, 1, 1, PERM_WRITE))
        self._add_system(TopicConfig(TRANS_CHECK_MAX_TIME_TOPIC, 1, 1))
        # Request-reply: the cluster's reply topic (RocketMQ's TopicConfigManager creates it
        # on every broker; broker.processors.reply stores replies there).
        self._add_system(TopicConfig(reply_topic(cluster_name), 1, 1))
        if trace_topic_enable:
            # RocketMQ's traceTopicEnable: the trace topic exists from the start (1 queue,
            # readable and writable), so traced clients need no auto-create.
            self._add_system(TopicConfig(TRACE_TOPIC, 1, 1))

    def _add_system(self, cfg: TopicConfig) -> None:
        self._table[cfg.topic_name] = cfg
        self._system.add(cfg.topic_name)

    # -- persistence ------------------------------------------------------------------------
    def load(self) -> None:
        """Read `config/topics.json` (or its .bak); system topics keep their built-in settings
        except where the file has them too (as RocketMQ does)."""
        raw = read_json_file(self.path)
        if not isinstance(raw, dict):
            return
        for name, cfg in (raw.get("topicConfigTable") or {}).items():
            try:
                self._table[str(name)] = TopicConfig.from_dict(cfg)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("topic_config_skipped", topic=name, error=str(exc))
        if not self.auto_create_topic_enable and AUTO_CREATE_TOPIC_KEY in self._table:
            # A TBW102 left from a run with auto-create on must not enable it now.
            self._table[AUTO_CREATE_TOPIC_KEY] = replace(
                self._table[AUTO_CREATE_TOPIC_KEY], perm=PERM_READ | PERM_WRITE
            )
        dv = raw.get("dataVersion") or {}
        self.data_version = DataVersion(
            timestamp=int(dv.get("timestamp", 0)), counter=int(dv.get("counter", 0))
        )

    def encode(self) -> bytes:
        return dumps(
            {
                "dataVersion": self.data_version.to_dict(),
                "topicConfigTable": {k: v.to_dict() for k, v in self._table.items()},
            }
        )

    def snapshot(self) -> bytes:
        """The file contents now; clears `dirty` (encode on the event loop, write elsewhere)."""
        self.dirty = False
        return self.encode()

    def persist(self) -> None:
        """Write the table now (blocking: from async code, write `snapshot()` in a thread)."""
        write_atomically(self.path, self.snapshot())

    # -- queries ----------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        """The topic's config (treat it as read-only; change topics through `update`)."""
        return self._table.get(topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._table

    def __iter__(self) -> Iterator[TopicConfig]:
        return iter(list(self._table.values()))

    def __len__(self) -> int:
        return len(self._table)

    def is_system_topic(self, topic: str) -> bool:
        return topic in self._system or topic.startswith(SYSTEM_TOPIC_PREFIX)

    def table(self) -> dict[str, TopicConfig]:
        return dict(self._table)

    # -- changes ----------------------------------------------------------------------------
    def take_master(self, table: dict[str, TopicConfig], version: DataVersion) -> bool:
        """A slave takes its master's whole table when the master's data version differs;
        True when it did."""
        if version == self.data_version:
            return False
        self._table = dict(table)
        for name in self._system:
            self._table.setdefault(name, TopicConfig(name, 1, 1))
        self.data_version = version.copy()
        self.dirty = True
        return True

    def new_version(self) -> None:
        """The next data version with the table unchanged: what the broker registers from it
        changed (its permission)."""
        self._changed()

    def _changed(self) -> None:
        bump(self.data_version)
        self.dirty = True

    def check(self, cfg: TopicConfig) -> None:
        """Raise ValueError (the reason) unless `cfg` may be stored: a valid name (it becomes a
        directory of the store) and queue counts within 0..`max_queue_nums` (each queue is a
        directory and files)."""
        reason = validate_internal_topic(cfg.topic_name)
        if reason is not None:
            raise ValueError(reason)
        for what, n in (
            ("readQueueNums", cfg.read_queue_nums),
            ("writeQueueNums", cfg.write_queue_nums),
        ):
            if not 0 <= n <= self.max_queue_nums:
                raise ValueError(f"{what} {n} must be between 0 and {self.max_queue_nums}")

    def update(self, cfg: TopicConfig) -> bool:
        """Create or replace a topic. Returns True when it changed.

        Raises:
            ValueError: `cfg` has a name or queue count the broker refuses (see `check`).
        """
        self.check(cfg)
        old = self._table.get(cfg.topic_name)
        if old == cfg:
            return False
        self._table[cfg.topic_name] = replace(cfg)
        self._changed()
        log.info(
            "topic_updated" if old else "topic_created",
            topic=cfg.topic_name,
            read_queues=cfg.read_queue_nums,
            write_queues=cfg.write_queue_nums,
            perm=cfg.perm,
        )
        return True

    def add_missing(self, table: dict[str, TopicConfig]) -> list[str]:
        """Create the topics of `table` this broker lacks (a master taking back what its slave
        kept); existing ones stay as they are, refused ones are logged and skipped. Returns
        the names created."""
        added = []
        for name, cfg in table.items():
            if name in self._table:
                continue
            try:
                self.update(cfg)
            except ValueError as exc:
                log.warning("topic_not_taken", topic=name, error=str(exc))
                continue
            added.append(name)
        return added

    def delete(self, topic: str) -> bool:
        if self._table.pop(topic, None) is None:
            return False
        self._changed()
        log.info("topic_deleted", topic=topic)
        return True

    def create_in_send(
        self, topic: str, default_topic: str | None, client_queue_nums: int, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """The topic's config, auto-creating it from the template topic when allowed.

        The new topic gets perm = template perm without INHERIT and
        min(client_queue_nums, template write queues) queues. None when the template is missing
        or not inheritable (auto-create off).
        """
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        template = self._table.get(default_topic or AUTO_CREATE_TOPIC_KEY)
        if template is None:
            return None
        perm = template.perm
        if template.topic_name == AUTO_CREATE_TOPIC_KEY and not self.auto_create_topic_enable:
            perm = PERM_READ | PERM_WRITE
        if not perm & PERM_INHERIT:
            return None
        nums = max(0, min(client_queue_nums, template.write_queue_nums))
        cfg = TopicConfig(topic, nums, nums, perm & ~PERM_INHERIT, topic_sys_flag=topic_sys_flag)
        self.update(cfg)
        log.info("topic_auto_created", topic=topic, template=template.topic_name, queues=nums)
        return cfg

    def create_in_send_back(
        self, topic: str, queue_nums: int, perm: int = PERM_READ | PERM_WRITE, sys_flag: int = 0
    ) -> TopicConfig:
        """The config of a retry/DLQ topic, creating it with `queue_nums` queues if missing.

        Retry topics are created readable and writable; DLQ topics (`%DLQ%<group>`) write-only
        (perm 2), as RocketMQ does: update the perm to 6 to read one."""
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        # A group's retryQueueNums may come from an old file: never more queues than allowed.
        queue_nums = max(0, min(queue_nums, self.max_queue_nums))
        cfg = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=sys_flag)
        self.update(cfg)
        return cfg

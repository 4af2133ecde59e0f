"""`BrokerConfig`: every setting of `mqbroker` (TOML, `TRIMQ_*` environment, flags).

Precedence (lowest to highest): field defaults, the TOML file given with `--config`, environment
variables named `TRIMQ_<FIELD NAME IN UPPER CASE>` (e.g. `TRIMQ_BROKER_NAME=broker-b`,
`TRIMQ_NAMESRV_ADDR="10.0.0.1:9876;10.0.0.2:9876"`), command-line flags; `common.config` does
the loading, this module has the settings and their rules.

The store settings (`mapped_file_size_commitlog`, `flush_disk_type`, ...) are fields of
`BrokerConfig` too; `store_config()` passes those the `StoreConfig` knows on to it, with
`store_path_root_dir = store_dir`. Tests shrink `mapped_file_size_commitlog` and
`mapped_file_size_consume_queue` to keep files small.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from common.config import ConfigError as ConfigError  # re-exported: broker.cli catches it
from common.config import TlsClientFields, TlsServerFields, load_settings
from common.schedule import DEFAULT_MESSAGE_DELAY_LEVEL, parse_delay_levels
from remoting.tls import server_settings

if TYPE_CHECKING:
    from store.config import StoreConfig


def parse_host_port(addr: str, *, what: str = "address") -> tuple[str, int]:
    """Split `host:port`.

    Raises:
        ValueError: not of that form, or the port is outside 0-65535.
    """
    host, sep, port_text = addr.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{what} {addr!r} is not HOST:PORT")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"{what} {addr!r}: port out of range")
    return host, port


def primary_local_ip() -> str:
    """The local IP of the default route (no packet is sent), or 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.254.254.254", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class BrokerConfig(TlsServerFields, TlsClientFields):
    """All broker settings. Field names are the TOML keys (`TRIMQ_` + upper case for env vars)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- identity and network ------------------------------------------------------------
    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    namesrv_addr: str = ""
    """NameServer addresses, `;`-separated (`-n`)."""
    listen: str = "0.0.0.0:10911"
    advertise: str | None = None
    """Address published to NameServers and in message ids. Default: the listen address, with
    0.0.0.0 replaced by the primary local IP (the source address of the default route)."""
    region_id: str = "DefaultRegion"
    msgpack_headers: bool = True
    """Read trimq's msgpack headers and advertise them to trimq clients. False serves only
    RocketMQ's JSON and ROCKETMQ header codecs, as an Apache server does (a msgpack frame then
    closes its connection as an unknown serialize type)."""
    trace_on: bool = True
    metrics_listen: str = "127.0.0.1:5557"
    """Where Prometheus scrapes `/metrics` (HOST:PORT; RocketMQ's metricsPromExporterPort is
    5557); "" turns metrics off. Set explicitly (file, `TRIMQ_METRICS_LISTEN`, flag), an
    address that cannot be bound stops the start; the default one taken (several brokers on a
    host) only logs `metrics_listen_failed` and the broker runs without metrics
    (docs/metrics.md)."""

    # -- replication -----------------------------------------------------------------------
    broker_role: Literal["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"] = "ASYNC_MASTER"
    """ASYNC_MASTER answers once stored; SYNC_MASTER also waits for a slave to have the bytes;
    SLAVE copies its master (same `broker_name`, `broker_id` > 0) and takes no sends."""
    ha_listen_port: int = Field(default=0, ge=0, le=65535)
    """The port slaves replicate from; 0: the listen port + 1 (RocketMQ's 10912)."""
    ha_master_address: str | None = None
    """A slave's fixed master HA address (HOST:PORT); unset: learned from the NameServer."""
    ha_send_heartbeat_interval_ms: int = Field(default=5000, ge=1)
    ha_housekeeping_interval_ms: int = Field(default=20_000, ge=1)
    ha_transfer_batch_size: int = Field(default=32768, ge=1024, le=8 * 1024 * 1024)
    ha_max_gap_not_in_sync: int = Field(default=256 * 1024 * 1024, ge=0)
    """A slave further behind than this many bytes does not count for SYNC_MASTER sends
    (answered SLAVE_NOT_AVAILABLE)."""
    slave_timeout_ms: int = Field(default=3000, ge=1)
    """How long a SYNC_MASTER send waits for a slave before FLUSH_SLAVE_TIMEOUT."""
    slave_sync_interval_ms: int = Field(default=10_000, ge=1)
    """How often a slave copies its master's topics, groups and offsets."""
    enable_property_filter: bool = False
    """SQL92 subscriptions (RocketMQ's enablePropertyFilter): evaluated on each record's
    properties in the pull path (docs/filters.md); off, they are refused with SYSTEM_ERROR."""
    slave_read_enable: bool = False
    """A pull that reads further behind than `access_message_in_memory_max_ratio` of memory
    is answered with the group's `whichBrokerWhenConsumeSlowly` as `suggestWhichBrokerId`
    (the consumer reads from that slave next); off: always the master."""
    access_message_in_memory_max_ratio: int = Field(default=40, ge=0, le=100)
    """See store.config.StoreConfig."""

    # -- controller mode (docs/controller.md) ------------------------------------------------
    enable_controller_mode: bool = False
    """The controllers (`controller_addr`) decide this broker's role and id: it registers,
    heartbeats, and becomes master or slave as they say; `broker_role`/`broker_id` are then
    ignored (the master registers as id 0, slaves with their controller-assigned id)."""
    controller_addr: str = ""
    """Every controller's address, `;`-separated."""
    controller_heartbeat_timeout_ms: int = Field(default=10_000, ge=100)
    """How long the controllers keep this broker alive after a heartbeat."""
    broker_heartbeat_interval_ms: int = Field(default=1000, ge=10)
    sync_broker_metadata_period_ms: int = Field(default=5000, ge=10)
    """How often the broker asks the controller for its group's master and SyncStateSet."""
    check_sync_state_set_period_ms: int = Field(default=5000, ge=10)
    """How often a master drops slaves that fell behind from its SyncStateSet."""
    broker_election_priority: int = Field(default=2**31 - 1, ge=0)
    """Lower wins among equally up-to-date candidates."""
    in_sync_replicas: int = Field(default=1, ge=1)
    """Replicas (master included) that hold a message before a SYNC send is acknowledged."""
    min_in_sync_replicas: int = Field(default=1, ge=1)
    """Below this many members in the SyncStateSet, sends are refused, not acknowledged."""
    all_ack_in_sync_state_set: bool = False
    """A SYNC send waits for every SyncStateSet member (else for `in_sync_replicas`)."""
    ha_max_time_slave_not_catchup_ms: int = Field(default=15_000, ge=1)
    """A slave not caught up with the master for this long leaves the SyncStateSet."""

    # -- access control (docs/security.md) ---------------------------------------------------
    acl_enable: bool = False
    """Check every request against the accounts of `acl_file` (RocketMQ's plain ACL)."""
    acl_file: str | None = None
    """The plain_acl.yml; reloaded when it changes (a bad file keeps the last good one)."""
    acl_reload_interval_ms: int = Field(default=5000, ge=100)
    acl_access_key: str | None = None
    """This broker's own account (`broker: true` in the NameServers' and peers' files): what
    it sends to NameServers and to its group's other brokers is signed with it."""
    acl_secret_key: str | None = Field(default=None, repr=False)

    # TLS: the listening port's `tls_mode` and `tls_server_*` (TlsServerFields), the broker's
    # own connections' (to NameServers, group peers, controllers, its master's HA port)
    # `tls_enable` and `tls_client_*` (TlsClientFields); common.config.

    # -- storage -------------------------------------------------------------------------
    store_dir: str = "~/store"
    flush_disk_type: Literal["ASYNC_FLUSH", "SYNC_FLUSH"] = "ASYNC_FLUSH"
    mapped_file_size_commitlog: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_interval_commitlog_ms: int = 500
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    flush_interval_index_ms: int = 10_000  # see store.config.StoreConfig
    warm_mapped_file_enable: bool = False  # see store.config.StoreConfig
    sync_flush_timeout_ms: int = 5000
    file_reserved_hours: int = 72
    delete_when: str = "04"
    disk_max_used_ratio: float = 0.75
    disk_hard_ratio: float = 0.90
    disk_check_interval_ms: int = 1000
    """How often the store's free space is read for the disk-full refusal (statvfs, in a
    worker thread); see store.config.StoreConfig."""
    clean_file_forcibly_enable: bool = False
    """Under disk pressure, also delete commitlog files holding messages a consumer group has
    not consumed yet: LOSES those acknowledged messages. Off: they go by age only
    (`file_reserved_hours`) and sends are refused (SERVICE_NOT_AVAILABLE) once the disk is
    full."""
    clean_resource_interval_ms: int = 10_000
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    message_index_enable: bool = True
    check_crc_on_recover: bool = True
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    """Delay levels, level 1 first (`common.schedule.parse_delay_levels`); at least one."""

    # -- topics and groups ---------------------------------------------------------------
    auto_create_topic_enable: bool = True
    max_topic_queue_nums: int = Field(default=1024, ge=1, le=65536)
    """Most queues a topic (and a group's retry topic, `retryQueueNums`) may have: each queue is
    a directory and files of the store. Above it, creating or updating is refused."""
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    """Queues of the TBW102 template topic (and the cap for auto-created topics)."""
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    trace_topic_enable: bool = False
    """Create the message trace topic RMQ_SYS_TRACE_TOPIC at start (RocketMQ's traceTopicEnable;
    docs/trace.md); off, traced clients' first trace send auto-creates it (if allowed)."""
    store_reply_message_enable: bool = True
    """Store request-reply replies in the cluster's reply topic as well as pushing them to the
    requester (RocketMQ's storeReplyMessageEnable; docs/request-reply.md)."""
    broker_permission: int = 6

    # -- messages ------------------------------------------------------------------------
    max_message_size: int = 4 * 1024 * 1024
    max_properties_size: int = 32767

    # -- pull ------------------------------------------------------------------------------
    long_polling_enable: bool = True
    short_polling_time_ms: int = 1000
    max_pull_msgs: int = 1024
    """Cap on messages per pull (a pull asks for maxMsgNums; it gets min(asked, this))."""
    max_pull_bytes: int = 4 * 1024 * 1024
    """Cap on record bytes per pull."""
    max_suspend_ms: int = 60_000
    """Longest a pull may be parked, whatever suspendTimeoutMillis asks."""
    max_parked_pulls: int = 100_000
    """Beyond this, a pull that finds nothing is answered PULL_NOT_FOUND at once."""

    # -- timers ----------------------------------------------------------------------------
    register_name_server_period_ms: int = 30_000
    register_timeout_ms: int = 6000
    consumer_offset_persist_interval_ms: int = 5000
    channel_idle_timeout_ms: int = 120_000
    """A connection whose client sent nothing for this long, with none of its requests in
    flight, is closed (RocketMQ's serverChannelMaxIdleTimeSeconds); 0: never."""
    channel_read_timeout_ms: int = 30_000
    """A connection that sent part of a frame and then nothing for this long is closed; 0:
    never."""
    client_scan_interval_ms: int = 10_000

    # -- delayed delivery and transactions ------------------------------------------------
    max_delay_timestamp_ahead_ms: int = 7 * 24 * 3_600_000
    """How far ahead an exact delivery time (TIMER_DELIVER_MS, ...) may be; later sends are
    refused with MESSAGE_ILLEGAL."""
    transaction_check_interval_ms: int = 60_000
    """Period of the transaction check-back pass."""
    transaction_timeout_ms: int = 6000
    """A half message is checked once older than this (or its CHECK_IMMUNITY_TIME_IN_SECONDS)."""
    transaction_check_max: int = 15
    """Checks before a half message moves to TRANS_CHECK_MAX_TIME_TOPIC."""

    # -- process ---------------------------------------------------------------------------
    gil_switch_interval_ms: float | None = None
    """`sys.setswitchinterval` that `mqbroker` sets at start: how long a thread that holds the
    GIL keeps it while another thread waits for it. None (default): 2 ms under ASYNC_FLUSH,
    Python's own 5 ms under SYNC_FLUSH (`switch_interval_s`)."""

    # -- logging ---------------------------------------------------------------------------
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool = False

    # -- runtime changes -----------------------------------------------------------------------
    broker_config_path: str | None = None
    """The TOML file `updateBrokerConfig` (UPDATE_BROKER_CONFIG) writes its changes to
    (RocketMQ's brokerConfigPath); `mqbroker --config FILE` sets it to FILE. None: runtime
    changes are not persisted. It cannot be changed at run time."""

    @field_validator("flush_disk_type", mode="before")
    @classmethod
    def _flush_alias(cls, v: object) -> object:
        if isinstance(v, str):
            low = v.strip().lower()
            if low in ("sync", "sync_flush"):
                return "SYNC_FLUSH"
            if low in ("async", "async_flush"):
                return "ASYNC_FLUSH"
        return v

    @field_validator("broker_role", mode="before")
    @classmethod
    def _role_upper(cls, v: object) -> object:
        return v.strip().upper() if isinstance(v, str) else v

    @field_validator("ha_master_address")
    @classmethod
    def _check_ha_master(cls, v: str | None) -> str | None:
        if v:
            parse_host_port(v, what="ha_master_address")
        return v or None

    @model_validator(mode="after")
    def _check_role(self) -> BrokerConfig:
        server_settings(self)  # TlsConfigError (a ValueError) names a bad TLS setting
        if self.acl_enable and not self.acl_file:
            raise ValueError("acl_enable needs acl_file")
        if (self.acl_access_key is None) != (self.acl_secret_key is None):
            raise ValueError("acl_access_key and acl_secret_key go together")
        if self.enable_controller_mode:
            if not self.controller_addrs:
                raise ValueError("enable_controller_mode needs controller_addr")
            return self  # the controllers assign the role and the id
        if self.broker_role == "SLAVE" and self.broker_id <= 0:
            raise ValueError("a SLAVE's broker_id must be > 0 (0 is its master's)")
        if self.broker_role != "SLAVE" and self.broker_id != 0:
            raise ValueError(f"a {self.broker_role}'s broker_id must be 0 (slaves have > 0)")
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        parse_host_port(v, what="listen")
        return v

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, v: str) -> str:
        if v.strip():
            parse_host_port(v, what="metrics_listen")
        return v.strip()

    @field_validator("advertise")
    @classmethod
    def _check_advertise(cls, v: str | None) -> str | None:
        if v:
            host, _ = parse_host_port(v, what="advertise")
            if host in ("0.0.0.0", "::"):
                raise ValueError("advertise must be an address clients can reach, not 0.0.0.0")
        return v or None

    @field_validator("controller_addr")
    @classmethod
    def _check_controllers(cls, v: str) -> str:
        for addr in v.split(";"):
            if addr.strip():
                parse_host_port(addr, what="controller address")
        return v

    @field_validator("namesrv_addr")
    @classmethod
    def _check_namesrv(cls, v: str) -> str:
        for addr in v.split(";"):
            if addr.strip():
                parse_host_port(addr, what="namesrv address")
        return v

    @field_validator("message_delay_level")
    @classmethod
    def _check_delay_levels(cls, v: str) -> str:
        if not parse_delay_levels(v):
            raise ValueError("needs at least one level")
        return v

    @field_validator("transaction_check_interval_ms")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("must be positive")
        return v

    @field_validator("gil_switch_interval_ms")
    @classmethod
    def _switch_interval(cls, v: float | None) -> float | None:
        if v is not None and not 0.01 <= v <= 1000:
            raise ValueError("must be between 0.01 and 1000 ms")
        return v

    @field_validator("broker_name", "broker_cluster_name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not v or len(v) > 127 or any(c.isspace() for c in v):
            raise ValueError("must be 1-127 characters without spaces")
        return v

    @field_validator(
        "broker_id",
        "default_topic_queue_nums",
        "max_message_size",
        "max_pull_msgs",
        "max_pull_bytes",
        "max_parked_pulls",
        "short_polling_time_ms",
        "register_name_server_period_ms",
        "consumer_offset_persist_interval_ms",
        "channel_idle_timeout_ms",
        "channel_read_timeout_ms",
        "client_scan_interval_ms",
        "mapped_file_size_commitlog",
        "mapped_file_size_consume_queue",
        "max_delay_timestamp_ahead_ms",
        "transaction_timeout_ms",
        "transaction_check_max",
    )
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must not be negative")
        return v

    # -- derived -----------------------------------------------------------------------------
    @property
    def switch_interval_s(self) -> float:
        """The GIL switch interval `mqbroker` runs with, in seconds.

        Under ASYNC_FLUSH the default is 2 ms, not Python's 5 ms. The broker's worker threads
        (flushes, the checkpoint, page pre-faulting) wake while the event loop is busy and
        wait for the GIL; Python makes the loop hand it over only after the interval, and the
        loop then waits its turn behind them, so a shorter interval shortens the latency tail.
        Under SYNC_FLUSH the group commit's thread wants the GIL at every round, and a shorter
        interval forces more hand-offs and costs throughput: Python's default stays.
        (docs/design-notes.md, "GIL switch interval")
        """
        if self.gil_switch_interval_ms is not None:
            return self.gil_switch_interval_ms / 1000
        return 0.002 if self.flush_disk_type == "ASYNC_FLUSH" else 0.005

    @property
    def namesrv_addrs(self) -> list[str]:
        """The NameServer addresses as a list (empty entries dropped)."""
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_host_port(self.listen)

    @property
    def controller_addrs(self) -> list[str]:
        """The controller addresses as a list (empty entries dropped)."""
        return [a.strip() for a in self.controller_addr.split(";") if a.strip()]

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    def ha_port(self, bound_port: int) -> int:
        """The HA listen port, given the port the broker bound: `ha_listen_port`, or that + 1."""
        return self.ha_listen_port or bound_port + 1

    def advertise_addr(self, bound_port: int | None = None) -> str:
        """`host:port` published to NameServers.

        Args:
            bound_port: the port actually bound (when `listen` asked for port 0).
        """
        if self.advertise:
            return self.advertise
        host, port = self.listen_host_port
        if host in ("0.0.0.0", "", "::"):
            host = primary_local_ip()
        if port == 0 and bound_port is not None:
            port = bound_port
        return f"{host}:{port}"

    @property
    def store_path(self) -> Path:
        return Path(os.path.expanduser(self.store_dir))

    def store_config(self) -> StoreConfig:
        """The `StoreConfig` for this broker: the store fields it knows, taken from here."""
        from store.config import StoreConfig

        values: dict[str, Any] = {"store_path_root_dir": str(self.store_path)}
        mine = type(self).model_fields
        for name in StoreConfig.model_fields:
            if name in mine and name != "store_path_root_dir":
                values[name] = getattr(self, name)
        return StoreConfig(**values)


def load_config(
    config_file: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Build the configuration: defaults < TOML file < environment < flags.

    Args:
        config_file: a TOML file of `field = value` lines (a `[broker]` table also works).
        flags: command-line values; None entries are ignored.
        environ: the environment (default `os.environ`).

    Raises:
        ConfigError: unreadable file, bad TOML, unknown setting, or invalid value; an invalid
            value's message names the config file (or "defaults"), not the layer it came from.
    """
    return load_settings(
        BrokerConfig, "broker", config_file, flags=flags, environ=environ, error_source="file"
    )


# -- runtime changes (UPDATE_BROKER_CONFIG) -------------------------------------------------------
# The settings the broker reads on every use (or that `broker.processors.admin_more` hands on
# to the component that holds a copy), so a change takes effect at once. Every other setting
# (ports, paths, role, flush type, sizes of files and pools, names) needs a restart.
RUNTIME_KEYS: frozenset[str] = frozenset(
    {
        "auto_create_topic_enable",
        "auto_create_subscription_group",
        "slave_read_enable",
        "long_polling_enable",
        "short_polling_time_ms",
        "max_suspend_ms",
        "max_pull_msgs",
        "max_pull_bytes",
        "max_message_size",
        "max_properties_size",
        "max_delay_timestamp_ahead_ms",
        "enable_property_filter",
        "broker_permission",
        "file_reserved_hours",
        "disk_max_used_ratio",
        "disk_hard_ratio",
        "clean_file_forcibly_enable",
    }
)

# Ranges a runtime change must stay in (the start-up checks are looser): a value outside would
# refuse every send or pull, or make no sense (a permission, a disk ratio).
_RUNTIME_RANGES: dict[str, tuple[float, float]] = {
    "max_message_size": (1, 1024 * 1024 * 1024),
    "max_properties_size": (1, 32767),
    "max_pull_msgs": (1, 65536),
    "max_pull_bytes": (1, 2**31 - 1),
    "short_polling_time_ms": (0, 3_600_000),
    "max_suspend_ms": (0, 3_600_000),
    "broker_permission": (0, 7),
    "file_reserved_hours": (0, 24 * 365 * 10),
    "disk_max_used_ratio": (0.01, 1.0),
    "disk_hard_ratio": (0.01, 1.0),
}

# RocketMQ's names where trimq's differ: name -> (field, convert RocketMQ's value text).
_ROCKETMQ_ALIASES: dict[str, tuple[str, Any]] = {
    "fileReservedTime": ("file_reserved_hours", str),
    "diskMaxUsedSpaceRatio": ("disk_max_used_ratio", lambda v: str(int(v) / 100)),
    "maxTransferCountOnMessageInMemory": ("max_pull_msgs", str),
    "maxTransferBytesOnMessageInMemory": ("max_pull_bytes", str),
}


def _snake(name: str) -> str:
    out = []
    for ch in name:
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def runtime_changes(config: BrokerConfig, pairs: Mapping[str, str]) -> dict[str, Any]:
    """Check `key -> value text` pairs (RocketMQ's camelCase names, trimq's snake_case ones, or
    RocketMQ's own names where they differ) against `config` and return `field -> new value`,
    validated as the model validates a setting. Nothing is changed.

    Raises:
        KeyError: an unknown setting (the message names it).
        PermissionError: a known setting that cannot change at run time.
        ValueError: a value the setting refuses.
    """
    out: dict[str, Any] = {}
    probe = config.model_copy()
    for key, text in pairs.items():
        raw: str = text.strip()
        if key in _ROCKETMQ_ALIASES:
            name, convert = _ROCKETMQ_ALIASES[key]
            try:
                raw = convert(raw)
            except ValueError:
                raise ValueError(f"{key}: bad value {text!r}") from None
        else:
            name = _snake(key.strip())
        if name not in BrokerConfig.model_fields:
            raise KeyError(f"unknown broker setting {key!r}")
        if name not in RUNTIME_KEYS:
            raise PermissionError(
                f"the broker setting {key!r} cannot be changed at run time (restart the broker "
                f"with it in its config file); changeable: "
                + ", ".join(sorted(_camel(k) for k in RUNTIME_KEYS))
            )
        try:
            setattr(probe, name, raw)
        except ValueError as exc:
            first = exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)
            raise ValueError(f"{key}={text!r}: {first}") from None
        value = getattr(probe, name)
        lo, hi = _RUNTIME_RANGES.get(name, (None, None))
        if lo is not None and hi is not None and not lo <= value <= hi:
            raise ValueError(f"{key}={text!r}: must be between {lo:g} and {hi:g}")
        if name == "max_message_size" and value >= config.mapped_file_size_commitlog:
            raise ValueError(
                f"{key}={text!r}: must be below the commitlog file size "
                f"({config.mapped_file_size_commitlog})"
            )
        out[name] = value
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def update_toml_text(text: str, changes: Mapping[str, Any], table: str = "broker") -> str:
    """`text` (a broker config file) with each `field = value` of `changes` set: the line that
    sets it replaced in place (in the `[broker]` table when the file has one and sets it there,
    else at the top level), or a new line added at the end of the top level. Comments and every
    other line are kept.

    Raises:
        ValueError: `text` is not valid TOML, or the result does not read back as `changes`.
    """
    import re
    import tomllib

    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"the config file is not valid TOML: {exc}") from exc
    lines = text.splitlines()
    header = re.compile(r"^\s*\[")
    for name, value in changes.items():
        setter = re.compile(rf"^\s*{re.escape(name)}\s*=")
        section = ""
        top_end = len(lines)
        found: int | None = None
        in_table: int | None = None
        for i, line in enumerate(lines):
            if header.match(line):
                if not section:
                    top_end = min(top_end, i)
                section = line.strip().strip("[]").strip()
                continue
            if setter.match(line):
                if section == table:
                    in_table = i
                elif not section:
                    found = i
        target = in_table if in_table is not None else found
        new_line = f"{name} = {_toml_value(value)}"
        if target is not None:
            lines[target] = new_line
        else:
            while top_end > 0 and not lines[top_end - 1].strip():
                top_end -= 1
            lines.insert(top_end, new_line)
    out = "\n".join(lines) + "\n"

    def settings(data: dict[str, Any]) -> dict[str, Any]:
        if isinstance(data.get(table), dict):
            return {**{k: v for k, v in data.items() if k != table}, **data[table]}
        return data

    old, new = settings(before), settings(tomllib.loads(out))
    for name, value in changes.items():
        if new.get(name) != value:
            raise ValueError(f"rewriting the config file did not set {name} to {value!r}")
    # Line edits must not touch anything else (a look-alike line inside a multi-line string).
    if {k: v for k, v in new.items() if k not in changes} != {
        k: v for k, v in old.items() if k not in changes
    }:
        raise ValueError("rewriting the config file would change other settings")
    return out

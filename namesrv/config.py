"""`NamesrvConfig`: settings of `mqnamesrv` from TOML, `TRIMQ_*` environment variables and flags.

Precedence (lowest to highest): field defaults, the TOML file given with
`--config`, environment variables named `TRIMQ_<FIELD NAME IN UPPER CASE>`
(e.g. `TRIMQ_LISTEN=0.0.0.0:9876`, `TRIMQ_BROKER_CHANNEL_EXPIRED_TIME_MS=1500`),
command-line flags. Unknown keys in the file are errors; `TRIMQ_*` variables
that name no NameServer setting are ignored (brokers and clients share the prefix).
`common.config` does the loading; this module has the settings and their rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from common.config import ConfigError as ConfigError  # re-exported: namesrv.cli catches it
from common.config import TlsServerFields, load_settings
from remoting.tls import server_settings


def parse_host_port(addr: str) -> tuple[str, int]:
    """Split `host:port`.

    Raises:
        ValueError: not of that form, or the port is outside 0-65535.
    """
    host, sep, port_text = addr.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{addr!r} is not HOST:PORT")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"{addr!r}: port out of range")
    return host.strip("[]"), port


class NamesrvConfig(TlsServerFields):
    """All NameServer settings. Field names are the TOML keys (`TRIMQ_` + upper case for env)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    listen: str = "127.0.0.1:9876"
    """Address to listen on; port 0 picks a free port."""
    scan_not_active_broker_interval_ms: int = 10_000
    """How often silent brokers are looked for."""
    broker_channel_expired_time_ms: int = 120_000
    """A broker silent for longer than this is removed."""
    order_message_enable: bool = False
    """Add `orderTopicConf` (KV namespace ORDER_TOPIC_CONFIG) to route answers."""
    channel_idle_timeout_ms: int = Field(default=120_000, ge=0)
    """A connection whose peer sent nothing for this long, with none of its requests in flight,
    is closed (RocketMQ's serverChannelMaxIdleTimeSeconds); 0: never."""
    channel_read_timeout_ms: int = Field(default=30_000, ge=0)
    """A connection that sent part of a frame and then nothing for this long is closed; 0:
    never."""
    msgpack_headers: bool = True
    """Read trimq's msgpack headers and advertise them to trimq clients. False serves only
    RocketMQ's JSON and ROCKETMQ header codecs, as an Apache server does (a msgpack frame then
    closes its connection as an unknown serialize type)."""
    acl_enable: bool = False
    """Check every request against the accounts of `acl_file` (docs/security.md): route
    changes need a broker or admin account."""
    acl_file: str | None = None
    """The plain_acl.yml; reloaded when it changes (a bad file keeps the last good one)."""
    acl_reload_interval_ms: int = Field(default=5000, ge=100)
    acl_open_route_reads: bool = True
    """With ACL on, route queries need no account (clients look brokers up before anything
    else); False: any valid account."""
    metrics_listen: str = "127.0.0.1:5558"
    """Where Prometheus scrapes `/metrics` (HOST:PORT); "" turns metrics off. Set explicitly,
    an address that cannot be bound stops the start; the default one taken only logs
    `metrics_listen_failed` (docs/metrics.md)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool = False

    @model_validator(mode="after")
    def _check_acl(self) -> NamesrvConfig:
        server_settings(self)  # TlsConfigError (a ValueError) names a bad TLS setting
        if self.acl_enable and not self.acl_file:
            raise ValueError("acl_enable needs acl_file")
        return self

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        parse_host_port(v)
        return v

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, v: str) -> str:
        if v.strip():
            parse_host_port(v)
        return v.strip()

    @field_validator("scan_not_active_broker_interval_ms", "broker_channel_expired_time_ms")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("must be positive")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_host_port(self.listen)


def load_config(
    config_file: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NamesrvConfig:
    """Build the configuration: defaults < TOML file < environment < flags.

    Args:
        config_file: a TOML file of `field = value` lines (a `[namesrv]` table also works).
        flags: command-line values; None entries are ignored.
        environ: the environment (default `os.environ`).

    Raises:
        ConfigError: unreadable file, bad TOML, unknown setting, or invalid value; an invalid
            value's message names every layer that gave values ("defaults, f.toml,
            environment, flags").
    """
    return load_settings(NamesrvConfig, "namesrv", config_file, flags=flags, environ=environ)


# Settings the NameServer reads on every use, so UPDATE_NAMESRV_CONFIG (318) may change them at
# run time (`namesrv.processors`); every other setting needs a restart.
RUNTIME_KEYS: frozenset[str] = frozenset({"order_message_enable", "broker_channel_expired_time_ms"})


def camel(name: str) -> str:
    """`order_message_enable` -> `orderMessageEnable` (RocketMQ's spelling on the wire)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def snake(name: str) -> str:
    """`orderMessageEnable` -> `order_message_enable`."""
    return "".join("_" + c.lower() if c.isupper() else c for c in name.strip())


def runtime_changes(config: NamesrvConfig, pairs: Mapping[str, str]) -> dict[str, Any]:
    """Check `key -> value text` pairs (camelCase or snake_case) and return `field -> new
    value`, validated as the model validates a setting. Nothing is changed.

    Raises:
        KeyError: an unknown setting.
        PermissionError: a setting that cannot change at run time.
        ValueError: a value the setting refuses.
    """
    probe = config.model_copy()
    out: dict[str, Any] = {}
    for key, text in pairs.items():
        name = snake(key)
        if name not in NamesrvConfig.model_fields:
            raise KeyError(f"unknown NameServer setting {key!r}")
        if name not in RUNTIME_KEYS:
            raise PermissionError(
                f"the NameServer setting {key!r} cannot be changed at run time (restart the "
                "NameServer with it); changeable: "
                + ", ".join(sorted(camel(k) for k in RUNTIME_KEYS))
            )
        try:
            setattr(probe, name, text.strip())
        except ValueError as exc:
            errors = getattr(exc, "errors", None)
            msg = errors()[0]["msg"] if callable(errors) else str(exc)
            raise ValueError(f"{key}={text!r}: {msg}") from None
        out[name] = getattr(probe, name)
    return out

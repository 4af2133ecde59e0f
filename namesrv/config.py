"""`NamesrvConfig`: settings of `mqnamesrv` from TOML, `TRIMQ_*` environment variables and flags.

Precedence (lowest to highest): field defaults, the TOML file given with
`--config`, environment variables named `TRIMQ_<FIELD NAME IN UPPER CASE>`
(e.g. `TRIMQ_LISTEN=0.0.0.0:9876`, `TRIMQ_BROKER_CHANNEL_EXPIRED_TIME_MS=1500`),
command-line flags. Unknown keys in the file are errors; `TRIMQ_*` variables
that name no NameServer setting are ignored (brokers and clients share the prefix).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "TRIMQ_"


class ConfigError(Exception):
    """The configuration is invalid; the message says which setting and why."""


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


class NamesrvConfig(BaseModel):
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
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool = False

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        parse_host_port(v)
        return v

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


def _format_validation_error(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = "unknown setting" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return f"invalid namesrv configuration ({source}): " + "; ".join(parts)


def env_overrides(environ: Mapping[str, str]) -> dict[str, str]:
    """Settings from `TRIMQ_*` variables that name a NamesrvConfig field."""
    fields = NamesrvConfig.model_fields
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX) :].lower()
            if name in fields:
                out[name] = value
    return out


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
        ConfigError: unreadable file, bad TOML, unknown setting, or invalid value.
    """
    values: dict[str, Any] = {}
    sources = ["defaults"]
    if config_file is not None:
        path = Path(config_file)
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        if isinstance(data.get("namesrv"), dict):
            data = {**{k: v for k, v in data.items() if k != "namesrv"}, **data["namesrv"]}
        values.update(data)
        sources.append(str(path))
    env = env_overrides(os.environ if environ is None else environ)
    if env:
        sources.append("environment")
    values.update(env)
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    if given:
        sources.append("flags")
    values.update(given)
    try:
        return NamesrvConfig(**values)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, ", ".join(sources))) from None

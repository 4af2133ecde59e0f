"""Loading a program's settings into its pydantic model: TOML file, environment, flags.

Precedence (lowest to highest): the model's field defaults, the TOML file (top-level keys, and a
table named after the program, e.g. `[broker]`, over them), environment variables named
`TRIMQ_<FIELD NAME IN UPPER CASE>`, command-line flags (None values are not given). Unknown keys
in the file are errors (the models forbid extras); `TRIMQ_*` variables that name no field of the
model are ignored, because the NameServer, brokers and clients share the prefix.

Each program keeps its model and the rules of its own settings (`broker.config`,
`namesrv.config`) and loads it with `load_settings`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

__all__ = [
    "ENV_PREFIX",
    "ConfigError",
    "TlsServerFields",
    "env_overrides",
    "format_validation_error",
    "load_settings",
]

ENV_PREFIX = "TRIMQ_"

ModelT = TypeVar("ModelT", bound=BaseModel)


class ConfigError(Exception):
    """The configuration is invalid; the message says which setting and why."""


def parse_properties(text: str) -> dict[str, str]:
    """`key=value` lines (Java properties text: `#`/`!` comments, `=` or `:`), in order: the
    bodies of UPDATE_BROKER_CONFIG and UPDATE_NAMESRV_CONFIG.

    Raises:
        ValueError: a line without a separator or with an empty key.
    """
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise ValueError(f"not a key=value line: {line!r}")
        out[line[:cut].strip()] = line[cut + 1 :].strip()
    return out


def env_overrides(model: type[BaseModel], environ: Mapping[str, str]) -> dict[str, str]:
    """Settings from `TRIMQ_*` variables that name a field of `model` (others are ignored).

    Args:
        model: The settings model.
        environ: The environment.

    Returns:
        Field name -> the variable's text (the model converts it).
    """
    fields = model.model_fields
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX) :].lower()
            if name in fields:
                out[name] = value
    return out


def format_validation_error(exc: ValidationError, program: str, source: str) -> str:
    """One line naming every bad setting: `invalid <program> configuration (<source>): ...`.

    Args:
        exc: The model's validation error.
        program: "broker", "namesrv", ...
        source: Where the values came from, as the message shows it.
    """
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = "unknown setting" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return f"invalid {program} configuration ({source}): " + "; ".join(parts)


def _read_toml(path: Path, table: str) -> dict[str, Any]:
    """The file's settings, with those of a `[table]` table merged over the top-level ones.

    Raises:
        ConfigError: the file cannot be read or is not valid TOML.
    """
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    if isinstance(data.get(table), dict):
        data = {**{k: v for k, v in data.items() if k != table}, **data[table]}
    return data


def load_settings(
    model: type[ModelT],
    program: str,
    config_file: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    error_source: Literal["layers", "file"] = "layers",
) -> ModelT:
    """Build `model` from defaults < TOML file < environment < flags.

    Args:
        model: The settings model (pydantic, extras forbidden).
        program: The program's name: its table in the TOML file and the word in error messages
            ("broker", "namesrv").
        config_file: A TOML file of `field = value` lines, or None.
        flags: Command-line values; None entries are ignored.
        environ: The environment (default `os.environ`).
        error_source: What an invalid-value message names in parentheses. "layers": every
            layer that gave values, in order ("defaults, n.toml, environment, flags");
            "file": the config file alone, or "defaults" without one.

    Returns:
        The validated settings.

    Raises:
        ConfigError: unreadable file, bad TOML, unknown setting, or invalid value.
    """
    values: dict[str, Any] = {}
    layers = ["defaults"]
    if config_file is not None:
        path = Path(config_file)
        values.update(_read_toml(path, program))
        layers.append(str(path))
    file_source = layers[-1]
    env = env_overrides(model, os.environ if environ is None else environ)
    if env:
        layers.append("environment")
    values.update(env)
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    if given:
        layers.append("flags")
    values.update(given)
    try:
        return model(**values)
    except ValidationError as exc:
        source = ", ".join(layers) if error_source == "layers" else file_source
        raise ConfigError(format_validation_error(exc, program, source)) from None


class TlsClientFields(BaseModel):
    """TLS settings of a server's own connections to other servers (RocketMQ's `tls.enable`
    and `tls.client.*`; docs/security.md), shared by the broker's and the controller's models;
    `remoting.tls.client_settings` turns them into `TlsClientSettings`."""

    tls_enable: bool | None = None
    """Connect with TLS; None: when `tls_mode` is enforcing (RocketMQ's tls.enable)."""
    tls_client_trust_cert_path: str | None = None
    """CA certificates for the servers connected to; None: the system store."""
    tls_client_verify_server: bool = True
    tls_client_check_hostname: bool = True
    tls_client_cert_path: str | None = None
    tls_client_key_path: str | None = None
    tls_client_key_password: str | None = Field(default=None, repr=False)


class TlsServerFields(BaseModel):
    """TLS settings of a server's remoting port (RocketMQ's `tls.server.*`; docs/security.md),
    shared by the broker's and the NameServer's models."""

    tls_mode: Literal["disabled", "permissive", "enforcing"] = "disabled"
    """`permissive` serves TLS and plain on one port (told apart by the first byte);
    `enforcing` TLS only."""
    tls_server_cert_path: str | None = None
    tls_server_key_path: str | None = None
    """None: the key is in the certificate file."""
    tls_server_key_password: str | None = Field(default=None, repr=False)
    tls_server_need_client_auth: Literal["none", "optional", "require"] = "none"
    tls_server_trust_cert_path: str | None = None
    """The CA certificates client certificates are checked against."""
    tls_handshake_timeout_ms: int = Field(default=10_000, ge=1)
    tls_reload_interval_ms: int = Field(default=5000, ge=100)

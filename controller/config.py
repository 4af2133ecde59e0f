"""`ControllerConfig`: the settings of one `mqcontroller` process: defaults < TOML file
(`--config`) < `TRIMQ_<FIELD>` environment variables < flags (`common.config`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from common.acl import RequestSigner
from common.config import TlsClientFields, TlsServerFields, load_settings
from controller.keys import DEFAULT_ROOT
from remoting.tls import TlsClientSettings, client_settings, server_settings

__all__ = ["ControllerConfig", "load_config"]


class ControllerConfig(TlsServerFields, TlsClientFields):
    """One controller process; several share one etcd and elect a leader there.

    The remoting port's TLS settings are `tls_mode` and `tls_server_*` (`common.config`), as
    the broker's and the NameServer's."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    listen: str = "0.0.0.0:9878"
    """Where brokers and admins reach this controller (RocketMQ's DLedger peer port)."""
    advertise: str | None = None
    """The address told as the leader's (default: `listen`, 0.0.0.0 as 127.0.0.1)."""
    etcd_endpoints: str = "http://127.0.0.1:2379"
    """etcd client URLs, `;`-separated."""
    etcd_root: str = DEFAULT_ROOT
    etcd_timeout_ms: int = Field(default=1500, ge=100)
    """Bound of one etcd call (all endpoints): at most a third of the lease ttl."""
    lease_ttl_s: int = Field(default=5, ge=2, le=60)
    """Leadership lease: a dead leader is replaced after about this long."""
    broker_heartbeat_timeout_ms: int = Field(default=10_000, ge=100)
    """A broker silent this long is dead, unless its heartbeat names another timeout
    (RocketMQ's controllerHeartBeatTimeoutMills)."""
    scan_inactive_master_interval_ms: int = Field(default=5000, ge=50)
    """How often the leader looks for groups whose master died."""
    enable_elect_unclean_master: bool = False
    """Elect a live replica outside the SyncStateSet when no member is alive: LOSES what it
    had not copied. Off: such a group stays without master until a member returns."""
    notify_broker_role_changed: bool = True
    """Tell a group's live replicas at once (NOTIFY_BROKER_ROLE_CHANGED) after an election."""

    # -- access control (docs/security.md) ---------------------------------------------------
    acl_enable: bool = False
    """Check every request against the accounts of `acl_file`: what brokers send needs a
    broker (or admin) account, a designated election and the controller's administration
    codes an admin account, reads any account."""
    acl_file: str | None = None
    """The plain_acl.yml; reloaded when it changes (a bad file keeps the last good one)."""
    acl_reload_interval_ms: int = Field(default=5000, ge=100)
    acl_access_key: str | None = None
    """The controller's own account (`broker: true` in the brokers' files): what it sends to
    brokers (NOTIFY_BROKER_ROLE_CHANGED) is signed with it."""
    acl_secret_key: str | None = Field(default=None, repr=False)

    # TLS of the controller's own connections (to brokers): `tls_enable`, `tls_client_*`
    # (TlsClientFields, common.config).

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool = False

    @model_validator(mode="after")
    def _check_security(self) -> ControllerConfig:
        server_settings(self)  # TlsConfigError (a ValueError) names a bad TLS setting
        self.client_tls()
        if self.acl_enable and not self.acl_file:
            raise ValueError("acl_enable needs acl_file")
        if (self.acl_access_key is None) != (self.acl_secret_key is None):
            raise ValueError("acl_access_key and acl_secret_key go together")
        return self

    def client_tls(self) -> TlsClientSettings | None:
        """TLS of the controller's connections to brokers; None: plain.

        Raises:
            TlsConfigError: an inconsistent combination (a key without a certificate).
        """
        return client_settings(self)

    def request_signer(self) -> RequestSigner | None:
        """The signer of what the controller sends, when it has an account."""
        if self.acl_access_key is None or self.acl_secret_key is None:
            return None
        return RequestSigner(self.acl_access_key, self.acl_secret_key)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{v!r} is not HOST:PORT")
        return v

    @property
    def endpoints(self) -> list[str]:
        return [e.strip() for e in self.etcd_endpoints.split(";") if e.strip()]

    def address(self, bound_port: int) -> str:
        if self.advertise:
            return self.advertise
        host = self.listen.rpartition(":")[0]
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        return f"{host}:{bound_port}"


def load_config(
    config_file: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ControllerConfig:
    """Build the configuration (see the module docstring).

    Raises:
        common.config.ConfigError: unreadable file, unknown setting or invalid value.
    """
    return load_settings(ControllerConfig, "controller", config_file, flags=flags, environ=environ)

"""Client options (one pydantic model, validated once when a client starts)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from client.fault import LATENCY_MAX_MS, NOT_AVAILABLE_DURATION_MS, check_fault_tables
from common.acl import RequestSigner
from remoting.tls import TlsClientSettings

# Credentials of a cluster with ACL on (docs/security.md), read when the options do not name
# them.
ACCESS_KEY_ENV = "TRIMQ_ACCESS_KEY"
SECRET_KEY_ENV = "TRIMQ_SECRET_KEY"
# TLS (docs/security.md, "TLS"), read when the options do not set them: `use_tls` is
# RocketMQ's `useTLS` (`-Dtls.enable`), the others its `tls.client.*` properties.
USE_TLS_ENV = "TRIMQ_USE_TLS"
TLS_ENV = {
    "tls_trust_cert_path": "TRIMQ_TLS_TRUST_CERT_PATH",
    "tls_verify_server": "TRIMQ_TLS_VERIFY_SERVER",
    "tls_check_hostname": "TRIMQ_TLS_CHECK_HOSTNAME",
    "tls_server_hostname": "TRIMQ_TLS_SERVER_HOSTNAME",
    "tls_cert_path": "TRIMQ_TLS_CERT_PATH",
    "tls_key_path": "TRIMQ_TLS_KEY_PATH",
    "tls_key_password": "TRIMQ_TLS_KEY_PASSWORD",
}
# The TLS options that only mean something with use_tls on.
_TLS_ONLY = (
    "tls_trust_cert_path",
    "tls_server_hostname",
    "tls_cert_path",
    "tls_key_path",
    "tls_key_password",
)


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _default_client_ip() -> str:
    """The address other hosts most likely reach us on (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


SerializeTypeName = Literal["auto", "json", "rocketmq", "msgpack"]
SERIALIZE_TYPE_NAMES: tuple[str, ...] = ("auto", "json", "rocketmq", "msgpack")


class ClientConfig(BaseModel):
    """Options shared by producers, consumers and the admin client.

    Defaults are RocketMQ 4.x's (`ClientConfig`, `DefaultMQProducer`,
    `DefaultMQPushConsumer`). Intervals are in milliseconds.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    namesrv_addr: str = Field(
        default_factory=lambda: os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
        description="NameServer addresses separated by ';'",
    )
    instance_name: str = Field(default_factory=lambda: str(os.getpid()))
    client_ip: str = Field(default_factory=_default_client_ip)
    unit_name: str | None = None
    serialize_type: SerializeTypeName = Field(
        default="auto",
        description=(
            "header codec: 'auto' starts every connection in JSON (which any RocketMQ server "
            "reads) and moves it to trimq's msgpack when the server says it reads it; 'json', "
            "'rocketmq' (RocketMQ's binary codec) or 'msgpack' fix it"
        ),
    )
    mq_client_api_timeout_ms: int = Field(default=3000, gt=0)
    access_key: str | None = Field(
        default_factory=lambda: os.environ.get(ACCESS_KEY_ENV) or None,
        description=(
            "ACL account (RocketMQ's AccessKey): with secret_key, every request is signed as "
            "RocketMQ clients sign them; default: the TRIMQ_ACCESS_KEY environment variable"
        ),
    )
    secret_key: str | None = Field(
        default_factory=lambda: os.environ.get(SECRET_KEY_ENV) or None,
        repr=False,
        description="the account's secret key; default: the TRIMQ_SECRET_KEY variable",
    )
    # Defaults from the environment are validated like given values (`validate_default`),
    # so TRIMQ_USE_TLS=yes is True and TRIMQ_USE_TLS=maybe an error naming the option.
    use_tls: bool = Field(
        default_factory=lambda: _env(USE_TLS_ENV) or False,
        validate_default=True,
        description=(
            "open every connection (NameServers and brokers) with TLS (RocketMQ's useTLS, "
            "tls.enable); default: the TRIMQ_USE_TLS variable, else false"
        ),
    )
    tls_trust_cert_path: str | None = Field(
        default_factory=lambda: _env(TLS_ENV["tls_trust_cert_path"]),
        description=(
            "PEM file of the CA certificates servers' certificates must chain to "
            "(tls.client.trustCertPath); none: the system's trust store"
        ),
    )
    tls_verify_server: bool = Field(
        default_factory=lambda: _env(TLS_ENV["tls_verify_server"]) or True,
        validate_default=True,
        description=(
            "verify the server's certificate (tls.client.authServer); false trusts any "
            "certificate, as RocketMQ's default does: encrypted but not authenticated"
        ),
    )
    tls_check_hostname: bool = Field(
        default_factory=lambda: _env(TLS_ENV["tls_check_hostname"]) or True,
        validate_default=True,
        description=(
            "with tls_verify_server, the certificate must name the host connected to (DNS "
            "name, or IP address: broker addresses from routes are IPs); false checks the "
            "chain only, as RocketMQ's Java client does"
        ),
    )
    tls_server_hostname: str | None = Field(
        default_factory=lambda: _env(TLS_ENV["tls_server_hostname"]),
        description="the name checked in (and sent as SNI to) every server instead of its host",
    )
    tls_cert_path: str | None = Field(
        default_factory=lambda: _env(TLS_ENV["tls_cert_path"]),
        description="the client's PEM certificate, for servers that require one (mutual TLS)",
    )
    tls_key_path: str | None = Field(
        default_factory=lambda: _env(TLS_ENV["tls_key_path"]),
        description="its PEM private key; none: in tls_cert_path",
    )
    tls_key_password: str | None = Field(
        default_factory=lambda: _env(TLS_ENV["tls_key_password"]),
        repr=False,
        description="the private key's pass phrase",
    )

    # producer
    send_timeout_ms: int = Field(default=3000, gt=0)
    retry_times_when_send_failed: int = Field(default=2, ge=0)
    retry_times_when_send_async_failed: int = Field(default=2, ge=0)
    retry_another_broker_when_not_store_ok: bool = False
    """A send answered stored-but-not-OK (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT,
    FLUSH_DISK_TIMEOUT) is tried again on another broker within the retries; the last
    answer is returned when none is SEND_OK (the message may then be stored twice)."""
    compress_over: int = Field(default=4096, ge=0)
    compress_level: int = Field(default=5, ge=0, le=9)
    max_message_size: int = Field(default=4 * 1024 * 1024, gt=0)
    default_topic_queue_nums: int = Field(default=4, gt=0)
    create_topic_key: str = "TBW102"
    auto_create_topic: bool = True
    send_latency_fault_enable: bool = True
    latency_max_ms: tuple[int, ...] = Field(
        default=LATENCY_MAX_MS,
        description="send latency thresholds (ms) of the fault table, non-decreasing",
    )
    not_available_duration_ms: tuple[int, ...] = Field(
        default=NOT_AVAILABLE_DURATION_MS,
        description=(
            "how long (ms) a broker is avoided after a send at least as slow as the "
            "latency_max_ms entry of the same index; a failed send counts as 30000 ms"
        ),
    )

    # timers
    poll_name_server_interval_ms: int = Field(default=30_000, gt=0)
    heartbeat_broker_interval_ms: int = Field(default=30_000, gt=0)
    persist_consumer_offset_interval_ms: int = Field(default=5_000, gt=0)
    rebalance_interval_ms: int = Field(default=20_000, gt=0)

    # consumer
    pull_batch_size: int = Field(default=32, gt=0, le=1024)
    consume_message_batch_max_size: int = Field(default=1, gt=0, le=1024)
    consume_concurrency: int = Field(default=20, gt=0)
    pull_threshold_for_queue: int = Field(default=1000, gt=0)
    pull_threshold_size_for_queue_mib: int = Field(default=100, gt=0)
    consume_concurrently_max_span: int = Field(default=2000, gt=0)
    broker_suspend_max_time_ms: int = Field(default=15_000, gt=0)
    consumer_timeout_when_suspend_ms: int = Field(default=30_000, gt=0)
    pull_time_delay_when_exception_ms: int = Field(default=3_000, ge=0)
    pull_time_delay_when_flow_control_ms: int = Field(default=50, ge=0)
    consume_timestamp: str | None = Field(
        default=None, description="yyyyMMddHHmmss; default now - 30 min"
    )
    max_reconsume_times: int = Field(
        default=-1,
        ge=-1,
        description="-1: 16 for concurrent listeners, unlimited for orderly ones",
    )
    consume_timeout_ms: int = Field(
        default=15 * 60_000, gt=0, description="a listener call longer than this is retried"
    )
    suspend_current_queue_time_ms: int = Field(default=1000, ge=0)
    offset_store_dir: str = Field(
        default_factory=lambda: os.path.join(os.path.expanduser("~"), ".trimq_offsets")
    )

    # lite pull consumer
    lite_pull_batch_size: int = Field(default=10, gt=0)
    lite_pull_poll_timeout_ms: int = Field(default=5_000, gt=0)

    # message trace (docs/trace.md)
    enable_trace: bool = Field(
        default=False,
        description=(
            "write a trace record per message sent and consumed to trace_topic in RocketMQ's "
            "trace format (RocketMQ's enableMsgTrace), batched and asynchronous"
        ),
    )
    trace_topic: str = Field(
        default="RMQ_SYS_TRACE_TOPIC",
        min_length=1,
        max_length=127,
        pattern=r"^[%|a-zA-Z0-9_-]+$",
        description="the trace topic (RocketMQ's customizedTraceTopic)",
    )
    trace_queue_size: int = Field(
        default=1024,
        gt=0,
        le=1_000_000,
        description="trace records waiting to be written; past it they are dropped and counted",
    )

    @model_validator(mode="after")
    def _check_fault_tables(self) -> ClientConfig:
        check_fault_tables(self.latency_max_ms, self.not_available_duration_ms)
        return self

    @model_validator(mode="after")
    def _check_credentials(self) -> ClientConfig:
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError(
                "access_key and secret_key go together: set both (or TRIMQ_ACCESS_KEY and "
                "TRIMQ_SECRET_KEY) to sign requests, or neither"
            )
        return self

    @model_validator(mode="after")
    def _check_tls(self) -> ClientConfig:
        if not self.use_tls:
            given = [name for name in _TLS_ONLY if name in self.model_fields_set]
            if any(getattr(self, name) is not None for name in given):
                raise ValueError(
                    f"{', '.join(given)} given but use_tls is off: set use_tls (TRIMQ_USE_TLS, "
                    "mqadmin --tls) to connect with TLS"
                )
            return self
        # The remoting settings check the combinations (a key needs its certificate).
        self.tls_settings()
        return self

    def tls_settings(self) -> TlsClientSettings | None:
        """The TLS settings of the client's connections, or None without `use_tls`.

        Raises:
            TlsConfigError: an inconsistent combination (a key without a certificate).
        """
        if not self.use_tls:
            return None
        return TlsClientSettings(
            enable=True,
            trust_cert_path=self.tls_trust_cert_path,
            verify_server=self.tls_verify_server,
            check_hostname=self.tls_check_hostname,
            server_hostname=self.tls_server_hostname,
            cert_path=self.tls_cert_path,
            key_path=self.tls_key_path,
            key_password=self.tls_key_password,
        )

    def request_signer(self) -> RequestSigner | None:
        """The signer of every request when credentials are set, else None."""
        if not self.access_key or not self.secret_key:
            return None
        return RequestSigner(self.access_key, self.secret_key)

    def namesrv_list(self) -> list[str]:
        """The NameServer addresses, in order."""
        return [a.strip() for a in self.namesrv_addr.replace(",", ";").split(";") if a.strip()]

    def client_id(self) -> str:
        """RocketMQ's client id: ip@instance[@unit]."""
        cid = f"{self.client_ip}@{self.instance_name}"
        if self.unit_name:
            cid += f"@{self.unit_name}"
        return cid

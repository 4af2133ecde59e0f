"""Options of the `rocketmq` Spark data source, parsed once into frozen dataclasses (sans-IO).

Spark hands a data source its options as a case-insensitive mapping of strings
(`.option("x", 5)` arrives as `"5"`). Everything here works on a lower-cased
copy, so `failOnDataLoss` and `failondataloss` are the same option, and every
error is a `ValueError` naming the option as users write it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from client.config import SERIALIZE_TYPE_NAMES
from client.trace import TRACE_TOPIC
from common.schedule import SCHEDULE_TOPIC

__all__ = [
    "DEFAULT_PULL_BATCH_SIZE",
    "DEFAULT_SEND_BATCH_SIZE",
    "SYSTEM_TOPICS",
    "SYSTEM_TOPIC_PREFIXES",
    "OffsetSpec",
    "SinkOptions",
    "SourceOptions",
    "TlsOptions",
    "match_topics",
    "parse_offset_spec",
    "parse_queue_key",
    "parse_sink_options",
    "parse_source_options",
]

DEFAULT_PULL_BATCH_SIZE = 1000
DEFAULT_SEND_BATCH_SIZE = 500
MAX_PULL_BATCH_SIZE = 65536

SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        SCHEDULE_TOPIC,
        "OFFSET_MOVED_EVENT",
        "SELF_TEST_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "BenchmarkTest",
    }
)
SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%", "RMQ_SYS_", "rmq_sys_")

_GROUP_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")

# `ClientConfig` TLS options as sorted (name, value) pairs: hashable, for the connection cache.
TlsOptions = tuple[tuple[str, str | bool], ...]

# Spark option (lower-cased) -> (as users write it, `ClientConfig` field, boolean?).
_TLS_OPTIONS: dict[str, tuple[str, str, bool]] = {
    "rocketmq.tls.enable": ("rocketmq.tls.enable", "use_tls", True),
    "rocketmq.tls.trustcertpath": ("rocketmq.tls.trustCertPath", "tls_trust_cert_path", False),
    "rocketmq.tls.verifyserver": ("rocketmq.tls.verifyServer", "tls_verify_server", True),
    "rocketmq.tls.checkhostname": ("rocketmq.tls.checkHostname", "tls_check_hostname", True),
    "rocketmq.tls.serverhostname": (
        "rocketmq.tls.serverHostname",
        "tls_server_hostname",
        False,
    ),
    "rocketmq.tls.certpath": ("rocketmq.tls.certPath", "tls_cert_path", False),
    "rocketmq.tls.keypath": ("rocketmq.tls.keyPath", "tls_key_path", False),
    "rocketmq.tls.keypassword": ("rocketmq.tls.keyPassword", "tls_key_password", False),
}

# A per-topic offset spec: {topic: {"broker:queue": offset}}; -2 = earliest, -1 = latest.
OffsetSpec = Literal["earliest", "latest"] | dict[str, dict[str, int]]


def _err(option: str, msg: str) -> ValueError:
    return ValueError(f"rocketmq data source: option '{option}' {msg}")


def parse_queue_key(key: str) -> tuple[str, int]:
    """Split a queue key `"brokerName:queueId"` into its parts.

    Raises:
        ValueError: no `:`, an empty broker name or a queue id that is not an integer >= 0.
    """
    broker, sep, qid = key.rpartition(":")
    if not sep or not broker or not qid.isdigit():
        raise ValueError(f"bad queue key {key!r}: expected 'brokerName:queueId'")
    return broker, int(qid)


def _opt_int(
    opts: Mapping[str, str], key: str, name: str, default: int | None, *, minimum: int
) -> int | None:
    raw = opts.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _err(name, f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise _err(name, f"must be >= {minimum}, got {value}")
    return value


def _int(opts: Mapping[str, str], key: str, name: str, default: int, *, minimum: int) -> int:
    value = _opt_int(opts, key, name, default, minimum=minimum)
    return default if value is None else value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low == "true":
        return True
    if low == "false":
        return False
    raise _err(name, f"must be 'true' or 'false', got {raw!r}")


def parse_offset_spec(raw: str, name: str, *, allowed: tuple[int, ...]) -> OffsetSpec:
    """Parse `earliest`, `latest` or the JSON form `{"T": {"broker-a:0": 23}}`.

    Args:
        raw: the option's value.
        name: the option's name, for errors.
        allowed: the negative special values accepted in JSON (-2 earliest, -1 latest).

    Raises:
        ValueError: anything else, naming the option.
    """
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    if not text.startswith("{"):
        raise _err(name, f"must be 'earliest', 'latest' or a JSON object, got {raw!r}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _err(name, f"is not valid JSON: {exc}") from None
    out: dict[str, dict[str, int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise _err(name, f"topic {topic!r} must map to an object of 'broker:queue': offset")
        per: dict[str, int] = {}
        for key, off in queues.items():
            try:
                parse_queue_key(key)
            except ValueError as exc:
                raise _err(name, str(exc)) from None
            if isinstance(off, bool) or not isinstance(off, int):
                raise _err(name, f"offset of {topic} {key} must be an integer, got {off!r}")
            if off < 0 and off not in allowed:
                allowed_s = " or ".join(str(a) for a in allowed) or "no negative value"
                raise _err(name, f"offset {off} of {topic} {key} is not allowed here ({allowed_s})")
            per[key] = off
        out[str(topic)] = per
    return out


def match_topics(pattern: re.Pattern[str], topics: list[str]) -> list[str]:
    """Topics whose whole name matches `pattern`, without system topics, sorted."""
    return sorted(
        t
        for t in topics
        if t not in SYSTEM_TOPICS
        and not t.startswith(SYSTEM_TOPIC_PREFIXES)
        and pattern.fullmatch(t)
    )


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The parsed options of a read (batch or streaming).

    Exactly one of `subscribe`, `subscribe_pattern` and `assign` is set.
    """

    namesrv_addr: str
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    assign: dict[str, tuple[str, ...]] | None
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    pull_batch_size: int
    poll_timeout_ms: int
    fetch_offset_num_retries: int
    fetch_offset_retry_interval_ms: int
    consumer_group: str | None
    sub_expression: str
    streaming: bool
    serialize_type: str = "auto"
    # ACL credentials (`rocketmq.accessKey`, `rocketmq.secretKey`); None: the executors'
    # TRIMQ_ACCESS_KEY / TRIMQ_SECRET_KEY, if any.
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    # TLS (`rocketmq.tls.*`): the `ClientConfig` options given, as sorted pairs; empty: the
    # executors' TRIMQ_USE_TLS / TRIMQ_TLS_* variables, if any.
    tls: TlsOptions = field(default=(), repr=False)

    def namesrv_list(self) -> list[str]:
        return _namesrv_list(self.namesrv_addr)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The parsed options of a write (batch or streaming)."""

    namesrv_addr: str
    topic: str | None
    producer_group: str
    send_batch_size: int
    send_msg_timeout_ms: int
    serialize_type: str = "auto"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    tls: TlsOptions = field(default=(), repr=False)
    # Message trace of the writes (`rocketmq.enableMsgTrace`, `rocketmq.traceTopic`): the
    # trace topic, or None when off (docs/trace.md).
    trace_topic: str | None = None

    def namesrv_list(self) -> list[str]:
        return _namesrv_list(self.namesrv_addr)


def _namesrv_list(addr: str) -> list[str]:
    return [a.strip() for a in addr.replace(",", ";").split(";") if a.strip()]


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's CaseInsensitiveDict already lower-cases keys; a plain dict from a test may not.
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _serialize_type(opts: Mapping[str, str]) -> str:
    raw = opts.get("rocketmq.serializetype", "auto").strip().lower()
    if raw not in SERIALIZE_TYPE_NAMES:
        names = ", ".join(repr(n) for n in SERIALIZE_TYPE_NAMES)
        raise _err("rocketmq.serializeType", f"must be one of {names}, got {raw!r}")
    return raw


def _credentials(opts: Mapping[str, str]) -> dict[str, str]:
    """`rocketmq.accessKey` and `rocketmq.secretKey`: both or neither."""
    access = opts.get("rocketmq.accesskey", "").strip()
    secret = opts.get("rocketmq.secretkey", "").strip()
    if bool(access) != bool(secret):
        missing = "rocketmq.secretKey" if access else "rocketmq.accessKey"
        raise _err(missing, "is required with the other ACL credential")
    return {"access_key": access, "secret_key": secret} if access else {}


def _tls(opts: Mapping[str, str]) -> TlsOptions:
    """`rocketmq.tls.enable` and the other `rocketmq.tls.*` options (docs/security.md, "TLS").

    Raises:
        ValueError: an unknown `rocketmq.tls.` option, a malformed boolean, or TLS options
            without `rocketmq.tls.enable=true`.
    """
    out: dict[str, str | bool] = {}
    for key, raw in opts.items():
        if not key.startswith("rocketmq.tls."):
            continue
        spec = _TLS_OPTIONS.get(key)
        if spec is None:
            known = ", ".join(name for name, _, _ in _TLS_OPTIONS.values())
            raise _err(key, f"is not a TLS option (known: {known})")
        name, config_field, boolean = spec
        if boolean:
            out[config_field] = _bool(opts, key, name, False)
        elif raw.strip():
            out[config_field] = raw.strip()
    if out.get("use_tls") is not True:
        others = [n for n, name, _ in _TLS_OPTIONS.values() if name in out and name != "use_tls"]
        if others:
            raise _err(others[0], "needs rocketmq.tls.enable=true")
    return tuple(sorted(out.items()))


def _namesrv(opts: Mapping[str, str]) -> str:
    addr = opts.get("rocketmq.namesrvaddr", "").strip()
    if not _namesrv_list(addr):
        raise _err("rocketmq.namesrvAddr", "is required (NameServer list 'host:port;host:port')")
    return addr


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate the options of `spark.read` / `spark.readStream`.

    Raises:
        ValueError: a missing or malformed option; the message names it.
    """
    opts = _lower(options)
    namesrv = _namesrv(opts)
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k, "").strip()]
    if len(chosen) != 1:
        raise ValueError(
            "rocketmq data source: set exactly one of the options 'subscribe', "
            f"'subscribePattern' or 'assign' (got {len(chosen)})"
        )
    subscribe: tuple[str, ...] | None = None
    pattern: str | None = None
    assign: dict[str, tuple[str, ...]] | None = None
    if chosen[0] == "subscribe":
        topics = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
        if not topics:
            raise _err("subscribe", "must list at least one topic")
        subscribe = tuple(dict.fromkeys(topics))
    elif chosen[0] == "subscribepattern":
        pattern = opts["subscribepattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _err("subscribePattern", f"is not a valid regular expression: {exc}") from None
    else:
        assign = _parse_assign(opts["assign"])

    start_default = "latest" if streaming else "earliest"
    start = parse_offset_spec(
        opts.get("startingoffsets", start_default),
        "startingOffsets",
        allowed=(-2, -1) if streaming else (-2,),
    )
    if not streaming and start == "latest":
        raise _err("startingOffsets", "cannot be 'latest' for a batch read")
    if streaming and "endingoffsets" in opts:
        raise _err("endingOffsets", "is for batch reads only")
    end = parse_offset_spec(opts.get("endingoffsets", "latest"), "endingOffsets", allowed=(-1,))
    if end == "earliest":
        raise _err("endingOffsets", "cannot be 'earliest'")
    max_per_trigger = _opt_int(
        opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger", None, minimum=1
    )
    if max_per_trigger is not None and not streaming:
        raise _err("maxOffsetsPerTrigger", "is for streaming reads only")
    group = opts.get("consumergroup", "").strip() or None
    if group is not None and not _GROUP_RE.match(group):
        raise _err("consumerGroup", f"has characters outside [%|a-zA-Z0-9_-]: {group!r}")
    sub_expr = opts.get("subexpression", "*").strip() or "*"
    pull_batch = _int(opts, "pullbatchsize", "pullBatchSize", DEFAULT_PULL_BATCH_SIZE, minimum=1)
    if pull_batch > MAX_PULL_BATCH_SIZE:
        raise _err("pullBatchSize", f"must be <= {MAX_PULL_BATCH_SIZE}, got {pull_batch}")
    return SourceOptions(
        namesrv_addr=namesrv,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=start,
        ending_offsets=end,
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", True),
        max_offsets_per_trigger=max_per_trigger,
        min_partitions=_opt_int(opts, "minpartitions", "minPartitions", None, minimum=1),
        pull_batch_size=pull_batch,
        poll_timeout_ms=_int(opts, "polltimeoutms", "pollTimeoutMs", 120_000, minimum=1),
        fetch_offset_num_retries=_int(
            opts, "fetchoffset.numretries", "fetchOffset.numRetries", 3, minimum=0
        ),
        fetch_offset_retry_interval_ms=_int(
            opts, "fetchoffset.retryintervalms", "fetchOffset.retryIntervalMs", 10, minimum=0
        ),
        consumer_group=group,
        sub_expression=sub_expr,
        streaming=streaming,
        serialize_type=_serialize_type(opts),
        **_credentials(opts),
        tls=_tls(opts),
    )


def _parse_assign(raw: str) -> dict[str, tuple[str, ...]]:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _err("assign", f"is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not doc:
        raise _err("assign", 'must be a JSON object like {"TopicA": ["broker-a:0"]}')
    out: dict[str, tuple[str, ...]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, list) or not queues:
            raise _err("assign", f"topic {topic!r} must map to a non-empty list of 'broker:queue'")
        for key in queues:
            if not isinstance(key, str):
                raise _err("assign", f"queue {key!r} of {topic!r} must be a 'broker:queue' string")
            try:
                parse_queue_key(key)
            except ValueError as exc:
                raise _err("assign", str(exc)) from None
        out[str(topic)] = tuple(sorted(set(queues), key=parse_queue_key))
    return out


def _trace_topic(opts: Mapping[str, str]) -> str | None:
    """`rocketmq.enableMsgTrace` (false) and `rocketmq.traceTopic` (RMQ_SYS_TRACE_TOPIC): the
    trace topic of the writer's producers, or None when tracing is off."""
    topic = opts.get("rocketmq.tracetopic", "").strip()
    if not _bool(opts, "rocketmq.enablemsgtrace", "rocketmq.enableMsgTrace", False):
        if topic:
            raise _err("rocketmq.traceTopic", "needs rocketmq.enableMsgTrace=true")
        return None
    topic = topic or TRACE_TOPIC
    if len(topic) > 127 or not _GROUP_RE.match(topic):
        raise _err(
            "rocketmq.traceTopic",
            f"must be 1-127 characters of [%|a-zA-Z0-9_-], got {topic[:80]!r}",
        )
    return topic


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the options of `df.write` / `df.writeStream`.

    Raises:
        ValueError: a missing or malformed option; the message names it.
    """
    opts = _lower(options)
    namesrv = _namesrv(opts)
    topic = opts.get("topic", "").strip() or None
    group = opts.get("producergroup", "").strip() or "SPARK_ROCKETMQ_WRITER"
    if not _GROUP_RE.match(group):
        raise _err("producerGroup", f"has characters outside [%|a-zA-Z0-9_-]: {group!r}")
    batch = _int(opts, "sendbatchsize", "sendBatchSize", DEFAULT_SEND_BATCH_SIZE, minimum=1)
    timeout = _int(opts, "rocketmq.sendmsgtimeout", "rocketmq.sendMsgTimeout", 3000, minimum=1)
    return SinkOptions(
        namesrv_addr=namesrv,
        topic=topic,
        producer_group=group,
        send_batch_size=batch,
        send_msg_timeout_ms=timeout,
        serialize_type=_serialize_type(opts),
        **_credentials(opts),
        tls=_tls(opts),
        trace_topic=_trace_topic(opts),
    )

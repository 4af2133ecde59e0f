"""The broker's Prometheus metrics, with RocketMQ 5.x's names and labels (docs/metrics.md).

Two kinds of figures:
- counted on the hot path into plain dicts (`Traffic`: messages and bytes in per topic, out
  per topic and group, the message-size histogram; `common.metrics.RpcLatencyStats`: RPC
  durations, fed by the remoting table's RPC observer), a dict lookup and a few additions per
  send, pull answer or batch of answers;
- computed when scraped (`BrokerCollector`), from the broker's state: consumer lag from the
  committed offsets against the queues' max offsets, connections, topic and group counts,
  store and replication figures.

`BrokerCollector.collect` turns both into Prometheus samples at each scrape, on the event loop
(it reads state that lives there; memory only, no I/O but a consume-queue unit or record header
per queue behind a consumer). The broker serves them with `common.metrics_http`
(`BrokerMetrics.start`), each broker with its own registry (tests run several in a process).

Cardinality: label values are only topics and groups the broker has (counts of topics deleted
since are dropped at the next scrape), request and response codes, languages and versions;
each family keeps at most `MAX_LABEL_SETS` label sets, more are counted under `__overflow__`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import structlog
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from common.metrics import OVERFLOW, RpcLatencyStats, cumulative_buckets
from common.metrics_http import MetricsHttpServer, MetricsListenError, start_exporter
from remoting.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = [
    "MAX_LABEL_SETS",
    "MESSAGE_SIZE_BUCKETS",
    "BrokerCollector",
    "BrokerMetrics",
    "MetricsListenError",
    "Traffic",
    "code_label",
    "rpc_latency_family",
]

log = structlog.get_logger()

# RocketMQ 5.x's buckets of rocketmq_message_size (bytes).
MESSAGE_SIZE_BUCKETS: tuple[int, ...] = (
    1024,
    4 * 1024,
    512 * 1024,
    1024 * 1024,
    2 * 1024 * 1024,
    4 * 1024 * 1024,
)
MAX_LABEL_SETS = 4096

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYS_GROUP_PREFIX = "CID_RMQ_SYS_"

# Row layout of `Traffic.inbound`: messages, bytes, what batch puts wrote beyond their size
# observation (so the sizes' sum is bytes - that, with no addition for a single message),
# then one count per bucket.
_IN_MSGS, _IN_BYTES, _IN_BATCH_EXTRA, _IN_BUCKET0 = 0, 1, 2, 3


class Traffic:
    """Messages in and out, counted by the send and pull processors (event loop only).

    A row is created on the first count of its key; `prune` drops the rows of topics and
    groups that no longer exist.
    """

    __slots__ = ("inbound", "max_label_sets", "outbound", "pull_offsets")

    def __init__(self, max_label_sets: int = MAX_LABEL_SETS) -> None:
        self.max_label_sets = max_label_sets
        # topic -> [messages, bytes, batch extra, per-bucket counts...]
        self.inbound: dict[str, list[int]] = {}
        # (topic, group) -> [messages, bytes]
        self.outbound: dict[tuple[str, str], list[int]] = {}
        # (topic, group, queue id) -> the next offset the group's last pull will read from
        # (RocketMQ's pull offset: what was pulled and not committed is in flight).
        self.pull_offsets: dict[tuple[str, str, int], int] = {}

    def count_in(self, topic: str, msgs: int, wrote_bytes: int) -> None:
        """A put of `msgs` records, `wrote_bytes` in all, was stored in `topic`. One message
        size observation per put (its records' mean size), as RocketMQ records it.

        Once per send on the event loop: literal indices (the row layout above) and bounds
        (`MESSAGE_SIZE_BUCKETS`) for the common sizes, no global lookups."""
        row = self.inbound.get(topic)
        if row is None:
            row = self._in_row(topic)
        row[0] += msgs
        row[1] += wrote_bytes
        if msgs == 1:
            size = wrote_bytes
        else:
            size = wrote_bytes // msgs if msgs else 0
            row[2] += wrote_bytes - size
        if size <= 1024:
            row[3] += 1
        elif size <= 4096:
            row[4] += 1
        else:
            row[3 + bisect_left(MESSAGE_SIZE_BUCKETS, size)] += 1

    def _in_row(self, topic: str) -> list[int]:
        if len(self.inbound) >= self.max_label_sets:
            topic = OVERFLOW
            row = self.inbound.get(topic)
            if row is not None:
                return row
        row = self.inbound[topic] = [0] * (_IN_BUCKET0 + len(MESSAGE_SIZE_BUCKETS) + 1)
        return row

    def count_out(
        self, topic: str, group: str, queue_id: int, msgs: int, nbytes: int, next_offset: int
    ) -> None:
        """A pull answer of `group` carried `msgs` records (`nbytes`) of `topic`'s queue
        `queue_id`; the group reads on from `next_offset`."""
        key = (topic, group)
        row = self.outbound.get(key)
        if row is None:
            if len(self.outbound) >= self.max_label_sets:
                key = (OVERFLOW, OVERFLOW)
            row = self.outbound.setdefault(key, [0, 0])
        row[0] += msgs
        row[1] += nbytes
        if len(self.pull_offsets) < self.max_label_sets * 8 or (
            (topic, group, queue_id) in self.pull_offsets
        ):
            self.pull_offsets[topic, group, queue_id] = next_offset

    def prune(self, topic_exists: set[str], group_exists: set[str]) -> None:
        """Drop the rows of topics or groups that are gone."""
        for topic in [t for t in self.inbound if t not in topic_exists and t != OVERFLOW]:
            del self.inbound[topic]
        for key in [
            k
            for k in self.outbound
            if k[0] != OVERFLOW and (k[0] not in topic_exists or k[1] not in group_exists)
        ]:
            del self.outbound[key]
        for pkey in [
            k for k in self.pull_offsets if k[0] not in topic_exists or k[1] not in group_exists
        ]:
            del self.pull_offsets[pkey]


def code_label(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    """RocketMQ's label of a request or response code: its constant's name in lower case
    (`send_message_v2`, `success`); the number for a code trimq does not name."""
    if code == -1:
        return OVERFLOW
    try:
        return enum(code).name.lower()
    except ValueError:
        return str(code)


def language_label(language: str) -> str:
    return language.lower()


# The MQVersion ordinals trimq names (RocketMQ's label is the version's description in lower
# case); any other is given as its number.
_VERSIONS = {409: "v4_9_8"}


def version_label(version: int) -> str:
    return _VERSIONS.get(version, str(version))


def rpc_latency_family(
    stats: RpcLatencyStats, base_names: list[str], base_values: list[str]
) -> HistogramMetricFamily:
    """rocketmq_rpc_latency from an `RpcLatencyStats`."""
    fam = HistogramMetricFamily(
        "rocketmq_rpc_latency",
        "RPC latency in milliseconds, from the request's read to its answer's write",
        labels=[*base_names, "protocol_type", "request_code", "response_code"],
    )
    for code, rc, buckets, total in stats.samples():
        fam.add_metric(
            [
                *base_values,
                "remoting",
                code_label(RequestCode, code),
                code_label(ResponseCode, rc),
            ],
            buckets,
            total,
        )
    return fam


def _yes(flag: bool) -> str:
    return "true" if flag else "false"


class BrokerCollector(Collector):
    """Builds every family from the broker's counters and state at each scrape."""

    def __init__(self, ctrl: BrokerController, traffic: Traffic, rpc: RpcLatencyStats) -> None:
        self.ctrl = ctrl
        self.traffic = traffic
        self.rpc = rpc

    def collect(self) -> Iterator[Metric]:
        ctrl = self.ctrl
        cfg = ctrl.config
        base_names = ["cluster", "node_type", "node_id"]
        base = [cfg.broker_cluster_name, "broker", cfg.broker_name]
        topics = ctrl.topics
        topic_names = {t.topic_name for t in topics}
        group_names = set(ctrl.subscriptions.groups())
        self.traffic.prune(topic_names, group_names)

        def system(topic: str, group: str | None = None) -> str:
            # RocketMQ's is_system: a system topic, or a group named CID_RMQ_SYS_*.
            return _yes(
                topics.is_system_topic(topic)
                or (group is not None and group.startswith(SYS_GROUP_PREFIX))
            )

        # -- messages in and out ------------------------------------------------------------
        in_labels = [*base_names, "topic", "is_system"]
        msgs_in = CounterMetricFamily(
            "rocketmq_messages_in_total", "Messages stored by sends", labels=in_labels
        )
        bytes_in = CounterMetricFamily(
            "rocketmq_throughput_in_total",
            "Bytes stored by sends (whole records, as RocketMQ's wroteBytes)",
            labels=in_labels,
        )
        sizes = HistogramMetricFamily(
            "rocketmq_message_size",
            "Size in bytes of the records stored, one observation per put (its mean record)",
            labels=in_labels,
        )
        for topic, row in sorted(self.traffic.inbound.items()):
            if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                continue  # RocketMQ counts neither
            values = [*base, topic, system(topic)]
            msgs_in.add_metric(values, row[_IN_MSGS])
            bytes_in.add_metric(values, row[_IN_BYTES])
            sizes.add_metric(
                values,
                cumulative_buckets(MESSAGE_SIZE_BUCKETS, row[_IN_BUCKET0:]),
                row[_IN_BYTES] - row[_IN_BATCH_EXTRA],
            )
        out_labels = [*base_names, "topic", "consumer_group", "is_system"]
        msgs_out = CounterMetricFamily(
            "rocketmq_messages_out_total", "Messages served by pulls", labels=out_labels
        )
        bytes_out = CounterMetricFamily(
            "rocketmq_throughput_out_total",
            "Bytes served by pulls (whole records)",
            labels=out_labels,
        )
        for (topic, group), (n, nbytes) in sorted(self.traffic.outbound.items()):
            if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                continue
            values = [*base, topic, group, system(topic, group)]
            msgs_out.add_metric(values, n)
            bytes_out.add_metric(values, nbytes)
        yield from (msgs_in, bytes_in, sizes, msgs_out, bytes_out)
        yield rpc_latency_family(self.rpc, base_names, base)

        # -- counts and connections ----------------------------------------------------------
        yield _gauge("rocketmq_topic_number", "Topics", base_names, base, len(topic_names))
        yield _gauge(
            "rocketmq_consumer_group_number",
            "Subscription groups",
            base_names,
            base,
            len(group_names),
        )
        yield _gauge(
            "rocketmq_broker_permission",
            "The broker's permission (brokerPermission)",
            base_names,
            base,
            cfg.broker_permission,
        )
        yield from self._connections(base_names, base)
        yield from self._lag(base_names, base, system)
        yield from self._storage(base_names, base)

    def _connections(self, base_names: list[str], base: list[str]) -> Iterator[Metric]:
        ctrl = self.ctrl
        producers: dict[tuple[str, str], int] = {}
        for group in ctrl.producers.groups():
            for c in ctrl.producers.members(group):
                pkey = (language_label(c.language), version_label(c.version))
                producers[pkey] = producers.get(pkey, 0) + 1
        fam = GaugeMetricFamily(
            "rocketmq_producer_connections",
            "Producer clients connected (per group they registered in)",
            labels=[*base_names, "language", "version", "protocol_type"],
        )
        for (language, version), n in sorted(producers.items()):
            fam.add_metric([*base, language, version, "remoting"], n)
        yield fam
        consumers: dict[tuple[str, str, str, str], int] = {}
        for group in ctrl.consumers.groups():
            info = ctrl.consumers.get(group)
            if info is None:
                continue
            mode = "pull" if info.consume_type == "CONSUME_ACTIVELY" else "push"
            for c in info.channels.values():
                ckey = (group, language_label(c.language), version_label(c.version), mode)
                consumers[ckey] = consumers.get(ckey, 0) + 1
        fam = GaugeMetricFamily(
            "rocketmq_consumer_connections",
            "Consumer clients connected",
            labels=[
                *base_names,
                "consumer_group",
                "language",
                "version",
                "consume_mode",
                "protocol_type",
                "is_system",
            ],
        )
        for i, ((group, language, version, mode), n) in enumerate(sorted(consumers.items())):
            if i >= MAX_LABEL_SETS:
                break
            system = _yes(group.startswith(SYS_GROUP_PREFIX))
            fam.add_metric([*base, group, language, version, mode, "remoting", system], n)
        yield fam

    def _lag(
        self, base_names: list[str], base: list[str], system: Callable[[str, str], str]
    ) -> Iterator[Metric]:
        """Per (topic, group) with committed offsets, over the topic's write queues (as
        GET_CONSUME_STATS, so the lag equals mqadmin consumerProgress' diff): lag = max offset
        - committed offset; in flight = pulled (pull offset) - committed; the latencies are
        the age of the oldest message not committed / not pulled yet."""
        ctrl = self.ctrl
        store = ctrl._store
        names = [*base_names, "topic", "consumer_group", "is_retry", "is_system"]
        families = {
            "lag": GaugeMetricFamily(
                "rocketmq_consumer_lag_messages",
                "Messages not consumed (committed) yet",
                labels=names,
            ),
            "lag_latency": GaugeMetricFamily(
                "rocketmq_consumer_lag_latency",
                "Age in milliseconds of the oldest message not consumed yet",
                labels=names,
            ),
            "inflight": GaugeMetricFamily(
                "rocketmq_consumer_inflight_messages",
                "Messages pulled and not committed yet",
                labels=names,
            ),
            "ready": GaugeMetricFamily(
                "rocketmq_consumer_ready_messages",
                "Messages not pulled yet",
                labels=names,
            ),
            "queueing": GaugeMetricFamily(
                "rocketmq_consumer_queueing_latency",
                "Age in milliseconds of the oldest message not pulled yet",
                labels=names,
            ),
        }
        if store is not None:
            now_ms = int(time.time() * 1000)
            pulled = self.traffic.pull_offsets
            series = 0
            for topic, group, queues in sorted(ctrl.offsets.entries()):
                cfg = ctrl.topics.get(topic)
                if cfg is None:
                    continue
                if series >= MAX_LABEL_SETS:
                    break
                series += 1
                lag = inflight = ready = 0
                oldest_unconsumed = oldest_unpulled = 0
                for qid in range(cfg.write_queue_nums):
                    end = max(0, store.get_max_offset_in_queue(topic, qid))
                    committed = max(0, queues.get(qid, -1))
                    pull = min(end, max(committed, pulled.get((topic, group, qid), committed)))
                    if end > committed:
                        lag += end - committed
                        ts = store.get_message_store_timestamp(topic, qid, committed)
                        if ts > 0 and (not oldest_unconsumed or ts < oldest_unconsumed):
                            oldest_unconsumed = ts
                    inflight += max(0, pull - committed)
                    if end > pull:
                        ready += end - pull
                        ts = store.get_message_store_timestamp(topic, qid, pull)
                        if ts > 0 and (not oldest_unpulled or ts < oldest_unpulled):
                            oldest_unpulled = ts
                values = [
                    *base,
                    topic,
                    group,
                    _yes(topic.startswith(RETRY_PREFIX)),
                    system(topic, group),
                ]
                families["lag"].add_metric(values, lag)
                families["inflight"].add_metric(values, inflight)
                families["ready"].add_metric(values, ready)
                families["lag_latency"].add_metric(
                    values, max(0, now_ms - oldest_unconsumed) if oldest_unconsumed else 0
                )
                families["queueing"].add_metric(
                    values, max(0, now_ms - oldest_unpulled) if oldest_unpulled else 0
                )
        yield from families.values()

    def _storage(self, base_names: list[str], base: list[str]) -> Iterator[Metric]:
        ctrl = self.ctrl
        store = ctrl._store
        names = [*base_names, "storage_type", "storage_medium"]
        values = [*base, "local", "disk"]
        size = GaugeMetricFamily(
            "rocketmq_storage_size",
            "Bytes of records the commitlog holds (max offset - min offset)",
            labels=names,
        )
        flush = GaugeMetricFamily(
            "rocketmq_storage_flush_behind_bytes",
            "Commitlog bytes written and not flushed to disk yet",
            labels=names,
        )
        dispatch = GaugeMetricFamily(
            "rocketmq_storage_dispatch_behind_bytes",
            "Commitlog bytes not dispatched to the consume queues yet",
            labels=names,
        )
        repl = GaugeMetricFamily(
            "rocketmq_replication_lag_bytes",
            "trimq: commitlog bytes a slave has not acknowledged yet (master side)",
            labels=[*base_names, "slave"],
        )
        if store is not None:
            cl = store.commitlog
            size.add_metric(values, max(0, cl.max_offset - cl.min_offset))
            flush.add_metric(values, max(0, cl.max_offset - cl.mfq.flushed_where))
            # Records are dispatched as they are appended (a run's staged ones when it ends,
            # before anything else runs): a scrape never sees any behind.
            dispatch.add_metric(values, 0)
            ha = ctrl.ha_master
            if ha is not None:
                for c in ha.runtime_info().ha_connection_info:
                    repl.add_metric([*base, c.addr], max(0, c.diff))
        yield from (size, flush, dispatch, repl)


def _gauge(
    name: str, doc: str, base_names: list[str], base: list[str], value: float
) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=base_names)
    fam.add_metric(base, value)
    return fam


class BrokerMetrics:
    """The broker's counters, registry and HTTP endpoint.

    `traffic` and `rpc` are always there; the broker counts into them only once `start` has
    bound the endpoint (`BrokerController.metrics` is None until then: no cost when off).
    """

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl
        self.traffic = Traffic()
        self.rpc = RpcLatencyStats()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(ctrl, self.traffic, self.rpc))
        self.server: MetricsHttpServer | None = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def start(self, nursery: trio.Nursery) -> bool:
        """Serve `/metrics` on `metrics_listen` in `nursery` (`start_exporter`); False when
        off, or when the default address cannot be bound.

        Raises:
            MetricsListenError: `metrics_listen` was set explicitly and cannot be bound.
        """
        cfg = self.ctrl.config
        self.server = await start_exporter(
            nursery,
            cfg.metrics_listen,
            explicit="metrics_listen" in cfg.model_fields_set,
            render=self.render,
            content_type=CONTENT_TYPE_LATEST,
        )
        return self.server is not None

"""The NameServer's Prometheus metrics (docs/metrics.md): RPC latency, fed by the remoting
table's RPC observer, plus gauges of the route table read at each scrape. Served with
`common.metrics_http` from a registry of its own (tests run several NameServers in a
process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics import OVERFLOW, RpcLatencyStats
from common.metrics_http import MetricsHttpServer, MetricsListenError, start_exporter
from remoting.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from namesrv.server import NameServer

__all__ = ["MetricsListenError", "NamesrvCollector", "NamesrvMetrics"]

log = structlog.get_logger()


def _code(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    # RocketMQ's label: the constant's name in lower case; a code trimq does not name: its
    # number.
    if code == -1:
        return OVERFLOW
    try:
        return enum(code).name.lower()
    except ValueError:
        return str(code)


class NamesrvCollector(Collector):
    """rocketmq_rpc_latency and the route table's sizes, at each scrape."""

    def __init__(self, ns: NameServer, rpc: RpcLatencyStats) -> None:
        self.ns = ns
        self.rpc = rpc

    def collect(self) -> Iterator[Metric]:
        ns = self.ns
        base_names = ["node_type", "node_id"]
        base = ["namesrv", ns.address]
        fam = HistogramMetricFamily(
            "rocketmq_rpc_latency",
            "RPC latency in milliseconds, from the request's read to its answer's write",
            labels=[*base_names, "protocol_type", "request_code", "response_code"],
        )
        for code, rc, buckets, total in self.rpc.samples():
            fam.add_metric(
                [*base, "remoting", _code(RequestCode, code), _code(ResponseCode, rc)],
                buckets,
                total,
            )
        yield fam
        table = ns.route_table
        gauges = (
            ("rocketmq_namesrv_broker_number", "trimq: brokers alive", table.broker_live_table),
            ("rocketmq_namesrv_topic_number", "trimq: topics routed", table.topic_queue_table),
            ("rocketmq_namesrv_cluster_number", "trimq: clusters", table.cluster_addr_table),
        )
        for name, doc, items in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=base_names)
            gauge.add_metric(base, len(items))
            yield gauge


class NamesrvMetrics:
    """The NameServer's counters, registry and HTTP endpoint."""

    def __init__(self, ns: NameServer) -> None:
        self.ns = ns
        self.rpc = RpcLatencyStats()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NamesrvCollector(ns, self.rpc))
        self.server: MetricsHttpServer | None = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def start(self, nursery: trio.Nursery) -> bool:
        """Serve `/metrics` on `metrics_listen` in `nursery` (`start_exporter`); False when
        off, or when the default address cannot be bound.

        Raises:
            MetricsListenError: `metrics_listen` was set explicitly and cannot be bound.
        """
        cfg = self.ns.config
        self.server = await start_exporter(
            nursery,
            cfg.metrics_listen,
            explicit="metrics_listen" in cfg.model_fields_set,
            render=self.render,
            content_type=CONTENT_TYPE_LATEST,
        )
        return self.server is not None

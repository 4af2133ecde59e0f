"""Helpers for the client integration tests (real mqnamesrv / mqbroker processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from client import Admin, ClientConfig, MQClientError
from tests.helpers import wait_until


def fast_config(namesrv_addr: str, **kw: Any) -> ClientConfig:
    """Client options with the periodic intervals shortened for tests."""
    opts: dict[str, Any] = {
        "namesrv_addr": namesrv_addr,
        "client_ip": "127.0.0.1",
        "poll_name_server_interval_ms": 1000,
        "heartbeat_broker_interval_ms": 1000,
        "persist_consumer_offset_interval_ms": 500,
        "rebalance_interval_ms": 1000,
        "broker_suspend_max_time_ms": 1000,
        "consumer_timeout_when_suspend_ms": 5000,
        "pull_time_delay_when_exception_ms": 300,
    }
    opts.update(kw)
    return ClientConfig(**opts)


async def create_topic(
    namesrv_addr: str,
    topic: str,
    *,
    queues: int = 4,
    brokers: int = 1,
    cluster: str = "DefaultCluster",
) -> None:
    """Create `topic` on every broker of the cluster and wait until the route shows them all."""
    cfg = fast_config(namesrv_addr)
    async with Admin(cfg) as admin:

        async def cluster_ready() -> bool:
            try:
                return len(await admin.master_addrs(cluster)) >= brokers
            except MQClientError:  # the cluster appears with its first broker
                return False

        await wait_until(cluster_ready, total=20, what="brokers registered")
        await admin.create_topic(
            topic, cluster=cluster, read_queue_nums=queues, write_queue_nums=queues
        )

        async def route_ready() -> bool:
            route = await admin.instance.api.get_topic_route(topic)
            return route is not None and len(route.queue_datas) >= brokers

        await wait_until(route_ready, total=20, what=f"route of {topic}")


def store_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / f"store-{name}"

"""Prometheus in the compose cluster (deploy/docker-compose.yml, deploy/prometheus.yml): it
scrapes every NameServer and broker, and after known traffic its query API gives the brokers'
`rocketmq_messages_in_total` for the topic."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
import uuid
from typing import Any

import pytest
import trio

from client import Admin, ClientConfig, Message, Producer, SendStatus
from tests.cluster.support import ALL_BROKERS, NAMESRVS, Cluster

pytestmark = pytest.mark.slow

SENT = 40


def _get(port: int, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{query}", timeout=5) as resp:
        return json.loads(resp.read())


async def _poll(
    port: int, path: str, done: Any, what: str, params: dict[str, str] | None = None
) -> Any:
    """The answer of `path` once `done(answer)`; at most 90 seconds."""
    last: Any = None
    with trio.move_on_after(90):
        while True:
            try:
                last = await trio.to_thread.run_sync(lambda: _get(port, path, **(params or {})))
            except OSError as exc:
                last = repr(exc)
            if not isinstance(last, str) and done(last):
                return last
            await trio.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; last answer {last!r:.2000}")


async def test_prometheus_scrapes_the_cluster(cluster: Cluster) -> None:
    port = cluster.prometheus_port
    cluster.wait_healthy(total=120)
    expected = {f"{s}:5558" for s in NAMESRVS} | {f"{b}:5557" for b in ALL_BROKERS}

    def all_up(answer: Any) -> bool:
        targets = answer["data"]["activeTargets"]
        up = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
        return expected <= up

    await _poll(port, "/api/v1/targets", all_up, "every NameServer and broker scraped")

    topic = f"PromT{uuid.uuid4().hex[:8]}"
    cfg = ClientConfig(namesrv_addr=cluster.namesrv_addr)
    async with Admin(cfg) as admin:
        await admin.create_topic(
            topic, cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4
        )
    async with Producer("prom_pg", cfg) as producer:
        ok = 0
        with trio.fail_after(60):
            while ok < SENT:
                try:
                    result = await producer.send(Message(topic, b"p" * 100))
                except Exception:  # the route appears once the brokers registered the topic
                    await trio.sleep(0.5)
                    continue
                ok += result.status is SendStatus.SEND_OK
    query = {"query": f'sum(rocketmq_messages_in_total{{topic="{topic}"}})'}

    def counted(answer: Any) -> bool:
        result = answer["data"]["result"]
        return bool(result) and float(result[0]["value"][1]) >= SENT

    # At least: a send answered late and retried is stored (and counted) twice.
    await _poll(port, "/api/v1/query", counted, f"{SENT} messages in for {topic}", query)

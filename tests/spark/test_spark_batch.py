"""Batch reads and writes through the `rocketmq` data source against real brokers."""

from __future__ import annotations

from typing import Any

from tests.spark.conftest import Cluster
from tests.spark.support import MQ


def _reader(spark: Any, cluster: Cluster) -> Any:
    return spark.read.format("rocketmq").option("rocketmq.namesrvAddr", cluster.namesrv_addr)


def test_batch_read_exact_ranges(spark: Any, cluster: Cluster, mq: MQ, unique_topic: str) -> None:
    t = unique_topic
    mq.create_topic(t, queues=2)
    for b in ("broker-a", "broker-b"):
        for q in (0, 1):
            mq.send(t, b, q, 30, tags="TagA")
    df = _reader(spark, cluster).option("subscribe", t).load()
    assert df.schema.simpleString() == (
        "struct<topic:string,queue_id:int,broker:string,queue_offset:bigint,msg_id:string,"
        "keys:string,tags:string,body:binary,born_timestamp:timestamp,"
        "store_timestamp:timestamp,properties:map<string,string>>"
    )
    rows = df.collect()
    assert len(rows) == 120
    got = sorted((r.broker, r.queue_id, r.queue_offset, bytes(r.body)) for r in rows)
    want = sorted(
        (b, q, i, f"m{i}".encode())
        for b in ("broker-a", "broker-b")
        for q in (0, 1)
        for i in range(30)
    )
    assert got == want
    assert {r.tags for r in rows} == {"TagA"}
    assert all(r.keys == f"k{r.queue_offset}" for r in rows)

    ranged = (
        _reader(spark, cluster)
        .option("subscribe", t)
        .option("startingOffsets", f'{{"{t}": {{"broker-a:0": 5, "broker-b:1": 28}}}}')
        .option(
            "endingOffsets", f'{{"{t}": {{"broker-a:0": 12, "broker-a:1": 3, "broker-b:0": -1}}}}'
        )
        .load()
        .select("broker", "queue_id", "queue_offset")
        .collect()
    )
    got2 = sorted((r.broker, r.queue_id, r.queue_offset) for r in ranged)
    want2 = sorted(
        [("broker-a", 0, i) for i in range(5, 12)]
        + [("broker-a", 1, i) for i in range(3)]
        + [("broker-b", 0, i) for i in range(30)]
        + [("broker-b", 1, i) for i in range(28, 30)]
    )
    assert got2 == want2

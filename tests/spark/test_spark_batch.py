"""Batch reads and writes through the `rocketmq` data source against real brokers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.spark.conftest import Cluster
from tests.spark.support import MQ


def _reader(spark: Any, cluster: Cluster) -> Any:
    return spark.read.format("rocketmq").option("rocketmq.namesrvAddr", cluster.namesrv_addr)


@pytest.mark.slow
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


def test_sub_expression_pattern_assign_and_min_partitions(
    spark: Any, cluster: Cluster, mq: MQ, unique_topic: str
) -> None:
    t = unique_topic
    mq.create_topic(t, queues=2)
    mq.send(t, "broker-a", 0, 20, tags="TagA")
    mq.send(t, "broker-a", 0, 20, start=20, tags="TagB")
    mq.send(t, "broker-b", 1, 10, tags="TagB")

    tagged = _reader(spark, cluster).option("subscribe", t).option("subExpression", "TagB").load()
    rows = tagged.select("broker", "queue_offset", "tags").collect()
    assert sorted((r.broker, r.queue_offset) for r in rows) == sorted(
        [("broker-a", i) for i in range(20, 40)] + [("broker-b", i) for i in range(10)]
    )
    assert {r.tags for r in rows} == {"TagB"}

    by_pattern = _reader(spark, cluster).option("subscribePattern", t + "|NoSuchTopic_x").load()
    assert by_pattern.count() == 50

    assigned = _reader(spark, cluster).option("assign", f'{{"{t}": ["broker-b:1"]}}').load()
    assert sorted(r.queue_offset for r in assigned.collect()) == list(range(10))

    at_end = json.dumps({t: {"broker-a:0": 40, "broker-b:1": 10}})
    empty = _reader(spark, cluster).option("subscribe", t).option("startingOffsets", at_end)
    assert empty.load().count() == 0

    split = _reader(spark, cluster).option("subscribe", t).option("minPartitions", "6").load()
    assert split.rdd.getNumPartitions() == 6
    assert sorted(r.queue_offset for r in split.collect() if r.broker == "broker-a") == list(
        range(40)
    )


@pytest.mark.slow
def test_write_then_read_back_with_properties_and_topic_column(
    spark: Any, cluster: Cluster, mq: MQ, unique_topic: str
) -> None:
    t1, t2 = unique_topic + "_a", unique_topic + "_b"
    mq.create_topic(t1, queues=2)
    mq.create_topic(t2, queues=2)
    data = [
        (
            t1 if i % 3 else t2,
            f"body-{i}",
            f"key{i}",
            "even" if i % 2 == 0 else "odd",
            {"n": str(i)},
        )
        for i in range(300)
    ]
    df = spark.createDataFrame(
        data, "topic STRING, body STRING, keys STRING, tags STRING, properties MAP<STRING,STRING>"
    ).repartition(3)
    (
        df.write.format("rocketmq")
        .option("rocketmq.namesrvAddr", cluster.namesrv_addr)
        .mode("append")
        .save()
    )
    back = _reader(spark, cluster).option("subscribe", f"{t1},{t2}").load().collect()
    assert len(back) == 300
    got = sorted((r.topic, bytes(r.body).decode(), r.keys, r.tags, r.properties["n"]) for r in back)
    want = sorted((tp, b, k, tg, p["n"]) for tp, b, k, tg, p in data)
    assert got == want
    ids = {r.properties["SPARK_WRITE_ID"] for r in back}
    assert len(ids) == 300
    assert all(r.msg_id and len(r.msg_id) == 32 for r in back)

    # The topic option overrides the column; binary bodies work too.
    bin_df = spark.createDataFrame([(bytearray(b"\x00\x01"), t2)], "body BINARY, topic STRING")
    (
        bin_df.write.format("rocketmq")
        .option("rocketmq.namesrvAddr", cluster.namesrv_addr)
        .option("topic", t1)
        .mode("append")
        .save()
    )
    assert _reader(spark, cluster).option("subscribe", t1).load().count() == 201

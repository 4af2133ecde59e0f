"""Structured Streaming through the `rocketmq` data source against real brokers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from client.sync import Admin, ClientConfig
from tests.spark.conftest import Cluster
from tests.spark.support import MQ

QUEUES = [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]


def _stream(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    r = (
        spark.readStream.format("rocketmq")
        .option("rocketmq.namesrvAddr", cluster.namesrv_addr)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


class Collector:
    """foreachBatch target: rows per batch id, as (broker, queue, offset, body)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: dict[int, list[tuple[str, int, int, bytes]]] = {}
        self.fail_on = fail_on

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [
            (r.broker, r.queue_id, r.queue_offset, bytes(r.body))
            for r in df.select("broker", "queue_id", "queue_offset", "body").collect()
        ]
        self.batches[batch_id] = sorted(rows)
        if self.fail_on == batch_id:
            self.fail_on = None
            raise RuntimeError("injected failure in foreachBatch")

    def sizes(self) -> list[int]:
        return [len(self.batches[b]) for b in sorted(self.batches)]

    def rows(self) -> list[tuple[str, int, int, bytes]]:
        return [r for b in sorted(self.batches) for r in self.batches[b]]


def _run(df: Any, checkpoint: Path, sink: Collector) -> Any:
    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(180)
    except Exception:  # a failed query raises here; tests look at q.exception()
        pass
    return q


def _send_even(mq: MQ, topic: str, per_queue: int, start: int = 0) -> None:
    for b, q in QUEUES:
        mq.send(topic, b, q, per_queue, start=start)


@pytest.mark.slow
def test_exactly_once_across_runs_with_rate_limit(
    spark: Any, cluster: Cluster, mq: MQ, unique_topic: str, tmp_path: Path
) -> None:
    t = unique_topic
    group = f"G_{t}"[:60]
    mq.create_topic(t, queues=2)
    _send_even(mq, t, 250)  # 1000
    ckpt = tmp_path / "ckpt"
    opts = {"maxOffsetsPerTrigger": "300", "consumerGroup": group}

    first = Collector()
    q1 = _run(_stream(spark, cluster, t, **opts), ckpt, first)
    assert q1.exception() is None
    # availableNow honours the rate limit: 300/300/300/100, split evenly by lag.
    assert first.sizes() == [300, 300, 300, 100]
    assert len([p for p in q1.recentProgress if p["numInputRows"] > 0]) == 4
    per_queue: dict[tuple[str, int], int] = {}
    for b, qid, _off, _body in first.batches[0]:
        per_queue[(b, qid)] = per_queue.get((b, qid), 0) + 1
    assert sorted(per_queue.values()) == [75, 75, 75, 75]

    # Checkpointed offsets are canonical JSON: sorted topics, queues by broker then id.
    last = max(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    offset_line = (ckpt / "offsets" / str(last)).read_text().splitlines()[-1]
    assert offset_line == json.dumps(
        {t: {"broker-a:0": 250, "broker-a:1": 250, "broker-b:0": 250, "broker-b:1": 250}},
    )

    _send_even(mq, t, 125, start=250)  # 500 more
    # A queue added between runs is read from its earliest offset.
    mq.add_queues(t, "broker-a", 3)
    mq.send(t, "broker-a", 2, 40)
    second = Collector()
    q2 = _run(_stream(spark, cluster, t, **opts), ckpt, second)
    assert q2.exception() is None
    assert second.sizes() == [300, 240]
    rows = first.rows() + second.rows()
    assert len(rows) == 1540
    assert len(set(rows)) == 1540
    assert sorted((b, q, off) for b, q, off, _ in rows) == sorted(
        [(b, q, i) for b, q in QUEUES for i in range(375)] + [("broker-a", 2, i) for i in range(40)]
    )

    # A restart with nothing new runs no batch.
    third = Collector()
    assert _run(_stream(spark, cluster, t, **opts), ckpt, third).exception() is None
    assert third.sizes() == []

    # consumerGroup reports progress to the brokers (one batch late, as Spark commits lazily).
    with Admin(ClientConfig(namesrv_addr=cluster.namesrv_addr)) as admin:
        progress = admin.consumer_progress(group, t, timeout=10)
    old_queues = [p for p in progress if (p.mq.broker_name, p.mq.queue_id) in QUEUES]
    assert {(p.mq.broker_name, p.mq.queue_id) for p in old_queues} == set(QUEUES)
    assert all(p.broker_offset == 375 for p in old_queues)
    assert all(250 <= p.consumer_offset <= 375 for p in old_queues)


@pytest.mark.slow
def test_replay_after_foreach_batch_failure_is_identical(
    spark: Any, cluster: Cluster, mq: MQ, unique_topic: str, tmp_path: Path
) -> None:
    t = unique_topic
    mq.create_topic(t, queues=2)
    _send_even(mq, t, 50)  # 200
    ckpt = tmp_path / "ckpt"
    failing = Collector(fail_on=1)
    q = _run(_stream(spark, cluster, t, maxOffsetsPerTrigger="80"), ckpt, failing)
    assert q.exception() is not None
    assert "injected failure" in str(q.exception())
    seen_in_failed_attempt = failing.batches[1]
    assert len(seen_in_failed_attempt) == 80

    _send_even(mq, t, 10, start=50)  # new data must not change the replayed batch
    again = Collector()
    q2 = _run(_stream(spark, cluster, t, maxOffsetsPerTrigger="80"), ckpt, again)
    assert q2.exception() is None
    assert again.batches[1] == seen_in_failed_attempt
    everything = failing.batches[0] + again.rows()
    assert len(everything) == 240
    assert len(set(everything)) == 240


@pytest.mark.slow
def test_stream_to_stream(
    spark: Any, cluster: Cluster, mq: MQ, unique_topic: str, tmp_path: Path
) -> None:
    src, dst = unique_topic, unique_topic + "_out"
    mq.create_topic(src, queues=2)
    mq.create_topic(dst, queues=2)
    _send_even(mq, src, 25)  # 100
    out = (
        _stream(spark, cluster, src)
        .selectExpr("upper(cast(body as string)) as body", "keys", "properties")
        .writeStream.format("rocketmq")
        .option("rocketmq.namesrvAddr", cluster.namesrv_addr)
        .option("topic", dst)
        .option("checkpointLocation", str(tmp_path / "s2s"))
        .trigger(availableNow=True)
        .start()
    )
    out.awaitTermination(180)
    assert out.exception() is None
    assert not out.isActive
    rows = (
        spark.read.format("rocketmq")
        .option("rocketmq.namesrvAddr", cluster.namesrv_addr)
        .option("subscribe", dst)
        .load()
        .collect()
    )
    assert sorted(bytes(r.body) for r in rows) == sorted(
        f"M{i}".encode() for _ in QUEUES for i in range(25)
    )
    ids = [r.properties["SPARK_WRITE_ID"] for r in rows]
    assert len(set(ids)) == 100
    query_id = str(out.id)
    assert all(i.startswith(f"{query_id}:0:") for i in ids)


@pytest.mark.slow
def test_fail_on_data_loss_after_old_files_are_deleted(
    spark: Any, cluster: Cluster, mq: MQ, unique_topic: str, tmp_path: Path
) -> None:
    from tests.helpers import wait_until_sync

    t = unique_topic
    broker = cluster.lossy_broker()
    mq.create_topic(t, queues=1, brokers=(broker,))
    mq.send(t, broker, 0, 10, size=1024)
    ckpt = tmp_path / "ckpt"
    first = Collector()
    assert _run(_stream(spark, cluster, t), ckpt, first).exception() is None
    assert sorted(off for _, _, off, _ in first.rows()) == list(range(10))

    # 1 KiB messages into 64 KiB commitlog files: the broker deletes all but the newest file.
    mq.send(t, broker, 0, 300, start=10, size=1024)
    wait_until_sync(
        lambda: mq.min_offset(t, broker, 0) > 10, total=30, what="old commitlog files deleted"
    )

    # failOnDataLoss=true (the default): the restarted query fails and says why.
    failed = Collector()
    q = _run(_stream(spark, cluster, t), ckpt, failed)
    assert q.exception() is not None
    assert "data loss" in str(q.exception())
    assert "failOnDataLoss" in str(q.exception())
    assert failed.sizes() == []

    # failOnDataLoss=false on the same checkpoint: skips to the min offset, reads the rest.
    lo = mq.min_offset(t, broker, 0)
    skipped = Collector()
    q = _run(_stream(spark, cluster, t, failOnDataLoss="false"), ckpt, skipped)
    assert q.exception() is None
    offsets = sorted(off for _, _, off, _ in skipped.rows())
    assert offsets[0] >= lo
    assert offsets == list(range(offsets[0], 310))

    # Batch reads follow the same rule for a start below the queue's min offset.
    def batch(fail: str) -> Any:
        return (
            spark.read.format("rocketmq")
            .option("rocketmq.namesrvAddr", cluster.namesrv_addr)
            .option("subscribe", t)
            .option("startingOffsets", json.dumps({t: {f"{broker}:0": 0}}))
            .option("failOnDataLoss", fail)
            .load()
        )

    with pytest.raises(Exception, match="data loss"):
        batch("true").collect()
    rows = batch("false").select("queue_offset").collect()
    got = sorted(r.queue_offset for r in rows)
    assert got
    assert got[0] >= lo
    assert got == list(range(got[0], 310))

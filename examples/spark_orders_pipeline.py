"""Order events -> per-minute revenue per product, with Spark Structured Streaming on trimq.

1. A plain producer writes order events (JSON) into the `SparkOrders` topic.
2. A streaming query reads them with the `rocketmq` source, parses the JSON, and computes
   revenue per product per one-minute event-time window with a 2-minute watermark.
3. Each micro-batch of finished windows goes to Parquet and, as JSON messages keyed by
   product, into the `SparkRevenue` topic (`foreachBatch` with two writes).
4. Finally a batch read of `SparkRevenue` prints what the pipeline produced.

Run against `make run` (NameServer on 127.0.0.1:9876):

    .venv/bin/python examples/spark_orders_pipeline.py --orders 2000
    # or
    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/spark-submit examples/spark_orders_pipeline.py

The query uses `trigger(availableNow=True)`, so it processes what is there and stops; run the
script again and it continues from its checkpoint (`--work`), exactly once on the read side.
`--continuous` keeps it running with a 5-second trigger instead (Ctrl-C to stop).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ORDERS = "SparkOrders"
REVENUE = "SparkRevenue"
PRODUCTS = ["apple", "banana", "cherry", "durian", "elderberry"]


def produce_orders(namesrv: str, n: int, seed: int) -> None:
    """Send `n` orders spread over the last ten minutes of event time."""
    from client.sync import ClientConfig, Message, Producer

    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    with Producer("spark_orders_example", ClientConfig(namesrv_addr=namesrv)) as producer:
        batch = []
        for i in range(n):
            order_id = f"o-{seed}-{i}"
            event = {
                "order_id": order_id,
                "product": rng.choice(PRODUCTS),
                "amount": round(rng.uniform(1, 100), 2),
                "event_time_ms": now_ms - 600_000 + i * 600_000 // max(1, n),
            }
            batch.append(Message(ORDERS, json.dumps(event), keys=order_id, tags="order"))
            if len(batch) == 200:
                producer.send_batch(batch)
                batch = []
        if batch:
            producer.send_batch(batch)
    print(f"sent {n} orders to {ORDERS}")


def run_pipeline(namesrv: str, work: Path, continuous: bool) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    import client.spark

    spark = (
        SparkSession.builder.appName("trimq-orders-pipeline")
        .master(os.environ.get("SPARK_MASTER", "local[2]"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    client.spark.register(spark)

    order_schema = "order_id STRING, product STRING, amount DOUBLE, event_time_ms BIGINT"
    orders = (
        spark.readStream.format("rocketmq")
        .option("rocketmq.namesrvAddr", namesrv)
        .option("subscribe", ORDERS)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "5000")
        .option("consumerGroup", "spark_orders_pipeline")  # lag visible in mqadmin
        .load()
        .select(F.from_json(F.col("body").cast("string"), order_schema).alias("o"))
        .select("o.*")
        .withColumn("event_time", F.timestamp_millis("event_time_ms"))
    )
    revenue = (
        orders.withWatermark("event_time", "2 minutes")
        .groupBy(F.window("event_time", "1 minute"), "product")
        .agg(F.round(F.sum("amount"), 2).alias("revenue"), F.count("*").alias("orders"))
        .select(
            F.col("window.start").alias("minute"),
            "product",
            "revenue",
            "orders",
        )
    )

    parquet_dir = work / "revenue.parquet"

    def sink(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        batch.write.mode("append").parquet(str(parquet_dir))
        (
            batch.select(
                F.to_json(F.struct("minute", "product", "revenue", "orders")).alias("body"),
                F.col("product").alias("keys"),
                F.lit("revenue").alias("tags"),
            )
            .write.format("rocketmq")
            .option("rocketmq.namesrvAddr", namesrv)
            .option("topic", REVENUE)
            .mode("append")
            .save()
        )
        print(f"batch {batch_id}: {batch.count()} finished windows")
        batch.unpersist()

    writer = (
        revenue.writeStream.outputMode("append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoint"))
    )
    query = (
        writer.trigger(processingTime="5 seconds")
        if continuous
        else writer.trigger(availableNow=True)
    ).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()

    out = (
        spark.read.format("rocketmq")
        .option("rocketmq.namesrvAddr", namesrv)
        .option("subscribe", REVENUE)
        .load()
        .select(F.col("body").cast("string").alias("json"))
    )
    print(f"{out.count()} revenue messages in {REVENUE}; the last ten:")
    for row in out.tail(10):
        print("  ", row.json)
    spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namesrv", default=os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"))
    ap.add_argument("--orders", type=int, default=2000, help="orders to produce (0: none)")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--work", type=Path, default=Path("./.spark-orders"))
    ap.add_argument("--continuous", action="store_true", help="keep running (5 s trigger)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.orders:
        produce_orders(args.namesrv, args.orders, args.seed)
    run_pipeline(args.namesrv, args.work.resolve(), args.continuous)


if __name__ == "__main__":
    main()

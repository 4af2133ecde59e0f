"""Spark batch read/write through the `rocketmq` data source vs the plain client, same run.

Starts `mqnamesrv` and one `mqbroker` (temp store), then measures on one topic with 4 queues:

- plain send: `client.Producer.send_batch`, 500 messages per batch, 4 batches in flight
  (what the Spark sink does per task);
- plain consume: `client.PullConsumer` (lite pull), 4 assigned queues, 1000 per pull;
- Spark batch read: `spark.read.format("rocketmq")...load()` -> `write.format("noop")`
  (every column materialised), local[2], best of 2 after a warm-up read;
- Spark batch write: a 1 KiB `body` column built in the JVM -> `write.format("rocketmq")`,
  best of 2 after a warm-up write.

A warm query of 4,000 rows (1,000 per queue) is timed too: about Spark's cost per query.

    python bench/spark_rw.py            # 200,000 x 1 KiB
    python bench/spark_rw.py --quick    # 20,000 x 1 KiB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table

from client import ClientConfig, ConsumeFromWhere, Message, MessageQueue, Producer, PullConsumer
from client.sync import Admin

BIN = Path(sys.executable).parent
TOPIC = "BenchSparkIn"
OUT_TOPIC = "BenchSparkOut"
QUEUES = 4
BODY = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def start_cluster(root: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    ns_port, br_port = free_port(), free_port()
    ns = subprocess.Popen(
        [str(BIN / "mqnamesrv"), "--listen", f"127.0.0.1:{ns_port}", "--log-level", "warning"],
        env=env,
    )
    wait_port(ns_port, ns)
    env["TRIMQ_MAPPED_FILE_SIZE_COMMITLOG"] = str(512 * 1024 * 1024)
    br = subprocess.Popen(
        [
            str(BIN / "mqbroker"),
            "-n",
            f"127.0.0.1:{ns_port}",
            "--listen",
            f"127.0.0.1:{br_port}",
            "--store-dir",
            str(root / "store"),
            "--log-level",
            "warning",
        ],
        env=env,
    )
    wait_port(br_port, br)
    return [br, ns], f"127.0.0.1:{ns_port}"


def create_topics(namesrv: str) -> None:
    with Admin(ClientConfig(namesrv_addr=namesrv)) as admin:
        deadline = time.monotonic() + 30
        while not admin.master_addrs(timeout=5):
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not register")
            time.sleep(0.2)
        for t in (TOPIC, OUT_TOPIC):
            admin.create_topic(t, cluster="DefaultCluster", read_queue_nums=QUEUES,
                               write_queue_nums=QUEUES, timeout=10)  # fmt: skip
        for t in (TOPIC, OUT_TOPIC):
            while True:
                try:
                    admin.topic_route(t, timeout=5)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


async def plain_send(namesrv: str, n: int) -> float:
    body = b"x" * BODY
    cfg = ClientConfig(namesrv_addr=namesrv)
    async with Producer("bench_spark_pg", cfg) as p:
        await p.send(Message(TOPIC, body))  # route + connection warm-up
        limit = trio.Semaphore(4)
        t0 = time.perf_counter()
        sent = 1

        async def one(msgs: list[Message], q: int) -> None:
            try:
                await p.send_batch(msgs, queue=MessageQueue(TOPIC, "broker-a", q))
            finally:
                limit.release()

        async with trio.open_nursery() as nursery:
            i = 0
            while sent < n:
                k = min(500, n - sent)
                await limit.acquire()
                nursery.start_soon(one, [Message(TOPIC, body) for _ in range(k)], i % QUEUES)
                sent += k
                i += 1
        return n / (time.perf_counter() - t0)


async def plain_consume(namesrv: str, n: int) -> float:
    cfg = ClientConfig(namesrv_addr=namesrv, lite_pull_batch_size=1000)
    c = PullConsumer(
        "bench_spark_cg",
        cfg,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        auto_commit=True,
    )
    c.assign([MessageQueue(TOPIC, "broker-a", q) for q in range(QUEUES)])
    async with c:
        t0 = time.perf_counter()
        got = 0
        while got < n:
            msgs = await c.poll(timeout_ms=10_000)
            if not msgs:
                raise RuntimeError(f"consumer stalled after {got} messages")
            got += len(msgs)
        return got / (time.perf_counter() - t0)


def spark_session() -> object:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import client.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("trimq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    client.spark.register(spark)
    return spark


def spark_read(spark: object, namesrv: str, n: int, runs: int) -> tuple[float, float]:
    def once(limit: int | None) -> float:
        r = (
            spark.read.format("rocketmq")  # type: ignore[attr-defined]
            .option("rocketmq.namesrvAddr", namesrv)
            .option("subscribe", TOPIC)
        )
        if limit is not None:
            ends = {f"broker-a:{q}": limit for q in range(QUEUES)}
            r = r.option("endingOffsets", json.dumps({TOPIC: ends}))
        t0 = time.perf_counter()
        r.load().write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t0

    once(1000)  # warm-up: Python workers, connections, JIT
    fixed = once(1000)  # a warm query of 4,000 rows: about Spark's per-query cost
    best = min(once(None) for _ in range(runs))
    return n / best, fixed


def spark_write(spark: object, namesrv: str, n: int, runs: int) -> tuple[float, float]:
    def once(rows: int) -> float:
        df = spark.range(rows, numPartitions=2).selectExpr(  # type: ignore[attr-defined]
            f"concat(cast(id as string), repeat('x', {BODY})) as body"
        )
        t0 = time.perf_counter()
        (
            df.write.format("rocketmq")
            .option("rocketmq.namesrvAddr", namesrv)
            .option("topic", OUT_TOPIC)
            .mode("append")
            .save()
        )
        return time.perf_counter() - t0

    once(2000)  # warm-up
    fixed = once(4000)
    return n / min(once(n) for _ in range(runs)), fixed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20,000 messages, one timed read")
    ap.add_argument("-n", type=int, default=None, help="number of messages")
    args = ap.parse_args()
    n = args.n or (20_000 if args.quick else 200_000)
    runs = 1 if args.quick else 2
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="trimq-spark-bench-"))
    procs, namesrv = start_cluster(root)
    try:
        create_topics(namesrv)
        send_rate = trio.run(plain_send, namesrv, n)
        consume_rate = trio.run(plain_consume, namesrv, n)
        t0 = time.perf_counter()
        spark = spark_session()
        startup = time.perf_counter() - t0
        read_rate, read_fixed = spark_read(spark, namesrv, n, runs)
        write_rate, write_fixed = spark_write(spark, namesrv, n, runs)
        spark.stop()  # type: ignore[attr-defined]
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)

    table = Table(title=f"Spark vs plain client, {n:,} x {BODY} B, 4 queues, local[2]")
    table.add_column("path")
    table.add_column("rows/s", justify="right")
    table.add_column("vs plain", justify="right")
    table.add_row("plain consume (PullConsumer, 1000/pull)", f"{consume_rate:,.0f}", "1.00x")
    table.add_row(
        "Spark batch read -> noop", f"{read_rate:,.0f}", f"{read_rate / consume_rate:.2f}x"
    )
    table.add_row("plain send (send_batch 500, 4 in flight)", f"{send_rate:,.0f}", "1.00x")
    table.add_row("Spark batch write", f"{write_rate:,.0f}", f"{write_rate / send_rate:.2f}x")
    console.print(table)
    console.print(
        f"SparkSession start: {startup:.1f} s; a warm 4,000-row read {read_fixed:.2f} s, "
        f"write {write_fixed:.2f} s; cores: {os.cpu_count()}"
    )


if __name__ == "__main__":
    main()

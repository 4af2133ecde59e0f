"""PySpark data source `rocketmq`: read topics as DataFrames, write DataFrames into topics.

    import client.spark
    client.spark.register(spark)
    df = (spark.read.format("rocketmq")
          .option("rocketmq.namesrvAddr", "127.0.0.1:9876")
          .option("subscribe", "TopicA")
          .load())

Importing this package does not import pyspark (an optional extra: `pip install
'trimq[spark]'`); `register()` and `RocketMQDataSource` do. Spark's workers
must run a Python that can import `client` (set `PYSPARK_PYTHON`).
The option parsing (`client.spark.options`) and offset arithmetic
(`client.spark.offsets`) are plain Python.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "WRITE_ID_PROPERTY", "RocketMQDataSource", "register"]

FORMAT = "rocketmq"
WRITE_ID_PROPERTY = "SPARK_WRITE_ID"
"""Property on every message the sink writes (`queryId:batchId:partition:row`)."""


def register(spark: Any) -> None:
    """Register the `rocketmq` format with a SparkSession.

    Args:
        spark: a `pyspark.sql.SparkSession` (PySpark 4.2 or later).
    """
    from client.spark.source import RocketMQDataSource

    spark.dataSource.register(RocketMQDataSource)


def __getattr__(name: str) -> Any:
    if name == "RocketMQDataSource":
        from client.spark.source import RocketMQDataSource

        return RocketMQDataSource
    raise AttributeError(name)

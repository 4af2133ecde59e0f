"""Clear errors for bad options, overwrite mode and a missing body.

Each case costs a Spark planning round trip; the full option matrix is in
tests/unit/client/test_spark_options.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark.conftest import Cluster
from tests.spark.support import MQ


def _fails(df_or_action: Any, *needles: str) -> None:
    with pytest.raises(Exception) as info:
        df_or_action()
    text = str(info.value)
    for needle in needles:
        assert needle in text, text


@pytest.mark.slow
def test_bad_read_options(spark: Any, cluster: Cluster, mq: MQ, unique_topic: str) -> None:
    mq.create_topic(unique_topic, queues=1)
    ns = cluster.namesrv_addr

    def load(**opts: str) -> Any:
        r = spark.read.format("rocketmq")
        for k, v in opts.items():
            r = r.option(k, v)
        return lambda: r.load().collect()

    _fails(load(subscribe=unique_topic), "rocketmq.namesrvAddr", "is required")
    _fails(
        load(**{"rocketmq.namesrvAddr": ns, "subscribe": "a", "assign": '{"a":["b:0"]}'}),
        "exactly one of",
    )
    _fails(
        load(**{"rocketmq.namesrvAddr": ns, "subscribe": unique_topic, "startingOffsets": "soon"}),
        "startingOffsets",
    )
    _fails(load(**{"rocketmq.namesrvAddr": ns, "subscribe": "NoSuchTopic_spark"}), "does not exist")
    _fails(
        load(**{"rocketmq.namesrvAddr": ns, "assign": f'{{"{unique_topic}": ["broker-a:7"]}}'}),
        "broker-a:7",
    )


def test_bad_writes(spark: Any, cluster: Cluster, mq: MQ, unique_topic: str) -> None:
    mq.create_topic(unique_topic, queues=1)
    ns = cluster.namesrv_addr
    df = spark.createDataFrame([("x",)], "body STRING")
    _fails(
        lambda: (
            df.write.format("rocketmq")
            .option("rocketmq.namesrvAddr", ns)
            .option("topic", unique_topic)
            .mode("overwrite")
            .save()
        ),
        "only mode('append')",
    )
    no_body = spark.createDataFrame([("x",)], "value STRING")
    _fails(
        lambda: (
            no_body.write.format("rocketmq")
            .option("rocketmq.namesrvAddr", ns)
            .option("topic", unique_topic)
            .mode("append")
            .save()
        ),
        "needs a 'body' column",
    )
    _fails(
        lambda: (
            df.write.format("rocketmq").option("rocketmq.namesrvAddr", ns).mode("append").save()
        ),
        "no topic",
    )

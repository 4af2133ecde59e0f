"""Option parsing of the `rocketmq` Spark data source (sans-IO, no Spark)."""

from __future__ import annotations

import re
import sys

import pytest

from client.spark.options import (
    DEFAULT_PULL_BATCH_SIZE,
    match_topics,
    parse_offset_spec,
    parse_queue_key,
    parse_sink_options,
    parse_source_options,
)

NS = {"rocketmq.namesrvaddr": "127.0.0.1:9876"}


def test_importing_client_spark_does_not_import_pyspark() -> None:
    import client
    import client.spark
    import client.spark.offsets
    import client.spark.options

    assert client.spark.FORMAT == "rocketmq"
    import subprocess

    code = (
        "import sys, client, client.spark, client.spark.options, client.spark.offsets; "
        "print('pyspark' in sys.modules, 'pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_defaults_batch_and_streaming() -> None:
    b = parse_source_options({**NS, "subscribe": "A, B,A"}, streaming=False)
    assert b.subscribe == ("A", "B")
    assert b.starting_offsets == "earliest"
    assert b.ending_offsets == "latest"
    assert b.pull_batch_size == DEFAULT_PULL_BATCH_SIZE == 1000
    assert b.fail_on_data_loss is True
    assert b.sub_expression == "*"
    assert b.max_offsets_per_trigger is None
    s = parse_source_options({**NS, "subscribe": "A"}, streaming=True)
    assert s.starting_offsets == "latest"
    assert s.serialize_type == "auto"
    j = parse_source_options(
        {**NS, "subscribe": "A", "rocketmq.serializeType": "JSON"}, streaming=True
    )
    assert j.serialize_type == "json"
    assert s.namesrv_list() == ["127.0.0.1:9876"]


def test_keys_are_case_insensitive_and_values_strings() -> None:
    o = parse_source_options(
        {
            "ROCKETMQ.NAMESRVADDR": "a:1;b:2",
            "subscribePattern": "Orders.*",
            "FailOnDataLoss": "FALSE",
            "maxOffsetsPerTrigger": "300",
            "minPartitions": "4",
            "pullBatchSize": "500",
            "consumerGroup": "cg_1",
            "subExpression": "TagA || TagB",
        },
        streaming=True,
    )
    assert o.namesrv_list() == ["a:1", "b:2"]
    assert o.subscribe_pattern == "Orders.*"
    assert o.fail_on_data_loss is False
    assert o.max_offsets_per_trigger == 300
    assert o.min_partitions == 4
    assert o.pull_batch_size == 500
    assert o.consumer_group == "cg_1"
    assert o.sub_expression == "TagA || TagB"


@pytest.mark.parametrize(
    ("opts", "streaming", "needle"),
    [
        ({"subscribe": "A"}, False, "rocketmq.namesrvAddr"),
        ({**NS}, False, "exactly one of"),
        ({**NS, "subscribe": "A", "assign": '{"A": ["b:0"]}'}, False, "exactly one of"),
        ({**NS, "subscribe": " , "}, False, "at least one topic"),
        ({**NS, "subscribePattern": "(("}, False, "subscribePattern"),
        ({**NS, "assign": "[1]"}, False, "assign"),
        ({**NS, "assign": '{"A": ["nocolon"]}'}, False, "brokerName:queueId"),
        ({**NS, "assign": '{"A": []}'}, False, "non-empty list"),
        ({**NS, "subscribe": "A", "startingOffsets": "now"}, False, "startingOffsets"),
        ({**NS, "subscribe": "A", "startingOffsets": "latest"}, False, "batch read"),
        ({**NS, "subscribe": "A", "startingOffsets": '{"A": {"b:0": -1}}'}, False, "-1"),
        ({**NS, "subscribe": "A", "startingOffsets": '{"A": {"b:0": "x"}}'}, True, "integer"),
        ({**NS, "subscribe": "A", "startingOffsets": "{bad json"}, True, "valid JSON"),
        ({**NS, "subscribe": "A", "endingOffsets": "earliest"}, False, "endingOffsets"),
        ({**NS, "subscribe": "A", "endingOffsets": '{"A": {"b:0": -2}}'}, False, "-2"),
        ({**NS, "subscribe": "A", "endingOffsets": "latest"}, True, "batch reads only"),
        ({**NS, "subscribe": "A", "maxOffsetsPerTrigger": "10"}, False, "streaming reads"),
        ({**NS, "subscribe": "A", "maxOffsetsPerTrigger": "0"}, True, ">= 1"),
        ({**NS, "subscribe": "A", "maxOffsetsPerTrigger": "ten"}, True, "integer"),
        ({**NS, "subscribe": "A", "failOnDataLoss": "yes"}, True, "'true' or 'false'"),
        ({**NS, "subscribe": "A", "pullBatchSize": "0"}, True, "pullBatchSize"),
        ({**NS, "subscribe": "A", "pullBatchSize": "999999"}, True, "pullBatchSize"),
        ({**NS, "subscribe": "A", "consumerGroup": "bad group!"}, True, "consumerGroup"),
        ({**NS, "subscribe": "A", "rocketmq.serializeType": "xml"}, True, "serializeType"),
    ],
)
def test_bad_source_options_name_the_option(
    opts: dict[str, str], streaming: bool, needle: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        parse_source_options(opts, streaming=streaming)


def test_offset_spec_json() -> None:
    spec = parse_offset_spec('{"T": {"broker-a:0": 23, "broker-b:1": -2}}', "x", allowed=(-2, -1))
    assert spec == {"T": {"broker-a:0": 23, "broker-b:1": -2}}
    assert parse_offset_spec(" Earliest ", "x", allowed=()) == "earliest"


def test_queue_key() -> None:
    assert parse_queue_key("broker-a:3") == ("broker-a", 3)
    assert parse_queue_key("host:10911:0") == ("host:10911", 0)
    for bad in ("broker-a", ":1", "b:-1", "b:x"):
        with pytest.raises(ValueError):
            parse_queue_key(bad)


def test_match_topics_full_match_without_system_topics() -> None:
    topics = ["Orders", "OrdersEU", "XOrders", "TBW102", "%RETRY%Orders_g", "RMQ_SYS_TRACE", "Ord"]
    assert match_topics(re.compile("Orders.*"), topics) == ["Orders", "OrdersEU"]
    assert match_topics(re.compile(".*"), topics) == ["Ord", "Orders", "OrdersEU", "XOrders"]


def test_sink_options() -> None:
    o = parse_sink_options({**NS, "Topic": "T", "sendBatchSize": "100"})
    assert (o.topic, o.send_batch_size, o.producer_group, o.send_msg_timeout_ms) == (
        "T",
        100,
        "SPARK_ROCKETMQ_WRITER",
        3000,
    )
    assert parse_sink_options(NS).topic is None
    with pytest.raises(ValueError, match=r"rocketmq\.namesrvAddr"):
        parse_sink_options({"topic": "T"})
    with pytest.raises(ValueError, match="sendBatchSize"):
        parse_sink_options({**NS, "sendBatchSize": "0"})
    with pytest.raises(ValueError, match="producerGroup"):
        parse_sink_options({**NS, "producerGroup": "a b"})


def test_only_client_spark_imports_pyspark_and_pyarrow() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    allowed = {"client/spark/source.py", "client/spark/sink.py", "client/spark/arrow.py"}
    offenders: list[str] = []
    for path in sorted((root / "client").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
        bad = [n for n in names if n.split(".")[0] in ("pyspark", "pyarrow")]
        if bad and rel not in allowed:
            offenders.append(f"{rel}: {bad}")
    assert offenders == []

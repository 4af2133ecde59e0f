"""Where tracing is switched on besides `ClientConfig`: the Spark sink's options, the Spark
connection's client options, mqbench's flags, and the broker's trace topic at start."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from broker.topic_manager import TRACE_TOPIC as BROKER_TRACE_TOPIC
from broker.topic_manager import TopicManager
from client.cli import mqbench
from client.spark._conn import Conn
from client.spark.options import parse_sink_options
from client.trace import TRACE_TOPIC

NS = {"rocketmq.namesrvAddr": "127.0.0.1:9876"}


def test_spark_sink_trace_options() -> None:
    assert parse_sink_options(NS).trace_topic is None
    assert parse_sink_options({**NS, "rocketmq.enableMsgTrace": "true"}).trace_topic == TRACE_TOPIC
    opts = parse_sink_options(
        {**NS, "rocketmq.enableMsgTrace": "TRUE", "rocketmq.traceTopic": "MyTrace"}
    )
    assert opts.trace_topic == "MyTrace"
    with pytest.raises(ValueError, match=r"rocketmq\.traceTopic' needs rocketmq\.enableMsgTrace"):
        parse_sink_options({**NS, "rocketmq.traceTopic": "MyTrace"})
    for bad in ("bad topic", "x" * 128):
        with pytest.raises(ValueError, match=r"rocketmq\.traceTopic"):
            parse_sink_options(
                {**NS, "rocketmq.enableMsgTrace": "true", "rocketmq.traceTopic": bad}
            )
    with pytest.raises(ValueError, match=r"rocketmq\.enableMsgTrace"):
        parse_sink_options({**NS, "rocketmq.enableMsgTrace": "maybe"})


def test_spark_connection_client_options() -> None:
    traced = Conn("127.0.0.1:9876", trace_topic="MyTrace")._open_instance().config
    assert (traced.enable_trace, traced.trace_topic) == (True, "MyTrace")
    plain = Conn("127.0.0.1:9876")._open_instance().config
    assert plain.enable_trace is False


def test_mqbench_trace_flags_reach_the_client_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_config(namesrv: str | None, **kw: object) -> object:
        mqbench._options.setdefault("trace", False)
        seen.update(trace=mqbench._options.get("trace"), topic=mqbench._options.get("trace_topic"))
        raise SystemExit(0)

    monkeypatch.setattr(mqbench, "_options", dict(mqbench._options))  # restored after
    monkeypatch.setattr(mqbench, "_config", fake_config)
    result = CliRunner().invoke(
        mqbench.cli, ["producer", "-n", "x:1", "--trace", "--trace-topic", "T1"]
    )
    assert result.exit_code == 0, result.output
    assert seen == {"trace": True, "topic": "T1"}


def test_mqbench_rejects_a_bad_trace_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mqbench, "_options", {**mqbench._options, "trace": True})
    mqbench._options["trace_topic"] = "bad topic"
    with pytest.raises(click.UsageError, match="trace_topic"):
        mqbench._config("127.0.0.1:1")


def test_broker_trace_topic_at_start(tmp_path: Path) -> None:
    assert BROKER_TRACE_TOPIC == TRACE_TOPIC
    off = TopicManager(tmp_path / "a")
    assert off.get(TRACE_TOPIC) is None
    on = TopicManager(tmp_path / "b", trace_topic_enable=True)
    cfg = on.get(TRACE_TOPIC)
    assert cfg is not None
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, 6)
    assert on.is_system_topic(TRACE_TOPIC)

"""mqadmin / mqbench command-line parsing (no network), and the import surface."""

from __future__ import annotations

import io
import subprocess
import sys
import threading

import pytest
import trio
from click.testing import CliRunner
from rich.console import Console
from rich.live import _RefreshThread

from client.cli.mqadmin import _parse_time, cli, message_to_dict
from client.cli.mqbench import Stats, _progress
from client.message import MessageExt

COMMANDS = [
    "updateTopic", "deleteTopic", "topicList", "topicRoute", "topicStatus", "clusterList",
    "brokerStatus", "consumerProgress", "consumerConnection", "queryMsgById", "queryMsgByKey",
    "resetOffsetByTime", "sendMessage", "consumeMessage", "haStatus", "getSyncStateSet",
    "brokerConsumeStats", "consumerStatus", "queryMsgByUniqueKey",
]  # fmt: skip


# Commands that talk to controllers only (`-a`), as RocketMQ's: no NameServer option.
CONTROLLER_ONLY = ["getControllerMetaData", "electMaster"]


@pytest.mark.parametrize("name", COMMANDS + CONTROLLER_ONLY)
def test_every_command_has_rocketmq_and_kebab_names(name: str) -> None:
    runner = CliRunner()
    kebab = "".join("-" + c.lower() if c.isupper() else c for c in name)
    for spelled in (name, kebab, name.lower()):
        res = runner.invoke(cli, [spelled, "--help"])
        assert res.exit_code == 0, (spelled, res.output)
        if name in CONTROLLER_ONLY:
            assert "-a, --controllerAddress" in res.output
        else:
            assert "-n, --namesrvAddr" in res.output


def test_help_lists_aliases() -> None:
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    assert "updateTopic (update-topic)" in res.output


def test_missing_namesrv_is_a_clear_error() -> None:
    res = CliRunner().invoke(cli, ["topicList"], env={"NAMESRV_ADDR": ""})
    assert res.exit_code == 1
    assert "NAMESRV_ADDR" in res.output


def test_update_topic_needs_cluster_or_broker() -> None:
    res = CliRunner().invoke(cli, ["updateTopic", "-n", "x:1", "-t", "T"])
    assert res.exit_code == 2
    assert "-c CLUSTER or -b BROKER_ADDR" in res.output


def test_parse_time() -> None:
    assert _parse_time("1700000000000") == 1700000000000
    assert _parse_time("2023-11-14#22:13:20:000") == _parse_time("20231114221320")
    with pytest.raises(Exception, match="cannot read time"):
        _parse_time("yesterday")


def test_message_json_body_text_or_base64() -> None:
    text = MessageExt("T", "héllo".encode(), properties={"TAGS": "A", "KEYS": "k"})
    d = message_to_dict(text)
    assert d["body"] == "héllo"
    assert d["body_base64"] is False
    assert (d["tags"], d["keys"]) == ("A", "k")
    raw = MessageExt("T", b"\xff\x00\xfe", properties={})
    d = message_to_dict(raw)
    assert d["body"] == "/wD+"
    assert d["body_base64"] is True


def test_bench_stats_percentiles() -> None:
    s = Stats(started=0.0)
    s.latencies = [float(i) for i in range(1, 101)]
    s.messages, s.bytes, s.last = 100, 100_000, 2.0
    out = s.summary("producer", {})
    assert out["msgs_per_s"] == 50.0
    assert out["mb_per_s"] == 0.05
    assert out["latency_ms"]["p50"] == 51.0
    assert out["latency_ms"]["p99"] == 100.0
    assert out["latency_ms"]["max"] == 100.0
    assert out["latency_ms"]["avg"] == 50.5


def test_importing_client_never_imports_pyspark() -> None:
    code = (
        "import sys, client, client.sync, client.cli.mqadmin, client.cli.mqbench; "
        "assert not [m for m in sys.modules if m.startswith(('pyspark', 'py4j', 'pyarrow'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_bench_progress_draws_only_on_a_terminal() -> None:
    def refresh_threads() -> int:
        return sum(isinstance(t, _RefreshThread) for t in threading.enumerate())

    for terminal, expected in ((False, 0), (True, 1)):
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal)
        done = trio.Event()
        seen: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_progress, Stats(), "producer", done, console)
            await trio.sleep(0.05)
            seen.append(refresh_threads())
            done.set()
        assert seen == [expected]
        assert (out.getvalue() != "") is terminal


def test_clients_subscribing_alike_differ_only_in_sub_version() -> None:
    from client.cli.mqadmin import _subscriptions

    java = {"subscriptionSet": [{"topic": "T", "subString": "*", "subVersion": 1,
                                 "expressionType": "TAG"}]}  # fmt: skip
    cpp = {"subscriptionSet": [{"topic": "T", "subString": "*", "subVersion": 2}]}
    other = {"subscriptionSet": [{"topic": "T", "subString": "a || b", "subVersion": 1}]}
    odd = {"subscriptionSet": "junk"}
    assert _subscriptions(java) == _subscriptions(cpp)
    assert _subscriptions(java) != _subscriptions(other)
    assert _subscriptions(odd) == "[]"

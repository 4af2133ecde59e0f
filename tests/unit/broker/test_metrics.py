"""`broker.metrics`: the hot-path counters, label caps, pruning, code labels, and the text a
broker's registry renders (a controller that is not running: no store, no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.config import BrokerConfig, ConfigError, load_config
from broker.controller import BrokerController
from broker.metrics import MESSAGE_SIZE_BUCKETS, BrokerMetrics, Traffic, code_label
from common.metrics import OVERFLOW
from remoting import RequestCode, ResponseCode


def test_count_in_adds_messages_bytes_and_one_size_observation_per_put() -> None:
    t = Traffic()
    t.count_in("T", 1, 300)
    t.count_in("T", 4, 4 * 3000)  # a batch: mean 3000 bytes
    t.count_in("T", 1, 5 * 1024 * 1024)
    row = t.inbound["T"]
    # messages, bytes, and what the batch wrote beyond its one (mean) size observation
    assert row[:3] == [6, 300 + 12000 + 5 * 1024 * 1024, 12000 - 3000]
    assert row[3:] == [1, 1, 0, 0, 0, 0, 1]
    assert len(row[3:]) == len(MESSAGE_SIZE_BUCKETS) + 1


def test_count_out_and_pull_offsets() -> None:
    t = Traffic()
    t.count_out("T", "G", 0, 32, 32_000, 32)
    t.count_out("T", "G", 0, 5, 5_000, 37)
    t.count_out("T", "H", 1, 1, 100, 8)
    assert t.outbound == {("T", "G"): [37, 37_000], ("T", "H"): [1, 100]}
    assert t.pull_offsets == {("T", "G", 0): 37, ("T", "H", 1): 8}


def test_label_sets_are_capped() -> None:
    t = Traffic(max_label_sets=2)
    for i in range(5):
        t.count_in(f"T{i}", 1, 10)
        t.count_out(f"T{i}", "G", 0, 1, 10, 1)
    # Two label sets, then everything new under the overflow row.
    assert set(t.inbound) == {"T0", "T1", OVERFLOW}
    assert t.inbound[OVERFLOW][0] == 3
    assert set(t.outbound) == {("T0", "G"), ("T1", "G"), (OVERFLOW, OVERFLOW)}
    assert t.outbound[OVERFLOW, OVERFLOW] == [3, 30]


def test_prune_drops_gone_topics_and_groups() -> None:
    t = Traffic()
    t.count_in("A", 1, 10)
    t.count_in("B", 1, 10)
    t.count_out("A", "G", 0, 1, 10, 1)
    t.count_out("A", "Gone", 0, 1, 10, 1)
    t.count_out("B", "G", 0, 1, 10, 1)
    t.prune({"A"}, {"G"})
    assert set(t.inbound) == {"A"}
    assert set(t.outbound) == {("A", "G")}
    assert set(t.pull_offsets) == {("A", "G", 0)}


def test_code_labels_are_rocketmq_constant_names() -> None:
    assert code_label(RequestCode, 310) == "send_message_v2"
    assert code_label(RequestCode, 11) == "pull_message"
    assert code_label(ResponseCode, 0) == "success"
    assert code_label(ResponseCode, 19) == "pull_not_found"
    assert code_label(RequestCode, 31999) == "31999"
    assert code_label(RequestCode, -1) == OVERFLOW


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_registry_renders_counts_with_rocketmq_names(tmp_path: Path) -> None:
    ctrl = BrokerController(
        BrokerConfig(store_dir=str(tmp_path), broker_name="b1", broker_cluster_name="C1")
    )
    metrics = BrokerMetrics(ctrl)
    ctrl.topics.create_in_send("X", "TBW102", 4)
    ctrl.subscriptions.find_or_create("G")
    metrics.traffic.count_in("X", 3, 900)
    metrics.traffic.count_in("X", 1, 500)
    metrics.traffic.count_in("%RETRY%G", 1, 100)  # not exported, as RocketMQ
    metrics.traffic.count_out("X", "G", 0, 2, 600, 2)
    metrics.rpc.observe([310, 0], 0.002)
    s = _samples(metrics.render().decode())
    base = {("cluster", "C1"), ("node_type", "broker"), ("node_id", "b1")}
    x = frozenset(base | {("topic", "X"), ("is_system", "false")})
    assert s["rocketmq_messages_in_total", x] == 4
    assert s["rocketmq_throughput_in_total", x] == 1400
    assert s["rocketmq_message_size_count", x] == 2
    assert s["rocketmq_message_size_sum", x] == 300 + 500
    xg = frozenset(base | {("topic", "X"), ("consumer_group", "G"), ("is_system", "false")})
    assert s["rocketmq_messages_out_total", xg] == 2
    assert s["rocketmq_throughput_out_total", xg] == 600
    rpc = frozenset(
        base
        | {
            ("protocol_type", "remoting"),
            ("request_code", "send_message_v2"),
            ("response_code", "success"),
            ("le", "3"),
        }
    )
    assert s["rocketmq_rpc_latency_bucket", rpc] == 1
    assert s["rocketmq_topic_number", frozenset(base)] == len(list(ctrl.topics))
    assert s["rocketmq_consumer_group_number", frozenset(base)] == len(ctrl.subscriptions.groups())
    assert not [k for k in s if ("topic", "%RETRY%G") in k[1]]
    # TBW102 is a system topic.
    assert ("is_system", "true") not in x


def test_metrics_listen_setting(tmp_path: Path) -> None:
    assert BrokerConfig().metrics_listen == "127.0.0.1:5557"
    assert "metrics_listen" not in BrokerConfig().model_fields_set
    cfg = load_config(environ={"TRIMQ_METRICS_LISTEN": ""})
    assert cfg.metrics_listen == ""
    assert "metrics_listen" in cfg.model_fields_set
    cfg = load_config(flags={"metrics_listen": "0.0.0.0:9100"}, environ={})
    assert cfg.metrics_listen == "0.0.0.0:9100"
    with pytest.raises(ConfigError, match="metrics_listen"):
        load_config(flags={"metrics_listen": "nope"}, environ={})


@pytest.mark.parametrize(
    ("size", "bucket"),
    [
        (1, 0),
        (1024, 0),
        (1025, 1),
        (4096, 1),
        (4097, 2),
        (512 * 1024, 2),
        (512 * 1024 + 1, 3),
        (4 * 1024 * 1024, 5),
        (4 * 1024 * 1024 + 1, 6),
    ],
)
def test_size_buckets_are_prometheus_le(size: int, bucket: int) -> None:
    t = Traffic()
    t.count_in("T", 1, size)
    counts = t.inbound["T"][3:]
    assert counts.index(1) == bucket
    assert sum(counts) == 1

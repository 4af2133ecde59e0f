"""bench/peers' optional same-protocol peer, rocketmq-rust: config, skip logic, client, report.

Nothing here needs the rocketmq-rust binaries (`make bench-rmqrs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.peers import rmqrs
from bench.peers.report import render
from bench.peers.run import CLIENT_OF, CONFIGS, OPT_IN, PAIRS, _trimq_args, usable_configs


def _run(rate: float, cpu: float) -> dict[str, Any]:
    res = {
        "result": {"msgs_per_s": rate, "messages": 1000, "latency_ms": {"p99": 1.0}},
        "server_cpu_s": cpu,
        "client_cpu_s": cpu / 2,
    }
    return dict.fromkeys(("W1", "W2", "W3", "W4", "W5"), res)


def _fake_rmqrs(root: Path) -> None:
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    for name in (rmqrs.NAMESRV_BIN, rmqrs.BROKER_BIN):
        exe = bindir / name
        exe.write_text("#!/bin/sh\necho rocketmq-broker-rust\necho version=1.0.0\n")
        exe.chmod(0o755)


def test_rmqrs_broker_properties_are_java_style(tmp_path: Path) -> None:
    text = rmqrs.broker_properties(
        namesrv="127.0.0.1:9876", listen_port=20911, ha_port=20999, store=tmp_path / "store"
    )
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["flushDiskType"] == "ASYNC_FLUSH"
    assert props["brokerRole"] == "ASYNC_MASTER"
    assert props["listenPort"] == "20911"
    assert props["haListenPort"] == "20999"
    assert props["haListenAddress"] == "127.0.0.1"
    assert props["namesrvAddr"] == "127.0.0.1:9876"
    assert props["brokerClusterName"] == "DefaultCluster"  # the cluster mqadmin -c names
    assert props["storePathRootDir"] == str(tmp_path / "store")
    assert props["storePathCommitLog"] == str(tmp_path / "store" / "commitlog")
    assert props["commitLogMicroBatchEnabled"] == "false"  # rmqrs.TUNING: at its best
    assert len(props) == len(text.splitlines())  # one key a line, none twice
    shipped = rmqrs.broker_properties(
        namesrv="x:1", listen_port=3, ha_port=4, store=tmp_path, tuned=False
    )
    assert "commitLogMicroBatch" not in shipped
    assert "flushDiskType=ASYNC_FLUSH\n" in shipped
    sync = rmqrs.broker_properties(
        namesrv="x:1", listen_port=3, ha_port=4, store=tmp_path, flush="SYNC_FLUSH"
    )
    assert "flushDiskType=SYNC_FLUSH\n" in sync
    assert "brokerRole=SYNC_MASTER\n" in sync
    with pytest.raises(ValueError, match="flush type"):
        rmqrs.broker_properties(namesrv="x:1", listen_port=3, ha_port=4, store=tmp_path, flush="x")


def test_rmqrs_broker_ports_leave_the_fast_listener_free() -> None:
    picks = iter([20010, 20000, 20000, 19998, 20020])
    taken = {20008}  # 20010 - 2: the fast listener's port is busy, so 20010 is passed over
    # The HA port may be neither listenPort nor the fast listener's port.
    port, ha = rmqrs.broker_ports(lambda: next(picks), lambda p: p not in taken)
    assert (port, ha) == (20000, 20020)
    with pytest.raises(RuntimeError, match="no free pair"):
        rmqrs.broker_ports(lambda: 20000, lambda p: False)


def test_rmqrs_skipped_with_a_message_when_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMQ_RMQRS_ROOT", str(tmp_path / "none"))
    why = rmqrs.missing()
    assert why is not None
    assert "make bench-rmqrs" in why
    assert rmqrs.BROKER_BIN in why
    said: list[str] = []
    kept = usable_configs(["trimq-async", "rocketmq-rust", "rocketmq-rust-shipped"], said.append)
    assert kept == ["trimq-async"]
    assert said == [why]  # one message for both
    assert usable_configs(["trimq-async"], said.append) == ["trimq-async"]
    assert rmqrs.version() == "absent"
    with pytest.raises(RuntimeError, match="make bench-rmqrs"):
        rmqrs.start(tmp_path, None, lambda ns, topic, options: None)


def test_rmqrs_kept_when_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_rmqrs(tmp_path)
    monkeypatch.setenv("TRIMQ_RMQRS_ROOT", str(tmp_path))
    assert rmqrs.missing() is None
    said: list[str] = []
    assert usable_configs(["trimq-async", "rocketmq-rust"], said.append) == [
        "trimq-async",
        "rocketmq-rust",
    ]
    assert said == []
    assert rmqrs.version() == "rocketmq-broker-rust version=1.0.0"
    env = rmqrs.env_for(tmp_path / "home")
    assert env["ROCKETMQ_HOME"] == env["HOME"] == str(tmp_path / "home")


def test_rmqrs_runs_trimqs_client_with_json_headers() -> None:
    for w in ("W1", "W2", "W3", "W5"):
        args = _trimq_args(w, "127.0.0.1:1", rmqrs.SERIALIZE)
        at = args.index("--serialize-type")
        assert args[at + 1] == "json"
        assert at < args.index("producer" if w != "W3" else "consumer")
        plain = _trimq_args(w, "127.0.0.1:1")
        assert [a for a in args if a not in rmqrs.SERIALIZE] == plain
    assert CLIENT_OF[CONFIGS["rocketmq-rust"][0]] == "trimq"
    assert ("trimq-async", "rocketmq-rust") in PAIRS
    assert ("trimq-async", "rocketmq-rust-shipped") in PAIRS
    assert "rocketmq-rust-shipped" in OPT_IN  # run only when named in --only
    assert "rocketmq-rust" not in OPT_IN


def test_report_compares_trimq_async_with_rocketmq_rust() -> None:
    runs = {
        "trimq-async": [_run(8000, 1.0)],
        "rocketmq-rust": [_run(1000, 2.0)],
    }
    text = render({"runs": runs})
    assert "| metric | trimq-async | rocketmq-rust | async/rocketmq-rust |" in text
    assert "| W1 publish, 64 in flight: msgs/s | 8,000 | 1,000 | 8.00x |" in text
    assert "| W1 server CPU us/msg | 1,000 | 2,000 | 0.50x |" in text

"""BrokerConfig: defaults, TOML < env < flags, clear errors, and the mqbroker exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.cli import cli
from broker.config import BrokerConfig, ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config(environ={})
    assert cfg.broker_name == "broker-a"
    assert cfg.broker_cluster_name == "DefaultCluster"
    assert cfg.listen == "0.0.0.0:10911"
    assert cfg.default_topic_queue_nums == 8
    assert cfg.max_message_size == 4 * 1024 * 1024
    # One pull may return 1,000 messages of 1 KiB.
    assert cfg.max_pull_msgs >= 1000
    assert cfg.max_pull_bytes >= 1000 * (1024 + 200)
    assert cfg.flush_disk_type == "ASYNC_FLUSH"


def test_precedence_toml_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "broker.toml"
    f.write_text(
        'broker_name = "from-toml"\nbroker_cluster_name = "C1"\nflush_disk_type = "sync"\n'
        "default_topic_queue_nums = 4\n"
    )
    env = {"TRIMQ_BROKER_NAME": "from-env", "TRIMQ_DEFAULT_TOPIC_QUEUE_NUMS": "6", "TRIMQ_X": "1"}
    cfg = load_config(f, environ=env, flags={"broker_name": "from-flag", "broker_id": None})
    assert cfg.broker_name == "from-flag"
    assert cfg.default_topic_queue_nums == 6
    assert cfg.broker_cluster_name == "C1"
    assert cfg.flush_disk_type == "SYNC_FLUSH"
    assert cfg.broker_id == 0
    # A [broker] table works too.
    g = tmp_path / "b2.toml"
    g.write_text('[broker]\nnamesrv_addr = "127.0.0.1:9876;127.0.0.2:9876"\n')
    assert load_config(g, environ={}).namesrv_addrs == ["127.0.0.1:9876", "127.0.0.2:9876"]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"listen": "nonsense"}, "listen"),
        ({"namesrv_addr": "a:b"}, "namesrv_addr"),
        ({"flush_disk_type": "sometimes"}, "flush_disk_type"),
        ({"broker_id": -1}, "broker_id"),
        ({"advertise": "0.0.0.0:10911"}, "advertise"),
        ({"no_such_option": 1}, "unknown setting"),
    ],
)
def test_errors_name_the_setting(flags: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(environ={}, flags=flags)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})


def test_advertise_and_store_config(tmp_path: Path) -> None:
    cfg = BrokerConfig(
        listen="127.0.0.1:0", store_dir=str(tmp_path), mapped_file_size_commitlog=8192
    )
    assert cfg.advertise_addr(12345) == "127.0.0.1:12345"
    assert BrokerConfig(advertise="192.0.2.3:1").advertise_addr() == "192.0.2.3:1"
    host, port = BrokerConfig(listen="0.0.0.0:10911").advertise_addr().rsplit(":", 1)
    assert host != "0.0.0.0"
    assert port == "10911"
    sc = cfg.store_config()
    assert sc.mapped_file_size_commitlog == 8192
    assert Path(sc.store_path_root_dir) == tmp_path


def test_cli_bad_config_exits_2(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--listen", "nope"], env={})
    assert result.exit_code == 2
    assert "listen" in result.output
    result = runner.invoke(cli, ["--config", str(tmp_path / "missing.toml")], env={})
    assert result.exit_code == 2
    result = runner.invoke(cli, ["--flush", "sometimes"])
    assert result.exit_code == 2


def test_every_store_setting_can_be_set_through_the_broker() -> None:
    from store.config import StoreConfig

    missing = (
        set(StoreConfig.model_fields) - {"store_path_root_dir"} - set(BrokerConfig.model_fields)
    )
    assert missing == set()
    # And the defaults agree.
    store_defaults = StoreConfig()
    broker = BrokerConfig()
    for name in set(StoreConfig.model_fields) - {"store_path_root_dir"}:
        assert getattr(broker, name) == getattr(store_defaults, name), name


def test_gil_switch_interval_follows_the_flush_type_unless_set(tmp_path: Path) -> None:
    assert load_config(environ={}).switch_interval_s == pytest.approx(0.002)
    assert load_config(environ={}, flags={"flush_disk_type": "sync"}).switch_interval_s == (
        pytest.approx(0.005)
    )
    env = {"TRIMQ_GIL_SWITCH_INTERVAL_MS": "0.5"}
    assert load_config(environ=env).switch_interval_s == pytest.approx(0.0005)
    f = tmp_path / "b.toml"
    f.write_text('flush_disk_type = "sync"\ngil_switch_interval_ms = 1\n')
    assert load_config(f, environ={}).switch_interval_s == pytest.approx(0.001)
    for bad in ("0", "-1", "5000", "fast"):
        with pytest.raises(ConfigError, match="gil_switch_interval_ms"):
            load_config(environ={"TRIMQ_GIL_SWITCH_INTERVAL_MS": bad})


@pytest.mark.parametrize(("argv", "expected"), [([], 0.002), (["--flush", "sync"], 0.005)])
def test_mqbroker_runs_with_the_configured_switch_interval(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: float
) -> None:
    import sys

    import trio

    seen: list[float] = []

    def fake_run(*_args: object) -> None:  # the broker itself is not started
        seen.append(sys.getswitchinterval())

    before = sys.getswitchinterval()
    monkeypatch.setattr(trio, "run", fake_run)
    try:
        result = CliRunner().invoke(cli, ["--log-level", "error", *argv], env={})
    finally:
        sys.setswitchinterval(before)
    assert result.exit_code == 0, result.output
    assert seen == [pytest.approx(expected)]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"broker_role": "SLAVE", "broker_id": 0}, "SLAVE's broker_id must be > 0"),
        ({"broker_role": "SYNC_MASTER", "broker_id": 1}, "broker_id must be 0"),
        ({"broker_role": "LEADER"}, "broker_role"),
        ({"ha_master_address": "nowhere"}, "ha_master_address"),
    ],
)
def test_role_settings_are_checked(tmp_path: Path, flags: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_config(flags=flags, environ={})


def test_roles_are_read_in_any_case_and_the_ha_port_follows_the_listen_port() -> None:
    cfg = load_config(flags={"broker_role": "sync_master"}, environ={})
    assert cfg.broker_role == "SYNC_MASTER"
    assert cfg.ha_port(10911) == 10912
    slave = load_config(
        flags={"broker_role": "slave", "broker_id": 2, "ha_listen_port": 20000}, environ={}
    )
    assert slave.is_slave
    assert slave.ha_port(10911) == 20000

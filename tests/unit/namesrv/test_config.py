"""NamesrvConfig: defaults < TOML < TRIMQ_* environment < flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from namesrv.config import ConfigError, NamesrvConfig, load_config


def test_defaults() -> None:
    cfg = load_config(environ={})
    assert cfg == NamesrvConfig()
    assert cfg.listen == "127.0.0.1:9876"
    assert cfg.scan_not_active_broker_interval_ms == 10_000
    assert cfg.broker_channel_expired_time_ms == 120_000
    assert cfg.order_message_enable is False
    assert cfg.listen_host_port == ("127.0.0.1", 9876)


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "namesrv.toml"
    f.write_text(
        'listen = "127.0.0.1:1111"\nbroker_channel_expired_time_ms = 5000\n'
        "scan_not_active_broker_interval_ms = 700\norder_message_enable = true\n"
    )
    cfg = load_config(f, environ={})
    assert cfg.listen == "127.0.0.1:1111"
    assert cfg.broker_channel_expired_time_ms == 5000
    assert cfg.order_message_enable is True
    env = {
        "TRIMQ_LISTEN": "127.0.0.1:2222",
        "TRIMQ_BROKER_CHANNEL_EXPIRED_TIME_MS": "1500",
        "TRIMQ_BROKER_NAME": "ignored-here",  # a broker setting: not ours, ignored
        "OTHER": "x",
    }
    cfg = load_config(f, environ=env)
    assert cfg.listen == "127.0.0.1:2222"
    assert cfg.broker_channel_expired_time_ms == 1500
    assert cfg.scan_not_active_broker_interval_ms == 700
    cfg = load_config(f, environ=env, flags={"listen": "127.0.0.1:3333", "log_level": None})
    assert cfg.listen == "127.0.0.1:3333"
    assert cfg.log_level == "info"


def test_namesrv_table_in_toml(tmp_path: Path) -> None:
    f = tmp_path / "n.toml"
    f.write_text('[namesrv]\nlisten = "127.0.0.1:4444"\nlog_level = "DEBUG"\n')
    cfg = load_config(f, environ={})
    assert cfg.listen == "127.0.0.1:4444"
    assert cfg.log_level == "debug"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("listen = [", "not valid TOML"),
        ('listen = "nonsense"', "listen"),
        ("bogus_key = 1", "bogus_key: unknown setting"),
        ("broker_channel_expired_time_ms = -5", "broker_channel_expired_time_ms"),
        ('scan_not_active_broker_interval_ms = "soon"', "scan_not_active_broker_interval_ms"),
    ],
)
def test_bad_file_values(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(content + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={})
    assert needle in str(info.value)


def test_missing_file_and_bad_env() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config("/nonexistent/trimq/namesrv.toml", environ={})
    with pytest.raises(ConfigError, match="environment"):
        load_config(environ={"TRIMQ_LISTEN": "127.0.0.1:99999"})

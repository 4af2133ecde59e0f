"""`mqcontroller` settings: layers, validation, and the exit code of a bad configuration."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from common.config import ConfigError
from controller.cli import main
from controller.config import load_config

pytestmark = pytest.mark.unit


def test_defaults_environment_and_flags() -> None:
    cfg = load_config(environ={})
    assert cfg.listen == "0.0.0.0:9878"
    assert cfg.endpoints == ["http://127.0.0.1:2379"]
    assert cfg.address(9878) == "127.0.0.1:9878"
    env = {"TRIMQ_ETCD_ENDPOINTS": "http://a:1; http://b:2", "TRIMQ_LEASE_TTL_S": "7"}
    cfg = load_config(environ=env, flags={"listen": "127.0.0.1:1"})
    assert cfg.endpoints == ["http://a:1", "http://b:2"]
    assert cfg.lease_ttl_s == 7
    assert cfg.listen == "127.0.0.1:1"


@pytest.mark.parametrize(
    "env",
    [
        {"TRIMQ_LISTEN": "nonsense"},
        {"TRIMQ_LEASE_TTL_S": "1"},  # below etcd's minimum lease
    ],
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load_config(environ=env)


def test_a_bad_flag_exits_2_with_a_message() -> None:
    result = CliRunner().invoke(main, ["--listen", "nope"])
    assert result.exit_code == 2
    assert "mqcontroller" in result.output

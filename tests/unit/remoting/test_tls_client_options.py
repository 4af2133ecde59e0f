"""The client's TLS options: `ClientConfig.use_tls` / `tls_*` (and their environment
variables), `mqadmin` / `mqbench` `--tls...`, Spark `rocketmq.tls.*`, down to the
`TlsClientSettings` the client's RemotingClient gets."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from client import ClientConfig
from client.cli import mqadmin, mqbench
from client.cli._options import tls
from client.spark._conn import Conn
from client.spark.options import parse_sink_options, parse_source_options
from remoting import TlsClientSettings

TLS_ENV = (
    "TRIMQ_USE_TLS",
    "TRIMQ_TLS_TRUST_CERT_PATH",
    "TRIMQ_TLS_VERIFY_SERVER",
    "TRIMQ_TLS_CHECK_HOSTNAME",
    "TRIMQ_TLS_SERVER_HOSTNAME",
    "TRIMQ_TLS_CERT_PATH",
    "TRIMQ_TLS_KEY_PATH",
    "TRIMQ_TLS_KEY_PASSWORD",
)


@pytest.fixture(autouse=True)
def _no_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


# -- ClientConfig ----------------------------------------------------------------------------


def test_off_by_default() -> None:
    cfg = ClientConfig()
    assert cfg.use_tls is False
    assert cfg.tls_settings() is None


def test_settings_from_the_config() -> None:
    cfg = ClientConfig(
        use_tls=True,
        tls_trust_cert_path="/ca.pem",
        tls_check_hostname=False,
        tls_server_hostname="broker.example",
        tls_cert_path="/c.pem",
        tls_key_path="/k.pem",
        tls_key_password="pw",
    )
    assert cfg.tls_settings() == TlsClientSettings(
        enable=True,
        trust_cert_path="/ca.pem",
        verify_server=True,
        check_hostname=False,
        server_hostname="broker.example",
        cert_path="/c.pem",
        key_path="/k.pem",
        key_password="pw",
    )
    assert "pw" not in repr(cfg)
    insecure = ClientConfig(use_tls=True, tls_verify_server=False).tls_settings()
    assert insecure is not None
    assert insecure.verify_server is False


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_USE_TLS", "yes")
    monkeypatch.setenv("TRIMQ_TLS_TRUST_CERT_PATH", "/env-ca.pem")
    monkeypatch.setenv("TRIMQ_TLS_VERIFY_SERVER", "false")
    monkeypatch.setenv("TRIMQ_TLS_KEY_PASSWORD", "envpw")
    monkeypatch.setenv("TRIMQ_TLS_CERT_PATH", "/c.pem")
    cfg = ClientConfig()
    settings = cfg.tls_settings()
    assert settings is not None
    assert settings.trust_cert_path == "/env-ca.pem"
    assert settings.verify_server is False
    assert settings.cert_path == "/c.pem"
    assert settings.key_password == "envpw"
    # Given options win over the environment.
    assert ClientConfig(use_tls=False).tls_settings() is None


def test_bad_environment_values_name_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_USE_TLS", "maybe")
    with pytest.raises(ValidationError, match="use_tls"):
        ClientConfig()


def test_tls_options_without_use_tls_are_refused() -> None:
    with pytest.raises(ValidationError, match="tls_trust_cert_path given but use_tls is off"):
        ClientConfig(tls_trust_cert_path="/ca.pem")
    # A key without its certificate, as the remoting settings say.
    with pytest.raises(ValidationError, match="key_path needs cert_path"):
        ClientConfig(use_tls=True, tls_key_path="/k.pem")


def test_environment_files_without_use_tls_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_TLS_TRUST_CERT_PATH", "/env-ca.pem")
    assert ClientConfig().tls_settings() is None


# -- mqadmin, mqbench ------------------------------------------------------------------------


def test_cli_tls_values() -> None:
    assert tls({"use_tls": None, "tls_cert_path": None}) == {}
    given = tls({"use_tls": True, "tls_trust_cert_path": "/ca.pem", "tls_verify_server": False})
    assert given == {"use_tls": True, "tls_trust_cert_path": "/ca.pem", "tls_verify_server": False}


def test_cli_tls_options_need_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    import click

    with pytest.raises(click.UsageError, match="--tls-cert, --tls-key: only with --tls"):
        tls({"tls_cert_path": "/c", "tls_key_path": "/k"})
    with pytest.raises(click.UsageError, match="--tls-trust-cert"):
        tls({"use_tls": False, "tls_trust_cert_path": "/ca"})
    monkeypatch.setenv("TRIMQ_USE_TLS", "true")
    assert tls({"tls_trust_cert_path": "/ca"}) == {"tls_trust_cert_path": "/ca"}


@pytest.mark.parametrize("tool", [mqadmin, mqbench])
def test_group_options_reach_the_config(tool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool, "_options", dict(tool._options))
    sub = ["topicList", "-n", ""] if tool is mqadmin else ["producer", "-n", ""]
    args = [
        "--tls",
        "--tls-trust-cert",
        "/ca.pem",
        "--tls-no-check-hostname",
        "--tls-server-name",
        "broker.example",
        "--tls-cert",
        "/c.pem",
        "--tls-key",
        "/k.pem",
        *sub,
    ]
    result = CliRunner().invoke(tool.cli, args)
    # The command itself stops at the missing NameServer, after the group's options.
    assert result.exit_code == 1, result.output
    cfg = tool._config("127.0.0.1:9876")
    assert cfg.tls_settings() == TlsClientSettings(
        trust_cert_path="/ca.pem",
        check_hostname=False,
        server_hostname="broker.example",
        cert_path="/c.pem",
        key_path="/k.pem",
    )


@pytest.mark.parametrize("tool", [mqadmin, mqbench])
def test_group_tls_option_without_tls_is_a_usage_error(tool: Any) -> None:
    sub = ["topicList", "-n", "127.0.0.1:1"] if tool is mqadmin else ["producer", "-n", "x:1"]
    result = CliRunner().invoke(tool.cli, ["--tls-trust-cert", "/ca.pem", *sub])
    assert result.exit_code == 2
    assert "only with --tls" in result.output


# -- Spark -----------------------------------------------------------------------------------


def _source(**options: str) -> dict[str, str]:
    return {"rocketmq.namesrvAddr": "127.0.0.1:9876", "subscribe": "T", **options}


def test_spark_tls_options() -> None:
    opts = parse_source_options(
        _source(
            **{
                "rocketmq.tls.enable": "true",
                "rocketmq.tls.trustCertPath": "/ca.pem",
                "rocketmq.tls.verifyServer": "false",
                "rocketmq.tls.checkHostname": "false",
                "rocketmq.tls.serverHostname": "b.example",
                "rocketmq.tls.certPath": "/c.pem",
                "rocketmq.tls.keyPath": "/k.pem",
                "rocketmq.tls.keyPassword": "pw",
            }
        ),
        streaming=False,
    )
    assert dict(opts.tls) == {
        "use_tls": True,
        "tls_trust_cert_path": "/ca.pem",
        "tls_verify_server": False,
        "tls_check_hostname": False,
        "tls_server_hostname": "b.example",
        "tls_cert_path": "/c.pem",
        "tls_key_path": "/k.pem",
        "tls_key_password": "pw",
    }
    assert "pw" not in repr(opts)
    sink = parse_sink_options(
        {"rocketmq.namesrvAddr": "127.0.0.1:9876", "rocketmq.tls.enable": "true"}
    )
    assert sink.tls == (("use_tls", True),)
    assert parse_sink_options({"rocketmq.namesrvAddr": "127.0.0.1:9876"}).tls == ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rocketmq.tls.trustCertPath": "/ca.pem"}, "'rocketmq.tls.trustCertPath' needs"),
        (
            {"rocketmq.tls.enable": "false", "rocketmq.tls.certPath": "/c"},
            "'rocketmq.tls.certPath' needs rocketmq.tls.enable=true",
        ),
        ({"rocketmq.tls.enable": "yes"}, "'rocketmq.tls.enable' must be 'true' or 'false'"),
        ({"rocketmq.tls.trustCert": "/ca.pem"}, "is not a TLS option"),
    ],
)
def test_bad_spark_tls_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_source_options(_source(**options), streaming=False)


def test_spark_connection_config_gets_the_tls_options() -> None:
    opts = parse_source_options(
        _source(**{"rocketmq.tls.enable": "true", "rocketmq.tls.trustCertPath": "/ca.pem"}),
        streaming=False,
    )
    conn = Conn(opts.namesrv_addr, tls=opts.tls)
    settings = conn._open_instance().config.tls_settings()
    assert settings == TlsClientSettings(trust_cert_path="/ca.pem")
    assert Conn(opts.namesrv_addr)._open_instance().config.tls_settings() is None


@pytest.mark.parametrize("tool", [mqadmin, mqbench])
def test_bad_tls_variable_is_a_usage_error(tool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_USE_TLS", "maybe")
    monkeypatch.setenv("TRIMQ_TLS_KEY_PASSWORD", "hunter22")
    monkeypatch.setattr(tool, "_options", dict(tool._options))
    sub = ["topicList", "-n", "127.0.0.1:1"] if tool is mqadmin else ["producer", "-n", "x:1"]
    result = CliRunner().invoke(tool.cli, sub)
    assert result.exit_code == 2, result.output
    assert "bad client options (use_tls: Input should be a valid boolean" in result.output
    assert "hunter22" not in result.output

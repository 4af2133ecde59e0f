"""bench.peers.secure: the secured systems' accounts, certificates and settings, and how the
harness and its report name them."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench.peers import secure
from bench.peers.report import render, secured_notes, targets
from bench.peers.run import CONFIGS, OPT_IN, PAIRS
from broker.config import BrokerConfig
from common.acl import AclChecker, AclError, RequestSigner, parse_acl
from namesrv.config import NamesrvConfig
from remoting.codes import RequestCode

pytestmark = pytest.mark.unit


def test_the_bench_account_holds_the_bench_topics_and_groups_only() -> None:
    rules = parse_acl(secure.acl_yaml("b" * 24, "a" * 24, "c" * 24))
    assert rules.accounts[secure.BROKER_KEY].broker
    assert rules.accounts[secure.ADMIN_KEY].admin
    bench = rules.accounts[secure.BENCH_KEY]
    assert not bench.admin
    assert not bench.broker
    checker = AclChecker(rules)
    signer = RequestSigner(secure.BENCH_KEY, "c" * 24)
    for topic in secure.TOPICS:
        checker.check(RequestCode.SEND_MESSAGE_V2, signer.sign_fields({"b": topic}, b"x"), b"x", "")
    for group in secure.GROUPS:
        fields = signer.sign_fields({"consumerGroup": group, "topic": "Bench"}, None)
        checker.check(RequestCode.PULL_MESSAGE, fields, None, "")
    with pytest.raises(AclError, match="lacks PUB on topic:Other"):
        checker.check(RequestCode.SEND_MESSAGE_V2, signer.sign_fields({"b": "Other"}, b""), b"", "")
    with pytest.raises(AclError, match="admin"):
        checker.check(RequestCode.UPDATE_AND_CREATE_TOPIC, signer.sign_fields({}, None), None, "")


def _private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", secure.MODES)
def test_material_gives_valid_server_settings_and_client_variables(
    tmp_path: Path, mode: str
) -> None:
    material = secure.make_material(mode, tmp_path / "secure")
    ns_toml = secure.write_toml(tmp_path / "ns.toml", material.namesrv)
    br_toml = secure.write_toml(tmp_path / "br.toml", material.broker)
    assert _private(ns_toml)
    assert _private(br_toml)
    ns = NamesrvConfig.model_validate(tomllib.loads(ns_toml.read_text()))
    br = BrokerConfig.model_validate(tomllib.loads(br_toml.read_text()))
    if mode == "acl":
        assert ns.acl_enable
        assert br.acl_enable
        assert br.acl_access_key == secure.BROKER_KEY
        assert _private(tmp_path / "secure" / "plain_acl.yml")
        assert material.client_env["TRIMQ_ACCESS_KEY"] == secure.BENCH_KEY
        assert material.admin_env["TRIMQ_ACCESS_KEY"] == secure.ADMIN_KEY
        # The secret is in no setting a log or a command line shows.
        assert material.bench_secret not in repr(material)
    else:
        assert ns.tls_mode == br.tls_mode == "enforcing"
        assert br.tls_client_trust_cert_path == material.ca
        assert _private(tmp_path / "secure" / "server.key")
        assert material.client_env == {
            "TRIMQ_USE_TLS": "true",
            "TRIMQ_TLS_TRUST_CERT_PATH": material.ca,
        }


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown secured mode"):
        secure.make_material("open", tmp_path)


def test_the_secured_configs_are_opt_in_and_paired_with_trimq_async() -> None:
    for config in ("trimq-acl", "trimq-tls"):
        assert CONFIGS[config][1] in secure.MODES
        assert config in OPT_IN
        assert (config, "trimq-async") in PAIRS


def _run(w1: float) -> dict[str, Any]:
    res = {"result": {"msgs_per_s": w1, "messages": 1000}, "server_cpu_s": 1.0}
    return {"W1": {**res, "client_cpu_s": 0.5}}


def test_the_report_checks_the_acl_target_and_names_what_was_verified() -> None:
    acl = {**_run(80), "secured": ["broker unsigned: code 16", "broker signed: code 0"]}
    runs = {"trimq-async": [_run(100)], "trimq-acl": [acl]}
    got = {desc: (ok, figures) for desc, ok, figures in targets(runs)}
    ok, figures = got["ACL W1 >= 0.85x W1 without ACL"]
    assert ok is False
    assert "0.80x the reference" in figures
    notes = secured_notes(runs)
    assert notes == ["trimq-acl run 1 secured: broker unsigned: code 16; broker signed: code 0"]
    text = render({"runs": runs})
    assert f"- {notes[0]}" in text
    assert "| acl/trimq-async |" in text.splitlines()[0] + " |"

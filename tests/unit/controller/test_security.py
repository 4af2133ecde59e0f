"""The controller's TLS and ACL settings, its pre-dispatch check (the table's, then the
designated-election rule and brokerClusters), and `mqcontroller`'s exit code for a TLS or ACL
file that does not load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner

from client.config import ClientConfig
from client.controller_admin import ControllerAdmin
from common.acl import AclChecker, RequestSigner, parse_acl
from common.config import ConfigError
from controller.cli import main
from controller.config import ControllerConfig, load_config
from controller.server import ControllerServer
from remoting import RemotingCommand, RequestCode
from remoting.protocol.headers import (
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
)

pytestmark = pytest.mark.unit

NO_PERMISSION = 16

ACL = """
globalWhiteRemoteAddresses:
  - 198.51.100.7
accounts:
  - accessKey: broker-ak
    secretKey: broker-sk
    broker: true
    brokerClusters: [ClusterA]
  - accessKey: free-broker
    secretKey: free-broker-sk
    broker: true
  - accessKey: admin-ak
    secretKey: admin-sk
    admin: true
  - accessKey: trusted-ak
    secretKey: trusted-sk
    broker: true
    whiteRemoteAddress: 203.0.113.9
"""


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    out = {"ca": str(tmp_path / "ca.pem"), "cert": str(tmp_path / "s.pem")}
    ca.cert_pem.write_to_path(out["ca"])
    cert.private_key_and_cert_chain_pem.write_to_path(out["cert"])
    return out


def test_tls_and_acl_settings_from_the_environment(tmp_path: Path, pem: dict[str, str]) -> None:
    cfg = load_config(environ={})
    assert cfg.tls_mode == "disabled"
    assert cfg.client_tls() is None
    assert cfg.request_signer() is None
    acl = tmp_path / "plain_acl.yml"
    env = {
        "TRIMQ_TLS_MODE": "enforcing",
        "TRIMQ_TLS_SERVER_CERT_PATH": pem["cert"],
        "TRIMQ_TLS_CLIENT_TRUST_CERT_PATH": pem["ca"],
        "TRIMQ_ACL_ENABLE": "true",
        "TRIMQ_ACL_FILE": str(acl),
        "TRIMQ_ACL_ACCESS_KEY": "ctl-account",
        "TRIMQ_ACL_SECRET_KEY": "ctl-secret-1",
    }
    cfg = load_config(environ=env)
    tls = cfg.client_tls()
    assert tls is not None  # enforcing: its own connections use TLS too
    assert tls.trust_cert_path == pem["ca"]
    signer = cfg.request_signer()
    assert signer is not None
    assert signer.access_key == "ctl-account"
    assert "ctl-secret-1" not in repr(cfg)
    # tls_enable decides over the mode.
    assert load_config(environ={**env, "TRIMQ_TLS_ENABLE": "false"}).client_tls() is None
    permissive = {**env, "TRIMQ_TLS_MODE": "permissive"}
    assert load_config(environ=permissive).client_tls() is None
    assert load_config(environ={**permissive, "TRIMQ_TLS_ENABLE": "1"}).client_tls() is not None


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"TRIMQ_TLS_MODE": "enforcing"}, "cert"),
        ({"TRIMQ_TLS_MODE": "sometimes"}, "tls_mode"),
        ({"TRIMQ_ACL_ENABLE": "true"}, "acl_file"),
        ({"TRIMQ_ACL_ACCESS_KEY": "ctl-account"}, "go together"),
        ({"TRIMQ_TLS_ENABLE": "true", "TRIMQ_TLS_CLIENT_KEY_PATH": "/k.pem"}, "cert_path"),
    ],
)
def test_bad_security_settings_are_refused(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_config(environ=env)


def test_a_tls_mode_flag_without_a_certificate_exits_2() -> None:
    result = CliRunner().invoke(main, ["--tls-mode", "enforcing"], env={})
    assert result.exit_code == 2
    assert "TLS server mode enforcing needs cert_path" in result.output


def test_an_acl_file_that_does_not_load_exits_2(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: short\n")
    env = {"TRIMQ_ACL_FILE": str(acl)}
    result = CliRunner().invoke(
        main, ["--listen", "127.0.0.1:0", "--etcd", "http://192.0.2.1:1", "--acl"], env=env
    )
    assert result.exit_code == 2, result.output
    assert "bad ACL file" in result.output


def test_a_tls_file_that_does_not_load_exits_2(tmp_path: Path) -> None:
    env = {
        "TRIMQ_TLS_MODE": "enforcing",
        "TRIMQ_TLS_SERVER_CERT_PATH": str(tmp_path / "missing.pem"),
    }
    result = CliRunner().invoke(
        main, ["--listen", "127.0.0.1:0", "--etcd", "http://192.0.2.1:1"], env=env
    )
    assert result.exit_code == 2, result.output
    assert "no such file" in result.output


@dataclass
class _Conn:
    remote_address: str


def _checked() -> tuple[ControllerServer, AclChecker]:
    cfg = ControllerConfig(listen="127.0.0.1:0", acl_enable=True, acl_file="unused.yml")
    server = ControllerServer(cfg)
    assert server.acl is not None
    server.acl.replace(parse_acl(ACL))
    return server, server.acl


def _elect(designate: bool, signer: RequestSigner | None) -> RemotingCommand:
    cmd = RemotingCommand.request(
        RequestCode.CONTROLLER_ELECT_MASTER,
        ElectMasterRequestHeader(
            cluster_name="ClusterA", broker_name="b", broker_id=2, designate_elect=designate
        ).to_fields(),
    )
    if signer is not None:
        signer(cmd)
    return cmd


def test_a_designated_election_needs_an_admin_account() -> None:
    _, checker = _checked()
    check = ControllerServer._acl_check(checker)
    here = _Conn("192.0.2.10:40000")
    broker = RequestSigner("broker-ak", "broker-sk")
    # A broker asks for an ordinary election with its own account.
    assert check(here, _elect(False, broker)) is None
    refused = check(here, _elect(True, broker))
    assert refused is not None
    assert refused.code == NO_PERMISSION
    assert "designated election" in refused.remark
    assert "accessKey=broker-ak is not admin" in refused.remark
    assert check(here, _elect(True, RequestSigner("admin-ak", "admin-sk"))) is None
    # Unsigned: the table's check refuses it first (no AccessKey).
    unsigned = check(here, _elect(True, None))
    assert unsigned is not None
    assert "carries no AccessKey" in unsigned.remark
    # White lists pass it as they pass the table's admin codes.
    assert check(_Conn("198.51.100.7:1"), _elect(True, None)) is None
    trusted = _elect(True, None)
    trusted.ext_fields = {**(trusted.ext_fields or {}), "AccessKey": "trusted-ak"}
    assert check(_Conn("203.0.113.9:2"), trusted) is None


def test_broker_accounts_are_bound_to_their_clusters() -> None:
    server, _ = _checked()

    def bound(signer: RequestSigner | None) -> frozenset[str] | None:
        cmd = RemotingCommand.request(
            RequestCode.BROKER_HEARTBEAT,
            BrokerHeartbeatRequestHeader(
                cluster_name="ClusterA", broker_addr="192.0.2.1:1", broker_name="b", broker_id=1
            ).to_fields(),
        )
        if signer is not None:
            signer(cmd)
        return server._bound_clusters(cmd)

    assert bound(RequestSigner("broker-ak", "broker-sk")) == frozenset({"ClusterA"})
    assert bound(RequestSigner("free-broker", "free-broker-sk")) is None
    assert bound(RequestSigner("admin-ak", "admin-sk")) is None
    assert bound(None) is None
    # Without ACL nothing is bound.
    open_server = ControllerServer(ControllerConfig(listen="127.0.0.1:0"))
    assert open_server.acl is None


def test_controller_admin_from_a_client_config(pem: dict[str, str]) -> None:
    cfg = ClientConfig(
        namesrv_addr="127.0.0.1:9876",
        access_key="admin-ak",
        secret_key="admin-sk",
        use_tls=True,
        tls_trust_cert_path=pem["ca"],
    )
    admin = ControllerAdmin.from_config("127.0.0.1:9878", cfg)
    assert admin.addrs == ["127.0.0.1:9878"]
    signer = admin._client.before_send
    assert isinstance(signer, RequestSigner)
    assert signer.access_key == "admin-ak"
    assert admin._client.tls is not None
    assert admin._client.tls.trust_cert_path == pem["ca"]
    plain = ControllerAdmin.from_config(
        "127.0.0.1:9878", ClientConfig(namesrv_addr="127.0.0.1:9876", use_tls=False)
    )
    assert plain._client.before_send is None
    assert plain._client.tls is None

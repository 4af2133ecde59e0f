"""Controller mode in a secured cluster, on 127.0.0.1: a real `mqcontroller` process (TLS
enforcing and ACL on, set through TRIMQ_* variables as a deployment would), a real etcd, and a
NameServer and two brokers in process, every server with ACL on and TLS enforcing.

The brokers get ids and roles from the controller over TLS with signed requests; a signed TLS
producer's sends are acknowledged by the group; the controller's own signed 1008 reaches the
brokers (their group reads are slowed to once a minute, so only the controller's notice can
promote the slave in time) and the group fails over when the master is killed. Unsigned
requests, a non-broker account, another cluster's broker account and a broker account
designating a master are refused NO_PERMISSION with a remark; a plain connection to the
controller's port gets nothing; mqadmin's controller commands work with an account and TLS
options and are refused without an account; an account added to the file is accepted once the
controller reloads it."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from client.controller_admin import ControllerAdmin
from client.errors import MQClientError
from common.acl import RequestSigner
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.headers import (
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
)
from remoting.tls import TlsClientSettings
from tests.helpers import free_port, wait_until
from tests.integration.etcd_support import EtcdProc, etcd_procs
from tests.integration.procs import BIN_DIR, ManagedProcess, child_env
from tests.integration.test_broker_process import send_request
from tests.integration.test_controller_mode import _broker, _broker_config
from tests.integration.test_tls_remoting import Pki, make_pki

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("staging_guard")]

NO_PERMISSION = 16

ACL = """
accounts:
  - accessKey: broker-ak
    secretKey: broker-sk
    broker: true
    brokerClusters: [DefaultCluster]
  - accessKey: controller-ak
    secretKey: controller-sk
    broker: true
  - accessKey: other-broker-ak
    secretKey: other-broker-sk
    broker: true
    brokerClusters: [OtherCluster]
  - accessKey: app-ak-1
    secretKey: app-sk-1
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - SecT=PUB|SUB
  - accessKey: admin-ak
    secretKey: admin-sk
    admin: true
"""


class ControllerProc(ManagedProcess):
    """`mqcontroller --listen 127.0.0.1:<port> --etcd <url>` with the given environment."""

    def __init__(self, workdir: Path, etcd_url: str, env: dict[str, str]) -> None:
        super().__init__("mqcontroller", workdir, free_port(), env)
        self.etcd_url = etcd_url

    def argv(self) -> list[str]:
        return [
            str(BIN_DIR / "mqcontroller"),
            "--listen",
            self.addr,
            "--etcd",
            self.etcd_url,
        ]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProc]:
    with etcd_procs(tmp_path) as start:
        yield start()


def _tls_server(pki: Pki) -> dict[str, object]:
    return {
        "tls_mode": "enforcing",
        "tls_server_cert_path": pki.server_cert,
        "tls_server_key_path": pki.server_key,
    }


def _signed(cmd: RemotingCommand, ak: str, sk: str) -> RemotingCommand:
    RequestSigner(ak, sk)(cmd)
    return cmd


def _register(cluster: str = "DefaultCluster") -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.CONTROLLER_REGISTER_BROKER,
        RegisterBrokerToControllerRequestHeader(
            cluster_name=cluster, broker_name="broker-a", broker_id=9, broker_address="192.0.2.1:1"
        ).to_fields(),
    )


def _heartbeat(cluster: str = "DefaultCluster") -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.BROKER_HEARTBEAT,
        BrokerHeartbeatRequestHeader(
            cluster_name=cluster, broker_addr="192.0.2.1:1", broker_name="broker-a", broker_id=9
        ).to_fields(),
    )


async def _refusals(client: RemotingClient, ctl: str, broker_addr: str) -> None:
    """What the controller (and a broker, for 1008) refuses, with the remark it gives."""
    for make in (_register, _heartbeat):
        resp = await client.invoke(ctl, make())
        assert resp.code == NO_PERMISSION, (resp.code, resp.remark)
        assert "carries no AccessKey" in (resp.remark or "")
        resp = await client.invoke(ctl, _signed(make(), "app-ak-1", "app-sk-1"))
        assert resp.code == NO_PERMISSION
        assert "needs a broker or admin account; accessKey=app-ak-1" in (resp.remark or "")
        resp = await client.invoke(ctl, _signed(make(), "broker-ak", "wrong-secret"))
        assert resp.code == NO_PERMISSION
        assert "signature check failed for accessKey=broker-ak" in (resp.remark or "")
        # A broker account bound to another cluster may not act on this one's group.
        resp = await client.invoke(ctl, _signed(make(), "other-broker-ak", "other-broker-sk"))
        assert resp.code == NO_PERMISSION, (resp.code, resp.remark)
        assert "OtherCluster only" in (resp.remark or "")
    # Naming its own cluster does not help: the group is DefaultCluster's.
    resp = await client.invoke(
        ctl, _signed(_register("OtherCluster"), "other-broker-ak", "other-broker-sk")
    )
    assert resp.code == NO_PERMISSION
    assert "group broker-a is in cluster DefaultCluster" in (resp.remark or "")
    # A designated election is an admin's; a broker account may not make one.
    elect = RemotingCommand.request(
        RequestCode.CONTROLLER_ELECT_MASTER,
        ElectMasterRequestHeader(
            cluster_name="DefaultCluster", broker_name="broker-a", broker_id=2, designate_elect=True
        ).to_fields(),
    )
    resp = await client.invoke(ctl, _signed(elect, "broker-ak", "broker-sk"))
    assert resp.code == NO_PERMISSION
    assert "needs an admin account; accessKey=broker-ak is not admin" in (resp.remark or "")
    # The controller's administration codes need an admin account.
    clean = _signed(
        RemotingCommand.request(RequestCode.CLEAN_BROKER_DATA), "broker-ak", "broker-sk"
    )
    resp = await client.invoke(ctl, clean)
    assert resp.code == NO_PERMISSION
    assert "needs an admin account" in (resp.remark or "")
    # The broker takes a role change only from a broker account (the controller's is one).
    notify = RemotingCommand.request(
        RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
        NotifyBrokerRoleChangedRequestHeader(
            master_address="192.0.2.1:1", master_epoch=99, sync_state_set_epoch=99
        ).to_fields(),
    )
    resp = await client.invoke(broker_addr, _signed(notify, "app-ak-1", "app-sk-1"))
    assert resp.code == NO_PERMISSION


async def _mqadmin(*args: str) -> tuple[int, str, str]:
    proc = await trio.run_process(
        [str(BIN_DIR / "mqadmin"), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=child_env(),
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_a_secured_controller_mode_group(tmp_path: Path, etcd: EtcdProc) -> None:
    pki = make_pki(tmp_path)
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    controller = ControllerProc(
        tmp_path / "ctl",
        etcd.url,
        {
            "TRIMQ_TLS_MODE": "enforcing",
            "TRIMQ_TLS_SERVER_CERT_PATH": pki.server_cert,
            "TRIMQ_TLS_SERVER_KEY_PATH": pki.server_key,
            "TRIMQ_TLS_CLIENT_TRUST_CERT_PATH": pki.ca,
            "TRIMQ_ACL_ENABLE": "true",
            "TRIMQ_ACL_FILE": str(acl_file),
            "TRIMQ_ACL_ACCESS_KEY": "controller-ak",
            "TRIMQ_ACL_SECRET_KEY": "controller-sk",
            "TRIMQ_ACL_RELOAD_INTERVAL_MS": "200",
            "TRIMQ_LEASE_TTL_S": "2",
            "TRIMQ_ETCD_TIMEOUT_MS": "600",
            "TRIMQ_BROKER_HEARTBEAT_TIMEOUT_MS": "1500",
            "TRIMQ_SCAN_INACTIVE_MASTER_INTERVAL_MS": "200",
        },
    )
    await trio.to_thread.run_sync(controller.start)
    try:
        await _secured_group(tmp_path, pki, acl_file, controller.addr)
    finally:
        await trio.to_thread.run_sync(controller.stop)
    assert "acl_refused" in controller.log_text()


async def _secured_group(tmp_path: Path, pki: Pki, acl_file: Path, ctl: str) -> None:
    client_tls = TlsClientSettings(trust_cert_path=pki.ca)
    secured = {**_tls_server(pki), "acl_enable": True, "acl_file": str(acl_file)}
    ns_cfg = NamesrvConfig.model_validate({"listen": "127.0.0.1:0", **secured})
    async with (
        NameServer(ns_cfg) as ns,
        ControllerAdmin(ctl, signer=RequestSigner("app-ak-1", "app-sk-1"), tls=client_tls) as admin,
        RemotingClient(tls=client_tls) as client,
    ):
        # Reads need any account; the controller leads once its lease is granted.
        async def leads() -> bool:
            try:
                return (await admin.metadata(ctl)).is_leader
            except Exception:
                return False

        with trio.fail_after(20):
            while not await leads():
                await trio.sleep(0.2)

        broker_kw = {
            **secured,
            "tls_client_trust_cert_path": pki.ca,
            "acl_access_key": "broker-ak",
            "acl_secret_key": "broker-sk",
            # Group reads once a minute: only the controller's 1008 can promote in time.
            "sync_broker_metadata_period_ms": 60_000,
        }
        cfg_a = _broker_config(tmp_path, "a0", ns.address, ctl, **broker_kw)
        cfg_b = _broker_config(tmp_path, "a1", ns.address, ctl, **broker_kw)
        async with _broker(cfg_a) as (a, kill_a):
            await wait_until(lambda: a.role == "SYNC_MASTER", total=20, what="a master")
            async with _broker(cfg_b) as (b, _):
                await wait_until(lambda: b.role == "SLAVE" and not b.role_pending, total=20)
                await wait_until(
                    lambda: (
                        a.replicas is not None and a.replicas.sync_state_set == frozenset({1, 2})
                    ),
                    total=20,
                    what="the slave in the SyncStateSet",
                )
                table = await admin.sync_state_data(["broker-a"])
                assert sorted(m["brokerId"] for m in table["broker-a"]["inSyncReplicas"]) == [1, 2]

                aaddr, baddr = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
                await _refusals(client, ctl, aaddr)
                # A plain connection to the enforcing controller gets nothing.
                async with RemotingClient() as plain:
                    with pytest.raises(RemotingError):
                        await plain.invoke(
                            ctl, RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO)
                        )

                # Signed sends over TLS, acknowledged by both replicas (all-ack).
                async with RemotingClient(
                    tls=client_tls, before_send=RequestSigner("app-ak-1", "app-sk-1")
                ) as app:
                    for i in range(20):
                        resp = await app.invoke(aaddr, send_request("SecT", b"secure %d" % i))
                        assert resp.code == ResponseCode.SUCCESS, resp.remark
                        assert b.store.max_phy_offset >= a.store.max_phy_offset

                    # The master dies; the controller elects the slave and tells it (1008).
                    assert b.replicas is not None
                    old_epoch = b.replicas.master_epoch
                    killed = time.monotonic()
                    kill_a.cancel()
                    await wait_until(
                        lambda: b.role == "SYNC_MASTER", total=10, what="the slave promoted"
                    )
                    promoted = time.monotonic() - killed
                    assert b.replicas.master_epoch > old_epoch
                    with trio.fail_after(10):
                        while True:
                            resp = await app.invoke(baddr, send_request("SecT", b"after"))
                            if resp.code == ResponseCode.SUCCESS:
                                break
                            await trio.sleep(0.2)
                    taking_sends = time.monotonic() - killed
                # Shown with -s: the secured failover's figures.
                print(
                    f"secured failover: promoted {promoted:.2f} s, sends taken "
                    f"{taking_sends:.2f} s after the kill",
                    file=sys.stderr,
                )

                # mqadmin's controller commands: an account and TLS options, as elsewhere.
                tls_args = ["--tls", "--tls-trust-cert", pki.ca]
                rc, out, err = await _mqadmin(
                    "--access-key", "admin-ak", "--secret-key", "admin-sk", *tls_args,
                    "getSyncStateSet", "-a", ctl, "-b", "broker-a", "--json",
                )  # fmt: skip
                assert rc == 0, err
                group = json.loads(out)["broker-a"]
                assert group["masterAddress"] == baddr
                rc, out, err = await _mqadmin(*tls_args, "getControllerMetaData", "-a", ctl)
                assert rc == 1
                assert "code 16" in err
                assert "carries no AccessKey" in err

        # The controller reloads its accounts file: an account added is accepted.
        late = RequestSigner("late-admin", "late-admin-sk")
        async with ControllerAdmin(ctl, signer=late, tls=client_tls) as late_admin:
            with pytest.raises(MQClientError, match="no account has accessKey=late-admin"):
                await late_admin.metadata(ctl)
            text = (
                ACL + "  - accessKey: late-admin\n    secretKey: late-admin-sk\n    admin: true\n"
            )
            await trio.to_thread.run_sync(acl_file.write_text, text)
            with trio.fail_after(10):
                while True:
                    try:
                        assert (await late_admin.metadata(ctl)).is_leader
                        break
                    except MQClientError:
                        await trio.sleep(0.1)

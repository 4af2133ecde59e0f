"""With ACL on, the NameServer's routes belong to the brokers of their cluster: a registration
that would replace, move or remove a live broker needs a valid signature of a broker account of
that cluster (an admin account, another cluster's broker account or a white-listed address is
not enough), and a broker account bound to clusters (`brokerClusters`) registers only there."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.acl import RequestSigner
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import RegisterBrokerRequestHeader, UnRegisterBrokerRequestHeader
from remoting.protocol.route import RegisterBrokerBody, TopicConfigSerializeWrapper

pytestmark = [pytest.mark.integration]

ACL = """
globalWhiteRemoteAddresses:
  - 192.0.2.*
accounts:
  - accessKey: broker-of-a
    secretKey: broker-of-a-sk
    broker: true
    brokerClusters: [ClusterA]
  - accessKey: broker-of-b
    secretKey: broker-of-b-sk
    broker: true
    brokerClusters: [ClusterB]
  - accessKey: broker-any
    secretKey: broker-any-sk
    broker: true
  - accessKey: admin-ak
    secretKey: admin-sk
    admin: true
"""

A = ("broker-of-a", "broker-of-a-sk")
B = ("broker-of-b", "broker-of-b-sk")
ANY = ("broker-any", "broker-any-sk")
ADMIN = ("admin-ak", "admin-sk")


def _register(
    name: str, addr: str, signer: tuple[str, str] | None, cluster: str = "ClusterA", bid: int = 0
) -> RemotingCommand:
    fields = RegisterBrokerRequestHeader(
        broker_name=name, broker_addr=addr, cluster_name=cluster, ha_server_addr="", broker_id=bid
    ).to_fields()
    body = RegisterBrokerBody(TopicConfigSerializeWrapper({}), []).encode()
    cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, dict(fields), body)
    if signer is not None:
        RequestSigner(*signer)(cmd)
    return cmd


def _unregister(name: str, addr: str, signer: tuple[str, str], cluster: str) -> RemotingCommand:
    fields = UnRegisterBrokerRequestHeader(
        broker_name=name, broker_addr=addr, cluster_name=cluster, broker_id=0
    ).to_fields()
    cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, dict(fields))
    RequestSigner(*signer)(cmd)
    return cmd


async def test_live_routes_belong_to_their_clusters_broker_accounts(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    cfg = NamesrvConfig(listen="127.0.0.1:0", acl_enable=True, acl_file=str(acl_file))
    async with NameServer(cfg) as ns, RemotingClient() as raw:

        async def answer(cmd: RemotingCommand) -> tuple[int, str]:
            # The stranger's requests come over connections of their own (closing the
            # registering connection would remove its brokers: `raw` stays open).
            async with RemotingClient() as one:
                resp = await one.invoke(ns.address, cmd)
            return resp.code, resp.remark or ""

        def addrs(name: str) -> dict[int, str] | None:
            bd = ns.route_table.broker_addr_table.get(name)
            return None if bd is None else dict(bd.broker_addrs)

        live = "127.0.0.1:20001"
        assert (await raw.invoke(ns.address, _register("broker-a", live, A))).code == 0
        assert addrs("broker-a") == {0: live}

        # Another cluster's broker account may neither take the address nor move the group.
        code, remark = await answer(_register("broker-a", "127.0.0.1:20002", B))
        assert code == ResponseCode.NO_PERMISSION
        assert "ClusterA" in remark
        assert "broker-of-b" in remark
        assert B[1] not in remark
        code, _ = await answer(_register("broker-a", live, B, cluster="ClusterB"))
        assert code == ResponseCode.NO_PERMISSION
        # ... nor register anything in a cluster not its own.
        code, _ = await answer(_register("broker-new", "127.0.0.1:20009", B))
        assert code == ResponseCode.NO_PERMISSION
        # An admin account passes the request's ACL check but may not displace a live broker.
        code, remark = await answer(_register("broker-a", "127.0.0.1:20002", ADMIN))
        assert code == ResponseCode.NO_PERMISSION
        assert f"broker-a id 0 at {live}" in remark
        assert "not a broker account" in remark
        # A wrong secret for the right account.
        code, _ = await answer(_register("broker-a", "127.0.0.1:20002", (A[0], "wrong-secret")))
        assert code == ResponseCode.NO_PERMISSION
        # Unregistering another cluster's live broker from elsewhere.
        code, _ = await answer(_unregister("broker-a", live, B, "ClusterB"))
        assert code == ResponseCode.NO_PERMISSION
        code, _ = await answer(_unregister("broker-a", live, ADMIN, "ClusterA"))
        assert code == ResponseCode.NO_PERMISSION
        assert addrs("broker-a") == {0: live}
        assert live in ns.route_table.broker_live_table

        # What is allowed: an admin adds a broker nobody holds; the cluster's broker account
        # (or an unbound one) replaces a live master, as a failover does.
        assert (await answer(_register("broker-x", "127.0.0.1:20010", ADMIN)))[0] == 0
        assert (await raw.invoke(ns.address, _register("broker-a", "127.0.0.1:20002", A))).code == 0
        assert addrs("broker-a") == {0: "127.0.0.1:20002"}
        assert (
            await raw.invoke(ns.address, _register("broker-a", "127.0.0.1:20003", ANY))
        ).code == 0
        assert addrs("broker-a") == {0: "127.0.0.1:20003"}

        # A broker unregisters itself over the connection it registered on with any broker
        # account the request's check allows; from another connection it needs its cluster's.
        own = _register("broker-y", "127.0.0.1:20020", ANY)
        assert (await raw.invoke(ns.address, own)).code == ResponseCode.SUCCESS
        bye = _unregister("broker-y", "127.0.0.1:20020", ANY, "ClusterA")
        assert (await raw.invoke(ns.address, bye)).code == ResponseCode.SUCCESS
        assert addrs("broker-y") is None
        assert (await answer(_unregister("broker-a", "127.0.0.1:20003", A, "ClusterA")))[0] == 0
        assert addrs("broker-a") is None


async def test_a_white_listed_address_cannot_displace_a_live_broker(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL.replace("192.0.2.*", "127.0.0.1"))
    cfg = NamesrvConfig(listen="127.0.0.1:0", acl_enable=True, acl_file=str(acl_file))
    async with NameServer(cfg) as ns, RemotingClient() as raw:
        # Unsigned registrations from the white-listed address pass the request's check ...
        first = await raw.invoke(ns.address, _register("broker-w", "127.0.0.1:20030", None))
        assert first.code == ResponseCode.SUCCESS
        # ... but replacing a live broker needs the signature of its cluster's broker account.
        async with RemotingClient() as other:
            hijack = _register("broker-w", "127.0.0.1:20031", None)
            resp = await other.invoke(ns.address, hijack)
        assert resp.code == ResponseCode.NO_PERMISSION
        assert "carries no AccessKey" in (resp.remark or "")
        bd = ns.route_table.broker_addr_table["broker-w"]
        assert bd.broker_addrs == {0: "127.0.0.1:20030"}

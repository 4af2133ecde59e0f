"""Two `ControllerServer`s on one etcd (real processes' worth of wire: RemotingCommand over
127.0.0.1): one leads; brokers get ids, register and heartbeat; the first election, a
SyncStateSet change, a dead master replaced from the set by the leader's scan, a leader that
stops replaced by the other with the state intact, and bad requests answered with RocketMQ's
controller codes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from controller.config import ControllerConfig
from controller.replicas import ControllerCode
from controller.server import ControllerServer
from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.headers import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    RegisterBrokerToControllerRequestHeader,
)
from tests.helpers import free_port, wait_until
from tests.integration.etcd_support import EtcdProc, etcd_procs

pytestmark = pytest.mark.slow  # a leader lease must expire once (2 s)

R = RequestCode


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProc]:
    with etcd_procs(tmp_path) as start:
        yield start()


def _config(etcd: EtcdProc, root: str) -> ControllerConfig:
    return ControllerConfig(
        listen=f"127.0.0.1:{free_port()}",
        etcd_endpoints=etcd.url,
        etcd_root=root,
        lease_ttl_s=2,
        etcd_timeout_ms=600,
        broker_heartbeat_timeout_ms=800,
        scan_inactive_master_interval_ms=100,
    )


def _req(
    code: int, fields: dict[str, str] | None = None, body: bytes | None = None
) -> RemotingCommand:
    return RemotingCommand.request(code, fields or {}, body=body)


async def _beat(client: RemotingClient, addrs: list[str], bid: int, offset: int) -> None:
    hdr = BrokerHeartbeatRequestHeader(
        cluster_name="C",
        broker_addr=f"127.0.0.1:{20000 + bid}",
        broker_name="broker-a",
        broker_id=bid,
        epoch=0,
        max_offset=offset,
        heartbeat_timeout_mills=800,
    )
    for addr in addrs:
        try:
            resp = await client.invoke(addr, _req(R.BROKER_HEARTBEAT, hdr.to_fields()))
        except RemotingError:
            continue  # a stopped controller: brokers heartbeat the others regardless
        assert resp.code == ResponseCode.SUCCESS


async def _join(client: RemotingClient, addr: str, *, register: bool) -> None:
    """Replicas 1 and 2 of broker-a take their ids (and register) at the leader `addr`."""
    for bid in (1, 2):
        apply = ApplyBrokerIdRequestHeader(
            cluster_name="C",
            broker_name="broker-a",
            applied_broker_id=bid,
            register_check_code=f"127.0.0.1:{20000 + bid};{bid}",
        )
        resp = await client.invoke(addr, _req(R.CONTROLLER_APPLY_BROKER_ID, apply.to_fields()))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        if register:
            reg = RegisterBrokerToControllerRequestHeader(
                cluster_name="C",
                broker_name="broker-a",
                broker_id=bid,
                broker_address=f"127.0.0.1:{20000 + bid}",
            )
            resp = await client.invoke(addr, _req(R.CONTROLLER_REGISTER_BROKER, reg.to_fields()))
            assert resp.code == ResponseCode.SUCCESS, resp.remark


async def _heartbeats(client: RemotingClient, addrs: list[str], beating: dict[int, bool]) -> None:
    """Every 100 ms, each replica whose flag is on heartbeats to every controller in `addrs`."""
    while True:
        for bid, on in beating.items():
            if on:
                await _beat(client, addrs, bid, 100 * bid)
        await trio.sleep(0.1)


async def test_election_failover_and_leader_change(etcd: EtcdProc) -> None:
    a, b = ControllerServer(_config(etcd, "/t1")), ControllerServer(_config(etcd, "/t1"))
    scopes: dict[int, trio.CancelScope] = {}

    async def host(ctl: ControllerServer, *, task_status: trio.TaskStatus[int]) -> None:
        with trio.CancelScope() as scope:
            scopes[id(ctl)] = scope
            await ctl.run(task_status=task_status)

    async with RemotingClient() as client, trio.open_nursery() as nursery:
        await nursery.start(host, a)
        await nursery.start(host, b)
        await wait_until(lambda: a.is_leader or b.is_leader, total=15, what="a leader")
        leader, other = (a, b) if a.is_leader else (b, a)
        laddr, oaddr = f"127.0.0.1:{leader.port}", f"127.0.0.1:{other.port}"
        both = [laddr, oaddr]

        # The follower refuses state requests and names the leader.
        info = GetReplicaInfoRequestHeader(broker_name="broker-a").to_fields()
        refused = await client.invoke(oaddr, _req(R.CONTROLLER_GET_REPLICA_INFO, info))
        assert refused.code == ControllerCode.NOT_LEADER
        assert leader.address in (refused.remark or "")

        await _join(client, laddr, register=True)
        beating = {1: True, 2: True}
        nursery.start_soon(_heartbeats, client, both, beating)
        await wait_until(lambda: len(leader.liveness.alive("C", "broker-a", leader._clock())) == 2)

        # The first election: the replica furthest ahead.
        elect = ElectMasterRequestHeader(cluster_name="C", broker_name="broker-a", broker_id=1)
        resp = await client.invoke(laddr, _req(R.CONTROLLER_ELECT_MASTER, elect.to_fields()))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert resp.ext_fields is not None
        assert (resp.ext_fields["masterBrokerId"], resp.ext_fields["masterEpoch"]) == ("2", "1")

        # The master adds the other replica to its SyncStateSet.
        alter = AlterSyncStateSetRequestHeader(
            broker_name="broker-a", master_broker_id=2, master_epoch=1
        )
        body = json.dumps({"syncStateSet": [1, 2], "syncStateSetEpoch": 1}).encode()
        resp = await client.invoke(
            laddr, _req(R.CONTROLLER_ALTER_SYNC_STATE_SET, alter.to_fields(), body)
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        stale = await client.invoke(
            laddr, _req(R.CONTROLLER_ALTER_SYNC_STATE_SET, alter.to_fields(), body)
        )
        assert stale.code == ControllerCode.FENCED_SYNC_STATE_SET_EPOCH

        # The master stops heartbeating: the leader's scan promotes the in-sync replica.
        beating[2] = False

        async def master_of(addr: str) -> tuple[int, int]:
            resp = await client.invoke(addr, _req(R.CONTROLLER_GET_REPLICA_INFO, info))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            hdr = GetReplicaInfoResponseHeader.from_fields(resp.ext_fields)
            return hdr.master_broker_id or 0, hdr.master_epoch or 0

        async def promoted() -> bool:
            return await master_of(laddr) == (1, 2)

        await wait_until(promoted, total=15, what="replica 1 promoted")

        # The leader goes: the other controller leads, with the state kept in etcd.
        scopes[id(leader)].cancel()
        await wait_until(lambda: other.is_leader, total=15, what="the other controller leads")
        assert await master_of(oaddr) == (1, 2)
        data = await client.invoke(
            oaddr, _req(R.CONTROLLER_GET_SYNC_STATE_DATA, body=json.dumps(["broker-a"]).encode())
        )
        table = json.loads(data.body_bytes())["replicasInfoTable"]["broker-a"]
        assert table["masterBrokerId"] == 1
        assert [m["brokerId"] for m in table["inSyncReplicas"]] == [1]
        assert [m["brokerId"] for m in table["notInSyncReplicas"]] == [2]
        nursery.cancel_scope.cancel()


async def test_bad_requests_get_controller_codes(etcd: EtcdProc) -> None:
    async with ControllerServer(_config(etcd, "/t2")) as ctl, RemotingClient() as client:
        await wait_until(lambda: ctl.is_leader, total=15, what="leadership")
        addr = f"127.0.0.1:{ctl.port}"
        cases: list[tuple[RemotingCommand, int]] = [
            (
                _req(
                    R.CONTROLLER_REGISTER_BROKER,
                    RegisterBrokerToControllerRequestHeader(
                        cluster_name="C", broker_name="nobody", broker_id=1, broker_address="x:1"
                    ).to_fields(),
                ),
                ControllerCode.BROKER_METADATA_NOT_EXIST,
            ),
            (_req(R.BROKER_HEARTBEAT, {"clusterName": "C"}), ControllerCode.INVALID_REQUEST),
            (
                _req(
                    R.CONTROLLER_GET_REPLICA_INFO,
                    GetReplicaInfoRequestHeader(broker_name="a b").to_fields(),
                ),
                ControllerCode.INVALID_REQUEST,
            ),
            (
                _req(
                    R.CONTROLLER_ALTER_SYNC_STATE_SET,
                    AlterSyncStateSetRequestHeader(
                        broker_name="broker-a", master_broker_id=1, master_epoch=1
                    ).to_fields(),
                    b"not json",
                ),
                ControllerCode.INVALID_REQUEST,
            ),
            (
                _req(R.CONTROLLER_GET_SYNC_STATE_DATA, body=b'{"no": "list"}'),
                ControllerCode.INVALID_REQUEST,
            ),
            (
                _req(
                    R.CONTROLLER_APPLY_BROKER_ID,
                    ApplyBrokerIdRequestHeader(
                        cluster_name="C",
                        broker_name="x" * 300,
                        applied_broker_id=1,
                        register_check_code="a;1",
                    ).to_fields(),
                ),
                ControllerCode.INVALID_REQUEST,
            ),
        ]
        for cmd, code in cases:
            resp = await client.invoke(addr, cmd)
            assert resp.code == code, (cmd.code, resp.code, resp.remark)
            assert resp.remark


MQADMIN = str(Path(sys.executable).parent / "mqadmin")


async def _mqadmin(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [MQADMIN, *args], capture_stdout=True, capture_stderr=True, check=False
    )


async def test_mqadmin_controller_commands(etcd: EtcdProc) -> None:
    async with (
        ControllerServer(_config(etcd, "/t3")) as ctl,
        RemotingClient() as client,
        trio.open_nursery() as nursery,
    ):
        await wait_until(lambda: ctl.is_leader, total=15, what="leadership")
        addr = f"127.0.0.1:{ctl.port}"
        await _join(client, addr, register=False)
        nursery.start_soon(_heartbeats, client, [addr], {1: True, 2: True})
        await wait_until(lambda: len(ctl.liveness.alive("C", "broker-a", ctl._clock())) == 2)
        elect = ElectMasterRequestHeader(cluster_name="C", broker_name="broker-a", broker_id=2)
        assert (
            await client.invoke(addr, _req(R.CONTROLLER_ELECT_MASTER, elect.to_fields()))
        ).code == 0

        meta = await _mqadmin("getControllerMetaData", "-a", addr, "--json")
        assert meta.returncode == 0, meta.stderr
        assert json.loads(meta.stdout)["isLeader"] is True
        sss = await _mqadmin("getSyncStateSet", "-a", addr, "-b", "broker-a", "--json")
        assert sss.returncode == 0, sss.stderr
        group = json.loads(sss.stdout)["broker-a"]
        assert (group["masterBrokerId"], group["masterEpoch"]) == (2, 1)
        table = await _mqadmin("getSyncStateSet", "-a", addr, "-b", "broker-a")
        assert b"#InSync" in table.stdout
        # Replica 1 is not in sync: the controller refuses to elect it, and says why.
        refused = await _mqadmin("electMaster", "-a", addr, "-c", "C", "-bn", "broker-a", "-b", "1")
        assert refused.returncode == 1
        assert b"2012" in refused.stderr
        alter = AlterSyncStateSetRequestHeader(
            broker_name="broker-a", master_broker_id=2, master_epoch=1
        )
        body = json.dumps({"syncStateSet": [1, 2], "syncStateSetEpoch": 1}).encode()
        resp = await client.invoke(
            addr, _req(R.CONTROLLER_ALTER_SYNC_STATE_SET, alter.to_fields(), body)
        )
        assert resp.code == ResponseCode.SUCCESS
        moved = await _mqadmin(
            "electMaster", "-a", addr, "-c", "C", "-bn", "broker-a", "-b", "1", "--json"
        )
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["masterBrokerId"] == 1
        unknown = await _mqadmin("getSyncStateSet", "-a", addr, "-b", "nosuch")
        assert unknown.returncode == 1
        assert b"nosuch" in unknown.stderr
        bad = await _mqadmin("electMaster", "-a", addr, "-c", "C", "-bn", "broker-a", "-b", "0")
        assert bad.returncode == 2
        dead = await _mqadmin("getControllerMetaData", "-a", "127.0.0.1:1")
        assert dead.returncode == 1
        nursery.cancel_scope.cancel()

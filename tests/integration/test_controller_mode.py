"""Brokers in controller mode, in process on 127.0.0.1, with a real etcd and a controller:
the two replicas of broker-a get ids and roles from the controller (one master registered
as id 0, one slave), the slave joins the SyncStateSet once caught up, SYNC sends wait for
it; the master stops: the controller promotes the slave, which takes sends under the same
broker name with every acknowledged message kept; the old master comes back as a slave,
cuts what the group never acknowledged (its epoch entries against the new master's) and
ends byte-identical; a master whose SyncStateSet is below `min_in_sync_replicas` refuses
sends before storing them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.ha_autoswitch import AutoSwitchHASlave
from client import Admin, ClientConfig
from client.controller_admin import ControllerAdmin
from common.message import MessageInner, decode_records
from common.pull import PULL_FLAG_SUSPEND
from controller.config import ControllerConfig
from controller.server import ControllerServer
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, ResponseCode
from store import MessageStore, PutMessageStatus
from tests.helpers import free_port, wait_until
from tests.integration.etcd_support import EtcdProc, etcd_procs
from tests.integration.test_broker_process import PULL_SUBSCRIPTION, pull_request, send_request
from tests.integration.test_replication import _assert_same_commitlogs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("staging_guard")]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProc]:
    with etcd_procs(tmp_path) as start:
        yield start()


def _controller_config(etcd: EtcdProc) -> ControllerConfig:
    return ControllerConfig(
        listen=f"127.0.0.1:{free_port()}",
        etcd_endpoints=etcd.url,
        lease_ttl_s=2,
        etcd_timeout_ms=600,
        broker_heartbeat_timeout_ms=1500,
        scan_inactive_master_interval_ms=200,
    )


def _broker_config(tmp_path: Path, name: str, namesrv: str, ctl: str, **kw: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "listen": f"127.0.0.1:{free_port()}",
            "ha_listen_port": free_port(),
            "store_dir": str(tmp_path / name),
            "namesrv_addr": namesrv,
            "mapped_file_size_commitlog": 64 * 1024,
            "mapped_file_size_consume_queue": 20_000,
            "register_name_server_period_ms": 500,
            "slave_timeout_ms": 2000,
            "slave_sync_interval_ms": 300,
            "enable_controller_mode": True,
            "controller_addr": ctl,
            "controller_heartbeat_timeout_ms": 1500,
            "broker_heartbeat_interval_ms": 200,
            "sync_broker_metadata_period_ms": 300,
            "check_sync_state_set_period_ms": 500,
            "ha_max_time_slave_not_catchup_ms": 2000,
            "ha_send_heartbeat_interval_ms": 500,
            "all_ack_in_sync_state_set": True,
            **kw,
        }
    )


@asynccontextmanager
async def _control_plane(etcd: EtcdProc) -> AsyncIterator[tuple[NameServer, str, RemotingClient]]:
    """A NameServer, a controller that leads (its address) and a client."""
    async with (
        NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns,
        ControllerServer(_controller_config(etcd)) as ctl,
        RemotingClient() as client,
    ):
        await wait_until(lambda: ctl.is_leader, total=15, what="a controller leader")
        yield ns, f"127.0.0.1:{ctl.port}", client


@asynccontextmanager
async def _broker(cfg: BrokerConfig) -> AsyncIterator[tuple[BrokerController, trio.CancelScope]]:
    """A broker and the scope that kills it (cancelled: no clean shutdown of its role)."""
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()
        broker = BrokerController(cfg)

        async def run(*, task_status: trio.TaskStatus[int]) -> None:
            with scope:
                await broker.run(task_status=task_status)

        await nursery.start(run)
        try:
            yield broker, scope
        finally:
            broker.stop()


async def _pull_all(client: RemotingClient, addr: str, topic: str, want: int) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    with trio.fail_after(20):
        while len(got) < want:
            resp = await client.invoke(addr, pull_request(topic, offset, max_msgs=64))
            if resp.code != ResponseCode.SUCCESS:
                await trio.sleep(0.1)
                continue
            records = decode_records(resp.body_bytes())
            got.extend(r.body for r in records if r.body is not None)
            offset += len(records)
    return got


async def _add_unacknowledged_tail(cfg: BrokerConfig, count: int) -> None:
    """Append records to a stopped broker's store directly: what a master cut off mid-send
    leaves behind, never replicated nor acknowledged."""
    async with MessageStore(cfg.store_config()) as store:
        for i in range(count):
            result = await store.put_message(MessageInner("CtlT", b"never acknowledged %d" % i))
            assert result.status is PutMessageStatus.PUT_OK


async def test_promotion_and_the_old_master_rejoining(tmp_path: Path, etcd: EtcdProc) -> None:
    async with _control_plane(etcd) as (ns, ctl_addr, client):
        cfg_a = _broker_config(tmp_path, "a0", ns.address, ctl_addr)
        cfg_b = _broker_config(tmp_path, "a1", ns.address, ctl_addr)
        async with _broker(cfg_a) as (a, kill_a):
            # The first replica up wins the first election.
            await wait_until(lambda: a.role == "SYNC_MASTER", total=15, what="a master")
            assert a.broker_id == 0
            assert not a.role_pending
            assert a.replicas is not None
            assert a.replicas.broker_id == 1
            async with _broker(cfg_b) as (b, _):
                assert b.replicas is not None
                await wait_until(lambda: b.role == "SLAVE" and not b.role_pending, total=15)
                assert b.replicas.broker_id == 2
                # Caught up, the slave joins the SyncStateSet (confirmed by the controller).
                await wait_until(
                    lambda: (
                        a.replicas is not None and a.replicas.sync_state_set == frozenset({1, 2})
                    ),
                    total=15,
                    what="the slave in the SyncStateSet",
                )
                async with ControllerAdmin(ctl_addr) as admin:
                    table = await admin.sync_state_data(["broker-a"])
                in_sync = table["broker-a"]["inSyncReplicas"]
                assert sorted(m["brokerId"] for m in in_sync) == [1, 2]

                aaddr, baddr = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
                bodies = [b"c%03d-" % i + b"x" * 500 for i in range(150)]  # several files
                for body in bodies:
                    resp = await client.invoke(aaddr, send_request("CtlT", body))
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                    # All-ack: acknowledged means the slave holds it.
                    assert b.store.max_phy_offset >= a.store.max_phy_offset
                refused = await client.invoke(baddr, send_request("CtlT", b"no"))
                assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE

                # The master dies (cancelled, no clean stop): the slave is promoted.
                old_epoch = a.replicas.master_epoch
                kill_a.cancel()
                await wait_until(
                    lambda: b.role == "SYNC_MASTER", total=15, what="the slave promoted"
                )
                assert b.broker_id == 0
                assert b.replicas.master_epoch > old_epoch
                last = b.epochs.last
                assert last is not None
                assert last.epoch == b.replicas.master_epoch
                # Alone in its SyncStateSet, the new master acknowledges alone.
                with trio.fail_after(10):
                    while True:
                        resp = await client.invoke(baddr, send_request("CtlT", b"after"))
                        if resp.code == ResponseCode.SUCCESS:
                            break
                        await trio.sleep(0.2)
                got = await _pull_all(client, baddr, "CtlT", len(bodies) + 1)
                assert got == [*bodies, b"after"]

                # The old master held a tail nobody acknowledged; it comes back as a slave,
                # cuts that tail at the last offset both logs agree on, and follows.
                await _add_unacknowledged_tail(cfg_a, 5)
                async with _broker(cfg_a) as (a2, _):
                    await wait_until(lambda: a2.role == "SLAVE" and not a2.role_pending, total=15)
                    for i in range(20):
                        resp = await client.invoke(baddr, send_request("CtlT", b"more %d" % i))
                        assert resp.code == ResponseCode.SUCCESS, resp.remark
                    await wait_until(
                        lambda: a2.store.max_phy_offset == b.store.max_phy_offset,
                        total=15,
                        what="the old master caught up",
                    )
                    _assert_same_commitlogs(cfg_a.store_path, cfg_b.store_path)
                    # Cut where the new master's epoch began, not where the old log ended.
                    assert isinstance(a2.ha_slave, AutoSwitchHASlave)
                    assert a2.ha_slave.last_consistent_point == last.start_offset
                    # What `mqadmin getBrokerEpoch` shows: the same epochs on both.
                    async with Admin(ClientConfig(namesrv_addr=ns.address)) as nadmin:
                        infos = [
                            await nadmin.broker_epoch(addr)
                            for addr in (baddr, f"127.0.0.1:{a2.port}")
                        ]
                    assert [e["epoch"] for e in infos[0]["epochList"]] == [1, 2]
                    assert infos[0]["epochList"] == infos[1]["epochList"]
                    assert infos[0]["maxOffset"] == infos[1]["maxOffset"]
                    assert (infos[0]["brokerId"], infos[1]["brokerId"]) == (2, 1)
                    assert [e.epoch for e in a2.epochs.entries] == [
                        e.epoch for e in b.epochs.entries
                    ]
                    # It rejoins the SyncStateSet.
                    await wait_until(
                        lambda: (
                            b.replicas is not None
                            and b.replicas.sync_state_set == frozenset({1, 2})
                        ),
                        total=15,
                        what="the old master back in the SyncStateSet",
                    )


async def test_min_in_sync_replicas_refuses_before_storing(tmp_path: Path, etcd: EtcdProc) -> None:
    async with _control_plane(etcd) as (ns, ctl_addr, client):
        cfg = _broker_config(tmp_path, "solo", ns.address, ctl_addr, min_in_sync_replicas=2)
        async with _broker(cfg) as (broker, _):
            await wait_until(lambda: broker.role == "SYNC_MASTER", total=15, what="master")
            before = broker.store.max_phy_offset
            resp = await client.invoke(f"127.0.0.1:{broker.port}", send_request("MinT", b"x"))
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert "in-sync replicas not enough" in (resp.remark or "")
            assert broker.store.max_phy_offset == before


async def test_reads_stop_at_what_the_group_confirmed(tmp_path: Path, etcd: EtcdProc) -> None:
    """A record the master stored but its SyncStateSet did not confirm is not served (a
    consumer that read and committed it would skip what a new master writes at its queue
    offset); a pull parked for it is answered once it is confirmed."""
    async with _control_plane(etcd) as (ns, ctl_addr, client):
        cfg_a = _broker_config(tmp_path, "a0", ns.address, ctl_addr)
        cfg_b = _broker_config(tmp_path, "a1", ns.address, ctl_addr)
        async with _broker(cfg_a) as (a, _):
            await wait_until(lambda: a.role == "SYNC_MASTER", total=15, what="a master")
            async with _broker(cfg_b) as (b, _):
                await wait_until(
                    lambda: (
                        a.replicas is not None and a.replicas.sync_state_set == frozenset({1, 2})
                    ),
                    total=15,
                    what="the slave in the SyncStateSet",
                )
                aaddr = f"127.0.0.1:{a.port}"
                first = await client.invoke(aaddr, send_request("ConfT", b"confirmed"))
                assert first.code == ResponseCode.SUCCESS, first.remark
                # The controller cannot be reached (the set stays), the slave stops following.
                assert a.replicas is not None

                async def unreachable(members: frozenset[int]) -> None:
                    await trio.lowlevel.checkpoint()

                a.replicas._alter = unreachable  # type: ignore[method-assign]
                assert isinstance(b.ha_slave, AutoSwitchHASlave)
                follow = b.ha_slave.master_addr
                b.registration.on_master = None  # else the next registration answer restores it
                b.ha_slave.set_master(None)
                ha = a.ha_master_autoswitch
                assert ha is not None
                await wait_until(lambda: ha.connected_members() == 0, total=10)
                second = await client.invoke(aaddr, send_request("ConfT", b"not confirmed"))
                assert second.code != ResponseCode.SUCCESS  # stored, not acknowledged
                assert a.store.get_max_offset_in_queue("ConfT", 0) == 2, second
                resp = await client.invoke(aaddr, pull_request("ConfT", 1, suspend_ms=0))
                assert resp.code == ResponseCode.PULL_NOT_FOUND
                got = await _pull_all(client, aaddr, "ConfT", 1)
                assert got == [b"confirmed"]
                # A pull parked at offset 1 is answered once the slave is back and confirms.
                async with trio.open_nursery() as nursery:
                    answers: list[bytes] = []

                    async def parked() -> None:
                        req = pull_request(
                            "ConfT",
                            1,
                            suspend_ms=15_000,
                            sys_flag=PULL_SUBSCRIPTION | PULL_FLAG_SUSPEND,
                        )
                        resp = await client.invoke(aaddr, req, 20_000)
                        assert resp.code == ResponseCode.SUCCESS, resp.remark
                        answers.extend(r.body for r in decode_records(resp.body_bytes()) if r.body)

                    nursery.start_soon(parked)
                    await trio.sleep(0.5)
                    assert not answers
                    b.ha_slave.set_master(follow)
                assert answers == [b"not confirmed"]

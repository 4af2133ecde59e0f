"""Master/slave replication between two in-process brokers on 127.0.0.1: a SYNC_MASTER answers
SLAVE_NOT_AVAILABLE until a slave is in sync, then SEND_OK once the slave has the bytes; the
slave, which learns its master from the NameServer, ends with byte-identical commitlog files
and serves pulls of what the master acknowledged; a master that loses its slave stops
acknowledging as SEND_OK."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from client import (
    Admin,
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendStatus,
)
from client.admin import replication_lag
from common.message import decode_records
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import (
    ReadCommitlogRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from remoting.protocol.route import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
)
from tests.helpers import free_port, wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.test_broker_process import pull_request, send_request

pytestmark = pytest.mark.usefixtures("staging_guard")


def _config(tmp_path: Path, name: str, namesrv: str, **kw: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "listen": f"127.0.0.1:{free_port()}",
            "ha_listen_port": free_port(),
            "store_dir": str(tmp_path / name),
            "namesrv_addr": namesrv,
            "mapped_file_size_commitlog": 64 * 1024,
            "mapped_file_size_consume_queue": 20_000,
            "register_name_server_period_ms": 300,
            "slave_timeout_ms": 2000,
            "slave_sync_interval_ms": 200,
            **kw,
        }
    )


def _slave_config(tmp_path: Path, namesrv: str, master_cfg: BrokerConfig) -> BrokerConfig:
    """A slave of `master_cfg`'s broker at its HA port (fixed, not learned)."""
    return _config(
        tmp_path,
        "slave",
        namesrv,
        broker_role="SLAVE",
        broker_id=1,
        ha_master_address=f"127.0.0.1:{master_cfg.ha_listen_port}",
    )


def _commitlog(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "commitlog").iterdir())}


def _assert_same_commitlogs(a: Path, b: Path) -> None:
    """Byte-identical commitlog files; else which file and where they first differ. A file
    of zeros only (created ahead of the write position) may exist on one side only."""

    def written(root: Path) -> dict[str, bytes]:
        return {n: d for n, d in _commitlog(root).items() if d.count(0) != len(d)}

    left, right = written(a), written(b)
    assert sorted(left) == sorted(right)
    for name, data in left.items():
        other = right[name]
        if data != other:
            at = next(
                (i for i, (x, y) in enumerate(zip(data, other, strict=False)) if x != y),
                min(len(data), len(other)),
            )
            raise AssertionError(
                f"{name} differs from byte {at} (sizes {len(data)}, {len(other)}): "
                f"{data[at : at + 16]!r} vs {other[at : at + 16]!r}"
            )


async def test_a_sync_master_acknowledges_what_its_slave_has(tmp_path: Path) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        namesrv = ns.address
        master_cfg = _config(tmp_path, "master", namesrv, broker_role="SYNC_MASTER")
        async with BrokerController(master_cfg) as master, RemotingClient() as client:
            addr = f"127.0.0.1:{master.port}"
            # No slave yet: stored, answered SLAVE_NOT_AVAILABLE (the header is filled).
            first = await client.invoke(addr, send_request("RepT", b"before the slave"))
            assert first.code == ResponseCode.SLAVE_NOT_AVAILABLE
            assert first.ext_fields is not None
            assert first.ext_fields["msgId"]
            slave_cfg = _config(tmp_path, "slave", namesrv, broker_role="SLAVE", broker_id=1)
            async with BrokerController(slave_cfg) as slave:
                assert slave.ha_slave is not None
                assert master.ha_master is not None
                ha = master.ha_master
                # Learned from the NameServer's register answer, then in sync.
                await wait_until(lambda: ha.slave_count == 1)
                await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
                answers = []
                for i in range(200):  # several 64 KiB commitlog files
                    body = b"m%03d-" % i + b"x" * 700
                    answers.append(await client.invoke(addr, send_request("RepT", body)))
                assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 200
                # Acknowledged means the slave reported it: it holds every byte.
                assert ha.acked_offset >= master.store.max_phy_offset
                assert slave.store.max_phy_offset >= master.store.max_phy_offset
                await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
                _assert_same_commitlogs(master_cfg.store_path, slave_cfg.store_path)
                # The slave serves the acknowledged messages (once it copied the topic).
                await wait_until(lambda: slave.topics.get("RepT") is not None)
                saddr = f"127.0.0.1:{slave.port}"
                got: list[bytes] = []
                offset = 0
                while len(got) < 201:
                    resp = await client.invoke(saddr, pull_request("RepT", offset, max_msgs=64))
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                    records = decode_records(resp.body_bytes())
                    got.extend(r.body for r in records if r.body is not None)
                    offset += len(records)
                assert got[0] == b"before the slave"
                assert got[1:] == [b"m%03d-" % i + b"x" * 700 for i in range(200)]
                # The master's consumer offsets and groups reach the slave too.
                upd = UpdateConsumerOffsetRequestHeader(
                    consumer_group="CG", topic="RepT", queue_id=0, commit_offset=150
                )
                cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, upd.to_fields())
                assert (await client.invoke(addr, cmd)).code == ResponseCode.SUCCESS
                await wait_until(lambda: slave.offsets.query("CG", "RepT", 0) == 150)
                await wait_until(
                    lambda: set(slave.subscriptions.groups()) == set(master.subscriptions.groups())
                )
                # Sends to the slave are refused.
                refused = await client.invoke(saddr, send_request("RepT", b"to the slave"))
                assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
            # The slave is gone: stored but not acknowledged as SEND_OK.
            await wait_until(lambda: ha.slave_count == 0)
            with trio.fail_after(10):
                after = await client.invoke(addr, send_request("RepT", b"after the slave"))
            assert after.code == ResponseCode.SLAVE_NOT_AVAILABLE


async def test_an_async_master_answers_at_once_and_its_slave_follows(tmp_path: Path) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        master_cfg = _config(tmp_path, "master", ns.address)
        slave_cfg = _slave_config(tmp_path, ns.address, master_cfg)
        async with BrokerController(master_cfg) as master, RemotingClient() as client:
            addr = f"127.0.0.1:{master.port}"
            for i in range(50):
                resp = await client.invoke(addr, send_request("AsyncT", b"a%d" % i))
                assert resp.code == ResponseCode.SUCCESS
            async with BrokerController(slave_cfg) as slave:  # starts empty, catches up
                await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
                _assert_same_commitlogs(master_cfg.store_path, slave_cfg.store_path)
                # What mqadmin clusterList and haStatus show: roles, offsets, the slave's lag.
                async with Admin(ClientConfig(namesrv_addr=ns.address)) as admin:
                    await wait_until(lambda: master.ha_master is not None)
                    rows = await admin.cluster_list()
                    by_id = {r.broker_id: r for r in rows}
                    assert sorted(by_id) == [0, 1]
                    assert (by_id[0].role, by_id[1].role) == ("ASYNC_MASTER", "SLAVE")
                    assert by_id[0].ha_offset == by_id[1].ha_offset == master.store.max_phy_offset
                    assert replication_lag(rows, by_id[1]) == 0
                    assert replication_lag(rows, by_id[0]) == 0
                    mstatus = await admin.ha_status(by_id[0].addr)
                    assert mstatus.master
                    assert mstatus.in_sync_slave_nums == 1
                    [conn] = mstatus.ha_connection_info
                    assert conn.slave_ack_offset == master.store.max_phy_offset
                    sstatus = await admin.ha_status(by_id[1].addr)
                    assert not sstatus.master
                    assert sstatus.ha_client_runtime_info.activated
                    assert sstatus.ha_client_runtime_info.master_addr == (
                        f"127.0.0.1:{master_cfg.ha_listen_port}"
                    )
                    assert sstatus.ha_client_runtime_info.max_offset == slave.store.max_phy_offset


async def test_consumers_read_and_commit_on_the_slave_while_the_master_is_down(
    tmp_path: Path,
) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        master_cfg = _config(tmp_path, "master", ns.address)
        slave_cfg = _slave_config(tmp_path, ns.address, master_cfg)
        async with BrokerController(slave_cfg) as slave:
            async with BrokerController(master_cfg) as master:
                await create_topic(ns.address, "FromSlaveT", queues=2)
                async with Producer("PG", fast_config(ns.address)) as producer:
                    sent = {
                        (await producer.send(Message("FromSlaveT", b"s%d" % i))).msg_id
                        for i in range(40)
                    }
                await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
                await wait_until(lambda: slave.topics.get("FromSlaveT") is not None)
            # The master is gone (it unregistered): the route names the slave only.
            got: dict[str, bytes] = {}

            async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
                for m in msgs:
                    got[m.msg_id] = m.body or b""
                return ConsumeStatus.CONSUME_SUCCESS

            consumer = PushConsumer(
                "SlaveReaders",
                fast_config(ns.address),
                listener=listener,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            )
            consumer.subscribe("FromSlaveT")
            async with consumer:
                await wait_until(lambda: set(got) == sent, total=20, what="read from the slave")
                # Offsets are committed to the slave, which keeps them.
                await wait_until(
                    lambda: (
                        sum(slave.offsets.query("SlaveReaders", "FromSlaveT", q) for q in (0, 1))
                        == 40
                    ),
                    total=10,
                    what="offsets on the slave",
                )


@pytest.mark.parametrize(
    ("slave_read", "ratio", "expected"),
    [(True, 0, 1), (True, 40, 0), (False, 0, 0)],
)
async def test_a_read_from_beyond_the_page_cache_is_sent_to_the_slave(
    tmp_path: Path, slave_read: bool, ratio: int, expected: int
) -> None:
    # Ratio 0 makes every record "beyond the page cache"; 40 % of memory covers this store.
    cfg = _config(
        tmp_path,
        "master",
        "",
        slave_read_enable=slave_read,
        access_message_in_memory_max_ratio=ratio,
    )
    async with BrokerController(cfg) as broker, RemotingClient() as client:
        addr = f"127.0.0.1:{broker.port}"
        for i in range(3):
            assert (await client.invoke(addr, send_request("SugT", b"%d" % i))).code == 0
        resp = await client.invoke(addr, pull_request("SugT", 0, max_msgs=1))
        assert resp.code == ResponseCode.SUCCESS
        assert resp.ext_fields is not None
        assert int(resp.ext_fields["suggestWhichBrokerId"]) == expected


async def test_a_consumer_follows_the_suggestion_to_the_slave_and_back(tmp_path: Path) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        master_cfg = _config(
            tmp_path,
            "master",
            ns.address,
            slave_read_enable=True,
            access_message_in_memory_max_ratio=0,
        )
        slave_cfg = _slave_config(tmp_path, ns.address, master_cfg)
        async with BrokerController(master_cfg) as master, BrokerController(slave_cfg) as slave:
            await create_topic(ns.address, "SuggestT", queues=1)
            async with Producer("PG", fast_config(ns.address)) as producer:
                sent = {
                    (await producer.send(Message("SuggestT", b"g%d" % i))).msg_id for i in range(60)
                }
            await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
            await wait_until(lambda: slave.topics.get("SuggestT") is not None)
            got: set[str] = set()

            async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
                got.update(m.msg_id for m in msgs)
                return ConsumeStatus.CONSUME_SUCCESS

            consumer = PushConsumer(
                "Followers",
                fast_config(ns.address, pull_batch_size=8),
                listener=listener,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            )
            consumer.subscribe("SuggestT")
            async with consumer:
                await wait_until(lambda: got == sent, total=20, what="every message")
                # Both served pulls: the master sends the consumer to the slave, the slave (not
                # behind by its own measure) back to the master.
                assert slave.stats.get_count > 0
                assert master.stats.get_count > 0
                # Offsets still go to the master, which is in the route.
                await wait_until(
                    lambda: master.offsets.query("Followers", "SuggestT", 0) == 60,
                    total=10,
                    what="offsets on the master",
                )


def _offset_cmd(group: str, topic: str, queue_id: int, offset: int) -> RemotingCommand:
    upd = UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, commit_offset=offset
    )
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, upd.to_fields())


async def _send_many(client: RemotingClient, addr: str, topic: str, n: int, tag: bytes) -> None:
    for i in range(n):
        resp = await client.invoke(addr, send_request(topic, tag + b"%04d-" % i + b"y" * 600))
        assert resp.code == ResponseCode.SUCCESS, resp.remark


async def _bodies(client: RemotingClient, addr: str, topic: str, n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        resp = await client.invoke(addr, pull_request(topic, len(got), max_msgs=64))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        records = decode_records(resp.body_bytes())
        assert records
        got.extend(r.body or b"" for r in records)
    return got


@pytest.mark.parametrize("lost", ["everything", "the tail"])
async def test_a_master_that_returns_behind_its_slave_copies_back_first(
    tmp_path: Path, lost: str
) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        master_cfg = _config(tmp_path, "master", ns.address, broker_role="SYNC_MASTER")
        slave_cfg = _slave_config(tmp_path, ns.address, master_cfg)
        snapshot = tmp_path / "snapshot"
        async with BrokerController(slave_cfg) as slave, RemotingClient() as client:
            saddr = f"127.0.0.1:{slave.port}"
            async with BrokerController(master_cfg) as master:
                addr = f"127.0.0.1:{master.port}"
                assert master.ha_master is not None
                ha = master.ha_master
                await wait_until(lambda: ha.slave_count == 1)
                await _send_many(client, addr, "BackT", 60, b"a")
                cmd = _offset_cmd("CG", "BackT", 0, 10)
                assert (await client.invoke(addr, cmd)).code == ResponseCode.SUCCESS
                await wait_until(lambda: slave.offsets.query("CG", "BackT", 0) == 10)
            if lost == "the tail":
                # What the master will come back with: its store as of now.
                shutil.copytree(master_cfg.store_path, snapshot)
                async with BrokerController(master_cfg) as master:
                    addr = f"127.0.0.1:{master.port}"
                    assert master.ha_master is not None
                    ha = master.ha_master
                    await wait_until(lambda: ha.slave_count == 1, total=15)
                    await _send_many(client, addr, "BackT", 140, b"b")
            # The master is down: consumers commit to the slave.
            assert (
                await client.invoke(saddr, _offset_cmd("CG", "BackT", 0, 55))
            ).code == ResponseCode.SUCCESS
            slave_max = slave.store.max_phy_offset
            total = 60 if lost == "everything" else 200
            shutil.rmtree(master_cfg.store_path)
            if lost == "the tail":
                shutil.copytree(snapshot, master_cfg.store_path)
            async with BrokerController(master_cfg) as master:
                addr = f"127.0.0.1:{master.port}"
                # Started (registered) only once it holds what the slave holds.
                assert master.catch_up.fence is None
                assert master.store.max_phy_offset == slave_max
                assert master.catch_up.copied_bytes > 0
                _assert_same_commitlogs(master_cfg.store_path, slave_cfg.store_path)
                assert master.topics.get("BackT") is not None
                # The slave's larger offset wins; the master's own were gone or smaller.
                assert master.offsets.query("CG", "BackT", 0) == 55
                bodies = await _bodies(client, addr, "BackT", total)
                assert bodies[:60] == [b"a%04d-" % i + b"y" * 600 for i in range(60)]
                assert bodies[60:] == [b"b%04d-" % i + b"y" * 600 for i in range(total - 60)]
                # Replication resumes where both are, and new sends are acknowledged.
                assert master.ha_master is not None
                ha = master.ha_master
                await wait_until(lambda: ha.slave_count == 1, total=15)
                await _send_many(client, addr, "BackT", 5, b"c")
                await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
                _assert_same_commitlogs(master_cfg.store_path, slave_cfg.store_path)


async def test_a_master_that_cannot_copy_back_refuses_and_says_why(tmp_path: Path) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns, RemotingClient() as client:
        master_cfg = _config(tmp_path, "master", ns.address)
        snapshot = tmp_path / "snapshot"
        async with BrokerController(master_cfg) as master:
            await _send_many(client, f"127.0.0.1:{master.port}", "GapT", 20, b"a")
        shutil.copytree(master_cfg.store_path, snapshot)  # within the first 64 KiB file
        slave_cfg = _slave_config(tmp_path, ns.address, master_cfg)
        async with BrokerController(master_cfg) as master:
            await _send_many(client, f"127.0.0.1:{master.port}", "GapT", 300, b"b")
            # An empty slave starts at the master's last file: it lacks the first ones.
            async with BrokerController(slave_cfg) as slave:
                await wait_until(lambda: slave.store.max_phy_offset == master.store.max_phy_offset)
                assert slave.store.min_phy_offset > 64 * 1024
                slave_bytes = _commitlog(slave_cfg.store_path)
        async with BrokerController(slave_cfg) as slave:
            shutil.rmtree(master_cfg.store_path)
            shutil.copytree(snapshot, master_cfg.store_path)
            returning = BrokerController(master_cfg)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(returning.run)
                await wait_until(
                    lambda: "in neither" in (returning.catch_up.fence or "") and returning.port > 0,
                    what="the fence, listening",
                )
                addr = f"127.0.0.1:{returning.port}"
                refused = await client.invoke(addr, send_request("GapT", b"while fenced"))
                assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
                assert "in neither" in (refused.remark or "")
                pulled = await client.invoke(addr, pull_request("GapT", 0))
                assert pulled.code == ResponseCode.SERVICE_NOT_AVAILABLE
                # Not registered: the route names the slave only.
                route = await client.invoke(
                    ns.address,
                    RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "GapT"}),
                )
                assert f"127.0.0.1:{returning.port}" not in route.body_bytes().decode()
                returning.stop()
            # Nothing of the slave's was touched.
            assert _commitlog(slave_cfg.store_path) == slave_bytes
            assert slave.store.max_phy_offset > 0


async def test_read_commitlog_answers_bounded_bytes_and_refuses_bad_ranges(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, "broker", "")
    async with BrokerController(cfg) as broker, RemotingClient() as client:
        addr = f"127.0.0.1:{broker.port}"
        await _send_many(client, addr, "RawT", 30, b"r")
        top = broker.store.max_phy_offset

        async def read(offset: int, max_bytes: int) -> RemotingCommand:
            hdr = ReadCommitlogRequestHeader(offset=offset, max_bytes=max_bytes)
            cmd = RemotingCommand.request(RequestCode.READ_COMMITLOG, hdr.to_fields())
            return await client.invoke(addr, cmd)

        whole = await read(0, 2**31 - 1)  # capped, within the one file
        assert whole.code == ResponseCode.SUCCESS
        assert whole.body_bytes() == _commitlog(cfg.store_path)["00000000000000000000"][:top]
        part = await read(100, 50)
        assert part.body_bytes() == whole.body_bytes()[100:150]
        assert (await read(top, 10)).body_bytes() == b""
        for offset, n in ((-1, 10), (top + 1, 10), (0, 0), (0, -5)):
            bad = await read(offset, n)
            assert bad.code == ResponseCode.SYSTEM_ERROR
            assert bad.ext_fields is not None
            assert bad.ext_fields["maxOffset"] == str(top)


@pytest.mark.parametrize("retry", [True, False])
async def test_a_producer_moves_not_stored_ok_sends_to_another_broker(
    tmp_path: Path, retry: bool
) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        # broker-a: SYNC_MASTER without a slave, so every send is SLAVE_NOT_AVAILABLE.
        a_cfg = _config(tmp_path, "a", ns.address, broker_role="SYNC_MASTER")
        b_cfg = _config(tmp_path, "b", ns.address, broker_name="broker-b")
        async with BrokerController(a_cfg) as a, BrokerController(b_cfg) as b:
            await create_topic(ns.address, "MoveT", queues=2)
            cfg = fast_config(ns.address, retry_another_broker_when_not_store_ok=retry)
            async with Producer("PG", cfg) as producer:
                results = [await producer.send(Message("MoveT", b"%d" % i)) for i in range(20)]
            statuses = {r.status for r in results}
            brokers = {r.message_queue.broker_name for r in results}
            if retry:
                assert statuses == {SendStatus.SEND_OK}
                assert brokers == {"broker-b"}
            else:
                assert statuses == {SendStatus.SEND_OK, SendStatus.SLAVE_NOT_AVAILABLE}
                assert brokers == {"broker-a", "broker-b"}
            # Either way nothing was lost: broker-a stored what it answered.
            assert a.stats.put_count + b.stats.put_count >= 20


async def test_a_listed_slave_that_does_not_answer_keeps_a_starting_master_fenced(
    tmp_path: Path,
) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns, RemotingClient() as client:
        # A slave of broker-a the NameServer lists, at an address nobody serves.
        ghost = f"127.0.0.1:{free_port()}"
        body = RegisterBrokerBody(
            TopicConfigSerializeWrapper({"T": TopicConfig("T", 4, 4, 6)}, DataVersion(1, 1)), []
        ).to_json()
        fields = {
            "brokerName": "broker-a",
            "brokerAddr": ghost,
            "clusterName": "DefaultCluster",
            "haServerAddr": ghost,
            "brokerId": "1",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
        }
        reg = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
        assert (await client.invoke(ns.address, reg)).code == ResponseCode.SUCCESS
        master = BrokerController(_config(tmp_path, "master", ns.address))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(master.run)
            await wait_until(
                lambda: "does not answer" in (master.catch_up.fence or "") and master.port > 0,
                what="the fence, listening",
            )
            addr = f"127.0.0.1:{master.port}"
            refused = await client.invoke(addr, send_request("GhostT", b"while fenced"))
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert ghost in (refused.remark or "")
            # The NameServer drops it: the master starts.
            unreg = RemotingCommand.request(
                RequestCode.UNREGISTER_BROKER,
                {
                    "brokerName": "broker-a",
                    "brokerAddr": ghost,
                    "clusterName": "DefaultCluster",
                    "brokerId": "1",
                },
            )
            assert (await client.invoke(ns.address, unreg)).code == ResponseCode.SUCCESS
            await wait_until(lambda: master.catch_up.fence is None, total=15, what="unfenced")
            ok = await client.invoke(addr, send_request("GhostT", b"after"))
            assert ok.code == ResponseCode.SUCCESS
            master.stop()

"""VIEW_BROKER_STATS_DATA (315), mqadmin statsAll on it, and deleteSubGroup -r true, against a
live NameServer and broker (real processes)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from client import Admin, Message, MessageQueue, Producer
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemoteError
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_mqadmin_messages import _mqadmin_async

StartBroker = Callable[..., BrokerProc]

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SENT = 7
PULLED = 5


async def _all_offsets(admin: Admin, addr: str) -> dict[str, dict[str, int]]:
    """GET_ALL_CONSUMER_OFFSET (43): `topic@group` -> {queue id: offset}."""
    resp = await admin.call(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
    table = json.loads(resp.body_bytes())["offsetTable"]
    assert isinstance(table, dict)
    return {str(k): {str(q): int(o) for q, o in v.items()} for k, v in table.items()}


async def test_broker_stats_data_and_stats_all(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker = start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "StT", queues=1)
    await create_topic(ns, "StIdle", queues=1)
    cfg = fast_config(ns)
    async with Admin(cfg) as admin, Producer("StP", cfg) as producer:
        (addr,) = (await admin.master_addrs()).values()
        mq = MessageQueue("StT", "broker-a", 0)
        for i in range(SENT):
            await producer.send(Message("StT", f"m{i}".encode()), queue=mq)
        got = await admin.pull_range(mq, 0, PULLED, max_num=PULLED, group="StG")
        assert len(got) == PULLED
        await admin.instance.api.update_consumer_offset(addr, "StG", mq, PULLED)

        # 315: the exact sums of the last minute (and hour, and day: the broker is young).
        data = await admin.view_broker_stats_data(addr, "TOPIC_PUT_NUMS", "StT")
        assert (data.minute.sum, data.hour.sum, data.day.sum) == (SENT, SENT, SENT)
        assert data.minute.avgpt == 1.0  # one message per put
        assert data.minute.tps > 0
        data = await admin.view_broker_stats_data(addr, "GROUP_GET_NUMS", "StT@StG")
        assert (data.minute.sum, data.hour.sum, data.day.sum) == (PULLED, PULLED, PULLED)
        size = await admin.view_broker_stats_data(addr, "GROUP_GET_SIZE", "StT@StG")
        assert size.minute.sum > PULLED
        data = await admin.view_broker_stats_data(addr, "BROKER_PUT_NUMS", "DefaultCluster")
        assert data.minute.sum >= SENT
        data = await admin.view_broker_stats_data(addr, "BROKER_GET_NUMS", "DefaultCluster")
        assert data.minute.sum >= PULLED

        # Unknown names and keys: RocketMQ's SYSTEM_ERROR and remark.
        for name, key in (
            ("NO_SUCH_STATS", "StT"),
            ("TOPIC_PUT_NUMS", "NoSuchTopic"),
            ("GROUP_GET_NUMS", "StT"),
            ("BROKER_PUT_NUMS", "OtherCluster"),
            ("TOPIC_PUT_NUMS", "x" * 5000),
        ):
            with pytest.raises(RemoteError) as err:
                await admin.view_broker_stats_data(addr, name, key)
            assert err.value.code == ResponseCode.SYSTEM_ERROR
            assert err.value.remark == f"The stats <{name}> <{key}> not exist"
        with pytest.raises(RemoteError) as err:
            await admin.call(addr, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "X"})
        assert err.value.code == ResponseCode.SYSTEM_ERROR
        assert "statsName and statsKey fields are required" in (err.value.remark or "")

    # statsAll on 315: accumulation, TPS and 24-hour figures.
    rc, out, err_text = await _mqadmin_async("statsAll", "-n", ns, "-t", "StT", "--json")
    assert rc == 0, err_text
    (row,) = json.loads(out)
    assert (row["topic"], row["group"], row["accumulation"]) == ("StT", "StG", SENT - PULLED)
    assert (row["inMsg24Hour"], row["outMsg24Hour"]) == (SENT, PULLED)
    assert row["inTps"] > 0
    assert row["outTps"] > 0
    rc, out, err_text = await _mqadmin_async("statsAll", "-n", ns)
    assert rc == 0, err_text
    lines = out.splitlines()
    assert lines[0].split() == ["#Topic", "#Consumer", "Group", "#Accumulation", "#InTPS",
                                "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour"]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.strip()}
    cols = rows["StT"]
    assert cols[0] == "StG"
    assert (int(cols[1]), int(cols[4]), int(cols[5])) == (SENT - PULLED, SENT, PULLED)
    assert rows["StIdle"] == ["0", "0.00", "0", "NO_CONSUMER"]
    assert not any(t.startswith(("%RETRY%", "%DLQ%")) for t in rows)
    # -a: only topics with traffic in the last day.
    rc, out, _ = await _mqadmin_async("statsAll", "-n", ns, "-a", "--json")
    assert rc == 0
    assert {r["topic"] for r in json.loads(out)} == {"StT"}
    assert broker.running


async def test_delete_sub_group_remove_offset(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker = start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "DgT", queues=2)
    cfg = fast_config(ns)
    async with Admin(cfg) as admin:
        (addr,) = (await admin.master_addrs()).values()
        for group in ("KeepG", "DropG"):
            for qid in (0, 1):
                mq = MessageQueue("DgT", "broker-a", qid)
                await admin.instance.api.update_consumer_offset(addr, group, mq, 0)
        before = await _all_offsets(admin, addr)
        assert {"DgT@KeepG", "DgT@DropG"} <= set(before)
        assert len(await admin.consumer_progress("DropG")) == 2

        # Without -r the offsets stay.
        rc, out, err = await _mqadmin_async("deleteSubGroup", "-n", ns, "-b", addr, "-g", "KeepG")
        assert rc == 0, err
        assert "DgT@KeepG" in await _all_offsets(admin, addr)
        assert len(await admin.consumer_progress("KeepG")) == 2

        rc, out, err = await _mqadmin_async(
            "deleteSubGroup", "-n", ns, "-b", addr, "-g", "DropG", "-r", "true"
        )
        assert rc == 0, err
        assert f"delete subscription group [DropG] from broker [{addr}] success." in out
        after = await _all_offsets(admin, addr)
        assert "DgT@DropG" not in after
        assert after["DgT@KeepG"] == {"0": 0, "1": 0}
        # consumerProgress without -t: the topics the group has offsets of (none left).
        assert await admin.consumer_progress("DropG") == []
        assert len(await admin.consumer_progress("KeepG")) == 2
        # Persisted at once.
        doc = json.loads((broker.store_dir / "config" / "consumerOffset.json").read_text())
        assert "DgT@DropG" not in doc["offsetTable"]
        assert "DgT@KeepG" in doc["offsetTable"]

        # A bad flag on the wire and on the command line.
        with pytest.raises(RemoteError) as exc:
            await admin.call(
                addr,
                RequestCode.DELETE_SUBSCRIPTIONGROUP,
                {"groupName": "KeepG", "removeOffset": "maybe"},
            )
        assert "bad removeOffset" in (exc.value.remark or "")
        rc, _, err = await _mqadmin_async(
            "deleteSubGroup", "-n", ns, "-b", addr, "-g", "KeepG", "-r", "maybe"
        )
        assert rc != 0
        assert "Traceback" not in err
        assert "DgT@KeepG" in await _all_offsets(admin, addr)

        # 5.x names the flag cleanOffset (the dashboard sends it): the same removal.
        await admin.call(
            addr,
            RequestCode.DELETE_SUBSCRIPTIONGROUP,
            {"groupName": "KeepG", "cleanOffset": "true"},
        )
        assert "DgT@KeepG" not in await _all_offsets(admin, addr)


async def test_dashboard_group_delete_removes_the_group_and_its_offsets(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    """mqdashboard's group delete (207 with 5.x's cleanOffset) on a live broker."""
    from dashboard import service

    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "DashDel", queues=1)
    async with Admin(fast_config(ns)) as admin:
        (addr,) = (await admin.master_addrs()).values()
        await admin.call(
            addr,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            body=json.dumps({"groupName": "DashG"}).encode(),
        )
        mq = MessageQueue("DashDel", "broker-a", 0)
        await admin.instance.api.update_consumer_offset(addr, "DashG", mq, 3)
        assert "DashG" in await service.group_names(admin)
        assert await service.delete_group(admin, "DashG") == [addr]
        assert "DashG" not in await service.group_names(admin)
        assert "DashDel@DashG" not in await _all_offsets(admin, addr)

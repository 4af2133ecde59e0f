"""Every mqadmin command against a live NameServer and broker (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import wait_until_sync
from tests.integration.procs import BrokerProc, NamesrvProc

MQADMIN = str(Path(sys.executable).parent / "mqadmin")
StartBroker = Callable[..., BrokerProc]


def mqadmin(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    full_env.update(env or {})
    proc = subprocess.run(
        [MQADMIN, *args], capture_output=True, text=True, timeout=60, env=full_env, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"mqadmin {args} exited {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture
def ns(namesrv: NamesrvProc, start_broker: StartBroker) -> str:
    start_broker(namesrv.addr, name="broker-a")
    return namesrv.addr


@pytest.mark.slow
def test_every_command(ns: str) -> None:
    # clusterList: wait for the broker's registration.
    def registered() -> bool:
        out = mqadmin("clusterList", "-n", ns, "--json", check=False)
        return out.returncode == 0 and any(
            r["broker_name"] == "broker-a" for r in json.loads(out.stdout)
        )

    wait_until_sync(registered, total=20, what="broker in clusterList")
    table = mqadmin("clusterList", "-n", ns).stdout
    assert "#Cluster Name" in table
    assert "DefaultCluster" in table

    # updateTopic, RocketMQ spelling and kebab-case alias; -n from NAMESRV_ADDR.
    out = mqadmin(
        "updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", "AdmT", "-r", "4", "-w", "4"
    )
    assert "success" in out.stdout
    mqadmin("update-topic", "-b", _broker_addr(ns), "-t", "AdmT2", "-r", "2", "-w", "2",
            env={"NAMESRV_ADDR": ns})  # fmt: skip

    def routed() -> bool:
        return mqadmin("topicRoute", "-n", ns, "-t", "AdmT", check=False).returncode == 0

    wait_until_sync(routed, total=20, what="AdmT route")
    topics = json.loads(mqadmin("topicList", "-n", ns, "--json").stdout)["topicList"]
    assert "AdmT" in topics
    assert "AdmT" in mqadmin("topic-list", "-n", ns).stdout.split()
    route = json.loads(mqadmin("topicRoute", "-n", ns, "-t", "AdmT", "--json").stdout)
    assert route["queueDatas"][0]["writeQueueNums"] == 4

    # sendMessage, then find it by key and by id.
    send_args = ["-t", "AdmT", "-p", "hello admin", "-k", "K1", "-c", "TagX", "--json"]
    sent = json.loads(mqadmin("sendMessage", "-n", ns, *send_args).stdout)
    assert sent["status"] == "SEND_OK"
    assert "SEND_OK" in mqadmin("sendMessage", "-n", ns, "-t", "AdmT", "-p", "second").stdout

    status = json.loads(mqadmin("topicStatus", "-n", ns, "-t", "AdmT", "--json").stdout)
    assert sum(r["max_offset"] for r in status) == 2
    assert "#Max Offset" in mqadmin("topicStatus", "-n", ns, "-t", "AdmT").stdout

    def indexed() -> bool:
        out = mqadmin("queryMsgByKey", "-n", ns, "-t", "AdmT", "-k", "K1", "--json", check=False)
        return out.returncode == 0 and len(json.loads(out.stdout)) == 1

    wait_until_sync(indexed, total=20, what="key index")
    by_id = json.loads(
        mqadmin("queryMsgById", "-n", ns, "-i", sent["offset_msg_id"], "--json").stdout
    )
    assert by_id[0]["body"] == "hello admin"
    assert by_id[0]["tags"] == "TagX"
    assert "hello admin" in mqadmin("queryMsgById", "-n", ns, "-i", sent["offset_msg_id"]).stdout
    by_uniq = json.loads(
        mqadmin("queryMsgById", "-n", ns, "-i", sent["msg_id"], "-t", "AdmT", "--json").stdout
    )
    assert by_uniq[0]["msg_id"] == sent["msg_id"]

    # consumeMessage prints one JSON object per message.
    lines = mqadmin(
        "consumeMessage", "-n", ns, "-t", "AdmT", "-g", "admg", "--count", "2", "--timeout", "20",
        "--from", "first",
    ).stdout.splitlines()  # fmt: skip
    objs = [json.loads(line) for line in lines]
    assert sorted(o["body"] for o in objs) == ["hello admin", "second"]
    first = next(o for o in objs if o["body"] == "hello admin")
    assert first["keys"] == "K1"
    assert first["tags"] == "TagX"
    assert first["body_base64"] is False
    assert {"topic", "queue_id", "queue_offset", "msg_id", "properties"} <= set(first)

    # The group's progress shows its committed offsets; resetOffsetByTime rewinds them.
    def progressed() -> bool:
        out = json.loads(mqadmin("consumerProgress", "-n", ns, "-g", "admg", "--json").stdout)
        return bool(sum(q["consumer_offset"] for q in out["queues"]) == 2)

    wait_until_sync(progressed, total=20, what="committed offsets")
    assert "Diff Total" in mqadmin("consumerProgress", "-n", ns, "-g", "admg").stdout
    reset = json.loads(
        mqadmin(
            "resetOffsetByTime", "-n", ns, "-g", "admg", "-t", "AdmT", "-s", "0", "--json"
        ).stdout
    )
    assert all(r["offset"] == 0 for r in reset)
    progress = json.loads(mqadmin("consumerProgress", "-n", ns, "-g", "admg", "--json").stdout)
    assert progress["diff_total"] == 2

    # brokerStatus
    bs = json.loads(mqadmin("brokerStatus", "-n", ns, "-b", _broker_addr(ns), "--json").stdout)
    assert "brokerVersionDesc" in next(iter(bs.values()))

    # consumerConnection: no consumer online is a clear error with status 1.
    gone = mqadmin("consumerConnection", "-n", ns, "-g", "nobody", check=False)
    assert gone.returncode == 1
    assert "not online" in gone.stderr

    # deleteTopic
    mqadmin("deleteTopic", "-n", ns, "-t", "AdmT2", "-c", "DefaultCluster")
    assert "AdmT2" not in json.loads(mqadmin("topicList", "-n", ns, "--json").stdout)["topicList"]


@pytest.mark.slow
def test_consumer_connection_with_a_live_consumer(ns: str, tmp_path: Path) -> None:
    mqadmin("updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", "AdmC", "-r", "2", "-w", "2")
    script = tmp_path / "consumer.py"
    script.write_text(
        "import sys, trio\n"
        "from client import PushConsumer, ConsumeStatus, ClientConfig\n"
        "from remoting.logs import configure_logging\n"
        "configure_logging('warning')\n"
        "async def main():\n"
        "    async def l(m): return ConsumeStatus.CONSUME_SUCCESS\n"
        f"    c = PushConsumer('conng', ClientConfig(namesrv_addr={ns!r}), listener=l)\n"
        "    c.subscribe('AdmC', 'TagA || TagB')\n"
        "    async with c:\n"
        "        print('ready', flush=True)\n"
        "        await trio.sleep(60)\n"
        "trio.run(main)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"

        def listed() -> bool:
            out = mqadmin("consumerConnection", "-n", ns, "-g", "conng", "--json", check=False)
            return out.returncode == 0 and len(json.loads(out.stdout)["connectionSet"]) == 1

        wait_until_sync(listed, total=20, what="consumer connection")
        text = mqadmin("consumer-connection", "-n", ns, "-g", "conng").stdout
        assert "TagA || TagB" in text
        assert "CLUSTERING" in text
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
def test_errors_are_clear(ns: str) -> None:
    no_ns = mqadmin("topicList", check=False)
    assert no_ns.returncode == 1
    assert "NAMESRV_ADDR" in no_ns.stderr
    missing = mqadmin("topicRoute", "-n", ns, "-t", "NoSuchTopic", check=False)
    assert missing.returncode == 1
    assert "No route info of this topic: NoSuchTopic" in missing.stderr
    usage = mqadmin("updateTopic", "-n", ns, "-t", "X", check=False)
    assert usage.returncode == 2
    unknown = mqadmin("noSuchCommand", check=False)
    assert unknown.returncode == 2
    dead = mqadmin("topicList", "-n", "127.0.0.1:1", check=False)
    assert dead.returncode == 1
    assert "127.0.0.1:1" in dead.stderr


def _broker_addr(ns: str) -> str:
    out = mqadmin("clusterList", "-n", ns, "--json").stdout
    return str(json.loads(out)[0]["addr"])


@pytest.mark.slow
def test_cluster_list_and_ha_status_show_roles_and_replication(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    ns = namesrv.addr
    master = start_broker(ns, name="broker-r")
    # The slave learns its master's HA address from its next registration.
    start_broker(
        ns,
        name="broker-r",
        broker_id=1,
        args=["--role", "SLAVE"],
        env={"TRIMQ_REGISTER_NAME_SERVER_PERIOD_MS": "500"},
    )

    def both_in_sync() -> bool:
        out = mqadmin("clusterList", "-n", ns, "--json", check=False)
        if out.returncode != 0:
            return False
        rows = json.loads(out.stdout)
        return len(rows) == 2 and all(r["lag_bytes"] == 0 for r in rows)

    wait_until_sync(both_in_sync, total=30, what="master and slave listed in sync")
    rows = {
        r["broker_id"]: r for r in json.loads(mqadmin("clusterList", "-n", ns, "--json").stdout)
    }
    assert (rows[0]["role"], rows[1]["role"]) == ("ASYNC_MASTER", "SLAVE")
    table = mqadmin("clusterList", "-n", ns).stdout
    assert "#Role" in table
    assert "SLAVE" in table
    status = json.loads(mqadmin("haStatus", "-n", ns, "-b", master.addr, "--json").stdout)[
        master.addr
    ]
    assert status["master"] is True
    assert status["inSyncSlaveNums"] == 1
    by_cluster = json.loads(mqadmin("haStatus", "-n", ns, "-c", "DefaultCluster", "--json").stdout)
    assert {v["master"] for v in by_cluster.values()} == {True, False}
    assert mqadmin("haStatus", "-n", ns, check=False).returncode == 2
    unknown = mqadmin("haStatus", "-n", ns, "-c", "NoSuchCluster", check=False)
    assert unknown.returncode == 1
    assert "NoSuchCluster" in unknown.stderr

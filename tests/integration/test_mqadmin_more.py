"""mqadmin's group, configuration, permission, file and order-config commands against a live
NameServer and broker (real processes), with their bad-input answers."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import wait_until_sync
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_mqadmin import mqadmin

StartBroker = Callable[..., BrokerProc]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _fails(*args: str) -> str:
    """Run mqadmin expecting a non-zero exit; its stderr."""
    out = mqadmin(*args, check=False)
    assert out.returncode != 0, f"mqadmin {args} exited 0: {out.stdout}"
    assert "Traceback" not in out.stderr, out.stderr
    return out.stderr


def _wait_registered(ns: str, broker: str = "broker-a") -> str:
    addr: list[str] = []

    def registered() -> bool:
        out = mqadmin("clusterList", "-n", ns, "--json", check=False)
        if out.returncode != 0:
            return False
        rows = [r for r in json.loads(out.stdout) if r["broker_name"] == broker]
        addr[:] = [r["addr"] for r in rows]
        return bool(rows)

    wait_until_sync(registered, total=20, what=f"{broker} in clusterList")
    return addr[0]


def _make_topic(ns: str, topic: str, queues: int = 4) -> None:
    q = str(queues)
    mqadmin("updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", topic, "-r", q, "-w", q)

    def routed() -> bool:
        return mqadmin("topicRoute", "-n", ns, "-t", topic, check=False).returncode == 0

    wait_until_sync(routed, total=20, what=f"route of {topic}")


@pytest.fixture
def cluster(
    namesrv: NamesrvProc, start_broker: StartBroker, tmp_path: Path
) -> tuple[str, str, BrokerProc, Path]:
    """A NameServer and broker-a started with a TOML config file (small commitlog files)."""
    conf = tmp_path / "broker-a.toml"
    conf.write_text(
        "# written by the test\nmapped_file_size_commitlog = 65536\n\n"
        "[broker]\nmax_pull_msgs = 64\n"
    )
    broker = start_broker(namesrv.addr, name="broker-a", config=conf)
    addr = _wait_registered(namesrv.addr)
    return namesrv.addr, addr, broker, conf


def _groups_file(broker: BrokerProc) -> dict[str, object]:
    path = broker.store_dir / "config" / "subscriptionGroup.json"
    doc = json.loads(path.read_text())
    table = doc["subscriptionGroupTable"]
    assert isinstance(table, dict)
    return table


def test_subscription_groups(cluster: tuple[str, str, BrokerProc, Path]) -> None:
    ns, addr, broker, _ = cluster
    out = mqadmin("updateSubGroup", "-n", ns, "-b", addr, "-g", "GrpA", "-r", "5", "-q", "2",
                  "-s", "false").stdout  # fmt: skip
    assert f"create subscription group to {addr} success." in out
    assert "retryMaxTimes=5" in out
    group = _groups_file(broker)["GrpA"]
    assert isinstance(group, dict)
    assert (group["retryMaxTimes"], group["retryQueueNums"], group["consumeEnable"]) == (
        5,
        2,
        False,
    )
    # Kebab-case alias, the whole cluster, JSON output.
    doc = json.loads(
        mqadmin("update-sub-group", "-n", ns, "-c", "DefaultCluster", "-g", "GrpB", "--json").stdout
    )
    assert doc["brokers"] == [addr]
    assert doc["config"]["groupName"] == "GrpB"
    assert "GrpB" in _groups_file(broker)

    out = mqadmin("deleteSubGroup", "-n", ns, "-b", addr, "-g", "GrpA").stdout
    assert f"delete subscription group [GrpA] from broker [{addr}] success." in out
    assert "GrpA" not in _groups_file(broker)
    mqadmin("delete-sub-group", "-n", ns, "-c", "DefaultCluster", "-g", "GrpB")
    assert "GrpB" not in _groups_file(broker)

    # Bad input: unknown broker, no target, bad numbers and flags.
    assert "no broker at 127.0.0.1:1 is registered" in _fails(
        "updateSubGroup", "-n", ns, "-b", "127.0.0.1:1", "-g", "G"
    )
    assert "-b BROKER_ADDR or -c CLUSTER" in _fails("updateSubGroup", "-n", ns, "-g", "G")
    assert "must not be negative" in _fails(
        "updateSubGroup", "-n", ns, "-b", addr, "-g", "G", "-r", "-1"
    )
    assert "expected true or false" in _fails(
        "updateSubGroup", "-n", ns, "-b", addr, "-g", "G", "-s", "maybe"
    )
    assert "not found" in _fails("deleteSubGroup", "-n", ns, "-c", "NoCluster", "-g", "G")
    assert "expected true or false" in _fails(
        "deleteSubGroup", "-n", ns, "-b", addr, "-g", "G", "-r", "maybe"
    )
    # A name the broker refuses: the broker's remark reaches the user.
    assert "CODE" in _fails("updateSubGroup", "-n", ns, "-b", addr, "-g", "bad name!")


def test_broker_config(cluster: tuple[str, str, BrokerProc, Path]) -> None:
    ns, addr, _, conf = cluster
    table = json.loads(mqadmin("getBrokerConfig", "-n", ns, "-b", addr, "--json").stdout)[addr]
    assert table["brokerName"] == "broker-a"
    assert table["maxMessageSize"] == str(4 * 1024 * 1024)
    out = mqadmin("get-broker-config", "-n", ns, "-c", "DefaultCluster").stdout
    assert f"============{addr}============" in out
    assert any(line.startswith("brokerName") and line.endswith("=  broker-a")
               for line in out.splitlines())  # fmt: skip

    # A runtime setting: applied at once and written to the broker's config file.
    res = mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSize", "-v", "1000")
    assert f"update broker config success, {addr}" in res.stdout
    table = json.loads(mqadmin("getBrokerConfig", "-n", ns, "-b", addr, "--json").stdout)[addr]
    assert table["maxMessageSize"] == "1000"
    saved = tomllib.loads(conf.read_text())
    assert saved["max_message_size"] == 1000
    assert saved["mapped_file_size_commitlog"] == 65536
    assert saved["broker"]["max_pull_msgs"] == 64
    assert conf.read_text().startswith("# written by the test\n")
    _make_topic(ns, "CfgT", 1)
    assert "SEND_OK" in mqadmin("sendMessage", "-n", ns, "-t", "CfgT", "-p", "x" * 900).stdout
    assert "CODE" in _fails("sendMessage", "-n", ns, "-t", "CfgT", "-p", "x" * 1500)
    # A setting of the [broker] table is rewritten there; RocketMQ's names are understood.
    mqadmin("update-broker-config", "-n", ns, "-c", "DefaultCluster", "-k", "maxPullMsgs",
            "-v", "32")  # fmt: skip
    mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "diskMaxUsedSpaceRatio", "-v", "80")
    saved = tomllib.loads(conf.read_text())
    assert saved["broker"]["max_pull_msgs"] == 32
    assert "max_pull_msgs" not in {k for k in saved if k != "broker"}
    assert saved["disk_max_used_ratio"] == 0.8

    # Refused: unknown key, a setting that needs a restart, a bad value, an unknown broker.
    err = _fails("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "noSuchKey", "-v", "1")
    assert "unknown broker setting 'noSuchKey'" in err
    err = _fails("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "listen", "-v", "0.0.0.0:1")
    assert "cannot be changed at run time" in err
    err = _fails("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "brokerConfigPath", "-v", "/x")
    assert "cannot be changed at run time" in err
    err = _fails("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSize", "-v", "abc")
    assert "valid integer" in err
    err = _fails("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "a=b", "-v", "1")
    assert "bad setting name" in err
    err = _fails("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSize", "-v", "1\n2")
    assert "line break" in err
    err = _fails("getBrokerConfig", "-n", ns, "-b", "127.0.0.1:1")
    assert "no broker at 127.0.0.1:1" in err
    # Nothing refused was applied or written.
    table = json.loads(mqadmin("getBrokerConfig", "-n", ns, "-b", addr, "--json").stdout)[addr]
    assert table["maxMessageSize"] == "1000"
    assert "listen" not in tomllib.loads(conf.read_text())


def test_broker_without_config_file(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    addr = _wait_registered(namesrv.addr)
    out = mqadmin("updateBrokerConfig", "-n", namesrv.addr, "-b", addr, "-k",
                  "autoCreateTopicEnable", "-v", "false")  # fmt: skip
    assert "success" in out.stdout
    assert "not persisted" in out.stderr
    table = json.loads(mqadmin("getBrokerConfig", "-n", namesrv.addr, "-b", addr, "--json").stdout)
    assert table[addr]["autoCreateTopicEnable"] == "False"
    # Auto-creation is off now: a send to a new topic finds no route.
    assert _fails("sendMessage", "-n", namesrv.addr, "-t", "NoSuchTopicYet", "-p", "x")


def test_namesrv_config_write_perm_and_order_conf(
    cluster: tuple[str, str, BrokerProc, Path],
) -> None:
    ns, _, _, _ = cluster
    table = json.loads(mqadmin("getNamesrvConfig", "-n", ns, "--json").stdout)[ns]
    assert table["orderMessageEnable"] == "False"
    assert f"============{ns}============" in mqadmin("get-namesrv-config", "-n", ns).stdout
    out = mqadmin("updateNamesrvConfig", "-n", ns, "-k", "orderMessageEnable", "-v", "true").stdout
    assert "update name server config success!" in out
    assert "orderMessageEnable : true" in out
    table = json.loads(mqadmin("getNamesrvConfig", "-n", ns, "--json").stdout)[ns]
    assert table["orderMessageEnable"] == "True"
    assert "unknown NameServer setting" in _fails(
        "updateNamesrvConfig", "-n", ns, "-k", "nope", "-v", "1"
    )
    assert "cannot be changed at run time" in _fails(
        "updateNamesrvConfig", "-n", ns, "-k", "listen", "-v", "127.0.0.1:1"
    )
    assert "valid" in _fails(
        "updateNamesrvConfig", "-n", ns, "-k", "brokerChannelExpiredTimeMs", "-v", "soon"
    )

    # Order config, served in routes now that orderMessageEnable is on.
    _make_topic(ns, "OrdT", 4)
    res = mqadmin("updateOrderConf", "-n", ns, "-t", "OrdT", "-m", "put", "-v", "broker-a:4")
    assert "update orderConf success. topic=[OrdT], orderConf=[broker-a:4]" in res.stdout
    got = json.loads(mqadmin("update-order-conf", "-n", ns, "-t", "OrdT", "-m", "get",
                             "--json").stdout)  # fmt: skip
    assert got["orderConf"] == "broker-a:4"
    route = json.loads(mqadmin("topicRoute", "-n", ns, "-t", "OrdT", "--json").stdout)
    assert route["orderTopicConf"] == "broker-a:4"
    assert (
        "delete orderConf success"
        in mqadmin("updateOrderConf", "-n", ns, "-t", "OrdT", "-m", "delete").stdout
    )
    assert "no order config for topic OrdT" in _fails(
        "updateOrderConf", "-n", ns, "-t", "OrdT", "-m", "get"
    )
    for bad in ("broker-a", "broker-a:x", "broker-a:0", ":4"):
        assert "-v" in _fails("updateOrderConf", "-n", ns, "-t", "OrdT", "-m", "put", "-v", bad)
    assert _fails("updateOrderConf", "-n", ns, "-t", "OrdT", "-m", "put")
    assert _fails("updateOrderConf", "-n", ns, "-t", "OrdT", "-m", "replace", "-v", "b:1")

    # Write permission in the NameServer's routes.
    _make_topic(ns, "PermT", 2)
    out = mqadmin("wipeWritePerm", "-n", ns, "-b", "broker-a").stdout
    assert f"wipe write perm of broker[broker-a] in name server[{ns}] OK, " in out
    assert int(out.rsplit(",", 1)[1]) >= 2
    route = json.loads(mqadmin("topicRoute", "-n", ns, "-t", "PermT", "--json").stdout)
    assert route["queueDatas"][0]["perm"] == 4
    doc = json.loads(mqadmin("add-write-perm", "-n", ns, "-b", "broker-a", "--json").stdout)
    assert doc["namesrv"][ns] >= 2
    route = json.loads(mqadmin("topicRoute", "-n", ns, "-t", "PermT", "--json").stdout)
    assert route["queueDatas"][0]["perm"] == 6
    assert "no broker named broker-zz is registered" in _fails(
        "wipeWritePerm", "-n", ns, "-b", "broker-zz"
    )
    assert "no broker named broker-zz" in _fails("addWritePerm", "-n", ns, "-b", "broker-zz")

    # Which cluster a topic lives in; queues spread over clients.
    assert mqadmin("topicClusterList", "-n", ns, "-t", "PermT").stdout.split() == ["DefaultCluster"]
    assert "No route info of this topic" in _fails(
        "topicClusterList", "-n", ns, "-t", "NoSuchTopic"
    )
    doc = json.loads(
        mqadmin("allocateMQ", "-n", ns, "-t", "OrdT", "-i", "192.0.2.1,192.0.2.2").stdout
    )
    assert [q["queueId"] for q in doc["result"]["192.0.2.1"]] == [0, 1]
    assert [q["queueId"] for q in doc["result"]["192.0.2.2"]] == [2, 3]
    assert "twice" in _fails("allocateMQ", "-n", ns, "-t", "OrdT", "-i", "a,a")
    assert "no client id" in _fails("allocateMQ", "-n", ns, "-t", "OrdT", "-i", ",")


def _commitlog_files(broker: BrokerProc) -> list[str]:
    return sorted(p.name for p in (broker.store_dir / "commitlog").iterdir())


def test_expired_files(cluster: tuple[str, str, BrokerProc, Path]) -> None:
    ns, addr, broker, _ = cluster
    _make_topic(ns, "FileT", 1)
    # 64 KiB commitlog files: 60 records of about 4 KiB fill several.
    out = json.loads(
        mqadmin(
            "checkMsgSendRT", "-n", ns, "-t", "FileT", "-a", "60", "-s", "4000", "--json"
        ).stdout
    )
    assert len(out["sends"]) == 60
    before = _commitlog_files(broker)
    assert len(before) >= 3
    # Nothing is past its reserved time (72 h): nothing is deleted.
    doc = json.loads(mqadmin("deleteExpiredCommitLog", "-n", ns, "-b", addr, "--json").stdout)
    assert doc["deleted_files"] == {addr: 0}
    assert set(before) <= set(_commitlog_files(broker))  # (the store may add the next file)
    # Reserved time 0 h: every full file is expired, whatever the delete hour.
    mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "fileReservedTime", "-v", "0")
    assert mqadmin(
        "delete-expired-commit-log", "-n", ns, "-c", "DefaultCluster"
    ).stdout.strip() == ("success")
    after = _commitlog_files(broker)
    # Kept: the file being written (and the next one when the store made it ahead).
    assert 1 <= len(after) <= 2
    assert before[0] not in after
    assert before[1] not in after
    assert mqadmin("cleanExpiredCQ", "-n", ns, "-b", addr).stdout.strip() == "success"
    assert mqadmin("clean-expired-cq", "-n", ns).stdout.strip() == "success"
    status = json.loads(mqadmin("topicStatus", "-n", ns, "-t", "FileT", "--json").stdout)
    assert status[0]["max_offset"] == 60
    assert 0 < status[0]["min_offset"] < 60
    assert "not found" in _fails("cleanExpiredCQ", "-n", ns, "-c", "NoCluster")
    assert "no broker at 127.0.0.1:1" in _fails(
        "deleteExpiredCommitLog", "-n", ns, "-b", "127.0.0.1:1"
    )


def test_broker_permission_steers_routes_at_once(
    cluster: tuple[str, str, BrokerProc, Path],
) -> None:
    """brokerPermission masks the perm of every topic the broker registers, registered at once
    (well inside the 30 s registration period) and from the config file at start."""
    ns, addr, broker, conf = cluster
    _make_topic(ns, "PermB", 2)

    def route_perm() -> int:
        route = json.loads(mqadmin("topicRoute", "-n", ns, "-t", "PermB", "--json").stdout)
        return int(route["queueDatas"][0]["perm"])

    def perm_becomes(want: int) -> None:
        wait_until_sync(lambda: route_perm() == want, total=10, what=f"route perm {want}")

    assert route_perm() == 6
    mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "brokerPermission", "-v", "4")
    perm_becomes(4)
    assert tomllib.loads(conf.read_text())["broker_permission"] == 4
    # A read-only route: the producer finds no queue to write to.
    assert _fails("sendMessage", "-n", ns, "-t", "PermB", "-p", "x")
    mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "brokerPermission", "-v", "2")
    perm_becomes(2)
    mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "brokerPermission", "-v", "4")
    perm_becomes(4)

    # Read from the config file at start: the first registration is masked already (the
    # NameServer's own view set to read-write first, so only that registration brings 4).
    mqadmin("addWritePerm", "-n", ns, "-b", "broker-a")
    assert route_perm() == 6
    broker.restart()
    perm_becomes(4)
    mqadmin("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "brokerPermission", "-v", "6")
    perm_becomes(6)
    assert "SEND_OK" in mqadmin("sendMessage", "-n", ns, "-t", "PermB", "-p", "x").stdout

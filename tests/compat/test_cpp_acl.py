"""The Apache RocketMQ C++ client (PyPI `rocketmq==0.4.4`, `set_session_credentials`) against a
NameServer and a broker with ACL on (real processes): the library's signatures verify (its
producer sends, its push consumer heartbeats, pulls and commits); a denied topic, a wrong
secret and no credentials at all are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin
from tests.compat.conftest import CppClient
from tests.helpers import wait_until
from tests.integration.client_support import fast_config
from tests.integration.procs import BrokerProc, ManagedProcess, NamesrvProc, stop_all

pytestmark = pytest.mark.slow

ACL = """
accounts:
  - accessKey: cpp-producer
    secretKey: cpp-producer-secret
    defaultTopicPerm: DENY
    topicPerms:
      - CompatAclT=PUB
  - accessKey: cpp-consumer
    secretKey: cpp-consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: broker-account
    secretKey: broker-secret
    broker: true
  - accessKey: admin-account
    secretKey: admin-secret
    admin: true
"""

CPP_TIMEOUT = 40.0


@pytest.fixture(scope="module")
def acl_cluster(
    cpp_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, BrokerProc]]:
    base = tmp_path_factory.mktemp("compat-acl")
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL)
    acl_env = {"TRIMQ_ACL_ENABLE": "true", "TRIMQ_ACL_FILE": str(acl_file)}
    started: list[ManagedProcess] = []
    try:
        namesrv = NamesrvProc(base / "namesrv", env=acl_env)
        started.append(namesrv)
        namesrv.start()
        broker = BrokerProc(
            base / "broker-a",
            namesrv.addr,
            env={
                **acl_env,
                "TRIMQ_ACL_ACCESS_KEY": "broker-account",
                "TRIMQ_ACL_SECRET_KEY": "broker-secret",
            },
        )
        started.append(broker)
        broker.start()
        yield namesrv.addr, broker
    finally:
        stop_all(started)


async def test_cpp_client_signs_and_is_refused_without_rights(
    acl_cluster: tuple[str, BrokerProc], tmp_path: Path
) -> None:
    namesrv, broker = acl_cluster
    cpp = CppClient(tmp_path / "home")
    admin_cfg = fast_config(namesrv, access_key="admin-account", secret_key="admin-secret")
    async with Admin(admin_cfg) as admin:
        for topic in ("CompatAclT", "CompatAclOther"):
            await admin.create_topic(
                topic, cluster="DefaultCluster", read_queue_nums=2, write_queue_nums=2
            )

            async def routed(topic: str = topic) -> bool:
                route = await admin.instance.api.get_topic_route(topic)
                return route is not None and bool(route.queue_datas)

            await wait_until(routed, total=20, what=f"the route of {topic}")

    def spec(credentials: list[str] | None, topic: str, body: str) -> dict[str, object]:
        return {
            "namesrv": namesrv,
            "group": "CompatAclPG",
            "credentials": credentials,
            "catch_errors": True,
            "sends": [{"mode": "sync", "topic": topic, "body_hex": body.encode().hex()}],
        }

    good = ["cpp-producer", "cpp-producer-secret"]
    out = await cpp.run("produce", spec(good, "CompatAclT", "allowed"), time_limit=CPP_TIMEOUT)
    [allowed] = out["results"]
    assert "error" not in allowed, allowed
    assert allowed["status"] == 0  # SEND_OK
    refusals = [
        spec(good, "CompatAclOther", "denied topic"),
        spec(["cpp-producer", "not-the-secret"], "CompatAclT", "wrong secret"),
        spec(None, "CompatAclT", "no credentials"),
    ]
    for refused in refusals:
        out = await cpp.run("produce", refused, time_limit=CPP_TIMEOUT)
        [result] = out["results"]
        assert "error" in result, (refused, result)
        assert result["msg_id"] is None
    # librocketmq 1.0.1 reports any send that failed on every attempt as "No route info of
    # this topic"; the broker's log says why: NO_PERMISSION, per account and resource.
    refused_log = [
        line for line in broker.log_path.read_text().splitlines() if "acl_refused" in line
    ]
    assert any("CompatAclOther" in line and "cpp-producer" in line for line in refused_log)
    assert any("ignature" in line for line in refused_log), refused_log
    assert any("no AccessKey" in line for line in refused_log), refused_log

    # The C++ push consumer (heartbeat, pulls, offset commits signed) gets the allowed one.
    out = await cpp.run(
        "push",
        {
            "namesrv": namesrv,
            "group": "CompatAclCG",
            "topic": "CompatAclT",
            "expression": "*",
            "expect": 1,
            "timeout_s": 20,
            "settle_s": 1.0,
            "credentials": ["cpp-consumer", "cpp-consumer-secret"],
        },
        time_limit=CPP_TIMEOUT,
    )
    assert not out["timed_out"], out
    assert [bytes.fromhex(d["body_hex"]) for d in out["deliveries"]] == [b"allowed"]

"""trimq's tools against servers that speak only RocketMQ's JSON and ROCKETMQ header codecs, as
an Apache NameServer and broker do (`msgpack_headers = false`): they work with no flag, because
a trimq client starts in JSON and moves to msgpack only when the server says it reads it."""

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

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIN = Path(sys.executable).parent
JSON_ONLY = {"TRIMQ_MSGPACK_HEADERS": "false"}


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NAMESRV_ADDR", "TRIMQ_CLIENT_SERIALIZE_TYPE")
    }
    return subprocess.run(
        [str(BIN / tool), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_mqadmin_and_mqbench_need_no_flag(
    start_namesrv: Callable[..., NamesrvProc], start_broker: Callable[..., BrokerProc]
) -> None:
    namesrv = start_namesrv(env=JSON_ONLY)
    broker = start_broker(namesrv.addr, name="broker-a", env=JSON_ONLY)
    ns = namesrv.addr

    def registered() -> bool:
        out = _run("mqadmin", "clusterList", "-n", ns, "--json")
        return out.returncode == 0 and "broker-a" in out.stdout

    wait_until_sync(registered, total=20, what="broker-a in clusterList")
    made = _run("mqadmin", "updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", "JsonOnlyT")
    assert made.returncode == 0, made.stderr
    listed = _run("mqadmin", "topicList", "-n", ns, "--json")
    assert listed.returncode == 0, listed.stderr
    assert "JsonOnlyT" in json.loads(listed.stdout)["topicList"]

    sent = _run("mqbench", "producer", "-n", ns, "-t", "JsonOnlyT", "-w", "2", "-s", "64",
                "--count", "100", "--json")  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    summary = json.loads(sent.stdout.strip().splitlines()[-1])
    assert (summary["messages"], summary["errors"]) == (100, 0)
    got = _run("mqbench", "consumer", "-n", ns, "-t", "JsonOnlyT", "-g", "jsonOnlyG",
               "--from", "first", "--count", "101", "--duration", "60", "--json")  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.strip().splitlines()[-1])["messages"] == 101

    # The servers really refuse trimq's own codec: forcing it fails with a clear error.
    forced = _run("mqadmin", "--serialize-type", "msgpack", "topicList", "-n", ns)
    assert forced.returncode != 0
    assert "mqadmin: error:" in forced.stderr
    assert "unknown serialize type" in broker.log_text() + namesrv.log_text()

"""mqbench against a real NameServer and broker: counts add up and the summary is complete."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.integration.procs import BrokerProc, NamesrvProc

BIN = Path(sys.executable).parent
StartBroker = Callable[..., BrokerProc]


def _run(*args: str) -> dict[str, object]:
    proc = subprocess.run(
        [str(BIN / "mqbench"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_producer_then_consumer_counts(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    prod = _run("producer", "-n", ns, "-t", "MB1", "-w", "4", "-s", "256", "-b", "5",
                "--count", "200", "--json")  # fmt: skip
    assert prod["messages"] == 200
    assert prod["errors"] == 0
    lat = prod["latency_ms"]
    assert isinstance(lat, dict)
    assert set(lat) == {"avg", "p50", "p99", "max", "samples"}
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    cons = _run("consumer", "-n", ns, "-t", "MB1", "-g", "mbg", "--from", "first",
                "--count", "201", "--duration", "60", "--json")  # fmt: skip
    # 200 measured messages plus the producer's one warm-up send.
    assert cons["messages"] == 201
    assert cons["kind"] == "consumer"


def test_producer_sends_from_a_body_pool(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    prod = _run("producer", "-n", ns, "-t", "MBPool", "-w", "2", "-s", "128", "-b", "3",
                "--body-pool", "4", "--count", "30", "--json")  # fmt: skip
    assert prod["messages"] == 30
    assert prod["errors"] == 0
    cons = _run("consumer", "-n", ns, "-t", "MBPool", "-g", "mbpool", "--from", "first",
                "--count", "31", "--duration", "60", "--json")  # fmt: skip
    assert cons["messages"] == 31

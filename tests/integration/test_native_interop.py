"""The native accelerators (common.speedups, remoting._speedups) and the pure-Python reference
(TRIMQ_NO_NATIVE=1) against each other over real processes: a pure-Python broker serves a
native client, a native broker serves a pure-Python client (mqbench in a subprocess), and a
store written by one is recovered, read and searched by the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

import common.message as store_message
import remoting._header_codec as header_codec
from client import (
    Admin,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendStatus,
)
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc, child_env

StartBroker = Callable[..., BrokerProc]
BIN = Path(sys.executable).parent
PURE = {"TRIMQ_NO_NATIVE": "1"}
# The interop tests need both sides: a run with TRIMQ_NO_NATIVE set has only the pure one.
needs_native = pytest.mark.skipif(
    not store_message.NATIVE, reason="native accelerators off or not built: nothing to pair"
)


def test_native_accelerators_are_built_and_selected() -> None:
    """`make test` builds both extensions (pyproject's optional ext-modules): if a compiler
    is missing the install still works on the pure-Python code, and this says so."""
    if os.environ.get("TRIMQ_NO_NATIVE", "") not in ("", "0"):
        assert not store_message.NATIVE
        assert header_codec.native is None
        return
    assert store_message.NATIVE, "common.speedups was not built (no C compiler?)"
    assert header_codec.native is not None, "remoting._speedups was not built (no C compiler?)"


async def _send_mix(ns: str, topic: str) -> dict[str, Message]:
    """Single sends with tags, keys, unicode properties and one compressed body, and two
    batches: what every codec path touches. Returns the messages by msg id."""
    cfg = fast_config(ns)
    sent: dict[str, Message] = {}
    async with Producer("interop_pg", cfg) as p:
        for i in range(12):
            body = bytes(range(256)) * 64 if i == 5 else f"single-{i}".encode()
            m = Message(topic, body, tags=f"T{i % 3}", keys=f"k{i} shared")
            m.put_user_property("note", f"ü-{i}-✓")
            r = await p.send(m)
            assert r.status is SendStatus.SEND_OK
            sent[r.msg_id] = m
        for b in range(2):
            batch = [Message(topic, f"batch-{b}-{j}".encode(), tags="TB") for j in range(10)]
            results = await p.send_batch(batch)
            ids = [i for r in results for i in r.msg_id.split(",")]
            assert len(ids) == 10
            sent.update(zip(ids, batch, strict=True))
    return sent


async def _consume_all(ns: str, topic: str, group: str, n: int) -> dict[str, MessageExt]:
    got: dict[str, MessageExt] = {}

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            got[m.msg_id] = m
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        group,
        fast_config(ns),
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    c.subscribe(topic, "*")
    async with c:
        await wait_until(lambda: len(got) >= n, total=30, what=f"{n} messages of {topic}")
        await trio.sleep(0.3)
    return got


def _check(sent: dict[str, Message], got: dict[str, MessageExt]) -> None:
    assert set(got) == set(sent)
    for mid, m in sent.items():
        g = got[mid]
        assert g.body == m.body
        assert g.tags == m.tags
        assert g.keys == m.keys
        assert g.properties.get("note") == m.properties.get("note")


@pytest.mark.slow
@needs_native
async def test_pure_python_broker_serves_the_native_client_and_a_native_broker_recovers_it(
    namesrv: NamesrvProc, start_broker: StartBroker, tmp_path: Path
) -> None:
    broker = start_broker(namesrv.addr, name="broker-a", env=PURE)
    # Logged once registered, a moment after the port opens.
    await wait_until(lambda: "native=False" in broker.log_path.read_text(), total=20, what="log")
    assert "native=True" not in broker.log_path.read_text()
    await create_topic(namesrv.addr, "InteropA", queues=2)
    sent = await _send_mix(namesrv.addr, "InteropA")
    _check(sent, await _consume_all(namesrv.addr, "InteropA", "interop_cg1", len(sent)))
    async with Admin(fast_config(namesrv.addr)) as admin:
        found = await admin.query_msg_by_key("InteropA", "shared")
        assert len(found) == 12

    # The same store, recovered by a native broker: records, consume queues and index read back.
    await trio.to_thread.run_sync(broker.stop)
    broker.env = {}
    await trio.to_thread.run_sync(broker.start)
    await wait_until(lambda: "native=True" in broker.log_path.read_text(), total=20, what="log")
    _check(sent, await _consume_all(namesrv.addr, "InteropA", "interop_cg2", len(sent)))
    async with Admin(fast_config(namesrv.addr)) as admin:

        async def indexed() -> bool:
            return len(await admin.query_msg_by_key("InteropA", "k5")) == 1

        await wait_until(indexed, total=20, what="index lookup after recovery")
        [big] = await admin.query_msg_by_key("InteropA", "k5")
        assert big.body == bytes(range(256)) * 64


def _mqbench(*args: str, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run(
        [str(BIN / "mqbench"), "--log-level", "error", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=child_env(env),
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
@needs_native
async def test_native_broker_serves_a_pure_python_client(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr, name="broker-a")
    await create_topic(namesrv.addr, "InteropB", queues=4)
    ns = namesrv.addr
    single_args = ["producer", "-n", ns, "-t", "InteropB", "-w", "8", "-s", "300", "-c", "300"]
    batch_args = ["producer", "-n", ns, "-t", "InteropB", "-w", "2", "-s", "300", "-b", "16"]
    single = await trio.to_thread.run_sync(lambda: _mqbench(*single_args, env=PURE))
    batched = await trio.to_thread.run_sync(lambda: _mqbench(*batch_args, "-c", "320", env=PURE))
    assert single["errors"] == batched["errors"] == 0
    # 620 measured messages plus each producer's warm-up send.
    total = 300 + 320 + 2
    consumer_args = ["consumer", "-n", ns, "-t", "InteropB", "-g", "interop_pure",
                     "--from", "first", "-c", str(total), "-d", "60"]  # fmt: skip
    consumed = await trio.to_thread.run_sync(lambda: _mqbench(*consumer_args, env=PURE))
    assert consumed["messages"] == total
    got = await _consume_all(ns, "InteropB", "interop_native", total)
    assert len(got) == total
    assert all(len(m.body) == 300 for m in got.values())

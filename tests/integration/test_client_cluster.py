"""Rebalance, broadcasting and producer failover against two real brokers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    MQClientError,
    Producer,
    PushConsumer,
)
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def two_brokers(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> tuple[str, BrokerProc, BrokerProc]:
    a = start_broker(namesrv.addr, name="broker-a")
    b = start_broker(namesrv.addr, name="broker-b")
    return namesrv.addr, a, b


class Collector:
    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        self.ids.extend(m.msg_id for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


async def _send(p: Producer, topic: str, n: int, tag: str) -> set[str]:
    ids = set()
    for i in range(n):
        ids.add((await p.send(Message(topic, f"{tag}-{i}"))).msg_id)
    return ids


async def test_three_consumers_share_queues_and_hand_over(
    two_brokers: tuple[str, BrokerProc, BrokerProc],
) -> None:
    ns, _, _ = two_brokers
    await create_topic(ns, "RB1", queues=4, brokers=2)
    cfg = fast_config(ns)
    collectors = [Collector() for _ in range(3)]
    consumers = [
        PushConsumer(
            "rbg",
            cfg.model_copy(update={"instance_name": f"c{i}"}),
            listener=collectors[i],
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        for i in range(3)
    ]
    for c in consumers:
        c.subscribe("RB1", "*")
    all_mqs = {MessageQueue("RB1", b, q) for b in ("broker-a", "broker-b") for q in range(4)}

    def converged(active: list[PushConsumer]) -> bool:
        owned = [set(c.queues) for c in active]
        flat = [q for s in owned for q in s]
        return len(flat) == len(set(flat)) and set(flat) == all_mqs and all(owned)

    async with Producer("rbp", cfg) as p:
        sent = await _send(p, "RB1", 60, "first")
        async with consumers[0], consumers[1]:
            leaver = consumers[2]
            async with leaver:
                await wait_until(
                    lambda: converged(consumers), total=20, what="three-way assignment"
                )
                sent |= await _send(p, "RB1", 60, "second")
                await wait_until(
                    lambda: sent <= {i for c in collectors for i in c.ids},
                    total=30,
                    what="all messages consumed",
                )
                leaver_queues = set(leaver.queues)
                assert leaver_queues
                await trio.sleep(1)  # offsets committed in memory reach the broker
            marks = [len(c.ids) for c in collectors]
            # The leaver is gone: the other two take its queues within a rebalance interval.
            with trio.fail_after(10):
                await wait_until(
                    lambda: converged(consumers[:2]), total=10, what="two-way assignment"
                )
            sent |= await _send(p, "RB1", 60, "third")
            await wait_until(
                lambda: sent <= {i for c in collectors for i in c.ids},
                total=30,
                what="messages after hand-over consumed",
            )
    consumed = [i for c in collectors for i in c.ids]
    assert sent <= set(consumed)
    # After the hand-over the new owners resumed from the leaver's committed offsets:
    # nothing consumed before it left was delivered again.
    earlier = {i for c, m in zip(collectors, marks, strict=True) for i in c.ids[:m]}
    later = [i for c, m in zip(collectors, marks, strict=True) for i in c.ids[m:]]
    assert not set(later) & earlier


async def test_broadcasting_gets_everything_and_offsets_survive_restart(
    two_brokers: tuple[str, BrokerProc, BrokerProc], tmp_path: Path
) -> None:
    ns, _, _ = two_brokers
    await create_topic(ns, "BC1", queues=2, brokers=2)
    cfg = fast_config(ns, offset_store_dir=str(tmp_path / "offsets"))

    def make(name: str, col: Collector) -> PushConsumer:
        c = PushConsumer(
            "bcg",
            cfg.model_copy(update={"instance_name": name}),
            listener=col,
            message_model=MessageModel.BROADCASTING,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        c.subscribe("BC1")
        return c

    c1, c2 = Collector(), Collector()
    async with Producer("bcp", cfg) as p:
        first = await _send(p, "BC1", 20, "one")
        async with make("b1", c1), make("b2", c2):
            await wait_until(lambda: set(c1.ids) >= first, total=20, what="b1 got all")
            await wait_until(lambda: set(c2.ids) >= first, total=20, what="b2 got all")
        assert (tmp_path / "offsets" / "b1" / "bcg" / "offsets.json").exists()
        second = await _send(p, "BC1", 10, "two")
        again = Collector()
        async with make("b1", again):
            await wait_until(lambda: set(again.ids) >= second, total=20, what="new messages")
            await trio.sleep(1)
    # From FIRST_OFFSET the restarted consumer would see all 30 without its stored offsets.
    assert not set(again.ids) & first


async def test_producer_avoids_dead_broker_then_fails_when_none_left(
    two_brokers: tuple[str, BrokerProc, BrokerProc],
) -> None:
    ns, a, b = two_brokers
    await create_topic(ns, "FO1", queues=2, brokers=2)
    cfg = fast_config(ns, poll_name_server_interval_ms=60_000)
    async with Producer("fop", cfg) as p:
        brokers = {(await p.send(Message("FO1", b"x"))).message_queue.broker_name for _ in range(8)}
        assert brokers == {"broker-a", "broker-b"}
        await trio.to_thread.run_sync(b.kill)
        landed = [(await p.send(Message("FO1", b"y"))).message_queue.broker_name for _ in range(10)]
        assert set(landed) == {"broker-a"}
        # The failure isolated broker-b for its not-available duration (600 s for 30 s latency).
        assert not p.fault.is_available("broker-b")
        assert p.fault.is_available("broker-a")
        await trio.to_thread.run_sync(a.kill)
        with pytest.raises(MQClientError, match="still failed"):
            await p.send(Message("FO1", b"z"))

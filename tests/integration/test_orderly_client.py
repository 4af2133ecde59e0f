"""Orderly PushConsumer on real processes: per sharding key order across 3 consumers while
one leaves and rejoins; no two clients consume a queue at the same time; locks held on the
broker (a foreign client's LOCK_BATCH_MQ gets nothing)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import trio

from client import (
    Admin,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

TOPIC = "OrdT"
GROUP = "CG_ord"
KEYS = [f"k{i}" for i in range(8)]
PER_KEY = 40


@pytest.mark.slow
async def test_order_per_key_and_exclusive_queues(
    namesrv: NamesrvProc, start_broker: object
) -> None:
    assert callable(start_broker)
    broker: BrokerProc = start_broker(namesrv.addr)
    await create_topic(namesrv.addr, TOPIC, queues=4)
    seen: dict[str, list[int]] = defaultdict(list)
    windows: list[tuple[str, MessageQueue, float, float]] = []
    suspended_once: set[bytes] = set()

    def make(name: str) -> PushConsumer:
        async def listener(
            msgs: list[MessageExt], ctx: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            start = trio.current_time()
            await trio.sleep(0.003)
            for m in msgs:
                # One suspension per key at seq 5: the same message must come back first.
                if m.body.endswith(b":5") and m.body not in suspended_once:
                    suspended_once.add(m.body)
                    windows.append((name, ctx.message_queue, start, trio.current_time()))
                    ctx.suspend_current_queue_time_ms = 100
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                key, seq = m.body.decode().split(":")
                seen[key].append(int(seq))
            windows.append((name, ctx.message_queue, start, trio.current_time()))
            return ConsumeOrderlyStatus.SUCCESS

        c = PushConsumer(
            GROUP,
            fast_config(namesrv.addr),
            orderly_listener=listener,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        c.subscribe(TOPIC, "*")
        return c

    def all_seen() -> bool:
        return all(len(set(seen[k])) == PER_KEY for k in KEYS)

    cfg = fast_config(namesrv.addr)
    c1, c2, c3, c3b = make("c1"), make("c2"), make("c3"), make("c3b")

    async def run(c: PushConsumer, stop: trio.Event, *, task_status: trio.TaskStatus[None]) -> None:
        async with c:
            task_status.started()
            await stop.wait()

    def locked() -> set[MessageQueue]:
        return {
            mq
            for c in (c1, c2, c3, c3b)
            for mq, oq in c._orderly.items()
            if mq.topic == TOPIC and c._lock_valid(oq)
        }

    async with Producer("PG_ord", cfg) as producer, Admin(cfg) as admin, c1, c2:
        stop3, stop3b = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(run, c3, stop3)

            # Wait for the rebalance after c3 joined to settle: before it, c1 and c2 hold all
            # four queues, and one of them is released to c3 during the rebalance (a foreign
            # lock request in that window would rightly succeed).
            def settled() -> bool:
                held = [
                    {mq for mq, oq in c._orderly.items() if mq.topic == TOPIC and c._lock_valid(oq)}
                    for c in (c1, c2, c3)
                ]
                return all(held) and sum(map(len, held)) == 4 and len(locked()) == 4

            await wait_until(settled, total=20, what="4 queues locked, c3 holding its share")
            # A foreign client of the group cannot lock any of them.
            mqs = await admin.instance.get_subscribe_queues(TOPIC)
            assert len(mqs) == 4
            stolen = await admin.instance.api.lock_batch_mq(broker.addr, GROUP, "intruder", mqs)
            assert stolen == set()

            async def send_all() -> None:
                for seq in range(PER_KEY):
                    for k in KEYS:
                        await producer.send_orderly(Message(TOPIC, f"{k}:{seq}".encode()), k)
                    await trio.sleep(0.02)

            nursery.start_soon(send_all)
            await trio.sleep(0.5)
            stop3.set()  # c3 leaves while messages flow
            await trio.sleep(1.5)
            await nursery.start(run, c3b, stop3b)  # and rejoins (a new client id)
            await wait_until(all_seen, total=25, what="every message consumed")
            stop3b.set()
    for k in KEYS:
        assert seen[k] == sorted(seen[k]), f"{k} out of order: {seen[k]}"
        assert set(seen[k]) == set(range(PER_KEY))
    # No two clients ever consumed the same queue at overlapping times.
    by_queue: dict[MessageQueue, list[tuple[float, float, str]]] = defaultdict(list)
    for name, mq, start, end in windows:
        by_queue[mq].append((start, end, name))
    for mq, ws in by_queue.items():
        ws.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in itertools.pairwise(ws):
            if n1 != n2:
                assert s2 >= e1, f"{mq}: {n1} and {n2} overlapped"
    assert len(suspended_once) == len(KEYS)

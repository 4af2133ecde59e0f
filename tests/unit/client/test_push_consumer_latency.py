"""Latency properties of the push consumer's pull -> listener path (W4), and the W4 harness's
GC settling. Counted in scheduler rounds, never in milliseconds."""

from __future__ import annotations

import gc
from typing import Any

import trio
import trio.lowlevel
import trio.testing

from bench.peers import trimq_e2e
from client._api import PullResult, PullStatus
from client.config import ClientConfig
from client.consumer._base import _QueueState
from client.consumer.offset_store import RemoteOffsetStore
from client.consumer.process_queue import ProcessQueue
from client.consumer.push import ConsumeStatus, PushConsumer
from client.message import MessageExt, MessageQueue, decode_pull_body
from common.message import MessageInner, encode_record

MQ = MessageQueue("T", "broker-a", 0)


class _NoBackend:
    async def fetch_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        return -1

    async def store_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        return None


def _body(offset: int) -> bytes:
    msg = MessageInner("T", b"x" * 16, queue_id=0, properties={"UNIQ_KEY": "U" * 32})
    return bytes(encode_record(msg, offset, 1000 + offset * 200, 1_700_000_000_000))


class _ParkedPulls:
    """Stands in for `_pull_once`: each pull is parked until `arrive()` answers it with one
    message (as the broker's long poll does); counts the pulls issued."""

    def __init__(self) -> None:
        self.issued = 0
        self._arrival = trio.Event()
        self._offset = 100

    def arrive(self) -> None:
        self._arrival.set()

    async def pull_once(self, mq: MessageQueue, st: _QueueState) -> PullResult:
        self.issued += 1
        await self._arrival.wait()
        self._arrival = trio.Event()
        msgs = decode_pull_body(_body(self._offset), "broker-a")
        self._offset += 1
        return PullResult(PullStatus.FOUND, self._offset, 0, self._offset, msgs)


def _consumer(listener: Any) -> tuple[PushConsumer, _ParkedPulls]:
    c = PushConsumer("cg_latency", ClientConfig(), listener=listener)
    c._offset_store = RemoteOffsetStore("cg_latency", _NoBackend())
    c._wants_context = False
    pulls = _ParkedPulls()
    c._pull_once = pulls.pull_once  # type: ignore[method-assign]
    return c, pulls


def test_message_answering_a_parked_pull_reaches_the_listener_within_three_rounds() -> None:
    """From the moment the parked pull is answered: the pull loop runs in the next scheduler
    round and hands the batch to a consume worker, which calls the listener in the round
    after. No sleep,
    back-off or timer sits on the path (a regression would need more rounds)."""
    seen: list[int] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.queue_offset for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c, pulls = _consumer(listener)
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            st = _QueueState(ProcessQueue(), 100, trio.CancelScope())
            nursery.start_soon(c._pull_loop, MQ, st)
            for expected in (100, 101, 102):
                await trio.testing.wait_all_tasks_blocked()
                pulls.arrive()
                rounds = 0
                while len(seen) < expected - 99:
                    await trio.lowlevel.checkpoint()  # one scheduler round for this task
                    rounds += 1
                    assert rounds <= 3, f"listener not called {rounds} rounds after the answer"
                assert seen[-1] == expected
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()  # the pull loop and the idle consume worker
        assert c.offset_store.table()[MQ] == 103

    trio.run(main)


def test_next_pull_is_issued_while_the_listener_still_runs() -> None:
    """The pull loop hands a batch to a consume worker and pulls again at once: a slow listener
    never holds back the next long poll (so a new arrival is answered immediately)."""
    release = trio.Event()
    calls = [0]

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        calls[0] += 1
        await release.wait()
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c, pulls = _consumer(listener)
        async with trio.open_nursery() as nursery:
            c._nursery = nursery
            st = _QueueState(ProcessQueue(), 100, trio.CancelScope())
            nursery.start_soon(c._pull_loop, MQ, st)
            await trio.testing.wait_all_tasks_blocked()
            pulls.arrive()
            await trio.testing.wait_all_tasks_blocked()
            assert calls[0] == 1  # the listener is blocked on `release` ...
            assert pulls.issued == 2  # ... and the next pull is already parked
            pulls.arrive()
            await trio.testing.wait_all_tasks_blocked()
            assert calls[0] == 2  # consumed concurrently
            assert pulls.issued == 3
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()  # the pull loop and the idle consume workers
        assert c.consumed_ok == 2

    trio.run(main)


def test_w4_harness_freezes_the_startup_heap_before_the_paced_loop() -> None:
    """`freeze_startup_heap` moves live objects to the permanent generation (so full
    collections during the measured run skip them), and `run` calls it."""
    before = gc.get_freeze_count()
    keep = [[i] for i in range(100)]
    try:
        trimq_e2e.freeze_startup_heap()
        assert gc.get_freeze_count() >= before + len(keep)
    finally:
        gc.unfreeze()
    assert "freeze_startup_heap" in trimq_e2e.run.__code__.co_names


class _LoopIterations(trio.abc.Instrument):
    """Counts scheduler loop iterations (each ends in one epoll wait)."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


def test_w4_pacing_costs_one_scheduler_round_per_message() -> None:
    """The paced sender yields once per message (sleep 0 when behind) and takes a free window
    slot without a second yield, as the peers' asyncio.Semaphore does; the window still
    bounds the sends in flight."""
    n = 400
    sent: list[int] = []
    in_flight = [0, 0]  # now, max

    async def instant(seq: int) -> None:
        sent.append(seq)

    async def slow(seq: int) -> None:
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        await trio.sleep(0.001)
        in_flight[0] -= 1

    async def main() -> None:
        loops = _LoopIterations()
        trio.lowlevel.add_instrument(loops)
        await trimq_e2e.paced(1e9, range(n), instant)  # always behind: sleep(0) each time
        trio.lowlevel.remove_instrument(loops)
        assert sent == list(range(n))
        assert loops.count <= n + n // 10  # trio's Semaphore.acquire() alone: ~2n
        await trimq_e2e.paced(1e9, range(50), slow, window=4)
        assert in_flight[1] == 4

    trio.run(main)

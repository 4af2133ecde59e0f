"""`PushConsumer`: long-polling pull loops feeding an async listener (DefaultMQPushConsumer).

Two kinds of listener:

- concurrent (`listener`): batches are consumed in parallel; a batch that fails
  (RECONSUME_LATER, an exception, or longer than `consume_timeout_ms`) is sent back
  to the broker (CONSUMER_SEND_MSG_BACK -> `%RETRY%<group>`, then `%DLQ%<group>` after
  the max reconsume times). In CLUSTERING mode the consumer subscribes to its retry
  topic by itself and hands retried messages to the listener with their real topic.
- orderly (`orderly_listener`): each queue is locked on its broker (LOCK_BATCH_MQ,
  renewed every 20 s) and consumed by one task in offset order, only while the lock
  is held; SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same messages after a pause.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any

import structlog
import trio

from client.config import ClientConfig
from client.consumer._base import ConsumeFromWhere, ConsumerBase, MessageModel
from client.consumer._deadlines import CallDeadlines
from client.consumer.process_queue import ProcessQueue
from client.consumer.rebalance import AllocateStrategy
from client.errors import MQClientError
from client.filter import parse_subscription
from client.instance import ClientInstance
from client.message import Message, MessageExt, MessageQueue, put_properties_lazily
from client.trace import ConsumeReturnType
from common.message import (
    PROPERTY_CONSUME_START_TIMESTAMP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
)

log = structlog.get_logger()

# A batch whose send-back failed (and whose re-send through the inner producer failed)
# is consumed again locally after this delay (RocketMQ's 5 s).
LOCAL_RETRY_DELAY_S = 5.0
DRAIN_TIMEOUT_S = 10.0
DEFAULT_MAX_RECONSUME_TIMES = 16
# Orderly: lock renewal period and how long a lock is trusted client-side without renewal
# (RocketMQ's REBALANCE_LOCK_INTERVAL and REBALANCE_LOCK_MAX_LIVE_TIME).
LOCK_RENEW_INTERVAL_S = 20.0
LOCK_MAX_LIVE_S = 30.0
# How long a queue being released waits for its consume task to finish the batch in hand.
RELEASE_WAIT_S = 1.0


class ConsumeStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass(slots=True)
class ConsumeConcurrentlyContext:
    """What a concurrent listener may set for a failed batch.

    Attributes:
        message_queue: the queue the batch was pulled from.
        delay_level_when_next_consume: send-back delay level; 0 lets the broker choose
            (3 + reconsume times), -1 sends straight to the DLQ.
        ack_index: with CONSUME_SUCCESS, messages after this index are still retried.
    """

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0
    ack_index: int = 2**31 - 1


@dataclass(slots=True)
class ConsumeOrderlyContext:
    """Orderly listener context.

    Attributes:
        message_queue: the queue being consumed.
        suspend_current_queue_time_ms: pause before a suspended batch is retried (-1: the
            consumer's `suspend_current_queue_time_ms`).
    """

    message_queue: MessageQueue
    suspend_current_queue_time_ms: int = -1


# `async (msgs) -> ConsumeStatus` or `async (msgs, context) -> ConsumeStatus`.
Listener = Callable[..., Awaitable[ConsumeStatus | None]]
_Batch = tuple[MessageQueue, ProcessQueue, list[MessageExt], trio.Event | None]
OrderlyListener = Callable[
    [list[MessageExt], ConsumeOrderlyContext], Awaitable[ConsumeOrderlyStatus | None]
]


def _wants_context(fn: Callable[..., object]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional for p in params) >= 2


@dataclass(slots=True)
class _OrderlyQueue:
    wakeup: trio.Event = field(default_factory=trio.Event)
    consume_lock: trio.Lock = field(default_factory=trio.Lock)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    locked_at: float | None = None  # monotonic time of the last successful broker lock


class PushConsumer(ConsumerBase):
    """Consumes subscribed topics and calls the listener for each batch.

    Args:
        group: the consumer group.
        config: client options (pull batch size, consume concurrency and batch size,
            flow-control thresholds, `max_reconsume_times`, `consume_timeout_ms`,
            `suspend_current_queue_time_ms`, intervals...).
        instance: a started ClientInstance to share (default: its own).
        listener: concurrent listener, `async (msgs) -> ConsumeStatus` or
            `async (msgs, ConsumeConcurrentlyContext) -> ConsumeStatus`; may also be set
            with `register_listener` before start.
        orderly_listener: `async (msgs, ConsumeOrderlyContext) -> ConsumeOrderlyStatus`
            (or `register_orderly_listener`); exclusive with `listener`.
        message_model: CLUSTERING (queues shared by the group, offsets on the
            broker) or BROADCASTING (every consumer gets everything, offsets
            in a local file; failed messages are dropped, never retried).
        consume_from_where: where a queue with no stored offset starts.
        consume_timestamp: epoch ms for CONSUME_FROM_TIMESTAMP (default now - 30 min).
        allocate_strategy: rebalance strategy (default averagely).

    Usage::

        consumer = PushConsumer("cg", cfg, listener=handle)
        consumer.subscribe("TopicTest", "TagA || TagB")
        async with consumer:
            await trio.sleep_forever()

    Delivery is at least once: the committed offset of a queue is the smallest
    offset still being consumed, so a crash re-delivers rather than loses. A failed
    message's offset is passed once the broker holds its retry copy.
    """

    def __init__(
        self,
        group: str,
        config: ClientConfig | None = None,
        *,
        instance: ClientInstance | None = None,
        listener: Listener | None = None,
        orderly_listener: OrderlyListener | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        allocate_strategy: AllocateStrategy | None = None,
    ) -> None:
        super().__init__(
            group,
            config,
            instance=instance,
            message_model=message_model,
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
        )
        self.listener = listener
        self.orderly_listener = orderly_listener
        # Concurrent consumption: batches go to a pool of up to `consume_concurrency` worker
        # tasks (RocketMQ's consume thread pool), started as needed and kept: a task spawned
        # per pulled batch is a sizeable share of the client's CPU per message.
        # (docs/design-notes.md, "Push consumer worker pool")
        self._work_send, self._work_receive = trio.open_memory_channel[_Batch](math.inf)
        self._workers = 0
        self._idle_workers = 0  # workers parked on the channel and not yet handed a batch
        # Listeners running in pull tasks (`_consume_caught_up`): they count against
        # `consume_concurrency` with the workers.
        self._in_pull_tasks = 0
        self._inflight = 0
        self._idle = trio.Event()
        self._idle.set()
        self._orderly: dict[MessageQueue, _OrderlyQueue] = {}
        self.consumed_ok = 0
        self.consumed_failed = 0
        self.sent_back = 0
        # `consume_timeout_ms` of every listener call, by one timer task (`_start_extra`).
        self._call_deadlines = CallDeadlines(self.config.consume_timeout_ms / 1000)

    def register_listener(self, listener: Listener) -> None:
        self.listener = listener

    def register_orderly_listener(self, listener: OrderlyListener) -> None:
        self.orderly_listener = listener

    @property
    def orderly(self) -> bool:
        return self.orderly_listener is not None

    def max_reconsume_times(self) -> int:
        """The consumer's limit (config -1: 16 concurrent, unlimited orderly)."""
        n = self.config.max_reconsume_times
        if n >= 0:
            return n
        return 2**31 - 1 if self.orderly else DEFAULT_MAX_RECONSUME_TIMES

    async def _start_extra(self, nursery: trio.Nursery) -> None:
        if (self.listener is None) == (self.orderly_listener is None):
            raise MQClientError("register exactly one listener (concurrent or orderly) first")
        if not self.subscriptions:
            raise MQClientError("subscribe to at least one topic before starting the consumer")
        if self.message_model is MessageModel.CLUSTERING:
            retry = self._retry_topic()
            if retry not in self.subscriptions:
                self.subscriptions[retry] = parse_subscription(retry, "*")
        self._wants_context = self.listener is not None and _wants_context(self.listener)
        # Read at start, as the rest of the config: one timeout for every call while running.
        self._call_deadlines.timeout_s = self.config.consume_timeout_ms / 1000
        nursery.start_soon(self._call_deadlines.run)
        if self.orderly and self.message_model is MessageModel.CLUSTERING:
            nursery.start_soon(self._lock_renew_loop)

    # -- concurrent ---------------------------------------------------------------
    def _consumes_caught_up(self) -> bool:
        return not self.orderly

    def _has_room(self) -> bool:
        """Room for one more consumer: the workers (busy or not) and the listeners running
        in pull tasks never exceed `consume_concurrency`."""
        return self._workers + self._in_pull_tasks < self.config.consume_concurrency

    def _add_worker(self) -> None:
        assert self._nursery is not None
        self._workers += 1
        self._nursery.start_soon(self._worker)

    def _consume_here(self, msgs: list[MessageExt]) -> bool:
        # One listener call, and room for it.
        return len(msgs) <= self.config.consume_message_batch_max_size and self._has_room()

    async def _consume_caught_up(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]
    ) -> None:
        self._task_started()
        self._in_pull_tasks += 1
        try:
            await self._consume(mq, pq, msgs)
        finally:
            self._in_pull_tasks -= 1
            # Batches queued while this listener held the last slot get a worker now.
            if self._work_send.statistics().current_buffer_used and self._has_room():
                self._add_worker()

    async def _deliver(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], caught_up: bool
    ) -> None:
        if self.orderly:
            oq = self._orderly.get(mq)
            if oq is not None:
                oq.wakeup.set()
            return
        n = self.config.consume_message_batch_max_size
        # The first batch goes to a parked worker if there is one.
        picked = trio.Event() if caught_up and self._idle_workers else None
        for i in range(0, len(msgs), n):
            self._task_started()
            self._submit(mq, pq, msgs[i : i + n], None if i else picked)
        if picked is not None:
            # Caught up, and a parked worker takes the (first) batch: let it run the listener
            # before this pull loop sends its next pull, which would otherwise go first. That
            # pull is likely to be held anyway; with a backlog the next pull goes at once.
            await picked.wait()

    def _submit(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], picked: trio.Event | None
    ) -> None:
        """Hand a batch (counted by `_task_started`) to an idle worker, to a new one while
        the workers and the listeners running in pull tasks are fewer than
        `consume_concurrency`, else to the queue the workers take from."""
        if self._idle_workers:
            self._idle_workers -= 1  # the parked worker that the channel hands it to
        elif self._has_room():
            self._add_worker()
        self._work_send.send_nowait((mq, pq, msgs, picked))

    async def _worker(self) -> None:
        receive = self._work_receive
        while True:
            try:
                mq, pq, msgs, picked = receive.receive_nowait()
            except trio.WouldBlock:
                self._idle_workers += 1
                mq, pq, msgs, picked = await receive.receive()
            if picked is not None:
                picked.set()
            await self._consume(mq, pq, msgs)

    def _task_started(self) -> None:
        if self._inflight == 0:
            self._idle = trio.Event()
        self._inflight += 1

    def _task_done(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    def _restore_topic(self, mq: MessageQueue, msgs: list[MessageExt]) -> None:
        """Retried messages come from %RETRY%<group>: show them under their real topic.

        Only a batch pulled from the retry topic can hold such messages, so other batches
        skip the per-message check (and never parse properties for it).
        """
        retry = self._retry_topic()
        if mq.topic == retry:
            for m in msgs:
                if m.topic == retry:  # not yet restored (a local retry keeps the real one)
                    real = m.properties.get(PROPERTY_RETRY_TOPIC)
                    if real:
                        m.topic = real
        now = str(int(time.time() * 1000))
        put_properties_lazily(msgs, ((PROPERTY_CONSUME_START_TIMESTAMP, now),))

    async def _call_listener(
        self,
        mq: MessageQueue,
        msgs: list[MessageExt],
        ctx: ConsumeConcurrentlyContext,
        outcome: list[ConsumeReturnType] | None = None,
    ) -> ConsumeStatus:
        """The listener's status for `msgs`; `outcome` (when given) gets how the call ended
        (RocketMQ's ConsumeReturnType, for the trace)."""
        assert self.listener is not None
        deadlines = self._call_deadlines
        scope = deadlines.open()  # not `trio.move_on_after`: see client/consumer/_deadlines.py
        try:
            with scope:
                if self._wants_context:
                    status = await self.listener(msgs, ctx)
                else:
                    status = await self.listener(msgs)
        except Exception as exc:
            log.warning("listener_failed", group=self.group, mq=str(mq), error=repr(exc))
            if outcome is not None:
                outcome.append(ConsumeReturnType.EXCEPTION)
            return ConsumeStatus.RECONSUME_LATER
        finally:
            deadlines.close(scope)
        if scope.cancelled_caught:
            log.warning(
                "consume_timeout", group=self.group, mq=str(mq), timeout_s=deadlines.timeout_s
            )
            if outcome is not None:
                outcome.append(ConsumeReturnType.TIME_OUT)
            return ConsumeStatus.RECONSUME_LATER
        result = ConsumeStatus.CONSUME_SUCCESS if status is None else status
        if outcome is not None:
            outcome.append(
                ConsumeReturnType.SUCCESS
                if result is ConsumeStatus.CONSUME_SUCCESS
                else ConsumeReturnType.FAILED
            )
        return result

    async def _consume(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        try:
            if pq.dropped:
                return
            self._restore_topic(mq, msgs)
            ctx = ConsumeConcurrentlyContext(mq)
            began = time.monotonic()
            if self._tracer is None:
                status = await self._call_listener(mq, msgs, ctx)
            else:
                before = self._trace_before(msgs)
                outcome: list[ConsumeReturnType] = []
                status = await self._call_listener(mq, msgs, ctx, outcome)
                ok = status is ConsumeStatus.CONSUME_SUCCESS
                self._trace_after(before, len(msgs), ok, outcome[0])
            if status is ConsumeStatus.CONSUME_SUCCESS:
                ok_upto = min(max(ctx.ack_index, -1), len(msgs) - 1) + 1
            else:
                ok_upto = 0
            self.consumed_ok += ok_upto
            failed = msgs[ok_upto:]
            self.consumed_failed += len(failed)
            self.stats.consumed(mq.topic, (time.monotonic() - began) * 1000, ok_upto, len(failed))
            retry_locally: list[MessageExt] = []
            if failed and self.message_model is MessageModel.BROADCASTING:
                for m in failed:
                    log.warning(
                        "broadcast_consume_failed_dropped", group=self.group, msg_id=m.msg_id
                    )
            elif failed:
                level = ctx.delay_level_when_next_consume
                for m in failed:
                    if not await self.send_message_back(m, level):
                        retry_locally.append(m)  # noqa: PERF401 (awaits in the loop)
            done = [m for m in msgs if m not in retry_locally] if retry_locally else msgs
            offset = pq.remove(done)
            if offset >= 0 and not pq.dropped:
                self.offset_store.update(mq, offset, increase_only=True)
            if retry_locally:
                # Its own task: the worker must not wait the 5 s.
                assert self._nursery is not None
                self._task_started()
                self._nursery.start_soon(self._consume_later, mq, pq, retry_locally)
        finally:
            self._task_done()

    async def consume_message_directly(self, msg: MessageExt, broker_name: str) -> dict[str, Any]:
        """CONSUME_MESSAGE_DIRECTLY (309: `mqadmin queryMsgByUniqueKey -g -d`): the listener
        consumes `msg` once, outside the queues: no offset moves, and a failure is neither
        retried nor sent back. Returns RocketMQ's ConsumeMessageDirectlyResult; a listener
        that returns None succeeded, as in consumption."""
        msg.broker_name = broker_name
        mq = MessageQueue(msg.topic, broker_name, msg.queue_id)
        self._restore_topic(mq, [msg])
        result: dict[str, Any] = {"order": self.orderly, "autoCommit": True, "remark": None}
        deadlines = self._call_deadlines
        began = trio.current_time()
        scope = deadlines.open()
        try:
            with scope:
                if self.orderly_listener is not None:
                    orderly = await self.orderly_listener([msg], ConsumeOrderlyContext(mq))
                    ok = orderly in (None, ConsumeOrderlyStatus.SUCCESS)
                else:
                    assert self.listener is not None
                    ctx = ConsumeConcurrentlyContext(mq)
                    if self._wants_context:
                        status = await self.listener([msg], ctx)
                    else:
                        status = await self.listener([msg])
                    ok = status in (None, ConsumeStatus.CONSUME_SUCCESS)
                result["consumeResult"] = "CR_SUCCESS" if ok else "CR_LATER"
        except Exception as exc:
            result["consumeResult"] = "CR_THROW_EXCEPTION"
            result["remark"] = repr(exc)
        finally:
            deadlines.close(scope)
        if scope.cancelled_caught:
            result["consumeResult"] = "CR_THROW_EXCEPTION"
            result["remark"] = f"consume timeout: the listener ran past {deadlines.timeout_s}s"
        result["spentTimeMills"] = int((trio.current_time() - began) * 1000)
        log.info(
            "consumed_directly",
            group=self.group,
            msg_id=msg.msg_id,
            result=result["consumeResult"],
        )
        return result

    async def send_message_back(self, msg: MessageExt, delay_level: int) -> bool:
        """Hand a failed message to the broker's retry machinery (RocketMQ's order).

        CONSUMER_SEND_MSG_BACK first; if that fails, a re-send of a copy to
        `%RETRY%<group>` through the instance's inner producer. Returns False when both
        failed (the caller then retries locally).
        """
        max_times = self.max_reconsume_times()
        try:
            addr = await self.instance.find_master_addr(msg.broker_name, msg.topic)
            await self.instance.api.consumer_send_msg_back(
                addr,
                msg,
                self.group,
                delay_level,
                max_reconsume_times=max_times,
                timeout_ms=self.config.mq_client_api_timeout_ms,
            )
            self.sent_back += 1
            return True
        except Exception as exc:
            log.warning("send_back_failed", group=self.group, msg_id=msg.msg_id, error=str(exc))
        copy = Message(self._retry_topic(), msg.body, flag=msg.flag)
        copy.properties.update(msg.properties)
        copy.properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, msg.msg_id)
        copy.properties[PROPERTY_RETRY_TOPIC] = msg.topic
        copy.properties[PROPERTY_RECONSUME_TIME] = str(msg.reconsume_times + 1)
        copy.properties[PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        copy.properties[PROPERTY_DELAY_TIME_LEVEL] = str(3 + msg.reconsume_times)
        try:
            producer = await self.instance.inner_producer()
            await producer.send(copy)
            self.sent_back += 1
            return True
        except Exception as exc:
            log.warning("retry_resend_failed", group=self.group, msg_id=msg.msg_id, error=str(exc))
            return False

    async def _consume_later(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]
    ) -> None:
        """Neither send-back path worked: offer the batch again after 5 s.

        The messages stay in the process queue meanwhile, so the committed offset
        does not pass them.
        """
        try:
            await trio.sleep(LOCAL_RETRY_DELAY_S)
            if pq.dropped or self._closing:
                return
            for m in msgs:
                m.reconsume_times += 1
            self._task_started()
            self._submit(mq, pq, msgs, None)
        finally:
            self._task_done()

    async def _drain(self) -> None:
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            await self._idle.wait()

    # -- orderly: locks ---------------------------------------------------------------
    def _lock_valid(self, oq: _OrderlyQueue) -> bool:
        return oq.locked_at is not None and time.monotonic() - oq.locked_at < LOCK_MAX_LIVE_S

    async def _lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ per broker; returns the queues now held by this client."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        held: set[MessageQueue] = set()
        for name, group in by_broker.items():
            try:
                addr = await self.instance.find_master_addr(name, group[0].topic)
                held |= await self.instance.api.lock_batch_mq(
                    addr, self.group, self.instance.client_id, group
                )
            except Exception as exc:
                log.warning("lock_batch_failed", broker=name, error=str(exc))
        return held

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for name, group in by_broker.items():
            try:
                addr = await self.instance.find_master_addr(name, group[0].topic)
                await self.instance.api.unlock_batch_mq(
                    addr, self.group, self.instance.client_id, group
                )
            except Exception as exc:
                log.warning("unlock_batch_failed", broker=name, error=str(exc))

    async def lock_all(self) -> None:
        """Renew the broker locks of every queue we own (every 20 s)."""
        mqs = sorted(self._orderly)
        if not mqs:
            return
        held = await self._lock(mqs)
        now = time.monotonic()
        for mq in mqs:
            oq = self._orderly.get(mq)
            if oq is None:
                continue
            if mq in held:
                oq.locked_at = now
                oq.wakeup.set()
            else:
                log.warning("queue_lock_lost", group=self.group, mq=str(mq))
                oq.locked_at = None

    async def _lock_renew_loop(self) -> None:
        while True:
            await trio.sleep(LOCK_RENEW_INTERVAL_S)
            try:
                await self.lock_all()
            except Exception as exc:
                log.warning("lock_renew_failed", group=self.group, error=str(exc))

    # -- orderly: queues ----------------------------------------------------------------
    async def _add_queue(self, mq: MessageQueue, offset: int | None = None) -> bool:
        if not self.orderly:
            return await super()._add_queue(mq, offset)
        oq = _OrderlyQueue()
        if self.message_model is MessageModel.CLUSTERING:
            if mq not in await self._lock([mq]):
                log.info("queue_lock_refused", group=self.group, mq=str(mq))
                return False
            oq.locked_at = time.monotonic()
        self._orderly[mq] = oq
        if not await super()._add_queue(mq, offset):
            self._orderly.pop(mq, None)
            if oq.locked_at is not None:
                await self._unlock([mq])
            return False
        assert self._nursery is not None
        self._nursery.start_soon(self._orderly_loop, mq, oq)
        return True

    async def _remove_queue(self, mq: MessageQueue) -> None:
        oq = self._orderly.pop(mq, None)
        if oq is None:
            await super()._remove_queue(mq)
            return
        # Let the batch in hand finish, then stop consuming, persist, and only then
        # unlock: the next owner starts exactly where we stopped.
        got = False
        with trio.move_on_after(RELEASE_WAIT_S):
            await oq.consume_lock.acquire()
            got = True
        oq.scope.cancel()
        await super()._remove_queue(mq)
        if got:
            oq.consume_lock.release()
            if oq.locked_at is not None and self.message_model is MessageModel.CLUSTERING:
                await self._unlock([mq])
        else:
            # Still consuming: keep the broker lock until it expires, so nobody else
            # consumes the queue while our listener call is in flight.
            log.warning("queue_released_while_consuming", group=self.group, mq=str(mq))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self.orderly:
            with trio.CancelScope(shield=True):
                self._closing = True
                for mq in sorted(self._orderly):
                    with trio.move_on_after(5):
                        await self._remove_queue(mq)
        return await super().__aexit__(exc_type, exc, tb)

    async def _orderly_loop(self, mq: MessageQueue, oq: _OrderlyQueue) -> None:
        assert self.orderly_listener is not None
        cfg = self.config
        clustering = self.message_model is MessageModel.CLUSTERING
        with oq.scope:
            while True:
                st = self.queues.get(mq)
                if st is None:
                    return
                pq = st.pq
                if pq.is_empty() or (clustering and not self._lock_valid(oq)):
                    oq.wakeup = trio.Event()
                    # Re-check after a bounded wait: lock expiry and pq swaps wake nobody.
                    with trio.move_on_after(1.0):
                        await oq.wakeup.wait()
                    continue
                async with oq.consume_lock:
                    if pq.dropped or (clustering and not self._lock_valid(oq)):
                        continue
                    msgs = pq.take(cfg.consume_message_batch_max_size)
                    self._restore_topic(mq, msgs)
                    ctx = ConsumeOrderlyContext(mq)
                    before = self._trace_before(msgs)
                    began = time.monotonic()
                    status = await self._call_orderly(mq, msgs, ctx)
                    ok = status is ConsumeOrderlyStatus.SUCCESS
                    self.stats.consumed(
                        mq.topic,
                        (time.monotonic() - began) * 1000,
                        len(msgs) if ok else 0,
                        0 if ok else len(msgs),
                    )
                    if before is not None:
                        kind = ConsumeReturnType.SUCCESS if ok else ConsumeReturnType.FAILED
                        self._trace_after(before, len(msgs), ok, kind)
                    if ok:
                        self.consumed_ok += len(msgs)
                        offset = pq.remove(msgs)
                        if offset >= 0 and not pq.dropped:
                            self.offset_store.update(mq, offset, increase_only=True)
                        continue
                    self.consumed_failed += len(msgs)
                    if await self._orderly_give_up(msgs):
                        offset = pq.remove(msgs)
                        if offset >= 0 and not pq.dropped:
                            self.offset_store.update(mq, offset, increase_only=True)
                        continue
                    for m in msgs:
                        m.reconsume_times += 1
                    pause_ms = ctx.suspend_current_queue_time_ms
                    if pause_ms < 0:
                        pause_ms = cfg.suspend_current_queue_time_ms
                await trio.sleep(pause_ms / 1000)

    async def _orderly_give_up(self, msgs: list[MessageExt]) -> bool:
        """Past the max reconsume times the batch goes to the DLQ (send-back, level -1)."""
        limit = self.max_reconsume_times()
        if not any(m.reconsume_times >= limit for m in msgs):
            return False
        if self.message_model is MessageModel.BROADCASTING:
            return True
        for m in msgs:
            m.properties[PROPERTY_RECONSUME_TIME] = str(m.reconsume_times)
            if not await self.send_message_back(m, -1):
                return False
        return True

    async def _call_orderly(
        self, mq: MessageQueue, msgs: list[MessageExt], ctx: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        assert self.orderly_listener is not None
        deadlines = self._call_deadlines
        scope = deadlines.open()
        try:
            with scope:
                status = await self.orderly_listener(msgs, ctx)
        except Exception as exc:
            log.warning("orderly_listener_failed", group=self.group, mq=str(mq), error=repr(exc))
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        finally:
            deadlines.close(scope)
        if scope.cancelled_caught:
            log.warning(
                "consume_timeout", group=self.group, mq=str(mq), timeout_s=deadlines.timeout_s
            )
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS if status is None else status

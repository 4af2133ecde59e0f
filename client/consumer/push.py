"""`PushConsumer`: long-polling pull loops feeding an async listener (DefaultMQPushConsumer)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import Enum

import structlog
import trio

from client.config import ClientConfig
from client.consumer._base import ConsumeFromWhere, ConsumerBase, MessageModel
from client.consumer.process_queue import ProcessQueue
from client.consumer.rebalance import AllocateStrategy
from client.errors import MQClientError
from client.instance import ClientInstance
from client.message import MessageExt, MessageQueue

log = structlog.get_logger()

# Delay before a batch the listener asked to retry is offered again (local retry;
# sending it back to the broker's %RETRY% topic is issue 6).
LOCAL_RETRY_DELAY_S = 1.0
DRAIN_TIMEOUT_S = 10.0


class ConsumeStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


Listener = Callable[[list[MessageExt]], Awaitable[ConsumeStatus]]


class PushConsumer(ConsumerBase):
    """Consumes subscribed topics and calls `listener(msgs)` for each batch.

    Args:
        group: the consumer group.
        config: client options (pull batch size, consume concurrency and
            batch size, flow-control thresholds, intervals...).
        instance: a started ClientInstance to share (default: its own).
        listener: `async (msgs) -> ConsumeStatus`; may also be set with
            `register_listener` before start.
        message_model: CLUSTERING (queues shared by the group, offsets on the
            broker) or BROADCASTING (every consumer gets everything, offsets
            in a local file).
        consume_from_where: where a queue with no stored offset starts.
        consume_timestamp: epoch ms for CONSUME_FROM_TIMESTAMP (default now - 30 min).
        allocate_strategy: rebalance strategy (default averagely).

    Usage::

        consumer = PushConsumer("cg", cfg, listener=handle)
        consumer.subscribe("TopicTest", "TagA || TagB")
        async with consumer:
            await trio.sleep_forever()

    Delivery is at least once: the committed offset of a queue is the smallest
    offset still being consumed, so a crash re-delivers rather than loses.
    """

    def __init__(
        self,
        group: str,
        config: ClientConfig | None = None,
        *,
        instance: ClientInstance | None = None,
        listener: Listener | None = None,
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
        self._limiter = trio.CapacityLimiter(self.config.consume_concurrency)
        self._inflight = 0
        self._idle = trio.Event()
        self._idle.set()
        self.consumed_ok = 0
        self.consumed_failed = 0

    def register_listener(self, listener: Listener) -> None:
        self.listener = listener

    async def _start_extra(self, nursery: trio.Nursery) -> None:
        if self.listener is None:
            raise MQClientError("register a listener before starting the consumer")
        if not self.subscriptions:
            raise MQClientError("subscribe to at least one topic before starting the consumer")

    async def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        assert self._nursery is not None
        n = self.config.consume_message_batch_max_size
        for i in range(0, len(msgs), n):
            self._task_started()
            self._nursery.start_soon(self._consume, mq, pq, msgs[i : i + n])

    def _task_started(self) -> None:
        if self._inflight == 0:
            self._idle = trio.Event()
        self._inflight += 1

    def _task_done(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    async def _consume(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        try:
            async with self._limiter:
                if pq.dropped:
                    return
                assert self.listener is not None
                status: ConsumeStatus | None
                try:
                    status = await self.listener(msgs)
                except Exception as exc:
                    log.warning("listener_failed", group=self.group, mq=str(mq), error=repr(exc))
                    status = ConsumeStatus.RECONSUME_LATER
            if status is None or status is ConsumeStatus.CONSUME_SUCCESS:
                self.consumed_ok += len(msgs)
                offset = pq.remove(msgs)
                if offset >= 0 and not pq.dropped:
                    self.offset_store.update(mq, offset, increase_only=True)
            else:
                self.consumed_failed += len(msgs)
                await self._consume_later(mq, pq, msgs)
        finally:
            self._task_done()

    async def _consume_later(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]
    ) -> None:
        """The listener asked for a retry: offer the batch again after a delay.

        The messages stay in the process queue meanwhile, so the committed
        offset does not pass them. (Issue 6 replaces this with RocketMQ's
        send-back to %RETRY%<group>.)
        """
        await trio.sleep(LOCAL_RETRY_DELAY_S)
        if pq.dropped or self._closing:
            return
        for m in msgs:
            m.reconsume_times += 1
        self._task_started()
        assert self._nursery is not None
        self._nursery.start_soon(self._consume, mq, pq, msgs)

    async def _drain(self) -> None:
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            await self._idle.wait()

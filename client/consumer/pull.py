"""`PullConsumer`: RocketMQ's lite pull consumer (`poll`, `commit`, `seek`).

Background pull loops (one per owned queue) fill a bounded buffer; `poll`
takes from it. Queues come from rebalance (`subscribe`) or are given
(`assign`).
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
import trio

from client.config import ClientConfig
from client.consumer._base import ConsumeFromWhere, ConsumerBase, MessageModel, _QueueState
from client.consumer.offset_store import ReadOffsetType
from client.consumer.process_queue import ProcessQueue
from client.consumer.rebalance import AllocateStrategy
from client.errors import MQClientError
from client.filter import parse_subscription
from client.instance import ClientInstance
from client.message import MessageExt, MessageQueue
from client.trace import ConsumeReturnType

log = structlog.get_logger()

_Batch = tuple[MessageQueue, ProcessQueue, list[MessageExt]]


class PullConsumer(ConsumerBase):
    """Lite pull consumer.

    Args:
        group: the consumer group.
        config: client options (`lite_pull_batch_size`, `lite_pull_poll_timeout_ms`...).
        instance: a started ClientInstance to share.
        auto_commit: commit the offsets of polled messages on every `poll`
            (persisted every 5 s); when False call `commit()`.
        buffer_batches: pulled batches buffered before pull loops wait.

    Usage::

        async with PullConsumer("g", cfg) as c:   # after c.subscribe(...) or c.assign(...)
            msgs = await c.poll(timeout_ms=1000)
    """

    consume_type = "CONSUME_ACTIVELY"

    def __init__(
        self,
        group: str,
        config: ClientConfig | None = None,
        *,
        instance: ClientInstance | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        allocate_strategy: AllocateStrategy | None = None,
        auto_commit: bool = True,
        buffer_batches: int = 64,
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
        self.auto_commit = auto_commit
        self._assigned: set[MessageQueue] | None = None
        self._send, self._recv = trio.open_memory_channel[_Batch](buffer_batches)
        self._polled: dict[MessageQueue, tuple[ProcessQueue, list[MessageExt]]] = {}

    # -- assignment ---------------------------------------------------------------
    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Consume exactly these queues (no rebalance)."""
        self._assigned = set(mqs)
        self.subscriptions = {
            t: self.subscriptions.get(t) or parse_subscription(t, "*")
            for t in {m.topic for m in self._assigned}
        }
        if self._instance is not None and self._instance.running:
            self._instance.rebalance_immediately()

    def assignment(self) -> set[MessageQueue]:
        """The queues this consumer owns now."""
        return set(self.queues)

    async def do_rebalance(self) -> None:
        if self._assigned is None:
            await super().do_rebalance()
            return
        if self._closing or self._nursery is None:
            return
        async with self._rebalance_lock:
            for mq in [m for m in self.queues if m not in self._assigned]:
                await self._remove_queue(mq)
            for mq in sorted(self._assigned - set(self.queues)):
                await self._add_queue(mq)

    def _pull_batch_size(self) -> int:
        return self.config.lite_pull_batch_size

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """All readable queues of a topic."""
        return await self.instance.get_subscribe_queues(topic, refresh=True)

    # -- delivery ---------------------------------------------------------------------
    async def _deliver(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], caught_up: bool
    ) -> None:
        await self._send.send((mq, pq, msgs))

    async def poll(self, timeout_ms: int | None = None) -> list[MessageExt]:
        """The next pulled batch, or [] after `timeout_ms` (default lite_pull_poll_timeout_ms)."""
        wait_s = timeout_ms if timeout_ms is not None else self.config.lite_pull_poll_timeout_ms
        with trio.move_on_after(wait_s / 1000):
            while True:
                mq, pq, msgs = await self._recv.receive()
                if pq.dropped:
                    continue  # stale: the queue was sought, moved or released
                self._after_poll(mq, pq, msgs)
                if self._tracer is not None:
                    # As RocketMQ's lite pull consumer: both records when handed over,
                    # successful (what the application does next is not seen).
                    before = self._trace_before(msgs)
                    self._trace_after(before, len(msgs), True, ConsumeReturnType.SUCCESS)
                return msgs
        return []

    def _after_poll(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if self.auto_commit:
            offset = pq.remove(msgs)
            if offset >= 0:
                self.offset_store.update(mq, offset, increase_only=True)
            return
        prev = self._polled.get(mq)
        if prev is not None and prev[0] is pq:
            prev[1].extend(msgs)
        else:
            self._polled[mq] = (pq, list(msgs))

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Commit what `poll` returned (or the given offsets) and persist to the broker/file."""
        if offsets is None:
            offsets = {}
            for mq, (pq, msgs) in self._polled.items():
                if pq.dropped:
                    continue
                off = pq.remove(msgs)
                if off >= 0:
                    offsets[mq] = off
            self._polled.clear()
        for mq, off in offsets.items():
            self.offset_store.update(mq, off)
        await self.offset_store.persist_all([mq for mq in offsets if mq in self.queues])

    async def committed(self, mq: MessageQueue) -> int:
        """The stored offset of `mq` (-1 when none)."""
        return await self.offset_store.read(mq, ReadOffsetType.READ_FROM_STORE)

    # -- seeking ------------------------------------------------------------------------
    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Restart `mq` at `offset`; buffered messages of the queue are discarded.

        Raises:
            MQClientError: the queue is not owned by this consumer.
        """
        st = self.queues.get(mq)
        if st is None:
            raise MQClientError(f"seek: {mq} is not assigned to this consumer")
        st.pq.dropped = True
        st.scope.cancel()
        self._polled.pop(mq, None)
        fresh = _QueueState(ProcessQueue(), offset, trio.CancelScope())
        self.queues[mq] = fresh
        self.offset_store.update(mq, offset)
        assert self._nursery is not None
        self._nursery.start_soon(self._pull_loop, mq, fresh)

    async def _addr(self, mq: MessageQueue) -> str:
        addr, _ = await self.instance.find_read_addr(mq.broker_name, mq.topic)
        return addr

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        await self.seek(mq, await self.instance.api.get_min_offset(await self._addr(mq), mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        await self.seek(mq, await self.instance.api.get_max_offset(await self._addr(mq), mq))

    async def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms`."""
        return await self.instance.api.search_offset(await self._addr(mq), mq, timestamp_ms)

    async def _drain(self) -> None:
        # Nothing runs user code here: polled messages were committed by poll/commit.
        return None

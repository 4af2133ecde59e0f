"""What push and lite-pull consumers share: subscriptions, rebalance, offsets, pulling.

A consumer owns a table of process queues (one per assigned queue) and one
pull task per queue. Rebalance computes the assignment and calls
`_on_queue_added` / `_on_queue_removed`; subclasses decide what pulled
messages turn into (listener calls, or a buffer for `poll`).
"""

from __future__ import annotations

import json
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from types import TracebackType
from typing import Self

import structlog
import trio

from client._api import PullResult, PullStatus, is_transport_error
from client._util import close_stack
from client.config import ClientConfig
from client.consumer.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    ReadOffsetType,
    RemoteOffsetStore,
)
from client.consumer.process_queue import ProcessQueue
from client.consumer.rebalance import (
    AllocateMessageQueueAveragely,
    AllocateStrategy,
    allocate,
)
from client.consumer.stats import ConsumerStats
from client.errors import ClientClosedError, MQClientError, NoRouteError
from client.filter import (
    EXPRESSION_TYPE_SQL92,
    MessageSelector,
    Subscription,
    parse_subscription,
)
from client.instance import ClientInstance, client_config, open_instance
from client.message import (
    RETRY_GROUP_TOPIC_PREFIX,
    MessageExt,
    MessageQueue,
    check_group,
    check_topic,
    put_properties_lazily,
)
from client.trace import ConsumeReturnType, TraceContext, TraceDispatcher, sub_after, sub_before
from common.message import PROPERTY_MAX_OFFSET, PROPERTY_MIN_OFFSET
from common.pull import PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemoteError
from remoting.protocol import bodies
from remoting.protocol.headers import PullMessageRequestHeader
from remoting.protocol.route import MASTER_ID

log = structlog.get_logger()


class MessageModel(Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(Enum):
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


def parse_consume_timestamp(text: str) -> int:
    """RocketMQ's yyyyMMddHHmmss (local time) to epoch ms."""
    return int(datetime.strptime(text, "%Y%m%d%H%M%S").timestamp() * 1000)


class _BrokerOffsets:
    """`OffsetBackend` over the client instance (broker that masters the queue)."""

    def __init__(self, instance: ClientInstance) -> None:
        self._instance = instance

    async def fetch_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        addr = await self._instance.find_offset_addr(mq.broker_name, mq.topic)
        return await self._instance.api.query_consumer_offset(addr, group, mq)

    async def store_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        addr = await self._instance.find_offset_addr(mq.broker_name, mq.topic)
        await self._instance.api.update_consumer_offset(addr, group, mq, offset)


@dataclass(slots=True)
class _QueueState:
    pq: ProcessQueue
    next_offset: int
    scope: trio.CancelScope


def _dropped(st: _QueueState) -> bool:
    return st.pq.dropped


class _Baton:
    """Which of a queue's two pull tasks pulls (`ConsumerBase._pull_turns`). The holder
    pulls; the other waits in `take` and takes over when the holder keeps a batch to consume
    itself (`hand_over`), then waits in its turn once that batch is consumed."""

    __slots__ = ("_handed", "closed", "held")

    def __init__(self) -> None:
        self.held = False
        self.closed = False
        self._handed: trio.Event | None = None

    async def take(self) -> bool:
        """Until this task holds the baton; False once the queue's pulling has ended."""
        if self.closed:
            return False
        if not self.held:
            self.held = True
            return True
        handed = self._handed = trio.Event()
        await handed.wait()
        return not self.closed

    def hand_over(self) -> bool:
        """Pass the pulling to the task waiting in `take`; False if none waits."""
        handed = self._handed
        if handed is None or self.closed:
            return False
        self._handed = None
        handed.set()
        return True

    def close(self) -> None:
        """The queue's pulling has ended: a waiting task leaves."""
        self.closed = True
        if self._handed is not None:
            self._handed.set()
            self._handed = None


class ConsumerBase:
    """Shared machinery; see PushConsumer and PullConsumer."""

    consume_type = "CONSUME_PASSIVELY"
    # RocketMQ piggybacks the committed offset on pulls (COMMIT_OFFSET flag, when the
    # in-memory offset is > 0). The broker stores it when the pull arrives, never after
    # the long-poll wait, so a pull parked while its queue moves away cannot overwrite
    # the new owner's offset. Offsets also go out with the 5 s persist.
    commit_offset_on_pull = True

    def __init__(
        self,
        group: str,
        config: ClientConfig | None,
        *,
        instance: ClientInstance | None,
        message_model: MessageModel,
        consume_from_where: ConsumeFromWhere,
        consume_timestamp: int | None,
        allocate_strategy: AllocateStrategy | None,
    ) -> None:
        check_group(group)
        self.group = group
        self.config = config or (instance.config if instance else ClientConfig())
        # Local (broadcasting) offsets live under the instance name the user chose, or
        # under "DEFAULT" (as RocketMQ does), so that they survive a restart.
        self._offsets_dir_name = (
            self.config.instance_name
            if "instance_name" in self.config.model_fields_set
            else "DEFAULT"
        )
        self.config, self._share_instance = client_config(self.config, instance)
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        if consume_timestamp is None and self.config.consume_timestamp:
            consume_timestamp = parse_consume_timestamp(self.config.consume_timestamp)
        self.consume_timestamp = consume_timestamp or int((time.time() - 1800) * 1000)
        self.allocate_strategy: AllocateStrategy = (
            allocate_strategy or AllocateMessageQueueAveragely()
        )
        self.subscriptions: dict[str, Subscription] = {}
        self.queues: dict[MessageQueue, _QueueState] = {}
        # Pull and consume figures per topic (the running info's statusTable).
        self.stats = ConsumerStats()
        # Queue -> the broker id its last pull answer suggested (absent: the master).
        self._pull_from: dict[MessageQueue, int] = {}
        self._instance = instance
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._offset_store: OffsetStore | None = None
        self._rebalance_lock = trio.Lock()
        self._closing = False
        # Message trace (`config.enable_trace`, client/trace.py): set while started.
        self._tracer: TraceDispatcher | None = None

    # -- setup ------------------------------------------------------------------
    @property
    def instance(self) -> ClientInstance:
        if self._instance is None or not self._instance.running:
            raise ClientClosedError("consumer is not started (use `async with`)")
        return self._instance

    @property
    def offset_store(self) -> OffsetStore:
        if self._offset_store is None:
            raise ClientClosedError("consumer is not started")
        return self._offset_store

    def subscribe(self, topic: str, expression: str | MessageSelector | None = "*") -> None:
        """Subscribe to `topic` with a tag expression ("*" or "tagA || tagB") or a selector
        (`MessageSelector.by_sql(...)`: filtered by the broker on message properties).

        Raises:
            MessageValidationError: bad topic name.
            ValueError: bad expression.
        """
        check_topic(topic)
        self.subscriptions[topic] = parse_subscription(topic, expression)
        if self._instance is not None and self._instance.running:
            self._instance.rebalance_immediately()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        if self._instance is not None and self._instance.running:
            self._instance.rebalance_immediately()

    def _retry_topic(self) -> str:
        return RETRY_GROUP_TOPIC_PREFIX + self.group

    def subscribed_topics(self) -> set[str]:
        return set(self.subscriptions)

    def consumer_data(self) -> bodies.ConsumerData:
        subs = [
            bodies.SubscriptionData(
                topic=s.topic,
                sub_string=s.sub_string,
                tags_set=list(s.tags_set),
                code_set=list(s.code_set),
                sub_version=s.sub_version,
                expression_type=s.expression_type,
            )
            for s in self.subscriptions.values()
        ]
        return bodies.ConsumerData(
            group_name=self.group,
            consume_type=self.consume_type,
            message_model=self.message_model.value,
            consume_from_where=self.consume_from_where.value,
            subscription_data_set=subs,
        )

    async def __aenter__(self) -> Self:
        try:
            if self._instance is None:
                self._instance = await self._stack.enter_async_context(
                    open_instance(self.config, shared=self._share_instance)
                )
            if self.message_model is MessageModel.BROADCASTING:
                self._offset_store = LocalFileOffsetStore(
                    self.config.offset_store_dir, self._offsets_dir_name, self.group
                )
            else:
                self._offset_store = RemoteOffsetStore(self.group, _BrokerOffsets(self._instance))
            await self._offset_store.load()
            if self.config.enable_trace:
                # Entered before the nursery: `__aexit__` cancels the nursery first, and the
                # dispatcher's own tasks must still write what is queued after that.
                self._tracer = await self._stack.enter_async_context(
                    TraceDispatcher(self._instance, self.config, self.group, "CONSUMER")
                )
            self._nursery = await self._stack.enter_async_context(trio.open_nursery())
            await self._start_extra(self._nursery)
            self._instance.register_consumer(self)
            for topic in list(self.subscriptions):
                try:
                    await self._instance.update_topic_route(topic)
                except Exception as exc:
                    log.warning("route_fetch_failed", topic=topic, error=str(exc))
            await self._check_sql_subscriptions()
            await self._instance.send_heartbeat_to_all_brokers()
            await self.do_rebalance()
        except BaseException:
            if self._instance is not None and self._instance.consumers.get(self.group) is self:
                del self._instance.consumers[self.group]
            if self._nursery is not None:
                # The tasks `_start_extra` started run until cancelled: closing the stack
                # would otherwise wait for them forever.
                self._nursery.cancel_scope.cancel()
                self._nursery = None
            self._tracer = None
            await self._stack.aclose()
            raise
        return self

    async def _check_sql_subscriptions(self) -> None:
        """Ask the brokers of each SQL92-subscribed topic whether they take the expression
        (CHECK_CLIENT_CONFIG, 46), as RocketMQ's `checkClientInBroker` does at start, so a bad
        expression or a broker without `enable_property_filter` fails the start instead of
        every pull. Every broker of the topic is asked (RocketMQ asks one); one that cannot be
        reached is only logged (its pulls will say more).

        Raises:
            MQClientError: a broker refused the subscription (its code and remark).
        """
        instance = self.instance
        for sub in list(self.subscriptions.values()):
            if sub.expression_type != EXPRESSION_TYPE_SQL92:
                continue
            try:
                mqs = await instance.get_subscribe_queues(sub.topic)
            except Exception as exc:
                log.warning("sql_check_no_route", topic=sub.topic, error=str(exc))
                continue
            body = {
                "clientId": instance.client_id,
                "group": self.group,
                "subscriptionData": sub.to_json_dict(),
            }
            payload = json.dumps(body).encode()
            for name in sorted({mq.broker_name for mq in mqs}):
                addr = instance.master_addr(name) or instance.any_addr(name)
                if addr is None:
                    continue
                cmd = RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, None, payload)
                try:
                    resp = await instance.api.transport.invoke(
                        addr, cmd, self.config.mq_client_api_timeout_ms
                    )
                except Exception as exc:
                    log.warning("sql_check_failed", broker=name, addr=addr, error=str(exc))
                    continue
                if resp.code != ResponseCode.SUCCESS:
                    raise MQClientError(
                        f"broker {name} ({addr}) refused the SQL92 subscription of consumer "
                        f"group {self.group} to topic {sub.topic} ({sub.sub_string!r}): "
                        f"CODE {resp.code}: {resp.remark or 'no remark'}"
                    )

    # -- message trace -------------------------------------------------------------------
    def _trace_before(self, msgs: list[MessageExt]) -> TraceContext | None:
        """Write the SubBefore records of a batch about to be consumed (trace on); the
        context to hand to `_trace_after`, or None."""
        tracer = self._tracer
        if tracer is None:
            return None
        try:
            ctx = sub_before(self.group, msgs, tracer.topic)
            if ctx is not None:
                tracer.append(ctx)
            return ctx
        except Exception as exc:  # tracing never stops consumption
            log.warning("trace_sub_failed", group=self.group, error=repr(exc))
            return None

    def _trace_after(
        self,
        before: TraceContext | None,
        batch_size: int,
        success: bool,
        return_type: ConsumeReturnType,
    ) -> None:
        """Write the SubAfter records paired with `_trace_before`'s context."""
        tracer = self._tracer
        if tracer is None or before is None:
            return
        try:
            tracer.append(sub_after(before, batch_size, success, return_type))
        except Exception as exc:
            log.warning("trace_sub_failed", group=self.group, error=repr(exc))

    async def _start_extra(self, nursery: trio.Nursery) -> None:
        """Subclass hook: start tasks that live as long as the consumer."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closing = True
        with trio.CancelScope(shield=True):
            for st in self.queues.values():
                st.scope.cancel()
            await self._drain()
            for st in self.queues.values():
                st.pq.dropped = True
            if self._offset_store is not None:
                try:
                    with trio.move_on_after(5):
                        await self._offset_store.persist_all(list(self.queues))
                except Exception as persist_exc:
                    log.warning("final_offset_persist_failed", error=str(persist_exc))
            if self._instance is not None and self._instance.running:
                with trio.move_on_after(3):
                    await self._instance.unregister_consumer(self.group)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._nursery = None
        self._tracer = None  # the stack sends its queued records and stops it
        return await close_stack(self._stack, exc_type, exc, tb)

    async def _drain(self) -> None:
        """Subclass hook: wait (bounded) for work in flight before the final persist."""

    # -- rebalance -----------------------------------------------------------------
    async def do_rebalance(self) -> None:
        """Recompute this consumer's queues for every subscribed topic."""
        if self._closing or self._nursery is None:
            return
        async with self._rebalance_lock:
            for topic in list(self.subscriptions):
                try:
                    await self._rebalance_topic(topic)
                except NoRouteError:
                    log.warning("rebalance_no_route", topic=topic, group=self.group)
                except Exception as exc:
                    log.warning("rebalance_topic_failed", topic=topic, error=str(exc))
            gone = {mq for mq in self.queues if mq.topic not in self.subscriptions}
            for mq in gone:
                await self._remove_queue(mq)

    async def _rebalance_topic(self, topic: str) -> None:
        mq_all = await self.instance.get_subscribe_queues(topic)
        if self.message_model is MessageModel.BROADCASTING:
            mine = set(mq_all)
        else:
            cids = await self.instance.find_consumer_id_list(topic, self.group)
            if not cids:
                log.warning("rebalance_no_consumer_ids", topic=topic, group=self.group)
                return
            mine = set(
                allocate(self.allocate_strategy, self.group, self.instance.client_id, mq_all, cids)
            )
        changed = False
        for mq in [m for m in self.queues if m.topic == topic and m not in mine]:
            await self._remove_queue(mq)
            changed = True
        for mq in sorted(mine - set(self.queues)):
            if await self._add_queue(mq):
                changed = True
        if changed:
            log.info(
                "rebalance_changed",
                group=self.group,
                topic=topic,
                queues=[f"{q.broker_name}:{q.queue_id}" for q in sorted(mine)],
            )
            await self.instance.send_heartbeat_to_all_brokers()

    async def _remove_queue(self, mq: MessageQueue) -> None:
        st = self.queues.pop(mq, None)
        if st is None:
            return
        self._pull_from.pop(mq, None)
        st.pq.dropped = True
        st.scope.cancel()
        self._on_queue_removed(mq, st.pq)
        try:
            await self.offset_store.persist(mq)
        except Exception as exc:
            log.warning("persist_dropped_queue_failed", mq=str(mq), error=str(exc))
        self.offset_store.remove(mq)

    def _on_queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Subclass hook."""

    async def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """Where to start a newly assigned queue: stored offset, else by consume_from_where.

        Raises:
            MQClientError / RemotingError: the offset could not be determined.
        """
        last = await self.offset_store.read(mq, ReadOffsetType.READ_FROM_STORE)
        if last >= 0:
            return last
        if last != -1:
            raise MQClientError(f"bad stored offset {last} for {mq}")
        is_retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        where = self.consume_from_where
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        addr, _ = await self.instance.find_read_addr(mq.broker_name, mq.topic)
        if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return 0 if is_retry else await self.instance.api.get_max_offset(addr, mq)
        if is_retry:
            return await self.instance.api.get_max_offset(addr, mq)
        return await self.instance.api.search_offset(addr, mq, self.consume_timestamp)

    async def _add_queue(self, mq: MessageQueue, offset: int | None = None) -> bool:
        if offset is None:
            try:
                offset = await self.compute_pull_from_where(mq)
            except Exception as exc:
                log.warning("compute_offset_failed", mq=str(mq), error=str(exc))
                return False
        self.offset_store.update(mq, offset)
        st = _QueueState(ProcessQueue(), offset, trio.CancelScope())
        self.queues[mq] = st
        assert self._nursery is not None
        self._nursery.start_soon(self._pull_loop, mq, st)
        return True

    async def persist_offsets(self) -> None:
        """Persist the offsets of the queues we own (called every 5 s by the instance)."""
        if self._offset_store is not None:
            await self._offset_store.persist_all(list(self.queues))

    async def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Broker-initiated reset: restart the given queues at the given offsets."""
        for mq, off in offsets.items():
            if mq.topic != topic:
                continue
            owned = mq in self.queues
            if owned:
                await self._remove_queue(mq)
            self.offset_store.update(mq, off)
            await self.offset_store.persist(mq)
            if owned:
                await self._add_queue(mq, off)

    # -- pulling ---------------------------------------------------------------------
    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        cfg = self.config
        return (
            pq.msg_count > cfg.pull_threshold_for_queue
            or pq.msg_size > cfg.pull_threshold_size_for_queue_mib * 1024 * 1024
            or pq.max_span() > cfg.consume_concurrently_max_span
        )

    def _pull_batch_size(self) -> int:
        return self.config.pull_batch_size

    async def _pull_once(self, mq: MessageQueue, st: _QueueState) -> PullResult:
        sub = self.subscriptions.get(mq.topic) or parse_subscription(mq.topic, "*")
        commit = -1
        if self.message_model is MessageModel.CLUSTERING and self.commit_offset_on_pull:
            commit = self.offset_store.table().get(mq, -1)
        # The broker the last answer suggested (a slave when the master is behind on
        # reads), else the master; with the master gone from the route, a slave.
        addr, from_slave = await self.instance.find_read_addr(
            mq.broker_name, mq.topic, self._pull_from.get(mq, MASTER_ID)
        )
        # The subscription travels with every pull, so a pull never races the heartbeat.
        flags = PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION
        if commit > 0 and not from_slave:  # a slave would not store it
            flags |= PULL_FLAG_COMMIT_OFFSET
        header = PullMessageRequestHeader(
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=st.next_offset,
            max_msg_nums=self._pull_batch_size(),
            sys_flag=flags,
            commit_offset=max(commit, 0),
            suspend_timeout_millis=self.config.broker_suspend_max_time_ms,
            subscription=sub.sub_string,
            sub_version=sub.sub_version,
            expression_type=sub.expression_type,
        )
        began = time.monotonic()
        result = await self.instance.api.pull_message(
            addr, mq.broker_name, header, self.config.consumer_timeout_when_suspend_ms
        )
        if result.suggest_which_broker_id == MASTER_ID:
            self._pull_from.pop(mq, None)
        else:
            self._pull_from[mq] = result.suggest_which_broker_id
        if result.status is PullStatus.FOUND:
            msgs = result.messages
            if sub.tags_set:  # "*" matches everything: no per-message tag check
                msgs = result.messages = [m for m in msgs if sub.match_tags(m.tags)]
            # Stamped without parsing each message's properties (applied on first read).
            put_properties_lazily(
                msgs,
                (
                    (PROPERTY_MIN_OFFSET, str(result.min_offset)),
                    (PROPERTY_MAX_OFFSET, str(result.max_offset)),
                ),
            )
            self.stats.pulled(mq.topic, (time.monotonic() - began) * 1000, len(msgs))
        return result

    def _consumes_caught_up(self) -> bool:
        """Subclass hook: whether a queue's pull task may consume a caught-up batch itself
        (`_consume_here`); the queue then runs two pull tasks that take turns."""
        return False

    def _consume_here(self, msgs: list[MessageExt]) -> bool:
        """Subclass hook: whether to consume this caught-up batch in the pull task."""
        return False

    async def _consume_caught_up(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]
    ) -> None:
        """Subclass hook: consume a batch in the pull task that received it."""
        raise NotImplementedError

    async def _pull_loop(self, mq: MessageQueue, st: _QueueState) -> None:
        with st.scope:
            if not self._consumes_caught_up():
                await self._pull_turns(mq, st, None)
                return
            # Two tasks take turns pulling: one that receives a caught-up batch consumes it
            # at once, and the other sends the next pull meanwhile. The listener runs
            # without waiting for a worker to be scheduled, and a listener that waits does
            # not hold up the queue's pulling.
            baton = _Baton()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pull_turns, mq, st, baton)
                nursery.start_soon(self._pull_turns, mq, st, baton)

    async def _pull_turns(self, mq: MessageQueue, st: _QueueState, baton: _Baton | None) -> None:
        if baton is not None and not await baton.take():
            return
        try:
            await self._pull_while_held(mq, st, baton)
        finally:
            if baton is not None:
                baton.close()

    async def _pull_while_held(
        self, mq: MessageQueue, st: _QueueState, baton: _Baton | None
    ) -> None:
        cfg = self.config
        while not st.pq.dropped:
            if self._flow_controlled(st.pq):
                await trio.sleep(cfg.pull_time_delay_when_flow_control_ms / 1000)
                continue
            try:
                result = await self._pull_once(mq, st)
            except RemoteError as exc:
                delay = 0.02 if exc.code == ResponseCode.FLOW_CONTROL else None
                log.warning("pull_failed", mq=str(mq), code=exc.code, remark=exc.remark)
                await trio.sleep(delay or cfg.pull_time_delay_when_exception_ms / 1000)
                continue
            except Exception as exc:
                log.warning(
                    "pull_failed",
                    mq=str(mq),
                    error=str(exc) or type(exc).__name__,
                    transport=is_transport_error(exc),
                )
                await trio.sleep(cfg.pull_time_delay_when_exception_ms / 1000)
                continue
            st.pq.last_pull_timestamp = time.monotonic()
            if _dropped(st):  # rebalance may have taken the queue meanwhile
                return
            if result.status is PullStatus.FOUND:
                st.next_offset = result.next_begin_offset
                if result.messages:
                    pq = st.pq
                    msgs = result.messages
                    pq.put_messages(msgs)
                    # Caught up: the next pull will be held until something arrives.
                    caught_up = result.next_begin_offset >= result.max_offset
                    if (
                        caught_up
                        and baton is not None
                        and self._consume_here(msgs)
                        and baton.hand_over()
                    ):
                        await self._consume_caught_up(mq, pq, msgs)
                        if not await baton.take():
                            return
                        continue
                    await self._deliver(mq, pq, msgs, caught_up)
                elif st.pq.is_empty():
                    self.offset_store.update(mq, st.next_offset, increase_only=True)
            elif result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                st.next_offset = result.next_begin_offset
                if st.pq.is_empty():
                    self.offset_store.update(mq, st.next_offset, increase_only=True)
            else:  # OFFSET_ILLEGAL
                log.warning(
                    "pull_offset_moved",
                    mq=str(mq),
                    requested=st.next_offset,
                    next=result.next_begin_offset,
                )
                self._on_offset_moved(mq, st.pq)
                st.pq.dropped = True
                fresh = ProcessQueue()
                st.pq = fresh
                st.next_offset = result.next_begin_offset
                self.offset_store.update(mq, result.next_begin_offset)
                try:
                    await self.offset_store.persist(mq)
                except Exception as exc:
                    log.warning("persist_failed", mq=str(mq), error=str(exc))

    def _on_offset_moved(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Subclass hook: the queue's cached messages are void."""

    async def _deliver(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], caught_up: bool
    ) -> None:
        """Subclass hook: hand pulled (and tag-checked) messages on. `caught_up`: they were
        the last in the queue when pulled (the next pull is likely to be held)."""
        raise NotImplementedError

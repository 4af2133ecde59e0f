"""`Producer`: validated, compressed, fault-tolerant sends (RocketMQ's DefaultMQProducer)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import structlog
import trio

from client._api import is_retryable_broker_error, is_transport_error, send_request, send_result
from client._util import close_stack
from client.config import ClientConfig
from client.errors import ClientClosedError, MessageValidationError, SendFailedError
from client.fault import FaultStrategy
from client.instance import ClientInstance, client_config, open_instance
from client.message import (
    DEFAULT_TOPIC,
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
    SendStatus,
    check_group,
    check_topic,
    encode_batch_chunks,
    validate_message,
)
from client.request_reply import (
    REPLY_MESSAGE_FLAG,
    RequestCallback,
    RequestFuture,
    request,
    request_async,
)
from client.route import TopicPublishInfo
from client.trace import DEFAULT_REGION, TraceDispatcher, end_transaction_context, pub_contexts
from common.message import (
    COMPRESSED_FLAG,
    COMPRESSION_ZLIB,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_MESSAGE_TYPE,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    TRANSACTION_PREPARED_TYPE,
    BatchItem,
    UniqKeyGenerator,
    decode_properties,
    encode_batch_body,
    encode_properties,
    java_string_hash,
)
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemotingTimeoutError
from remoting.protocol.headers import SendMessageRequestHeader, send_request_fields_v2

log = structlog.get_logger()

DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
# Per-message overhead of a batch body item besides body and properties.
BATCH_ITEM_OVERHEAD = 4 * 5 + 2
# Bounds of the producer's per-topic and per-queue caches (cleared when full).
_MAX_CACHED_TOPICS = 1024
_MAX_CACHED_QUEUES = 4096

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


@dataclass(slots=True)
class _Send:
    """One send's data, prepared once and read by every attempt."""

    topic: str
    body: bytes
    sys_flag: int
    flag: int
    properties: str
    msg_id: str
    batch: bool
    timeout_s: float
    fixed: Callable[[TopicPublishInfo], MessageQueue] | None
    retries: int
    answer: dict[str, str] | None = None  # the SEND_OK-family answer's extFields (trace)
    reply: bool = False  # a reply (MSG_TYPE=reply): sent with SEND_REPLY_MESSAGE_V2


SendCallback = Callable[[SendResult | None, BaseException | None], None]


def select_by_hash(mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """RocketMQ's SelectMessageQueueByHash: same key, same queue."""
    h = java_string_hash(arg) if isinstance(arg, str) else hash(arg)
    value = h % len(mqs) if h >= 0 else abs(int(h) % -len(mqs))
    return mqs[value]


class SendFuture:
    """The result of `send_async`: `await fut` returns the SendResult or raises."""

    __slots__ = ("_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = trio.Event()
        self._result: SendResult | None = None
        self._error: BaseException | None = None

    def _set(self, result: SendResult | None, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def result(self) -> SendResult:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def __await__(self) -> Generator[Any, None, SendResult]:
        return self.result().__await__()


class Producer:
    """Sends messages to a trimq (or RocketMQ 4.x) cluster.

    Args:
        group: the producer group.
        config: client options (NameServer address, timeouts, retries...).
        instance: a started ClientInstance to share; by default the producer
            starts its own.

    Usage::

        async with Producer("pg", ClientConfig(namesrv_addr="127.0.0.1:9876")) as p:
            result = await p.send(Message("TopicTest", b"hello", tags="TagA"))
    """

    def __init__(
        self,
        group: str = DEFAULT_PRODUCER_GROUP,
        config: ClientConfig | None = None,
        *,
        instance: ClientInstance | None = None,
    ) -> None:
        check_group(group)
        self.group = group
        self.config = config or (instance.config if instance else ClientConfig())
        self.config, self._share_instance = client_config(self.config, instance)
        self._instance = instance
        self._owns_instance = instance is None
        self.fault = FaultStrategy(
            self.config.send_latency_fault_enable,
            latency_max_ms=self.config.latency_max_ms,
            not_available_duration_ms=self.config.not_available_duration_ms,
        )
        self._uniq = UniqKeyGenerator(self._uniq_ip())
        # The send header's per-producer fields, read once (the config is not changed later).
        self._default_topic = self.config.create_topic_key
        self._default_queue_nums = str(self.config.default_topic_queue_nums)
        # Topics that passed the send checks (`validate_message`'s topic part depends on the
        # name only), and per queue the SEND_MESSAGE_V2 extFields with the per-send values
        # at their defaults (single sends, batches): both bounded, see `_MAX_CACHED_*`.
        self._send_topics: set[str] = set()
        self._templates: tuple[dict[MessageQueue, dict[str, str]], ...] = ({}, {})
        # trio's clock: the started producer's run's clock read directly (one call instead
        # of `trio.current_time`'s three), else `trio.current_time`.
        self._now: Callable[[], float] = trio.current_time
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._pending_async = 0
        self._idle = trio.Event()
        self._idle.set()
        # Message trace (`config.enable_trace`, client/trace.py): set while started.
        self._tracer: TraceDispatcher | None = None

    def _uniq_ip(self) -> str | None:
        ip = self.config.client_ip
        return ip if ip and ":" not in ip else None

    @property
    def instance(self) -> ClientInstance:
        if self._instance is None or not self._instance.running:
            raise ClientClosedError("producer is not started (use `async with Producer(...)`)")
        return self._instance

    # -- lifecycle ----------------------------------------------------------------
    async def __aenter__(self) -> Self:
        try:
            if self._instance is None:
                self._instance = await self._stack.enter_async_context(
                    open_instance(self.config, shared=self._share_instance)
                )
            self._instance.register_producer(self.group, self)
            if self.config.enable_trace:
                # Entered before the nursery: `__aexit__` cancels the nursery first, and the
                # dispatcher's own tasks must still write what is queued after that.
                self._tracer = await self._stack.enter_async_context(
                    TraceDispatcher(self._instance, self.config, self.group, "PRODUCER")
                )
            self._nursery = await self._stack.enter_async_context(trio.open_nursery())
            self._now = trio.lowlevel.current_clock().current_time
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        # Let async sends in flight finish (bounded by the send timeout).
        with trio.move_on_after(self.config.send_timeout_ms / 1000 + 1) as scope:
            scope.shield = True
            await self._idle.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        # Requests still waiting for replies end now (ClientClosedError).
        if self._instance is not None:
            self._instance.requests.cancel_owner(self, f"producer {self.group} closed")
        if self._instance is not None and self._instance.running:
            with trio.CancelScope(shield=True):
                await self._instance.unregister_producer(self.group)
        self._nursery = None
        self._now = trio.current_time
        self._tracer = None  # the stack sends its queued records and stops it
        return await close_stack(self._stack, exc_type, exc, tb)

    # -- preparing ----------------------------------------------------------------
    def _prepare(self, msg: Message) -> tuple[bytes, int, str, str]:
        """Validate `msg`, give it a UNIQ_KEY if it has none, compress a big body.

        Returns:
            ``(body to send, sys_flag, properties string, UNIQ_KEY)``.

        Raises:
            MessageValidationError: see `validate_message`.
        """
        topic = msg.topic
        body = msg.body
        props = msg.properties
        max_size = self.config.max_message_size
        if topic not in self._send_topics:
            validate_message(msg, max_size)
            # The topic checks depend on the name only: once per topic (bounded).
            if len(self._send_topics) >= _MAX_CACHED_TOPICS:
                self._send_topics.clear()
            self._send_topics.add(topic)
        elif not body or len(body) > max_size or PROPERTY_DELAY_TIME_LEVEL in props:
            validate_message(msg, max_size)  # the reference checks (and their errors)
        uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if not uniq:
            uniq = self._uniq.next()
            props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        sys_flag = 0
        compress_over = self.config.compress_over
        if len(body) >= compress_over > 0:
            compressed = zlib.compress(body, self.config.compress_level)
            if len(compressed) < len(body):
                body = compressed
                sys_flag = COMPRESSED_FLAG | COMPRESSION_ZLIB
        if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
            sys_flag |= TRANSACTION_PREPARED_TYPE
        return body, sys_flag, encode_properties(props), uniq

    def _header(
        self,
        topic: str,
        mq: MessageQueue,
        sys_flag: int,
        flag: int,
        properties: str,
        batch: bool = False,
    ) -> SendMessageRequestHeader:
        reconsume_times, max_reconsume_times = 0, None
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # A consumer's fallback re-send: the broker routes it by these (retry or DLQ).
            props = decode_properties(properties)
            reconsume_times = int(props.get(PROPERTY_RECONSUME_TIME) or 0)
            max_text = props.get(PROPERTY_MAX_RECONSUME_TIMES)
            max_reconsume_times = int(max_text) if max_text else None
        return SendMessageRequestHeader(
            producer_group=self.group,
            topic=topic,
            default_topic=self.config.create_topic_key,
            default_topic_queue_nums=self.config.default_topic_queue_nums,
            queue_id=mq.queue_id,
            sys_flag=sys_flag,
            born_timestamp=int(time.time() * 1000),
            flag=flag,
            properties=properties,
            reconsume_times=reconsume_times,
            unit_mode=False,
            max_reconsume_times=max_reconsume_times,
            batch=batch,
            broker_name=mq.broker_name,
        )

    def _fields(
        self,
        topic: str,
        mq: MessageQueue,
        sys_flag: int,
        flag: int,
        properties: str,
        batch: bool = False,
    ) -> dict[str, str]:
        """The SEND_MESSAGE_V2 extFields: `_header(...).to_fields_v2()`, built directly
        unless the topic is a retry topic (which carries the reconsume fields).

        A copy of the queue's template (`send_request_fields_v2` with the per-send values
        at 0 / empty) with the born timestamp, properties, and sys flag and flag when not 0,
        set in place: same keys in the same order, same values.
        """
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return self._header(topic, mq, sys_flag, flag, properties, batch).to_fields_v2()
        templates = self._templates[batch]
        template = templates.get(mq)
        if template is None or mq.topic != topic:
            if mq.topic != topic:  # a selector's queue of another topic: not cached
                return send_request_fields_v2(
                    self.group,
                    topic,
                    self._default_topic,
                    self._default_queue_nums,
                    mq.queue_id,
                    sys_flag,
                    int(time.time() * 1000),
                    flag,
                    properties,
                    mq.broker_name,
                    batch,
                )
            if len(templates) >= _MAX_CACHED_QUEUES:
                templates.clear()
            template = templates[mq] = send_request_fields_v2(
                self.group,
                topic,
                self._default_topic,
                self._default_queue_nums,
                mq.queue_id,
                0,
                0,
                0,
                "",
                mq.broker_name,
                batch,
            )
        fields = template.copy()
        if sys_flag:
            fields["f"] = str(sys_flag)
        fields["g"] = str(int(time.time() * 1000))
        if flag:
            fields["h"] = str(flag)
        fields["i"] = properties
        return fields

    # -- the send loop --------------------------------------------------------------
    def _send_with_retries(self, req: _Send) -> Coroutine[Any, Any, SendResult]:
        """The send (a coroutine to await): attempts with retries within the send timeout.

        With the route cached every wait in `_attempts` is bounded by the remaining time
        already (the request's own timeout, route refreshes in a `move_on_at`), so no cancel
        scope is entered per send; a first send of a topic looks the route up under one.
        """
        instance = self._instance
        if instance is None or not instance.running:
            raise ClientClosedError("producer is not started (use `async with Producer(...)`)")
        info = instance.publish_info.get(req.topic)
        if info is not None and info.queues:
            return self._attempts(instance, info, req)
        return self._bounded_attempts(instance, req)

    async def _bounded_attempts(self, instance: ClientInstance, req: _Send) -> SendResult:
        """`_attempts` under a cancel scope of the whole send timeout (route not cached: the
        route lookup itself may wait)."""
        with trio.move_on_after(req.timeout_s):
            return await self._attempts(instance, None, req)
        raise RemotingTimeoutError(
            f"sendDefaultImpl call timeout: {req.timeout_s * 1000:.0f} ms for topic {req.topic}"
        )

    async def _attempts(
        self, instance: ClientInstance, info: TopicPublishInfo | None, req: _Send
    ) -> SendResult:
        """Up to `1 + req.retries` attempts (one with a fixed queue) within `req.timeout_s`.

        `info` is the cached route when the caller found one (then no await happens before
        the first attempt, and its start time is the deadline's base).
        """
        current_time = self._now
        fault = self.fault
        topic = req.topic
        start = current_time()
        deadline = start + req.timeout_s
        begin: float | None = start
        if info is None:
            info = await instance.get_publish_info(topic)
            begin = None
        fixed = req.fixed
        attempts = 1 if fixed is not None else 1 + req.retries
        transport = instance.api.transport
        last_failed: str | None = None
        last_error: BaseException | None = None
        not_stored: SendResult | None = None
        retry_not_stored = self.config.retry_another_broker_when_not_store_ok
        for attempt in range(attempts):
            if begin is None:
                begin = current_time()
            remaining = deadline - begin
            if remaining <= 0:
                break
            mq = fixed(info) if fixed is not None else info.select_with_fault(fault, last_failed)
            try:
                addr = await instance.find_master_addr(mq.broker_name, topic)
                cmd = send_request(
                    self._fields(topic, mq, req.sys_flag, req.flag, req.properties, req.batch),
                    req.body,
                    req.batch,
                )
                if req.reply:
                    cmd.code = RequestCode.SEND_REPLY_MESSAGE_V2
                resp = await transport.invoke(addr, cmd, max(1, int(remaining * 1000)))
                result = send_result(resp, mq, req.msg_id)
                req.answer = resp.ext_fields
            except BaseException as exc:
                self._record_failure(
                    exc, topic, mq.broker_name, (current_time() - begin) * 1000, attempt
                )
                begin = None
                last_error = exc
                last_failed = mq.broker_name
                info = await self._refresh_route(instance, info, topic, exc, deadline)
                continue
            if fault.enabled:
                fault.update_fault_item(mq.broker_name, (current_time() - begin) * 1000, False)
            if retry_not_stored and result.status is not SendStatus.SEND_OK:
                # Stored, but not as asked (no slave in sync, flush or slave timeout): try
                # another broker, as RocketMQ's retryAnotherBrokerWhenNotStoreOK.
                log.info("send_not_stored_ok", topic=topic, broker=mq.broker_name,
                         status=result.status.value, attempt=attempt + 1)  # fmt: skip
                not_stored = result
                last_failed = mq.broker_name
                begin = None
                continue
            return result
        if not_stored is not None:
            return not_stored  # every attempt was answered, none SEND_OK: the last answer
        if last_error is None:
            raise RemotingTimeoutError(
                f"sendDefaultImpl call timeout: {req.timeout_s * 1000:.0f} ms for topic {topic}"
            )
        raise SendFailedError(
            f"Send [{attempts}] times, still failed, topic {topic}: {last_error}"
        ) from last_error

    def _record_failure(
        self, exc: BaseException, topic: str, broker: str, elapsed_ms: float, attempt: int
    ) -> None:
        """Charge `broker` for a failed attempt (number `attempt`, from 0); raise `exc` again
        unless another attempt may follow (a retryable error).

        A cut-off attempt (not an Exception: the total send timeout's cancel scope, the
        caller's scope) is charged like a timeout before the cancellation goes on, or the
        next send picks this broker again. Bookkeeping only, no await.
        """
        fault = self.fault
        if not isinstance(exc, Exception):
            fault.update_fault_item(broker, elapsed_ms, isolation=True)
            log.warning(
                "send_cut_off",
                topic=topic,
                broker=broker,
                attempt=attempt + 1,
                elapsed_ms=round(elapsed_ms),
            )
            raise exc
        retryable = is_transport_error(exc) or is_retryable_broker_error(exc)
        fault.update_fault_item(broker, elapsed_ms, isolation=retryable)
        log.warning("send_failed", topic=topic, broker=broker, attempt=attempt + 1, error=str(exc))
        if not retryable:
            raise exc

    async def _refresh_route(
        self,
        instance: ClientInstance,
        info: TopicPublishInfo,
        topic: str,
        exc: BaseException,
        deadline: float,
    ) -> TopicPublishInfo:
        """After a retryable failure: the topic's route again when it may have changed
        (broker gone, topic created, a master turned slave or not given a role yet), within
        `deadline`; else `info`."""
        if is_transport_error(exc) or getattr(exc, "code", None) in (
            ResponseCode.TOPIC_NOT_EXIST,
            ResponseCode.SERVICE_NOT_AVAILABLE,
        ):
            try:
                with trio.move_on_at(deadline):
                    await instance.update_topic_route(topic)
                info = instance.publish_info.get(topic, info)
            except Exception as route_exc:
                log.debug("route_refresh_failed", topic=topic, error=str(route_exc))
        return info

    # -- public API -----------------------------------------------------------------
    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        sharding_key: str | None = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer.

        Args:
            msg: the message.
            queue: send to exactly this queue (no retry elsewhere).
            selector: choose the queue with `selector(queues, msg, arg)`.
            arg: passed to `selector`.
            sharding_key: ordered send: messages with the same key go to the same queue.
            timeout_ms: total time for all attempts (default `send_timeout_ms`).

        Returns:
            The SendResult.

        Raises:
            MessageValidationError: the message breaks a rule (nothing was sent).
            NoRouteError: the topic has no route.
            SendFailedError: every attempt failed; `__cause__` is the last error.
            remoting.RemoteError: the broker refused the message (not retryable).
        """
        req = self._single(msg, timeout_ms, self.config.retry_times_when_send_failed)
        if queue is not None or selector is not None or sharding_key is not None:
            req.fixed = self._fixed_chooser(msg, queue, selector, arg, sharding_key)
        if self._tracer is not None:
            return await self._traced(req, (msg,))
        return await self._send_with_retries(req)

    async def _traced(self, req: _Send, msgs: Sequence[Message]) -> SendResult:
        """A send that writes its Pub trace records (one per message) once answered; a send
        that fails writes none, as RocketMQ's hook. Tracing never fails the send."""
        started = time.time()
        result = await self._send_with_retries(req)
        tracer = self._tracer
        try:
            answer = req.answer or {}
            if (
                tracer is not None
                and answer.get("TRACE_ON") != "false"
                and not req.topic.startswith(tracer.topic)
            ):
                broker = result.message_queue.broker_name
                store = self._instance.master_addr(broker) if self._instance else None
                region = answer.get("MSG_REGION") or DEFAULT_REGION
                cost = int((time.time() - started) * 1000)
                for ctx in pub_contexts(
                    self.group, msgs, result, store, region, int(started * 1000), cost
                ):
                    tracer.append(ctx)
        except Exception as exc:  # a trace is never worth a failed send
            log.warning("trace_pub_failed", topic=req.topic, error=repr(exc))
        return result

    def _trace_end_transaction(
        self,
        msg: Message,
        msg_id: str,
        broker_addr: str | None,
        transaction_id: str | None,
        state: str,
        from_check: bool,
    ) -> None:
        """Write the EndTransaction trace record of a transaction's end (trace on; for
        `TransactionProducer`, after each END_TRANSACTION). Never raises."""
        tracer = self._tracer
        if tracer is None or msg.topic.startswith(tracer.topic):
            return
        try:
            tracer.append(
                end_transaction_context(
                    self.group, msg, msg_id, broker_addr, transaction_id, state, from_check
                )
            )
        except Exception as exc:
            log.warning("trace_end_transaction_failed", topic=msg.topic, error=repr(exc))

    def _single(self, msg: Message, timeout_ms: int | None, retries: int) -> _Send:
        """One message validated and encoded for sending, to any queue (set `fixed` after);
        raises what `_prepare` raises."""
        body, sys_flag, properties, uniq = self._prepare(msg)
        timeout_s = (timeout_ms or self.config.send_timeout_ms) / 1000
        return _Send(
            msg.topic,
            body,
            sys_flag,
            msg.flag,
            properties,
            uniq,
            False,
            timeout_s,
            None,
            retries,
            reply=msg.properties.get(PROPERTY_MESSAGE_TYPE) == REPLY_MESSAGE_FLAG,
        )

    def _fixed_chooser(
        self,
        msg: Message,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        arg: Any,
        sharding_key: str | None,
    ) -> Callable[[TopicPublishInfo], MessageQueue] | None:
        if queue is not None:
            if queue.topic != msg.topic:
                raise MessageValidationError(
                    f"message topic {msg.topic} differs from queue topic {queue.topic}"
                )
            return lambda info: queue
        if sharding_key is not None:
            selector, arg = select_by_hash, sharding_key
        if selector is None:
            return None
        sel = selector

        def choose(info: TopicPublishInfo) -> MessageQueue:
            return sel(info.queues, msg, arg)

        return choose

    async def send_orderly(self, msg: Message, sharding_key: str, **kw: Any) -> SendResult:
        """Ordered send: every message with `sharding_key` lands in the same queue."""
        return await self.send(msg, sharding_key=sharding_key, **kw)

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        *,
        timeout_ms: int | None = None,
        queue: MessageQueue | None = None,
        sharding_key: str | None = None,
    ) -> SendFuture:
        """Start a send in the background.

        Validation errors are raised at once. The outcome goes to
        `callback(result, error)` (if given) and to the returned future.
        """
        if self._nursery is None:
            raise ClientClosedError("producer is not started")
        req = self._single(msg, timeout_ms, self.config.retry_times_when_send_async_failed)
        req.fixed = self._fixed_chooser(msg, queue, None, None, sharding_key)
        fut = SendFuture()
        self._pending_async += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle

        async def run() -> None:
            result: SendResult | None = None
            error: BaseException | None = None
            try:
                if self._tracer is not None:
                    result = await self._traced(req, (msg,))
                else:
                    result = await self._send_with_retries(req)
            except Exception as exc:
                error = exc
            finally:
                self._pending_async -= 1
                if self._pending_async == 0:
                    self._idle.set()
            fut._set(result, error)
            if callback is not None:
                try:
                    callback(result, error)
                except Exception as cb_exc:
                    log.warning("send_callback_failed", error=str(cb_exc))

        self._nursery.start_soon(run)
        return fut

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        """Send without waiting for any answer (no retries, no result)."""
        body, sys_flag, properties, _ = self._prepare(msg)
        info = await self.instance.get_publish_info(msg.topic)
        mq = queue or info.select_with_fault(self.fault)
        addr = await self.instance.find_master_addr(mq.broker_name, msg.topic)
        fields = self._fields(msg.topic, mq, sys_flag, msg.flag, properties)
        await self.instance.api.send_message_oneway_fields(addr, fields, body)

    # -- request-reply (client/request_reply.py, docs/request-reply.md) ----------------
    async def request(self, msg: Message, timeout_ms: int = 3000, **send_kw: Any) -> MessageExt:
        """Send `msg` as a request and wait for the reply (RocketMQ's
        DefaultMQProducer.request).

        Args:
            msg: the request; CORRELATION_ID, REPLY_TO_CLIENT and TTL are set on it.
            timeout_ms: the whole wait, the send included.
            send_kw: `send`'s queue choice (`queue`, `selector`, `arg`, `sharding_key`).

        Returns:
            The reply message.

        Raises:
            RequestTimeoutError: no reply within `timeout_ms`.
            MQClientError: the request could not be sent (`__cause__` says why).
            ClientClosedError: the producer closed while waiting.
            MessageValidationError: the message breaks a rule (nothing was sent).
        """
        return await request(self, msg, timeout_ms, **send_kw)

    def request_async(
        self,
        msg: Message,
        callback: RequestCallback | None = None,
        *,
        timeout_ms: int = 3000,
    ) -> RequestFuture:
        """Start a request in the background: the reply or the error goes to
        `callback(reply, error)` (if given) and to the returned future (`await fut`).
        Validation errors are raised at once."""
        if self._nursery is None:
            raise ClientClosedError("producer is not started")
        return request_async(self, self._nursery, msg, callback, timeout_ms)

    async def send_reply(self, reply: Message, *, timeout_ms: int | None = None) -> SendResult:
        """Send a reply built with `create_reply_message`, once: a retry would store and
        push it again. The broker answers SUCCESS once the requester took it.

        Raises:
            MessageValidationError: `reply` is not a reply message (MSG_TYPE=reply).
            SendFailedError: the broker refused it (`__cause__`: the RemoteError, e.g.
                "push reply message fail, channel of <client id> not found.").
        """
        if reply.properties.get(PROPERTY_MESSAGE_TYPE) != REPLY_MESSAGE_FLAG:
            raise MessageValidationError(
                "not a reply message: build it with create_reply_message(request, body)"
            )
        return await self._send_with_retries(self._single(reply, timeout_ms, 0))

    # -- batches --------------------------------------------------------------------
    def _check_batch(self, msgs: Sequence[Message]) -> None:
        if not msgs:
            raise MessageValidationError("batch is empty")
        topic = msgs[0].topic
        wait = msgs[0].wait_store_msg_ok
        for m in msgs:
            if m.topic != topic:
                raise MessageValidationError(
                    "The topic of the messages in one batch should be the same"
                )
            if m.delay_time_level > 0 or PROPERTY_DELAY_TIME_LEVEL in m.properties:
                raise MessageValidationError("TimeDelayLevel is not supported for batching")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise MessageValidationError("Retry Group is not supported for batching")
            if m.wait_store_msg_ok != wait:
                raise MessageValidationError(
                    "The waitStoreMsgOK of the messages in one batch should the same"
                )
            validate_message(m, self.config.max_message_size)

    def split_batch(self, msgs: Sequence[Message]) -> list[list[tuple[Message, BatchItem]]]:
        """Validate, set UNIQ_KEYs and split into chunks whose bodies fit the size limit.

        Raises:
            MessageValidationError: a rule is broken or one message alone is too big.
        """
        self._check_batch(msgs)
        limit = self.config.max_message_size
        chunks: list[list[tuple[Message, BatchItem]]] = []
        current: list[tuple[Message, BatchItem]] = []
        size = 0
        for m in msgs:
            if not m.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX):
                m.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = self._uniq.next()
            item = BatchItem(m.flag, m.body, encode_properties(m.properties))
            item_size = BATCH_ITEM_OVERHEAD + len(m.body) + len(item.properties.encode())
            if item_size > limit:
                raise MessageValidationError(
                    f"one message of the batch is {item_size} bytes, over the limit {limit}"
                )
            if current and size + item_size > limit:
                chunks.append(current)
                current, size = [], 0
            current.append((m, item))
            size += item_size
        if current:
            chunks.append(current)
        return chunks

    def _batch_missing_keys(self, msgs: Sequence[Message]) -> int:
        """`_check_batch`'s rules in one cheap pass: how many messages lack a UNIQ_KEY, or
        -1 when a rule may be broken (then `split_batch` runs the reference checks)."""
        if not msgs:
            return -1
        topic = msgs[0].topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or topic in NOT_ALLOWED_SEND_TOPICS:
            return -1
        try:
            check_topic(topic)
        except MessageValidationError:
            return -1
        wait = msgs[0].wait_store_msg_ok
        limit = self.config.max_message_size
        delay_name, wait_name = PROPERTY_DELAY_TIME_LEVEL, PROPERTY_WAIT_STORE_MSG_OK
        uniq_name = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        missing = 0
        for m in msgs:
            props = m.properties
            body = m.body
            if (
                m.topic != topic
                or delay_name in props
                or (props.get(wait_name, "true") != "false") != wait
                or not body
                or len(body) > limit
            ):
                return -1
            if not props.get(uniq_name):
                missing += 1
        return missing

    def _batch_bodies(self, msgs: Sequence[Message]) -> list[tuple[bytes, str]]:
        """Validate, set UNIQ_KEYs, split and encode: ``(body, comma-joined ids)`` per chunk.

        The one-pass encoder (`encode_batch_chunks`) when every rule holds; `split_batch` +
        `encode_batch_body` (same bytes, and the errors) otherwise.
        """
        missing = self._batch_missing_keys(msgs)
        if missing >= 0:
            keys = iter(self._uniq.next_many(missing) if missing else ())
            chunks = encode_batch_chunks(msgs, keys, self.config.max_message_size)
            if chunks is not None:
                return chunks
        uniq_name = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        return [
            (
                encode_batch_body(item for _, item in chunk),
                ",".join(m.properties[uniq_name] for m, _ in chunk),
            )
            for chunk in self.split_batch(msgs)
        ]

    async def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout_ms: int | None = None,
    ) -> list[SendResult]:
        """Send messages of one topic as batches (split when over the size limit).

        Returns:
            One SendResult per batch sent (msg_id holds the comma-joined UNIQ_KEYs).

        Raises:
            MessageValidationError: mixed topics, delay levels, retry topics,
                differing WAIT flags, or one message over the limit.
        """
        chunks = self._batch_bodies(msgs)
        topic = msgs[0].topic
        tracer = self._tracer
        by_id = {m.uniq_key: m for m in msgs} if tracer is not None else {}
        wait = msgs[0].wait_store_msg_ok
        props = encode_properties({PROPERTY_WAIT_STORE_MSG_OK: "true" if wait else "false"})
        fixed = self._fixed_chooser(msgs[0], queue, None, None, None)
        timeout_s = (timeout_ms or self.config.send_timeout_ms) / 1000
        results = []
        for body, ids in chunks:
            req = _Send(
                topic,
                body,
                0,
                0,
                props,
                ids,
                True,
                timeout_s,
                fixed,
                self.config.retry_times_when_send_failed,
            )
            if tracer is not None:
                chunk = [by_id[i] for i in ids.split(",") if i in by_id]
                results.append(await self._traced(req, chunk))
            else:
                results.append(await self._send_with_retries(req))
        return results

    # -- helpers ------------------------------------------------------------------------
    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's publish queues (ordered by broker, then id)."""
        return list((await self.instance.get_publish_info(topic)).queues)

    async def create_topic(self, topic: str, queue_nums: int = 4) -> None:
        """Create `topic` on every broker serving the auto-create template (TBW102)."""
        route = await self.instance.api.get_topic_route(DEFAULT_TOPIC)
        if route is None:
            raise ClientClosedError("no TBW102 route: cannot find brokers to create the topic on")
        for bd in route.broker_datas:
            addr = bd.broker_addrs.get(0)
            if addr:
                await self.instance.api.create_topic(
                    addr, topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums
                )


AwaitableSend = Awaitable[SendResult]

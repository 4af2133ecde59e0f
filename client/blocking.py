"""Blocking facade: the client for code that is not trio (scripts, web apps, Spark workers).

Each object starts a background thread running a trio loop; its methods hand
work to that loop (`trio.from_thread`) and block until it is done or until
their `timeout` (seconds) passes, which raises the builtin `TimeoutError`.
Methods may be called from several threads at once. `close()` (or leaving the
`with` block) stops the object and its thread cleanly.

    from client.sync import Producer, Message
    with Producer("pg", ClientConfig(namesrv_addr="127.0.0.1:9876")) as p:
        print(p.send(Message("TopicTest", b"hi")))
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import structlog
import trio

from client.admin import Admin as AsyncAdmin
from client.config import ClientConfig
from client.consumer._base import ConsumeFromWhere, MessageModel
from client.consumer.pull import PullConsumer as AsyncPullConsumer
from client.consumer.push import ConsumeStatus
from client.consumer.push import PushConsumer as AsyncPushConsumer
from client.consumer.rebalance import AllocateStrategy
from client.errors import ClientClosedError
from client.filter import MessageSelector
from client.message import Message, MessageExt, MessageQueue, SendResult
from client.producer import Producer as AsyncProducer
from client.producer import QueueSelector
from common.trio_thread import TrioThread

log = structlog.get_logger()

T = TypeVar("T")
A = TypeVar("A")

START_TIMEOUT_S = 30.0


_NOT_STARTED = "the client is not started (call start() or use `with`)"


def _closed_error(_reason: str) -> ClientClosedError:
    return ClientClosedError(_NOT_STARTED)


@contextlib.asynccontextmanager
async def _held_open(obj: Any) -> AsyncIterator[trio.Nursery]:
    """`obj` (an async context manager) entered and held open, inside a nursery for the
    facade's own tasks, which is the value.

    The tasks (`send_async`) outlive `obj`: a send in flight when the facade closes keeps
    running while `obj` closes gracefully, and is cancelled only after that. An error of `obj`
    entering or leaving comes out as itself, not as the nursery's group of one.
    """
    try:
        async with trio.open_nursery() as tasks:
            async with obj:
                yield tasks
            tasks.cancel_scope.cancel()
    except BaseExceptionGroup as eg:
        if len(eg.exceptions) == 1:
            raise eg.exceptions[0] from None
        raise


class _LoopThread(TrioThread[trio.Nursery]):
    """The facade's trio thread: `obj` held open in it (`_held_open`), calls with a timeout."""

    def __init__(self, name: str, obj: Any) -> None:
        super().__init__(
            name,
            lambda: _held_open(obj),
            what="the client's trio thread",
            closed_error=_closed_error,
            start_timeout=START_TIMEOUT_S,
        )

    def run(
        self, fn: Callable[..., Awaitable[T]], /, *args: Any, timeout: float | None = None
    ) -> T:
        """Run `await fn(*args)` in the loop and return its result (blocking).

        Raises:
            TimeoutError: no result within `timeout` seconds (the call is cancelled).
            ClientClosedError: the client is not started or closed.
        """
        if timeout is None:
            return super().run(fn, *args)

        async def call() -> T:
            try:
                with trio.fail_after(timeout):
                    return await fn(*args)
            except trio.TooSlowError:
                raise TimeoutError(f"no result within {timeout} s") from None

        return super().run(call)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], /, *args: Any) -> None:
        """Start `fn(*args)` in the nursery around `obj` (it outlives `obj`, see `_held_open`)."""
        try:
            self.run_sync(self.value.start_soon, fn, *args)
        except ClientClosedError:
            raise ClientClosedError("the client is closed") from None


class _Held(Generic[A]):
    """An async context manager entered and held open inside its own loop thread."""

    def __init__(self, name: str, obj: A) -> None:
        self.obj = obj
        self._name = name
        self._loop = _LoopThread(name, obj)
        self._started = False

    @property
    def loop(self) -> _LoopThread:
        return self._loop

    def start(self) -> None:
        if self._started:
            return
        # A loop thread runs once: a client started again after close() gets a new one.
        self._loop = _LoopThread(self._name, self.obj)
        self._loop.start()
        self._started = True

    def close(self) -> None:
        if not self._started:
            return
        self._started = False
        self._loop.close()


def _in_loop(held: _Held[Any], fn: Callable[..., Any], *args: Any) -> None:
    """Call a sync method of the async object: in its loop thread once started."""
    if held._started:
        held.loop.run_sync(fn, *args)
    else:
        fn(*args)


class _Facade(Generic[A]):
    _held: _Held[A]

    def start(self) -> Self:
        """Connect and start background work (idempotent)."""
        self._held.start()
        return self

    def close(self) -> None:
        """Stop cleanly (persist offsets, unregister) and end the background thread."""
        self._held.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None) -> T:
        return self._held.loop.run(fn, *args, timeout=timeout)


class Producer(_Facade[AsyncProducer]):
    """Blocking producer; see `client.Producer` for the arguments and semantics."""

    def __init__(self, group: str = "DEFAULT_PRODUCER", config: ClientConfig | None = None) -> None:
        self.inner = AsyncProducer(group, config)
        self._held = _Held(f"trimq-producer-{group}", self.inner)

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        sharding_key: str | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send and wait for the result (`timeout` seconds bound the whole call)."""

        async def call() -> SendResult:
            return await self.inner.send(
                msg, queue=queue, selector=selector, arg=arg, sharding_key=sharding_key
            )

        return self._run(call, timeout=timeout)

    def send_orderly(
        self, msg: Message, sharding_key: str, timeout: float | None = None
    ) -> SendResult:
        return self.send(msg, sharding_key=sharding_key, timeout=timeout)

    def send_oneway(self, msg: Message, timeout: float | None = None) -> None:
        self._run(self.inner.send_oneway, msg, timeout=timeout)

    def send_batch(self, msgs: Sequence[Message], timeout: float | None = None) -> list[SendResult]:
        return self._run(self.inner.send_batch, msgs, timeout=timeout)

    def request(self, msg: Message, timeout_ms: int = 3000) -> MessageExt:
        """Send `msg` as a request and wait for its reply (`client.Producer.request`).

        Raises:
            client.request_reply.RequestTimeoutError: no reply within `timeout_ms`.
        """

        async def call() -> MessageExt:
            return await self.inner.request(msg, timeout_ms)

        # The request bounds itself; the margin lets its own error come back first.
        return self._run(call, timeout=timeout_ms / 1000 + 5)

    def send_reply(self, reply: Message, timeout: float | None = None) -> SendResult:
        """Send a reply built with `client.request_reply.create_reply_message`."""
        return self._run(self.inner.send_reply, reply, timeout=timeout)

    def send_async(
        self,
        msg: Message,
        callback: Callable[[SendResult | None, BaseException | None], None] | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Start a send; the future (and `callback`, in the client's thread) get the outcome."""
        fut: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        async def call() -> None:
            result: SendResult | None = None
            error: Exception | None = None
            try:
                result = await self.inner.send(msg)
            except Exception as exc:
                error = exc
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            if callback is not None:
                try:
                    callback(result, error)
                except Exception as cb_exc:  # never let user code stop the client's loop
                    log.warning("send_callback_failed", error=repr(cb_exc))

        self._held.loop.start_soon(call)
        return fut


SyncListener = Callable[[list[MessageExt]], ConsumeStatus | None]


class PushConsumer(_Facade[AsyncPushConsumer]):
    """Blocking push consumer: `listener(msgs)` runs in a thread pool.

    Args:
        group: consumer group.
        config: client options (`consume_concurrency` sizes the thread pool).
        listener: a plain function `(msgs) -> ConsumeStatus`.
        Other arguments as `client.PushConsumer`.
    """

    def __init__(
        self,
        group: str,
        config: ClientConfig | None = None,
        *,
        listener: SyncListener | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        allocate_strategy: AllocateStrategy | None = None,
    ) -> None:
        self.inner = AsyncPushConsumer(
            group,
            config,
            listener=self._call_listener,
            message_model=message_model,
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
        )
        self.listener = listener
        self._threads = trio.CapacityLimiter(self.inner.config.consume_concurrency)
        self._held = _Held(f"trimq-push-{group}", self.inner)

    def register_listener(self, listener: SyncListener) -> None:
        self.listener = listener

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        _in_loop(self._held, self.inner.subscribe, topic, expression)

    async def _call_listener(self, msgs: list[MessageExt]) -> ConsumeStatus:
        listener = self.listener
        if listener is None:
            return ConsumeStatus.RECONSUME_LATER
        status = await trio.to_thread.run_sync(listener, msgs, limiter=self._threads)
        return ConsumeStatus.CONSUME_SUCCESS if status is None else status

    def assignment(self) -> set[MessageQueue]:
        return set(self._held.loop.run_sync(lambda: set(self.inner.queues)))


class PullConsumer(_Facade[AsyncPullConsumer]):
    """Blocking lite pull consumer; see `client.PullConsumer`."""

    def __init__(
        self,
        group: str,
        config: ClientConfig | None = None,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        auto_commit: bool = True,
    ) -> None:
        self.inner = AsyncPullConsumer(
            group,
            config,
            message_model=message_model,
            consume_from_where=consume_from_where,
            auto_commit=auto_commit,
        )
        self._held = _Held(f"trimq-pull-{group}", self.inner)

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        _in_loop(self._held, self.inner.subscribe, topic, expression)

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        mq_list = list(mqs)
        if self._held._started:
            self._held.loop.run_sync(self.inner.assign, mq_list)
            self._held.loop.run(self.inner.do_rebalance)
        else:
            self.inner.assign(mq_list)

    def poll(self, timeout_ms: int | None = None) -> list[MessageExt]:
        """Messages pulled so far, waiting up to `timeout_ms` for the first."""
        return self._run(self.inner.poll, timeout_ms, timeout=None)

    def commit(
        self, offsets: dict[MessageQueue, int] | None = None, timeout: float | None = None
    ) -> None:
        self._run(self.inner.commit, offsets, timeout=timeout)

    def committed(self, mq: MessageQueue, timeout: float | None = None) -> int:
        return self._run(self.inner.committed, mq, timeout=timeout)

    def seek(self, mq: MessageQueue, offset: int, timeout: float | None = None) -> None:
        self._run(self.inner.seek, mq, offset, timeout=timeout)

    def seek_to_begin(self, mq: MessageQueue, timeout: float | None = None) -> None:
        self._run(self.inner.seek_to_begin, mq, timeout=timeout)

    def seek_to_end(self, mq: MessageQueue, timeout: float | None = None) -> None:
        self._run(self.inner.seek_to_end, mq, timeout=timeout)

    def offset_for_timestamp(
        self, mq: MessageQueue, timestamp_ms: int, timeout: float | None = None
    ) -> int:
        return self._run(self.inner.offset_for_timestamp, mq, timestamp_ms, timeout=timeout)

    def fetch_message_queues(self, topic: str, timeout: float | None = None) -> list[MessageQueue]:
        return self._run(self.inner.fetch_message_queues, topic, timeout=timeout)

    def assignment(self) -> set[MessageQueue]:
        return set(self._held.loop.run_sync(lambda: set(self.inner.queues)))


class Admin(_Facade[AsyncAdmin]):
    """Blocking admin: every coroutine method of `client.Admin`, called with an
    optional `timeout=` keyword (seconds)."""

    def __init__(self, config: ClientConfig | None = None) -> None:
        self.inner = AsyncAdmin(config)
        self._held = _Held("trimq-admin", self.inner)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        target = getattr(self.inner, name)
        if not callable(target):
            return target  # type: ignore[no-any-return]

        def call(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            async def run() -> Any:
                return await target(*args, **kwargs)

            return self._run(run, timeout=timeout)

        call.__name__ = name
        call.__doc__ = target.__doc__
        return call

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
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
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
from client.message import Message, MessageExt, MessageQueue, SendResult
from client.producer import Producer as AsyncProducer
from client.producer import QueueSelector

log = structlog.get_logger()

T = TypeVar("T")
A = TypeVar("A")

START_TIMEOUT_S = 30.0


class _LoopThread:
    """A trio loop in a daemon thread with a nursery for long-lived tasks."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError("the client's trio thread did not start")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._token = trio.lowlevel.current_trio_token()
            self._nursery = nursery
            self._ready.set()
            await trio.sleep_forever()

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        if self._token is None or self._nursery is None:
            raise ClientClosedError("the client is not started (call start() or use `with`)")
        return self._token

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Run `await fn(*args)` in the loop and return its result (blocking)."""

        async def call() -> T:
            if timeout is None:
                return await fn(*args)
            try:
                with trio.fail_after(timeout):
                    return await fn(*args)
            except trio.TooSlowError:
                raise TimeoutError(f"no result within {timeout} s") from None

        return trio.from_thread.run(call, trio_token=self.token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        nursery = self._nursery
        if nursery is None:
            raise ClientClosedError("the client is closed")
        self.run_sync(nursery.start_soon, fn, *args)

    def stop(self) -> None:
        if self._nursery is not None and self._token is not None:
            nursery = self._nursery
            self._nursery = None
            try:
                trio.from_thread.run_sync(nursery.cancel_scope.cancel, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)
            self._thread = None


class _Held(Generic[A]):
    """An async context manager entered and held open inside a loop thread."""

    def __init__(self, name: str, obj: A) -> None:
        self.obj = obj
        self._loop = _LoopThread(name)
        self._close = trio.Event()
        self._closed = threading.Event()
        self._started = False

    @property
    def loop(self) -> _LoopThread:
        return self._loop

    def start(self) -> None:
        if self._started:
            return
        self._loop.start()
        try:
            self._loop.run(self._enter)
        except BaseException:
            self._loop.stop()
            raise
        self._started = True

    async def _enter(self) -> None:
        nursery = self._loop._nursery
        assert nursery is not None
        await nursery.start(self._hold)

    async def _hold(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with self.obj:  # type: ignore[attr-defined]
                task_status.started()
                await self._close.wait()
        finally:
            self._closed.set()

    def close(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            self._loop.run_sync(self._close.set)
        except (trio.RunFinishedError, ClientClosedError):
            pass
        self._closed.wait(START_TIMEOUT_S)
        self._loop.stop()


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

    def subscribe(self, topic: str, expression: str = "*") -> None:
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

    def subscribe(self, topic: str, expression: str = "*") -> None:
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

"""Blocking access to a RocketMQ-protocol cluster from Spark's Python processes.

Spark runs our code in plain threads of short- and long-lived Python
processes (planner workers, the streaming source runner, executor workers that
are reused across tasks). A `Conn` hosts one `ClientInstance` in a trio loop on
a daemon thread and exposes the few calls the data source needs as blocking
methods.

`get_conn(namesrv_addr)` keeps one `Conn` per process and NameServer list.
This cache is trimq's one deliberate piece of module-level state: Spark reuses
worker processes, and reconnecting for every task would cost a route lookup and
a TCP handshake per partition. The cache is
keyed by pid (a forked child never uses its parent's loop thread) and a `Conn`
whose loop died is replaced.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import structlog
import trio

from client._api import PullStatus
from client.config import ClientConfig, SerializeTypeName
from client.errors import MQClientError
from client.instance import ClientInstance, unique_instance_name
from client.message import Message, MessageQueue
from client.producer import Producer
from client.route import subscribe_queues
from client.spark.offsets import DataLossError, OffsetMap, QueueRange, queue_key
from common.pull import PULL_FLAG_SUBSCRIPTION
from common.trio_thread import TrioThread
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemoteError
from remoting.protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader

if TYPE_CHECKING:
    from client.spark.options import TlsOptions

__all__ = ["Conn", "PulledBody", "SendSession", "close_all", "get_conn"]

log = structlog.get_logger()

T = TypeVar("T")

START_TIMEOUT_S = 30.0
READER_GROUP = "SPARK_ROCKETMQ_READER"
# How often a pull inside a promised range may find nothing before the read fails.
NOT_FOUND_RETRIES = 50
NOT_FOUND_SLEEP_S = 0.1
PREFETCH = 2

_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


class PulledBody:
    """One FOUND pull answer: the raw record bytes (decoded by the caller's thread)."""

    __slots__ = ("body", "offset")

    def __init__(self, offset: int, body: bytes) -> None:
        self.offset = offset
        self.body = body


class Conn:
    """A started client instance on its own trio thread, with blocking methods.

    Args:
        namesrv_addr: NameServer list `host:port;host:port`.
        timeout_ms: RPC timeout for route and offset calls.
        serialize_type: header codec, as `ClientConfig.serialize_type` ("auto": JSON, moving to
            msgpack with a trimq server).
        access_key, secret_key: ACL credentials (`ClientConfig.access_key` / `secret_key`);
            None: the config's defaults (the TRIMQ_ACCESS_KEY / TRIMQ_SECRET_KEY variables).
        tls: `ClientConfig` TLS options (`use_tls`, `tls_*`) as (name, value) pairs; empty:
            the config's defaults (the TRIMQ_USE_TLS / TRIMQ_TLS_* variables).
        trace_topic: the producers write message trace records to this topic
            (`ClientConfig.enable_trace`); None: no trace.
    """

    def __init__(
        self,
        namesrv_addr: str,
        *,
        timeout_ms: int = 3000,
        serialize_type: str = "auto",
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: TlsOptions = (),
        trace_topic: str | None = None,
    ) -> None:
        self.namesrv_addr = namesrv_addr
        self._trace: dict[str, Any] = (
            {"enable_trace": True, "trace_topic": trace_topic} if trace_topic else {}
        )
        self._tls: dict[str, Any] = dict(tls)
        self.serialize_type = serialize_type
        self._credentials: dict[str, Any] = (
            {"access_key": access_key, "secret_key": secret_key} if access_key else {}
        )
        self.timeout_ms = timeout_ms
        self._producers: dict[str, Producer] = {}
        self._lock = threading.Lock()
        self._loop: TrioThread[ClientInstance] = TrioThread(
            "trimq-spark-conn",
            self._open_instance,
            what="the trimq Spark connection",
            closed_error=MQClientError,
            start_timeout=START_TIMEOUT_S,
        )

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> Conn:
        self._loop.start()
        return self

    @property
    def pid(self) -> int:
        """The process whose loop thread this is."""
        return self._loop.pid

    @property
    def alive(self) -> bool:
        """Started, not closed, its loop thread running, and in the process that started it."""
        return self._loop.alive

    def _open_instance(self) -> ClientInstance:
        """The client instance, entered in the loop thread before the connection is ready."""
        cfg = ClientConfig(
            namesrv_addr=self.namesrv_addr,
            instance_name=unique_instance_name(),
            mq_client_api_timeout_ms=self.timeout_ms,
            serialize_type=cast(SerializeTypeName, self.serialize_type),
            **self._credentials,
            **self._tls,
            **self._trace,
        )
        return ClientInstance(cfg)

    def close(self) -> None:
        """Stop the loop (pumps and producers first, then the instance) and join its thread."""
        self._loop.close()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)` in the loop thread; blocks until done."""
        return self._loop.run(fn, *args)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return self._loop.run_sync(fn, *args)

    @property
    def instance(self) -> ClientInstance:
        return self._loop.value

    @property
    def _nursery(self) -> trio.Nursery:
        """The loop's nursery (pumps, held producers); for code running in the loop."""
        return self._loop.nursery

    # -- topics and offsets --------------------------------------------------------
    def topic_list(self) -> list[str]:
        return self.run(self.instance.api.get_topic_list_from_namesrv)

    def queues(self, topic: str) -> list[tuple[str, int]] | None:
        """The topic's readable queues `(broker, queue id)`, sorted; None without a route."""

        async def call() -> list[tuple[str, int]] | None:
            if not await self.instance.update_topic_route(topic):
                return None
            route = self.instance.route_table[topic]
            return sorted((mq.broker_name, mq.queue_id) for mq in subscribe_queues(topic, route))

        return self.run(call)

    def bounds(
        self,
        queues: Mapping[str, Sequence[tuple[str, int]]],
        *,
        retries: int = 3,
        retry_interval_ms: int = 10,
    ) -> dict[str, dict[str, tuple[int, int]]]:
        """`{topic: {"broker:queue": (min offset, max offset)}}` asked of the masters (a
        slave while its master is gone from the route)."""

        async def one(topic: str, broker: str, qid: int, out: dict[str, tuple[int, int]]) -> None:
            mq = MessageQueue(topic, broker, qid)
            for attempt in range(retries + 1):
                try:
                    addr, _ = await self.instance.find_read_addr(broker, topic)
                    lo = await self.instance.api.get_min_offset(addr, mq)
                    hi = await self.instance.api.get_max_offset(addr, mq)
                except Exception:
                    if attempt >= retries:
                        raise
                    await trio.sleep(retry_interval_ms / 1000)
                    continue
                out[queue_key(broker, qid)] = (lo, hi)
                return

        async def call() -> dict[str, dict[str, tuple[int, int]]]:
            result: dict[str, dict[str, tuple[int, int]]] = {t: {} for t in queues}
            async with trio.open_nursery() as nursery:
                for topic, qs in queues.items():
                    for broker, qid in qs:
                        nursery.start_soon(one, topic, broker, qid, result[topic])
            return result

        return _unwrap(self.run, call)

    def update_offsets(self, group: str, offsets: OffsetMap) -> None:
        """UPDATE_CONSUMER_OFFSET for every queue (monitoring: `mqadmin consumerProgress`)."""
        from client.spark.options import parse_queue_key

        async def one(topic: str, key: str, off: int) -> None:
            broker, qid = parse_queue_key(key)
            addr = await self.instance.find_offset_addr(broker, topic)
            await self.instance.api.update_consumer_offset(
                addr, group, MessageQueue(topic, broker, qid), off
            )

        async def call() -> None:
            async with trio.open_nursery() as nursery:
                for topic, qs in offsets.items():
                    for key, off in qs.items():
                        nursery.start_soon(one, topic, key, off)

        _unwrap(self.run, call)

    # -- pulling -------------------------------------------------------------------
    async def _pull(
        self,
        addr: str,
        rng: QueueRange,
        offset: int,
        max_nums: int,
        sub_expression: str,
        timeout_ms: int,
    ) -> tuple[PullStatus, PullMessageResponseHeader, bytes]:
        header = PullMessageRequestHeader(
            consumer_group=READER_GROUP,
            topic=rng.topic,
            queue_id=rng.queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            sys_flag=PULL_FLAG_SUBSCRIPTION,  # never the commit-offset bit: reads are stateless
            commit_offset=0,
            suspend_timeout_millis=0,
            subscription=sub_expression,
            sub_version=0,
            expression_type="TAG",
        )
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_fields())
        remoting = self.instance.remoting
        assert remoting is not None
        resp = await remoting.invoke(addr, cmd, timeout_ms)
        try:
            status = _PULL_STATUS[ResponseCode(resp.code)]
        except (KeyError, ValueError):
            raise RemoteError(resp.code, resp.remark) from None
        rh = PullMessageResponseHeader.from_fields(resp.ext_fields)
        body = resp.body_bytes() if status is PullStatus.FOUND else b""
        return status, rh, body

    async def _pump(
        self,
        rng: QueueRange,
        send: trio.MemorySendChannel[PulledBody | BaseException],
        batch: int,
        sub_expression: str,
        timeout_ms: int,
        fail_on_data_loss: bool,
        scope: trio.CancelScope,
    ) -> None:
        with scope:
            async with send:
                try:
                    await self._pump_range(
                        rng, send, batch, sub_expression, timeout_ms, fail_on_data_loss
                    )
                except Exception as exc:
                    # The reader may be gone already; never let this task kill the loop.
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await send.send(exc)

    async def _pump_range(
        self,
        rng: QueueRange,
        send: trio.MemorySendChannel[PulledBody | BaseException],
        batch: int,
        sub_expression: str,
        timeout_ms: int,
        fail_on_data_loss: bool,
    ) -> None:
        off = rng.start
        empty = 0
        where = f"{rng.topic} {queue_key(rng.broker, rng.queue_id)}"
        while off < rng.end:
            addr, _ = await self.instance.find_read_addr(rng.broker, rng.topic)
            status, rh, body = await self._pull(
                addr, rng, off, min(batch, rng.end - off), sub_expression, timeout_ms
            )
            nxt = rh.next_begin_offset
            if status is PullStatus.FOUND:
                if nxt <= off:
                    raise MQClientError(f"{where}: broker did not advance past offset {off}")
                await send.send(PulledBody(off, body))
                off, empty = nxt, 0
            elif status is PullStatus.NO_MATCHED_MSG:
                if nxt <= off:
                    raise MQClientError(f"{where}: broker did not advance past offset {off}")
                off, empty = nxt, 0
            elif status is PullStatus.NO_NEW_MSG:
                if nxt > off:  # a hole in the queue
                    self._lost(fail_on_data_loss, f"{where}: offsets {off}..{nxt - 1} are missing")
                    off = nxt
                    continue
                empty += 1
                if empty > NOT_FOUND_RETRIES:
                    raise MQClientError(
                        f"{where}: offset {off} is below the end {rng.end} planned for this "
                        f"batch but the broker has no message there (max offset {rh.max_offset})"
                    )
                await trio.sleep(NOT_FOUND_SLEEP_S)
            else:  # OFFSET_ILLEGAL
                if off < rh.min_offset:
                    self._lost(
                        fail_on_data_loss,
                        f"{where}: offsets {off}..{rh.min_offset - 1} were deleted "
                        f"(the queue's min offset is now {rh.min_offset})",
                    )
                    off = max(nxt, rh.min_offset)
                else:
                    self._lost(
                        fail_on_data_loss,
                        f"{where}: offset {off} is beyond the queue's max offset {rh.max_offset} "
                        "(was the topic deleted and created again?)",
                    )
                    return

    @staticmethod
    def _lost(fail: bool, what: str) -> None:
        if fail:
            raise DataLossError(
                f"rocketmq data source: data loss: {what}. "
                "Set option failOnDataLoss=false to skip lost offsets."
            )
        log.warning("spark_data_loss_skipped", detail=what)

    def iter_range(
        self,
        rng: QueueRange,
        *,
        batch: int,
        sub_expression: str,
        timeout_ms: int,
        fail_on_data_loss: bool,
    ) -> Iterator[PulledBody]:
        """The pull answers covering `[rng.start, rng.end)`, prefetched in the loop thread.

        The next pull is in flight while the caller processes the current one.
        Closing the generator early cancels the pulls in flight.

        Raises:
            DataLossError: offsets are gone and `fail_on_data_loss` is set.
            MQClientError / remoting errors: the broker could not serve the range.
        """

        def start() -> tuple[
            trio.MemoryReceiveChannel[PulledBody | BaseException], trio.CancelScope
        ]:
            send, recv = trio.open_memory_channel[PulledBody | BaseException](PREFETCH)
            scope = trio.CancelScope()
            self._nursery.start_soon(
                self._pump, rng, send, batch, sub_expression, timeout_ms, fail_on_data_loss, scope
            )
            return recv, scope

        recv, scope = self.run_sync(start)
        try:
            while True:
                try:
                    item = self.run(recv.receive)
                except trio.EndOfChannel:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if self.alive:
                try:
                    self.run_sync(scope.cancel)
                    self.run_sync(recv.close)
                except MQClientError:  # closed in between
                    pass

    # -- sending -------------------------------------------------------------------
    def producer(self, group: str) -> Producer:
        """A started producer of `group` sharing this connection's client instance."""
        with self._lock:
            p = self._producers.get(group)
            if p is None:

                async def hold(
                    task_status: trio.TaskStatus[Producer] = trio.TASK_STATUS_IGNORED,
                ) -> None:
                    async with Producer(group, instance=self.instance) as prod:
                        task_status.started(prod)
                        await trio.sleep_forever()

                async def make() -> Producer:
                    prod: Producer = await self._nursery.start(hold)
                    return prod

                p = self.run(make)
                self._producers[group] = p
            return p

    def send_session(self, group: str, *, timeout_ms: int, max_in_flight: int = 4) -> SendSession:
        return SendSession(self, self.producer(group), timeout_ms, max_in_flight)


class SendSession:
    """Batches sent in the background, at most `max_in_flight` at a time.

    `submit()` blocks only while that many batches are in flight; `finish()`
    waits for all of them and raises the first error.
    """

    def __init__(self, conn: Conn, producer: Producer, timeout_ms: int, max_in_flight: int) -> None:
        self._conn = conn
        self._producer = producer
        self._timeout_ms = timeout_ms
        self._max = max_in_flight
        self._sem = conn.run_sync(trio.Semaphore, max_in_flight)
        self.errors: list[BaseException] = []
        self.sent = 0

    async def _send(self, msgs: list[Message], queue: MessageQueue | None) -> None:
        try:
            await self._producer.send_batch(msgs, queue=queue, timeout_ms=self._timeout_ms)
            self.sent += len(msgs)
        except Exception as exc:
            self.errors.append(exc)
        finally:
            self._sem.release()

    async def _submit(self, msgs: list[Message], queue: MessageQueue | None) -> None:
        await self._sem.acquire()
        self._conn._nursery.start_soon(self._send, msgs, queue)

    def submit(self, msgs: list[Message], queue: MessageQueue | None = None) -> None:
        """Queue one batch (one topic; `queue` pins it to a queue).

        Raises:
            Exception: an earlier batch failed (the first error).
        """
        if self.errors:
            raise self.errors[0]
        self._conn.run(self._submit, msgs, queue)

    def finish(self) -> int:
        """Wait for every batch; returns how many messages were sent.

        Raises:
            Exception: a batch failed (the first error).
        """

        async def drain() -> None:
            for _ in range(self._max):
                await self._sem.acquire()
            for _ in range(self._max):
                self._sem.release()

        self._conn.run(drain)
        if self.errors:
            raise self.errors[0]
        return self.sent


def _unwrap(run: Callable[[Callable[[], Awaitable[T]]], T], fn: Callable[[], Awaitable[T]]) -> T:
    """Run `fn`; a nursery's group of one error comes out as that error."""
    try:
        return run(fn)
    except BaseExceptionGroup as eg:
        first: BaseException = eg
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from eg


_CACHE: dict[tuple[int, str], Conn] = {}
_CACHE_LOCK = threading.Lock()
_MAX_CACHED = 8


def get_conn(
    namesrv_addr: str,
    *,
    serialize_type: str = "auto",
    access_key: str | None = None,
    secret_key: str | None = None,
    tls: TlsOptions = (),
    trace_topic: str | None = None,
) -> Conn:
    """This process's connection to the cluster behind `namesrv_addr` (started on first use),
    one per header codec, set of ACL credentials, TLS options and trace topic (None: no
    trace)."""
    # The secret is in the key as a digest only: the key is logged nowhere, but need not hold it.
    secret_id = hashlib.sha256(secret_key.encode()).hexdigest()[:16] if secret_key else ""
    # So are the TLS options (they may hold a key's pass phrase).
    tls_id = hashlib.sha256(repr(tls).encode()).hexdigest()[:16] if tls else ""
    key = (
        os.getpid(),
        f"{namesrv_addr}|{serialize_type}|{access_key or ''}|{secret_id}|{tls_id}"
        f"|{trace_topic or ''}",
    )
    with _CACHE_LOCK:
        conn = _CACHE.get(key)
        if conn is not None and conn.alive:
            return conn
        for k in [k for k in _CACHE if k[0] != key[0]]:
            del _CACHE[k]  # inherited through fork: the loop thread is not ours
        if len(_CACHE) >= _MAX_CACHED:
            oldest = next(iter(_CACHE))
            _CACHE.pop(oldest).close()
        conn = Conn(
            namesrv_addr,
            serialize_type=serialize_type,
            access_key=access_key,
            secret_key=secret_key,
            tls=tls,
            trace_topic=trace_topic,
        ).start()
        _CACHE[key] = conn
        return conn


def close_all() -> None:
    """Close this process's cached connections (also run at exit)."""
    with _CACHE_LOCK:
        conns = [c for k, c in _CACHE.items() if k[0] == os.getpid()]
        _CACHE.clear()
    for c in conns:
        try:
            c.close()
        except Exception as exc:
            log.debug("spark_conn_close_failed", error=str(exc))


atexit.register(close_all)

"""Request-reply (RocketMQ 4.6+): `Producer.request` and the reply pushed back by the broker.

The requester stamps CORRELATION_ID (a UUID), REPLY_TO_CLIENT (its client id) and TTL (the
timeout in ms) on the request and parks a `RequestFuture` in its instance's
`PendingRequests` table (RocketMQ's RequestFutureHolder). The responder builds the reply with
`create_reply_message` (topic ``<CLUSTER>_REPLY_TOPIC``, MSG_TYPE=reply) and sends it like
any message; the producer sends MSG_TYPE=reply messages with SEND_REPLY_MESSAGE_V2 (325). The
broker pushes it to the requester's connection with PUSH_REPLY_MESSAGE_TO_CLIENT (326), where
`PendingRequests.on_push_reply` matches the correlation id. Design: docs/request-reply.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import trio

from client.errors import ClientClosedError, MQClientError
from client.message import Message, MessageExt, validate_message
from common.message import (
    COMPRESSED_FLAG,
    PROPERTY_CLUSTER,
    PROPERTY_CORRELATION_ID,
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_MESSAGE_TTL,
    PROPERTY_MESSAGE_TYPE,
    PROPERTY_REPLY_MESSAGE_ARRIVE_TIME,
    MessageDecodeError,
    decode_properties,
    decompress_record_body,
)
from remoting import RemotingCommand
from remoting.codes import ResponseCode

if TYPE_CHECKING:
    from client.producer import Producer

log = structlog.get_logger()

REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"
REPLY_MESSAGE_FLAG = "reply"  # MSG_TYPE of a reply
# RocketMQ's RequestFutureHolder scans its table every second.
SCAN_INTERVAL_S = 1.0

RequestCallback = Callable[[Message | None, BaseException | None], None]


class RequestTimeoutError(MQClientError):
    """No reply within the request's timeout (RocketMQ's RequestTimeoutException)."""


def reply_topic(cluster: str) -> str:
    """The cluster's reply topic (RocketMQ's MixAll.getReplyTopic)."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


def is_reply(msg: Message) -> bool:
    """Whether `msg` is a reply (sent with SEND_REPLY_MESSAGE_V2)."""
    return msg.properties.get(PROPERTY_MESSAGE_TYPE) == REPLY_MESSAGE_FLAG


def create_reply_message(request: Message, body: bytes | bytearray | memoryview | str) -> Message:
    """The reply to `request` (a message a consumer received), as RocketMQ's
    MessageUtil.createReplyMessage: topic ``<CLUSTER>_REPLY_TOPIC``, MSG_TYPE=reply, and the
    request's CORRELATION_ID, REPLY_TO_CLIENT and TTL.

    Raises:
        MQClientError: the request has no CLUSTER property (it was not received from a
            broker) or no REPLY_TO_CLIENT / CORRELATION_ID (it is not a request).
    """
    props = request.properties
    cluster = props.get(PROPERTY_CLUSTER)
    if not cluster:
        raise MQClientError(
            f"create reply message fail, requestMessage error, property[{PROPERTY_CLUSTER}] "
            "is null."
        )
    for name in (PROPERTY_CORRELATION_ID, PROPERTY_MESSAGE_REPLY_TO_CLIENT):
        if not props.get(name):
            raise MQClientError(
                f"create reply message fail, requestMessage error, property[{name}] is null "
                "(not a request message)."
            )
    reply = Message(reply_topic(cluster), body)
    # System properties: set directly (put_user_property refuses their names).
    reply.properties[PROPERTY_MESSAGE_TYPE] = REPLY_MESSAGE_FLAG
    for name in (PROPERTY_CORRELATION_ID, PROPERTY_MESSAGE_REPLY_TO_CLIENT, PROPERTY_MESSAGE_TTL):
        value = props.get(name)
        if value is not None:
            reply.properties[name] = value
    return reply


@dataclass(eq=False)
class RequestFuture:
    """One request waiting for its reply (RocketMQ's RequestResponseFuture)."""

    correlation_id: str
    timeout_s: float
    begin: float  # trio time
    owner: object = None
    callback: RequestCallback | None = None
    reply: MessageExt | None = None
    cause: BaseException | None = None
    send_ok: bool = False
    done: trio.Event = field(default_factory=trio.Event)

    async def result(self) -> MessageExt:
        """The reply, or the request's error (RequestTimeoutError, a send failure,
        ClientClosedError)."""
        await self.done.wait()
        if self.reply is not None:
            return self.reply
        assert self.cause is not None
        raise self.cause

    def __await__(self) -> Generator[Any, None, MessageExt]:
        return self.result().__await__()

    def expired(self, now: float) -> bool:
        return now - self.begin > self.timeout_s

    def _finish(self, reply: MessageExt | None, cause: BaseException | None) -> None:
        if self.done.is_set():
            return
        self.reply, self.cause = reply, cause
        self.done.set()
        if self.callback is not None:
            try:
                self.callback(reply, cause)
            except Exception as exc:  # the application's bug: never the table's
                log.warning(
                    "request_callback_failed", correlation_id=self.correlation_id, error=repr(exc)
                )


class PendingRequests:
    """A client instance's requests waiting for replies, by correlation id.

    Entries leave on a matching reply, on a send failure, when their waiter gives up, when
    `scan_expired` finds them past their timeout (`run_scanner` every second) or when their
    producer or the instance closes (`cancel_owner`, `close`).
    """

    def __init__(self) -> None:
        self._table: dict[str, RequestFuture] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, correlation_id: object) -> bool:
        return correlation_id in self._table

    def add(
        self,
        correlation_id: str,
        timeout_s: float,
        *,
        owner: object = None,
        callback: RequestCallback | None = None,
    ) -> RequestFuture:
        """Park a request.

        Raises:
            ClientClosedError: the instance closed.
            MQClientError: the correlation id is waited for already.
        """
        if self._closed:
            raise ClientClosedError("client instance is closed: no request can wait for a reply")
        if correlation_id in self._table:
            raise MQClientError(f"a request with correlation id {correlation_id} is pending")
        fut = RequestFuture(correlation_id, timeout_s, trio.current_time(), owner, callback)
        self._table[correlation_id] = fut
        return fut

    def remove(self, correlation_id: str) -> None:
        self._table.pop(correlation_id, None)

    def complete(self, correlation_id: str, reply: MessageExt) -> bool:
        """Hand `reply` to its request; False when no request waits for that id."""
        fut = self._table.pop(correlation_id, None)
        if fut is None:
            return False
        fut._finish(reply, None)
        return True

    def fail(self, correlation_id: str, cause: BaseException) -> None:
        fut = self._table.pop(correlation_id, None)
        if fut is not None:
            fut._finish(None, cause)

    def scan_expired(self, now: float | None = None) -> int:
        """Fail every request past its timeout (RocketMQ's scanExpiredRequest); returns how
        many."""
        now = trio.current_time() if now is None else now
        expired = [f for f in self._table.values() if f.expired(now)]
        for fut in expired:
            del self._table[fut.correlation_id]
            fut._finish(None, RequestTimeoutError("request timeout, no reply message."))
        return len(expired)

    async def run_scanner(self, interval_s: float = SCAN_INTERVAL_S) -> None:
        """`scan_expired` every `interval_s` until cancelled (the instance's task)."""
        while True:
            await trio.sleep(interval_s)
            self.scan_expired()

    def cancel_owner(self, owner: object, reason: str) -> int:
        """Fail the requests of `owner` (a producer that closes) with ClientClosedError."""
        mine = [f for f in self._table.values() if f.owner is owner]
        for fut in mine:
            del self._table[fut.correlation_id]
            fut._finish(None, ClientClosedError(reason))
        return len(mine)

    def close(self, reason: str = "client instance closed") -> None:
        """Fail every request and refuse new ones."""
        self._closed = True
        pending = list(self._table.values())
        self._table.clear()
        for fut in pending:
            fut._finish(None, ClientClosedError(reason))

    # -- PUSH_REPLY_MESSAGE_TO_CLIENT (326) ------------------------------------------------
    async def on_push_reply(self, conn: object, cmd: RemotingCommand) -> RemotingCommand | None:
        """The broker pushes a reply: decode it and hand it to its request. A reply nobody
        waits for (timed out, or never ours) is logged and dropped; the broker is answered
        SUCCESS all the same, as RocketMQ's client does."""
        try:
            msg = decode_reply(cmd)
        except (KeyError, ValueError, MessageDecodeError) as exc:
            log.warning("bad_reply_message", error=str(exc))
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR, f"process reply message fail: {exc}"
            )
        correlation_id = msg.properties.get(PROPERTY_CORRELATION_ID, "")
        if not self.complete(correlation_id, msg):
            log.warning(
                "reply_not_matched",
                correlation_id=correlation_id,
                reply_from=msg.store_host,
                topic=msg.topic,
            )
        return None if cmd.is_oneway else cmd.make_response()


def decode_reply(cmd: RemotingCommand) -> MessageExt:
    """The reply message of a PUSH_REPLY_MESSAGE_TO_CLIENT request (ReplyMessageRequestHeader
    fields, the body inflated when compressed), with ARRIVE_TIME set.

    Raises:
        KeyError: a required header field is missing.
        ValueError: a number field is not a number.
        MessageDecodeError: the compressed body cannot be inflated.
    """
    fields = cmd.ext_fields or {}
    topic = fields["topic"]
    sys_flag = int(fields.get("sysFlag") or 0)
    body = cmd.body_bytes()
    if sys_flag & COMPRESSED_FLAG:
        body = decompress_record_body(body, sys_flag)
    props = decode_properties(fields.get("properties") or "")
    props[PROPERTY_REPLY_MESSAGE_ARRIVE_TIME] = str(int(time.time() * 1000))
    return MessageExt(
        topic,
        body,
        properties=props,
        flag=int(fields.get("flag") or 0),
        queue_id=int(fields.get("queueId") or 0),
        sys_flag=sys_flag,
        born_timestamp=int(fields.get("bornTimestamp") or 0),
        born_host=fields.get("bornHost") or "",
        store_timestamp=int(fields.get("storeTimestamp") or 0),
        store_host=fields.get("storeHost") or "",
        reconsume_times=int(fields.get("reconsumeTimes") or 0),
    )


# -- the requester's side (Producer.request / request_async) ---------------------------------
def _prepare_request(producer: Producer, msg: Message, timeout_ms: int) -> tuple[str, float]:
    """Validate `msg` and stamp the request properties; returns (correlation id, timeout s).

    Raises:
        MessageValidationError: see `validate_message`.
        ValueError: `timeout_ms` is not positive.
    """
    if timeout_ms <= 0:
        raise ValueError(f"the request timeout must be positive, got {timeout_ms} ms")
    validate_message(msg, producer.config.max_message_size)
    correlation_id = str(uuid.uuid4())
    msg.properties[PROPERTY_CORRELATION_ID] = correlation_id
    msg.properties[PROPERTY_MESSAGE_REPLY_TO_CLIENT] = producer.instance.client_id
    msg.properties[PROPERTY_MESSAGE_TTL] = str(timeout_ms)
    return correlation_id, timeout_ms / 1000


async def _ensure_route(producer: Producer, topic: str) -> None:
    """On a topic's first request: its route, then a heartbeat to every broker, so the broker
    that gets the reply already knows this client's connection (RocketMQ's
    prepareSendRequest)."""
    instance = producer.instance
    if topic in instance.route_table:
        return
    await instance.get_publish_info(topic)
    await instance.send_heartbeat_to_all_brokers()


async def _send_request(
    producer: Producer, msg: Message, deadline: float, timeout_ms: int, send_kw: dict[str, Any]
) -> None:
    """Send the stamped request within `deadline` (trio time).

    Raises:
        RequestTimeoutError: the route lookup used the whole timeout.
        NoRouteError: the topic has no route.
        MQClientError: the send failed (`__cause__` says why).
    """
    with trio.move_on_at(deadline):
        await _ensure_route(producer, msg.topic)
    remaining_ms = int((deadline - trio.current_time()) * 1000)
    if remaining_ms <= 0:
        raise RequestTimeoutError(
            f"send request message to <{msg.topic}> timeout: no route within {timeout_ms} ms"
        )
    try:
        await producer.send(msg, timeout_ms=remaining_ms, **send_kw)
    except Exception as exc:
        raise MQClientError(f"send request message to <{msg.topic}> fail: {exc}") from exc


async def request(producer: Producer, msg: Message, timeout_ms: int, **send_kw: Any) -> MessageExt:
    """Send `msg` as a request and wait for its reply (`Producer.request`)."""
    correlation_id, timeout_s = _prepare_request(producer, msg, timeout_ms)
    requests = producer.instance.requests
    deadline = trio.current_time() + timeout_s
    fut = requests.add(correlation_id, timeout_s, owner=producer)
    try:
        await _send_request(producer, msg, deadline, timeout_ms, send_kw)
        fut.send_ok = True
        with trio.move_on_at(deadline):
            await fut.done.wait()
        if fut.reply is not None:
            return fut.reply
        if fut.cause is not None and not isinstance(fut.cause, RequestTimeoutError):
            raise fut.cause
        raise RequestTimeoutError(
            f"send request message to <{msg.topic}> OK, but wait reply message timeout, "
            f"{timeout_ms} ms."
        )
    finally:
        requests.remove(correlation_id)


def request_async(
    producer: Producer,
    nursery: trio.Nursery,
    msg: Message,
    callback: RequestCallback | None,
    timeout_ms: int,
) -> RequestFuture:
    """Start a request in `nursery` (`Producer.request_async`): the reply or the error goes to
    `callback(reply, error)` and to the returned future; the table's scanner times it out."""
    correlation_id, timeout_s = _prepare_request(producer, msg, timeout_ms)
    requests = producer.instance.requests
    fut = requests.add(correlation_id, timeout_s, owner=producer, callback=callback)

    async def send() -> None:
        try:
            await _send_request(producer, msg, fut.begin + timeout_s, timeout_ms, {})
            fut.send_ok = True
        except Exception as exc:
            requests.fail(correlation_id, exc)

    nursery.start_soon(send)
    return fut

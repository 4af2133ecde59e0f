"""Request-reply on real processes: a consumer answers requests through the broker's push
(PUSH_REPLY_MESSAGE_TO_CLIENT), concurrent requests get their own replies, a request nobody
answers times out, a requester that went away gets nothing and its responder a clear answer,
and bad SEND_REPLY_MESSAGE requests are refused."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import trio

from client import (
    ClientClosedError,
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    SendFailedError,
    sync,
)
from client.errors import MessageValidationError
from client.request_reply import RequestTimeoutError, create_reply_message
from common.message import encode_properties
from remoting import RemoteError, RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import SendMessageRequestHeader
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

StartBroker = Callable[..., BrokerProc]
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


@pytest.mark.slow
async def test_requests_answered_by_a_consumer_concurrently_and_matched(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr)
    ns = namesrv.addr
    await create_topic(ns, "ReqT", queues=2)
    cfg = fast_config(ns)
    stored: list[str] = []
    async with Producer("resp-pg", cfg) as responder:

        async def listener(
            msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext
        ) -> ConsumeStatus:
            for m in msgs:
                result = await responder.send_reply(create_reply_message(m, b"re:" + m.body))
                stored.append(result.offset_msg_id)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer("resp-cg", cfg, listener=listener, consume_from_where=FIRST)
        consumer.subscribe("ReqT", "*")
        async with consumer, Producer("req-pg", cfg) as requester:
            request = Message("ReqT", b"ping")
            reply = await requester.request(request, timeout_ms=20_000)
            assert reply.body == b"re:ping"
            assert reply.topic == REPLY_TOPIC
            props = reply.properties
            assert props["CORRELATION_ID"] == request.properties["CORRELATION_ID"]
            assert props["REPLY_TO_CLIENT"] == requester.instance.client_id
            assert props["TTL"] == "20000"
            assert props["MSG_TYPE"] == "reply"
            assert props["PUSH_REPLY_TIME"].isdigit()
            assert props["ARRIVE_TIME"].isdigit()

            # Concurrent requests, each matched to its own reply.
            n = 20
            replies: dict[int, bytes] = {}

            async def ask(i: int) -> None:
                got = await requester.request(Message("ReqT", f"q{i}"), timeout_ms=20_000)
                replies[i] = got.body

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(ask, i)
            assert replies == {i: f"re:q{i}".encode() for i in range(n)}

            # The callback form.
            done: list[tuple[MessageExt | None, BaseException | None]] = []
            fut = requester.request_async(
                Message("ReqT", b"cb"),
                lambda r, e: done.append((r, e)),  # type: ignore[arg-type]
                timeout_ms=20_000,
            )
            got = await fut
            assert got.body == b"re:cb"
            assert done == [(got, None)]
            assert len(requester.instance.requests) == 0

            # A reply for a correlation id nobody waits for: pushed (SUCCESS) and dropped.
            stray = Message("ReqT", b"x")
            stray.properties.update(
                {
                    "CLUSTER": "DefaultCluster",
                    "CORRELATION_ID": "no-such-request",
                    "REPLY_TO_CLIENT": requester.instance.client_id,
                }
            )
            await responder.send_reply(create_reply_message(stray, b"late"))
            assert len(requester.instance.requests) == 0
    # Every reply was stored too (a real offset id, not RocketMQ's placeholder "0").
    assert len(stored) == n + 2
    assert "0" not in stored
    async with PullConsumer("reply-reader", cfg, consume_from_where=FIRST) as reader:
        reader.subscribe(REPLY_TOPIC, "*")
        bodies: set[bytes] = set()
        with trio.move_on_after(20):
            while len(bodies) < n + 3:
                bodies.update(m.body for m in await reader.poll(timeout_ms=500))
    assert bodies == {b"re:ping", b"re:cb", b"late"} | {f"re:q{i}".encode() for i in range(n)}


@pytest.mark.slow
async def test_a_request_nobody_answers_times_out(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr)
    ns = namesrv.addr
    await create_topic(ns, "Unanswered", queues=1)
    async with Producer("req-pg", fast_config(ns)) as requester:
        with trio.fail_after(15):
            with pytest.raises(RequestTimeoutError, match="wait reply message timeout, 1500 ms"):
                await requester.request(Message("Unanswered", b"hello?"), timeout_ms=1500)
        assert len(requester.instance.requests) == 0
        errors: list[BaseException | None] = []
        fut = requester.request_async(
            Message("Unanswered", b"hello?"), lambda r, e: errors.append(e), timeout_ms=1000
        )
        with trio.fail_after(15):
            with pytest.raises(RequestTimeoutError, match="request timeout, no reply message"):
                await fut
        assert len(errors) == 1
        assert isinstance(errors[0], RequestTimeoutError)
        assert len(requester.instance.requests) == 0
        with pytest.raises(ValueError, match="positive"):
            await requester.request(Message("Unanswered", b"x"), timeout_ms=0)


@pytest.mark.slow
async def test_a_requester_gone_before_the_reply(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr)
    ns = namesrv.addr
    await create_topic(ns, "GoneT", queues=1)
    cfg = fast_config(ns)
    received: list[MessageExt] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeStatus:
        received.extend(msgs)  # answered later, after the requester left
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("gone-cg", cfg, listener=listener, consume_from_where=FIRST)
    consumer.subscribe("GoneT", "*")
    outcome: list[BaseException] = []
    async with consumer, Producer("resp-pg", cfg) as responder:
        with trio.fail_after(30):
            # The producer closes (leaving the block) while `ask` waits; the nursery then
            # waits for `ask`, which the close ended at once.
            async with trio.open_nursery() as nursery, Producer("req-pg", cfg) as requester:
                client_id = requester.instance.client_id

                async def ask() -> None:
                    try:
                        await requester.request(Message("GoneT", b"q"), timeout_ms=60_000)
                    except ClientClosedError as exc:
                        outcome.append(exc)

                nursery.start_soon(ask)
                await wait_until(lambda: bool(received), total=20, what="request consumed")
            assert len(outcome) == 1
            assert "closed" in str(outcome[0])
            reply = create_reply_message(received[0], b"too late")
            with pytest.raises(SendFailedError) as info:
                await responder.send_reply(reply)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteError)
    assert cause.code == ResponseCode.SYSTEM_ERROR
    assert cause.remark is not None
    assert client_id in cause.remark
    assert "push reply message" in cause.remark
    # Stored all the same.
    async with PullConsumer("reply-reader", cfg, consume_from_where=FIRST) as reader:
        reader.subscribe(REPLY_TOPIC, "*")
        got: list[MessageExt] = []
        with trio.move_on_after(20):
            while not got:
                got = await reader.poll(timeout_ms=500)
    assert [m.body for m in got] == [b"too late"]


def _reply_cmd(
    topic: str,
    body: bytes,
    props: dict[str, str],
    code: int = RequestCode.SEND_REPLY_MESSAGE_V2,
    queue_id: int = 0,
) -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties(props) if props else None,
    )
    fields = hdr.to_fields() if code == RequestCode.SEND_REPLY_MESSAGE else hdr.to_fields_v2()
    return RemotingCommand.request(code, fields, body)


async def test_bad_reply_requests_are_refused(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker = start_broker(namesrv.addr)
    reply_props = {"MSG_TYPE": "reply", "CORRELATION_ID": "c1", "REPLY_TO_CLIENT": "1.2.3.4@x"}
    async with RemotingClient() as rc:
        addr = broker.addr

        async def ask(cmd: RemotingCommand) -> RemotingCommand:
            return await rc.invoke(addr, cmd, 5000)

        # Nobody to push to: RocketMQ's remark, in both header forms.
        for code in (RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2):
            resp = await ask(_reply_cmd(REPLY_TOPIC, b"r", reply_props, code))
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert resp.remark == "push reply message fail, channel of <1.2.3.4@x> not found."
        no_requester = {k: v for k, v in reply_props.items() if k != "REPLY_TO_CLIENT"}
        resp = await ask(_reply_cmd(REPLY_TOPIC, b"r", no_requester))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark == "reply message properties[REPLY_TO_CLIENT] is null"
        resp = await ask(_reply_cmd(REPLY_TOPIC, b"", reply_props))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert "empty" in (resp.remark or "")
        resp = await ask(_reply_cmd(REPLY_TOPIC, b"x" * (4 * 1024 * 1024 + 1), reply_props))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert "exceeds" in (resp.remark or "")
        huge = dict(reply_props, BIG="v" * 40_000)
        resp = await ask(_reply_cmd(REPLY_TOPIC, b"r", huge))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert "properties" in (resp.remark or "")
        resp = await ask(_reply_cmd(REPLY_TOPIC, b"r", reply_props, queue_id=7))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "queueId[7]" in (resp.remark or "")
        resp = await ask(_reply_cmd("bad topic!", b"r", reply_props))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        no_topic = _reply_cmd(REPLY_TOPIC, b"r", reply_props)
        assert no_topic.ext_fields is not None
        del no_topic.ext_fields["b"]  # the V2 topic field
        resp = await ask(no_topic)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert "bad request header" in (resp.remark or "")

    # The client refuses to send a message that is not a reply as one.
    async with Producer("pg", fast_config(namesrv.addr)) as producer:
        with pytest.raises(MessageValidationError, match="not a reply message"):
            await producer.send_reply(Message(REPLY_TOPIC, b"r"))


@pytest.mark.slow
async def test_blocking_requester_and_responder(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr)
    ns = namesrv.addr
    await create_topic(ns, "SyncReqT", queues=1)
    cfg = fast_config(ns)

    def run() -> tuple[bytes, str]:
        with sync.Producer("sync-resp-pg", cfg) as responder:

            def listener(msgs: list[MessageExt]) -> sync.ConsumeStatus:
                for m in msgs:
                    responder.send_reply(create_reply_message(m, m.body.upper()), timeout=10)
                return sync.ConsumeStatus.CONSUME_SUCCESS

            consumer = sync.PushConsumer(
                "sync-resp-cg", cfg, listener=listener, consume_from_where=FIRST
            )
            consumer.subscribe("SyncReqT", "*")
            with consumer, sync.Producer("sync-req-pg", cfg) as requester:
                reply = requester.request(Message("SyncReqT", b"hello"), timeout_ms=20_000)
                with pytest.raises(RequestTimeoutError):
                    requester.request(Message("NobodyListens", b"x"), timeout_ms=1000)
        return reply.body, reply.topic

    body, topic = await trio.to_thread.run_sync(run)
    assert body == b"HELLO"
    assert topic == REPLY_TOPIC

"""The requester's pending-request table (trio's fake clock), reply decoding and
`create_reply_message`."""

from __future__ import annotations

import zlib

import pytest
import trio
import trio.testing

from client.errors import ClientClosedError, MQClientError
from client.message import Message, MessageExt
from client.request_reply import (
    PendingRequests,
    RequestTimeoutError,
    create_reply_message,
    decode_reply,
    reply_topic,
)
from common.message import COMPRESSED_FLAG, encode_properties
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.unit


def _reply(correlation_id: str, body: bytes = b"pong", **fields: str) -> RemotingCommand:
    props = {"CORRELATION_ID": correlation_id, "MSG_TYPE": "reply", "CLUSTER": "C"}
    ext = {
        "topic": "C_REPLY_TOPIC",
        "queueId": "0",
        "sysFlag": "0",
        "bornTimestamp": "1",
        "flag": "0",
        "properties": encode_properties(props),
        "bornHost": "127.0.0.1:5000",
        "storeHost": "127.0.0.1:10911",
        "storeTimestamp": "2",
        **fields,
    }
    return RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext, body)


async def test_expired_requests_fail_with_a_timeout_at_the_next_scan(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table = PendingRequests()
    seen: list[tuple[Message | None, BaseException | None]] = []
    short = table.add("short", 2.0, callback=lambda r, e: seen.append((r, e)))
    long = table.add("long", 10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(table.run_scanner)
        await trio.sleep(1.5)
        assert not short.done.is_set()  # not due yet
        await trio.sleep(2.0)  # past 2 s: the scan at 3 s expired it
        assert short.done.is_set()
        assert "short" not in table
        assert "long" in table
        nursery.cancel_scope.cancel()
    assert isinstance(short.cause, RequestTimeoutError)
    assert str(short.cause) == "request timeout, no reply message."
    assert len(seen) == 1
    assert seen[0][0] is None
    assert seen[0][1] is short.cause
    with pytest.raises(RequestTimeoutError):
        await short
    assert not long.done.is_set()


async def test_a_reply_completes_only_its_own_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table = PendingRequests()
    a = table.add("a", 5.0)
    b = table.add("b", 5.0)
    resp = await table.on_push_reply(None, _reply("b", b"for-b"))
    assert resp is not None
    assert resp.code == ResponseCode.SUCCESS
    assert b.done.is_set()
    assert not a.done.is_set()
    got = await b
    assert got.body == b"for-b"
    assert got.properties["ARRIVE_TIME"].isdigit()
    assert got.store_host == "127.0.0.1:10911"
    assert "b" not in table
    assert "a" in table
    # The same reply again, and one for an id nobody waits for: dropped, still answered OK.
    for cid in ("b", "nobody"):
        resp = await table.on_push_reply(None, _reply(cid))
        assert resp is not None
        assert resp.code == ResponseCode.SUCCESS
    assert not a.done.is_set()
    assert len(table) == 1


async def test_a_reply_that_cannot_be_decoded_is_refused() -> None:
    table = PendingRequests()
    fut = table.add("x", 5.0)
    no_topic = _reply("x")
    assert no_topic.ext_fields is not None
    del no_topic.ext_fields["topic"]
    bad_number = _reply("x", queueId="zero")
    corrupt = _reply("x", b"not zlib", sysFlag=str(COMPRESSED_FLAG))
    for cmd in (no_topic, bad_number, corrupt):
        resp = await table.on_push_reply(None, cmd)
        assert resp is not None
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark
        assert resp.remark.startswith("process reply message fail")
    assert not fut.done.is_set()


def test_a_compressed_reply_is_inflated() -> None:
    body = b"x" * 5000
    msg = decode_reply(_reply("c", zlib.compress(body), sysFlag=str(COMPRESSED_FLAG)))
    assert isinstance(msg, MessageExt)
    assert msg.body == body


async def test_owner_close_and_instance_close_end_the_waits() -> None:
    table = PendingRequests()
    mine, other = object(), object()
    a = table.add("a", 5.0, owner=mine)
    b = table.add("b", 5.0, owner=other)
    assert table.cancel_owner(mine, "producer closed") == 1
    assert isinstance(a.cause, ClientClosedError)
    assert not b.done.is_set()
    table.close("gone")
    assert isinstance(b.cause, ClientClosedError)
    assert str(b.cause) == "gone"
    assert len(table) == 0
    with pytest.raises(ClientClosedError):
        table.add("c", 1.0)


async def test_a_correlation_id_waits_once() -> None:
    table = PendingRequests()
    table.add("same", 1.0)
    with pytest.raises(MQClientError, match="pending"):
        table.add("same", 1.0)


async def test_a_failing_callback_does_not_break_the_table() -> None:
    table = PendingRequests()

    def boom(reply: Message | None, error: BaseException | None) -> None:
        raise RuntimeError("application bug")

    fut = table.add("a", 1.0, callback=boom)
    assert table.complete("a", decode_reply(_reply("a")))
    assert fut.reply is not None
    assert "a" not in table


def test_create_reply_message_copies_the_request_properties() -> None:
    request = Message("T", b"ping")
    request.properties.update(
        {"CLUSTER": "Cl", "CORRELATION_ID": "cid", "REPLY_TO_CLIENT": "1.2.3.4@9", "TTL": "3000"}
    )
    reply = create_reply_message(request, "pong")
    assert reply.topic == reply_topic("Cl") == "Cl_REPLY_TOPIC"
    assert reply.body == b"pong"
    assert reply.properties == {
        "MSG_TYPE": "reply",
        "CORRELATION_ID": "cid",
        "REPLY_TO_CLIENT": "1.2.3.4@9",
        "TTL": "3000",
    }


@pytest.mark.parametrize("missing", ["CLUSTER", "CORRELATION_ID", "REPLY_TO_CLIENT"])
def test_create_reply_message_needs_a_received_request(missing: str) -> None:
    request = Message("T", b"ping")
    request.properties.update({"CLUSTER": "Cl", "CORRELATION_ID": "c", "REPLY_TO_CLIENT": "r"})
    del request.properties[missing]
    with pytest.raises(MQClientError, match=rf"property\[{missing}\] is null"):
        create_reply_message(request, b"x")

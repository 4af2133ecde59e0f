"""`RemotingProtocol` without any I/O: bytes in -> commands, requests -> bytes, responses matched
by opaque, deadlines expired against a given clock, the msgpack advert, the peer's requests in
flight."""

from __future__ import annotations

import math

import pytest

from remoting import FrameDecoder, FrameError, RemotingCommand, ResponseCode, SerializeType
from remoting._command import Body
from remoting._protocol import MSGPACK_ADVERT_FIELD, PendingBudget, RemotingProtocol
from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE
from remoting.errors import RemotingTooManyRequestsError


class Waiter:
    def __init__(self) -> None:
        self.done = False


def _proto(**kw: object) -> RemotingProtocol[Waiter]:
    args: dict[str, object] = {"max_frame_size": 1 << 20, "max_inflight": 2, **kw}
    return RemotingProtocol(**args)  # type: ignore[arg-type]


def _bytes(parts: tuple[bytes, Body | None]) -> bytes:
    head, body = parts
    return head if body is None else head + bytes(body)


def test_a_request_becomes_bytes_and_its_response_finds_it() -> None:
    client, server = _proto(), _proto()
    waiter = Waiter()
    cmd = RemotingCommand.request(10, {"a": "1"}, b"body")
    cmd.flag |= FLAG_ONEWAY
    parts = client.start_request(cmd, waiter, long_poll=False)
    assert not cmd.flag & FLAG_ONEWAY
    assert client.waiting == 1
    # The server side decodes it, in pieces.
    data = _bytes(parts)
    assert server.receive_data(data[:5]) == []
    assert server.buffered == 5
    [request] = server.receive_data(data[5:])
    assert (request.code, request.opaque, request.body) == (10, cmd.opaque, b"body")
    answer = _bytes(server.encode_response(request, request.make_response(body=b"ok")))
    [response] = client.receive_data(answer)
    assert response.flag & FLAG_RESPONSE
    assert client.response_for(response) is waiter
    assert client.response_for(response) is None  # late: matched once only
    client.end_request(cmd, waiter, long_poll=False)
    assert client.waiting == 0


def test_bad_bytes_are_a_frame_error() -> None:
    proto = _proto(max_frame_size=64)
    with pytest.raises(FrameError):
        proto.receive_data(b"\x00\x00\x10\x00" + b"\x00" * 8)  # declares 4 KiB


def test_deadlines_expire_against_the_clock_given() -> None:
    proto = _proto()
    waiters = [Waiter() for _ in range(3)]
    cmds = [RemotingCommand.request(10) for _ in waiters]
    for cmd, w in zip(cmds, waiters, strict=True):
        proto.start_request(cmd, w, long_poll=False)
    assert proto.next_deadline == math.inf
    assert proto.set_deadline(waiters[0], 5.0)  # the earliest: re-arm
    assert proto.set_deadline(waiters[1], 2.0)
    assert not proto.set_deadline(waiters[2], 9.0)
    assert proto.expire(1.0) == []
    assert proto.next_deadline == 2.0
    waiters[0].done = True  # answered in time: its entry is dropped, never handed back
    assert proto.expire(6.0) == [waiters[1]]
    assert proto.next_deadline == 9.0
    assert proto.expire(9.0) == [waiters[2]]
    assert proto.next_deadline == math.inf


def test_finished_deadlines_are_compacted_away() -> None:
    proto = _proto()
    for i in range(1000):
        w = Waiter()
        cmd = RemotingCommand.request(10)
        proto.start_request(cmd, w, long_poll=False)
        proto.set_deadline(w, 100.0 + i)
        w.done = True
        proto.end_request(cmd, w, long_poll=False)
    assert len(proto._deadlines) <= 65


def test_the_budget_caps_waiting_requests_and_an_unencodable_one_takes_none() -> None:
    budget = PendingBudget(1)
    proto = _proto(budget=budget)
    first = RemotingCommand.request(10)
    proto.start_request(first, Waiter(), long_poll=False)
    with pytest.raises(RemotingTooManyRequestsError):
        proto.start_request(RemotingCommand.request(10), Waiter(), long_poll=False)
    proto.end_request(first, Waiter(), long_poll=False)  # not the registered waiter: kept
    assert proto.waiting == 1
    assert budget.count == 0
    bad = RemotingCommand.request(10, {"k": "v"})
    bad.ext_fields = {"k": 1}  # type: ignore[dict-item]
    with pytest.raises((ValueError, TypeError)):
        proto.start_request(bad, Waiter(), long_poll=False)
    assert budget.count == 0


def test_fail_all_hands_back_every_waiting_request() -> None:
    proto = _proto()
    waiters = [Waiter() for _ in range(3)]
    for w in waiters:
        proto.start_request(RemotingCommand.request(10), w, long_poll=False)
    assert proto.fail_all() == waiters
    assert proto.waiting == 0


def test_direct_writes_only_with_few_others_in_flight_long_polls_aside() -> None:
    proto = _proto()
    for _ in range(5):  # parked long polls do not count
        proto.start_request(RemotingCommand.request(11), Waiter(), long_poll=True)
    for _ in range(4):
        proto.start_request(RemotingCommand.request(10), Waiter(), long_poll=False)
    assert proto.may_write_directly(long_poll=False)  # 3 others
    proto.start_request(RemotingCommand.request(10), Waiter(), long_poll=False)
    assert not proto.may_write_directly(long_poll=False)  # 4 others


def test_the_client_moves_to_msgpack_when_the_server_advertises_it() -> None:
    client = _proto(serialize_type=SerializeType.JSON, upgrade_to_msgpack=True)
    server = _proto(advertise_msgpack=True)
    cmd = RemotingCommand.request(10, serialize_type=SerializeType.JSON)
    w = Waiter()
    [request] = server.receive_data(_bytes(client.start_request(cmd, w, long_poll=False)))
    answer = server.encode_response(request, request.make_response())
    [response] = client.receive_data(_bytes(answer))
    assert response.ext_fields is not None
    assert MSGPACK_ADVERT_FIELD in response.ext_fields
    assert client.serialize_type == SerializeType.JSON
    assert client.response_for(response) is w
    assert client.serialize_type == SerializeType.MSGPACK


def test_an_unencodable_answer_becomes_system_error() -> None:
    proto = _proto()
    request = RemotingCommand.request(10)
    request.opaque = 9
    bad = request.make_response()
    bad.ext_fields = {"k": 1}  # type: ignore[dict-item]
    try:
        parts = proto.encode_response(request, bad)
    except TypeError:
        pytest.skip("this codec rejects the field type before encoding")
    [answer] = FrameDecoder().feed(_bytes(parts))
    assert (answer.opaque, answer.code) == (9, ResponseCode.SYSTEM_ERROR)


def test_the_peers_requests_in_flight_reach_the_limit() -> None:
    proto = _proto(max_inflight=2)

    def at_limit() -> bool:
        return proto.at_limit

    proto.admit()
    assert not at_limit()
    proto.admit()
    assert at_limit()
    proto.release()
    assert not at_limit()
    assert proto.busy == 1


def test_a_oneway_request_is_flagged_and_numbered() -> None:
    proto, peer = _proto(), _proto()
    cmd = RemotingCommand.request(10)
    [got] = peer.receive_data(_bytes(proto.oneway(cmd)))
    assert got.flag & FLAG_ONEWAY
    assert got.opaque == cmd.opaque
    assert proto.waiting == 0

"""MQClientAPI request building and response mapping, over a scripted transport."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from client._api import MQClientAPI, PullStatus
from client.message import MessageQueue, SendStatus
from common.message import MessageInner, encode_record
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemoteError, RemotingConnectError
from remoting.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from remoting.protocol.route import BrokerData, QueueData, TopicRouteData

Reply = Callable[[str, RemotingCommand], RemotingCommand]


class ScriptedTransport:
    """Answers each request with `reply(addr, cmd)`; records what was sent."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.sent: list[tuple[str, RemotingCommand, int | None]] = []
        self.long_polls: list[bool] = []

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> RemotingCommand:
        self.sent.append((addr, cmd, timeout_ms))
        self.long_polls.append(long_poll)
        return self.reply(addr, cmd)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.sent.append((addr, cmd, None))


def _route() -> TopicRouteData:
    return TopicRouteData(
        queue_datas=[QueueData("b", 4, 4, 6, 0)],
        broker_datas=[BrokerData("C", "b", {0: "192.0.2.1:10911"})],
    )


async def test_route_fails_over_to_the_next_namesrv() -> None:
    def reply(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        if addr == "ns1:9876":
            raise RemotingConnectError("refused")
        assert cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
        assert cmd.ext_fields == {"topic": "T", "acceptStandardJsonOnly": "true"}
        return cmd.make_response(body=_route().to_json())

    t = ScriptedTransport(reply)
    api = MQClientAPI(t, ["ns1:9876", "ns2:9876"])
    route = await api.get_topic_route("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "192.0.2.1:10911"}
    # The working NameServer is remembered.
    await api.get_topic_route("T")
    assert [a for a, _, _ in t.sent] == ["ns1:9876", "ns2:9876", "ns2:9876"]


async def test_route_unknown_topic_is_none() -> None:
    api = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(ResponseCode.TOPIC_NOT_EXIST, "no")),
        ["ns:1"],
    )
    assert await api.get_topic_route("T") is None


def _send_header() -> SendMessageRequestHeader:
    return SendMessageRequestHeader(
        producer_group="pg", topic="T", default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=2, sys_flag=0, born_timestamp=1, flag=0, properties="UNIQ_KEY\x01AB",
        broker_name="b",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ResponseCode.SUCCESS, SendStatus.SEND_OK),
        (ResponseCode.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_DISK_TIMEOUT),
        (ResponseCode.FLUSH_SLAVE_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT),
        (ResponseCode.SLAVE_NOT_AVAILABLE, SendStatus.SLAVE_NOT_AVAILABLE),
    ],
)
async def test_send_status_mapping(code: int, status: SendStatus) -> None:
    def reply(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        assert cmd.code == RequestCode.SEND_MESSAGE_V2
        assert cmd.ext_fields is not None
        assert cmd.ext_fields["b"] == "T"
        assert cmd.ext_fields["e"] == "2"
        assert cmd.body_bytes() == b"hi"
        return cmd.make_response(
            code,
            ext_fields={"msgId": "OFF", "queueId": "2", "queueOffset": "7", "MSG_REGION": "R"},
        )

    t = ScriptedTransport(reply)
    api = MQClientAPI(t, ["ns:1"])
    r = await api.send_message("b:1", "b", _send_header(), b"hi", msg_id="AB", timeout_ms=1234)
    assert r.status is status
    assert (r.msg_id, r.offset_msg_id, r.queue_offset) == ("AB", "OFF", 7)
    assert r.message_queue == MessageQueue("T", "b", 2)
    assert t.sent[0][2] == 1234


async def test_send_error_codes_raise() -> None:
    api = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(ResponseCode.TOPIC_NOT_EXIST, "nope")),
        ["ns:1"],
    )
    with pytest.raises(RemoteError) as info:
        await api.send_message("b:1", "b", _send_header(), b"x", msg_id="", timeout_ms=10)
    assert info.value.code == ResponseCode.TOPIC_NOT_EXIST


def _pull_header() -> PullMessageRequestHeader:
    return PullMessageRequestHeader(
        consumer_group="g", topic="T", queue_id=0, queue_offset=5, max_msg_nums=32, sys_flag=2,
        commit_offset=0, suspend_timeout_millis=15000, sub_version=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ResponseCode.PULL_NOT_FOUND, PullStatus.NO_NEW_MSG),
        (ResponseCode.PULL_RETRY_IMMEDIATELY, PullStatus.NO_MATCHED_MSG),
        (ResponseCode.PULL_OFFSET_MOVED, PullStatus.OFFSET_ILLEGAL),
    ],
)
async def test_pull_status_mapping(code: int, status: PullStatus) -> None:
    fields = {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": "9",
        "minOffset": "0",
        "maxOffset": "9",
    }

    api = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(code, ext_fields=fields)), ["ns:1"]
    )
    r = await api.pull_message("b:1", "b", _pull_header(), 30000)
    assert r.status is status
    assert r.next_begin_offset == 9
    assert r.messages == []


@pytest.mark.parametrize(("sys_flag", "long_poll"), [(2, True), (3, True), (0, False), (1, False)])
async def test_a_suspended_pull_is_a_long_poll_for_the_transport(
    sys_flag: int, long_poll: bool
) -> None:
    fields = {"suggestWhichBrokerId": "0", "nextBeginOffset": "5", "minOffset": "0",
              "maxOffset": "5"}  # fmt: skip
    transport = ScriptedTransport(lambda a, c: c.make_response(ResponseCode.PULL_NOT_FOUND,
                                                               ext_fields=fields))  # fmt: skip
    api = MQClientAPI(transport, ["ns:1"])
    header = _pull_header()
    header.sys_flag = sys_flag
    await api.pull_message("b:1", "b", header, 30000)
    assert transport.long_polls == [long_poll]


async def test_pull_found_decodes_records() -> None:
    recs = b"".join(
        bytes(
            encode_record(
                MessageInner("T", f"m{i}".encode(), properties={"TAGS": "A"}), 5 + i, 100 * i, 1
            )
        )
        for i in range(3)
    )
    fields = {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": "8",
        "minOffset": "0",
        "maxOffset": "8",
    }
    api = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(ext_fields=fields, body=recs)), ["ns:1"]
    )
    r = await api.pull_message("b:1", "broker-x", _pull_header(), 30000)
    assert r.status is PullStatus.FOUND
    assert [m.body for m in r.messages] == [b"m0", b"m1", b"m2"]
    assert [m.queue_offset for m in r.messages] == [5, 6, 7]
    assert {m.broker_name for m in r.messages} == {"broker-x"}
    other = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST, "x")),
        ["ns:1"],
    )
    with pytest.raises(RemoteError):
        await other.pull_message("b:1", "b", _pull_header(), 30000)


async def test_query_offset_not_found_is_minus_one_and_update_is_oneway_when_asked() -> None:
    def reply(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.code == RequestCode.QUERY_CONSUMER_OFFSET:
            if cmd.field("queueId") == "0":
                return cmd.make_response(ResponseCode.QUERY_NOT_FOUND, "none")
            return cmd.make_response(ext_fields={"offset": "42"})
        return cmd.make_response()

    t = ScriptedTransport(reply)
    api = MQClientAPI(t, ["ns:1"])
    assert await api.query_consumer_offset("b:1", "g", MessageQueue("T", "b", 0)) == -1
    assert await api.query_consumer_offset("b:1", "g", MessageQueue("T", "b", 1)) == 42
    await api.update_consumer_offset("b:1", "g", MessageQueue("T", "b", 1), 43, oneway=True)
    _addr, cmd, timeout = t.sent[-1]
    assert timeout is None
    assert cmd.is_oneway
    assert cmd.ext_fields == {
        "consumerGroup": "g", "topic": "T", "queueId": "1", "commitOffset": "43",
    }  # fmt: skip


async def test_consumer_id_list_empty_on_error() -> None:
    api = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(ResponseCode.SYSTEM_ERROR, "no consumer")),
        ["ns:1"],
    )
    assert await api.get_consumer_id_list("b:1", "g") == []
    ok = MQClientAPI(
        ScriptedTransport(lambda a, c: c.make_response(body=b'{"consumerIdList":["a@1","b@2"]}')),
        ["ns:1"],
    )
    assert await ok.get_consumer_id_list("b:1", "g") == ["a@1", "b@2"]

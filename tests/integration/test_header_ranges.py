"""Numbers outside their Java type, and numbers in range that mean nothing, are answered with
a code and a remark by a real broker, which keeps serving.

A header number wider than its Java field (`Integer` int32, `Long` int64) is a HeaderError:
MESSAGE_ILLEGAL for the send family, SYSTEM_ERROR elsewhere, the remark naming the field.
In range but meaningless: PULL with `maxMsgNums` <= 0 or `suspendTimeoutMillis` < 0, an offset
update for a negative queue or to a negative offset (SYSTEM_ERROR). A negative pull offset keeps
RocketMQ's answer: PULL_OFFSET_MOVED to the queue's first offset.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode, SerializeType
from remoting.protocol.headers import PullMessageRequestHeader, send_request_fields_v2
from tests.helpers import json_request
from tests.integration.procs import BrokerProc, NamesrvProc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "RangeT"
GROUP = "range_group"
INT32_UNDER = str(-(2**31) - 1)  # -2147483649, a queueId below int32
INT32_OVER = str(2**31)
INT64_OVER = str(2**63)


def _send(**over: str) -> RemotingCommand:
    fields = send_request_fields_v2(
        "range_producer", TOPIC, "TBW102", "4", 0, 0, 1_700_000_000_000, 0, "", "b"
    )
    fields.update(over)
    return json_request(RequestCode.SEND_MESSAGE_V2, fields, b"payload")


def _pull(**over: str) -> RemotingCommand:
    fields = PullMessageRequestHeader(
        consumer_group=GROUP,
        topic=TOPIC,
        queue_id=0,
        queue_offset=0,
        max_msg_nums=32,
        sys_flag=0x4,  # subscription in the request: no heartbeat needed
        commit_offset=0,
        suspend_timeout_millis=0,
        subscription="*",
        sub_version=1,
    ).to_fields()
    fields.update(over)
    return json_request(RequestCode.PULL_MESSAGE, fields)


def _offset_update(queue_id: str, offset: str) -> RemotingCommand:
    return json_request(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "commitOffset": offset},
    )


# (request, expected code, text the remark must contain)
def _cases() -> list[tuple[str, RemotingCommand, int, str]]:
    illegal, system = ResponseCode.MESSAGE_ILLEGAL, ResponseCode.SYSTEM_ERROR
    q = {"topic": TOPIC}
    return [
        ("send queueId int32-1", _send(e=INT32_UNDER), illegal, "'e'"),
        ("send queueId int32+1", _send(e=INT32_OVER), illegal, "outside int32"),
        ("send flag int32+1", _send(h=INT32_OVER), illegal, "'h'"),
        ("send sysFlag -2^40", _send(f=str(-(2**40))), illegal, "'f'"),
        ("send bornTimestamp 2^63", _send(g=INT64_OVER), illegal, "outside int64"),
        ("send reconsumeTimes 2^31", _send(j=INT32_OVER), illegal, "'j'"),
        ("pull queueId int32-1", _pull(queueId=INT32_UNDER), system, "'queueId'"),
        ("pull maxMsgNums 2^31", _pull(maxMsgNums=INT32_OVER), system, "'maxMsgNums'"),
        ("pull queueOffset 2^63", _pull(queueOffset=INT64_OVER), system, "'queueOffset'"),
        ("pull suspend 2^63", _pull(suspendTimeoutMillis=INT64_OVER), system, "outside int64"),
        ("pull maxMsgNums -1", _pull(maxMsgNums="-1"), system, "maxMsgNums[-1] is illegal"),
        ("pull maxMsgNums 0", _pull(maxMsgNums="0"), system, "maxMsgNums[0] is illegal"),
        (
            "pull maxMsgNums int32 min",
            _pull(maxMsgNums=str(-(2**31))),
            system,
            "maxMsgNums[-2147483648]",
        ),
        (
            "pull suspend -1",
            _pull(suspendTimeoutMillis="-1", sysFlag="6"),
            system,
            "suspendTimeoutMillis[-1] is illegal",
        ),
        ("pull queueId -1", _pull(queueId="-1"), system, "queueId[-1] is illegal"),
        ("offset update queue -1", _offset_update("-1", "0"), system, "queueId[-1] is illegal"),
        ("offset update offset -5", _offset_update("0", "-5"), system, "commitOffset[-5]"),
        ("offset update queue 2^31", _offset_update(INT32_OVER, "0"), system, "'queueId'"),
        (
            "query offset queue int32-1",
            json_request(
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": GROUP, "topic": TOPIC, "queueId": INT32_UNDER},
            ),
            system,
            "'queueId'",
        ),
        (
            "max offset queue int32-1",
            json_request(RequestCode.GET_MAX_OFFSET, {**q, "queueId": INT32_UNDER}),
            system,
            "'queueId'",
        ),
        (
            "search offset timestamp 2^63",
            json_request(
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                {**q, "queueId": "0", "timestamp": INT64_OVER},
            ),
            system,
            "'timestamp'",
        ),
        (
            "view message offset 2^63",
            json_request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": INT64_OVER}),
            system,
            "'offset'",
        ),
        (
            "view message offset -1",
            json_request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "-1"}),
            system,
            "-1",
        ),
    ]


async def test_extreme_numbers_get_a_code_and_the_broker_keeps_serving(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:

        async def call(cmd: RemotingCommand) -> RemotingCommand:
            with trio.fail_after(10):
                return await client.invoke(broker.addr, cmd)

        resp = await call(_send())
        assert resp.code == ResponseCode.SUCCESS, resp
        wrong: list[str] = []
        for name, cmd, code, remark in _cases():
            resp = await call(cmd)
            if resp.code != code or remark not in (resp.remark or ""):
                wrong.append(f"{name}: got {resp.code} {resp.remark!r}, want {code} ~{remark!r}")
        assert wrong == [], "\n".join(wrong)

        # A negative pull offset is RocketMQ's OFFSET_TOO_SMALL: moved to the first offset.
        for offset in ("-1", str(-(2**63))):
            resp = await call(_pull(queueOffset=offset))
            assert resp.code == ResponseCode.PULL_OFFSET_MOVED, (offset, resp)
            assert resp.ext_fields is not None
            assert resp.ext_fields["nextBeginOffset"] == "0"

        # A negative offset piggybacked on a pull is not stored (a valid one is).
        query = json_request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "1"},
        )
        for piggyback, stored in (("3", "3"), ("-7", "3")):
            resp = await call(_pull(queueId="1", sysFlag="5", commitOffset=piggyback))
            assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), resp
            resp = await call(query)
            assert resp.code == ResponseCode.SUCCESS, resp
            assert resp.ext_fields is not None
            assert resp.ext_fields["offset"] == stored, piggyback

        # Still serving: the edges of the types are accepted, a send and a pull work.
        resp = await call(_send(e="-2147483648", g=str(2**63 - 1), h=str(2**31 - 1)))
        assert resp.code == ResponseCode.SUCCESS, resp
        resp = await call(_pull(maxMsgNums=str(2**31 - 1)))
        assert resp.code == ResponseCode.SUCCESS, resp
        resp = await call(_offset_update("0", "1"))
        assert resp.code == ResponseCode.SUCCESS, resp
    assert broker.running
    assert broker.stop() == 0

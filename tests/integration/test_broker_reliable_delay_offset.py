"""GET_ALL_DELAY_OFFSET (45) on a real `mqbroker`: delayOffset.json's table, in standard JSON,
the same after a restart (what the file holds)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import trio

from common.message import encode_properties
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import SendMessageRequestHeader
from tests.helpers import wait_until
from tests.integration.procs import BrokerProc, NamesrvProc

ENV = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(1024 * 1024),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(1000 * 20),
    "TRIMQ_MESSAGE_DELAY_LEVEL": "1s 2s 3s",
}

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def broker(namesrv: NamesrvProc, start_broker: StartBroker) -> BrokerProc:
    return start_broker(namesrv.addr, env=ENV)


def send(topic: str, body: bytes, level: int) -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties({"DELAY": str(level)}),
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, hdr.to_fields_v2(), body)


async def ok(client: RemotingClient, addr: str, cmd: RemotingCommand) -> RemotingCommand:
    resp = await client.invoke(addr, cmd)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


async def delay_offsets(client: RemotingClient, addr: str) -> dict[str, object]:
    resp = await ok(client, addr, RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET))
    data = json.loads(resp.body_bytes())  # standard JSON: quoted level keys
    assert isinstance(data, dict)
    return data


async def delivered(client: RemotingClient, addr: str, n: int) -> bool:
    resp = await client.invoke(
        addr,
        RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "DelayedQ", "queueId": "0"}),
    )
    return resp.code == ResponseCode.SUCCESS and int((resp.ext_fields or {})["offset"]) >= n


async def test_get_all_delay_offset(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        assert await delay_offsets(client, broker.addr) == {"offsetTable": {}}
        for body, level in ((b"a", 1), (b"b", 1), (b"c", 3), (b"d", 9)):  # 9: clamped to 3
            await ok(client, broker.addr, send("DelayedQ", body, level))
        await wait_until(
            lambda: delivered(client, broker.addr, 4), total=20, what="the delayed messages"
        )
        expected: dict[str, object] = {"offsetTable": {"1": 2, "3": 2}}
        await wait_until(
            lambda: _equals(client, broker.addr, expected), total=10, what="offsets advanced"
        )
        await trio.to_thread.run_sync(broker.restart)
        assert await delay_offsets(client, broker.addr) == expected


async def _equals(client: RemotingClient, addr: str, expected: dict[str, object]) -> bool:
    return await delay_offsets(client, addr) == expected

"""PULL_MESSAGE's piggybacked commit offset is stored when the pull arrives, not after its
long-poll wait (RocketMQ behaviour): a parked pull must not overwrite a newer offset."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import trio

from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import (
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    SendMessageRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tests.integration.procs import BrokerProc, NamesrvProc

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


def _send(topic: str, body: bytes) -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=1,
        queue_id=0,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=None,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, hdr.to_fields_v2(), body)


async def _query(client: RemotingClient, addr: str, group: str, topic: str) -> int:
    hdr = QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=0)
    resp = await client.invoke(
        addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, hdr.to_fields())
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int((resp.ext_fields or {})["offset"])


@pytest.mark.slow
async def test_parked_pull_does_not_overwrite_a_newer_offset(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr)
    topic, group = "PullCommitT", "PullCommitCG"
    async with RemotingClient() as old_owner, RemotingClient() as new_owner:
        for i in range(3):
            resp = await old_owner.invoke(broker.addr, _send(topic, b"m%d" % i))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        # The old owner's pull at the end of the queue, carrying commit offset 1, parks.
        pull = PullMessageRequestHeader(
            consumer_group=group,
            topic=topic,
            queue_id=0,
            queue_offset=3,
            max_msg_nums=32,
            sys_flag=FLAG_COMMIT_OFFSET | FLAG_SUSPEND | FLAG_SUBSCRIPTION,
            commit_offset=1,
            suspend_timeout_millis=2000,
            subscription="*",
            sub_version=0,
        )
        answered: list[RemotingCommand] = []

        async def parked_pull() -> None:
            cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, pull.to_fields())
            answered.append(await old_owner.invoke(broker.addr, cmd, 10_000))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(parked_pull)
            # The commit happens on arrival: visible while the pull is still parked.
            deadline = trio.current_time() + 5
            while await _query(new_owner, broker.addr, group, topic) != 1:
                assert trio.current_time() < deadline, "commit offset not stored on arrival"
                await trio.sleep(0.02)
            assert not answered
            # Meanwhile the queue moved to a new owner, which stores offset 3.
            upd = UpdateConsumerOffsetRequestHeader(
                consumer_group=group, topic=topic, queue_id=0, commit_offset=3
            )
            resp = await new_owner.invoke(
                broker.addr,
                RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, upd.to_fields()),
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert len(answered) == 1
        assert answered[0].code == ResponseCode.PULL_NOT_FOUND
        # The parked pull ended (timeout) without storing its stale offset again.
        assert await _query(new_owner, broker.addr, group, topic) == 3

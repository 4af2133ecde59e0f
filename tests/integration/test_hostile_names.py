"""Names and counts a stranger controls cannot reach outside the store or hang the broker:
group names are checked where they enter, the store refuses any
name that is not one plain file name, and queue counts are bounded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode, SerializeType
from remoting.protocol.bodies import (
    ConsumerData,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
    SubscriptionGroupConfig,
)
from tests.helpers import json_request
from tests.integration.procs import BrokerProc, NamesrvProc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# From <store>/consumequeue/%RETRY%<group>, four levels up is the broker's work directory.
ESCAPE = "/../../../escaped"


def _heartbeat(group: str, producer: str = "okProducer") -> RemotingCommand:
    data = HeartbeatData(
        "hostile@1",
        producer_data_set=[ProducerData(producer)],
        consumer_data_set=[ConsumerData(group, subscription_data_set=[SubscriptionData("T")])],
    )
    return json_request(RequestCode.HEART_BEAT, None, data.to_json())


def _outside(workdir: Path, store: Path) -> list[Path]:
    """Files and directories of the work directory that are not the store's or the log's."""
    return [p for p in workdir.rglob("*") if store not in (p, *p.parents) and p.suffix != ".log"]


async def test_group_names_cannot_leave_the_store(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        for group, producer in [
            (ESCAPE, "okProducer"),
            ("ok_group", ESCAPE),
            ("..", "okProducer"),
            ("g" * 249, "okProducer"),
            ("a@b", "okProducer"),
        ]:
            resp = await client.invoke(broker.addr, _heartbeat(group, producer))
            assert resp.code == ResponseCode.SYSTEM_ERROR, (group, resp)
            assert resp.remark is not None
            assert "heartbeat refused" in resp.remark

        bad_group = SubscriptionGroupConfig(ESCAPE)
        resp = await client.invoke(
            broker.addr,
            json_request(
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, bad_group.to_json()
            ),
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "outside" in (resp.remark or "")

        for fields in (
            {"consumerGroup": ESCAPE, "topic": "T", "queueId": "0", "commitOffset": "1"},
            {"consumerGroup": "g", "topic": "a@b", "queueId": "0", "commitOffset": "1"},
        ):
            resp = await client.invoke(
                broker.addr, json_request(RequestCode.UPDATE_CONSUMER_OFFSET, fields)
            )
            assert resp.code == ResponseCode.SYSTEM_ERROR, fields

        # A valid group still works, and gets its retry topic.
        resp = await client.invoke(broker.addr, _heartbeat("good_group"))
        assert resp.code == ResponseCode.SUCCESS
        await trio.sleep(0.5)  # the retry topic's queue files are made in the background
    assert _outside(broker.workdir, broker.store_dir) == []
    assert (broker.store_dir / "consumequeue" / "%RETRY%good_group").is_dir()


async def test_queue_counts_are_bounded_and_sigterm_still_stops_the_broker(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr, env={"TRIMQ_MAX_TOPIC_QUEUE_NUMS": "64"})
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        huge = SubscriptionGroupConfig("amplified", retry_queue_nums=10**9)
        resp = await client.invoke(
            broker.addr,
            json_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, huge.to_json()),
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "retryQueueNums 1000000000 must be between 0 and 64" in (resp.remark or "")
        resp = await client.invoke(
            broker.addr,
            json_request(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {"topic": "Wide", "readQueueNums": "65", "writeQueueNums": "65", "perm": "6",
                 "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"},
            ),
        )  # fmt: skip
        assert resp.code == ResponseCode.SYSTEM_ERROR
        # The largest allowed still works, and the broker answers at once afterwards.
        ok = SubscriptionGroupConfig("wide_ok", retry_queue_nums=64)
        resp = await client.invoke(
            broker.addr,
            json_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, ok.to_json()),
        )
        assert resp.code == ResponseCode.SUCCESS
        resp = await client.invoke(broker.addr, _heartbeat("wide_ok"))
        assert resp.code == ResponseCode.SUCCESS
        with trio.fail_after(5):
            resp = await client.invoke(broker.addr, _heartbeat("another_ok"))
        assert resp.code == ResponseCode.SUCCESS
        await trio.sleep(1)
    queues = list((broker.store_dir / "consumequeue" / "%RETRY%wide_ok").iterdir())
    assert len(queues) == 64
    assert broker.stop() == 0  # SIGTERM, not the SIGKILL that follows a hang

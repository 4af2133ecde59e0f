"""Consumers with an SQL92 subscription ask the topic's brokers (CHECK_CLIENT_CONFIG, 46) at
start, as RocketMQ's checkClientInBroker: a broker without `enable_property_filter` or a bad
expression fails the start with the broker's code and remark; a good one starts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from client import (
    ConsumeStatus,
    MessageExt,
    MessageSelector,
    MQClientError,
    PullConsumer,
    PushConsumer,
)
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

StartBroker = Callable[..., BrokerProc]


async def _listener(msgs: list[MessageExt]) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


async def test_filter_off_fails_the_start(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")  # enable_property_filter off (the default)
    await create_topic(namesrv.addr, "SqlChk", queues=1)
    cfg = fast_config(namesrv.addr)
    push = PushConsumer("sql-chk-push", cfg, listener=_listener)
    push.subscribe("SqlChk", MessageSelector.by_sql("a > 5"))
    with pytest.raises(MQClientError) as info:
        async with push:
            pass
    text = str(info.value)
    assert "broker-a" in text
    assert "sql-chk-push" in text
    assert "CODE 1" in text
    assert "does not support consumer to filter message by SQL92" in text
    # A tag subscription needs no check.
    tags = PushConsumer("sql-chk-tags", cfg, listener=_listener)
    tags.subscribe("SqlChk", "TagA || TagB")
    async with tags:
        pass


async def test_bad_expression_fails_the_start_and_a_good_one_starts(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr, name="broker-a", env={"TRIMQ_ENABLE_PROPERTY_FILTER": "true"})
    await create_topic(namesrv.addr, "SqlChk2", queues=1)
    cfg = fast_config(namesrv.addr)
    lite = PullConsumer("sql-chk-lite", cfg)
    lite.subscribe("SqlChk2", MessageSelector.by_sql("a > AND b"))
    with pytest.raises(MQClientError, match=r"CODE 23: .*column"):
        async with lite:
            pass
    push = PushConsumer("sql-chk-bad", cfg, listener=_listener)
    push.subscribe("SqlChk2", MessageSelector.by_sql("region IN ('eu'"))
    with pytest.raises(MQClientError, match="CODE 23"):
        async with push:
            pass
    good = PushConsumer("sql-chk-good", cfg, listener=_listener)
    good.subscribe("SqlChk2", MessageSelector.by_sql("a > 5 AND region IN ('eu', 'us')"))
    async with good:
        assert good.subscriptions["SqlChk2"].expression_type == "SQL92"
    # The failed starts left nothing registered: the same groups start once fixed.
    again = PullConsumer("sql-chk-lite", cfg)
    again.subscribe("SqlChk2", MessageSelector.by_sql("a > 5"))
    async with again:
        pass

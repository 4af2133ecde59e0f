"""SQL92 property filters end to end: the broker's pull path (in-process broker),
CHECK_CLIENT_CONFIG, the filter-off error, and trimq's own consumers subscribing with
`MessageSelector.by_sql`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.filter import SQL92_NOT_SUPPORTED
from client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageSelector,
    Producer,
    PullConsumer,
    PushConsumer,
)
from common.message import decode_records
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader
from tests.helpers import free_port, wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_broker_process import (
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    send_request,
)

pytestmark = pytest.mark.usefixtures("staging_guard")

EXPR = "a > 5 AND region IN ('eu', 'us')"


def config(tmp_path: Path, *, enabled: bool = True) -> BrokerConfig:
    return BrokerConfig(
        listen=f"127.0.0.1:{free_port()}",
        store_dir=str(tmp_path / "store"),
        mapped_file_size_commitlog=1024 * 1024,
        mapped_file_size_consume_queue=20_000,
        enable_property_filter=enabled,
        metrics_listen="",
    )


def sql_pull(
    topic: str, offset: int, expr: str, *, suspend_ms: int = 0, max_msgs: int = 32
) -> RemotingCommand:
    hdr = PullMessageRequestHeader(
        consumer_group="CG",
        topic=topic,
        queue_id=0,
        queue_offset=offset,
        max_msg_nums=max_msgs,
        sys_flag=PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend_ms else 0),
        commit_offset=0,
        suspend_timeout_millis=suspend_ms,
        subscription=expr,
        sub_version=1,
        expression_type="SQL92",
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr.to_fields())


def props_of(i: int) -> dict[str, str]:
    """Message i: a = i, region cycling eu / us / ap; matches EXPR when i > 5 and not ap."""
    return {"a": str(i), "region": ("eu", "us", "ap")[i % 3]}


def matching(indexes: range) -> list[int]:
    return [i for i in indexes if i > 5 and i % 3 != 2]


async def send_mixed(client: RemotingClient, addr: str, topic: str, n: int) -> None:
    for i in range(n):
        resp = await client.invoke(
            addr, send_request(topic, b"m%d" % i, tags="T", props=props_of(i))
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark


def bodies(resp: RemotingCommand) -> list[int]:
    return [int(m.body[1:]) for m in decode_records(resp.body_bytes()) if m.body]


async def test_pull_returns_only_matching_records_and_moves_past_the_rest(
    tmp_path: Path,
) -> None:
    async with BrokerController(config(tmp_path)) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            await send_mixed(client, addr, "SqlT", 20)
            resp = await client.invoke(addr, sql_pull("SqlT", 0, EXPR))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert bodies(resp) == matching(range(20))
            hdr = PullMessageResponseHeader.from_fields(resp.ext_fields)
            assert hdr.next_begin_offset == 20
            # TAGS and KEYS are properties too; nothing matches: advanced past all, retry.
            resp = await client.invoke(addr, sql_pull("SqlT", 0, "TAGS = 'other'"))
            assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert resp.remark == "NO_MATCHED_MESSAGE"
            assert PullMessageResponseHeader.from_fields(resp.ext_fields).next_begin_offset == 20
            resp = await client.invoke(addr, sql_pull("SqlT", 0, "TAGS = 'T' AND a < 2"))
            assert bodies(resp) == [0, 1]


async def test_long_poll_skips_non_matching_arrivals_and_wakes_for_a_match(
    tmp_path: Path,
) -> None:
    async with BrokerController(config(tmp_path)) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            got: list[RemotingCommand] = []

            async def park() -> None:
                got.append(
                    await client.invoke(
                        addr,
                        sql_pull("SqlLP", 1, "a = 'hit'", suspend_ms=15_000),
                        30_000,
                        long_poll=True,
                    )
                )

            await client.invoke(addr, send_request("SqlLP", b"m0", props={"a": "miss"}))
            # Parked at the queue's end (offset 1): the three misses arrive, wake it, and are
            # moved past inside the broker; the hit answers it.
            async with trio.open_nursery() as n:
                n.start_soon(park)
                await trio.sleep(0.2)
                for _ in range(3):
                    await client.invoke(addr, send_request("SqlLP", b"x", props={"a": "miss"}))
                assert not got
                await client.invoke(addr, send_request("SqlLP", b"m9", props={"a": "hit"}))
            resp = got[0]
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert bodies(resp) == [9]
            assert PullMessageResponseHeader.from_fields(resp.ext_fields).next_begin_offset == 5


async def test_bad_expression_and_filter_off(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path)) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            await send_mixed(client, addr, "SqlBad", 1)
            resp = await client.invoke(addr, sql_pull("SqlBad", 0, "a > AND"))
            assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "column 5: expected" in (resp.remark or "")
            resp = await client.invoke(addr, check_client_config("SqlBad", "a >"))
            assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "column 4" in (resp.remark or "")
            resp = await client.invoke(addr, check_client_config("SqlBad", EXPR))
            assert resp.code == ResponseCode.SUCCESS
            deep = "(" * 10_000
            resp = await client.invoke(addr, check_client_config("SqlBad", deep))
            assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    async with BrokerController(config(tmp_path / "off", enabled=False)) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            await send_mixed(client, addr, "SqlOff", 1)
            for req in (sql_pull("SqlOff", 0, EXPR), check_client_config("SqlOff", EXPR)):
                resp = await client.invoke(addr, req)
                assert resp.code == ResponseCode.SYSTEM_ERROR
                assert resp.remark == SQL92_NOT_SUPPORTED
            resp = await client.invoke(addr, check_client_config("SqlOff", "TagA", "TAG"))
            assert resp.code == ResponseCode.SUCCESS


def check_client_config(topic: str, expr: str, kind: str = "SQL92") -> RemotingCommand:
    body = {
        "clientId": "127.0.0.1@test",
        "group": "CG",
        "subscriptionData": {
            "topic": topic,
            "subString": expr,
            "expressionType": kind,
            "subVersion": 1,
            "tagsSet": [],
            "codeSet": [],
            "classFilterMode": False,
        },
    }
    return RemotingCommand.request(
        RequestCode.CHECK_CLIENT_CONFIG, {}, body=json.dumps(body).encode()
    )


StartBroker = Callable[..., BrokerProc]


async def test_consumers_subscribed_by_sql_receive_exactly_the_matching_messages(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    start_broker(namesrv.addr, name="broker-a", env={"TRIMQ_ENABLE_PROPERTY_FILTER": "true"})
    await create_topic(namesrv.addr, "SqlC", queues=2)
    cfg = fast_config(namesrv.addr)
    n = 30
    async with Producer("sqlpg", cfg) as p:
        for i in range(n):
            msg = Message("SqlC", f"m{i}".encode(), tags="T", keys=f"k{i}")
            for k, v in props_of(i).items():
                msg.put_user_property(k, v)
            await p.send(msg)
    want = {f"m{i}" for i in matching(range(n))}
    pushed: set[str] = set()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        pushed.update(m.body.decode() for m in msgs if m.body is not None)
        return ConsumeStatus.CONSUME_SUCCESS

    push = PushConsumer(
        "sqlcg1",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    push.subscribe("SqlC", MessageSelector.by_sql(EXPR))
    async with push:
        await wait_until(lambda: len(pushed) >= len(want), total=20, what="matching messages")
        await trio.sleep(0.5)  # nothing else arrives
    assert pushed == want
    async with PullConsumer(
        "sqlcg2", cfg, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ) as c:
        c.subscribe("SqlC", MessageSelector.by_sql("KEYS = 'k7' OR region = 'ap'"))
        pulled: list[str] = []
        with trio.move_on_after(10):
            while len(pulled) < 11:
                pulled.extend(m.body.decode() for m in await c.poll(timeout_ms=500) if m.body)
    assert sorted(pulled) == sorted(["m7", *(f"m{i}" for i in range(n) if i % 3 == 2)])

"""Reliability on a real `mqbroker`, driven by a bare RemotingClient: delay levels, exact delivery
times, send-back to retry/DLQ, transactions with check-back, queue locks; restarts mid-way."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import pytest
import trio

from common.message import MessageExt, decode_offset_msg_id, decode_records, encode_properties
from remoting import Connection, RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.bodies import (
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    ProducerData,
    UnlockBatchRequestBody,
)
from remoting.protocol.headers import (
    CheckTransactionStateRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from tests.helpers import wait_until
from tests.integration.procs import BrokerProc, NamesrvProc

ENV = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(1024 * 1024),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(1000 * 20),
    "TRIMQ_CONSUMER_OFFSET_PERSIST_INTERVAL_MS": "500",
    "TRIMQ_MESSAGE_DELAY_LEVEL": "1s 2s 3s",
    "TRIMQ_TRANSACTION_CHECK_INTERVAL_MS": "500",
    "TRIMQ_TRANSACTION_TIMEOUT_MS": "1000",
    "TRIMQ_TRANSACTION_CHECK_MAX": "3",
}
PULL_SUBSCRIPTION = 0x4
PREPARED = 0x4
COMMIT = 8
ROLLBACK = 12

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def broker(namesrv: NamesrvProc, start_broker: StartBroker) -> BrokerProc:
    return start_broker(namesrv.addr, env=ENV)


def now_ms() -> int:
    return int(time.time() * 1000)


def send(
    topic: str,
    body: bytes,
    *,
    queue_id: int = 0,
    props: dict[str, str] | None = None,
    sys_flag: int = 0,
    group: str = "PG",
) -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group=group,
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=now_ms(),
        flag=0,
        properties=encode_properties(props) if props else None,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, hdr.to_fields_v2(), body)


def pull(topic: str, offset: int, queue_id: int = 0, group: str = "CG") -> RemotingCommand:
    hdr = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=PULL_SUBSCRIPTION,
        commit_offset=0,
        suspend_timeout_millis=0,
        subscription="*",
        sub_version=0,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr.to_fields())


async def ok(client: RemotingClient, addr: str, cmd: RemotingCommand) -> RemotingCommand:
    resp = await client.invoke(addr, cmd)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


async def pull_all(
    client: RemotingClient, addr: str, topic: str, queue_id: int = 0
) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = 0
    while True:
        resp = await client.invoke(addr, pull(topic, offset, queue_id))
        if resp.code != ResponseCode.SUCCESS:
            return out
        out.extend(decode_records(resp.body_bytes()))
        offset = int((resp.ext_fields or {})["nextBeginOffset"])


async def max_offset(client: RemotingClient, addr: str, topic: str, qid: int = 0) -> int:
    resp = await ok(
        client,
        addr,
        RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(qid)}),
    )
    return int((resp.ext_fields or {})["offset"])


async def restart(broker: BrokerProc, *, kill: bool = False) -> None:
    await trio.to_thread.run_sync(lambda: broker.restart(kill=kill))


# -- delay levels and exact times --------------------------------------------------------------
@pytest.mark.slow
async def test_delay_levels_on_time_and_across_a_restart(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        sent_at: dict[bytes, tuple[int, int]] = {}
        for level in (1, 2, 3, 9):
            body = f"L{level}".encode()
            await ok(
                client, broker.addr, send("Delayed", body, queue_id=1, props={"DELAY": str(level)})
            )
            sent_at[body] = (now_ms(), min(level, 3))
        # Not visible before its time.
        assert await pull_all(client, broker.addr, "Delayed", 1) == []
        await wait_until(
            lambda: _count(client, broker.addr, "Delayed", 1, 4), total=15, what="delivery"
        )
        got = await pull_all(client, broker.addr, "Delayed", 1)
        assert sorted(m.body or b"" for m in got) == sorted(sent_at)
        for m in got:
            born, level = m.born_timestamp, sent_at[m.body or b""][1]
            assert m.store_timestamp >= born + level * 1000, "delivered early"
            assert m.store_timestamp < born + level * 1000 + 1500, "delivered late"
            assert "REAL_TOPIC" not in m.properties
            assert "DELAY" not in m.properties
        # Restart mid-delay: stopped 1 s into a 3 s delay.
        await ok(client, broker.addr, send("Delayed2", b"across", props={"DELAY": "3"}))
        await trio.sleep(1)
        await restart(broker)
        await wait_until(
            lambda: _count(client, broker.addr, "Delayed2", 0, 1), total=15, what="after restart"
        )
        await trio.sleep(1.5)
        got = await pull_all(client, broker.addr, "Delayed2")
        assert [m.body for m in got] == [b"across"]


async def _count(client: RemotingClient, addr: str, topic: str, qid: int, n: int) -> bool:
    try:
        return await max_offset(client, addr, topic, qid) >= n
    except AssertionError:
        return False


@pytest.mark.slow
async def test_exact_delivery_time_not_early_and_within_tolerance(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        base = now_ms()
        dues = {b"t-late": base + 2500, b"t-early": base + 1200, b"t-mid": base + 1800}
        for body, due in dues.items():
            await ok(client, broker.addr, send("Timed", body, props={"TIMER_DELIVER_MS": str(due)}))
        onsgo = base + 1500
        await ok(
            client, broker.addr, send("Timed", b"t-ons", props={"__STARTDELIVERTIME": str(onsgo)})
        )
        dues[b"t-ons"] = onsgo
        # Too far ahead: refused.
        resp = await client.invoke(
            broker.addr,
            send("Timed", b"x", props={"TIMER_DELIVER_MS": str(base + 8 * 24 * 3_600_000)}),
        )
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        await wait_until(
            lambda: _count(client, broker.addr, "Timed", 0, 4), total=15, what="timed delivery"
        )
        got = await pull_all(client, broker.addr, "Timed")
        assert [m.body for m in got] == sorted(dues, key=lambda b: dues[b])
        lateness = [m.store_timestamp - dues[m.body or b""] for m in got]
        print(f"exact delivery lateness ms: {lateness}")
        assert all(0 <= late < 1000 for late in lateness), lateness
        assert all("TIMER_DELIVER_MS" not in m.properties for m in got)


@pytest.mark.slow
async def test_exact_delivery_survives_kill(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        base = now_ms()
        for i, d in enumerate((600, 5000, 900, 5500)):
            props = {"TIMER_DELIVER_MS": str(base + d)}
            await ok(client, broker.addr, send("TimedK", f"k{i}".encode(), props=props))
        await wait_until(lambda: _count(client, broker.addr, "TimedK", 0, 2), what="first two")
        await trio.sleep(0.5)  # the marks are written right after each batch
        await restart(broker, kill=True)
        await wait_until(
            lambda: _count(client, broker.addr, "TimedK", 0, 4), total=20, what="the rest"
        )
        await trio.sleep(1)
        got = await pull_all(client, broker.addr, "TimedK")
        assert sorted(m.body or b"" for m in got) == [b"k0", b"k1", b"k2", b"k3"]


# -- retry and DLQ -----------------------------------------------------------------------------
def send_back(offset: int, delay_level: int, max_times: int | None = None) -> RemotingCommand:
    hdr = ConsumerSendMsgBackRequestHeader(
        offset=offset, group="CG", delay_level=delay_level, max_reconsume_times=max_times
    )
    return RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, hdr.to_fields())


@pytest.mark.slow
async def test_send_back_retries_then_dead_letters(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        await ok(client, broker.addr, send("Work", b"job", props={"UNIQ_KEY": "U1", "KEYS": "k"}))
        (first,) = await pull_all(client, broker.addr, "Work")
        current = first
        seen = []
        for attempt in (1, 2):
            await ok(client, broker.addr, send_back(current.commit_log_offset, 1, max_times=2))
            await wait_until(
                functools.partial(_count, client, broker.addr, "%RETRY%CG", 0, attempt),
                total=10,
                what=f"retry {attempt}",
            )
            current = (await pull_all(client, broker.addr, "%RETRY%CG"))[-1]
            seen.append(current)
        assert [m.reconsume_times for m in seen] == [1, 2]
        for m in seen:
            assert m.body == b"job"
            assert m.properties["RETRY_TOPIC"] == "Work"
            assert m.properties["ORIGIN_MESSAGE_ID"] == first.msg_id
            assert m.uniq_key == "U1"
        # Past max reconsume times (2 from the header): the DLQ, at once.
        await ok(client, broker.addr, send_back(current.commit_log_offset, 0, max_times=2))
        assert await max_offset(client, broker.addr, "%DLQ%CG") == 1
        # A negative level goes straight to the DLQ.
        await ok(client, broker.addr, send_back(first.commit_log_offset, -1))
        assert await max_offset(client, broker.addr, "%DLQ%CG") == 2
        # DLQ is write-only: pulls are refused until an operator updates the perm.
        resp = await client.invoke(broker.addr, pull("%DLQ%CG", 0))
        assert resp.code == ResponseCode.NO_PERMISSION
        # Delay level 0 = 3 + reconsume times (clamped to the 3 s level here) -> not at once.
        await ok(client, broker.addr, send_back(first.commit_log_offset, 0))
        await trio.sleep(1.5)
        assert await max_offset(client, broker.addr, "%RETRY%CG") == 2
        await wait_until(lambda: _count(client, broker.addr, "%RETRY%CG", 0, 3), what="level 3")
        # Unknown offset.
        resp = await client.invoke(broker.addr, send_back(10**12, 1))
        assert resp.code == ResponseCode.SYSTEM_ERROR


@pytest.mark.slow
async def test_send_back_survives_restart(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        await ok(client, broker.addr, send("Work2", b"job"))
        (msg,) = await pull_all(client, broker.addr, "Work2")
        await ok(client, broker.addr, send_back(msg.commit_log_offset, 2))
        await restart(broker, kill=True)
        await wait_until(
            lambda: _count(client, broker.addr, "%RETRY%CG", 0, 1), total=15, what="retry"
        )
        resp = await client.invoke(broker.addr, pull("%RETRY%CG", 0))
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        (retry,) = decode_records(resp.body_bytes())
        assert retry.reconsume_times == 1


# -- transactions ------------------------------------------------------------------------------
def end_tx(
    half: dict[str, str], kind: int, group: str = "PG", *, check: bool = False
) -> RemotingCommand:
    _, phy = decode_offset_msg_id(half["msgId"])
    hdr = EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=int(half["queueOffset"]),
        commit_log_offset=phy,
        commit_or_rollback=kind,
        from_transaction_check=check,
        msg_id=half.get("uniq", "U"),
    )
    return RemotingCommand.request(RequestCode.END_TRANSACTION, hdr.to_fields())


async def send_half(
    client: RemotingClient, addr: str, topic: str, body: bytes, group: str = "PG"
) -> dict[str, str]:
    props = {"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": f"U-{body.decode()}"}
    resp = await ok(client, addr, send(topic, body, props=props, sys_flag=PREPARED, group=group))
    return dict(resp.ext_fields or {})


async def test_commit_and_rollback(broker: BrokerProc) -> None:
    async with RemotingClient() as client:
        a = await send_half(client, broker.addr, "TxT", b"a")
        b = await send_half(client, broker.addr, "TxT", b"b")
        assert await pull_all(client, broker.addr, "TxT") == []
        for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"):
            resp = await client.invoke(broker.addr, pull(topic, 0))
            assert resp.code == ResponseCode.NO_PERMISSION
        # Wrong producer group.
        resp = await client.invoke(broker.addr, end_tx(a, COMMIT, group="Other"))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        await ok(client, broker.addr, end_tx(a, COMMIT))
        await ok(client, broker.addr, end_tx(b, ROLLBACK))
        await ok(client, broker.addr, end_tx(a, COMMIT))  # repeated: no second copy
        # Oneway, as real producers send it: no answer, still applied.
        c = await send_half(client, broker.addr, "TxT", b"c")
        oneway = end_tx(c, COMMIT)
        oneway.flag |= 2
        await client.invoke_oneway(broker.addr, oneway)
        await wait_until(lambda: _count(client, broker.addr, "TxT", 0, 2), what="oneway commit")
        got = await pull_all(client, broker.addr, "TxT")
        assert [m.body for m in got] == [b"a", b"c"]
        assert all("TRAN_MSG" not in m.properties for m in got)
        assert all(m.sys_flag & 0xC == COMMIT for m in got)


class Checker:
    """A producer connection answering CHECK_TRANSACTION_STATE with a fixed verdict."""

    def __init__(self, client: RemotingClient, addr: str, group: str, verdict: int) -> None:
        self.client = client
        self.addr = addr
        self.group = group
        self.verdict = verdict
        self.checks: list[CheckTransactionStateRequestHeader] = []
        client.processors.register(RequestCode.CHECK_TRANSACTION_STATE, self.on_check)

    async def heartbeat(self) -> None:
        hb = HeartbeatData(f"127.0.0.1@{self.group}", [ProducerData(self.group)], [])
        await ok(
            self.client,
            self.addr,
            RemotingCommand.request(RequestCode.HEART_BEAT, None, hb.to_json()),
        )

    async def on_check(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        hdr = CheckTransactionStateRequestHeader.from_fields(cmd.ext_fields)
        self.checks.append(hdr)
        (msg,) = decode_records(cmd.body_bytes())
        assert msg.properties["PGROUP"] == self.group
        end = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=hdr.tran_state_table_offset,
            commit_log_offset=hdr.commit_log_offset,
            commit_or_rollback=self.verdict,
            from_transaction_check=True,
            msg_id=hdr.msg_id or "",
            transaction_id=hdr.transaction_id,
        )
        await conn.invoke_oneway(
            RemotingCommand.request(RequestCode.END_TRANSACTION, end.to_fields())
        )
        return None


@pytest.mark.slow
async def test_check_back_commit_unknown_and_restart(broker: BrokerProc) -> None:
    async with RemotingClient() as producer, RemotingClient() as client:
        # A producer that "crashed" before END_TRANSACTION: the checker of its group commits.
        committer = Checker(producer, broker.addr, "PGC", COMMIT)
        await send_half(client, broker.addr, "TxC", b"crashed", group="PGC")
        await committer.heartbeat()
        await wait_until(lambda: _count(client, broker.addr, "TxC", 0, 1), total=15, what="commit")
        got = await pull_all(client, broker.addr, "TxC")
        assert [m.body for m in got] == [b"crashed"]
        assert committer.checks
        assert committer.checks[0].transaction_id == "U-crashed"
    async with RemotingClient() as producer, RemotingClient() as client:
        # UNKNOWN every time: checked up to the limit (3), then TRANS_CHECK_MAX_TIME_TOPIC.
        unsure = Checker(producer, broker.addr, "PGU", 0)
        await send_half(client, broker.addr, "TxU", b"unsure", group="PGU")
        await unsure.heartbeat()
        await wait_until(
            lambda: _count(client, broker.addr, "TRANS_CHECK_MAX_TIME_TOPIC", 0, 1),
            total=20,
            what="given up",
        )
        assert len(unsure.checks) == 3
        assert await max_offset(client, broker.addr, "TxU") == 0
    async with RemotingClient() as client:
        # Restart between the half message and the check: the check still happens after.
        await send_half(client, broker.addr, "TxR", b"restart", group="PGR")
        await restart(broker)
    async with RemotingClient() as producer, RemotingClient() as client:
        roller = Checker(producer, broker.addr, "PGR", ROLLBACK)
        await roller.heartbeat()
        await wait_until(lambda: len(roller.checks) >= 1, total=15, what="check after restart")
        await trio.sleep(2)
        assert len(roller.checks) == 1  # rolled back: not asked again
        assert await max_offset(client, broker.addr, "TxR") == 0
        # Progress survived: the earlier transactions are not checked again.
        assert await max_offset(client, broker.addr, "TxC") == 1


# -- queue locks -------------------------------------------------------------------------------
async def test_queue_locks_exclusive_across_clients(broker: BrokerProc) -> None:
    mqs = [MessageQueue("LockT", "broker-a", i) for i in range(3)]

    def lock(client_id: str, qs: list[MessageQueue]) -> RemotingCommand:
        body = LockBatchRequestBody("OG", client_id, qs).to_json()
        return RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, None, body)

    async with RemotingClient() as c1, RemotingClient() as c2:
        r1 = await ok(c1, broker.addr, lock("c1", mqs[:2]))
        assert LockBatchResponseBody.from_json(r1.body_bytes()).lock_ok_mq_set == mqs[:2]
        r2 = await ok(c2, broker.addr, lock("c2", mqs))
        assert LockBatchResponseBody.from_json(r2.body_bytes()).lock_ok_mq_set == [mqs[2]]
        unlock = UnlockBatchRequestBody("OG", "c1", [mqs[0]]).to_json()
        await ok(
            c1, broker.addr, RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, None, unlock)
        )
        r2 = await ok(c2, broker.addr, lock("c2", mqs))
        assert LockBatchResponseBody.from_json(r2.body_bytes()).lock_ok_mq_set == [mqs[0], mqs[2]]
        r1 = await ok(c1, broker.addr, lock("c1", mqs))  # renewal of what it still holds
        assert LockBatchResponseBody.from_json(r1.body_bytes()).lock_ok_mq_set == [mqs[1]]

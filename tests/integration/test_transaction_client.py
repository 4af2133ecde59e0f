"""TransactionProducer on real processes: commit / rollback, a producer process that dies
before END_TRANSACTION (another producer of its group answers the check-back), UNKNOWN
re-checked up to the limit, and half / op messages never reaching consumers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from client import (
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    PushConsumer,
    TransactionProducer,
)
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

ENV = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(1024 * 1024),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(1000 * 20),
    "TRIMQ_TRANSACTION_CHECK_INTERVAL_MS": "500",
    "TRIMQ_TRANSACTION_TIMEOUT_MS": "1000",
    "TRIMQ_TRANSACTION_CHECK_MAX": "3",
}
REPO = Path(__file__).resolve().parents[2]

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def broker(namesrv: NamesrvProc, start_broker: StartBroker) -> BrokerProc:
    return start_broker(namesrv.addr, env=ENV)


def _consumer(namesrv_addr: str, group: str, topic: str, got: list[MessageExt]) -> PushConsumer:
    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        group,
        fast_config(namesrv_addr),
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    c.subscribe(topic, "*")
    return c


async def _announce(p: TransactionProducer, topic: str) -> None:
    """Make the producer known to the broker (a heartbeat) without sending anything."""
    await p.instance.update_topic_route(topic)
    await p.instance.send_heartbeat_to_all_brokers()


@pytest.mark.slow
async def test_commit_rollback_and_exception(namesrv: NamesrvProc, broker: BrokerProc) -> None:
    await create_topic(namesrv.addr, "TxT", queues=2)
    checks: list[bytes] = []

    async def execute(msg: Message, arg: object) -> LocalTransactionState:
        if arg == "boom":
            raise RuntimeError("local transaction crashed")
        return LocalTransactionState.COMMIT if arg == "ok" else LocalTransactionState.ROLLBACK

    async def check(msg: MessageExt) -> LocalTransactionState:
        checks.append(msg.body)
        return LocalTransactionState.COMMIT_MESSAGE  # the crashed one commits on check-back

    got: list[MessageExt] = []
    producer = TransactionProducer(
        "PG_tx",
        fast_config(namesrv.addr),
        execute_local_transaction=execute,
        check_local_transaction=check,
    )
    async with producer, _consumer(namesrv.addr, "CG_tx", "TxT", got):
        r1 = await producer.send_message_in_transaction(Message("TxT", b"commit"), "ok")
        r2 = await producer.send_message_in_transaction(Message("TxT", b"rollback"), "no")
        r3 = await producer.send_message_in_transaction(Message("TxT", b"boom"), "boom")
        assert r1.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        assert r2.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
        assert r3.local_transaction_state is LocalTransactionState.UNKNOW
        await wait_until(lambda: len(got) >= 2, total=20, what="commit and checked commit")
        await trio.sleep(2)  # the rolled-back one never shows up, nothing twice
    assert sorted(m.body for m in got) == [b"boom", b"commit"]
    assert {m.topic for m in got} == {"TxT"}
    assert checks == [b"boom"]


CRASHER = textwrap.dedent(
    """
    import os, sys, trio
    sys.path.insert(0, {repo!r})
    from client import ClientConfig, LocalTransactionState, Message, TransactionProducer

    async def execute(msg, arg):
        os._exit(3)  # dies after the half message, before END_TRANSACTION

    async def main():
        cfg = ClientConfig(namesrv_addr={ns!r}, client_ip="127.0.0.1")
        async with TransactionProducer("PG_crash", cfg, execute_local_transaction=execute) as p:
            await p.send_message_in_transaction(Message("TxCrash", b"orphan"), None)

    trio.run(main)
    """
)


@pytest.mark.slow
async def test_crashed_producer_is_checked_by_another(
    namesrv: NamesrvProc, broker: BrokerProc
) -> None:
    await create_topic(namesrv.addr, "TxCrash", queues=1)
    script = CRASHER.format(repo=str(REPO), ns=namesrv.addr)
    proc = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", script], capture_output=True, timeout=30, check=False
        )
    )
    assert proc.returncode == 3, proc.stderr.decode()[-2000:]
    checks: list[MessageExt] = []

    async def check(msg: MessageExt) -> LocalTransactionState:
        checks.append(msg)
        return LocalTransactionState.COMMIT

    got: list[MessageExt] = []
    survivor = TransactionProducer(
        "PG_crash", fast_config(namesrv.addr), check_local_transaction=check
    )
    async with survivor, _consumer(namesrv.addr, "CG_crash", "TxCrash", got):
        await _announce(survivor, "TxCrash")
        await wait_until(lambda: len(got) >= 1, total=20, what="checked-back commit")
        await trio.sleep(1.5)
    assert [m.body for m in got] == [b"orphan"]
    assert [m.body for m in checks] == [b"orphan"]
    assert checks[0].topic == "TxCrash" or checks[0].properties.get("REAL_TOPIC") == "TxCrash"


@pytest.mark.slow
async def test_unknown_rechecked_up_to_the_limit(namesrv: NamesrvProc, broker: BrokerProc) -> None:
    await create_topic(namesrv.addr, "TxU", queues=1)
    checks: list[int] = []

    async def execute(msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    async def check(msg: MessageExt) -> LocalTransactionState:
        checks.append(int(msg.properties.get("TRANSACTION_CHECK_TIMES", "0")))
        return LocalTransactionState.UNKNOWN

    got: list[MessageExt] = []
    producer = TransactionProducer(
        "PG_unk",
        fast_config(namesrv.addr),
        execute_local_transaction=execute,
        check_local_transaction=check,
    )
    async with producer, _consumer(namesrv.addr, "CG_unk", "TxU", got):
        await producer.send_message_in_transaction(Message("TxU", b"unsure"))
        api = producer.instance.api
        gave_up = MessageQueue("TRANS_CHECK_MAX_TIME_TOPIC", "broker-a", 0)

        async def given_up() -> bool:
            try:
                return await api.get_max_offset(broker.addr, gave_up) >= 1
            except Exception:
                return False

        await wait_until(given_up, total=25, what="moved to TRANS_CHECK_MAX_TIME_TOPIC")
        await trio.sleep(1.5)
    assert len(checks) == 3
    assert got == []

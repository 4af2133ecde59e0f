"""Small pure pieces of the client's reliability: listener arity, transaction states, limits."""

from __future__ import annotations

from client import ClientConfig, LocalTransactionState, MessageExt, PushConsumer
from client.consumer.push import ConsumeOrderlyContext, ConsumeStatus, _wants_context
from client.transaction import _END_CODE


async def _one(msgs: list[MessageExt]) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


async def _two(msgs: list[MessageExt], ctx: object) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


def test_listener_arity_decides_the_context() -> None:
    assert not _wants_context(_one)
    assert _wants_context(_two)
    assert _wants_context(lambda *a: None)


def test_transaction_states_and_end_codes() -> None:
    assert LocalTransactionState("COMMIT_MESSAGE") is LocalTransactionState.COMMIT
    assert LocalTransactionState("ROLLBACK_MESSAGE") is LocalTransactionState.ROLLBACK
    assert LocalTransactionState("UNKNOW") is LocalTransactionState.UNKNOWN
    assert _END_CODE[LocalTransactionState.COMMIT] == 8
    assert _END_CODE[LocalTransactionState.ROLLBACK] == 12
    assert _END_CODE[LocalTransactionState.UNKNOWN] == 0


async def _orderly(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> None:
    return None


def test_max_reconsume_times_defaults() -> None:
    cfg = ClientConfig(namesrv_addr="127.0.0.1:1")
    assert PushConsumer("g", cfg, listener=_one).max_reconsume_times() == 16
    assert PushConsumer("g", cfg, orderly_listener=_orderly).max_reconsume_times() == 2**31 - 1
    cfg3 = ClientConfig(namesrv_addr="127.0.0.1:1", max_reconsume_times=3)
    assert PushConsumer("g", cfg3, orderly_listener=_orderly).max_reconsume_times() == 3

"""`TransactionProducer`: half message, local transaction, END_TRANSACTION, check-back.

RocketMQ's TransactionMQProducer: `send_message_in_transaction(msg, arg)` sends the
message as a half message (TRAN_MSG=true, PGROUP), runs `execute_local_transaction`,
and tells the broker the outcome with a oneway END_TRANSACTION (commit 8, rollback 12,
unknown 0). When the outcome stays unknown (or the producer died first), the broker
asks a live producer of the group with CHECK_TRANSACTION_STATE (39); this producer
answers by calling `check_local_transaction` and sending END_TRANSACTION with
fromTransactionCheck=true on the same connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import structlog

from client.config import ClientConfig
from client.errors import MQClientError
from client.instance import ClientInstance
from client.message import Message, MessageExt, SendResult, SendStatus
from client.producer import DEFAULT_PRODUCER_GROUP, Producer
from common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    decode_offset_msg_id,
)
from remoting import RemotingCommand
from remoting.codes import RequestCode
from remoting.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)

log = structlog.get_logger()


class LocalTransactionState(Enum):
    """A local transaction's outcome (RocketMQ's names, plus friendly aliases)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
    # Aliases (the same members).
    COMMIT = "COMMIT_MESSAGE"  # noqa: PIE796
    ROLLBACK = "ROLLBACK_MESSAGE"  # noqa: PIE796
    UNKNOWN = "UNKNOW"  # noqa: PIE796


_END_CODE = {
    LocalTransactionState.COMMIT_MESSAGE: TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOW: TRANSACTION_NOT_TYPE,
}

ExecuteLocal = Callable[[Message, Any], Awaitable[LocalTransactionState]]
CheckLocal = Callable[[MessageExt], Awaitable[LocalTransactionState]]


@dataclass(slots=True, frozen=True)
class TransactionSendResult:
    """The half message's SendResult plus the local transaction's outcome."""

    send_result: SendResult
    local_transaction_state: LocalTransactionState


class TransactionProducer(Producer):
    """A producer whose messages are bound to a local transaction.

    Args:
        group: the producer group (the broker asks any live producer of it on check-back).
        config: client options.
        instance: a started ClientInstance to share.
        execute_local_transaction: `async (msg, arg) -> LocalTransactionState`; an exception
            counts as UNKNOW (the check-back decides).
        check_local_transaction: `async (msg_ext) -> LocalTransactionState`, called when
            the broker asks about a half message of this group.

    Usage::

        async with TransactionProducer("pg", cfg, execute_local_transaction=run,
                                       check_local_transaction=check) as p:
            r = await p.send_message_in_transaction(Message("T", b"x"), arg=order)
    """

    def __init__(
        self,
        group: str = DEFAULT_PRODUCER_GROUP,
        config: ClientConfig | None = None,
        *,
        instance: ClientInstance | None = None,
        execute_local_transaction: ExecuteLocal | None = None,
        check_local_transaction: CheckLocal | None = None,
    ) -> None:
        super().__init__(group, config, instance=instance)
        self.execute_local_transaction = execute_local_transaction
        self.check_local_transaction = check_local_transaction

    async def send_message_in_transaction(
        self, msg: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Send `msg` as a half message, run the local transaction, end the transaction.

        Raises:
            MQClientError: no `execute_local_transaction`.
            SendFailedError / RemoteError: the half message could not be sent (the local
                transaction did not run).
        """
        if self.execute_local_transaction is None:
            raise MQClientError("TransactionProducer needs execute_local_transaction")
        msg.properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)  # no delay for transactions
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.properties[PROPERTY_PRODUCER_GROUP] = self.group
        result = await self.send(msg)
        state = LocalTransactionState.UNKNOW
        if result.status is SendStatus.SEND_OK:
            try:
                state = LocalTransactionState(await self.execute_local_transaction(msg, arg))
            except Exception as exc:
                log.warning(
                    "local_transaction_failed",
                    group=self.group,
                    msg_id=result.msg_id,
                    error=repr(exc),
                )
                state = LocalTransactionState.UNKNOW
        else:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        try:
            addr = await self._end_transaction(result, state)
        except Exception as exc:
            # The broker's check-back settles it.
            log.warning("end_transaction_failed", msg_id=result.msg_id, error=str(exc))
        else:
            self._trace_end_transaction(
                msg, result.msg_id, addr, result.transaction_id or result.msg_id, state.value, False
            )
        return TransactionSendResult(result, state)

    async def _end_transaction(self, result: SendResult, state: LocalTransactionState) -> str:
        """Send END_TRANSACTION (oneway) to the master that took the half message; its address."""
        oid = result.offset_msg_id.split(",")[0]
        _, phy = decode_offset_msg_id(oid)
        header = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=result.queue_offset,
            commit_log_offset=phy,
            commit_or_rollback=_END_CODE[LocalTransactionState(state)],
            from_transaction_check=False,
            msg_id=result.msg_id,
            transaction_id=result.transaction_id or result.msg_id,
        )
        addr = await self.instance.find_master_addr(
            result.message_queue.broker_name, result.message_queue.topic
        )
        await self.instance.api.end_transaction_oneway(addr, header)
        return addr

    async def check_transaction_state(
        self, conn: object, msg: MessageExt, req: CheckTransactionStateRequestHeader
    ) -> None:
        """Answer a broker's CHECK_TRANSACTION_STATE (called by the ClientInstance)."""
        state = LocalTransactionState.UNKNOW
        if self.check_local_transaction is None:
            log.warning("check_local_transaction_missing", group=self.group)
        else:
            try:
                state = LocalTransactionState(await self.check_local_transaction(msg))
            except Exception as exc:
                log.warning("check_local_transaction_failed", msg_id=msg.msg_id, error=repr(exc))
        header = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=req.tran_state_table_offset,
            commit_log_offset=req.commit_log_offset,
            commit_or_rollback=_END_CODE[state],
            from_transaction_check=True,
            msg_id=msg.uniq_key or req.msg_id or "",
            transaction_id=req.transaction_id,
        )
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_fields(), oneway=True)
        invoke_oneway = getattr(conn, "invoke_oneway", None)
        if invoke_oneway is None:
            log.warning("end_transaction_no_connection", msg_id=msg.msg_id)
            return
        try:
            await invoke_oneway(cmd)
        except Exception as exc:
            log.warning("end_transaction_on_check_failed", msg_id=msg.msg_id, error=str(exc))
            return
        self._trace_end_transaction(
            msg, header.msg_id, msg.store_host, req.transaction_id, state.value, True
        )

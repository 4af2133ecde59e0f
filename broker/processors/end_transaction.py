"""END_TRANSACTION (37): a producer commits or rolls back a half message.

Real clients send it oneway (no response); a two-way request gets one. The half message is
found by `commitLogOffset` and must carry the request's PGROUP and queue offset
(`tranStateTableOffset`). Commit writes the real message (through the delay routing, so a
delayed transactional message is delayed after commit) and then the op record; rollback writes
the op record only; `commitOrRollback` 0 (unknown) does nothing. A half message already
resolved is acknowledged without writing again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from broker.processors._common import error, guarded
from broker.transaction import committed_message
from common.message import (
    PROPERTY_PRODUCER_GROUP,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from remoting import Connection, RemotingCommand, ResponseCode
from remoting.protocol.headers import EndTransactionRequestHeader

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()


class EndTransactionProcessor:
    """The END_TRANSACTION handler."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl

    @guarded()
    async def end_transaction(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        resp = await self._end(cmd)
        if cmd.is_oneway:
            if resp.code != ResponseCode.SUCCESS:
                log.warning("end_transaction_failed", code=resp.code, remark=resp.remark)
            return None
        return resp

    async def _end(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = EndTransactionRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        tx = ctrl.transactions
        kind = hdr.commit_or_rollback
        log.debug(
            "end_transaction",
            group=hdr.producer_group,
            kind=kind,
            half_offset=hdr.tran_state_table_offset,
            from_check=hdr.from_transaction_check,
        )
        if kind == TRANSACTION_NOT_TYPE:
            return cmd.make_response(ResponseCode.SUCCESS)
        if kind not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"bad commitOrRollback {kind}")
        half = tx.find_half(hdr.commit_log_offset)
        if half is None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != hdr.producer_group:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != hdr.tran_state_table_offset:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        if half.queue_offset in tx.resolved:
            return cmd.make_response(ResponseCode.SUCCESS)
        # Claim it before the first await: a racing END_TRANSACTION or check pass now sees it
        # resolved (released again if nothing could be written).
        tx.resolved.add(half.queue_offset)
        try:
            if kind == TRANSACTION_COMMIT_TYPE:
                msg = committed_message(half, ctrl.store_host)
                ctrl.schedule.route_delay(msg)
                ctrl.send.finish(msg)
                result = await ctrl.commits.put((msg,))
                if not result.ok:
                    tx.resolved.discard(half.queue_offset)
                    return error(
                        cmd,
                        ResponseCode.SYSTEM_ERROR,
                        f"store the committed message failed: {result.status.name}",
                    )
                ctrl.stats.put_count += 1
            op = await tx.write_op(half.queue_offset)
        except BaseException:
            tx.resolved.discard(half.queue_offset)
            raise
        if not op.ok:
            if kind != TRANSACTION_COMMIT_TYPE:
                tx.resolved.discard(half.queue_offset)
            # else: the real message is stored; it stays resolved in memory (after a restart,
            # without the op record, a check may ask the producer again, as in RocketMQ).
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"store the op record failed: {op.status.name}"
            )
        return cmd.make_response(ResponseCode.SUCCESS)

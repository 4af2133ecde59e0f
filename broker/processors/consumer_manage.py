"""Offsets (14, 15), consumer lists (38) and orderly-consumer queue locks (41, 42)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.processors._common import error, guarded
from broker.topic_manager import validate_group, validate_offset_key
from remoting import Connection, RemotingCommand, ResponseCode
from remoting.protocol.bodies import (
    ConsumerListBody,
    LockBatchRequestBody,
    LockBatchResponseBody,
    UnlockBatchRequestBody,
)
from remoting.protocol.headers import (
    GetConsumerListByGroupRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)

if TYPE_CHECKING:
    from broker.controller import BrokerController


class ConsumerManageProcessor:
    """Offsets and consumer lists.

    `query_consumer_offset` and `update_consumer_offset` are inline processors (registered
    with `inline=True`): the connection's reader runs them, no task per request.
    """

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl

    @guarded()
    async def query_consumer_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = QueryConsumerOffsetRequestHeader.from_fields(cmd.ext_fields)
        reason = validate_offset_key(hdr.consumer_group, hdr.topic)
        if reason is not None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, reason)
        fence = self.ctrl.catch_up.fence
        if fence is not None:  # its offsets may be behind its slave's
            return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, fence)
        offset = self.ctrl.offsets.query(hdr.consumer_group, hdr.topic, hdr.queue_id)
        if offset < 0:
            # No committed offset: a queue that still starts at 0 is read from 0 (RocketMQ's
            # answer when the first message is still available), otherwise QUERY_NOT_FOUND.
            # A 5.x client's `setZeroIfNotFound=false` always gets QUERY_NOT_FOUND.
            if hdr.set_zero_if_not_found is False:
                return error(
                    cmd,
                    ResponseCode.QUERY_NOT_FOUND,
                    "Not found, do not set to zero, maybe this group boot first",
                )
            min_offset = self.ctrl.store.get_min_offset_in_queue(hdr.topic, hdr.queue_id)
            if min_offset > 0:
                return error(
                    cmd,
                    ResponseCode.QUERY_NOT_FOUND,
                    "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
                )
            offset = 0
        return cmd.make_response(
            ResponseCode.SUCCESS,
            ext_fields=QueryConsumerOffsetResponseHeader(offset=offset).to_fields(),
        )

    @guarded()
    async def update_consumer_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = UpdateConsumerOffsetRequestHeader.from_fields(cmd.ext_fields)
        reason = validate_offset_key(hdr.consumer_group, hdr.topic)
        if reason is not None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, reason)
        if hdr.queue_id < 0 or hdr.commit_offset < 0:
            # In range of their types, but no queue or offset: never stored (RocketMQ's own
            # offset reset refuses them too).
            what = (
                f"queueId[{hdr.queue_id}]"
                if hdr.queue_id < 0
                else f"commitOffset[{hdr.commit_offset}]"
            )
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"{what} is illegal, it must be >= 0, topic:[{hdr.topic}] "
                f"group:[{hdr.consumer_group}]",
            )
        self.ctrl.offsets.commit(hdr.consumer_group, hdr.topic, hdr.queue_id, hdr.commit_offset)
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def get_consumer_list_by_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetConsumerListByGroupRequestHeader.from_fields(cmd.ext_fields)
        info = self.ctrl.consumers.get(hdr.consumer_group)
        if info is None or not info.channels:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {hdr.consumer_group}"
            )
        body = ConsumerListBody(info.client_ids()).to_json()
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    @guarded()
    async def lock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        body = LockBatchRequestBody.from_json(cmd.body_bytes())
        reason = validate_group(body.consumer_group)
        if reason is not None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, reason)
        held = self.ctrl.queue_locks.try_lock_batch(
            body.consumer_group, body.mq_set, body.client_id
        )
        return cmd.make_response(
            ResponseCode.SUCCESS, body=LockBatchResponseBody(sorted(held)).to_json()
        )

    @guarded()
    async def unlock_batch_mq(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        body = UnlockBatchRequestBody.from_json(cmd.body_bytes())
        self.ctrl.queue_locks.unlock_batch(body.consumer_group, body.mq_set, body.client_id)
        return cmd.make_response(ResponseCode.SUCCESS)

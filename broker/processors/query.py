"""QUERY_MESSAGE (12, by key or unique key through the index) and VIEW_MESSAGE_BY_ID (33)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.processors._common import error, guarded
from remoting import Connection, RemotingCommand, ResponseCode
from remoting.protocol.headers import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)

if TYPE_CHECKING:
    from broker.controller import BrokerController

DEFAULT_QUERY_MAX_NUM = 32


class QueryProcessor:
    """Message lookups."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl

    @guarded()
    async def query_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        hdr = QueryMessageRequestHeader.from_fields(cmd.ext_fields)
        max_num = hdr.max_num
        if cmd.field("_UNIQUE_KEY_QUERY") == "true":
            max_num = DEFAULT_QUERY_MAX_NUM
        result = self.ctrl.store.query_message(
            hdr.topic, hdr.key, max_num, hdr.begin_timestamp, hdr.end_timestamp
        )
        fields = QueryMessageResponseHeader(
            index_last_update_timestamp=result.index_last_update_timestamp,
            index_last_update_phyoffset=result.index_last_update_phyoffset,
        ).to_fields()
        if not result.buffers:
            return cmd.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                ext_fields=fields,
            )
        return cmd.make_response(
            ResponseCode.SUCCESS, ext_fields=fields, body=b"".join(result.buffers)
        )

    @guarded()
    async def view_message_by_id(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = ViewMessageRequestHeader.from_fields(cmd.ext_fields)
        record = self.ctrl.store.read_record(hdr.offset)
        if record is None:
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"can not find message by the offset, {hdr.offset}",
            )
        return cmd.make_response(ResponseCode.SUCCESS, body=record)

"""MQClientAPI: typed RocketMQ calls over a `remoting.RemotingClient`.

One method per request the client makes. Each builds the typed header, sends
it, checks the response code and returns plain values or body objects. The
caller's timeouts are `timeout_ms` values handed to the transport, which is
what RocketMQ users expect.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import structlog

from client.errors import MQClientError
from client.message import (
    MessageExt,
    MessageQueue,
    SendResult,
    SendStatus,
    decode_pull_body,
    new_send_result,
)
from common.message import MessageDecodeError

# The pull sys flags are common.pull's, re-exported: client.consumer, client.admin and
# client.spark import them from here.
from common.pull import PULL_FLAG_SUSPEND
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import (
    RemoteError,
    RemotingConnectError,
    RemotingConnectionLost,
    RemotingError,
    RemotingTimeoutError,
)
from remoting.protocol import bodies, headers
from remoting.protocol.route import ClusterInfo, TopicRouteData

log = structlog.get_logger()

_SEND_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}

# Plain-int keys: a send response's code is looked up per message.
_SEND_STATUS_BY_CODE: dict[int, SendStatus] = {int(k): v for k, v in _SEND_STATUS.items()}
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)
_NO_FIELDS: dict[str, str] = {}

TRANSPORT_ERRORS = (RemotingConnectError, RemotingConnectionLost, RemotingTimeoutError)


class Transport(Protocol):
    """What MQClientAPI needs from `remoting.RemotingClient`."""

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> RemotingCommand: ...

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None: ...


class PullStatus(Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(slots=True)
class PullResult:
    """A pull response: status, offsets and the decoded messages (FOUND only)."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]
    suggest_which_broker_id: int = 0


def decode_messages(body: bytes, broker_name: str = "") -> list[MessageExt]:
    """Records of a pull/query/view body as consumer messages.

    Raises:
        MQClientError: the body is not a sequence of valid records.
    """
    if not body:
        return []
    try:
        return decode_pull_body(body, broker_name)
    except MessageDecodeError as exc:
        raise MQClientError(f"bad message records from broker {broker_name}: {exc}") from exc


class MQClientAPI:
    """Typed calls to NameServers and brokers.

    Args:
        transport: the remoting client.
        namesrv_addrs: NameServer addresses; calls fail over between them.
        timeout_ms: default RPC timeout (RocketMQ's mqClientApiTimeout).
    """

    def __init__(self, transport: Transport, namesrv_addrs: list[str], timeout_ms: int = 3000):
        if not namesrv_addrs:
            raise MQClientError("no NameServer address: set namesrv_addr or NAMESRV_ADDR")
        self.transport = transport
        self.namesrv_addrs = list(namesrv_addrs)
        self.timeout_ms = timeout_ms
        self._ns_index = 0

    # -- NameServer ---------------------------------------------------------
    async def invoke_namesrv(
        self, cmd: RemotingCommand, timeout_ms: int | None = None
    ) -> RemotingCommand:
        """Send to the current NameServer, moving on to the next on transport errors.

        Raises:
            RemotingError: every NameServer failed (the last error).
        """
        last: Exception | None = None
        n = len(self.namesrv_addrs)
        for i in range(n):
            addr = self.namesrv_addrs[(self._ns_index + i) % n]
            try:
                resp = await self.transport.invoke(addr, cmd, timeout_ms or self.timeout_ms)
            except TRANSPORT_ERRORS as exc:
                log.warning("namesrv_unreachable", addr=addr, error=str(exc))
                last = exc
                continue
            self._ns_index = (self._ns_index + i) % n
            return resp
        assert last is not None
        raise last

    async def get_topic_route(self, topic: str) -> TopicRouteData | None:
        """The topic's route, or None when the NameServer does not know it."""
        cmd = RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            headers.GetRouteInfoRequestHeader(
                topic=topic, accept_standard_json_only=True
            ).to_fields(),
        )
        resp = await self.invoke_namesrv(cmd)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        resp.raise_for_code()
        return TopicRouteData.from_json(resp.body_bytes())

    async def get_broker_cluster_info(self) -> ClusterInfo:
        resp = await self.invoke_namesrv(
            RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        resp.raise_for_code()
        return ClusterInfo.from_json(resp.body_bytes())

    async def get_topic_list_from_namesrv(self) -> list[str]:
        resp = await self.invoke_namesrv(
            RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        )
        resp.raise_for_code()
        doc = json.loads(resp.body_bytes() or b"{}")
        return sorted(str(t) for t in doc.get("topicList", []))

    async def delete_topic_in_namesrv(self, topic: str, cluster: str | None = None) -> None:
        """Delete the topic's route on every NameServer."""
        fields = headers.DeleteTopicFromNamesrvRequestHeader(
            topic=topic, cluster_name=cluster
        ).to_fields()
        for addr in self.namesrv_addrs:
            cmd = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, fields)
            resp = await self.transport.invoke(addr, cmd, self.timeout_ms)
            resp.raise_for_code()

    # -- send -----------------------------------------------------------------
    async def send_message(
        self,
        addr: str,
        broker_name: str,
        header: headers.SendMessageRequestHeader,
        body: bytes,
        *,
        msg_id: str,
        timeout_ms: int,
        batch: bool = False,
    ) -> SendResult:
        """SEND_MESSAGE_V2 (310) or SEND_BATCH_MESSAGE (320).

        Raises:
            RemoteError: the broker answered with a code that is not a send status.
        """
        return await self.send_message_fields(
            addr,
            MessageQueue(header.topic, broker_name, header.queue_id),
            header.to_fields_v2(),
            body,
            msg_id=msg_id,
            timeout_ms=timeout_ms,
            batch=batch,
        )

    async def send_message_fields(
        self,
        addr: str,
        mq: MessageQueue,
        fields: dict[str, str],
        body: bytes,
        *,
        msg_id: str,
        timeout_ms: int,
        batch: bool = False,
    ) -> SendResult:
        """`send_message` with the V2 extFields already built (the producer's hot path).

        Args:
            addr: the broker's address.
            mq: the queue the request targets (its topic and broker name go into the result).
            fields: the SEND_MESSAGE_V2 short-name extFields (see
                `SendMessageRequestHeader.to_fields_v2`); handed to the command as is.
            body: the message body (or batch body).
            msg_id: the client id(s) reported in the result.
            timeout_ms: the request timeout.
            batch: SEND_BATCH_MESSAGE instead of SEND_MESSAGE_V2.

        Raises:
            RemoteError: the broker answered with a code that is not a send status.
            remoting.HeaderError: the response header lacks msgId, queueId or queueOffset.
        """
        resp = await self.transport.invoke(addr, send_request(fields, body, batch), timeout_ms)
        return send_result(resp, mq, msg_id)

    async def send_message_oneway(
        self, addr: str, header: headers.SendMessageRequestHeader, body: bytes
    ) -> None:
        await self.send_message_oneway_fields(addr, header.to_fields_v2(), body)

    async def send_message_oneway_fields(
        self, addr: str, fields: dict[str, str], body: bytes
    ) -> None:
        """SEND_MESSAGE_V2 without an answer, extFields already built."""
        cmd = RemotingCommand.request(_SEND_V2, None, body, oneway=True)
        cmd.ext_fields = fields
        await self.transport.invoke_oneway(addr, cmd)

    # -- pull -----------------------------------------------------------------
    async def pull_message(
        self,
        addr: str,
        broker_name: str,
        header: headers.PullMessageRequestHeader,
        timeout_ms: int,
    ) -> PullResult:
        """PULL_MESSAGE (11); long polling when the SUSPEND flag is set.

        Raises:
            RemoteError: any code that is not a pull status (e.g. 24, 26, 215).
        """
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_fields())
        # A suspended pull is parked at the broker until messages arrive: the transport does
        # not count it as a request in flight when deciding to write the next one at once.
        long_poll = bool(header.sys_flag & PULL_FLAG_SUSPEND)
        resp = await self.transport.invoke(addr, cmd, timeout_ms, long_poll=long_poll)
        try:
            status = _PULL_STATUS[ResponseCode(resp.code)]
        except (KeyError, ValueError):
            raise RemoteError(resp.code, resp.remark) from None
        rh = headers.PullMessageResponseHeader.from_fields(resp.ext_fields)
        msgs = decode_messages(resp.body_bytes(), broker_name) if status is PullStatus.FOUND else []
        return PullResult(
            status,
            rh.next_begin_offset,
            rh.min_offset,
            rh.max_offset,
            msgs,
            rh.suggest_which_broker_id,
        )

    # -- offsets --------------------------------------------------------------
    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue) -> int:
        """The stored offset, -1 when the broker has none (QUERY_NOT_FOUND)."""
        cmd = RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            headers.QueryConsumerOffsetRequestHeader(
                consumer_group=group, topic=mq.topic, queue_id=mq.queue_id
            ).to_fields(),
        )
        resp = await self.transport.invoke(addr, cmd, self.timeout_ms)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        resp.raise_for_code()
        return headers.QueryConsumerOffsetResponseHeader.from_fields(resp.ext_fields).offset

    async def update_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, offset: int, *, oneway: bool = False
    ) -> None:
        fields = headers.UpdateConsumerOffsetRequestHeader(
            consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, commit_offset=offset
        ).to_fields()
        if oneway:
            await self.transport.invoke_oneway(
                addr,
                RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields, oneway=True),
            )
            return
        resp = await self.transport.invoke(
            addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields),
            self.timeout_ms,
        )  # fmt: skip
        resp.raise_for_code()

    async def _offset_call(self, addr: str, code: int, fields: dict[str, str]) -> RemotingCommand:
        resp = await self.transport.invoke(
            addr, RemotingCommand.request(code, fields), self.timeout_ms
        )
        return resp.raise_for_code()

    async def get_max_offset(self, addr: str, mq: MessageQueue) -> int:
        resp = await self._offset_call(
            addr,
            RequestCode.GET_MAX_OFFSET,
            headers.GetMaxOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id).to_fields(),
        )
        return headers.GetMaxOffsetResponseHeader.from_fields(resp.ext_fields).offset

    async def get_min_offset(self, addr: str, mq: MessageQueue) -> int:
        resp = await self._offset_call(
            addr,
            RequestCode.GET_MIN_OFFSET,
            headers.GetMinOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id).to_fields(),
        )
        return headers.GetMinOffsetResponseHeader.from_fields(resp.ext_fields).offset

    async def get_earliest_msg_storetime(self, addr: str, mq: MessageQueue) -> int:
        resp = await self._offset_call(
            addr,
            RequestCode.GET_EARLIEST_MSG_STORETIME,
            headers.GetEarliestMsgStoretimeRequestHeader(
                topic=mq.topic, queue_id=mq.queue_id
            ).to_fields(),
        )
        return headers.GetEarliestMsgStoretimeResponseHeader.from_fields(resp.ext_fields).timestamp

    async def search_offset(self, addr: str, mq: MessageQueue, timestamp_ms: int) -> int:
        resp = await self._offset_call(
            addr,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            headers.SearchOffsetRequestHeader(
                topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp_ms
            ).to_fields(),
        )
        return headers.SearchOffsetResponseHeader.from_fields(resp.ext_fields).offset

    # -- client management ----------------------------------------------------
    async def send_heartbeat(self, addr: str, data: bodies.HeartbeatData) -> None:
        resp = await self.transport.invoke(
            addr,
            RemotingCommand.request(RequestCode.HEART_BEAT, None, data.to_json()),
            self.timeout_ms,
        )
        resp.raise_for_code()

    async def unregister_client(
        self,
        addr: str,
        client_id: str,
        producer_group: str | None = None,
        consumer_group: str | None = None,
    ) -> None:
        fields = headers.UnregisterClientRequestHeader(
            client_id=client_id, producer_group=producer_group, consumer_group=consumer_group
        ).to_fields()
        resp = await self.transport.invoke(
            addr,
            RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, fields),
            self.timeout_ms,
        )
        resp.raise_for_code()

    async def get_consumer_id_list(self, addr: str, group: str) -> list[str]:
        """Client ids of the group's consumers connected to that broker ([] when none)."""
        cmd = RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP,
            headers.GetConsumerListByGroupRequestHeader(consumer_group=group).to_fields(),
        )
        resp = await self.transport.invoke(addr, cmd, self.timeout_ms)
        if resp.code != ResponseCode.SUCCESS:
            return []
        return list(bodies.ConsumerListBody.from_json(resp.body_bytes()).consumer_id_list)

    async def lock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue]
    ) -> set[MessageQueue]:
        body = bodies.LockBatchRequestBody(
            consumer_group=group, client_id=client_id, mq_set=list(mqs)
        )
        resp = await self.transport.invoke(
            addr,
            RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, None, body.to_json()),
            self.timeout_ms,
        )
        resp.raise_for_code()
        got = bodies.LockBatchResponseBody.from_json(resp.body_bytes())
        return set(got.lock_ok_mq_set)

    async def unlock_batch_mq(
        self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue]
    ) -> None:
        body = bodies.UnlockBatchRequestBody(
            consumer_group=group, client_id=client_id, mq_set=list(mqs)
        )
        await self.transport.invoke_oneway(
            addr,
            RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, None, body.to_json(), oneway=True),
        )

    async def consumer_send_msg_back(
        self,
        addr: str,
        msg: MessageExt,
        group: str,
        delay_level: int,
        *,
        max_reconsume_times: int | None,
        timeout_ms: int,
    ) -> None:
        """CONSUMER_SEND_MSG_BACK (36): the broker copies the record to %RETRY% / %DLQ%.

        Raises:
            RemoteError: the broker refused.
        """
        fields = headers.ConsumerSendMsgBackRequestHeader(
            offset=msg.commit_log_offset,
            group=group,
            delay_level=delay_level,
            origin_msg_id=msg.msg_id,
            origin_topic=msg.topic,
            unit_mode=False,
            max_reconsume_times=max_reconsume_times,
        ).to_fields()
        cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, fields)
        resp = await self.transport.invoke(addr, cmd, timeout_ms)
        resp.raise_for_code()

    async def end_transaction_oneway(
        self, addr: str, header: headers.EndTransactionRequestHeader, remark: str | None = None
    ) -> None:
        """END_TRANSACTION (37), oneway as RocketMQ's producer sends it."""
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_fields(), oneway=True)
        if remark:
            cmd.remark = remark
        await self.transport.invoke_oneway(addr, cmd)

    # -- admin ----------------------------------------------------------------
    async def create_topic(
        self,
        addr: str,
        topic: str,
        *,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = 6,
        order: bool = False,
        topic_filter_type: str = "SINGLE_TAG",
        topic_sys_flag: int = 0,
        default_topic: str = "TBW102",
    ) -> None:
        fields = headers.CreateTopicRequestHeader(
            topic=topic,
            default_topic=default_topic,
            read_queue_nums=read_queue_nums,
            write_queue_nums=write_queue_nums,
            perm=perm,
            topic_filter_type=topic_filter_type,
            topic_sys_flag=topic_sys_flag,
            order=order,
        ).to_fields()
        await self._offset_call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)

    async def delete_topic_in_broker(self, addr: str, topic: str) -> None:
        await self._offset_call(
            addr,
            RequestCode.DELETE_TOPIC_IN_BROKER,
            headers.DeleteTopicRequestHeader(topic=topic).to_fields(),
        )

    async def get_broker_runtime_info(self, addr: str) -> dict[str, str]:
        resp = await self._offset_call(addr, RequestCode.GET_BROKER_RUNTIME_INFO, {})
        return dict(bodies.KVTable.from_json(resp.body_bytes()).table)

    async def get_broker_ha_status(self, addr: str) -> bodies.HARuntimeInfo:
        resp = await self._offset_call(addr, RequestCode.GET_BROKER_HA_STATUS, {})
        return bodies.HARuntimeInfo.from_json(resp.body_bytes())

    async def get_broker_epoch_cache(self, addr: str) -> dict[str, Any]:
        """GET_BROKER_EPOCH_CACHE (controller mode): the broker's epoch entries."""
        resp = await self._offset_call(addr, RequestCode.GET_BROKER_EPOCH_CACHE, {})
        try:
            out = json.loads(resp.body_bytes() or b"{}")
        except ValueError as exc:
            raise MQClientError(f"broker {addr}: bad epoch cache body: {exc}") from exc
        if not isinstance(out, dict):
            raise MQClientError(f"broker {addr}: bad epoch cache body")
        return out

    async def get_topic_stats_info(self, addr: str, topic: str) -> bodies.TopicStatsTable:
        resp = await self._offset_call(
            addr,
            RequestCode.GET_TOPIC_STATS_INFO,
            headers.GetTopicStatsInfoRequestHeader(topic=topic).to_fields(),
        )
        return bodies.TopicStatsTable.from_json(resp.body_bytes())

    async def get_consume_stats(
        self, addr: str, group: str, topic: str | None = None
    ) -> bodies.ConsumeStats:
        resp = await self._offset_call(
            addr,
            RequestCode.GET_CONSUME_STATS,
            headers.GetConsumeStatsRequestHeader(consumer_group=group, topic=topic).to_fields(),
        )
        return bodies.ConsumeStats.from_json(resp.body_bytes())

    async def get_consumer_connection_list(
        self, addr: str, group: str
    ) -> bodies.ConsumerConnection:
        resp = await self._offset_call(
            addr,
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            headers.GetConsumerConnectionListRequestHeader(consumer_group=group).to_fields(),
        )
        return bodies.ConsumerConnection.from_json(resp.body_bytes())

    async def view_message(self, addr: str, phy_offset: int) -> MessageExt:
        resp = await self._offset_call(
            addr,
            RequestCode.VIEW_MESSAGE_BY_ID,
            headers.ViewMessageRequestHeader(offset=phy_offset).to_fields(),
        )
        msgs = decode_messages(resp.body_bytes())
        if not msgs:
            raise MQClientError(f"no message at offset {phy_offset} on {addr}")
        return msgs[0]

    async def query_message(
        self,
        addr: str,
        topic: str,
        key: str,
        *,
        max_num: int = 64,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        unique_key: bool = False,
    ) -> list[MessageExt]:
        """Messages indexed under `key` (or UNIQ_KEY when `unique_key`); [] when none."""
        fields = headers.QueryMessageRequestHeader(
            topic=topic, key=key, max_num=max_num, begin_timestamp=begin_ms, end_timestamp=end_ms
        ).to_fields()
        fields["_UNIQUE_KEY_QUERY"] = "true" if unique_key else "false"
        resp = await self.transport.invoke(
            addr, RemotingCommand.request(RequestCode.QUERY_MESSAGE, fields), 15000
        )
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        resp.raise_for_code()
        return decode_messages(resp.body_bytes())

    async def invoke_broker_to_reset_offset(
        self, addr: str, topic: str, group: str, timestamp_ms: int, *, force: bool = True
    ) -> dict[MessageQueue, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET (222): the broker resets and tells the consumers.

        Raises:
            RemoteError: e.g. REQUEST_CODE_NOT_SUPPORTED from brokers without it.
        """
        resp = await self._offset_call(
            addr,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            headers.ResetOffsetRequestHeader(
                topic=topic, group=group, timestamp=timestamp_ms, is_force=force
            ).to_fields(),
        )
        if not resp.body:
            return {}
        body = bodies.ResetOffsetBody.from_json(resp.body_bytes())
        return dict(body.offset_table)


def send_request(fields: dict[str, str], body: bytes, batch: bool = False) -> RemotingCommand:
    """The SEND_MESSAGE_V2 (SEND_BATCH_MESSAGE when `batch`) request of `send_message_fields`.

    `fields` (the short-name V2 extFields) is handed to the command as is, no copy.
    """
    cmd = RemotingCommand.request(_SEND_BATCH if batch else _SEND_V2, None, body)
    cmd.ext_fields = fields  # built for this request only: no defensive copy
    return cmd


def send_result(resp: RemotingCommand, mq: MessageQueue, msg_id: str) -> SendResult:
    """The SendResult of a send response (`send_message_fields`' answer).

    Args:
        resp: the broker's response.
        mq: the queue the request targeted (a different queue id in the answer wins).
        msg_id: the client id(s) reported in the result.

    Raises:
        RemoteError: the code is not a send status.
        remoting.HeaderError: the response header lacks msgId, queueId or queueOffset.
    """
    status = _SEND_STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise RemoteError(resp.code, resp.remark)
    ext = resp.ext_fields or _NO_FIELDS
    try:
        offset_msg_id = ext["msgId"]
        queue_id = int(ext["queueId"])
        queue_offset = int(ext["queueOffset"])
    except (KeyError, ValueError):
        # Let the typed header say what is wrong (HeaderError naming the field).
        rh = headers.SendMessageResponseHeader.from_fields(ext)
        offset_msg_id, queue_id, queue_offset = rh.msg_id, rh.queue_id, rh.queue_offset
    if queue_id != mq.queue_id:
        mq = MessageQueue(mq.topic, mq.broker_name, queue_id)
    return new_send_result(
        status, msg_id, offset_msg_id, mq, queue_offset, ext.get("transactionId")
    )


def is_transport_error(exc: BaseException) -> bool:
    return isinstance(exc, TRANSPORT_ERRORS)


def is_retryable_broker_error(exc: BaseException) -> bool:
    """Send errors after which RocketMQ's sync send tries another queue."""
    if isinstance(exc, RemoteError):
        return exc.code in (
            ResponseCode.TOPIC_NOT_EXIST,
            ResponseCode.SERVICE_NOT_AVAILABLE,
            ResponseCode.SYSTEM_ERROR,
            ResponseCode.NO_PERMISSION,
            ResponseCode.NO_BUYER_ID,
            ResponseCode.NOT_IN_CURRENT_UNIT,
            ResponseCode.SYSTEM_BUSY,
        )
    return isinstance(exc, RemotingError)

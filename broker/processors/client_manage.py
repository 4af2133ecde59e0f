"""HEART_BEAT (34), UNREGISTER_CLIENT (35), CHECK_CLIENT_CONFIG (46),
GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204).

When a consumer group gains or loses a member, NOTIFY_CONSUMER_IDS_CHANGED (40) goes oneway to
every remaining member so they rebalance at once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import structlog

from broker.consumer_manager import ClientChannelInfo
from broker.filter import PropertyFilterDisabledError, build_subscription, sql_filter
from broker.processors._common import error, guarded
from broker.topic_manager import retry_topic, validate_group
from common.filter import SubscriptionParseError
from remoting import (
    Connection,
    LanguageCode,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from remoting.protocol.bodies import (
    ConnectionInfo,
    ConsumerConnection,
    HeartbeatData,
    ProducerConnection,
)
from remoting.protocol.headers import (
    GetConsumerConnectionListRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    UnregisterClientRequestHeader,
)

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()

ATTR_SERIALIZE_TYPE = "serialize_type"
ATTR_CLIENT_ID = "client_id"


def language_name(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return "OTHER"


class ClientManageProcessor:
    """Heartbeats and client registration."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl

    @guarded()
    async def heart_beat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """HEART_BEAT, an inline processor (registered with `inline=True`): registration and the
        notifications it triggers (sent in the background) never wait.

        The answer has no extFields. Apache 5.x's broker adds `IS_SUPPORT_HEART_BEAT_V2` and
        `IS_SUB_CHANGE`; trimq leaves them out, so 5.x clients with heartbeat v2 enabled keep
        sending full heartbeats. A v2 heartbeat without subscriptions (`withoutSub`) keeps the
        group's current ones."""
        data = HeartbeatData.from_json(cmd.body_bytes())
        ctrl = self.ctrl
        # Group names become topic names (%RETRY%<group>) and so directories: refuse the whole
        # heartbeat before anything of it is registered.
        for name in (
            *(cd.group_name for cd in data.consumer_data_set),
            *(pd.group_name for pd in data.producer_data_set),
        ):
            reason = validate_group(name)
            if reason is not None:
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"heartbeat refused: {reason}")
        conn.attributes[ATTR_SERIALIZE_TYPE] = cmd.serialize_type
        conn.attributes[ATTR_CLIENT_ID] = data.client_id
        language = language_name(cmd.language)
        for cd in data.consumer_data_set:
            subscriptions = cd.subscription_data_set
            if data.without_sub:
                known = ctrl.consumers.get(cd.group_name)
                subscriptions = list(known.subscriptions.values()) if known is not None else []
            group = ctrl.subscriptions.find_or_create(cd.group_name)
            notify = True
            if group is not None:
                notify = group.notify_consumer_ids_changed_enable
                if ctrl.topics.get(retry_topic(cd.group_name)) is None:
                    ctrl.topics.create_in_send_back(
                        retry_topic(cd.group_name), max(1, group.retry_queue_nums)
                    )
                    ctrl.on_topics_changed()
            changed = ctrl.consumers.register(
                cd.group_name,
                ClientChannelInfo(conn, data.client_id, language, cmd.version),
                consume_type=cd.consume_type,
                message_model=cd.message_model,
                consume_from_where=cd.consume_from_where,
                subscriptions=subscriptions,
            )
            if changed and notify:
                self.notify_group(cd.group_name)
        for pd in data.producer_data_set:
            ctrl.producers.register(
                pd.group_name, ClientChannelInfo(conn, data.client_id, language, cmd.version)
            )
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def check_client_config(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """CHECK_CLIENT_CONFIG: a consumer asks, before it starts, whether the broker takes its
        subscription (body: clientId, group, subscriptionData). A tag subscription always
        passes; SQL92 needs `enable_property_filter` (else SYSTEM_ERROR) and must compile
        (else SUBSCRIPTION_PARSE_FAILED with the column of the error)."""
        raw = json.loads(cmd.body_bytes() or b"{}")
        sub_raw = raw.get("subscriptionData") if isinstance(raw, dict) else None
        if not isinstance(sub_raw, dict):
            return cmd.make_response(ResponseCode.SUCCESS)
        group = str(raw.get("group") or "")
        try:
            sub = build_subscription(
                str(sub_raw.get("topic") or ""),
                sub_raw.get("subString"),
                expression_type=sub_raw.get("expressionType") or None,
                sub_version=int(sub_raw.get("subVersion") or 0),
            )
            sql_filter(sub, group, enabled=self.ctrl.config.enable_property_filter)
        except PropertyFilterDisabledError as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except SubscriptionParseError as exc:
            return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def unregister_client(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = UnregisterClientRequestHeader.from_fields(cmd.ext_fields)
        if hdr.producer_group:
            self.ctrl.producers.unregister(hdr.producer_group, hdr.client_id)
        if hdr.consumer_group and self.ctrl.consumers.unregister(hdr.consumer_group, hdr.client_id):
            group = self.ctrl.subscriptions.get(hdr.consumer_group)
            if group is None or group.notify_consumer_ids_changed_enable:
                self.notify_group(hdr.consumer_group)
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def get_consumer_connection_list(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetConsumerConnectionListRequestHeader.from_fields(cmd.ext_fields)
        info = self.ctrl.consumers.get(hdr.consumer_group)
        if info is None:
            return error(
                cmd,
                ResponseCode.CONSUMER_NOT_ONLINE,
                f"the consumer group[{hdr.consumer_group}] not online",
            )
        body = ConsumerConnection(
            [
                ConnectionInfo(c.client_id, c.channel.remote_address, c.language, c.version)
                for c in info.channels.values()
            ],
            dict(info.subscriptions),
            info.consume_type,
            info.message_model,
            info.consume_from_where,
        ).to_json()
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    @guarded()
    async def get_producer_connection_list(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """GET_PRODUCER_CONNECTION_LIST (204): the connections of a producer group.

        Header `producerGroup` (GetProducerConnectionListRequestHeader); SYSTEM_ERROR with
        Apache's remark when the group has no live producer.
        """
        group = cmd.field("producerGroup")
        if not group:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "the producerGroup field is missing")
        members = self.ctrl.producers.members(group)
        if not members:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = ProducerConnection(
            [
                ConnectionInfo(c.client_id, c.channel.remote_address, c.language, c.version)
                for c in members
            ]
        ).to_json()
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    # -- notifications -----------------------------------------------------------------------
    def notify_group(self, group: str) -> None:
        """Send NOTIFY_CONSUMER_IDS_CHANGED oneway to every member of `group` (in background)."""
        fields = NotifyConsumerIdsChangedRequestHeader(consumer_group=group).to_fields()
        self.send_to_group(group, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, fields)

    def send_to_group(
        self, group: str, code: int, fields: dict[str, str], body: bytes | None = None
    ) -> int:
        """Send a oneway request to every online member of `group` (in background), each in
        the serialize type its heartbeat used. Returns the number of members addressed."""
        info = self.ctrl.consumers.get(group)
        if info is None:
            return 0
        sent = 0
        for member in info.channels.values():
            channel = member.channel
            if isinstance(channel, Connection) and not channel.closed:
                st = channel.attributes.get(ATTR_SERIALIZE_TYPE, SerializeType.JSON)
                req = RemotingCommand.request(
                    code,
                    fields,
                    body,
                    oneway=True,
                    serialize_type=int(st) if isinstance(st, int) else SerializeType.JSON,
                )
                self.ctrl.spawn(self._send_oneway, channel, req)
                sent += 1
        return sent

    async def _send_oneway(self, channel: Connection, req: RemotingCommand) -> None:
        try:
            await channel.invoke_oneway(req)
        except Exception as exc:
            log.info(
                "client_request_failed", code=req.code, peer=channel.remote_address, error=str(exc)
            )

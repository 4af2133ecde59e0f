"""More admin requests: subscription group deletion, runtime configuration, file cleanup on
demand, which groups consume a topic, and a consumer's runtime info and a direct consume
through its connection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from broker._persist import write_atomically
from broker.config import runtime_changes, update_toml_text
from broker.processors._common import error, guarded
from broker.processors.client_manage import ATTR_SERIALIZE_TYPE
from common.config import parse_properties
from common.message import MessageDecodeError, decode_offset_msg_id
from remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from remoting.codes import SerializeType
from remoting.errors import RemotingError, RemotingTimeoutError
from remoting.protocol.bodies import dumps

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()

# How long the broker waits for a client's answer to a request it forwards (307, 309: a
# listener call), as RocketMQ's Broker2Client.callClient.
CLIENT_CALL_TIMEOUT_MS = 10_000
# Largest UPDATE_BROKER_CONFIG body read (a few `key=value` lines).
MAX_CONFIG_BODY = 64 * 1024


class AdminMoreProcessor:
    """Handlers of DELETE_SUBSCRIPTIONGROUP (207), UPDATE_BROKER_CONFIG (25),
    CLEAN_EXPIRED_CONSUMEQUEUE (306), DELETE_EXPIRED_COMMITLOG (329),
    QUERY_TOPIC_CONSUME_BY_WHO (300), GET_CONSUMER_RUNNING_INFO (307),
    CONSUME_MESSAGE_DIRECTLY (309) and VIEW_BROKER_STATS_DATA (315)."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl
        # One runtime change (and its file rewrite) at a time.
        self._config_lock = trio.Lock()

    # -- subscription groups ---------------------------------------------------------------
    @guarded()
    async def delete_subscription_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        group = cmd.field("groupName")
        if not group:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "the groupName field is missing")
        # 4.9's `removeOffset`, or 5.x's name for the same flag, `cleanOffset`.
        flags = {k: (cmd.field(k) or "false").lower() for k in ("removeOffset", "cleanOffset")}
        for key, value in flags.items():
            if value not in ("true", "false"):
                return error(cmd, ResponseCode.SYSTEM_ERROR, f"bad {key}: {value!r}")
        raw = "true" if "true" in flags.values() else "false"
        ctrl = self.ctrl
        if ctrl.subscriptions.delete(group):
            await ctrl.persist_subscriptions()
            log.info("subscription_group_deleted", group=group)
        if raw == "true":
            # RocketMQ's removeOffset: every topic's offsets of the group go too; the offset
            # file is rewritten now (a worker thread), like any other dirty config file.
            removed = ctrl.offsets.remove_group(group)
            if removed:
                await ctrl.persist_all()
                log.info("consumer_offsets_removed", group=group, topics=removed)
        return cmd.make_response(ResponseCode.SUCCESS)

    # -- statistics ------------------------------------------------------------------------
    @guarded()
    async def view_broker_stats_data(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """VIEW_BROKER_STATS_DATA (315): header `statsName`, `statsKey`; body BrokerStatsData
        (`statsMinute`, `statsHour`, `statsDay`: `sum`, `tps`, `avgpt`)."""
        name = cmd.field("statsName")
        key = cmd.field("statsKey")
        if not name or key is None:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, "the statsName and statsKey fields are required"
            )
        windows = self.ctrl.table_stats.view(name, key)
        if windows is None:
            # RocketMQ's answer for an unknown name or a key never counted.
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        minute, hour, day = windows
        body = {
            "statsDay": day.to_json(),
            "statsHour": hour.to_json(),
            "statsMinute": minute.to_json(),
        }
        return cmd.make_response(ResponseCode.SUCCESS, body=dumps(body))

    # -- runtime configuration -------------------------------------------------------------
    @guarded()
    async def update_broker_config(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """UPDATE_BROKER_CONFIG (25): body `key=value` lines. Every pair is checked before any
        is applied (an unknown key, one that needs a restart or a bad value refuses the whole
        request); then the settings change at once and are written to `broker_config_path`."""
        body = cmd.body_bytes()
        if len(body) > MAX_CONFIG_BODY:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "the config body is too large")
        try:
            pairs = parse_properties(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"bad config body: {exc}")
        if not pairs:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "no key=value in the request body")
        ctrl = self.ctrl
        async with self._config_lock:
            try:
                changes = runtime_changes(ctrl.config, pairs)
            except KeyError as exc:
                return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc.args[0]))
            except PermissionError as exc:
                return error(cmd, ResponseCode.NO_PERMISSION, str(exc))
            except ValueError as exc:
                return error(cmd, ResponseCode.SYSTEM_ERROR, f"bad value: {exc}")
            path = ctrl.config.broker_config_path
            if path is not None:
                try:
                    # File read, rewrite and fsync: a worker thread.
                    await trio.to_thread.run_sync(_persist_changes, Path(path), changes)
                except (OSError, ValueError) as exc:
                    return error(
                        cmd,
                        ResponseCode.SYSTEM_ERROR,
                        f"not changed: cannot write the config file {path}: {exc}",
                    )
            self._apply(changes)
        log.info("broker_config_updated", changes=changes, persisted_to=path)
        remark = None if path is not None else "not persisted: the broker has no config file"
        return cmd.make_response(ResponseCode.SUCCESS, remark)

    def _apply(self, changes: dict[str, Any]) -> None:
        ctrl = self.ctrl
        store_fields = type(ctrl.store.config).model_fields
        for name, value in changes.items():
            setattr(ctrl.config, name, value)
            # Components that keep their own copy of a setting get the new value too.
            if name == "auto_create_topic_enable":
                ctrl.topics.auto_create_topic_enable = value
            elif name == "auto_create_subscription_group":
                ctrl.subscriptions.auto_create = value
            if name in store_fields:
                setattr(ctrl.store.config, name, value)
        if "broker_permission" in changes:
            ctrl.on_broker_permission_changed()

    # -- files -------------------------------------------------------------------------------
    @guarded()
    async def clean_expired_consumequeue(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """CLEAN_EXPIRED_CONSUMEQUEUE (306): delete the consume-queue and index files that only
        point below the commitlog's first offset (what the store's cleanup does after it
        deleted commitlog files), now."""
        # The store's own step (file unlinks in worker threads inside).
        await self.ctrl.store.cleanup_service.clean_expired_consume_queues()
        log.info("expired_consume_queues_cleaned")
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def delete_expired_commitlog(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """DELETE_EXPIRED_COMMITLOG (329): delete the commitlog files older than the reserved
        time now, whatever the hour (`delete_when`), then the consume-queue and index files
        that pointed into them. Never the newest file, never a file still in its reserved
        time (RocketMQ's manual delete)."""
        # The store's own cleanup (munmap and unlink in worker threads inside).
        deleted = await self.ctrl.store.cleanup_service.delete_expired_now()
        log.info("expired_commitlog_deleted", files=deleted)
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={"deletedFiles": str(deleted)})

    # -- consumers ---------------------------------------------------------------------------
    @guarded()
    async def query_topic_consume_by_who(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """QUERY_TOPIC_CONSUME_BY_WHO (300): the groups online for the topic or with offsets
        of it, as GroupList `{"groupList":[...]}`."""
        topic = cmd.field("topic")
        if not topic:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "the topic field is missing")
        ctrl = self.ctrl
        groups = set(ctrl.consumers.groups_of_topic(topic)) | ctrl.offsets.groups_of_topic(topic)
        body = json.dumps({"groupList": sorted(groups)}).encode()
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    @guarded()
    async def get_consumer_running_info(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """GET_CONSUMER_RUNNING_INFO (307): the same request sent on to the client over its
        connection; the client's answer (a ConsumerRunningInfo body) is handed back."""
        fields = {"consumerGroup": cmd.field("consumerGroup") or "",
                  "clientId": cmd.field("clientId") or ""}  # fmt: skip
        if cmd.field("jstackEnable") is not None:
            fields["jstackEnable"] = cmd.field("jstackEnable") or "false"
        return await self._call_consumer(
            cmd, RequestCode.GET_CONSUMER_RUNNING_INFO, fields, None, CLIENT_CALL_TIMEOUT_MS
        )

    @guarded()
    async def consume_message_directly(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """CONSUME_MESSAGE_DIRECTLY (309): the message `msgId` (an offset message id of this
        broker) sent on to the client `clientId` of `consumerGroup`, whose listener consumes
        it once, outside its queues; the client's ConsumeMessageDirectlyResult is handed
        back."""
        msg_id = cmd.field("msgId") or ""
        try:
            _, offset = decode_offset_msg_id(msg_id)
        except MessageDecodeError as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"bad msgId: {exc}")
        record = self.ctrl.store.read_record(offset)
        if record is None:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        fields = {
            "consumerGroup": cmd.field("consumerGroup") or "",
            "clientId": cmd.field("clientId") or "",
            "msgId": msg_id,
            "brokerName": self.ctrl.config.broker_name,
        }
        return await self._call_consumer(
            cmd, RequestCode.CONSUME_MESSAGE_DIRECTLY, fields, record, CLIENT_CALL_TIMEOUT_MS
        )

    async def _call_consumer(
        self,
        cmd: RemotingCommand,
        code: int,
        fields: dict[str, str],
        body: bytes | None,
        timeout_ms: int,
    ) -> RemotingCommand:
        """Send request `code` to the client `fields["clientId"]` of `fields["consumerGroup"]`
        over its connection, and hand its answer back as the answer to `cmd`."""
        group, client_id = fields["consumerGroup"], fields["clientId"]
        if not group or not client_id:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, "the consumerGroup and clientId fields are needed"
            )
        info = self.ctrl.consumers.get(group)
        member = info.channels.get(client_id) if info is not None else None
        channel = member.channel if member is not None else None
        if not isinstance(channel, Connection) or channel.closed:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"The Consumer <{client_id}> Not Online")
        st = channel.attributes.get(ATTR_SERIALIZE_TYPE, SerializeType.JSON)
        req = RemotingCommand.request(
            code,
            fields,
            body,
            serialize_type=int(st) if isinstance(st, int) else SerializeType.JSON,
        )
        try:
            answer = await channel.invoke(req, timeout_ms)
        except RemotingTimeoutError as exc:
            # RocketMQ's code for a client that did not answer in time.
            return error(
                cmd,
                ResponseCode.CONSUME_MSG_TIMEOUT,
                f"consumer <{client_id}> of group {group} did not answer: {exc}",
            )
        except RemotingError as exc:
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{client_id}> of group {group} failed: {exc}",
            )
        return cmd.make_response(answer.code, answer.remark, body=answer.body_bytes() or None)


def _persist_changes(path: Path, changes: dict[str, Any]) -> None:
    """Rewrite the broker's TOML config file with `changes` (blocking: a worker thread)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    write_atomically(path, update_toml_text(text, changes).encode("utf-8"))

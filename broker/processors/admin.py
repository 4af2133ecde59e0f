"""Admin requests: topics, offsets by queue, runtime info, stats, subscription groups, config."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import structlog
import trio

from broker.processors._common import error, guarded
from broker.stats import GROUP_GET_NUMS
from broker.topic_manager import AUTO_CREATE_TOPIC_KEY, validate_topic
from remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.bodies import (
    ConsumeStats,
    ConsumeStatsList,
    KVTable,
    MessageQueue,
    OffsetWrapper,
    ResetOffsetBody,
    SubscriptionGroupConfig,
    TopicOffset,
    TopicStatsTable,
    dumps,
)
from remoting.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    GetTopicStatsInfoRequestHeader,
    ReadCommitlogRequestHeader,
    ReadCommitlogResponseHeader,
    ResetOffsetRequestHeader,
    SearchOffsetRequestHeader,
    SearchOffsetResponseHeader,
)
from remoting.protocol.route import TopicConfig, TopicConfigSerializeWrapper

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()

BROKER_VERSION = 409  # MQVersion ordinal reported (V4_9_8)
BROKER_VERSION_DESC = "V4_9_8"
READ_COMMITLOG_MAX_BYTES = 1024 * 1024


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class AdminProcessor:
    """Admin handlers (mqadmin and the Java admin tools use these)."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl

    # -- topics ----------------------------------------------------------------------------
    @guarded()
    async def update_and_create_topic(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = CreateTopicRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        reason = validate_topic(hdr.topic)
        if reason is not None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, reason)
        if hdr.topic == ctrl.config.broker_cluster_name:
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"the topic[{hdr.topic}] conflicts with a system reserved word",
            )
        for what, n in (
            ("readQueueNums", hdr.read_queue_nums),
            ("writeQueueNums", hdr.write_queue_nums),
        ):
            if not 0 < n <= ctrl.topics.max_queue_nums:
                return error(
                    cmd,
                    ResponseCode.SYSTEM_ERROR,
                    f"{what} {n} must be between 1 and {ctrl.topics.max_queue_nums}",
                )
        if not 0 <= hdr.perm <= 0xF:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"perm {hdr.perm} is not a permission")
        if hdr.topic_filter_type not in ("SINGLE_TAG", "MULTI_TAG"):
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"topicFilterType {hdr.topic_filter_type!r} is not SINGLE_TAG or MULTI_TAG",
            )
        cfg = TopicConfig(
            topic_name=hdr.topic,
            read_queue_nums=hdr.read_queue_nums,
            write_queue_nums=hdr.write_queue_nums,
            perm=hdr.perm,
            topic_filter_type=hdr.topic_filter_type,
            topic_sys_flag=hdr.topic_sys_flag or 0,
            order=hdr.order,
        )
        if ctrl.topics.update(cfg):
            await ctrl.persist_topics()
            ctrl.on_topics_changed()
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def delete_topic_in_broker(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = DeleteTopicRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        if hdr.topic == AUTO_CREATE_TOPIC_KEY or hdr.topic in (
            ctrl.config.broker_cluster_name,
            ctrl.config.broker_name,
        ):
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"the system topic[{hdr.topic}] cannot be deleted"
            )
        if ctrl.topics.delete(hdr.topic):
            ctrl.offsets.remove_topics([hdr.topic])
            ctrl.store.delete_topics([hdr.topic])
            await ctrl.persist_topics()
            ctrl.on_topics_changed()
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def get_all_topic_config(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        body = TopicConfigSerializeWrapper(
            self.ctrl.topics.table(), self.ctrl.topics.data_version
        ).to_json()
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    # -- queue offsets ------------------------------------------------------------------------
    @guarded()
    async def get_max_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetMaxOffsetRequestHeader.from_fields(cmd.ext_fields)
        offset = self.ctrl.store.get_max_offset_in_queue(hdr.topic, hdr.queue_id)
        return cmd.make_response(
            ResponseCode.SUCCESS, ext_fields=GetMaxOffsetResponseHeader(offset=offset).to_fields()
        )

    @guarded()
    async def get_min_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetMinOffsetRequestHeader.from_fields(cmd.ext_fields)
        offset = self.ctrl.store.get_min_offset_in_queue(hdr.topic, hdr.queue_id)
        return cmd.make_response(
            ResponseCode.SUCCESS, ext_fields=GetMinOffsetResponseHeader(offset=offset).to_fields()
        )

    @guarded()
    async def search_offset_by_timestamp(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = SearchOffsetRequestHeader.from_fields(cmd.ext_fields)
        offset = self.ctrl.store.get_offset_in_queue_by_time(hdr.topic, hdr.queue_id, hdr.timestamp)
        return cmd.make_response(
            ResponseCode.SUCCESS, ext_fields=SearchOffsetResponseHeader(offset=offset).to_fields()
        )

    @guarded()
    async def get_earliest_msg_storetime(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetEarliestMsgStoretimeRequestHeader.from_fields(cmd.ext_fields)
        ts = self.ctrl.store.get_earliest_message_time(hdr.topic, hdr.queue_id)
        return cmd.make_response(
            ResponseCode.SUCCESS,
            ext_fields=GetEarliestMsgStoretimeResponseHeader(timestamp=ts).to_fields(),
        )

    # -- runtime info and stats -------------------------------------------------------------
    @guarded()
    async def get_broker_runtime_info(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        ctrl = self.ctrl
        store = ctrl.store
        stats = ctrl.stats
        table: dict[str, str] = {}
        try:
            table.update({str(k): str(v) for k, v in store.runtime_info().items()})
        except Exception as exc:  # the store's extra figures are optional
            log.warning("store_runtime_info_failed", error=str(exc))
        put_tps, get_tps = stats.tps()
        table.update(
            {
                "brokerVersion": str(BROKER_VERSION),
                "brokerVersionDesc": BROKER_VERSION_DESC,
                # trimq's own key (RocketMQ has none): `mqadmin clusterList` shows it.
                "brokerRole": ctrl.role,
                "bootTimestamp": str(ctrl.boot_timestamp_ms),
                "runtime": _uptime(ctrl.boot_timestamp_ms),
                "commitLogMaxOffset": str(store.max_phy_offset),
                "commitLogMinOffset": str(store.min_phy_offset),
                "msgPutTotalTodayNow": str(stats.put_count),
                "msgGetTotalTodayNow": str(stats.get_count),
                "putTps": f"{put_tps:.2f} {put_tps:.2f} {put_tps:.2f}",
                "getTransferedTps": f"{get_tps:.2f} {get_tps:.2f} {get_tps:.2f}",
                # Java's `mqadmin clusterList` parses these as numbers: never leave them out.
                "msgPutTotalYesterdayMorning": "0",
                "msgPutTotalTodayMorning": "0",
                "msgGetTotalYesterdayMorning": "0",
                "msgGetTotalTodayMorning": "0",
                "dispatchBehindBytes": "0",
                "pageCacheLockTimeMills": "0",
                "sendThreadPoolQueueSize": "0",
                "pullThreadPoolQueueSize": "0",
                "parkedPulls": str(ctrl.long_polling.parked_count),
                "topicCount": str(len(ctrl.topics)),
            }
        )
        table.update(await _disk_usage(ctrl.config.store_path))
        return cmd.make_response(ResponseCode.SUCCESS, body=KVTable(table).to_json())

    @guarded()
    async def get_broker_ha_status(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        ctrl = self.ctrl
        source = ctrl.ha_master if ctrl.ha_master is not None else ctrl.ha_slave
        if source is None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "this broker runs no HA service")
        return cmd.make_response(ResponseCode.SUCCESS, body=source.runtime_info().to_json())

    @guarded()
    async def get_broker_epoch_cache(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """GET_BROKER_EPOCH_CACHE (controller mode): the epoch entries, each with its end."""
        ctrl = self.ctrl
        max_offset = ctrl.store.max_phy_offset
        entries = ctrl.epochs.entries
        epochs = [
            {
                "epoch": e.epoch,
                "startOffset": e.start_offset,
                "endOffset": entries[i + 1].start_offset if i + 1 < len(entries) else max_offset,
            }
            for i, e in enumerate(entries)
        ]
        body = {
            "clusterName": ctrl.config.broker_cluster_name,
            "brokerName": ctrl.config.broker_name,
            "brokerId": ctrl.replicas.broker_id if ctrl.replicas is not None else ctrl.broker_id,
            "epochList": epochs,
            "maxOffset": max_offset,
        }
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    @guarded()
    async def read_commitlog(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """Raw commitlog bytes from an offset (within one file), for a master that came
        back behind its slave (`broker.catch_up`); the same bytes pulls serve, at most
        `READ_COMMITLOG_MAX_BYTES` of page cache per call as a pull's."""
        hdr = ReadCommitlogRequestHeader.from_fields(cmd.ext_fields)
        store = self.ctrl.store
        lo, hi = store.min_phy_offset, store.max_phy_offset
        fields = ReadCommitlogResponseHeader(min_offset=lo, max_offset=hi).to_fields()
        if hdr.max_bytes <= 0 or not lo <= hdr.offset <= hi:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"offset {hdr.offset} is outside the commitlog [{lo}, {hi}] or max bytes "
                f"{hdr.max_bytes} not positive",
                ext_fields=fields,
            )
        data = store.read_commitlog(hdr.offset, min(hdr.max_bytes, READ_COMMITLOG_MAX_BYTES))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields=fields, body=data or b"")

    @guarded()
    async def get_topic_stats_info(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetTopicStatsInfoRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        cfg = ctrl.topics.get(hdr.topic)
        if cfg is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST, f"topic[{hdr.topic}] not exist")
        table = {}
        for qid in range(cfg.write_queue_nums):
            mx = ctrl.store.get_max_offset_in_queue(hdr.topic, qid)
            last = ctrl.store.get_message_store_timestamp(hdr.topic, qid, mx - 1) if mx > 0 else 0
            table[MessageQueue(hdr.topic, ctrl.config.broker_name, qid)] = TopicOffset(
                ctrl.store.get_min_offset_in_queue(hdr.topic, qid), mx, max(0, last)
            )
        return cmd.make_response(ResponseCode.SUCCESS, body=TopicStatsTable(table).to_json())

    @guarded()
    async def get_consume_stats(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = GetConsumeStatsRequestHeader.from_fields(cmd.ext_fields)
        group = hdr.consumer_group
        topics = [hdr.topic] if hdr.topic else sorted(self.ctrl.offsets.topics_of_group(group))
        merged = ConsumeStats()
        for topic in topics:
            cfg = self.ctrl.topics.get(topic)
            if cfg is not None:
                stats = self._consume_stats(group, cfg)
                merged.offset_table.update(stats.offset_table)
                merged.consume_tps += stats.consume_tps
        merged.consume_tps = round(merged.consume_tps, 2)
        return cmd.make_response(ResponseCode.SUCCESS, body=merged.to_json())

    @guarded()
    async def get_broker_consume_stats(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """GET_BROKER_CONSUME_STATS (317, `mqadmin brokerConsumeStats`): every subscription
        group's ConsumeStats per topic it has offsets of here; `isOrder=true` keeps the
        orderly topics only. As RocketMQ, a topic the group's online consumers do not
        subscribe is left out."""
        order_only = (cmd.field("isOrder") or "").strip().lower() == "true"
        ctrl = self.ctrl
        topics_of = ctrl.offsets.topics_by_group()
        out = ConsumeStatsList(broker_addr=ctrl.addr)
        for n, group in enumerate(sorted(ctrl.subscriptions.groups())):
            if n % 64 == 63:
                # Thousands of groups: let other requests run between slices.
                await trio.lowlevel.checkpoint()
            online = ctrl.consumers.get(group)
            subscribed = online.subscriptions if online is not None else {}
            per_topic: list[ConsumeStats] = []
            for topic in sorted(topics_of.get(group, ())):
                cfg = ctrl.topics.get(topic)
                if cfg is None or (order_only and not cfg.order):
                    continue
                if subscribed and topic not in subscribed:
                    continue
                stats = self._consume_stats(group, cfg)
                per_topic.append(stats)
                out.total_diff += sum(
                    w.broker_offset - w.consumer_offset for w in stats.offset_table.values()
                )
            out.consume_stats_list.append({group: per_topic})
        return cmd.make_response(ResponseCode.SUCCESS, body=out.to_json())

    def _consume_stats(self, group: str, cfg: TopicConfig) -> ConsumeStats:
        """RocketMQ's ConsumeStats of `group` on the topic of `cfg` here: per write queue the
        max offset, the committed offset and the store time of the last message consumed; the
        group's pulled messages per second over the last minute."""
        ctrl = self.ctrl
        topic = cfg.topic_name
        stats = ConsumeStats()
        for qid in range(cfg.write_queue_nums):
            broker_offset = max(0, ctrl.store.get_max_offset_in_queue(topic, qid))
            consumer_offset = max(0, ctrl.offsets.query(group, topic, qid))
            last = 0
            if consumer_offset > 0:
                last = max(
                    0, ctrl.store.get_message_store_timestamp(topic, qid, consumer_offset - 1)
                )
            # pullOffset (5.x): trimq keeps no separate pull position, so the committed
            # offset (Apache reports max(consumer offset, pull offset)).
            stats.offset_table[MessageQueue(topic, ctrl.config.broker_name, qid)] = OffsetWrapper(
                broker_offset, consumer_offset, last, consumer_offset
            )
        view = ctrl.table_stats.view(GROUP_GET_NUMS, f"{topic}@{group}")
        stats.consume_tps = round(view[0].tps, 2) if view is not None else 0.0
        return stats

    @guarded()
    async def get_all_consumer_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        return cmd.make_response(ResponseCode.SUCCESS, body=self.ctrl.offsets.encode())

    @guarded()
    async def get_all_delay_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """GET_ALL_DELAY_OFFSET (45): delayOffset.json's content, `{"offsetTable":{"1":n,..}}`.

        The schedule service's current table (what the file holds once the next write lands),
        in standard JSON (quoted level keys; RocketMQ writes them bare).
        """
        return cmd.make_response(ResponseCode.SUCCESS, body=self.ctrl.schedule.encode())

    @guarded()
    async def invoke_broker_to_reset_offset(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """INVOKE_BROKER_TO_RESET_OFFSET (222): move a group's offsets of a topic to a time.

        Per queue the new offset is the first at/after `timestamp` (the max offset for -1);
        without `isForce` an offset only moves backwards. The broker commits the new offsets
        and sends RESET_CONSUMER_CLIENT_OFFSET (220) to the group's online consumers, so it
        works whether or not they are running (RocketMQ 4.9 refuses when none is online).
        """
        hdr = ResetOffsetRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        cfg = ctrl.topics.get(hdr.topic)
        if cfg is None:
            return error(
                cmd,
                ResponseCode.TOPIC_NOT_EXIST,
                f"[reset-offset] no topic {hdr.topic} in this broker",
            )
        table: dict[MessageQueue, int] = {}
        for qid in range(cfg.write_queue_nums):
            current = ctrl.offsets.query(hdr.group, hdr.topic, qid)
            if hdr.timestamp == -1:
                target = ctrl.store.get_max_offset_in_queue(hdr.topic, qid)
            else:
                target = ctrl.store.get_offset_in_queue_by_time(hdr.topic, qid, hdr.timestamp)
            target = max(0, target)
            if not hdr.is_force and 0 <= current < target:
                target = current
            table[MessageQueue(hdr.topic, ctrl.config.broker_name, qid)] = target
            ctrl.offsets.commit(hdr.group, hdr.topic, qid, target)
        body = ResetOffsetBody(table).to_json()
        told = ctrl.client_manage.send_to_group(
            hdr.group, RequestCode.RESET_CONSUMER_CLIENT_OFFSET, hdr.to_fields(), body
        )
        log.info(
            "consumer_offset_reset",
            group=hdr.group,
            topic=hdr.topic,
            timestamp=hdr.timestamp,
            consumers_told=told,
        )
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    # -- subscription groups -----------------------------------------------------------------
    @guarded()
    async def get_all_subscription_group_config(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        return cmd.make_response(ResponseCode.SUCCESS, body=self.ctrl.subscriptions.encode())

    @guarded()
    async def update_and_create_subscription_group(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        cfg = SubscriptionGroupConfig.from_json(cmd.body_bytes())
        try:
            self.ctrl.subscriptions.update(cfg)
        except ValueError as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        await self.ctrl.persist_subscriptions()
        log.info("subscription_group_updated", group=cfg.group_name)
        return cmd.make_response(ResponseCode.SUCCESS)

    # -- configuration --------------------------------------------------------------------------
    @guarded()
    async def get_broker_config(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """The configuration as `key=value` lines (RocketMQ's camelCase names)."""
        values = self.ctrl.config.model_dump()
        lines = [f"{_camel(k)}={'' if v is None else v}" for k, v in sorted(values.items())]
        body = ("\n".join(lines) + "\n").encode()
        version = dumps(self.ctrl.topics.data_version.to_dict()).decode()
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={"version": version}, body=body)


def _uptime(boot_ms: int) -> str:
    secs = max(0, int(time.time() - boot_ms / 1000))
    d, rem = divmod(secs, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"[ {d} days, {h} hours, {m} minutes, {s} seconds ]"


async def _disk_usage(path: object) -> dict[str, str]:
    import shutil
    from pathlib import Path

    def usage() -> dict[str, str]:
        p = Path(str(path))
        while not p.exists() and p != p.parent:
            p = p.parent
        du = shutil.disk_usage(p)
        ratio = du.used / du.total if du.total else 0.0
        return {
            "commitLogDirCapacity": f"Total : {du.total} Free : {du.free}",
            "commitLogDiskRatio": f"{ratio:.4f}",
        }

    # statvfs can block on a slow or network file system.
    return await trio.to_thread.run_sync(usage)

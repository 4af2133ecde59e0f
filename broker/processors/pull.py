"""PULL_MESSAGE (11): checks, tag filter, caps, offset commit, and long polling.

Response header: suggestWhichBrokerId, nextBeginOffset, minOffset, maxOffset; remark = the
store's GetMessageStatus name; body = the raw records concatenated (never re-encoded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
import trio

from broker.filter import (
    PropertyFilterDisabledError,
    build_subscription,
    drop_unmatched,
    sql_filter,
    tag_filter,
)
from broker.long_polling import ParkedPull
from broker.processors._common import error, guarded
from broker.topic_manager import is_readable
from common.filter import SubscriptionParseError
from common.pull import PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND
from common.sql92 import Sql92Filter
from remoting import Connection, RemotingCommand, Responder, ResponseCode
from remoting.protocol.bodies import SubscriptionData
from remoting.protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader
from remoting.protocol.route import MASTER_ID
from store.results import GetMessageResult, GetMessageStatus

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()


def pull_code(status: GetMessageStatus, requested_offset: int) -> int:
    """The response code for a store status, mapped as Apache RocketMQ's PullMessageProcessor
    maps GetMessageStatus."""
    if status is GetMessageStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    if status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
        return ResponseCode.PULL_OFFSET_MOVED
    # NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE
    return ResponseCode.PULL_OFFSET_MOVED if requested_offset != 0 else ResponseCode.PULL_NOT_FOUND


class PullProcessor:
    """The PULL_MESSAGE handler."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl
        # Controller mode: whether the last `_get` was cut at the confirm offset, and the
        # queues whose pulls wait for the confirm offset to pass a record.
        self._capped = False
        self._confirm_waits: set[tuple[str, int]] = set()

    @guarded()
    async def pull_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """An inline processor (registered with `inline=True`): checks and the store read run
        in the connection's reader and the answer is ready at once, unless the pull is to be
        held (nothing found, suspend flag set): it is then answered later (`_hold`)."""
        hdr = PullMessageRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        if not is_readable(ctrl.config.broker_permission):
            return error(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"the broker[{ctrl.addr}] pulling message is forbidden",
            )
        fence = ctrl.catch_up.fence
        if fence is not None:  # what it would serve may be behind its slave's
            return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, fence)
        group = ctrl.subscriptions.find_or_create(hdr.consumer_group)
        if group is None:
            return error(
                cmd,
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{hdr.consumer_group}] does not exist",
            )
        if not group.consume_enable:
            return error(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"subscription group no permission, {hdr.consumer_group}",
            )
        topic_cfg = ctrl.topics.get(hdr.topic)
        if topic_cfg is None:
            return error(
                cmd,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{hdr.topic}] not exist, apply first please!",
            )
        if not is_readable(topic_cfg.perm):
            return error(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"the topic[{hdr.topic}] pulling message is forbidden",
            )
        if hdr.queue_id < 0 or hdr.queue_id >= topic_cfg.read_queue_nums:
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{hdr.queue_id}] is illegal, topic:[{hdr.topic}] "
                f"topicConfig.readQueueNums:[{topic_cfg.read_queue_nums}] "
                f"consumer:[{conn.remote_address}]",
            )
        if hdr.max_msg_nums <= 0 or hdr.suspend_timeout_millis < 0:
            return self._illegal(cmd, hdr)
        sub: SubscriptionData | None
        if hdr.sys_flag & PULL_FLAG_SUBSCRIPTION:
            try:
                sub = build_subscription(
                    hdr.topic,
                    hdr.subscription,
                    expression_type=hdr.expression_type,
                    sub_version=hdr.sub_version,
                )
            except SubscriptionParseError as exc:
                return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        else:
            info = ctrl.consumers.get(hdr.consumer_group)
            if info is None:
                return error(
                    cmd,
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's group info not exist, group: {hdr.consumer_group}",
                )
            if info.message_model == "BROADCASTING" and not group.consume_broadcast_enable:
                return error(
                    cmd,
                    ResponseCode.NO_PERMISSION,
                    f"the consumer group[{hdr.consumer_group}] can not consume by broadcast way",
                )
            sub = info.subscriptions.get(hdr.topic)
            if sub is None:
                return error(
                    cmd,
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist, group: {hdr.consumer_group} "
                    f"topic: {hdr.topic}",
                )
            if sub.sub_version < hdr.sub_version:
                return error(
                    cmd,
                    ResponseCode.SUBSCRIPTION_NOT_LATEST,
                    "the consumer's subscription not latest",
                )
        match = tag_filter(sub)
        try:
            sql = sql_filter(sub, hdr.consumer_group, enabled=ctrl.config.enable_property_filter)
        except PropertyFilterDisabledError as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except SubscriptionParseError as exc:
            return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        max_msgs = max(1, min(hdr.max_msg_nums, ctrl.config.max_pull_msgs))

        result = self._get(hdr, hdr.queue_offset, max_msgs, match, sql)
        code = pull_code(result.status, hdr.queue_offset)
        # The piggybacked offset is stored when the request arrives, never after a long-poll
        # wait (as RocketMQ: the re-run after suspend does not commit): a pull parked while
        # its queue moved to another consumer would otherwise overwrite the newer offset.
        # A negative one is no offset: left out, as UPDATE_CONSUMER_OFFSET refuses it.
        if (
            hdr.sys_flag & PULL_FLAG_COMMIT_OFFSET
            and hdr.commit_offset >= 0
            and ctrl.broker_id == 0
        ):
            ctrl.offsets.commit(hdr.consumer_group, hdr.topic, hdr.queue_id, hdr.commit_offset)
        if (
            code == ResponseCode.PULL_NOT_FOUND
            and hdr.sys_flag & PULL_FLAG_SUSPEND
            and not conn.closed
        ):
            return self._hold(conn, cmd, hdr, max_msgs, match, result, sql)
        return self._response(cmd, code, result, hdr)

    def _suggest(self, group: str, result: GetMessageResult) -> int:
        """suggestWhichBrokerId: with slave reads on, the group's `whichBrokerWhenConsumeSlowly`
        for a read from beyond the page cache, else the group's `brokerId`; off: the master."""
        if not self.ctrl.config.slave_read_enable:
            return MASTER_ID
        cfg = self.ctrl.subscriptions.get(group)
        if cfg is None:
            return MASTER_ID
        if result.suggest_pulling_from_slave:
            return cfg.which_broker_when_consume_slowly
        return cfg.broker_id

    @staticmethod
    def _illegal(cmd: RemotingCommand, hdr: PullMessageRequestHeader) -> RemotingCommand:
        """maxMsgNums <= 0 or suspendTimeoutMillis < 0: in range of their types, but no pull
        asks for them (RocketMQ's clients send 1..1024 and >= 0)."""
        if hdr.max_msg_nums <= 0:
            what = f"maxMsgNums[{hdr.max_msg_nums}] is illegal, it must be > 0"
        else:
            what = f"suspendTimeoutMillis[{hdr.suspend_timeout_millis}] is illegal, it must be >= 0"
        return error(cmd, ResponseCode.SYSTEM_ERROR, f"{what}, topic:[{hdr.topic}]")

    def _hold(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        hdr: PullMessageRequestHeader,
        max_msgs: int,
        match: Callable[[int], bool] | None,
        first: GetMessageResult,
        sql: Sql92Filter | None = None,
    ) -> RemotingCommand | None:
        """Hold a pull that found nothing until matching messages arrive on its queue or its
        suspend time ends, then answer it through its responder (None: held).

        With long polling the pull is parked in `LongPollingService` and answered when an
        arrival is told (or by its timer), no task. When new messages do not
        match its filter it moves past them and waits again, as long as time is left. The
        answer is read from the offset it last waited at; the offset piggybacked on the
        request was committed when it arrived.
        """
        ctrl = self.ctrl
        cfg = ctrl.config
        if cfg.long_polling_enable:
            wait_ms = min(hdr.suspend_timeout_millis, cfg.max_suspend_ms)
        else:
            wait_ms = cfg.short_polling_time_ms
        if wait_ms <= 0:
            return self._response(cmd, pull_code(first.status, hdr.queue_offset), first, hdr)
        deadline = trio.current_time() + wait_ms / 1000
        if not cfg.long_polling_enable:
            ctrl.spawn(self._short_poll, conn.defer(cmd), hdr, max_msgs, match, deadline, sql)
            return None
        responder: Responder | None = None

        def resume(p: ParkedPull, final: bool) -> bool:
            result = self._get(hdr, p.offset, max_msgs, match, sql)
            if not final and trio.current_time() < p.deadline:
                if (
                    result.status is GetMessageStatus.NO_MATCHED_MESSAGE
                    and result.next_begin_offset > p.offset
                ):
                    p.offset = result.next_begin_offset  # only filtered-out messages: wait on
                    return False
                if self._capped and not result.buffers:
                    return False  # arrived but not confirmed yet: woken again once it is

            response = self._response(cmd, pull_code(result.status, p.offset), result, hdr)
            assert responder is not None  # set right after `park`, before any arrival
            responder.respond(response, direct=True)
            return True

        # No schedule point since the read: nothing can have arrived meanwhile. A queue that
        # already reaches past the offset (an entry not readable, OFFSET_FOUND_NULL) would
        # not be notified again, and a full service parks nothing: answer those now, as a
        # woken pull would.
        topic, queue_id, offset = hdr.topic, hdr.queue_id, hdr.queue_offset
        # A read cut at the confirm offset ends where readers see the queue end.
        visible = (
            first.max_offset
            if self._capped
            else ctrl.store.get_max_offset_in_queue(topic, queue_id)
        )
        if visible <= offset and (
            ctrl.long_polling.park(topic, queue_id, offset, deadline, resume)
        ):
            responder = conn.defer(cmd)
            return None
        return self._response(cmd, pull_code(first.status, hdr.queue_offset), first, hdr)

    async def _short_poll(
        self,
        responder: Responder,
        hdr: PullMessageRequestHeader,
        max_msgs: int,
        match: Callable[[int], bool] | None,
        deadline: float,
        sql: Sql92Filter | None = None,
    ) -> None:
        """Without long polling: wait the short polling time, read again, answer (a broker
        task; if the broker stops first the pull stays unanswered and its connection closes)."""
        await trio.sleep_until(deadline)
        cmd = responder.request
        try:
            result = self._get(hdr, hdr.queue_offset, max_msgs, match, sql)
            response = self._response(cmd, pull_code(result.status, hdr.queue_offset), result, hdr)
        except Exception as exc:
            log.exception("short_poll_failed", topic=hdr.topic)
            response = error(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        responder.respond(response)

    def _get(
        self,
        hdr: PullMessageRequestHeader,
        offset: int,
        max_msgs: int,
        match: Callable[[int], bool] | None,
        sql: Sql92Filter | None = None,
    ) -> GetMessageResult:
        """The store's answer; in controller mode cut at the group's confirm offset
        (`BrokerController.read_limit`): records past it are not there yet for readers, and
        the queue's pulls are woken once they are confirmed. Sets `self._capped`. An SQL92
        filter then drops the records left whose properties do not match (after the cut, so
        the next offset never passes an unconfirmed record)."""
        ctrl = self.ctrl
        result = ctrl.store.get_message_nowait(
            hdr.consumer_group,
            hdr.topic,
            hdr.queue_id,
            offset,
            max_msgs,
            ctrl.config.max_pull_bytes,
            match,
        )
        self._capped = False
        limit = ctrl.read_limit()
        if limit is not None and result.buffers:
            for i, buf in enumerate(result.buffers):
                # PHYSICALOFFSET, bytes 28..36 of every record.
                end = int.from_bytes(buf[28:36], "big") + len(buf)
                if end > limit:
                    self._cut(result, i, offset)
                    self._wake_when_confirmed(hdr.topic, hdr.queue_id, end)
                    self._capped = True
                    break
        if sql is not None and result.buffers:
            drop_unmatched(result, sql)
        return result

    @staticmethod
    def _cut(result: GetMessageResult, keep: int, offset: int) -> None:
        """Keep the first `keep` records of `result`; the next pull starts at the first one
        dropped, which is also the queue's end as readers see it."""
        first_out = result.queue_offsets[keep]
        del result.buffers[keep:]
        del result.queue_offsets[keep:]
        result.message_count = keep
        result.buffer_total_size = sum(len(b) for b in result.buffers)
        result.next_begin_offset = first_out
        result.max_offset = first_out
        if keep == 0:
            result.status = GetMessageStatus.OFFSET_OVERFLOW_ONE
            result.next_begin_offset = offset

    def _wake_when_confirmed(self, topic: str, queue_id: int, end: int) -> None:
        """Resume the queue's parked pulls once the group confirmed up to `end` (one wait per
        queue at a time; a later cut read registers the next)."""
        ha = self.ctrl.ha_master
        key = (topic, queue_id)
        if ha is None or key in self._confirm_waits:
            return
        self._confirm_waits.add(key)
        ctrl = self.ctrl

        def confirmed(_ok: bool) -> None:
            self._confirm_waits.discard(key)
            store = ctrl._store
            if store is not None:
                ctrl.long_polling.notify(
                    topic, queue_id, store.get_max_offset_in_queue(topic, queue_id)
                )

        ha.when_replicated(end, confirmed, self.ctrl.config.slave_timeout_ms / 1000)

    def _response(
        self,
        cmd: RemotingCommand,
        code: int,
        result: GetMessageResult,
        hdr: PullMessageRequestHeader,
    ) -> RemotingCommand:
        """The answer of the pull `hdr` from `result`; records served are counted (stats and,
        with metrics on, `broker.metrics.Traffic`; always `broker.stats`: one call each per
        answer)."""
        fields = PullMessageResponseHeader(
            suggest_which_broker_id=self._suggest(hdr.consumer_group, result),
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
        ).to_fields()
        body = b"".join(result.buffers) if code == ResponseCode.SUCCESS else None
        if body is not None:
            self.ctrl.stats.get_count += result.message_count
            self.ctrl.table_stats.count_get(
                hdr.topic, hdr.consumer_group, result.message_count, len(body)
            )
            traffic = self.ctrl.traffic
            if traffic is not None:
                traffic.count_out(
                    hdr.topic,
                    hdr.consumer_group,
                    hdr.queue_id,
                    result.message_count,
                    len(body),
                    result.next_begin_offset,
                )
        return cmd.make_response(code, result.status.name, ext_fields=fields, body=body)

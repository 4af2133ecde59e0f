"""CONSUMER_SEND_MSG_BACK (36): a consumer hands back a message it failed to consume.

The broker looks the record up by its commitlog offset, keeps the original topic in RETRY_TOPIC
(when not already set) and the original message id in ORIGIN_MESSAGE_ID, increments the
reconsume times and stores the copy in `%RETRY%<group>` (auto-created with the group's
retryQueueNums, 1 by default) with delay level `3 + reconsume times` (or the level asked for),
through the schedule service. At the group's `retryMaxTimes` (16; the header's
`maxReconsumeTimes` wins when sent) or for a negative delay level it goes to `%DLQ%<group>`
queue 0 instead, created write-only (perm 2) as RocketMQ does: to read a DLQ, an operator (or
`mqadmin`) first updates the topic's perm to 6.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import structlog

from broker.processors._common import error, guarded
from broker.topic_manager import (
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    is_writeable,
)
from common.message import (
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT,
    MessageInner,
)
from remoting import Connection, RemotingCommand, ResponseCode
from remoting.protocol.headers import ConsumerSendMsgBackRequestHeader

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()

DLQ_PERM = PERM_WRITE


class SendBackProcessor:
    """The CONSUMER_SEND_MSG_BACK handler."""

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl

    @guarded()
    async def consumer_send_msg_back(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        hdr = ConsumerSendMsgBackRequestHeader.from_fields(cmd.ext_fields)
        ctrl = self.ctrl
        group = ctrl.subscriptions.find_or_create(hdr.group)
        if group is None:
            return error(
                cmd,
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {hdr.group}",
            )
        if not is_writeable(ctrl.config.broker_permission):
            return error(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"the broker[{ctrl.addr}] sending message is forbidden",
            )
        if group.retry_queue_nums <= 0:
            return cmd.make_response(ResponseCode.SUCCESS)  # the group wants no retries
        ext = ctrl.store.look_message_by_offset(hdr.offset)
        if ext is None:
            return error(
                cmd, ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {hdr.offset}"
            )
        props = dict(ext.properties)
        if PROPERTY_RETRY_TOPIC not in props:
            props[PROPERTY_RETRY_TOPIC] = ext.topic
        props[PROPERTY_WAIT] = "false"
        props.pop(PROPERTY_DELAY, None)
        if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
            props[PROPERTY_ORIGIN_MESSAGE_ID] = ext.msg_id
        max_times = group.retry_max_times
        if hdr.max_reconsume_times is not None and hdr.max_reconsume_times >= 0:
            max_times = hdr.max_reconsume_times
        delay_level = hdr.delay_level
        if ext.reconsume_times >= max_times or delay_level < 0:
            topic = DLQ_GROUP_TOPIC_PREFIX + hdr.group
            queue_id = 0
            created = ctrl.topics.get(topic) is None
            ctrl.topics.create_in_send_back(topic, 1, DLQ_PERM)
        else:
            topic = RETRY_GROUP_TOPIC_PREFIX + hdr.group
            nums = max(1, group.retry_queue_nums)
            queue_id = random.randrange(nums)
            created = ctrl.topics.get(topic) is None
            ctrl.topics.create_in_send_back(topic, nums, PERM_READ | PERM_WRITE)
            if delay_level == 0:
                delay_level = 3 + ext.reconsume_times
            props[PROPERTY_DELAY] = str(delay_level)
        if created:
            # Durable before the message that needs it is acknowledged (once per group).
            await ctrl.persist_topics()
            ctrl.on_topics_changed()
        msg = MessageInner(
            topic,
            ext.body or b"",
            queue_id=queue_id,
            flag=ext.flag,
            properties=props,
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=ext.born_host,
            store_host=ctrl.store_host,
            reconsume_times=ext.reconsume_times + 1,
        )
        ctrl.schedule.route_delay(msg)
        ctrl.send.finish(msg)
        result = await ctrl.commits.put((msg,))
        if not result.ok:
            return error(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"{result.status.name}{': ' + result.remark if result.remark else ''}",
            )
        ctrl.stats.put_count += 1
        # SNDBCK_PUT_NUMS under the message's original topic, as RocketMQ counts it.
        ctrl.table_stats.count_send_back(props[PROPERTY_RETRY_TOPIC], hdr.group)
        log.debug(
            "message_sent_back",
            group=hdr.group,
            topic=topic,
            reconsume_times=msg.reconsume_times,
            delay_level=delay_level,
        )
        return cmd.make_response(ResponseCode.SUCCESS)

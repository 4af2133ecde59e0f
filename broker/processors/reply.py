"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): a responder's reply, pushed to
the requester with PUSH_REPLY_MESSAGE_TO_CLIENT (326) and stored (RocketMQ's
ReplyMessageProcessor).

The requester is found by the reply's REPLY_TO_CLIENT property among the clients the broker
knows from heartbeats (producers first, as RocketMQ, then consumers). The answer says whether
the push worked: SUCCESS, or SYSTEM_ERROR with RocketMQ's remark. With
`store_reply_message_enable` (RocketMQ's storeReplyMessageEnable, default on) the reply is
also stored in the reply topic whatever the push did; the answer then carries the stored
message's id and offset. Design: docs/request-reply.md.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import structlog

from broker.processors._common import guarded_send, split_addr
from broker.processors.client_manage import ATTR_SERIALIZE_TYPE
from common.message import (
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_PUSH_REPLY_TIME,
    MessageInner,
    decode_properties,
    encode_properties,
)
from remoting import Connection, RemotingCommand, RemotingError, ResponseCode, SerializeType
from remoting.codes import RequestCode
from remoting.protocol.headers import SendMessageRequestHeader
from store.results import PutMessageStatus

if TYPE_CHECKING:
    from broker.controller import BrokerController

log = structlog.get_logger()

# How long the broker waits for the requester to acknowledge a push. RocketMQ waits 10 s;
# a responder's send gives up after 3 s by default, so a longer wait would answer nobody.
PUSH_TIMEOUT_MS = 3000

_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


def _host_text(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


class ReplyProcessor:
    """Handler of the reply codes.

    Args:
        ctrl: the broker.
        store_reply: store replies too (storeReplyMessageEnable).
    """

    def __init__(self, ctrl: BrokerController, *, store_reply: bool = True) -> None:
        self.ctrl = ctrl
        self.store_reply = store_reply

    def region_fields(self) -> dict[str, str]:
        return self.ctrl.send.region_fields()

    def _response(
        self, cmd: RemotingCommand, code: int, remark: str | None = None
    ) -> RemotingCommand:
        return cmd.make_response(code, remark, ext_fields=self.region_fields())

    @guarded_send
    async def send_reply_message(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325)."""
        hdr = SendMessageRequestHeader.from_command(cmd)
        ctrl = self.ctrl
        if hdr.batch:
            return self._response(
                cmd, ResponseCode.MESSAGE_ILLEGAL, "a reply message cannot be a batch"
            )
        # The send checks (RocketMQ's msgCheck): permission, topic, queue id.
        topic_cfg, err = ctrl.send._check(cmd, hdr)
        if err is not None:
            return err
        assert topic_cfg is not None
        body = cmd.body_bytes()
        max_size = ctrl.config.max_message_size
        if not body:
            return self._response(cmd, ResponseCode.MESSAGE_ILLEGAL, "the message body is empty")
        if len(body) > max_size:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {len(body)} exceeds the limit {max_size}",
            )
        raw = hdr.properties or ""
        max_props = ctrl.config.max_properties_size
        if len(raw.encode()) > max_props:
            return self._response(
                cmd,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message properties exceed {max_props} bytes",
            )
        props = decode_properties(raw)
        client_id = props.get(PROPERTY_MESSAGE_REPLY_TO_CLIENT)
        if not client_id:
            # Not a reply: nobody to push to (RocketMQ's answer), and nothing stored.
            log.warning("reply_without_requester", topic=hdr.topic, peer=conn.remote_address)
            return self._response(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"reply message properties[{PROPERTY_MESSAGE_REPLY_TO_CLIENT}] is null",
            )
        queue_id = hdr.queue_id
        if queue_id < 0:
            queue_id = random.randrange(max(1, topic_cfg.write_queue_nums))

        pushed, remark = await self._push(conn, hdr, body, props, client_id)
        if pushed:
            resp = cmd.make_response(
                ResponseCode.SUCCESS,
                None,
                ext_fields={
                    **self.region_fields(),
                    # RocketMQ answers "0" so that clients can decode it; a stored reply's
                    # own id and offset replace these below.
                    "msgId": "0",
                    "queueId": str(queue_id),
                    "queueOffset": "0",
                },
            )
        else:
            resp = self._response(cmd, ResponseCode.SYSTEM_ERROR, remark)
        if self.store_reply:
            await self._store(conn, hdr, body, props, queue_id, resp, pushed)
        return resp

    async def _push(
        self,
        conn: Connection,
        hdr: SendMessageRequestHeader,
        body: bytes,
        props: dict[str, str],
        client_id: str,
    ) -> tuple[bool, str]:
        """Push the reply to `client_id`'s connection; (pushed, remark when not)."""
        ctrl = self.ctrl
        channel = ctrl.producers.find_channel(client_id) or ctrl.consumers.find_channel(client_id)
        if not isinstance(channel, Connection) or channel.closed:
            remark = f"push reply message fail, channel of <{client_id}> not found."
            log.warning("reply_requester_not_found", client_id=client_id, topic=hdr.topic)
            return False, remark
        pushed_props = dict(props)
        pushed_props[PROPERTY_PUSH_REPLY_TIME] = str(int(time.time() * 1000))
        fields = {
            "producerGroup": hdr.producer_group,
            "topic": hdr.topic,
            "defaultTopic": hdr.default_topic,
            "defaultTopicQueueNums": str(hdr.default_topic_queue_nums),
            "queueId": str(hdr.queue_id),
            "sysFlag": str(hdr.sys_flag),
            "bornTimestamp": str(hdr.born_timestamp),
            "flag": str(hdr.flag),
            "properties": encode_properties(pushed_props),
            "unitMode": "true" if hdr.unit_mode else "false",
            "bornHost": _host_text(split_addr(conn.remote_address)),
            "storeHost": _host_text(ctrl.store_host),
            "storeTimestamp": str(int(time.time() * 1000)),
        }
        if hdr.reconsume_times is not None:
            fields["reconsumeTimes"] = str(hdr.reconsume_times)
        st = channel.attributes.get(ATTR_SERIALIZE_TYPE, SerializeType.JSON)
        req = RemotingCommand.request(
            RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT,
            fields,
            body,
            serialize_type=int(st) if isinstance(st, int) else SerializeType.JSON,
        )
        try:
            answer = await channel.invoke(req, PUSH_TIMEOUT_MS)
        except RemotingError as exc:
            log.warning("reply_push_failed", client_id=client_id, error=str(exc))
            return False, f"push reply message to {client_id} fail: {exc}"
        if answer.code != ResponseCode.SUCCESS:
            log.warning(
                "reply_push_refused", client_id=client_id, code=answer.code, remark=answer.remark
            )
            return False, (
                f"push reply message to {client_id} fail: the client answered {answer.code} "
                f"{answer.remark or ''}".rstrip()
            )
        return True, ""

    async def _store(
        self,
        conn: Connection,
        hdr: SendMessageRequestHeader,
        body: bytes,
        props: dict[str, str],
        queue_id: int,
        resp: RemotingCommand,
        pushed: bool,
    ) -> None:
        """Store the reply in its topic; a stored reply's id and offset go into a SUCCESS
        answer. A failed store is logged and leaves the answer as the push made it, as
        RocketMQ does."""
        ctrl = self.ctrl
        if ctrl.send.is_slave:
            log.warning("reply_not_stored_on_slave", topic=hdr.topic)
            return
        msg = MessageInner(
            hdr.topic,
            body,
            queue_id=queue_id,
            flag=hdr.flag,
            properties=props,
            sys_flag=hdr.sys_flag,
            born_timestamp=hdr.born_timestamp,
            born_host=split_addr(conn.remote_address),
            store_host=ctrl.store_host,
            reconsume_times=hdr.reconsume_times or 0,
        )
        msg.properties_string = hdr.properties or ""
        result = await ctrl.commits.put([msg])
        append = result.append
        if result.status not in _STORED or append is None:
            log.warning("reply_store_failed", topic=hdr.topic, status=result.status.name)
            return
        ctrl.stats.put_count += append.msg_num
        ctrl.table_stats.count_put(hdr.topic, append.msg_num, append.wrote_bytes)
        traffic = ctrl.traffic
        if traffic is not None:
            traffic.count_in(hdr.topic, append.msg_num, append.wrote_bytes)
        if pushed and resp.ext_fields is not None:
            resp.ext_fields["msgId"] = ",".join(append.msg_ids)
            resp.ext_fields["queueOffset"] = str(append.queue_offset)

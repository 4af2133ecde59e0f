"""Transactional messages: half messages, op records, and the check-back service.

- A TRAN_MSG=true send is stored as a *half* message in `RMQ_SYS_TRANS_HALF_TOPIC` queue 0
  (REAL_TOPIC / REAL_QID / PGROUP kept, sys flag transaction bits reset) (`prepare`).
- END_TRANSACTION commit writes the real message (sys flag COMMIT, TRAN_MSG and REAL_* cleared)
  and an *op* record; rollback writes the op record only. Op record: topic
  `RMQ_SYS_TRANS_OP_HALF_TOPIC` queue 0, tag `d`, body = the half message's queue offset in
  decimal.
- Check-back (`check_once`, every `transaction_check_interval_ms`): walks the half queue from
  its progress offset; a half message with an op record is done; one younger than its immunity
  time (CHECK_IMMUNITY_TIME_IN_SECONDS, else `transaction_timeout_ms`) stops the walk (later ones
  are younger); one checked `transaction_check_max` times goes to `TRANS_CHECK_MAX_TIME_TOPIC`;
  any other is re-queued at the end of the half queue with TRANSACTION_CHECK_TIMES + 1 and a
  CHECK_TRANSACTION_STATE (39) request for the new copy goes oneway to a live producer of its
  PGROUP. Progress is kept as consumer offsets of the system group `CID_RMQ_SYS_TRANS` on the
  half and op topics (`config/consumerOffset.json`), as RocketMQ does, so it survives restarts.
  The op progress never passes an op record whose half offset is at or above the half
  progress, so the set of resolved half offsets is rebuilt from the op queue after a restart.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

import structlog
import trio

from broker.commit import Put
from broker.consumer_manager import ClientChannelInfo
from broker.schedule import real_message
from broker.topic_manager import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from common.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageDecodeError,
    MessageExt,
    MessageInner,
    decode_record,
    encode_record,
)
from remoting import RemotingCommand, RequestCode, SerializeType
from remoting.protocol.headers import CheckTransactionStateRequestHeader
from store.results import GetMessageStatus, PutMessageResult

if TYPE_CHECKING:
    from broker.offset_manager import OffsetManager
    from broker.producer_manager import ProducerManager
    from store import MessageStore

log = structlog.get_logger()

TRANS_SYS_GROUP = "CID_RMQ_SYS_TRANS"
OP_TAG = "d"
# Half messages older than this are skipped by the check (RocketMQ's fileReservedTime).
MAX_HALF_AGE_MS = 72 * 3_600_000

_BATCH = 32
_READ_BYTES = 4 * 1024 * 1024


class _CheckChannel(Protocol):
    """What check-back needs of a producer's channel (`remoting.Connection` has it)."""

    @property
    def remote_address(self) -> str: ...

    async def invoke_oneway(self, cmd: RemotingCommand) -> None: ...


def wall_ms() -> int:
    return int(time.time() * 1000)


def is_transactional(props: dict[str, str]) -> bool:
    return props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"


def prepare(msg: MessageInner) -> None:
    """Turn `msg` into its half message (in place; caller re-encodes the properties)."""
    props = msg.properties
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QID] = str(msg.queue_id)
    msg.topic = TRANS_HALF_TOPIC
    msg.queue_id = 0
    msg.sys_flag &= ~TRANSACTION_TYPE_MASK
    msg.properties_string = None


def committed_message(half: MessageExt, store_host: tuple[str, int]) -> MessageInner:
    """The real message for a committed half message."""
    msg = real_message(half, store_host)
    msg.properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
    msg.properties.pop(PROPERTY_TRANSACTION_CHECK_TIMES, None)
    msg.sys_flag = (msg.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE
    msg.prepared_transaction_offset = half.commit_log_offset
    msg.properties_string = None
    return msg


def op_message(half_queue_offset: int, store_host: tuple[str, int], now_ms: int) -> MessageInner:
    """The op record saying the half message at `half_queue_offset` is resolved."""
    return MessageInner(
        TRANS_OP_HALF_TOPIC,
        str(half_queue_offset).encode(),
        queue_id=0,
        properties={PROPERTY_TAGS: OP_TAG},
        sys_flag=TRANSACTION_NOT_TYPE,
        born_timestamp=now_ms,
        born_host=store_host,
        store_host=store_host,
    )


def check_request(half: MessageExt, store_host: tuple[str, int]) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE (39) for a stored half message; the body is the record with the
    real topic and queue restored, as Java producers expect."""
    shown = half.to_inner()
    props = shown.properties
    shown.topic = props.get(PROPERTY_REAL_TOPIC, half.topic)
    try:
        shown.queue_id = int(props.get(PROPERTY_REAL_QID, "0"))
    except ValueError:
        shown.queue_id = 0
    shown.properties_string = None
    body = encode_record(shown, half.queue_offset, half.commit_log_offset, half.store_timestamp)
    uniq = props.get(PROPERTY_UNIQ_KEY)
    hdr = CheckTransactionStateRequestHeader(
        tran_state_table_offset=half.queue_offset,
        commit_log_offset=half.commit_log_offset,
        msg_id=uniq or half.msg_id,
        transaction_id=uniq or half.msg_id,
        offset_msg_id=half.msg_id,
    )
    return RemotingCommand.request(
        RequestCode.CHECK_TRANSACTION_STATE, hdr.to_fields(), bytes(body)
    )


class TransactionService:
    """End-of-transaction writes and the check-back service.

    Args:
        offsets: the broker's offset manager (progress as CID_RMQ_SYS_TRANS offsets).
        producers: online producers (check requests go to one of the group's channels).
        store_host: the broker's (ip, port) for records it writes.
        check_interval_ms / timeout_ms / check_max: the RocketMQ settings.
        now_ms: wall clock in epoch ms.
    """

    def __init__(
        self,
        offsets: OffsetManager,
        producers: ProducerManager,
        store_host: Callable[[], tuple[str, int]],
        *,
        check_interval_ms: int = 60_000,
        timeout_ms: int = 6000,
        check_max: int = 15,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.offsets = offsets
        self.producers = producers
        self._store_host = store_host
        self.check_interval_ms = check_interval_ms
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self.now_ms = now_ms
        self._store: MessageStore | None = None
        self._append: Put | None = None
        self.resolved: set[int] = set()  # half queue offsets with an op record
        self.checks_sent = 0
        self.discarded = 0
        self._lock = trio.Lock()
        self._kick = trio.Event()

    def attach(self, store: MessageStore, put: Put) -> None:
        """Read `store`; append with `put` (the broker's `CommitBatcher.put`)."""
        self._store = store
        self._append = put

    async def _put(self, msg: MessageInner) -> PutMessageResult:
        if self._append is None:
            raise RuntimeError("the transaction service has no store")
        return await self._append((msg,))

    @property
    def store(self) -> MessageStore:
        if self._store is None:
            raise RuntimeError("the transaction service has no store")
        return self._store

    # -- end transaction -----------------------------------------------------------------------
    def find_half(self, commit_log_offset: int) -> MessageExt | None:
        ext = self.store.look_message_by_offset(commit_log_offset)
        if ext is None or ext.topic != TRANS_HALF_TOPIC:
            return None
        return ext

    async def write_op(self, half_queue_offset: int) -> PutMessageResult:
        result = await self._put(op_message(half_queue_offset, self._store_host(), self.now_ms()))
        if result.ok:
            self.resolved.add(half_queue_offset)
        return result

    # -- check-back ----------------------------------------------------------------------------
    def _progress(self, topic: str) -> int:
        off = self.offsets.query(TRANS_SYS_GROUP, topic, 0)
        if off < 0:
            off = self.store.get_min_offset_in_queue(topic, 0)
        return off

    async def _read(self, topic: str, offset: int) -> tuple[list[MessageExt], int, bool]:
        """Records of `topic` queue 0 from `offset`: (records, next offset, more may follow)."""
        res = await self.store.get_message(TRANS_SYS_GROUP, topic, 0, offset, _BATCH, _READ_BYTES)
        if res.status is GetMessageStatus.FOUND:
            out = []
            for buf in res.buffers:
                try:
                    out.append(decode_record(buf))
                except MessageDecodeError:
                    log.exception("transaction_record_undecodable", topic=topic)
            return out, res.next_begin_offset, True
        if res.next_begin_offset > offset and res.status in (
            GetMessageStatus.OFFSET_TOO_SMALL,
            GetMessageStatus.OFFSET_FOUND_NULL,
            GetMessageStatus.MESSAGE_WAS_REMOVING,
        ):
            return [], res.next_begin_offset, True
        return [], offset, False

    async def _load_ops(self, half_progress: int) -> None:
        """Read op records from the op progress; move the op progress over the prefix whose
        half offsets are below `half_progress`."""
        op_off = self._progress(TRANS_OP_HALF_TOPIC)
        new_op_progress = op_off
        prefix = True
        offset = op_off
        while True:
            records, nxt, more = await self._read(TRANS_OP_HALF_TOPIC, offset)
            for ext in records:
                try:
                    half_off = int((ext.body or b"").decode())
                except ValueError:
                    half_off = -1
                if half_off >= half_progress:
                    self.resolved.add(half_off)
                    prefix = False
                elif prefix:
                    new_op_progress = ext.queue_offset + 1
            if prefix:
                new_op_progress = max(new_op_progress, nxt)
            if not more or nxt == offset:
                break
            offset = nxt
        if new_op_progress != op_off:
            self.offsets.commit(TRANS_SYS_GROUP, TRANS_OP_HALF_TOPIC, 0, new_op_progress)

    def _pick_producer(self, group: str) -> _CheckChannel | None:
        members: list[ClientChannelInfo] = self.producers.members(group)
        live = [
            cast("_CheckChannel", m.channel)
            for m in members
            if hasattr(m.channel, "invoke_oneway") and not getattr(m.channel, "closed", False)
        ]
        return random.choice(live) if live else None

    async def check_once(self) -> int:
        """One check pass. Returns how many half messages were re-queued and checked."""
        async with self._lock:
            return await self._check_once()

    async def _check_once(self) -> int:
        store = self.store
        half_off = self._progress(TRANS_HALF_TOPIC)
        await self._load_ops(half_off)
        end = store.get_max_offset_in_queue(TRANS_HALF_TOPIC, 0)
        checked = 0
        offset = half_off
        host = self._store_host()
        stop = False
        while offset < end and not stop:
            records, nxt, more = await self._read(TRANS_HALF_TOPIC, offset)
            if not more:
                break
            if not records:
                offset = nxt
                continue
            for ext in records:
                qoff = ext.queue_offset
                if qoff >= end:
                    stop = True
                    break
                if qoff in self.resolved:
                    offset = qoff + 1
                    continue
                now = self.now_ms()
                age = now - ext.store_timestamp
                props = ext.properties
                try:
                    times = int(props.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0"))
                except ValueError:
                    times = 0
                if age > MAX_HALF_AGE_MS:
                    offset = qoff + 1
                    continue
                if times >= self.check_max:
                    await self._discard(ext, host)
                    offset = qoff + 1
                    continue
                immunity = self.timeout_ms
                raw_imm = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
                if raw_imm:
                    try:
                        immunity = max(immunity, int(raw_imm) * 1000)
                    except ValueError:
                        pass
                if age < self.timeout_ms:
                    stop = True  # later half messages are younger still
                    break
                if age < immunity:
                    # Own longer immunity: keep it for later without counting a check.
                    if not await self._requeue(ext, host, times, count=False):
                        stop = True
                        break
                    offset = qoff + 1
                    continue
                if not await self._requeue(ext, host, times, count=True):
                    stop = True
                    break
                checked += 1
                offset = qoff + 1
            else:
                offset = max(offset, nxt)
        if offset != half_off:
            self.offsets.commit(TRANS_SYS_GROUP, TRANS_HALF_TOPIC, 0, offset)
            self.resolved = {o for o in self.resolved if o >= offset}
        return checked

    async def _requeue(
        self, ext: MessageExt, host: tuple[str, int], times: int, *, count: bool
    ) -> bool:
        copy = ext.to_inner()
        copy.store_host = host
        if count:
            copy.properties[PROPERTY_TRANSACTION_CHECK_TIMES] = str(times + 1)
        copy.properties_string = None
        result = await self._put(copy)
        if not result.ok or result.append is None:
            log.warning("transaction_requeue_failed", status=result.status.name)
            return False
        if not count:
            return True
        new_phy = result.append.wrote_offset
        new_half = self.store.look_message_by_offset(new_phy)
        group = ext.properties.get(PROPERTY_PRODUCER_GROUP, "")
        conn = self._pick_producer(group)
        if new_half is None or conn is None:
            log.info(
                "transaction_check_no_producer",
                group=group,
                half_offset=ext.queue_offset,
                check_times=times + 1,
            )
            return True
        try:
            cmd = check_request(new_half, host)
            # Speak the producer's header format (Java clients cannot read msgpack headers).
            attrs = getattr(conn, "attributes", None)
            st = attrs.get("serialize_type") if isinstance(attrs, dict) else None
            cmd.serialize_type = st if isinstance(st, int) else SerializeType.JSON
            await conn.invoke_oneway(cmd)
            self.checks_sent += 1
            log.info(
                "transaction_check_sent",
                group=group,
                half_offset=new_half.queue_offset,
                check_times=times + 1,
                peer=conn.remote_address,
            )
        except Exception as exc:  # a producer going away must not stop the pass
            log.warning("transaction_check_send_failed", group=group, error=str(exc))
        return True

    async def _discard(self, ext: MessageExt, host: tuple[str, int]) -> None:
        copy = ext.to_inner()
        copy.topic = TRANS_CHECK_MAX_TIME_TOPIC
        copy.queue_id = 0
        copy.store_host = host
        copy.properties_string = None
        result = await self._put(copy)
        self.discarded += 1
        log.warning(
            "transaction_check_max_reached",
            half_offset=ext.queue_offset,
            group=ext.properties.get(PROPERTY_PRODUCER_GROUP),
            stored=result.ok,
        )

    async def run(self) -> None:
        """Check every `check_interval_ms` until cancelled."""
        while True:
            with trio.move_on_after(self.check_interval_ms / 1000):
                await self._kick.wait()
            self._kick = trio.Event()
            try:
                await self.check_once()
            except Exception:
                log.exception("transaction_check_failed")

    def kick(self) -> None:
        """Run a check pass now (admin/tests)."""
        self._kick.set()

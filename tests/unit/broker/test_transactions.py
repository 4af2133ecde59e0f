"""Transaction service over an in-process store: half/op records and the check-back pass, with a
fake producer channel, on trio's virtual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing

from broker.consumer_manager import ClientChannelInfo
from broker.offset_manager import OffsetManager
from broker.producer_manager import ProducerManager
from broker.topic_manager import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.transaction import (
    TRANS_SYS_GROUP,
    TransactionService,
    committed_message,
    is_transactional,
    op_message,
    prepare,
)
from common.message import (
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    MessageInner,
    decode_record,
    decode_records,
)
from remoting import RemotingCommand, RequestCode, SerializeType
from remoting.protocol.headers import CheckTransactionStateRequestHeader
from store import GetMessageStatus, MessageStore, StoreConfig

BASE_S = 1_700_000_000.0
HOST = ("127.0.0.1", 10911)


def wall() -> float:
    return BASE_S + trio.current_time()


def wall_ms() -> int:
    return int(wall() * 1000)


class FakeProducerChannel:
    """A producer connection that records what the broker sends it."""

    def __init__(self, ident: int = 1) -> None:
        self.id = ident
        self.remote_address = f"192.0.2.9:{40000 + ident}"
        self.closed = False
        self.sent: list[RemotingCommand] = []

    async def invoke_oneway(self, cmd: RemotingCommand) -> None:
        self.sent.append(cmd)


def store_cfg(root: Path) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 1024 * 1024,
            "mapped_file_size_consume_queue": 100 * 20,
            "max_hash_slot_num": 64,
            "max_index_num": 256,
        }
    )


@asynccontextmanager
async def service(
    root: Path, producers: ProducerManager, check_max: int = 3
) -> AsyncIterator[tuple[MessageStore, TransactionService, OffsetManager]]:
    offsets = OffsetManager(root)
    offsets.load()
    tx = TransactionService(
        offsets, producers, lambda: HOST, timeout_ms=6000, check_max=check_max, now_ms=wall_ms
    )
    async with MessageStore(store_cfg(root), clock=wall) as store:
        tx.attach(store, store.put_messages)
        yield store, tx, offsets
    offsets.persist()


def tx_message(body: bytes, **props: str) -> MessageInner:
    p = {"TRAN_MSG": "true", "PGROUP": "PG", "UNIQ_KEY": f"U-{body.decode()}", **props}
    return MessageInner(
        "Real",
        body,
        queue_id=2,
        properties=p,
        sys_flag=TRANSACTION_PREPARED_TYPE,
        born_timestamp=wall_ms(),
        born_host=("192.0.2.1", 1234),
        store_host=HOST,
    )


async def put_half(store: MessageStore, body: bytes, **props: str) -> MessageExt:
    msg = tx_message(body, **props)
    assert is_transactional(msg.properties)
    prepare(msg)
    r = await store.put_message(msg)
    assert r.ok
    assert r.append is not None
    ext = store.look_message_by_offset(r.append.wrote_offset)
    assert ext is not None
    return ext


async def read_all(store: MessageStore, topic: str, qid: int = 0) -> list[MessageExt]:
    res = await store.get_message("G", topic, qid, 0, 1000, 1 << 22)
    if res.status is not GetMessageStatus.FOUND:
        return []
    return decode_records(b"".join(res.buffers))


async def test_prepare_and_commit_shapes() -> None:
    msg = tx_message(b"a")
    prepare(msg)
    assert (msg.topic, msg.queue_id) == (TRANS_HALF_TOPIC, 0)
    assert msg.sys_flag & TRANSACTION_TYPE_MASK == 0
    assert msg.properties[PROPERTY_REAL_TOPIC] == "Real"
    assert msg.properties[PROPERTY_REAL_QID] == "2"
    op = op_message(17, HOST, 5)
    assert (op.topic, op.body, op.properties) == (TRANS_OP_HALF_TOPIC, b"17", {"TAGS": "d"})


async def test_half_invisible_until_commit_then_real(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with service(tmp_path, ProducerManager()) as (store, tx, _):
        half = await put_half(store, b"a")
        assert store.get_max_offset_in_queue("Real", 2) == 0
        assert half.topic == TRANS_HALF_TOPIC
        real = committed_message(half, HOST)
        assert (await store.put_message(real)).ok
        assert (await tx.write_op(half.queue_offset)).ok
        (got,) = await read_all(store, "Real", 2)
        assert got.body == b"a"
        assert got.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
        assert "TRAN_MSG" not in got.properties
        assert PROPERTY_REAL_TOPIC not in got.properties
        assert got.prepared_transaction_offset == half.commit_log_offset
        (op,) = await read_all(store, TRANS_OP_HALF_TOPIC)
        assert op.body == str(half.queue_offset).encode()
        assert op.tags == "d"


async def test_check_back_requeues_asks_and_gives_up(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    producers = ProducerManager()
    chan = FakeProducerChannel()
    producers.register("PG", ClientChannelInfo(chan, "client-1"))
    async with service(tmp_path, producers, check_max=3) as (store, tx, offsets):
        committed = await put_half(store, b"committed")
        rolled = await put_half(store, b"rolled")
        pending = await put_half(store, b"pending")
        assert (await store.put_message(committed_message(committed, HOST))).ok
        assert (await tx.write_op(committed.queue_offset)).ok
        assert (await tx.write_op(rolled.queue_offset)).ok
        # Too young: nothing checked, progress stops at the first unresolved one.
        assert await tx.check_once() == 0
        assert chan.sent == []
        assert offsets.query(TRANS_SYS_GROUP, TRANS_HALF_TOPIC, 0) == pending.queue_offset
        await trio.sleep(7)
        assert await tx.check_once() == 1
        (cmd,) = chan.sent
        assert cmd.code == RequestCode.CHECK_TRANSACTION_STATE
        assert cmd.serialize_type == SerializeType.JSON  # no heartbeat seen: JSON
        hdr = CheckTransactionStateRequestHeader.from_fields(cmd.ext_fields)
        shown = decode_record(cmd.body_bytes())
        assert (shown.topic, shown.queue_id, shown.body) == ("Real", 2, b"pending")
        assert hdr.tran_state_table_offset == 3  # the re-queued copy
        assert hdr.msg_id == hdr.transaction_id == "U-pending"
        requeued = store.look_message_by_offset(hdr.commit_log_offset)
        assert requeued is not None
        assert requeued.topic == TRANS_HALF_TOPIC
        assert requeued.properties[PROPERTY_TRANSACTION_CHECK_TIMES] == "1"
        # Nobody answers: checked again each pass after the timeout, then given up.
        for times in (2, 3):
            await trio.sleep(7)
            assert await tx.check_once() == 1
            last = CheckTransactionStateRequestHeader.from_fields(chan.sent[-1].ext_fields)
            ext = store.look_message_by_offset(last.commit_log_offset)
            assert ext is not None
            assert ext.properties[PROPERTY_TRANSACTION_CHECK_TIMES] == str(times)
        await trio.sleep(7)
        assert await tx.check_once() == 0
        assert len(chan.sent) == 3
        (dead,) = await read_all(store, TRANS_CHECK_MAX_TIME_TOPIC)
        assert dead.body == b"pending"
        assert store.get_max_offset_in_queue("Real", 2) == 1  # only the committed one
        assert offsets.query(TRANS_SYS_GROUP, TRANS_HALF_TOPIC, 0) == store.get_max_offset_in_queue(
            TRANS_HALF_TOPIC, 0
        )


async def test_check_answer_commit_resolves_and_progress_survives_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    producers = ProducerManager()
    chan = FakeProducerChannel()
    producers.register("PG", ClientChannelInfo(chan, "client-1"))
    async with service(tmp_path, producers) as (store, tx, _):
        await put_half(store, b"x")
        await trio.sleep(7)
        assert await tx.check_once() == 1
        hdr = CheckTransactionStateRequestHeader.from_fields(chan.sent[-1].ext_fields)
        # The producer's answer (END_TRANSACTION commit for the re-queued copy) arrives, but
        # the broker stops before the next pass.
        half = tx.find_half(hdr.commit_log_offset)
        assert half is not None
        assert (await store.put_message(committed_message(half, HOST))).ok
        assert (await tx.write_op(half.queue_offset)).ok
    async with service(tmp_path, producers) as (store, tx, offsets):
        await trio.sleep(7)
        # The op record is found again: no check for the resolved copy.
        assert await tx.check_once() == 0
        assert len(chan.sent) == 1
        assert offsets.query(TRANS_SYS_GROUP, TRANS_HALF_TOPIC, 0) == 2
        assert store.get_max_offset_in_queue("Real", 2) == 1


async def test_immunity_time_is_honoured(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    producers = ProducerManager()
    chan = FakeProducerChannel()
    producers.register("PG", ClientChannelInfo(chan, "client-1"))
    async with service(tmp_path, producers) as (store, tx, _):
        await put_half(store, b"slow", CHECK_IMMUNITY_TIME_IN_SECONDS="30")
        await trio.sleep(7)
        await tx.check_once()
        assert chan.sent == []  # kept for later, not counted as a check
        await trio.sleep(31)
        assert await tx.check_once() == 1
        hdr = CheckTransactionStateRequestHeader.from_fields(chan.sent[-1].ext_fields)
        ext = store.look_message_by_offset(hdr.commit_log_offset)
        assert ext is not None
        assert ext.properties[PROPERTY_TRANSACTION_CHECK_TIMES] == "1"


async def test_no_live_producer_still_counts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    producers = ProducerManager()
    chan = FakeProducerChannel()
    chan.closed = True
    producers.register("PG", ClientChannelInfo(chan, "gone"))
    async with service(tmp_path, producers) as (store, tx, _):
        await put_half(store, b"orphan")
        await trio.sleep(7)
        assert await tx.check_once() == 1
        assert chan.sent == []
        halves = await read_all(store, TRANS_HALF_TOPIC)
        assert halves[-1].properties[PROPERTY_TRANSACTION_CHECK_TIMES] == "1"

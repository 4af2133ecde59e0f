"""Producer and consumers against one real NameServer and broker."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import trio

from client import (
    Admin,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    NoRouteError,
    Producer,
    PullConsumer,
    PushConsumer,
    SendStatus,
)
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc

StartBroker = Callable[..., BrokerProc]


@pytest.fixture
def cluster(namesrv: NamesrvProc, start_broker: StartBroker) -> str:
    start_broker(namesrv.addr, name="broker-a")
    return namesrv.addr


async def test_send_and_push_consume_with_tag_filter_and_compression(cluster: str) -> None:
    await create_topic(cluster, "PC1", queues=4)
    cfg = fast_config(cluster)
    big = bytes(range(256)) * 64  # 16 KiB: compressed on the wire
    sent: dict[str, bytes] = {}
    async with Producer("pg1", cfg) as p:
        for i in range(20):
            body = big if i == 7 else f"m{i}".encode()
            r = await p.send(Message("PC1", body, tags="A" if i % 2 else "B", keys=f"key{i}"))
            assert r.status is SendStatus.SEND_OK
            assert len(r.msg_id) == 32
            assert r.message_queue.topic == "PC1"
            if i % 2:
                sent[r.msg_id] = body
        big_result = await p.send(Message("PC1", big, tags="A"))
        sent[big_result.msg_id] = big
    got: dict[str, MessageExt] = {}

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            got[m.msg_id] = m
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        "cg1", cfg, listener=listener, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    c.subscribe("PC1", "A")
    async with c:
        await wait_until(lambda: len(got) >= len(sent), total=20, what="tagged messages")
        await trio.sleep(0.5)  # nothing else arrives
    assert set(got) == set(sent)
    for mid, m in got.items():
        assert m.body == sent[mid]
        assert m.tags == "A"
        assert m.properties["MIN_OFFSET"] == "0"


async def test_batch_is_split_and_every_message_arrives(cluster: str) -> None:
    await create_topic(cluster, "PC2", queues=2)
    cfg = fast_config(cluster, max_message_size=2000)
    msgs = [Message("PC2", bytes([65 + i % 26]) * 500, keys=f"b{i}") for i in range(10)]
    async with Producer("pg2", cfg) as p:
        results = await p.send_batch(msgs)
    assert len(results) > 1
    ids = [i for r in results for i in r.msg_id.split(",")]
    assert len(ids) == 10
    assert ids == [m.uniq_key for m in msgs]
    async with PullConsumer(
        "cg2", cfg, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ) as c:
        c.subscribe("PC2")
        got: list[MessageExt] = []
        with trio.move_on_after(20):
            while len(got) < 10:
                got.extend(await c.poll(timeout_ms=500))
    assert sorted(m.msg_id for m in got) == sorted(ids)


async def test_ordered_sends_land_in_one_queue_per_key(cluster: str) -> None:
    await create_topic(cluster, "PC3", queues=8)
    cfg = fast_config(cluster)
    placed: dict[str, list[tuple[int, int]]] = {}
    async with Producer("pg3", cfg) as p:
        for i in range(30):
            key = f"order-{i % 3}"
            r = await p.send_orderly(Message("PC3", f"{key}:{i}"), key)
            placed.setdefault(key, []).append((r.message_queue.queue_id, r.queue_offset))
    for key, rows in placed.items():
        assert len({q for q, _ in rows}) == 1, key
        offsets = [o for _, o in rows]
        assert offsets == sorted(offsets)


async def test_lite_pull_seek_and_commit(cluster: str) -> None:
    await create_topic(cluster, "PC4", queues=2)
    cfg = fast_config(cluster)
    async with Producer("pg4", cfg) as p:
        for i in range(10):
            await p.send(Message("PC4", f"x{i}"), queue=(await p.fetch_publish_queues("PC4"))[0])
    c = PullConsumer(
        "cg4", cfg, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, auto_commit=False
    )
    async with c:
        mqs = await c.fetch_message_queues("PC4")
        c.assign(mqs)
        mq0 = mqs[0]
        got: list[MessageExt] = []
        with trio.move_on_after(20):
            while len(got) < 10:
                got.extend(await c.poll(timeout_ms=500))
        assert [m.queue_offset for m in got] == list(range(10))
        assert await c.committed(mq0) in (-1, 0)
        await c.commit()
        assert await c.committed(mq0) == 10
        await c.seek(mq0, 4)
        again: list[MessageExt] = []
        with trio.move_on_after(20):
            while len(again) < 6:
                again.extend(await c.poll(timeout_ms=500))
        assert [m.queue_offset for m in again] == list(range(4, 10))
        await c.seek_to_begin(mq0)
        first = await c.poll(timeout_ms=5000)
        assert first
        assert first[0].queue_offset == 0
        await c.seek_to_end(mq0)
        assert await c.poll(timeout_ms=300) == []
        ts = got[5].store_timestamp
        assert await c.offset_for_timestamp(mq0, ts) <= 5


async def test_unknown_topic_without_auto_create(cluster: str) -> None:
    cfg = fast_config(cluster, auto_create_topic=False)
    async with Producer("pg5", cfg) as p:
        with pytest.raises(NoRouteError, match="No route info"):
            await p.send(Message("NoSuchTopic", b"x"))


async def test_json_header_serialization(cluster: str) -> None:
    await create_topic(cluster, "PC6", queues=1)
    cfg = fast_config(cluster, serialize_type="json")
    async with Producer("pg6", cfg) as p:
        r = await p.send(Message("PC6", "json headers", tags="J", keys="k"))
    async with PullConsumer(
        "cg6", cfg, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ) as c:
        c.subscribe("PC6", "J")
        got: list[MessageExt] = []
        with trio.move_on_after(20):
            while not got:
                got.extend(await c.poll(timeout_ms=500))
    assert [m.msg_id for m in got] == [r.msg_id]
    assert got[0].body == b"json headers"


async def test_reset_offset_by_time_then_consume(cluster: str) -> None:
    # A brand-new group would start at offset 0 here whatever consume_from_where says: the
    # broker answers QUERY_CONSUMER_OFFSET with 0 while a queue's first messages are still in
    # memory (RocketMQ's rule). Resetting the group's offsets by time is how to skip them.
    await create_topic(cluster, "PC7", queues=2)
    cfg = fast_config(cluster)
    async with Producer("pg7", cfg) as p:
        for i in range(5):
            await p.send(Message("PC7", f"old{i}"))
        await trio.sleep(0.3)
        cut = int(time.time() * 1000)
        await trio.sleep(0.3)
        new = {(await p.send(Message("PC7", f"new{i}"))).msg_id for i in range(5)}
    async with Admin(cfg) as admin:
        table = await admin.reset_offset_by_time("cg7", "PC7", cut)
    assert sum(table.values()) == 5  # the five old messages are skipped
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        "cg7",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
        consume_timestamp=cut,
    )
    c.subscribe("PC7")
    async with c:
        await wait_until(lambda: {m.msg_id for m in got} >= new, total=20, what="new messages")
        await trio.sleep(0.5)
    assert {m.msg_id for m in got} == new


@pytest.mark.slow
async def test_flow_control_pauses_pulling_while_the_listener_is_slow(cluster: str) -> None:
    await create_topic(cluster, "PC8", queues=1)
    cfg = fast_config(cluster, pull_threshold_for_queue=5, pull_batch_size=4)
    async with Producer("pg8", cfg) as p:
        for i in range(60):
            await p.send(Message("PC8", f"f{i}"))
    release = trio.Event()
    done: list[int] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        await release.wait()
        done.extend(m.queue_offset for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        "cg8", cfg, listener=listener, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    c.subscribe("PC8")
    async with c:
        # (the consumer also owns its %RETRY% queue: pick the topic's one)
        await wait_until(
            lambda: any(mq.topic == "PC8" for mq in c.queues), total=20, what="queue assigned"
        )
        (st,) = [s for mq, s in c.queues.items() if mq.topic == "PC8"]
        await wait_until(lambda: st.pq.msg_count > 5, total=20, what="threshold reached")
        await trio.sleep(1.5)
        # Pulling stopped once more than 5 messages were cached (plus at most one batch).
        assert st.pq.msg_count <= 5 + 4
        release.set()
        await wait_until(lambda: len(done) >= 60, total=30, what="all consumed")
    assert sorted(done) == list(range(60))


async def test_tag_hash_collision_is_filtered_on_the_client(cluster: str) -> None:
    # "Aa" and "BB" have the same Java hashCode (2112): the broker's filter by tag code lets
    # both through; the consumer must drop "BB" by comparing the tag strings.
    await create_topic(cluster, "PC9", queues=1)
    cfg = fast_config(cluster)
    async with Producer("pg9", cfg) as p:
        wanted = set()
        for i in range(6):
            r = await p.send(Message("PC9", f"c{i}", tags="Aa" if i % 2 else "BB"))
            if i % 2:
                wanted.add(r.msg_id)
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        "cg9", cfg, listener=listener, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    c.subscribe("PC9", "Aa")
    async with c:
        await wait_until(lambda: len(got) >= 3, total=20, what="Aa messages")
        # The filtered-out messages still advance the committed offset.
        mq = next(iter(c.queues))
        await wait_until(
            lambda: c.offset_store.table().get(mq) == 6, total=20, what="offset past BB"
        )
    assert {m.msg_id for m in got} == wanted
    assert {m.tags for m in got} == {"Aa"}


async def test_offset_beyond_the_queue_is_corrected(cluster: str) -> None:
    await create_topic(cluster, "PC10", queues=1)
    cfg = fast_config(cluster)
    async with Producer("pg10", cfg) as p:
        old = {(await p.send(Message("PC10", f"old{i}"))).msg_id for i in range(3)}
        mq = (await p.fetch_publish_queues("PC10"))[0]
        addr = await p.instance.find_master_addr(mq.broker_name, "PC10")
        # A stale committed offset far past the end of the queue.
        await p.instance.api.update_consumer_offset(addr, "cg10", mq, 100)
        got: list[MessageExt] = []

        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            got.extend(msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer("cg10", cfg, listener=listener)
        c.subscribe("PC10")
        async with c:
            # PULL_OFFSET_MOVED: the consumer restarts where the broker says. With the queue's
            # min offset at 0 that is 0 (RocketMQ's rule), so the old messages come again;
            # without the correction it would wait at offset 100 forever.
            await wait_until(
                lambda: c.offset_store.table().get(mq) == 3, total=20, what="offset corrected"
            )
            new = {(await p.send(Message("PC10", f"new{i}"))).msg_id for i in range(2)}
            await wait_until(lambda: len(got) >= 5, total=20, what="all messages")
    assert {m.msg_id for m in got} == old | new


async def test_clients_named_alike_share_one_instance_and_either_may_leave_first(
    cluster: str,
) -> None:
    """A producer and a consumer given the same instance name share one ClientInstance (its
    connections, heartbeats and routes), as RocketMQ's clients of one client id do; the
    producer leaves first and the consumer keeps consuming; the last to leave stops it."""
    await create_topic(cluster, "PCShare", queues=2)
    named = fast_config(cluster).model_copy(update={"instance_name": "svc-share"})
    got: list[bytes] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        "cg-share",
        named,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("PCShare", "*")
    async with consumer:
        async with Producer("pg-share", named) as p:
            assert p.instance is consumer.instance
            for i in range(5):
                await p.send(Message("PCShare", b"a%d" % i))
        async with Producer("pg-other", fast_config(cluster)) as other:
            assert other.instance is not consumer.instance  # unnamed: its own
            for i in range(5):
                await other.send(Message("PCShare", b"b%d" % i))
        await wait_until(lambda: len(got) >= 10, total=20, what="messages after the leave")
        instance = consumer.instance
        assert instance.running
    assert sorted(got) == sorted([b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)])
    assert not instance.running

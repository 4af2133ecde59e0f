"""Exact-time messages outlive commitlog retention: the schedule service re-appends undelivered
timer records before the store's cleanup can delete their files, and a crash between the
re-append and the old entry's mark still delivers the message once.

The retention test runs on real time: the cleanup judges a file's age by its mtime, which the
kernel sets on real time, so a virtual clock could not age the files.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.schedule import (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_ORIGIN,
    ScheduleService,
)
from broker.topic_manager import TIMER_TOPIC
from common.message import PROPERTY_REAL_TOPIC, MessageExt, MessageInner, decode_records
from common.schedule import parse_delay_levels
from store import GetMessageStatus, MessageStore, StoreConfig
from tests.helpers import wait_until

HOST = ("127.0.0.1", 10911)
ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))


def store_cfg(root: Path, reserved_hours: float, clean_ms: int) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 4096,
            "mapped_file_size_consume_queue": 50 * 20,
            "max_hash_slot_num": 64,
            "max_index_num": 256,
            "message_delay_level": "1s 2s 3s",
            "file_reserved_hours": reserved_hours,
            "delete_when": ALL_HOURS,  # expired files go whatever the hour
            "clean_resource_interval_ms": clean_ms,
            # Pages are written back often, so a file's mtime follows its last write closely.
            "flush_interval_commitlog_ms": 50,
            "flush_commitlog_least_pages": 0,
            "flush_commitlog_thorough_interval_ms": 200,
        }
    )


@asynccontextmanager
async def running(
    root: Path,
    clock: Callable[[], float],
    *,
    reserved_hours: float,
    clean_ms: int,
) -> AsyncIterator[tuple[MessageStore, ScheduleService]]:
    svc = ScheduleService(
        root,
        parse_delay_levels("1s 2s 3s"),
        lambda: HOST,
        now_ms=lambda: int(clock() * 1000),
    )
    await trio.to_thread.run_sync(svc.load)
    async with MessageStore(
        store_cfg(root, reserved_hours, clean_ms), clock=clock, disk_usage=lambda p: 0.1
    ) as store:
        store.add_arrival_listener(svc.on_arrival)
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run, store, store.put_messages)
            yield store, svc
            nursery.cancel_scope.cancel()
        await svc.persist()


def timer_message(clock: Callable[[], float], body: bytes, uniq: str) -> MessageInner:
    return MessageInner(
        "Real",
        body,
        queue_id=2,
        properties={"KEYS": "order-7", "UNIQ_KEY": uniq, "color": "red"},
        born_timestamp=int(clock() * 1000),
        born_host=("192.0.2.1", 1234),
        store_host=HOST,
    )


async def read_all(store: MessageStore, topic: str, qid: int) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = store.get_min_offset_in_queue(topic, qid)
    for _ in range(10_000):
        res = await store.get_message("G", topic, qid, offset, 64, 1 << 22)
        if res.status is not GetMessageStatus.FOUND:
            return out
        out.extend(decode_records(b"".join(res.buffers)))
        offset = res.next_begin_offset
    raise AssertionError("queue read did not end")


def check_delivered(got: list[MessageExt], due: int, body: bytes, uniq: str) -> None:
    assert [m.body for m in got] == [body], "delivered exactly once"
    (m,) = got
    assert m.store_timestamp >= due, "delivered early"
    assert m.queue_id == 2
    assert m.uniq_key == uniq
    assert m.keys == "order-7"
    assert m.properties["color"] == "red"
    for gone in (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_ORIGIN, PROPERTY_REAL_TOPIC):
        assert gone not in m.properties


@pytest.mark.slow
async def test_timer_message_due_after_its_file_is_deleted_arrives_once(tmp_path: Path) -> None:
    # Retention 7.2 s: records are re-appended once 3.6 s old (checked every 0.9 s), files go
    # once their last write is 7.2 s old (checked every 0.1 s). Due in 16 s: more than twice
    # the retention, so the original record's file and the first copy's are deleted first.
    async with running(tmp_path, time.time, reserved_hours=0.002, clean_ms=100) as (store, svc):
        due = int(time.time() * 1000) + 16_000
        msg = timer_message(time.time, b"far-future", "U-FAR")
        svc.route_timer(msg, due)
        r = await store.put_message(msg)
        assert r.ok
        assert r.append is not None
        original_phy = r.append.wrote_offset

        async def fill() -> None:
            # Other traffic rolls the 4 KiB commitlog files every ~0.4 s.
            for i in range(1000):
                assert (await store.put_message(MessageInner("Fill", bytes([i % 256]) * 900))).ok
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fill)
            await wait_until(
                lambda: store.get_max_offset_in_queue("Real", 2) >= 1,
                total=40,
                what="the timer message delivered",
            )
            nursery.cancel_scope.cancel()
        assert store.read_record(original_phy) is None, "the original file was deleted"
        assert store.min_phy_offset > original_phy
        assert store.get_min_offset_in_queue(TIMER_TOPIC, 0) > 0
        assert svc.timer_refreshed >= 2
        await trio.sleep(1.5)  # nothing else arrives
        got = await read_all(store, "Real", 2)
        check_delivered(got, due, b"far-future", "U-FAR")
        assert got[0].store_timestamp - due < 3000  # on time, not at a later retry
        assert svc.pending_timer_messages() == 0
        assert store.get_max_offset_in_queue("Fill", 0) > 100  # cleanup ran against traffic


async def test_crash_between_reappend_and_mark_delivers_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Virtual time (no file is old enough for the cleanup: only the re-append is exercised).
    base = time.time()

    def clock() -> float:
        return base + trio.current_time()

    hours = 0.01  # retention 36 s: records are re-appended at 18 s
    async with running(tmp_path, clock, reserved_hours=hours, clean_ms=3_600_000) as (store, svc):
        due = int(clock() * 1000) + 60_000
        msg = timer_message(clock, b"in-a-minute", "U-1M")
        svc.route_timer(msg, due)
        assert (await store.put_message(msg)).ok
        await wait_until(lambda: svc.timer_refreshed == 1, total=30, what="a re-append")
        assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 2
        assert svc.pending_timer_messages() == 1
        (copy,) = [m for m in await read_all(store, TIMER_TOPIC, 0) if m.queue_offset == 1]
        assert copy.properties[PROPERTY_TIMER_ORIGIN] == "0"
        assert copy.properties[PROPERTY_TIMER_DELIVER_MS] == str(due)
        assert copy.uniq_key == "U-1M"
        store.simulate_crash()
    # The state a kill after the re-append but before the old entry's mark leaves behind.
    config = tmp_path / "config"
    (config / "timerOffset.json").write_text(json.dumps({"deliveredOffset": 0}))
    (config / "timerDelivered.marks").write_bytes(b"")
    async with running(tmp_path, clock, reserved_hours=hours, clean_ms=3_600_000) as (store, svc):
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 2) >= 1,
            total=120,
            what="the timer message delivered",
        )
        await trio.sleep(30)  # a second delivery would come at the same due time
        got = await read_all(store, "Real", 2)
        # (No lateness bound here: the virtual clock jumps while the store opens in a thread.)
        check_delivered(got, due, b"in-a-minute", "U-1M")
        assert svc.pending_timer_messages() == 0
        timer_end = store.get_max_offset_in_queue(TIMER_TOPIC, 0)
    data = json.loads((config / "timerOffset.json").read_bytes())
    assert data["deliveredOffset"] == timer_end  # every timer record, both copies included

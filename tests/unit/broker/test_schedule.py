"""Schedule service: delay levels and exact delivery times over an in-process store, on trio's
virtual clock (the store and the service share a wall clock built on it)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.schedule import (
    PROPERTY_TIMER_DELIVER_MS,
    ScheduleService,
    exact_delivery_ms,
)
from broker.topic_manager import TIMER_TOPIC
from common.message import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    MessageExt,
    MessageInner,
    decode_records,
)
from common.schedule import SCHEDULE_TOPIC, clamp_level, level_delivery_ms, parse_delay_levels
from store import GetMessageStatus, MessageStore, StoreConfig
from tests.helpers import wait_until

BASE_S = 1_700_000_000.0
HOST = ("127.0.0.1", 10911)


def wall() -> float:
    return BASE_S + trio.current_time()


def wall_ms() -> int:
    return int(wall() * 1000)


def store_cfg(root: Path) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 1024 * 1024,
            "mapped_file_size_consume_queue": 100 * 20,
            "max_hash_slot_num": 64,
            "max_index_num": 256,
            "message_delay_level": "1s 2s 3s",
        }
    )


def message(topic: str, body: bytes, qid: int = 0, **props: str) -> MessageInner:
    return MessageInner(
        topic,
        body,
        queue_id=qid,
        properties=dict(props),
        born_timestamp=wall_ms(),
        born_host=("192.0.2.1", 1234),
        store_host=HOST,
    )


@asynccontextmanager
async def running(root: Path) -> AsyncIterator[tuple[MessageStore, ScheduleService]]:
    svc = ScheduleService(root, parse_delay_levels("1s 2s 3s"), lambda: HOST, now_ms=wall_ms)
    await trio.to_thread.run_sync(svc.load)
    async with MessageStore(store_cfg(root), clock=wall) as store:
        store.add_arrival_listener(svc.on_arrival)
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run, store, store.put_messages)
            yield store, svc
            nursery.cancel_scope.cancel()
        await svc.persist()


async def read_all(store: MessageStore, topic: str, qid: int = 0) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = 0
    while True:
        res = await store.get_message("G", topic, qid, offset, 64, 1 << 22)
        if res.status is not GetMessageStatus.FOUND:
            return out
        out.extend(decode_records(b"".join(res.buffers)))
        offset = res.next_begin_offset


# -- pure helpers -------------------------------------------------------------------------------
def test_parse_delay_levels() -> None:
    default = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    levels = parse_delay_levels(default)
    assert len(levels) == 18
    assert levels[:3] == [1000, 5000, 10_000]
    assert levels[-1] == 7_200_000
    assert parse_delay_levels("1d 250s") == [86_400_000, 250_000]
    with pytest.raises(ValueError, match="bad delay level"):
        parse_delay_levels("1x")
    with pytest.raises(ValueError, match="bad delay level"):
        parse_delay_levels("s")


def test_clamp_and_delivery_time() -> None:
    assert clamp_level(0, 18) == 0
    assert clamp_level(-2, 18) == 0
    assert clamp_level(3, 18) == 3
    assert clamp_level(40, 18) == 18
    assert level_delivery_ms(1000, 2, [1000, 5000]) == 6000
    assert level_delivery_ms(1000, 9, [1000, 5000]) == 6000  # clamped
    assert level_delivery_ms(1000, 0, [1000, 5000]) == 1000  # not delayed: due when stored
    assert level_delivery_ms(1000, 2, []) == 1000


def test_exact_delivery_properties() -> None:
    assert exact_delivery_ms({}, 100) is None
    assert exact_delivery_ms({"TIMER_DELIVER_MS": "5000"}, 100) == 5000
    assert exact_delivery_ms({"__STARTDELIVERTIME": "7000"}, 100) == 7000
    assert exact_delivery_ms({"TIMER_DELAY_MS": "250"}, 100) == 350
    assert exact_delivery_ms({"TIMER_DELAY_SEC": "3"}, 100) == 3100
    with pytest.raises(ValueError):
        exact_delivery_ms({"TIMER_DELIVER_MS": "soon"}, 100)


def test_route_delay_and_timer(tmp_path: Path) -> None:
    svc = ScheduleService(tmp_path, [1000, 2000], lambda: HOST, now_ms=lambda: 10_000)
    msg = MessageInner("T", b"x", queue_id=3, properties={PROPERTY_DELAY: "7"})
    svc.route_delay(msg)
    assert (msg.topic, msg.queue_id, msg.tags_code) == (SCHEDULE_TOPIC, 1, 12_000)
    assert msg.properties[PROPERTY_REAL_TOPIC] == "T"
    assert msg.properties[PROPERTY_REAL_QID] == "3"
    assert msg.properties[PROPERTY_DELAY] == "2"  # clamped to the last level
    plain = MessageInner("T", b"x", queue_id=1, properties={PROPERTY_DELAY: "0"})
    svc.route_delay(plain)
    assert plain.topic == "T"
    timed = MessageInner("T", b"x", queue_id=2, properties={"__STARTDELIVERTIME": "99999"})
    svc.route_timer(timed, 99_999)
    assert (timed.topic, timed.queue_id, timed.tags_code) == (TIMER_TOPIC, 0, 99_999)
    assert timed.properties == {
        PROPERTY_TIMER_DELIVER_MS: "99999",
        PROPERTY_REAL_TOPIC: "T",
        PROPERTY_REAL_QID: "2",
    }


# -- delay levels ------------------------------------------------------------------------------
async def test_levels_deliver_on_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (store, svc):
        sent: dict[bytes, tuple[int, int]] = {}
        for level in (1, 2, 3, 5):
            for i in range(3):
                body = f"L{level}-{i}".encode()
                msg = message("Real", body, qid=1, DELAY=str(level), KEYS=body.decode())
                svc.route_delay(msg)
                r = await store.put_message(msg)
                assert r.ok
                assert r.append is not None
                sent[body] = (r.append.store_timestamp, min(level, 3))
            await trio.sleep(0.2)
        assert store.get_max_offset_in_queue("Real", 1) == 0  # nothing delivered yet
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 1) >= len(sent),
            total=30,
            what="all delayed messages delivered",
        )
        got = await read_all(store, "Real", 1)
        assert sorted(m.body or b"" for m in got) == sorted(sent)
        for m in got:
            stored_at, level = sent[m.body or b""]
            late = m.store_timestamp - (stored_at + level * 1000)
            assert late >= 0, "delivered early"
            assert late < 1000, f"delivered {late} ms late"
            assert PROPERTY_REAL_TOPIC not in m.properties
            assert PROPERTY_DELAY not in m.properties
            assert m.queue_id == 1
            assert m.topic == "Real"
        assert svc.offsets == {1: 3, 2: 3, 3: 6}
    data = json.loads((tmp_path / "config" / "delayOffset.json").read_bytes())
    assert data == {"offsetTable": {"1": 3, "2": 3, "3": 6}}


async def test_level_restart_loses_nothing_and_does_not_repeat(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    n = 20
    async with running(tmp_path) as (store, svc):
        for i in range(n):
            msg = message("Real", f"m{i}".encode(), DELAY="2")
            svc.route_delay(msg)
            assert (await store.put_message(msg)).ok
            await trio.sleep(0.1)
        # Stop while roughly half are due (the first ~11 were stored > 2 s ago by then).
        await trio.sleep(0.9)
        delivered_before = store.get_max_offset_in_queue("Real", 0)
        assert 0 < delivered_before < n
    saved = json.loads((tmp_path / "config" / "delayOffset.json").read_bytes())
    assert saved["offsetTable"]["2"] == delivered_before
    async with running(tmp_path) as (store, svc):
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 0) >= n, total=30, what="the rest"
        )
        await trio.sleep(3)  # nothing more arrives
        got = await read_all(store, "Real")
        assert sorted(m.body or b"" for m in got) == sorted(f"m{i}".encode() for i in range(n))


async def test_level_crash_repeats_at_most_one_batch(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A kill loses no message; what was delivered but not recorded is one batch at most."""
    n = 100
    async with running(tmp_path) as (store, svc):
        for i in range(n):
            msg = message("Real", f"m{i}".encode(), DELAY="1")
            svc.route_delay(msg)
            assert (await store.put_message(msg)).ok
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 0) >= n, total=30, what="delivery"
        )
        await wait_until(lambda: not svc.dirty, what="offsets written")
        # Simulate the state a kill between delivery and the offset write leaves behind:
        # the file one batch behind.
        svc.offsets[1] = n - 32
        svc.dirty = True
        await svc.persist()
        svc.offsets[1] = n
        svc.dirty = False
        store.simulate_crash()
    async with running(tmp_path) as (store, _svc):
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 0) >= n + 32, total=30, what="redo"
        )
        await trio.sleep(3)
        got = await read_all(store, "Real")
        assert len(got) == n + 32
        assert {m.body for m in got} == {f"m{i}".encode() for i in range(n)}


# -- exact timestamps --------------------------------------------------------------------------
async def test_timer_delivers_out_of_order_sends_in_time_order(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (store, svc):
        now = wall_ms()
        dues = [now + d for d in (5000, 1200, 3000, 700, 9000, 3000, 250)]
        for i, due in enumerate(dues):
            msg = message("Real", f"t{i}".encode())
            svc.route_timer(msg, due)
            assert (await store.put_message(msg)).ok
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 0) >= len(dues),
            total=30,
            what="timer deliveries",
        )
        got = await read_all(store, "Real")
        assert [m.body for m in got] == [
            f"t{i}".encode() for i in sorted(range(len(dues)), key=lambda i: (dues[i], i))
        ]
        for m in got:
            due = dues[int((m.body or b"t0")[1:])]
            assert m.store_timestamp >= due, "delivered early"
            assert m.store_timestamp - due <= 100
            assert PROPERTY_TIMER_DELIVER_MS not in m.properties
            assert PROPERTY_REAL_TOPIC not in m.properties
        assert all(0 <= late <= 100 for late in svc.timer_lateness_ms)
        assert svc.timer_delivered_offset == len(dues)


async def test_timer_sooner_message_wakes_the_service(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (store, svc):
        far = message("Real", b"far")
        svc.route_timer(far, wall_ms() + 3_600_000)
        assert (await store.put_message(far)).ok
        await trio.sleep(1)
        soon_due = wall_ms() + 500
        soon = message("Real", b"soon")
        svc.route_timer(soon, soon_due)
        assert (await store.put_message(soon)).ok
        await wait_until(lambda: store.get_max_offset_in_queue("Real", 0) >= 1, what="soon")
        (got,) = await read_all(store, "Real")
        assert got.body == b"soon"
        assert 0 <= got.store_timestamp - soon_due <= 100
        assert svc.pending_timer_messages() == 1


async def test_timer_restart_skips_delivered_and_keeps_the_rest(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as (store, svc):
        now = wall_ms()
        # Offsets 0..5; 1, 3 and 5 are due soon, the others later: delivered ones sit above
        # undelivered offset 0, so they must come from the marks file after a restart.
        dues = [now + 60_000, now + 500, now + 60_000, now + 600, now + 60_000, now + 700]
        for i, due in enumerate(dues):
            msg = message("Real", f"t{i}".encode())
            svc.route_timer(msg, due)
            assert (await store.put_message(msg)).ok
        await wait_until(lambda: store.get_max_offset_in_queue("Real", 0) >= 3, what="3 due")
        await wait_until(lambda: svc._timer_marks == {1, 3, 5}, what="3 delivered")
        # The marks are written in a worker thread; while a task waits on a thread the
        # autojump clock would jump to the next deadline, the 60 s timer, and deliver the
        # rest too. Stop the virtual clock until this store is closed.
        autojump_clock.autojump_threshold = math.inf
        await svc.persist()
        assert not svc._timer_pending_marks
        assert svc.timer_delivered_offset == 0
    marks = (tmp_path / "config" / "timerDelivered.marks").read_bytes()
    assert sorted(int.from_bytes(marks[i : i + 8], "big") for i in range(0, len(marks), 8)) == [
        1,
        3,
        5,
    ]
    autojump_clock.autojump_threshold = 0
    async with running(tmp_path) as (store, svc):
        # (The virtual clock may jump far while the store opens, so the later ones may be due
        # already: what matters is that each of the six arrives exactly once.)
        await wait_until(
            lambda: store.get_max_offset_in_queue("Real", 0) >= 6, total=120, what="the rest"
        )
        got = await read_all(store, "Real")
        assert sorted(m.body or b"" for m in got) == [f"t{i}".encode() for i in range(6)]
        assert svc.timer_delivered_offset == 6
    data = json.loads((tmp_path / "config" / "timerOffset.json").read_bytes())
    assert data == {"deliveredOffset": 6}
    assert (tmp_path / "config" / "timerDelivered.marks").read_bytes() == b""

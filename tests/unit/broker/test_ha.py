"""HA master and slave over real loopback TCP, with in-memory commitlogs and a fake clock.

`FakeCommitLog` behaves as the store's replication API is specified: files of a fixed size,
records never crossing a file (the rest of a file is filled when the next one does not fit),
`read_commitlog` stopping at the write position of one file, and `append_replica` refusing
any offset but its max (an empty log takes any file-aligned start).
"""

from __future__ import annotations

import inspect
import itertools
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.lowlevel
import trio.testing
from structlog.testing import capture_logs

from broker.commit import Replication
from broker.ha import (
    FRAME_HEADER_SIZE,
    FrameReader,
    HAMaster,
    HAMasterStore,
    HASlave,
    HASlaveStore,
    ReportReader,
    encode_frame_header,
    encode_report,
)

FILE = 1024
FILLER = 0xBB


@pytest.fixture(autouse=True)
def _all_log_levels(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`capture_logs` sees every level of `broker.ha`'s events, whatever logging set-up an
    earlier test left (a level filter, a logger cached on first use)."""
    import broker.ha

    saved = structlog.get_config()
    structlog.reset_defaults()
    monkeypatch.setattr(broker.ha, "log", structlog.get_logger())
    try:
        yield
    finally:
        structlog.configure(**saved)


@dataclass
class _Config:
    mapped_file_size_commitlog: int


class FakeCommitLog:
    def __init__(self, file_size: int = FILE) -> None:
        self.config = _Config(file_size)
        self.base = 0
        self.data = bytearray()
        self.rng = random.Random(file_size)
        self.replica_appends: list[tuple[int, int]] = []

    @property
    def max_phy_offset(self) -> int:
        return self.base + len(self.data)

    def put(self, size: int) -> int:
        """One record of `size` random bytes; returns the offset after it."""
        fs = self.config.mapped_file_size_commitlog
        assert 0 < size <= fs
        room = fs - self.max_phy_offset % fs
        if size > room:
            self.data += bytes([FILLER]) * room
        self.data += self.rng.randbytes(size)
        return self.max_phy_offset

    def put_many(self, total: int) -> int:
        end = self.max_phy_offset + total
        while self.max_phy_offset < end:
            self.put(self.rng.randint(20, 300))
        return self.max_phy_offset

    def read_commitlog(self, phy_offset: int, max_bytes: int) -> bytes | None:
        if not self.base <= phy_offset < self.max_phy_offset:
            return None
        fs = self.config.mapped_file_size_commitlog
        end = min(self.max_phy_offset, phy_offset - phy_offset % fs + fs, phy_offset + max_bytes)
        return bytes(self.data[phy_offset - self.base : end - self.base])

    async def append_replica(
        self, phy_offset: int, data: bytes, written: Callable[[], None] | None = None
    ) -> None:
        await trio.lowlevel.checkpoint()
        fs = self.config.mapped_file_size_commitlog
        if self.max_phy_offset == 0:
            if phy_offset % fs:
                raise ValueError(f"empty store: start {phy_offset} not file-aligned")
            self.base = phy_offset
        elif phy_offset != self.max_phy_offset:
            raise ValueError(f"replica offset {phy_offset} != max {self.max_phy_offset}")
        if data and phy_offset // fs != (phy_offset + len(data) - 1) // fs:
            raise ValueError("replica bytes cross a file")
        self.data += data
        if written is not None:
            written()
        self.replica_appends.append((phy_offset, len(data)))

    def copy_prefix(self, other: FakeCommitLog, end: int) -> None:
        assert self.max_phy_offset == 0
        assert other.base == 0
        self.data = bytearray(other.data[:end])


def _typed(
    store: FakeCommitLog, master: HAMaster
) -> tuple[HAMasterStore, HASlaveStore, Replication]:
    # mypy checks these: the fake fits both store protocols, the master what commits wait on.
    return store, store, master


async def _until(pred: Callable[[], bool], limit: float = 30.0, step: float = 0.01) -> float:
    """Wait (fake clock) until `pred()`; returns the time it took."""
    start = trio.current_time()
    with trio.fail_after(limit):
        while not pred():
            await trio.sleep(step)
    return trio.current_time() - start


@asynccontextmanager
async def _master(store: FakeCommitLog, **kw: Any) -> AsyncIterator[HAMaster]:
    master = HAMaster(store, **kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(master.run, "127.0.0.1", 0)
        yield master
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def _slave(store: FakeCommitLog, addr: str | None, **kw: Any) -> AsyncIterator[HASlave]:
    slave = HASlave(store, addr, **kw)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slave.run)
        yield slave
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def _scripted_master() -> AsyncIterator[tuple[trio.SocketListener, str]]:
    """A bare listener for a test that plays the master by hand, and its address."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        yield listener, f"127.0.0.1:{listener.socket.getsockname()[1]}"


def _unnarrowed(slave: HASlave) -> HASlave:
    """The same slave, its properties no longer narrowed by earlier asserts (for mypy)."""
    return slave


def _addr(master: HAMaster) -> str:
    return f"127.0.0.1:{master.port}"


def _same(slave: FakeCommitLog, master: FakeCommitLog) -> bool:
    return (
        slave.max_phy_offset == master.max_phy_offset
        and slave.data == master.data[slave.base - master.base :]
    )


# -- master and slave --------------------------------------------------------------------


async def test_slave_ends_byte_identical_across_files_woken_by_notify(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(500)  # inside the first file: an empty slave starts at 0
    # Polls and heartbeats far apart: only notify_append can move the new bytes in time.
    async with (
        _master(src, transfer_batch_size=300, idle_poll_s=1000, heartbeat_interval_s=1000) as m,
        _slave(dst, _addr(m), heartbeat_interval_s=1000) as s,
    ):
        await _until(lambda: _same(dst, src), limit=2)
        for _ in range(8):
            src.put_many(450)  # crosses files every few rounds
            m.notify_append()
            await _until(lambda: _same(dst, src), limit=2)
        assert src.max_phy_offset > 4 * FILE
        assert dst.base == 0
        assert dst.data == src.data
        await _until(lambda: m.acked_offset == src.max_phy_offset, limit=2)
        assert s.last_report == src.max_phy_offset
        assert m.slave_offsets() == {next(iter(m.slave_offsets())): src.max_phy_offset}
        # Frames respect the batch size and never cross a file (the fake checks the latter).
        assert max(n for _, n in dst.replica_appends) <= 300
        assert s.connected
        assert m.slave_count == 1


async def test_appends_while_streaming_reach_the_slave(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(file_size=64 * 1024), FakeCommitLog(file_size=64 * 1024)
    async with _master(src) as m, _slave(dst, _addr(m)):
        async with trio.open_nursery() as nursery:

            async def writer() -> None:
                for _ in range(200):
                    src.put_many(2000)
                    m.notify_append()
                    await trio.sleep(0.003)

            nursery.start_soon(writer)
        await _until(lambda: _same(dst, src), limit=5)
        assert src.max_phy_offset > 6 * 64 * 1024
        assert dst.base == 0


async def test_non_empty_slave_continues_from_its_max(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(3 * FILE + 500)
    dst.copy_prefix(src, FILE + 300)
    async with _master(src) as m, _slave(dst, _addr(m)):
        await _until(lambda: _same(dst, src), limit=2)
    assert dst.data == src.data
    assert dst.replica_appends[0][0] == FILE + 300


async def test_empty_slave_starts_from_the_masters_last_file(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(3 * FILE + 400)
    last = src.max_phy_offset - src.max_phy_offset % FILE
    async with _master(src) as m, _slave(dst, _addr(m)):
        await _until(lambda: dst.max_phy_offset == src.max_phy_offset, limit=2)
        assert dst.base == last == 3 * FILE
        assert dst.data == src.data[last:]
        await _until(lambda: m.acked_offset == src.max_phy_offset, limit=2)


async def test_offset_mismatch_closes_and_reconnects_then_catches_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A scripted master: the first connection gets a frame at the wrong offset, the second
    the right one."""
    dst = FakeCommitLog()
    dst.data = bytearray(b"x" * 100)
    async with _scripted_master() as (listener, addr), _slave(dst, addr) as slave:
        async with await listener.accept() as conn1:
            start = trio.current_time()
            assert await conn1.receive_some(8) == encode_report(100)  # at once, not after 5 s
            assert trio.current_time() - start < 0.5
            await conn1.send_all(encode_frame_header(108, 4) + b"abcd")
            with trio.fail_after(2):
                assert await conn1.receive_some(100) == b""  # closed by the slave
            closed = trio.current_time()
        async with await listener.accept() as conn2:
            assert trio.current_time() - closed >= 1.0  # backoff, no spin
            assert await conn2.receive_some(8) == encode_report(100)
            await conn2.send_all(encode_frame_header(100, 4) + b"abcd")
            with trio.fail_after(2):
                assert await conn2.receive_some(8) == encode_report(104)
            assert dst.data == b"x" * 100 + b"abcd"
            assert slave.connected
            await _until(lambda: slave.last_report == 104)


async def test_slave_ahead_of_master_is_refused_until_the_master_passes_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(600)
    dst.copy_prefix(src, 600)
    dst.data += b"y" * 300  # bytes the master never had
    async with _master(src) as m, _slave(dst, _addr(m)):
        await trio.sleep(10)
        assert m.slave_count == 0
        assert m.acked_offset == 0
        src.put_many(600)
        m.notify_append()
        await _until(lambda: dst.max_phy_offset == src.max_phy_offset, limit=10)
        # It follows from its own max: the diverged bytes stay (4.x slaves never truncate).
        assert dst.data[:600] == src.data[:600]
        assert dst.data[900:] == src.data[900:]
        await _until(lambda: m.slave_count == 1)


async def test_set_master_moves_to_the_new_address_and_none_idles(
    autojump_clock: trio.testing.MockClock,
) -> None:
    one, two, dst = FakeCommitLog(), FakeCommitLog(), FakeCommitLog()
    one.put_many(700)
    two.copy_prefix(one, one.max_phy_offset)
    two.put_many(FILE)
    async with _master(one) as m1, _master(two) as m2, _slave(dst, _addr(m1)) as s:
        await _until(lambda: _same(dst, one), limit=2)
        assert m1.slave_count == 1
        assert m2.slave_count == 0
        s.set_master(_addr(m2))
        assert s.master_addr == _addr(m2)
        s = _unnarrowed(s)
        took = await _until(lambda: _same(dst, two), limit=2)
        assert took < 1.0  # no backoff on a change of address
        await _until(lambda: m1.slave_count == 0 and m2.slave_count == 1, limit=2)
        s.set_master(_addr(m2))  # same address: nothing happens
        await _until(lambda: s.connected, limit=0.001)
        s.set_master(None)
        await _until(lambda: not s.connected and m2.slave_count == 0, limit=2)
        await trio.sleep(30)
        assert not s.connected
        assert s.master_addr is None
        s.set_master(_addr(m2))
        await _until(lambda: m2.slave_count == 1, limit=2)


async def test_heartbeats_keep_an_idle_pair_connected(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(300)
    async with _master(src) as m, _slave(dst, _addr(m)) as s:
        await _until(lambda: m.slave_count == 1 and _same(dst, src))
        addrs = m.slave_offsets()
        await trio.sleep(120)  # six housekeeping intervals
        assert s.connected
        assert m.slave_offsets() == addrs


async def test_failed_sessions_back_off_from_one_to_five_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    async with _scripted_master() as (listener, addr), _slave(FakeCommitLog(), addr):
        for _ in range(6):
            conn = await listener.accept()
            times.append(trio.current_time())
            await conn.aclose()  # closed before any frame: a failure
    gaps = [round(b - a) for a, b in itertools.pairwise(times)]
    assert gaps == [1, 2, 4, 5, 5]


async def test_refused_connections_back_off(autojump_clock: trio.testing.MockClock) -> None:
    async with _scripted_master() as (_listener, addr):
        pass  # nothing listens there now
    with capture_logs() as logs:
        async with _slave(FakeCommitLog(), addr) as s:
            await trio.sleep(20)
            assert not s.connected
    times = [e for e in logs if e["event"] == "ha_connect_failed"]
    assert len(times) == 6  # at 0, 1, 3, 7, 12, 17


async def test_slave_reports_every_heartbeat_and_closes_a_silent_master(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        _scripted_master() as (listener, addr),
        _slave(FakeCommitLog(), addr, housekeeping_interval_s=18),
        await listener.accept() as conn,
    ):
        start = trio.current_time()
        reports: list[float] = []
        reader = ReportReader()
        while True:
            data = await conn.receive_some(64)
            if not data:
                break
            if reader.feed(data) == 0:
                reports.append(round(trio.current_time() - start))
        assert reports == [0, 5, 10, 15]
        assert round(trio.current_time() - start) == 18  # housekeeping


# -- replication waits -------------------------------------------------------------------


async def test_when_replicated_false_after_timeout_without_slave(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeCommitLog()
    src.put_many(100)
    async with _master(src) as m:
        results: list[tuple[bool, float]] = []
        start = trio.current_time()
        m.when_replicated(50, lambda ok: results.append((ok, trio.current_time() - start)), 3.0)
        assert results == []
        assert not m.slave_ok(src.max_phy_offset)
        await trio.sleep(5)
        assert results == [(False, 3.0)]
        assert not await m.wait_replicated(src.max_phy_offset, 2.0)
        assert trio.current_time() - start == pytest.approx(7.0)


async def test_when_replicated_group_commit_and_timeouts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(500)
    async with (
        _master(src, idle_poll_s=1000, heartbeat_interval_s=1000) as m,
        _slave(dst, _addr(m), heartbeat_interval_s=1000),
    ):
        await _until(lambda: m.acked_offset == src.max_phy_offset, limit=2)
        done: dict[int, bool] = {}
        # Already acknowledged: answered, but not from within the call.
        m.when_replicated(100, lambda ok: done.__setitem__(100, ok), 1.0)
        assert done == {}
        await trio.lowlevel.checkpoint()
        await _until(lambda: 100 in done)
        assert done[100] is True

        before = src.max_phy_offset
        end = src.put_many(400)
        offsets = list(range(before + 1, end + 1, 3))

        def record(key: int) -> Callable[[bool], None]:
            return lambda ok: done.__setitem__(key, ok)

        for off in offsets:
            m.when_replicated(off, record(off), 3.0)
        far = end + 10_000
        m.when_replicated(far, record(far), 3.0)
        # A cancelled wait_replicated leaves no waiter behind.
        with trio.move_on_after(0.001):
            await m.wait_replicated(end, 3.0)
        assert len(done) == 1
        assert m._live_waiters == len(offsets) + 1
        start = trio.current_time()
        m.notify_append()
        await _until(lambda: all(o in done for o in offsets), limit=1)
        assert all(done[o] for o in offsets)
        assert trio.current_time() - start < 0.5
        assert far not in done
        await trio.sleep(3)
        assert done[far] is False
        assert -1 not in done
        assert await m.wait_replicated(end, 1.0)
        assert m._live_waiters == 0


async def test_wait_replicated_true_once_the_slave_reports(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(100)
    async with _master(src, idle_poll_s=1000) as m, _slave(dst, _addr(m)):
        await _until(lambda: m.slave_count == 1)
        end = src.put_many(300)

        async def notify_later() -> None:
            await trio.sleep(0.5)
            m.notify_append()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(notify_later)
            start = trio.current_time()
            assert await m.wait_replicated(end, 3.0)
            assert 0.5 <= trio.current_time() - start < 1.0


async def test_slave_ok_needs_a_slave_within_the_gap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(file_size=1 << 20), FakeCommitLog(file_size=1 << 20)
    src.put_many(500)
    async with _master(src, max_gap_not_in_sync=1000, idle_poll_s=1000) as m:
        assert not m.slave_ok(src.max_phy_offset)  # no slave
        async with _slave(dst, _addr(m)):
            await _until(lambda: m.acked_offset == src.max_phy_offset)
            assert m.slave_ok(src.max_phy_offset)
            assert m.slave_ok(m.acked_offset + 999)
            assert not m.slave_ok(m.acked_offset + 1000)
            # Appends the slave has not been woken for: it falls behind.
            end = src.put_many(5000)
            assert not m.slave_ok(end)
            m.notify_append()
            await _until(lambda: m.acked_offset == end, limit=1)
            assert m.slave_ok(end)
        await _until(lambda: m.slave_count == 0)
        assert not m.slave_ok(end)


# -- hostile and raw clients -------------------------------------------------------------


async def _closed_within(stream: trio.SocketStream, seconds: float) -> float:
    """Drain `stream` until EOF; the time it took (fails after `seconds`)."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        while await stream.receive_some(65536):
            pass
    return trio.current_time() - start


async def test_hostile_clients_are_closed_without_affecting_a_slave(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(800)
    async with _master(src) as m, _slave(dst, _addr(m)):
        await _until(lambda: m.slave_count == 1 and _same(dst, src))
        acked = m.acked_offset

        async def connect() -> trio.SocketStream:
            return await trio.open_tcp_stream("127.0.0.1", m.port)

        cases = {
            "negative": b"\xff" * 8,
            "huge": encode_report(1 << 62),
            "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        }
        for name, payload in cases.items():
            async with await connect() as bad:
                await bad.send_all(payload)
                took = await _closed_within(bad, 2)
                assert took < 1, name
        # A good first report, then one beyond the master's max.
        async with await connect() as bad:
            await bad.send_all(encode_report(0))
            await trio.sleep(1)
            await bad.send_all(encode_report(src.max_phy_offset + 1))
            assert await _closed_within(bad, 2) < 1
        # Silent, or stuck inside a report: closed at the housekeeping timeout, not before.
        async with await connect() as silent, await connect() as partial:
            await partial.send_all(b"\x00" * 7)
            with trio.move_on_after(19):
                await silent.receive_some(1)
                raise AssertionError("closed too early")
            assert await _closed_within(silent, 2) <= 1.01
            assert await _closed_within(partial, 2) <= 1.01
        # The real slave kept going; no hostile report acknowledged anything.
        assert m.acked_offset == acked
        assert m.slave_count == 1
        src.put_many(700)
        m.notify_append()
        await _until(lambda: _same(dst, src), limit=2)
        assert m.acked_offset <= src.max_phy_offset


async def test_connections_beyond_the_cap_are_closed_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src, dst = FakeCommitLog(), FakeCommitLog()
    src.put_many(100)
    async with _master(src, max_connections=3) as m, _slave(dst, _addr(m)):
        await _until(lambda: m.slave_count == 1 and _same(dst, src))
        held = [await trio.open_tcp_stream("127.0.0.1", m.port) for _ in range(2)]
        await trio.sleep(0.5)  # the two are served (silent: closed only at housekeeping)
        async with await trio.open_tcp_stream("127.0.0.1", m.port) as extra:
            assert await _closed_within(extra, 2) < 0.5
        for s in held:
            await s.aclose()
        await _until(lambda: len(m._conns) == 1)
        # Room again: a new connection is served (kept open past the refusal time).
        again = await trio.open_tcp_stream("127.0.0.1", m.port)
        with trio.move_on_after(2):
            await again.receive_some(1)
            raise AssertionError("closed although under the cap")
        await again.aclose()
        assert m.slave_count == 1


async def test_master_sends_nothing_before_the_first_report_then_frames(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeCommitLog()
    src.put_many(3 * FILE + 10)
    async with (
        _master(src, transfer_batch_size=400) as m,
        await trio.open_tcp_stream("127.0.0.1", m.port) as raw,
    ):
        with trio.move_on_after(3) as quiet:
            await raw.receive_some(1)
        assert quiet.cancelled_caught
        assert m.slave_count == 0
        # Two reports and a partial third in one write: the newest complete one counts.
        await raw.send_all(encode_report(0) + encode_report(FILE + 100) + b"\x00\x00")
        reader = FrameReader()
        frames: list[tuple[int, bytes]] = []
        while sum(len(b) for _, b in frames) < src.max_phy_offset - (FILE + 100):
            frames += reader.feed(await raw.receive_some(65536))
        assert frames[0][0] == FILE + 100
        pos = FILE + 100
        for off, body in frames:
            assert off == pos
            assert 0 < len(body) <= 400
            assert off // FILE == (off + len(body) - 1) // FILE  # within one file
            assert body == src.data[off : off + len(body)]
            pos += len(body)
        assert m.slave_count == 1
        assert m.slave_offsets() == {next(iter(m.slave_offsets())): FILE + 100}
        await raw.send_all(b"\x00\x00\x00\x00\x00\x00")  # completes a report of 0
        await _until(lambda: 0 in m.slave_offsets().values())
        assert m.acked_offset == FILE + 100  # the high-water mark stays


async def test_master_heartbeat_frame_after_five_idle_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeCommitLog()
    src.put_many(2 * FILE + 50)
    last_file = 2 * FILE
    async with _master(src) as m, await trio.open_tcp_stream("127.0.0.1", m.port) as raw:
        # A report of 0 starts at the last file.
        await raw.send_all(encode_report(0))
        reader = FrameReader()
        frames = reader.feed(await raw.receive_some(65536))
        while len(frames) < 1:
            frames += reader.feed(await raw.receive_some(65536))
        assert frames == [(last_file, bytes(src.data[last_file:]))]
        sent = trio.current_time()
        await raw.send_all(encode_report(src.max_phy_offset))
        header = b""
        while len(header) < FRAME_HEADER_SIZE:
            header += await raw.receive_some(FRAME_HEADER_SIZE - len(header))
        assert header == encode_frame_header(src.max_phy_offset, 0)
        assert trio.current_time() - sent == pytest.approx(5.0, abs=0.15)


async def test_master_closes_a_slave_that_stops_reading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeCommitLog(file_size=64 << 20)
    src.data = bytearray(32 << 20)
    with capture_logs() as logs:
        async with _master(src) as m, await trio.open_tcp_stream("127.0.0.1", m.port) as raw:
            await raw.send_all(encode_report(0))
            await _until(lambda: m.slave_count == 1)
            # Keeps reporting (so the reader is content) but never reads the frames.
            start = trio.current_time()
            with trio.fail_after(40):
                while m.slave_count:
                    await raw.send_all(encode_report(0))
                    await trio.sleep(1)
            assert trio.current_time() - start > 19.9
    assert [e["reason"] for e in logs if e["event"] == "ha_slave_lost"] == ["send stalled"]


async def test_notify_append_writes_the_new_frame_within_the_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeCommitLog()
    src.put_many(200)
    # Polls and heartbeats far apart: only notify_append moves the new bytes.
    async with (
        _master(src, idle_poll_s=1000, heartbeat_interval_s=1000) as m,
        await trio.open_tcp_stream("127.0.0.1", m.port) as raw,
    ):
        await raw.send_all(encode_report(src.max_phy_offset))
        await _until(lambda: m.slave_count == 1)
        await trio.sleep(1)  # the transfer task is idle
        assert m.runtime_info().ha_connection_info[0].transfer_from_where == src.max_phy_offset
        before = src.max_phy_offset
        end = src.put_many(300)
        m.notify_append()
        # Written before the master's tasks ran again: the call wrote it to the socket.
        assert m.runtime_info().ha_connection_info[0].transfer_from_where == end
        reader = FrameReader()
        frames: list[tuple[int, bytes]] = []
        with trio.fail_after(1):
            while not frames:
                frames += reader.feed(await raw.receive_some(65536))
        assert frames == [(before, bytes(src.data[before:end]))]


async def test_frames_written_in_part_keep_the_stream_whole_until_the_stall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeCommitLog(file_size=64 << 20)
    src.put_many(100)
    with capture_logs() as logs:
        async with (
            _master(src, idle_poll_s=1000, heartbeat_interval_s=1000) as m,
            await trio.open_tcp_stream("127.0.0.1", m.port) as raw,
        ):
            start_at = src.max_phy_offset
            await raw.send_all(encode_report(start_at))
            await _until(lambda: m.slave_count == 1)
            # The slave stops reading: small appends, each written at once, fill the socket
            # until one goes out in part (or not at all) and its tail waits for the task.
            start = trio.current_time()
            with trio.fail_after(40):
                for step in range(2048):  # 16 MiB, beyond the socket buffers
                    src.put_many(8192)
                    m.notify_append()
                    if step % 100 == 0:
                        await raw.send_all(encode_report(start_at))  # still reporting
                    await trio.sleep(0.005)
                # Then silent: the stall bound (from when the socket filled) comes first.
                while m.slave_count:
                    await trio.sleep(0.5)
            assert trio.current_time() - start > 19.9
            # What reached the socket is whole frames in order, from where the slave was.
            reader = FrameReader(max_body=64 << 20)
            frames: list[tuple[int, bytes]] = []
            while data := await raw.receive_some(1 << 20):
                frames += reader.feed(data)
            assert frames
            assert reader.pending < FRAME_HEADER_SIZE + m.transfer_batch_size
            pos = start_at
            for off, body in frames:
                assert off == pos
                assert body == src.data[off : off + len(body)]
                pos += len(body)
    assert [e["reason"] for e in logs if e["event"] == "ha_slave_lost"] == ["send stalled"]


# -- the real store ---------------------------------------------------------------------


def _require_replica_api() -> type[Any]:
    from store.message_store import MessageStore

    if not hasattr(MessageStore, "read_commitlog") or not hasattr(MessageStore, "append_replica"):
        pytest.skip("MessageStore.read_commitlog/append_replica not there yet")
    return MessageStore


def test_message_store_has_the_replication_api() -> None:
    store_cls = _require_replica_api()
    read = inspect.signature(store_cls.read_commitlog)
    assert list(read.parameters)[1:] == ["phy_offset", "max_bytes"]
    append = inspect.signature(store_cls.append_replica)
    assert list(append.parameters)[1:] == ["phy_offset", "data", "written"]
    assert inspect.iscoroutinefunction(store_cls.append_replica)
    assert isinstance(inspect.getattr_static(store_cls, "max_phy_offset"), property)


async def test_real_stores_replicate_over_loopback(tmp_path: Path) -> None:
    store_cls = _require_replica_api()
    from common.message import MessageInner
    from store import PutMessageStatus, StoreConfig

    def config(root: Path) -> StoreConfig:
        return StoreConfig.model_validate(
            {
                "store_path_root_dir": root,
                "mapped_file_size_commitlog": 64 * 1024,
                "mapped_file_size_consume_queue": 32 * 20,
                "max_hash_slot_num": 64,
                "max_index_num": 256,
            }
        )

    async def put(store: Any, first: int, count: int) -> None:
        for i in range(first, first + count):
            msg = MessageInner(
                "TopicHA",
                bytes(i % 251 for _ in range(200 + 37 * (i % 50))),
                queue_id=i % 4,
                born_timestamp=1_700_000_000_000 + i,
                born_host=("192.0.2.1", 1234),
                store_host=("192.0.2.2", 10911),
            )
            result = await store.put_message(msg)
            assert result.status is PutMessageStatus.PUT_OK

    def files(store: Any) -> dict[str, bytes]:
        return {mf.path.name: mf.path.read_bytes() for mf in store.commitlog.mfq.files}

    async with (
        store_cls(config(tmp_path / "m")) as src,
        store_cls(config(tmp_path / "s")) as dst,
    ):
        await put(src, 0, 20)  # inside the first file: the slave starts at 0
        assert src.max_phy_offset < 64 * 1024
        ha = HAMaster(src)
        src.add_arrival_listener(lambda _t, _q, _o: ha.notify_append())
        async with trio.open_nursery() as nursery:
            await nursery.start(ha.run, "127.0.0.1", 0)
            slave = HASlave(dst, f"127.0.0.1:{ha.port}")
            nursery.start_soon(slave.run)
            await _until(lambda: ha.slave_count == 1, limit=5)
            await put(src, 20, 300)  # several files, while streaming
            assert len(src.commitlog.mfq.files) >= 4
            await _until(lambda: dst.max_phy_offset == src.max_phy_offset, limit=20)
            assert await ha.wait_replicated(src.max_phy_offset, 5.0)
            nursery.cancel_scope.cancel()
        assert files(dst) == files(src)

"""Controller-mode HA (`broker.ha_autoswitch`): the codec, master and slave over real loopback
TCP with in-memory commitlogs and real epoch files, the acknowledgement rule, hostile peers.

`FakeLog` is `test_ha.FakeCommitLog` (files of a fixed size, records never crossing a file,
`append_replica` refusing any offset but its max) with the min offset and a truncation.
Raw slaves (a socket speaking the wire by hand) let the acknowledgement tests choose every
report.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.lowlevel
import trio.testing
from structlog.testing import capture_logs

from broker.commit import Replication
from broker.ha import HAProtocolError
from broker.ha_autoswitch import (
    EPOCH_ENTRY_SIZE,
    MASTER_HANDSHAKE_HEADER_SIZE,
    SLAVE_HANDSHAKE_SIZE,
    SLAVE_REPORT_SIZE,
    TRANSFER_HEADER_SIZE,
    AutoSwitchHAMaster,
    AutoSwitchHASlave,
    AutoSwitchMasterStore,
    AutoSwitchSlaveStore,
    HAConnectionState,
    MasterHandshake,
    MasterStreamReader,
    SlaveHandshake,
    SlaveReport,
    SlaveStreamReader,
    TransferFrame,
    encode_master_handshake,
    encode_slave_handshake,
    encode_slave_report,
    encode_transfer_header,
)
from store.epoch_file import EpochEntry, EpochFile
from tests.unit.broker.test_ha import FakeCommitLog

pytestmark = pytest.mark.unit

FILE = 1024
E = EpochEntry


@pytest.fixture(autouse=True)
def _all_log_levels(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`capture_logs` sees every event of `broker.ha_autoswitch`, whatever logging set-up an
    earlier test left."""
    import broker.ha_autoswitch

    saved = structlog.get_config()
    structlog.reset_defaults()
    monkeypatch.setattr(broker.ha_autoswitch, "log", structlog.get_logger())
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture(autouse=True)
def _inline_epoch_saves(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the autojump clock, a wait for a worker thread counts as idle: the clock would
    leap over every deadline while the epoch file fsyncs. Those tests save inline; the
    real-clock test keeps the thread."""
    if "autojump_clock" not in request.fixturenames:
        return
    import broker.ha_autoswitch

    async def inline(epochs: EpochFile) -> None:
        await trio.lowlevel.checkpoint()
        epochs.save()

    monkeypatch.setattr(broker.ha_autoswitch, "_save_epochs", inline)


class FakeLog(FakeCommitLog):
    def __init__(self, file_size: int = FILE, seed: int = FILE) -> None:
        super().__init__(file_size)
        self.rng = random.Random(seed)
        self.truncations: list[int] = []
        self.before_append: Callable[[int], None] | None = None

    @property
    def min_phy_offset(self) -> int:
        return self.base

    async def truncate_commitlog(self, offset: int) -> int:
        await trio.lowlevel.checkpoint()
        if not self.base <= offset <= self.max_phy_offset:
            raise ValueError(f"truncate offset {offset} out of range")
        dropped = self.max_phy_offset - offset
        del self.data[offset - self.base :]
        self.truncations.append(offset)
        return dropped

    async def append_replica(
        self, phy_offset: int, data: bytes, written: Callable[[], None] | None = None
    ) -> None:
        if self.before_append is not None:
            self.before_append(phy_offset)
        await super().append_replica(phy_offset, data, written)


def _typed(
    store: FakeLog, master: AutoSwitchHAMaster
) -> tuple[AutoSwitchMasterStore, AutoSwitchSlaveStore, Replication]:
    # mypy checks these: the fake fits both store protocols, the master what commits wait on.
    return store, store, master


class Epochs:
    """A master's epoch entries, as the broker keeps them."""

    def __init__(self, *entries: EpochEntry) -> None:
        self.entries = list(entries)

    def __call__(self) -> list[EpochEntry]:
        return self.entries

    def start(self, epoch: int, log: FakeLog) -> None:
        self.entries.append(E(epoch, log.max_phy_offset))


def _epoch_file(tmp_path: Path, *entries: EpochEntry, name: str = "slave") -> EpochFile:
    (tmp_path / name).mkdir(exist_ok=True)
    f = EpochFile(tmp_path / name / "epochFileCheckpoint")
    f.entries = list(entries)
    f.save()
    return f


def _on_disk(f: EpochFile) -> list[EpochEntry]:
    g = EpochFile(f.path)
    g.load()
    return g.entries


async def _until(pred: Callable[[], bool], limit: float = 30.0, step: float = 0.01) -> float:
    """Wait (fake clock) until `pred()`; returns the time it took."""
    start = trio.current_time()
    with trio.fail_after(limit):
        while not pred():
            await trio.sleep(step)
    return trio.current_time() - start


async def _closed_within(stream: trio.SocketStream, seconds: float) -> float:
    """Drain `stream` until EOF (or a reset); the time it took (fails after `seconds`)."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
    return trio.current_time() - start


@asynccontextmanager
async def _master(
    store: FakeLog, epochs: Callable[[], list[EpochEntry]], **kw: Any
) -> AsyncIterator[AutoSwitchHAMaster]:
    master = AutoSwitchHAMaster(store, epochs, **kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(master.run, "127.0.0.1", 0)
        try:
            yield master
        finally:
            # Also on a failure: else the nursery waits forever (the fake clock spinning).
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def _slave(
    store: FakeLog, epochs: EpochFile, broker_id: int, addr: str | None, **kw: Any
) -> AsyncIterator[AutoSwitchHASlave]:
    slave = AutoSwitchHASlave(store, epochs, broker_id, addr, **kw)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slave.run)
        try:
            yield slave
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def _scripted_master() -> AsyncIterator[tuple[trio.SocketListener, str]]:
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        yield listener, f"127.0.0.1:{listener.socket.getsockname()[1]}"


def _addr(master: AutoSwitchHAMaster) -> str:
    return f"127.0.0.1:{master.port}"


def _same(slave: FakeLog, master: FakeLog) -> bool:
    return (
        slave.max_phy_offset == master.max_phy_offset
        and slave.data == master.data[slave.base - master.base :]
    )


async def _read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


async def _report_reaches(stream: trio.SocketStream, offset: int) -> None:
    """Read the slave's reports until one is `offset` (earlier heartbeats may repeat the
    previous one)."""
    with trio.fail_after(10):
        while True:
            state, value = struct.unpack(">iq", await _read_exactly(stream, 12))
            assert state == 2
            if value == offset:
                return
            assert value < offset


class RawSlave:
    """A slave played by hand: handshakes, then reports what the test says."""

    def __init__(self, stream: trio.SocketStream, handshake: MasterHandshake) -> None:
        self.stream = stream
        self.handshake = handshake

    @classmethod
    async def connect(cls, master: AutoSwitchHAMaster, slave_id: int, **kw: bool) -> RawSlave:
        stream = await trio.open_tcp_stream("127.0.0.1", master.port)
        await stream.send_all(encode_slave_handshake(slave_id, **kw))
        reader = MasterStreamReader()
        messages: list[MasterHandshake | TransferFrame] = []
        with trio.fail_after(2):
            while not messages:
                messages = reader.feed(await stream.receive_some(65536))
        (hs,) = messages
        assert isinstance(hs, MasterHandshake)
        return cls(stream, hs)

    async def report(self, offset: int) -> None:
        await self.stream.send_all(encode_slave_report(offset))

    async def aclose(self) -> None:
        await self.stream.aclose()


# -- codec -------------------------------------------------------------------------------


def test_sizes_and_layouts_match_rocketmq() -> None:
    assert [int(s) for s in HAConnectionState] == [0, 1, 2, 3, 4]
    assert (SLAVE_HANDSHAKE_SIZE, SLAVE_REPORT_SIZE) == (16, 12)
    assert (MASTER_HANDSHAKE_HEADER_SIZE, EPOCH_ENTRY_SIZE, TRANSFER_HEADER_SIZE) == (20, 12, 36)
    assert encode_slave_handshake(7, sync_from_last_file=True) == struct.pack(">ihhq", 1, 1, 0, 7)
    assert encode_slave_handshake(2**40, async_learner=True) == struct.pack(">ihhq", 1, 0, 1, 2**40)
    assert encode_slave_report(0x0102030405060708) == b"\x00\x00\x00\x02" + bytes(range(1, 9))
    assert encode_master_handshake(900, [E(1, 0), E(3, 500)]) == struct.pack(
        ">iiqi", 1, 24, 900, 3
    ) + struct.pack(">iqiq", 1, 0, 3, 500)
    assert encode_master_handshake(0, []) == struct.pack(">iiqi", 1, 0, 0, -1)
    assert encode_transfer_header(1000, 5, 3, 500, 800) == struct.pack(
        ">iiqiqq", 2, 5, 1000, 3, 500, 800
    )
    bad_calls: list[Callable[[], bytes]] = [
        lambda: encode_slave_handshake(-1),
        lambda: encode_slave_report(-1),
        lambda: encode_slave_report(2**63),
        lambda: encode_master_handshake(-1, []),
        lambda: encode_master_handshake(10, [E(-1, 0)]),
        lambda: encode_transfer_header(0, -1, 1, 0, 0),
        lambda: encode_transfer_header(0, 2**31, 1, 0, 0),
        lambda: encode_transfer_header(-1, 0, 1, 0, 0),
    ]
    for bad in bad_calls:
        with pytest.raises(ValueError):
            bad()


def test_slave_stream_round_trips_split_anywhere() -> None:
    wire = (
        encode_slave_handshake(9, sync_from_last_file=True)
        + encode_slave_report(0)
        + encode_slave_report(4096)
        + encode_slave_report(2**62)
    )
    expected = [
        SlaveHandshake(9, sync_from_last_file=True),
        SlaveReport(0),
        SlaveReport(4096),
        SlaveReport(2**62),
    ]
    for cut in range(len(wire) + 1):
        reader = SlaveStreamReader()
        got = reader.feed(wire[:cut]) + reader.feed(wire[cut:])
        assert got == expected
        assert reader.pending == 0
    reader = SlaveStreamReader()
    got = [m for b in wire for m in reader.feed(bytes([b]))]
    assert got == expected
    assert reader.feed(encode_slave_report(5)[:11]) == []
    assert reader.pending == 11  # under one message is kept


@pytest.mark.parametrize(
    "wire",
    [
        encode_slave_report(0),  # a report before the handshake: refused at its state
        struct.pack(">i", 0),  # READY
        struct.pack(">i", 3),  # SUSPEND
        struct.pack(">ihhq", 1, 2, 0, 1),  # a flag other than 0/1
        struct.pack(">ihhq", 1, 0, -1, 1),
        struct.pack(">ihhq", 1, 0, 0, -5),  # a negative id
        encode_slave_handshake(1) + encode_slave_handshake(1)[:4],  # twice
        encode_slave_handshake(1) + struct.pack(">i", 4),
        b"GET / HTTP/1.1\r\n",
    ],
)
def test_slave_stream_refuses_bad_messages(wire: bytes) -> None:
    reader = SlaveStreamReader()
    with pytest.raises(HAProtocolError):
        reader.feed(wire)
    assert reader.pending == 0
    with pytest.raises(HAProtocolError):
        reader.feed(encode_slave_report(0))


def test_master_stream_round_trips_split_anywhere() -> None:
    entries = (E(1, 0), E(2, 300), E(5, 300), E(6, 1200))
    wire = (
        encode_master_handshake(1500, entries)
        + encode_transfer_header(1200, 4, 6, 1200, 1100)
        + b"abcd"
        + encode_transfer_header(1204, 0, 6, 1200, 1204)
        + encode_transfer_header(1204, 0, -1, 0, -1)
    )
    expected = [
        MasterHandshake(1500, 6, entries),
        TransferFrame(1200, 6, 1200, 1100, b"abcd"),
        TransferFrame(1204, 6, 1200, 1204, b""),
        TransferFrame(1204, -1, 0, -1, b""),
    ]
    for cut in range(len(wire) + 1):
        reader = MasterStreamReader()
        assert reader.feed(wire[:cut]) + reader.feed(wire[cut:]) == expected
        assert reader.pending == 0
    empty = encode_master_handshake(0, [])
    assert MasterStreamReader().feed(empty) == [MasterHandshake(0, -1, ())]


def _mh(size: int, max_offset: int, body: bytes = b"") -> bytes:
    return struct.pack(">iiqi", 1, size, max_offset, 0) + body


_HS = encode_master_handshake(100, [E(1, 0)])


@pytest.mark.parametrize(
    "wire",
    [
        encode_transfer_header(0, 0, 1, 0, 0),  # a frame before the handshake
        struct.pack(">i", 4),
        _mh(13, 100),  # not a multiple of 12
        _mh(-12, 100),
        _mh(12 * 9, 100),  # over max_entries (8 here)
        _mh(0, -1),
        _mh(24, 100, struct.pack(">iqiq", 2, 0, 2, 50)),  # epochs not increasing
        _mh(24, 100, struct.pack(">iqiq", 1, 50, 2, 10)),  # starts going back
        _mh(12, 100, struct.pack(">iq", 1, 101)),  # an epoch starting past the max
        _mh(12, 100, struct.pack(">iq", 1, -1)),
        _mh(12, 100, struct.pack(">iq", -2, 0)),  # a negative epoch
        _HS + _HS[:4],  # a second handshake
        _HS + struct.pack(">iiqiqq", 2, 65, 0, 1, 0, 0),  # a body over max_body (64 here)
        _HS + struct.pack(">iiqiqq", 2, -1, 0, 1, 0, 0),
        _HS + struct.pack(">iiqiqq", 2, 0, -1, 1, 0, 0),
        _HS + struct.pack(">iiqiqq", 2, 0, 0, 1, -1, 0),
        _HS + struct.pack(">iiqiqq", 2, 4, 0, -1, 0, 0),  # a body without an epoch
        _HS + struct.pack(">iiqiqq", 2, 4, 10, 1, 11, 0),  # in an epoch starting after it
    ],
)
def test_master_stream_refuses_bad_headers_before_their_bodies(wire: bytes) -> None:
    reader = MasterStreamReader(max_body=64, max_entries=8)
    with pytest.raises(HAProtocolError):
        reader.feed(wire)
    assert reader.pending == 0
    with pytest.raises(HAProtocolError):
        reader.feed(b"")


def test_master_stream_buffers_one_message_at_most() -> None:
    reader = MasterStreamReader(max_body=64)
    assert reader.feed(_HS) != []
    # A header announcing a body too large is refused before any of the body arrives.
    with pytest.raises(HAProtocolError):
        reader.feed(struct.pack(">iiqiqq", 2, 1 << 30, 0, 1, 0, 0))


# -- master and slave over loopback ------------------------------------------------------


async def test_slave_follows_files_and_epochs_byte_identical(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    src, dst = FakeLog(), FakeLog(seed=7)
    epochs = Epochs(E(1, 0))
    src.put_many(1500)
    epochs.start(2, src)
    src.put_many(1300)
    epochs.start(3, src)
    src.put_many(900)
    local = _epoch_file(tmp_path)
    async with (
        _master(src, epochs, transfer_batch_size=300, need_acks=1) as m,
        _slave(dst, local, 1, _addr(m)) as s,
    ):
        m.set_sync_state_set(0, frozenset({0, 1}))
        await _until(lambda: _same(dst, src))
        assert dst.base == 0  # an empty slave starts at the master's min offset
        assert local.entries == epochs.entries
        assert _on_disk(local) == epochs.entries
        # An epoch started while the slave follows.
        epochs.start(4, src)
        for _ in range(5):
            src.put_many(400)
            m.notify_append()
            await _until(lambda: _same(dst, src))
        assert local.entries == epochs.entries == _on_disk(local)
        assert len(epochs.entries) == 4
        assert src.max_phy_offset > 5 * FILE
        # No frame crosses an epoch start (the fake checks files) or the batch size.
        starts = [e.start_offset for e in epochs.entries]
        for off, n in dst.replica_appends:
            assert 0 < n <= 300
            assert not any(off < st < off + n for st in starts), (off, n)
        await _until(lambda: m.confirm_offset == src.max_phy_offset)
        # The next frame (a heartbeat) brings the confirm offset to the slave.
        await _until(lambda: s.confirm_offset == src.max_phy_offset, limit=10)
        assert s.last_consistent_point is None  # no local epoch: nothing to reconcile
        assert m.slave_count == 1
        (state,) = m.slave_states().values()
        assert (state.slave_id, state.ack, state.connected) == (1, src.max_phy_offset, True)


async def test_an_empty_slave_starts_at_the_last_file_or_the_min_offset(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    src, dst = FakeLog(), FakeLog()
    src.put_many(3 * FILE + 200)
    async with (
        _master(src, Epochs(E(1, 0))) as m,
        _slave(dst, _epoch_file(tmp_path), 1, _addr(m), sync_from_last_file=True),
    ):
        await _until(lambda: dst.max_phy_offset == src.max_phy_offset)
        assert dst.base == 3 * FILE
        assert dst.data == src.data[3 * FILE :]
    # Without the flag an empty slave starts at the master's min offset (older files gone).
    src.base, src.data = 2 * FILE, src.data[2 * FILE :]
    dst = FakeLog()
    async with (
        _master(src, Epochs(E(1, 0))) as m,
        _slave(dst, _epoch_file(tmp_path, name="other"), 1, _addr(m)),
    ):
        await _until(lambda: _same(dst, src))
        assert dst.base == 2 * FILE


@pytest.mark.parametrize("case", ["epoch the master lacks", "longer tail of a shared epoch"])
async def test_a_diverged_slave_is_cut_to_the_consistent_point_then_converges(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, case: str
) -> None:
    src, dst = FakeLog(), FakeLog(seed=99)
    src.put_many(1500)
    shared = src.max_phy_offset
    dst.copy_prefix(src, shared)
    epochs = Epochs(E(1, 0))
    if case == "epoch the master lacks":
        # dst was master of epoch 2 and wrote a tail nobody acknowledged; src was elected
        # for epoch 3 at the shared end.
        local = _epoch_file(tmp_path, E(1, 0), E(2, shared))
        dst.put_many(1700)
        epochs.start(3, src)
    else:
        # dst wrote more of epoch 1 than src got; src was elected for epoch 2.
        local = _epoch_file(tmp_path, E(1, 0))
        dst.put_many(600)
        epochs.start(2, src)
    src.put_many(2100)
    assert dst.max_phy_offset > shared
    assert dst.data[shared:] != src.data[shared : dst.max_phy_offset]
    async with _master(src, epochs) as m, _slave(dst, local, 2, _addr(m)) as s:
        await _until(lambda: _same(dst, src))
        assert dst.truncations == [shared]
        assert s.last_consistent_point == shared
        assert dst.replica_appends[0][0] == shared
        assert dst.data == src.data
        assert local.entries == epochs.entries == _on_disk(local)


async def test_real_clock_a_diverged_slave_saves_in_a_thread_and_converges(
    tmp_path: Path,
) -> None:
    src, dst = FakeLog(), FakeLog(seed=99)
    src.put_many(2500)
    shared = src.max_phy_offset
    dst.copy_prefix(src, shared)
    local = _epoch_file(tmp_path, E(1, 0), E(2, shared))
    dst.put_many(900)
    epochs = Epochs(E(1, 0))
    epochs.start(3, src)
    src.put_many(2000)
    async with _master(src, epochs) as m, _slave(dst, local, 2, _addr(m)):
        await _until(lambda: _same(dst, src), limit=10)
        epochs.start(4, src)
        src.put_many(500)
        m.notify_append()
        await _until(lambda: _same(dst, src), limit=10)
    assert dst.truncations == [shared]
    assert local.entries == epochs.entries == _on_disk(local)
    assert len(epochs.entries) == 3


async def test_no_consistent_point_retries_and_never_appends(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    src, dst = FakeLog(), FakeLog(seed=5)
    src.put_many(900)
    dst.put_many(700)
    before = bytes(dst.data)
    local = _epoch_file(tmp_path, E(5, 0))
    epochs = Epochs(E(1, 0), E(2, 400))
    with capture_logs() as logs:
        async with _master(src, epochs) as m, _slave(dst, local, 1, _addr(m)) as s:
            await trio.sleep(30)
            assert m.slave_count == 0
            assert not any(st.connected for st in m.slave_states().values())
    assert dst.replica_appends == []
    assert dst.truncations == []
    assert bytes(dst.data) == before
    assert local.entries == _on_disk(local) == [E(5, 0)]
    assert s.last_consistent_point is None
    tries = [e for e in logs if e["event"] == "ha_no_consistent_point"]
    assert 6 <= len(tries) <= 10  # ~2, 2, 4, 5, 5, ... s apart over 30 s


async def test_no_consistent_point_waits_two_seconds_then_backs_off(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    dst = FakeLog()
    dst.put_many(300)
    local = _epoch_file(tmp_path, E(5, 0))
    times: list[float] = []
    async with _scripted_master() as (listener, addr), _slave(dst, local, 3, addr):
        for _ in range(5):
            conn = await listener.accept()
            times.append(trio.current_time())
            assert await _read_exactly(conn, 16) == encode_slave_handshake(3)
            await conn.send_all(encode_master_handshake(5000, [E(1, 0), E(2, 100)]))
            assert await _closed_within(conn, 1) < 0.1
            await conn.aclose()
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(times)]
    assert gaps == [2.0, 2.0, 4.0, 5.0]
    assert dst.truncations == []


async def test_slave_saves_a_new_epoch_before_the_bytes_and_checks_frames(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A scripted master: frames in a new epoch, then contradictions that close."""
    dst = FakeLog()
    local = _epoch_file(tmp_path)
    seen_on_disk: list[list[EpochEntry]] = []
    dst.before_append = lambda _off: seen_on_disk.append(_on_disk(local))
    body = bytes(range(100))

    async def hello(conn: trio.SocketStream, max_offset: int, entries: list[EpochEntry]) -> int:
        assert await _read_exactly(conn, 16) == encode_slave_handshake(7)
        await conn.send_all(encode_master_handshake(max_offset, entries))
        report = struct.unpack(">iq", await _read_exactly(conn, 12))
        assert report[0] == 2
        return int(report[1])

    async with _scripted_master() as (listener, addr), _slave(dst, local, 7, addr) as s:
        async with await listener.accept() as conn:
            assert await hello(conn, 0, []) == 0
            await conn.send_all(encode_transfer_header(0, 100, 3, 0, 50) + body)
            await _report_reaches(conn, 100)
            assert seen_on_disk == [[E(3, 0)]]  # saved before the bytes went in
            assert local.entries == [E(3, 0)]
            assert s.confirm_offset == 50
            # Epoch 4 from 100: recorded; a confirm past the local max is capped.
            await conn.send_all(encode_transfer_header(100, 100, 4, 100, 900) + body)
            await _report_reaches(conn, 200)
            assert _on_disk(local) == [E(3, 0), E(4, 100)]
            assert s.confirm_offset == 200
            # A heartbeat of an unknown epoch start is ignored, not recorded.
            await conn.send_all(encode_transfer_header(200, 0, 9, 150, 200))
            await trio.sleep(1)
            assert s.connected
            assert local.entries == [E(3, 0), E(4, 100)]
            # A body in an older epoch (even one said to start here): closed, nothing
            # appended.
            with capture_logs() as logs:
                await conn.send_all(encode_transfer_header(200, 100, 3, 200, 200) + body)
                assert await _closed_within(conn, 1) < 0.5
            assert [e["error"] for e in logs if e["event"] == "ha_epoch_mismatch"] == [
                "epoch 3 older than the local 4"
            ]
        assert dst.max_phy_offset == 200
        async with await listener.accept() as conn:
            assert await hello(conn, 300, [E(3, 0), E(4, 100)]) == 200
            # A new epoch that does not start at the local max.
            await conn.send_all(encode_transfer_header(200, 100, 5, 150, 200) + body)
            assert await _closed_within(conn, 1) < 0.5
        async with await listener.accept() as conn:
            assert await hello(conn, 300, [E(3, 0), E(4, 100)]) == 200
            # A frame at another offset than the local max (its epoch is not recorded).
            await conn.send_all(encode_transfer_header(260, 10, 5, 200, 200) + body[:10])
            assert await _closed_within(conn, 1) < 0.5
            assert local.entries == [E(3, 0), E(4, 100)]
        async with await listener.accept() as conn:
            assert await hello(conn, 300, [E(3, 0), E(4, 100)]) == 200
            # A handshake state where a transfer frame is due.
            await conn.send_all(encode_master_handshake(300, []))
            assert await _closed_within(conn, 1) < 0.5
        async with await listener.accept() as conn:
            assert await hello(conn, 300, [E(3, 0), E(4, 100)]) == 200
            await conn.send_all(encode_transfer_header(200, 100, 4, 100, 300) + body)
            await _report_reaches(conn, 300)
    assert dst.replica_appends == [(0, 100), (100, 100), (200, 100)]
    assert local.entries == _on_disk(local) == [E(3, 0), E(4, 100)]


async def test_an_epoch_entry_not_saved_is_not_kept(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import broker.ha_autoswitch

    dst = FakeLog()
    local = _epoch_file(tmp_path)
    failures = [OSError("disk full")]

    async def save(epochs: EpochFile) -> None:
        await trio.lowlevel.checkpoint()
        if failures:
            raise failures.pop()
        epochs.save()

    monkeypatch.setattr(broker.ha_autoswitch, "_save_epochs", save)
    frame = encode_transfer_header(0, 10, 3, 0, 0) + bytes(10)
    async with _scripted_master() as (listener, addr), _slave(dst, local, 7, addr):
        for attempt in range(2):
            async with await listener.accept() as conn:
                await _read_exactly(conn, 16)
                await conn.send_all(encode_master_handshake(10, [E(3, 0)]))
                await _report_reaches(conn, 0)
                await conn.send_all(frame)
                if attempt == 0:
                    assert await _closed_within(conn, 1) < 0.5
                    assert local.entries == []  # the failed save left nothing behind
                    assert dst.max_phy_offset == 0
                else:
                    await _report_reaches(conn, 10)
    assert failures == []
    assert dst.replica_appends == [(0, 10)]
    assert local.entries == _on_disk(local) == [E(3, 0)]


# -- the acknowledgement rule ------------------------------------------------------------


def _recorder() -> tuple[dict[int, bool], Callable[[int], Callable[[bool], None]]]:
    done: dict[int, bool] = {}

    def record(key: int) -> Callable[[bool], None]:
        return lambda ok: done.__setitem__(key, ok)

    return done, record


async def test_all_ack_waits_for_every_member(autojump_clock: trio.testing.MockClock) -> None:
    src = FakeLog()
    src.put_many(1000)
    top = src.max_phy_offset
    async with _master(src, Epochs(E(1, 0)), all_ack=True) as m:
        m.set_sync_state_set(0, frozenset({0, 1, 2}))
        assert m.in_sync_set_size() == 3
        assert not m.slave_ok(top)  # nobody connected
        a = await RawSlave.connect(m, 1)
        b = await RawSlave.connect(m, 2)
        await a.report(600)
        await b.report(0)
        await _until(lambda: m.slave_count == 2)
        assert m.slave_ok(top)
        assert m.confirm_offset == 0
        done, record = _recorder()
        m.when_replicated(600, record(600), 3.0)
        m.when_replicated(top, record(top), 3.0)
        await trio.sleep(0.5)
        assert done == {}
        await b.report(700)  # both have 600 now
        await _until(lambda: 600 in done, limit=0.5)
        assert done == {600: True}
        assert m.confirm_offset == m.acked_offset == 600
        await b.report(top)  # one member is not enough
        await trio.sleep(3)
        assert done == {600: True, top: False}
        # A set change answers the waiters it replicates, at once.
        m.when_replicated(top, record(-1), 3.0)
        await trio.sleep(0.5)
        assert -1 not in done
        m.set_sync_state_set(0, frozenset({0, 2}))
        assert done[-1] is True
        assert m.confirm_offset == top
        # Back to three members, one of them gone: the confirm offset stays, sends may not.
        await a.aclose()
        await _until(lambda: m.slave_count == 1)
        m.set_sync_state_set(0, frozenset({0, 1, 2}))
        assert m.confirm_offset == top
        assert not m.slave_ok(top)
        assert 1 not in m.slave_states()  # it left while not a member
        end = src.put_many(100)
        assert not await m.wait_replicated(end, 1.0)
        # A set of the master alone needs no slave.
        m.set_sync_state_set(0, frozenset({0}))
        assert await m.wait_replicated(end, 1.0)
        assert m.slave_ok(end)
        await b.aclose()


async def test_need_acks_counts_members_only(autojump_clock: trio.testing.MockClock) -> None:
    src = FakeLog()
    src.put_many(1000)
    top = src.max_phy_offset
    async with _master(src, Epochs(E(1, 0)), need_acks=2, max_gap_not_in_sync=300) as m:
        m.set_sync_state_set(0, frozenset({0, 1, 2}))
        a = await RawSlave.connect(m, 1)
        outsider = await RawSlave.connect(m, 3)
        await a.report(900)
        await outsider.report(top)
        await _until(lambda: m.slave_count == 2)
        assert m.connected_members() == 1
        assert not m.slave_ok(m.confirm_offset)  # one member of the two needed
        done, record = _recorder()
        m.when_replicated(500, record(500), 5.0)
        m.when_replicated(900, record(900), 5.0)
        await trio.sleep(1)
        assert done == {}  # the outsider's report does not count
        b = await RawSlave.connect(m, 2)
        await b.report(500)
        await _until(lambda: 500 in done, limit=1)
        assert done == {500: True}
        assert m.confirm_offset == 500  # the second-highest member ack
        assert m.slave_ok(500 + 299)  # within the gap
        assert not m.slave_ok(500 + 300)  # at the gap
        await b.report(950)
        await _until(lambda: 900 in done, limit=1)
        assert done[900] is True
        assert m.confirm_offset == 900
        assert {s: st.ack for s, st in m.slave_states().items()} == {1: 900, 2: 950, 3: top}
        for r in (a, b, outsider):
            await r.aclose()


async def test_need_acks_one_and_zero(autojump_clock: trio.testing.MockClock) -> None:
    src = FakeLog()
    src.put_many(800)
    top = src.max_phy_offset
    async with _master(src, Epochs(E(1, 0)), need_acks=1) as m:
        m.set_sync_state_set(0, frozenset({0, 1, 2}))
        a = await RawSlave.connect(m, 1)
        b = await RawSlave.connect(m, 2)
        await a.report(100)
        await b.report(400)
        await _until(lambda: m.confirm_offset == 400)  # either member suffices
        await a.report(top)
        await _until(lambda: m.confirm_offset == top)
        await b.aclose()
        await a.aclose()
        await _until(lambda: m.slave_count == 0)
        assert not m.slave_ok(top)
        assert m.confirm_offset == top  # never decreases
    async with _master(src, Epochs(E(1, 0))) as m:  # need_acks=0: no wait, no slave needed
        assert m.slave_ok(top)
        results: list[bool] = []
        m.when_replicated(top, results.append, 1.0)
        assert results == []  # not from within the call
        await trio.lowlevel.checkpoint()
        await _until(lambda: results == [True], limit=0.1)


async def test_last_caught_up_follows_transfers(autojump_clock: trio.testing.MockClock) -> None:
    src = FakeLog()
    src.put_many(600)

    def clock() -> int:
        # Not 0 at the start: a transfer's time must differ from "never".
        return 1_000_000 + int(trio.current_time() * 1000)

    async with _master(src, Epochs(E(1, 0)), clock_ms=clock, idle_poll_s=1000) as m:
        a = await RawSlave.connect(m, 1)
        learner = await RawSlave.connect(m, 2, async_learner=True)
        await learner.report(0)
        await a.report(0)  # behind: the transfer of everything starts
        await _until(lambda: m.slave_count == 2)
        sent_at = clock()
        await trio.sleep(2)
        assert m.slave_states()[1].last_caught_up_ms == 0
        await a.report(300)  # not at the max as of the transfer
        await trio.sleep(1)
        assert m.slave_states()[1].last_caught_up_ms == 0
        await a.report(src.max_phy_offset)  # at the current max: now
        await _until(lambda: m.slave_states()[1].ack == src.max_phy_offset)
        caught = m.slave_states()[1].last_caught_up_ms
        assert caught >= sent_at + 3000
        # More bytes, sent at once; an ack of them, after the master grew again, dates from
        # that transfer.
        await trio.sleep(1)
        mid = src.put_many(200)
        transfer_at = clock()
        m.notify_append()
        await trio.sleep(1)
        src.put_many(100)  # not notified: not sent before the next heartbeat
        await a.report(mid)
        await _until(lambda: m.slave_states()[1].ack == mid)
        assert m.slave_states()[1].ack < src.max_phy_offset
        assert transfer_at <= m.slave_states()[1].last_caught_up_ms < transfer_at + 100
        await learner.report(src.max_phy_offset)  # even at the max
        await trio.sleep(0.5)
        assert m.slave_states()[2].last_caught_up_ms == 0  # learners never catch up
        assert m.slave_states()[2].async_learner
        await a.aclose()
        await learner.aclose()


# -- connections: replacement, hostile peers ---------------------------------------------


async def test_a_second_connection_of_a_slave_id_replaces_the_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeLog()
    src.put_many(500)
    lost: list[int] = []
    async with _master(src, Epochs(E(1, 0)), all_ack=True, on_disconnect=lost.append) as m:
        m.set_sync_state_set(0, frozenset({0, 1}))
        first = await RawSlave.connect(m, 1)
        await first.report(src.max_phy_offset)
        await _until(lambda: m.slave_count == 1)
        assert m.confirm_offset == src.max_phy_offset
        second = await RawSlave.connect(m, 1)
        assert await _closed_within(first.stream, 1) < 0.5
        await first.aclose()
        await _until(lambda: len(m._conns) == 1)
        assert lost == []  # the slave did not go away
        state = m.slave_states()[1]
        assert not state.connected  # until the new connection reports
        assert state.addr == f"127.0.0.1:{second.stream.socket.getsockname()[1]}"
        assert not m.slave_ok(src.max_phy_offset)
        await second.report(100)
        await _until(lambda: m.slave_states()[1].connected)
        assert m.slave_ok(src.max_phy_offset)
        assert m.slave_states()[1].ack == 100
        (info,) = m.runtime_info().ha_connection_info
        assert (info.slave_ack_offset, info.in_sync) == (100, True)
        await second.aclose()
        await _until(lambda: lost == [1])
        # A member's record outlives its connection; a non-member's does not.
        assert m.slave_states()[1].connected is False
        other = await RawSlave.connect(m, 5)
        await other.report(0)
        await _until(lambda: 5 in m.slave_states())
        await other.aclose()
        await _until(lambda: lost == [1, 5])
        assert set(m.slave_states()) == {1}
        m.set_sync_state_set(0, frozenset({0}))
        assert m.slave_states() == {}


async def test_hostile_clients_are_closed_without_affecting_a_slave(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    src, dst = FakeLog(), FakeLog()
    src.put_many(800)
    async with (
        _master(src, Epochs(E(1, 0)), need_acks=1) as m,
        _slave(dst, _epoch_file(tmp_path), 1, _addr(m)),
    ):
        m.set_sync_state_set(0, frozenset({0, 1, 9}))
        await _until(lambda: m.slave_count == 1 and _same(dst, src))
        confirmed = m.confirm_offset
        hello = encode_slave_handshake(9)
        cases = {
            "report first": encode_slave_report(0),
            "bad flag": struct.pack(">ihhq", 1, 0, 7, 9),
            "negative id": struct.pack(">ihhq", 1, 0, 0, -9),
            "master's id": encode_slave_handshake(0),
            "twice": hello + hello,
            "negative report": hello + struct.pack(">iq", 2, -1),
            "report past max": hello + encode_slave_report(src.max_phy_offset + 1),
            "suspend": hello + struct.pack(">iq", 3, 0),
            "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        }
        for name, payload in cases.items():
            async with await trio.open_tcp_stream("127.0.0.1", m.port) as bad:
                await bad.send_all(payload)
                assert await _closed_within(bad, 2) < 1, name
        # A good report first, then one past the max.
        raw = await RawSlave.connect(m, 9)
        await raw.report(10)
        await trio.sleep(0.5)
        await raw.report(src.max_phy_offset + 1)
        assert await _closed_within(raw.stream, 2) < 1
        await raw.aclose()
        # Silent, or a handshake and nothing more: closed at the housekeeping timeout.
        async with (
            await trio.open_tcp_stream("127.0.0.1", m.port) as silent,
            await trio.open_tcp_stream("127.0.0.1", m.port) as mute,
        ):
            await mute.send_all(encode_slave_handshake(9))
            with trio.move_on_after(19):
                await silent.receive_some(1)
                raise AssertionError("closed too early")
            assert await _closed_within(silent, 2) <= 1.01
            assert await _closed_within(mute, 2) <= 1.01
        assert m.confirm_offset == confirmed
        assert m.slave_count == 1
        assert set(m.slave_states()) == {1, 9}
        assert not m.slave_states()[9].connected
        src.put_many(700)
        m.notify_append()
        await _until(lambda: _same(dst, src))
        await _until(lambda: m.confirm_offset == src.max_phy_offset)


async def test_connections_beyond_the_cap_are_closed_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeLog()
    src.put_many(100)
    async with _master(src, Epochs(E(1, 0)), max_connections=2) as m:
        held = [await trio.open_tcp_stream("127.0.0.1", m.port) for _ in range(2)]
        await trio.sleep(0.5)
        async with await trio.open_tcp_stream("127.0.0.1", m.port) as extra:
            assert await _closed_within(extra, 2) < 0.5
        for h in held:
            await h.aclose()


async def test_master_without_an_epoch_for_the_start_sends_heartbeats_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    src = FakeLog()
    src.put_many(900)
    async with _master(src, Epochs(E(4, 500))) as m:
        raw = await RawSlave.connect(m, 1)
        assert raw.handshake == MasterHandshake(src.max_phy_offset, 4, (E(4, 500),))
        await raw.report(0)  # from the min offset, 0: before the first epoch
        reader = MasterStreamReader()
        reader.feed(encode_master_handshake(0, []))
        frames: list[MasterHandshake | TransferFrame] = []
        with trio.move_on_after(12):
            while True:
                frames += reader.feed(await raw.stream.receive_some(65536))
                await raw.report(0)
        assert frames
        assert all(f == TransferFrame(0, -1, 0, src.max_phy_offset, b"") for f in frames)
        await raw.aclose()

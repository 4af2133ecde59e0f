"""RocketMQ 5.x controller-mode replication of the commitlog ("AutoSwitch" HA).

In controller mode the controller names the master, its epoch and the SyncStateSet; the HA
wire carries the slave's broker id and the master's epoch entries (`store.epoch_file`), so a
replica that comes back after a failover can cut what it wrote that the group never had.

Wire format (big-endian; a connection state is an int32 ordinal: READY 0, HANDSHAKE 1,
TRANSFER 2, SUSPEND 3, SHUTDOWN 4):

- slave -> master, first and once: the *slave handshake*, 16 bytes: int32 state=1, int16
  isSyncFromLastFile, int16 isAsyncLearner (each 0 or 1), int64 slaveBrokerId.
- master -> slave, in answer: the *master handshake*, a 20-byte header (int32 state=1, int32
  bodySize = 12·n, int64 masterMaxPhyOffset, int32 lastEpoch, -1 for none) and n entries
  (int32 epoch, int64 startOffset), the master's epoch entries, oldest first.
- slave -> master, after that: *reports*, 12 bytes: int32 state=2, int64 maxPhyOffset. The
  first one is where the transfer starts (0: the master's commitlog min offset, or the start
  of its last file when the slave asked isSyncFromLastFile); each is an acknowledgement.
- master -> slave, after the first report: *transfer frames*, a 36-byte header (int32
  state=2, int32 bodySize, int64 offset of the first body byte, int32 epoch, int64 the
  epoch's start offset, int64 confirmOffset) and bodySize commitlog bytes; bodySize 0 is a
  heartbeat. A frame never crosses a commitlog file nor an epoch boundary, so every body byte
  was written in the epoch its header names.

The codec (`encode_*`, `SlaveStreamReader`, `MasterStreamReader`) does no I/O;
`AutoSwitchHAMaster` and `AutoSwitchHASlave` run it over trio TCP streams.

Slave (`AutoSwitchHASlave`): sends its handshake, reads the master's, and makes its log a
prefix of the master's. With no local epoch entry nothing is cut. Otherwise
`store.epoch_file.consistent_point` gives the last offset both logs agree on (None: the
connection fails and is retried after `truncate_retry_s`); the commitlog is cut there when it
is longer (`truncate_commitlog`), entries starting at or after it are dropped and the epoch
file saved, then the slave reports and follows. The commitlog is cut first: a stop between the
two leaves entries that start at or past the log's end, which the next handshake drops again;
the other order would attribute the diverged tail to an older epoch. On each frame the offset
must be the local max (an empty store takes a file-aligned start); a frame of an epoch newer
than the last local entry adds (epoch, start) to the epoch file, saved before the body is
appended; a body in an older epoch, or a newer one not starting at the local max, closes the
connection (the next handshake reconciles). `confirm_offset` is min(the frame's, the local
max). Mismatches, bad headers and store refusals close the connection; it reconnects after a
bounded backoff (`broker.ha.HAClientBase`).

Master (`AutoSwitchHAMaster`), per connection: nothing is sent before the slave's handshake;
a handshake claiming the id of a connected slave closes that slave's older connection. Each
frame is the rest of one commitlog file, at most `transfer_batch_size` bytes, cut at the next
epoch's start, in the epoch that covers its offset (the master's entries are read from the
`epochs` callable at each frame: an epoch started while slaves follow is seen at once). Bytes
before the first epoch entry are not sent (no epoch can be named for them; logged once),
as in RocketMQ. A slave's `last_caught_up_ms` is set, on a report, to the time of the last
transfer when the report reaches the master's max offset as of that transfer (the report's
time when it reaches the current max), as RocketMQ's lastCatchUpTimeMs; async learners never
catch up (they never join the SyncStateSet).

Acknowledgement rule (what SYNC sends wait on; `when_replicated`, `wait_replicated`,
`slave_ok`, `acked_offset`, the `broker.commit.Replication` interface), computed from the
SyncStateSet the broker gives with `set_sync_state_set(master_id, members)` (members include
the master). A set member counts as connected from its first valid report on the current
connection; a member not connected has acknowledged nothing.

- `all_ack` (RocketMQ's allAckInSyncStateSet=true): an offset is replicated once every member
  other than the master acknowledged it; a set of the master alone needs no wait.
- otherwise, with `need_acks` = inSyncReplicas - 1: once `need_acks` connected members
  acknowledged it; 0 needs no wait. Slaves outside the set never count.
- `confirm_offset` is min(the master's max offset, the offset replicated by that rule), never
  decreasing (what was replicated stays replicated); it is sent in every frame. Waiters up to
  it are answered at once, together, whenever a report arrives or the set changes.
- `slave_ok(next_offset)` is False when fewer members than the rule needs are connected, or
  `next_offset` is `max_gap_not_in_sync` bytes or more past the confirm offset (a SYNC_MASTER
  then answers SLAVE_NOT_AVAILABLE); `in_sync_set_size()` is the number of members (the broker
  refuses sends below minInSyncReplicas).

Hostile peers: the HA port has no authentication, so the master closes a connection whose
first message is not a handshake, whose handshake has a flag other than 0/1, a negative id or
the master's own id, that handshakes twice, whose report is negative or beyond its max offset,
that is silent for `housekeeping_interval_s`, or that does not take a frame within that time.
A reader keeps under one message plus one read: 16 bytes on the master's side; a frame of at
most `max_frame_body` bytes, or a handshake of at most `MAX_EPOCH_ENTRIES` entries, on the
slave's.
"""

from __future__ import annotations

import bisect
import enum
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import structlog
import trio

from broker.ha import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_HOUSEKEEPING_INTERVAL_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_GAP_NOT_IN_SYNC,
    DEFAULT_TRANSFER_BATCH_SIZE,
    IO_ERRORS,
    MAX_FRAME_BODY,
    End,
    HAClientBase,
    HAMasterStore,
    HAProtocolError,
    HAServerTls,
    HASlaveStore,
    HAStream,
    Reads,
    ReplicationWaiters,
    Stalled,
    peer_addr,
    receive_within,
    send_within,
    tls_mode,
)
from remoting.protocol.bodies import HAConnectionRuntimeInfo, HARuntimeInfo
from remoting.tls import TlsClientSettings, TlsServerSettings
from store.epoch_file import EpochEntry, EpochFile, consistent_point

__all__ = [
    "EPOCH_ENTRY_SIZE",
    "MASTER_HANDSHAKE_HEADER_SIZE",
    "MAX_EPOCH_ENTRIES",
    "MAX_SENT_EPOCH_ENTRIES",
    "SLAVE_HANDSHAKE_SIZE",
    "SLAVE_REPORT_SIZE",
    "TRANSFER_HEADER_SIZE",
    "AutoSwitchHAMaster",
    "AutoSwitchHASlave",
    "AutoSwitchMasterStore",
    "AutoSwitchSlaveStore",
    "HAConnectionState",
    "MasterHandshake",
    "MasterStreamReader",
    "SlaveHandshake",
    "SlaveReport",
    "SlaveState",
    "SlaveStreamReader",
    "TransferFrame",
    "encode_master_handshake",
    "encode_slave_handshake",
    "encode_slave_report",
    "encode_transfer_header",
]

log = structlog.get_logger()


class HAConnectionState(enum.IntEnum):
    """RocketMQ's HAConnectionState; its ordinal opens every message."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


_STATE = struct.Struct(">i")
_SLAVE_HANDSHAKE = struct.Struct(">ihhq")
_SLAVE_REPORT = struct.Struct(">iq")
_MASTER_HANDSHAKE = struct.Struct(">iiqi")
_EPOCH_ENTRY = struct.Struct(">iq")
_TRANSFER_HEADER = struct.Struct(">iiqiqq")

SLAVE_HANDSHAKE_SIZE = _SLAVE_HANDSHAKE.size  # 16
SLAVE_REPORT_SIZE = _SLAVE_REPORT.size  # 12
MASTER_HANDSHAKE_HEADER_SIZE = _MASTER_HANDSHAKE.size  # 20
EPOCH_ENTRY_SIZE = _EPOCH_ENTRY.size  # 12
TRANSFER_HEADER_SIZE = _TRANSFER_HEADER.size  # 36

# A master sends at most its last this many entries (RocketMQ's handshake buffer holds 1000);
# a slave takes handshakes of up to MAX_EPOCH_ENTRIES (a bound on what it buffers).
MAX_SENT_EPOCH_ENTRIES = 1000
MAX_EPOCH_ENTRIES = 8192

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# The rule's offset when it needs no acknowledgement.
_NO_WAIT = _INT64_MAX

_SLAVE_READ_CHUNK = 4096
_FRAME_READ_CHUNK = 65536
_HANDSHAKE = HAConnectionState.HANDSHAKE
_TRANSFER = HAConnectionState.TRANSFER


# -- codec (sans-IO) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlaveHandshake:
    slave_id: int
    sync_from_last_file: bool = False
    async_learner: bool = False


@dataclass(frozen=True, slots=True)
class SlaveReport:
    offset: int


@dataclass(frozen=True, slots=True)
class MasterHandshake:
    max_offset: int
    last_epoch: int
    entries: tuple[EpochEntry, ...]


@dataclass(frozen=True, slots=True)
class TransferFrame:
    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    body: bytes


def _check(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} out of range: {value}")


def encode_slave_handshake(
    slave_id: int, *, sync_from_last_file: bool = False, async_learner: bool = False
) -> bytes:
    _check("slave id", slave_id, 0, _INT64_MAX)
    return _SLAVE_HANDSHAKE.pack(_HANDSHAKE, int(sync_from_last_file), int(async_learner), slave_id)


def encode_slave_report(offset: int) -> bytes:
    _check("report offset", offset, 0, _INT64_MAX)
    return _SLAVE_REPORT.pack(_TRANSFER, offset)


def encode_master_handshake(max_offset: int, entries: Sequence[EpochEntry]) -> bytes:
    """The master's handshake: its max offset and `entries` (lastEpoch: the last one's)."""
    _check("max offset", max_offset, 0, _INT64_MAX)
    _check("entry count", len(entries), 0, _INT32_MAX // EPOCH_ENTRY_SIZE)
    last_epoch = entries[-1].epoch if entries else -1
    parts = [
        _MASTER_HANDSHAKE.pack(_HANDSHAKE, EPOCH_ENTRY_SIZE * len(entries), max_offset, last_epoch)
    ]
    for e in entries:
        _check("epoch", e.epoch, 0, _INT32_MAX)
        _check("epoch start", e.start_offset, 0, _INT64_MAX)
        parts.append(_EPOCH_ENTRY.pack(e.epoch, e.start_offset))
    return b"".join(parts)


def encode_transfer_header(
    offset: int, size: int, epoch: int, epoch_start: int, confirm_offset: int
) -> bytes:
    _check("frame offset", offset, 0, _INT64_MAX)
    _check("frame size", size, 0, _INT32_MAX)
    _check("epoch", epoch, -1, _INT32_MAX)
    _check("epoch start", epoch_start, 0, _INT64_MAX)
    _check("confirm offset", confirm_offset, _INT64_MIN, _INT64_MAX)
    return _TRANSFER_HEADER.pack(_TRANSFER, size, offset, epoch, epoch_start, confirm_offset)


class _Reader:
    """A buffer that refuses everything once it failed (the connection is to be closed)."""

    __slots__ = ("_buf", "_failed")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._failed = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message held."""
        return len(self._buf)

    def _fail(self, message: str) -> HAProtocolError:
        self._failed = True
        self._buf.clear()
        return HAProtocolError(message)

    def _state(self, pos: int, expected: HAConnectionState) -> None:
        state: int = _STATE.unpack_from(self._buf, pos)[0]
        if state != expected:
            raise self._fail(f"state {state} where {expected.name} ({int(expected)}) was due")


class SlaveStreamReader(_Reader):
    """The master's reader of a slave's stream: one handshake, then reports; a message is
    refused as soon as its state is in. Keeps under 16 bytes."""

    __slots__ = ("_handshaken",)

    def __init__(self) -> None:
        super().__init__()
        self._handshaken = False

    def feed(self, data: bytes) -> list[SlaveHandshake | SlaveReport]:
        """The messages completed by `data`, in order.

        Raises:
            HAProtocolError: a state out of turn, a flag other than 0/1, a negative id.
        """
        if self._failed:
            raise HAProtocolError("slave stream already failed")
        buf = self._buf
        buf += data
        out: list[SlaveHandshake | SlaveReport] = []
        pos = 0
        end = len(buf)
        while end - pos >= _STATE.size:
            if not self._handshaken:
                self._state(pos, _HANDSHAKE)
                if end - pos < SLAVE_HANDSHAKE_SIZE:
                    break
                _, last_file, learner, slave_id = _SLAVE_HANDSHAKE.unpack_from(buf, pos)
                if last_file not in (0, 1) or learner not in (0, 1) or slave_id < 0:
                    raise self._fail(
                        f"bad handshake: flags {last_file}, {learner}, slave id {slave_id}"
                    )
                out.append(SlaveHandshake(slave_id, bool(last_file), bool(learner)))
                self._handshaken = True
                pos += SLAVE_HANDSHAKE_SIZE
            else:
                self._state(pos, _TRANSFER)
                if end - pos < SLAVE_REPORT_SIZE:
                    break
                out.append(SlaveReport(_SLAVE_REPORT.unpack_from(buf, pos)[1]))
                pos += SLAVE_REPORT_SIZE
        if pos:
            del buf[:pos]
        return out


class MasterStreamReader(_Reader):
    """The slave's reader of a master's stream: one handshake, then transfer frames, split
    anywhere. A header is checked as soon as it is in, so at most one message (a frame body
    of `max_body` bytes, `max_entries` epoch entries) plus one read is buffered."""

    __slots__ = ("_handshaken", "max_body", "max_entries")

    def __init__(
        self, max_body: int = MAX_FRAME_BODY, max_entries: int = MAX_EPOCH_ENTRIES
    ) -> None:
        super().__init__()
        self.max_body = max_body
        self.max_entries = max_entries
        self._handshaken = False

    def feed(self, data: bytes) -> list[MasterHandshake | TransferFrame]:
        """The messages completed by `data`, in order.

        Raises:
            HAProtocolError: a state out of turn; a handshake whose size is not a multiple
                of 12 or too large, whose max offset is negative, or whose entries are out
                of order or past that max; a frame with a negative offset or epoch start, a
                size outside [0, max_body], or a body without an epoch (< 0) or in an epoch
                starting after it.
        """
        if self._failed:
            raise HAProtocolError("master stream already failed")
        buf = self._buf
        buf += data
        out: list[MasterHandshake | TransferFrame] = []
        pos = 0
        end = len(buf)
        while end - pos >= _STATE.size:
            if not self._handshaken:
                self._state(pos, _HANDSHAKE)
                if end - pos < MASTER_HANDSHAKE_HEADER_SIZE:
                    break
                _, size, max_offset, last_epoch = _MASTER_HANDSHAKE.unpack_from(buf, pos)
                if (
                    size < 0
                    or size % EPOCH_ENTRY_SIZE
                    or size > self.max_entries * EPOCH_ENTRY_SIZE
                    or max_offset < 0
                ):
                    raise self._fail(f"bad handshake header: size {size}, max {max_offset}")
                start = pos + MASTER_HANDSHAKE_HEADER_SIZE
                if end - start < size:
                    break
                entries = tuple(
                    EpochEntry(*_EPOCH_ENTRY.unpack_from(buf, at))
                    for at in range(start, start + size, EPOCH_ENTRY_SIZE)
                )
                self._check_entries(entries, max_offset)
                out.append(MasterHandshake(max_offset, last_epoch, entries))
                self._handshaken = True
                pos = start + size
            else:
                self._state(pos, _TRANSFER)
                if end - pos < TRANSFER_HEADER_SIZE:
                    break
                _, size, offset, epoch, epoch_start, confirm = _TRANSFER_HEADER.unpack_from(
                    buf, pos
                )
                if (
                    offset < 0
                    or epoch_start < 0
                    or not 0 <= size <= self.max_body
                    or (size and (epoch < 0 or epoch_start > offset))
                ):
                    raise self._fail(
                        f"bad frame header: offset {offset}, size {size}, epoch {epoch}"
                        f" from {epoch_start}"
                    )
                start = pos + TRANSFER_HEADER_SIZE
                if end - start < size:
                    break
                body = bytes(buf[start : start + size])
                out.append(TransferFrame(offset, epoch, epoch_start, confirm, body))
                pos = start + size
        if pos:
            del buf[:pos]
        return out

    def _check_entries(self, entries: Sequence[EpochEntry], max_offset: int) -> None:
        prev: EpochEntry | None = None
        for e in entries:
            if (
                e.epoch < 0
                or not 0 <= e.start_offset <= max_offset
                or (
                    prev is not None
                    and (e.epoch <= prev.epoch or e.start_offset < prev.start_offset)
                )
            ):
                raise self._fail(f"bad epoch entries: {e} after {prev}, max {max_offset}")
            prev = e


# -- store interface ----------------------------------------------------------------------


class AutoSwitchMasterStore(HAMasterStore, Protocol):
    """What the master uses of the message store."""

    @property
    def min_phy_offset(self) -> int: ...


class AutoSwitchSlaveStore(HASlaveStore, Protocol):
    """What the slave uses of the message store."""

    async def truncate_commitlog(self, offset: int) -> int:
        """Drop the commitlog from `offset` (a record boundary) on, with what was dispatched
        from it; the number of bytes dropped. ValueError when `offset` is refused (nothing
        changed)."""
        ...


def _epoch_at(entries: Sequence[EpochEntry], offset: int) -> tuple[EpochEntry | None, int | None]:
    """The entry whose epoch wrote `offset` (the last starting at or before it; None: before
    the first entry) and the next entry's start after `offset` (None: no later entry)."""
    i = bisect.bisect_right(entries, offset, key=lambda e: e.start_offset)
    return (entries[i - 1] if i else None), (entries[i].start_offset if i < len(entries) else None)


async def _save_epochs(epochs: EpochFile) -> None:
    """Write the epoch file; it fsyncs, so in a worker thread."""
    await trio.to_thread.run_sync(epochs.save)


def _wall_ms() -> int:
    return int(time.time() * 1000)


# -- master -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlaveState:
    """What the master knows of a slave (connected, or a SyncStateSet member).

    Attributes:
        ack: its last report, -1 before any.
        last_caught_up_ms: when it last caught up with the master (see the module
            docstring), 0 = never.
        connected: it reported on an open connection.
    """

    slave_id: int
    addr: str
    ack: int
    last_caught_up_ms: int
    connected: bool
    async_learner: bool = False


class _Conn:
    """The master's side of one connection. `slave_id` and `ack` are -1 until the
    handshake and the first valid report."""

    __slots__ = (
        "ack",
        "addr",
        "async_learner",
        "end",
        "handshaken",
        "last_master_max",
        "last_transfer_ms",
        "next_offset",
        "reported",
        "slave_id",
        "sync_from_last_file",
    )

    def __init__(self, addr: str, end: End) -> None:
        self.addr = addr
        self.end = end
        self.slave_id = -1
        self.sync_from_last_file = False
        self.async_learner = False
        self.ack = -1
        self.next_offset = -1
        self.handshaken = trio.Event()
        self.reported = trio.Event()
        # The master's max offset and the time (ms) at the last transfer with a body.
        self.last_master_max = -1
        self.last_transfer_ms = 0


class _Slave:
    """One slave id: its current connection, and what outlives it while the id is a member."""

    __slots__ = ("ack", "addr", "async_learner", "conn", "last_caught_up_ms")

    def __init__(self, conn: _Conn) -> None:
        self.conn: _Conn | None = conn
        self.addr = conn.addr
        self.async_learner = conn.async_learner
        self.ack = -1
        self.last_caught_up_ms = 0


class AutoSwitchHAMaster:
    """Serves controller-mode slaves on the HA port and answers replication waits by the
    SyncStateSet (see the module docstring).

    Args:
        store: The commitlog to replicate.
        epochs: The master's epoch entries, oldest first (the broker's `EpochFile.entries`).
        all_ack: Every SyncStateSet member must acknowledge (allAckInSyncStateSet).
        need_acks: Otherwise, how many members must (inSyncReplicas - 1).
        transfer_batch_size: Largest frame body sent.
        heartbeat_interval_s: A heartbeat frame goes out after this long without a send.
        housekeeping_interval_s: A connection is closed after this long without a read, or
            when a send does not complete within it.
        max_gap_not_in_sync: `slave_ok` is False from this many unconfirmed bytes on.
        idle_poll_s: With nothing to send, look again after this long even without a
            `notify_append`.
        max_connections: Connections served at once; more are closed on accept.
        on_disconnect: Called with a slave's id when its connection ends (not when a new
            connection of the same id replaced it).
        clock_ms: The wall clock in ms, for `last_caught_up_ms`.

    All methods are for the trio thread; `when_replicated` timeouts need `run` running.
    """

    def __init__(
        self,
        store: AutoSwitchMasterStore,
        epochs: Callable[[], Sequence[EpochEntry]],
        *,
        all_ack: bool = False,
        need_acks: int = 0,
        transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        housekeeping_interval_s: float = DEFAULT_HOUSEKEEPING_INTERVAL_S,
        max_gap_not_in_sync: int = DEFAULT_MAX_GAP_NOT_IN_SYNC,
        idle_poll_s: float = 0.1,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        on_disconnect: Callable[[int], None] | None = None,
        clock_ms: Callable[[], int] = _wall_ms,
        tls: TlsServerSettings | None = None,
    ) -> None:
        if not 0 < transfer_batch_size <= MAX_FRAME_BODY:
            raise ValueError(f"transfer_batch_size must be in 1..{MAX_FRAME_BODY}")
        if need_acks < 0:
            raise ValueError(f"need_acks must not be negative: {need_acks}")
        self.tls = HAServerTls(tls) if tls is not None and tls.enabled else None
        self.store = store
        self.epochs = epochs
        self.all_ack = all_ack
        self.need_acks = need_acks
        self.transfer_batch_size = transfer_batch_size
        self.heartbeat_interval_s = heartbeat_interval_s
        self.housekeeping_interval_s = housekeeping_interval_s
        self.max_gap_not_in_sync = max_gap_not_in_sync
        self.idle_poll_s = idle_poll_s
        self.max_connections = max_connections
        self.on_disconnect = on_disconnect
        self.clock_ms = clock_ms
        self.port = 0
        self._master_id = -1
        self._members: frozenset[int] = frozenset()
        self._conns: set[_Conn] = set()
        # Slave id -> its record: connected ids, and members whose connection ended.
        self._slaves: dict[int, _Slave] = {}
        # Set (and dropped) by notify_append; created only while a writer waits.
        self._wake: trio.Event | None = None
        # Reached: the confirm offset the waiters were last answered up to.
        self._waiters = ReplicationWaiters()

    # -- SyncStateSet and the acknowledgement rule -------------------------------------
    def set_sync_state_set(self, master_id: int, members: frozenset[int]) -> None:
        """The SyncStateSet the controller confirmed (`members` includes `master_id`); answers
        the waiters it replicates."""
        self._master_id = master_id
        self._members = frozenset(members)
        for sid in [s for s, r in self._slaves.items() if r.conn is None and s not in members]:
            del self._slaves[sid]
        log.info("ha_sync_state_set", master=master_id, members=sorted(members))
        self._update()

    @property
    def sync_state_set(self) -> frozenset[int]:
        return self._members

    def in_sync_set_size(self) -> int:
        """Members of the SyncStateSet, the master included (0 before it is known)."""
        return len(self._members)

    def _set_slaves(self) -> frozenset[int]:
        return self._members - {self._master_id}

    def _ack_of(self, slave_id: int) -> int:
        record = self._slaves.get(slave_id)
        conn = record.conn if record is not None else None
        return conn.ack if conn is not None else -1

    def _needed(self) -> int:
        """Connected members the rule needs."""
        return len(self._set_slaves()) if self.all_ack else self.need_acks

    def _replicated(self) -> int:
        """The offset the rule replicates now: _NO_WAIT when it needs no slave, -1 when it
        has nothing."""
        needed = self._needed()
        if needed == 0:
            return _NO_WAIT
        acks = sorted((self._ack_of(s) for s in self._set_slaves()), reverse=True)
        return acks[needed - 1] if len(acks) >= needed else -1

    @property
    def confirm_offset(self) -> int:
        """min(max offset, the offset replicated by the rule); never decreases."""
        now = min(self.store.max_phy_offset, self._replicated())
        return max(self._waiters.reached, now)

    @property
    def acked_offset(self) -> int:
        """What SYNC sends wait on: `confirm_offset`."""
        return self.confirm_offset

    def _update(self) -> None:
        self._waiters.reach(self.confirm_offset)

    def connected_members(self) -> int:
        """SyncStateSet members (other than the master) connected and reporting."""
        return sum(1 for s in self._set_slaves() if self._ack_of(s) >= 0)

    def slave_ok(self, next_offset: int) -> bool:
        """As many members as the rule needs are connected and `next_offset` is less than
        `max_gap_not_in_sync` bytes past the confirm offset (else SYNC_MASTER answers
        SLAVE_NOT_AVAILABLE)."""
        return (
            self.connected_members() >= self._needed()
            and next_offset - self.confirm_offset < self.max_gap_not_in_sync
        )

    # -- state ------------------------------------------------------------------------
    @property
    def slave_count(self) -> int:
        """Connections that sent a valid report and are still open."""
        return sum(1 for c in self._conns if c.ack >= 0)

    def slave_states(self) -> dict[int, SlaveState]:
        """Slave id -> what is known of it: connected slaves, and members whose connection
        ended."""
        return {
            sid: SlaveState(
                slave_id=sid,
                addr=r.addr,
                ack=r.ack,
                last_caught_up_ms=r.last_caught_up_ms,
                connected=r.conn is not None and r.conn.ack >= 0,
                async_learner=r.async_learner,
            )
            for sid, r in self._slaves.items()
        }

    def runtime_info(self) -> HARuntimeInfo:
        """RocketMQ's HA status of a master (GET_BROKER_HA_STATUS): one row per reporting
        connection (by address: the body has no field for the id), in sync = a member."""
        max_offset = self.store.max_phy_offset
        conns = [
            HAConnectionRuntimeInfo(
                addr=c.addr,
                slave_ack_offset=c.ack,
                diff=max_offset - c.ack,
                in_sync=c.slave_id in self._members,
                transfer_from_where=c.next_offset,
            )
            for c in self._conns
            if c.ack >= 0
        ]
        return HARuntimeInfo(
            master=True,
            master_commit_log_max_offset=max_offset,
            in_sync_slave_nums=len(self._set_slaves()),
            ha_connection_info=conns,
        )

    def notify_append(self) -> None:
        """New commitlog bytes: wake the writers waiting for data."""
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    # -- replication waits ------------------------------------------------------------
    def when_replicated(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> None:
        """Call `callback(True)` once `offset` (the commitlog offset after the record) is
        replicated by the rule, or `callback(False)` after `timeout_s`. Never calls back
        from within this call."""
        self._waiters.add(offset, callback, timeout_s, ready=offset <= self.confirm_offset)

    async def wait_replicated(self, offset: int, timeout_s: float) -> bool:
        """Whether `offset` is replicated by the rule within `timeout_s`."""
        return await self._waiters.wait(offset, timeout_s, lambda: offset <= self.confirm_offset)

    # -- serving ----------------------------------------------------------------------
    async def run(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on host:port (0 = any free port) and serve slaves until cancelled;
        `task_status.started(bound_port)` once listening.

        Raises:
            TlsConfigError: TLS is on and its files do not load.
        """
        if self.tls is not None:
            await self.tls.load()
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = int(listeners[0].socket.getsockname()[1])
        log.info(
            "ha_master_listening",
            host=host,
            port=self.port,
            mode="autoswitch",
            tls=tls_mode(self.tls),
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._waiters.run_timer)
                await nursery.start(
                    partial(trio.serve_listeners, self._serve, listeners, handler_nursery=nursery)
                )
                task_status.started(self.port)
        finally:
            # Nothing will be acknowledged any more.
            self._waiters.fail_all()

    async def _serve(self, tcp: trio.SocketStream) -> None:
        addr = peer_addr(tcp)
        if len(self._conns) >= self.max_connections:
            # A flood of connections must not cost tasks and buffers.
            log.warning("ha_connection_refused", addr=addr, open=len(self._conns))
            await tcp.aclose()
            return
        stream: HAStream | None = tcp
        if self.tls is not None:
            stream = await self.tls.accept(tcp, addr)
            if stream is None:
                return
        assert stream is not None
        reason = "shutdown"
        conn: _Conn | None = None
        try:
            async with stream, trio.open_nursery() as nursery:
                conn = _Conn(addr, End(nursery.cancel_scope))
                self._conns.add(conn)
                log.info("ha_slave_connected", addr=conn.addr)
                nursery.start_soon(self._read_slave, stream, conn)
                nursery.start_soon(self._transfer, stream, conn)
            reason = conn.end.reason or "closed"
        finally:
            if conn is not None:
                self._conns.discard(conn)
                self._detach(conn)
                log.info(
                    "ha_slave_lost",
                    addr=conn.addr,
                    slave_id=conn.slave_id,
                    reason=reason,
                    ack=conn.ack,
                    next=conn.next_offset,
                )

    def _attach(self, conn: _Conn, hs: SlaveHandshake) -> str | None:
        """Take the handshake; why the connection must close, or None."""
        if hs.slave_id == self._master_id:
            return "the master's own id"
        conn.slave_id = hs.slave_id
        conn.sync_from_last_file = hs.sync_from_last_file
        conn.async_learner = hs.async_learner
        record = self._slaves.get(hs.slave_id)
        if record is None:
            self._slaves[hs.slave_id] = _Slave(conn)
        else:
            old = record.conn
            if old is not None:
                # One connection per slave id: the newer one is the slave's current session.
                log.warning("ha_slave_replaced", slave_id=hs.slave_id, old=old.addr, new=conn.addr)
                old.end("replaced by a new connection")
            record.conn = conn
            record.addr = conn.addr
            record.async_learner = conn.async_learner
        conn.handshaken.set()
        log.info(
            "ha_slave_handshake",
            addr=conn.addr,
            slave_id=hs.slave_id,
            sync_from_last_file=hs.sync_from_last_file,
            async_learner=hs.async_learner,
        )
        return None

    def _detach(self, conn: _Conn) -> None:
        record = self._slaves.get(conn.slave_id)
        if record is None or record.conn is not conn:
            return  # never handshaken, or replaced
        record.conn = None
        if conn.slave_id not in self._members:
            del self._slaves[conn.slave_id]
        if self.on_disconnect is not None:
            try:
                self.on_disconnect(conn.slave_id)
            except Exception:
                log.exception("ha_on_disconnect_failed", slave_id=conn.slave_id)

    def _report(self, conn: _Conn, offset: int) -> bool:
        """Take a report; False when it is out of range (the connection must close)."""
        # Unauthenticated port: never let a report acknowledge bytes we do not have.
        max_offset = self.store.max_phy_offset
        if offset < 0 or offset > max_offset:
            log.warning("ha_bad_report", addr=conn.addr, report=offset, max=max_offset)
            return False
        record = self._slaves.get(conn.slave_id)
        if record is None or record.conn is not conn:
            return True  # replaced: closing
        if conn.ack < 0:
            conn.next_offset = offset
            conn.reported.set()
            log.info("ha_slave_start", addr=conn.addr, slave_id=conn.slave_id, report=offset)
        conn.ack = record.ack = offset
        if not conn.async_learner and offset >= conn.last_master_max:
            # RocketMQ's lastCatchUpTimeMs: the last transfer, or now at the current max.
            at = self.clock_ms() if offset == max_offset else conn.last_transfer_ms
            record.last_caught_up_ms = max(record.last_caught_up_ms, at)
        self._update()
        return True

    async def _read_slave(self, stream: HAStream, conn: _Conn) -> None:
        end = conn.end
        reader = SlaveStreamReader()
        while True:
            data = await receive_within(
                stream, _SLAVE_READ_CHUNK, self.housekeeping_interval_s, end
            )
            if data is None:
                return
            try:
                messages = reader.feed(data)
            except HAProtocolError as exc:
                log.warning("ha_bad_slave_message", addr=conn.addr, error=str(exc))
                end("bad message")
                return
            for msg in messages:
                if isinstance(msg, SlaveHandshake):
                    why = self._attach(conn, msg)
                    if why is not None:
                        log.warning("ha_handshake_refused", addr=conn.addr, reason=why)
                        end(f"handshake refused: {why}")
                        return
                elif not self._report(conn, msg.offset):
                    end("report out of range")
                    return

    async def _transfer(self, stream: HAStream, conn: _Conn) -> None:
        end = conn.end
        store = self.store
        timeout = self.housekeeping_interval_s
        try:
            await conn.handshaken.wait()
            entries = list(self.epochs())[-MAX_SENT_EPOCH_ENTRIES:]
            await send_within(
                stream, encode_master_handshake(store.max_phy_offset, entries), timeout
            )
            await conn.reported.wait()
            nxt = conn.next_offset
            if nxt == 0:
                # An empty slave: the master's first byte, or its last file's.
                if conn.sync_from_last_file:
                    max_offset = store.max_phy_offset
                    nxt = max_offset - max_offset % store.config.mapped_file_size_commitlog
                else:
                    nxt = store.min_phy_offset
            conn.next_offset = nxt
            last_send = trio.current_time()
            warned = False
            while True:
                entry, boundary = _epoch_at(self.epochs(), nxt)
                data: bytes | None = None
                if entry is None:
                    if not warned:
                        log.warning("ha_no_epoch_for_offset", addr=conn.addr, offset=nxt)
                        warned = True
                else:
                    limit = self.transfer_batch_size
                    if boundary is not None:
                        limit = min(limit, boundary - nxt)
                    data = store.read_commitlog(nxt, limit)
                if data and entry is not None:
                    conn.last_master_max = store.max_phy_offset
                    conn.last_transfer_ms = self.clock_ms()
                    header = encode_transfer_header(
                        nxt, len(data), entry.epoch, entry.start_offset, self.confirm_offset
                    )
                    await send_within(stream, header + data, timeout)
                    nxt += len(data)
                    conn.next_offset = nxt
                    last_send = trio.current_time()
                    continue
                now = trio.current_time()
                # One absolute deadline for the test and the wait: a difference compared
                # with the interval can round below it while the wait rounds to nothing.
                heartbeat_due = last_send + self.heartbeat_interval_s
                if now >= heartbeat_due:
                    epoch, start = (entry.epoch, entry.start_offset) if entry else (-1, 0)
                    header = encode_transfer_header(nxt, 0, epoch, start, self.confirm_offset)
                    await send_within(stream, header, timeout)
                    last_send = trio.current_time()
                    continue
                # No checkpoint since the read: an append after it sets this event.
                if self._wake is None:
                    self._wake = trio.Event()
                wake = self._wake
                with trio.move_on_at(min(now + self.idle_poll_s, heartbeat_due)):
                    await wake.wait()
        except Stalled:
            end("send stalled")
        except IO_ERRORS as exc:
            end(f"write error: {exc!r}")


# -- slave --------------------------------------------------------------------------------


class _EpochMismatch(Exception):
    """A frame's epoch contradicts the local epoch file."""


def _epoch_problem(last: EpochEntry | None, frame: TransferFrame, local_max: int) -> str | None:
    """Why the frame's epoch does not fit after the last local entry, or None. A log with
    entries grows only at its max, so a newer epoch must start exactly there (an empty
    store, or no entries: at or before the frame)."""
    if last is None:
        if frame.epoch_start > frame.offset:
            return f"epoch {frame.epoch} starts at {frame.epoch_start}, after the frame"
        return None
    if frame.epoch < last.epoch:
        return f"epoch {frame.epoch} older than the local {last.epoch}"
    if frame.epoch == last.epoch:
        if frame.epoch_start != last.start_offset:
            return f"epoch {frame.epoch} starts at {frame.epoch_start}, locally at {last}"
        return None
    if local_max != 0 and frame.epoch_start != local_max:
        return f"new epoch {frame.epoch} starts at {frame.epoch_start}, not at {local_max}"
    if frame.epoch_start > frame.offset or frame.epoch_start < last.start_offset:
        return f"new epoch {frame.epoch} starts at {frame.epoch_start}"
    return None


class AutoSwitchHASlave(HAClientBase[AutoSwitchSlaveStore]):
    """Follows a controller-mode master's commitlog over its HA port.

    Args:
        store: The local commitlog.
        epoch_file: The local epoch file (loaded); changed and saved as frames and
            truncations require.
        broker_id: This broker's id, sent in the handshake.
        master_addr: The master's HA address "host:port", or None (idle until `set_master`).
        sync_from_last_file: An empty store starts at the master's last file, not its first.
        async_learner: Tell the master this replica never joins the SyncStateSet.
        truncate_retry_s: Least wait before the next attempt when the logs have no
            consistent point or the truncation failed.
        max_epoch_entries: Largest master handshake accepted, in entries.
        Other arguments: as `broker.ha.HAClientBase`.

    Attributes:
        confirm_offset: min(the last frame's confirm offset, the local max); 0 before any.
        last_consistent_point: the offset the last handshake reconciled to (None: none yet
            or no local epoch entry).
    """

    def __init__(
        self,
        store: AutoSwitchSlaveStore,
        epoch_file: EpochFile,
        broker_id: int,
        master_addr: str | None = None,
        *,
        sync_from_last_file: bool = False,
        async_learner: bool = False,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        housekeeping_interval_s: float = DEFAULT_HOUSEKEEPING_INTERVAL_S,
        connect_timeout_s: float = 5.0,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 5.0,
        max_frame_body: int = MAX_FRAME_BODY,
        truncate_retry_s: float = 2.0,
        max_epoch_entries: int = MAX_EPOCH_ENTRIES,
        tls: TlsClientSettings | None = None,
    ) -> None:
        super().__init__(
            store,
            master_addr,
            heartbeat_interval_s=heartbeat_interval_s,
            housekeeping_interval_s=housekeeping_interval_s,
            connect_timeout_s=connect_timeout_s,
            min_backoff_s=min_backoff_s,
            max_backoff_s=max_backoff_s,
            max_frame_body=max_frame_body,
            tls=tls,
        )
        _check("broker id", broker_id, 0, _INT64_MAX)
        self.epoch_file = epoch_file
        self.broker_id = broker_id
        self.sync_from_last_file = sync_from_last_file
        self.async_learner = async_learner
        self.truncate_retry_s = truncate_retry_s
        self.max_epoch_entries = max_epoch_entries
        self.confirm_offset = 0
        self.last_consistent_point: int | None = None

    def _encode_report(self, offset: int) -> bytes:
        return encode_slave_report(offset)

    async def _session(self, addr: str) -> bool:
        stream = await self._connect(addr)
        if stream is None:
            return False
        self._connected = True
        log.info("ha_master_connected", addr=addr, local_max=self.store.max_phy_offset)
        progress = [False]
        reason = "cancelled"
        try:
            async with stream, trio.open_nursery() as nursery:
                end = End(nursery.cancel_scope)
                nursery.start_soon(self._follow, stream, nursery, end, progress)
            reason = end.reason or "closed"
        finally:
            self._connected = False
            log.info(
                "ha_master_lost", addr=addr, reason=reason, local_max=self.store.max_phy_offset
            )
        return progress[0]

    async def _follow(
        self, stream: HAStream, nursery: trio.Nursery, end: End, progress: list[bool]
    ) -> None:
        """Handshake, reconcile the logs, then report and take frames."""
        hello = encode_slave_handshake(
            self.broker_id,
            sync_from_last_file=self.sync_from_last_file,
            async_learner=self.async_learner,
        )
        try:
            await send_within(stream, hello, self.housekeeping_interval_s)
        except Stalled:
            end("send stalled")
            return
        except IO_ERRORS as exc:
            end(f"write error: {exc!r}")
            return
        reader = MasterStreamReader(self.max_frame_body, self.max_epoch_entries)
        messages: list[MasterHandshake | TransferFrame] = []
        while not messages:
            data = await receive_within(
                stream, _FRAME_READ_CHUNK, self.housekeeping_interval_s, end
            )
            if data is None:
                return
            try:
                messages = reader.feed(data)
            except HAProtocolError as exc:
                log.warning("ha_bad_handshake", error=str(exc))
                end("bad handshake")
                return
        self.last_read_ms = _wall_ms()
        handshake = messages[0]
        if len(messages) > 1 or not isinstance(handshake, MasterHandshake):
            # Frames come only after the slave's first report.
            log.warning("ha_frame_before_report")
            end("frame before report")
            return
        if not await self._reconcile(handshake, end):
            return
        nursery.start_soon(self._report_loop, stream, end)
        await self._receive_loop(stream, reader, end, progress)

    async def _reconcile(self, hs: MasterHandshake, end: End) -> bool:
        """Cut the local log and epoch file back to the consistent point with the master's
        (RocketMQ's doTruncate); False when the connection must close."""
        epochs = self.epoch_file
        store = self.store
        local = list(epochs.entries)
        if not local:
            log.info("ha_no_local_epochs", local_max=store.max_phy_offset)
            return True
        local_max = store.max_phy_offset
        point = consistent_point(local, local_max, hs.entries, hs.max_offset)
        if point is None:
            log.warning(
                "ha_no_consistent_point",
                local=[(e.epoch, e.start_offset) for e in local],
                local_max=local_max,
                master=[(e.epoch, e.start_offset) for e in hs.entries],
                master_max=hs.max_offset,
            )
            self._retry_floor_s = self.truncate_retry_s
            end("no consistent point")
            return False
        try:
            # Shielded: a master change must not leave the log cut and the file not.
            with trio.CancelScope(shield=True):
                await self._cut_to(point, local_max)
        except (ValueError, OSError) as exc:
            log.warning("ha_truncate_failed", point=point, error=str(exc))
            self._retry_floor_s = self.truncate_retry_s
            end("truncation failed")
            return False
        self.last_consistent_point = point
        log.info("ha_consistent_point", point=point, local_max=store.max_phy_offset)
        return True

    async def _cut_to(self, point: int, local_max: int) -> None:
        """Cut the commitlog at `point` when longer, then the epoch entries from it.

        Raises:
            ValueError, OSError: the store refused or failed; the file is left as it was.
        """
        store = self.store
        epochs = self.epoch_file
        if local_max > point:
            log.warning("ha_truncating", local_max=local_max, point=point)
            await store.truncate_commitlog(point)
            if store.max_phy_offset > point:
                raise ValueError(f"truncated to {store.max_phy_offset}, not {point}")
        if any(e.start_offset >= point for e in epochs.entries):
            before = list(epochs.entries)
            epochs.truncate_from(point)
            try:
                # An emptied list is not written; the file's entries all start at or past
                # the log's end then, and the next handshake drops them again.
                await _save_epochs(epochs)
            except BaseException:
                epochs.entries = before
                raise

    async def _record_epoch(self, frame: TransferFrame, local_max: int) -> None:
        """Add the frame's epoch to the epoch file when it is newer than the last entry
        (saved before the body is appended). A heartbeat that does not fit is ignored.

        Raises:
            _EpochMismatch: a body frame whose epoch does not fit the file.
            OSError: the file could not be saved (the entry is not kept).
        """
        if frame.epoch < 0:
            return  # a heartbeat of a master without epochs (the reader refuses bodies)
        epochs = self.epoch_file
        last = epochs.last
        problem = _epoch_problem(last, frame, local_max)
        if problem is not None:
            if frame.body:
                raise _EpochMismatch(problem)
            return
        if last is not None and frame.epoch == last.epoch:
            return
        epochs.append(frame.epoch, frame.epoch_start)
        log.info("ha_epoch_recorded", epoch=frame.epoch, start=frame.epoch_start)
        try:
            await _save_epochs(epochs)
        except BaseException:
            epochs.entries.pop()
            raise

    async def _receive_loop(
        self,
        stream: HAStream,
        reader: MasterStreamReader,
        end: End,
        progress: list[bool],
    ) -> None:
        store = self.store
        reads = Reads(stream, _FRAME_READ_CHUNK)
        while True:
            data = await reads.or_end(end)
            if data is None:
                return
            # The report loop closes the session when this stays old (housekeeping).
            self._last_read_at = trio.current_time()
            try:
                frames = reader.feed(data)
            except HAProtocolError as exc:
                log.warning("ha_bad_frame", error=str(exc))
                end("bad frame")
                return
            if frames:
                self.last_read_ms = _wall_ms()
            before = store.max_phy_offset
            for frame in frames:
                assert isinstance(frame, TransferFrame)  # the reader took one handshake
                local = store.max_phy_offset
                if local != 0 and local != frame.offset:
                    log.warning("ha_offset_mismatch", local_max=local, frame_offset=frame.offset)
                    end("offset mismatch")
                    return
                try:
                    # Shielded: a half-done append (or an entry without its bytes' append)
                    # must not be left behind by a master change.
                    with trio.CancelScope(shield=True):
                        await self._record_epoch(frame, local)
                        if frame.body:
                            await store.append_replica(frame.offset, frame.body)
                except _EpochMismatch as exc:
                    log.warning("ha_epoch_mismatch", offset=frame.offset, error=str(exc))
                    end("epoch mismatch")
                    return
                except (ValueError, OSError) as exc:
                    log.warning(
                        "ha_append_failed",
                        offset=frame.offset,
                        size=len(frame.body),
                        error=str(exc),
                    )
                    end("append failed")
                    return
                progress[0] = True
                self.confirm_offset = max(0, min(frame.confirm_offset, store.max_phy_offset))
            if store.max_phy_offset != before:
                self._report_grown()

"""RocketMQ 4.x master/slave replication of the commitlog (the HA port).

Wire format (big-endian, no handshake):

- slave -> master, a *report*: int64, the slave's commitlog max offset (the next byte it
  needs). Sent at connect, after appends that grew the slave's max, and every heartbeat
  interval. The master acts only on the last complete 8-byte value of what it read, the
  stream being cut into 8-byte values from its start.
- master -> slave, a *frame*: int64 phyOffset of the first body byte, int32 bodySize, body
  (raw commitlog bytes). bodySize 0 is a heartbeat carrying the next transfer offset.

The codec (`encode_report`, `ReportReader`, `encode_frame_header`, `FrameReader`) does no I/O;
`HAMaster` and `HASlave` run it over trio TCP streams against a store that fits
`HAMasterStore` / `HASlaveStore`.

Master, per connection: nothing is sent before the first report. The first report is the
start point (0 = the start of the master's last commitlog file); each frame is the rest of
one commitlog file up to its write position, at most `transfer_batch_size` bytes, so frames
never cross files. `notify_append` writes the new frames straight to a plain TCP socket while
the connection's transfer task is idle; the task sends the rest (what did not fit, catch-up,
every frame of a TLS connection), polls every `idle_poll_s`, and after `heartbeat_interval_s`
without a send sends a heartbeat. Every report is an acknowledgement; `acked_offset` is the
highest offset any slave acknowledged (one slave suffices, as in RocketMQ), and it completes
the replication waiters (`when_replicated`) up to it at once.

Slave: reports its max at once on connect (RocketMQ slaves wait up to 5 s; masters accept
either), checks every frame's offset against its own max (an empty slave accepts any start)
and appends the bodies with `append_replica`, then reports the new max from the same task
(straight to a plain socket; through the report task when that is inside a send, or on TLS).
Any mismatch or protocol error closes the connection; it reconnects after a bounded backoff.

Plain TCP connections are read with one wait and one `recv` per wake-up (`Reads`), with no
timeout per read: each side's periodic task (the master's transfer, the slave's report loop)
closes a connection silent for `housekeeping_interval_s`. A round of replication then costs
each side one wake-up and one system call per direction.

Hostile peers: the HA port has no authentication, so the master closes a connection whose
report is negative or beyond its max offset (also the first one, which RocketMQ takes
unchecked), one silent for `housekeeping_interval_s`, and one that does not take a frame
within that time; a connection counts as a slave only from its first valid report. Every
buffer is bounded: a report reader keeps under 8 bytes, a frame reader one frame of at most
`max_frame_body` bytes plus one read.
"""

from __future__ import annotations

import heapq
import itertools
import os
import ssl
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Generic, Protocol, TypeVar

import structlog
import trio

from broker.config import parse_host_port
from common.deadlines import DeadlineHeap
from remoting.protocol.bodies import HAClientRuntimeInfo, HAConnectionRuntimeInfo, HARuntimeInfo
from remoting.tls import (
    TlsClientSettings,
    TlsConfigError,
    TlsServerSettings,
    accept_tls,
    connect_tls,
    describe_handshake_error,
    tls_files_signature,
)

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_HOUSEKEEPING_INTERVAL_S",
    "DEFAULT_MAX_GAP_NOT_IN_SYNC",
    "DEFAULT_TRANSFER_BATCH_SIZE",
    "FRAME_HEADER_SIZE",
    "IO_ERRORS",
    "MAX_FRAME_BODY",
    "REPORT_SIZE",
    "End",
    "FrameReader",
    "HAClientBase",
    "HAMaster",
    "HAMasterStore",
    "HAProtocolError",
    "HAServerTls",
    "HASlave",
    "HASlaveStore",
    "HAStream",
    "Outbox",
    "Reads",
    "ReplicationWaiters",
    "ReportReader",
    "Stalled",
    "Waiter",
    "encode_frame_header",
    "encode_report",
    "parse_addr",
    "peer_addr",
    "receive_within",
    "send_within",
]

log = structlog.get_logger()

# RocketMQ's MessageStoreConfig defaults.
DEFAULT_TRANSFER_BATCH_SIZE = 32768
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
DEFAULT_HOUSEKEEPING_INTERVAL_S = 20.0
DEFAULT_MAX_GAP_NOT_IN_SYNC = 256 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 64  # slaves of one master: a handful in practice

# An HA connection: plain TCP, or TLS over it (`HAServerTls`, `HAClientBase(tls=...)`).
HAStream = trio.abc.Stream

REPORT_SIZE = 8
_REPORT = struct.Struct(">q")
_FRAME_HEADER = struct.Struct(">qi")
FRAME_HEADER_SIZE = _FRAME_HEADER.size
# Largest frame body a slave accepts: far above any sane transfer batch, small enough that
# a hostile master cannot make it buffer much.
MAX_FRAME_BODY = 8 * 1024 * 1024
_INT64_MAX = (1 << 63) - 1

# Read sizes: reports are tiny (a chunk only bounds the work per read); frames are up to a
# transfer batch each.
_REPORT_READ_CHUNK = 4096
_FRAME_READ_CHUNK = 65536
# Frames `notify_append` writes at most per call (the transfer task sends the rest).
_PUSH_FRAMES = 8
# Waiter-heap compaction threshold (see `HAMaster._push_waiter`).
_COMPACT_MIN = 64


class HAProtocolError(ValueError):
    """The peer sent something the protocol does not allow (the connection is closed)."""


# -- codec (sans-IO) ----------------------------------------------------------------------


def encode_report(offset: int) -> bytes:
    """A slave's report: its commitlog max offset as a big-endian int64."""
    if not 0 <= offset <= _INT64_MAX:
        raise ValueError(f"report offset out of range: {offset}")
    return _REPORT.pack(offset)


def encode_frame_header(offset: int, size: int) -> bytes:
    """A frame header: int64 offset of the first body byte, int32 body size."""
    if not 0 <= offset <= _INT64_MAX:
        raise ValueError(f"frame offset out of range: {offset}")
    if not 0 <= size <= 0x7FFFFFFF:
        raise ValueError(f"frame size out of range: {size}")
    return _FRAME_HEADER.pack(offset, size)


class ReportReader:
    """Cuts the report stream into 8-byte values from its start and gives the newest complete
    one of each read (older ones in the same read are superseded). Keeps under 8 bytes."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    @property
    def pending(self) -> int:
        """Bytes of an incomplete report held."""
        return len(self._rest)

    def feed(self, data: bytes) -> int | None:
        """The newest report completed by `data` (signed, as sent), or None."""
        buf = self._rest + data if self._rest else data
        whole = len(buf) - len(buf) % REPORT_SIZE
        self._rest = bytes(buf[whole:])
        if whole == 0:
            return None
        value: int = _REPORT.unpack_from(buf, whole - REPORT_SIZE)[0]
        return value


class FrameReader:
    """Cuts the master's stream into frames, split anywhere. A header is checked as soon as
    its 12 bytes are in, so at most one frame of `max_body` bytes plus one read is buffered;
    a negative offset or a size outside [0, max_body] raises `HAProtocolError`, after which
    the reader refuses everything (the connection is to be closed)."""

    __slots__ = ("_buf", "_failed", "max_body")

    def __init__(self, max_body: int = MAX_FRAME_BODY) -> None:
        self.max_body = max_body
        self._buf = bytearray()
        self._failed = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The frames completed by `data`, in order, as (offset, body)."""
        if self._failed:
            raise HAProtocolError("frame stream already failed")
        buf = self._buf
        buf += data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= FRAME_HEADER_SIZE:
            offset, size = _FRAME_HEADER.unpack_from(buf, pos)
            if offset < 0 or size < 0 or size > self.max_body:
                self._failed = True
                buf.clear()
                raise HAProtocolError(f"bad frame header: offset {offset}, size {size}")
            start = pos + FRAME_HEADER_SIZE
            if end - start < size:
                break
            frames.append((offset, bytes(buf[start : start + size])))
            pos = start + size
        if pos:
            del buf[:pos]
        return frames


def parse_addr(addr: str) -> tuple[str, int]:
    """An address "host:port" (IPv6 hosts in brackets) -> (host, port): `parse_host_port`
    without the brackets and port 0; ValueError when malformed."""
    host, port = parse_host_port(addr, what="HA address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or port == 0:
        raise ValueError(f"not a host:port address: {addr!r}")
    return host, port


# -- store interface ----------------------------------------------------------------------


class _CommitlogConfig(Protocol):
    @property
    def mapped_file_size_commitlog(self) -> int: ...


class HAMasterStore(Protocol):
    """What the master uses of the message store."""

    @property
    def config(self) -> _CommitlogConfig: ...

    @property
    def max_phy_offset(self) -> int: ...

    def read_commitlog(self, phy_offset: int, max_bytes: int) -> bytes | None:
        """Bytes from `phy_offset` up to the write position of its one commitlog file, at
        most `max_bytes`; None when there is nothing there."""
        ...


class HASlaveStore(Protocol):
    """What the slave uses of the message store."""

    @property
    def max_phy_offset(self) -> int: ...

    async def append_replica(
        self, phy_offset: int, data: bytes, written: Callable[[], None] | None = None
    ) -> None:
        """Append the master's bytes at `phy_offset`; a ValueError when that is not the max
        offset (an empty store accepts any file-aligned start). `written()`: called once the
        bytes are held, before any further work on them (the slave reports from there)."""
        ...


# -- small helpers ------------------------------------------------------------------------


class End:
    """The first reason a connection's tasks give for ending it; cancels them all."""

    __slots__ = ("reason", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.reason: str | None = None

    def __call__(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


IO_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def tls_mode(tls: HAServerTls | None) -> str:
    """The HA port's TLS mode, for logs."""
    return "disabled" if tls is None else tls.settings.mode


class Stalled(Exception):
    """A send did not complete within the housekeeping interval."""


async def send_within(
    stream: trio.abc.SendStream, data: bytes | memoryview, timeout_s: float
) -> None:
    """Send `data`; `Stalled` when that takes more than `timeout_s`."""
    # A peer that stopped reading would block a send forever; give up on it instead.
    with trio.move_on_after(timeout_s):
        await stream.send_all(data)
        return
    raise Stalled


async def receive_within(stream: HAStream, size: int, timeout_s: float, end: End) -> bytes | None:
    """The next bytes from the peer, or None after `end(reason)`: a read error, the peer's
    close, or nothing within `timeout_s` (the housekeeping interval)."""
    data: bytes | bytearray | None = None
    try:
        with trio.move_on_after(timeout_s):
            data = await stream.receive_some(size)
    except IO_ERRORS as exc:
        end(f"read error: {exc!r}")
        return None
    if data is None:
        end("housekeeping timeout")
        return None
    if not data:
        end("eof")
        return None
    # A TLS stream may hand back a bytearray; the readers keep bytes.
    return data if type(data) is bytes else bytes(data)


class Reads:
    """Reads of up to `size` bytes from an HA stream: `await reads()` gives b"" at the peer's
    close and raises one of `IO_ERRORS` on failure; no timeout (the caller's periodic task
    bounds silence).

    A plain TCP stream is read as `remoting`'s reader reads: after a short read (the socket
    drained), wait until readable, then one `recv` that succeeds; after a full one, read
    again after a checkpoint. `SocketStream.receive_some` would instead try a `recv` that
    fails before each wait and yield once more after it. A TLS stream: `receive_some`.
    """

    __slots__ = ("_drained", "_size", "_sock", "_stream")

    def __init__(self, stream: HAStream, size: int) -> None:
        self._stream = stream
        self._size = size
        self._sock = stream.socket if type(stream) is trio.SocketStream else None
        self._drained = True

    async def __call__(self) -> bytes:
        sock = self._sock
        if sock is None:
            data = await self._stream.receive_some(self._size)
            # A TLS stream may hand back a bytearray; the readers keep bytes.
            return data if type(data) is bytes else bytes(data)
        while True:
            if self._drained:
                await trio.lowlevel.wait_readable(sock)
            else:
                await trio.lowlevel.checkpoint()
            try:
                # `fileno()` is -1 once the socket is closed: EBADF, never another file.
                data = os.read(sock.fileno(), self._size)
            except BlockingIOError:  # readable, then nothing to read: wait again
                self._drained = True
                continue
            self._drained = len(data) < self._size
            return data

    async def or_end(self, end: End) -> bytes | None:
        """The next bytes, or None after `end(reason)`: a read error or the peer's close."""
        try:
            data = await self()
        except IO_ERRORS as exc:
            end(f"read error: {exc!r}")
            return None
        if not data:
            end("eof")
            return None
        return data


class Outbox:
    """One connection's outgoing bytes, written in order from two places: `write_now`, from
    synchronous code, straight to a plain TCP socket while it is `idle`; and the connection's
    task (`send`, under the stall bound) for everything else. A write made in part leaves its
    tail in `rest`, which the task sends before any other byte."""

    __slots__ = ("fd", "rest", "sending")

    def __init__(self) -> None:
        self.fd = -1  # -1: no straight writes (not yet, TLS, or failed)
        self.sending = False  # the task is inside a send
        self.rest: bytes | memoryview | None = None

    def open(self, stream: HAStream) -> None:
        """Allow straight writes from now on if `stream` is plain TCP."""
        self.fd = stream.socket.fileno() if type(stream) is trio.SocketStream else -1

    def close(self) -> None:
        """No straight writes any more (the session ended: its socket may be reused)."""
        self.fd = -1

    @property
    def idle(self) -> bool:
        """`write_now` may write: a plain socket, no send of the task under way, no tail."""
        return self.fd >= 0 and not self.sending and self.rest is None

    def write_now(self, data: bytes) -> bool:
        """Write `data` now (only when `idle`); False when a tail is left for the task.

        Raises:
            OSError: the connection failed (no straight writes any more).
        """
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            raise
        if sent == len(data):
            return True
        self.rest = memoryview(data)[sent:]
        return False

    async def send(self, stream: HAStream, data: bytes | memoryview, timeout_s: float) -> None:
        """Send `data` from the task (`send_within`'s errors)."""
        self.rest = data
        self.sending = True
        await send_within(stream, data, timeout_s)
        self.sending = False
        self.rest = None


class HAServerTls:
    """TLS on an HA port, with the settings of the broker's remoting port (`tls_mode`:
    permissive serves plain and TLS slaves, enforcing TLS ones only; mutual TLS as set).
    The context is loaded by `load` (a bad file stops the start) and again for a new
    connection once the files changed (a change that does not load keeps the last context)."""

    def __init__(self, settings: TlsServerSettings) -> None:
        self.settings = settings
        self._context: ssl.SSLContext | None = None
        self._seen: tuple[tuple[int, int, int], ...] = ()

    async def load(self) -> None:
        """Load the context.

        Raises:
            TlsConfigError: a file is missing or unusable.
        """
        # Stat and read the files off the event loop.
        self._seen = await trio.to_thread.run_sync(tls_files_signature, self.settings.files)
        self._context = await self.settings.load_context()

    async def accept(self, stream: trio.SocketStream, peer: str) -> HAStream | None:
        """The stream to serve (`remoting.tls.accept_tls`), or None once it is closed."""
        seen = await trio.to_thread.run_sync(tls_files_signature, self.settings.files)
        if seen != self._seen or self._context is None:
            error: str | None = None
            try:
                await self.load()
            except TlsConfigError as exc:
                error = str(exc)
                self._seen = seen  # logged once per distinct state of the files
            if error is None:
                log.info("ha_tls_reloaded")
            else:
                log.error("ha_tls_reload_failed", error=error)
        if self._context is None:
            await trio.aclose_forcefully(stream)
            return None
        return await accept_tls(
            stream,
            self.settings,
            self._context,
            peer=peer,
            first_byte_timeout_s=self.settings.handshake_timeout_ms / 1000,
            port_name="ha",
        )


def peer_addr(stream: trio.SocketStream) -> str:
    """The peer's "host:port" (IPv6 hosts in brackets), "?" when unknown."""
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return "?"
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)


# -- replication waiters -----------------------------------------------------------------


class Waiter:
    """One replication wait. `cancel()` drops it without a callback."""

    __slots__ = ("_owner", "callback", "deadline", "done", "offset")

    def __init__(
        self,
        owner: ReplicationWaiters,
        offset: int,
        deadline: float,
        callback: Callable[[bool], None],
    ) -> None:
        self._owner = owner
        self.offset = offset
        self.deadline = deadline
        self.callback = callback
        self.done = False

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self._owner.live -= 1


class ReplicationWaiters:
    """Waits for a replicated offset that only grows (`reached`): each waiter is answered
    True once `reach` passes its offset, or False at its deadline. `run_timer` must run for
    the deadlines and for the waiters added already reached.

    Waiters are held by offset (reaches) and by deadline (timeouts); a finished waiter's
    entries are dropped lazily.
    """

    def __init__(self) -> None:
        self.reached = 0
        self.live = 0
        self._by_offset: list[tuple[int, int, Waiter]] = []
        self._deadlines: DeadlineHeap[Waiter] = DeadlineHeap()
        self._seq = itertools.count()
        self._ready: list[Waiter] = []
        self._timer_wake: trio.Event | None = None

    def add(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float, *, ready: bool
    ) -> Waiter:
        """Wait for `offset`; `ready`: it is replicated already (answered True by the timer,
        never from within this call)."""
        waiter = Waiter(self, offset, trio.current_time() + timeout_s, callback)
        self.live += 1
        if ready or offset <= self.reached:
            self._ready.append(waiter)
            self._wake_timer()
        else:
            self._push(waiter)
        return waiter

    async def wait(self, offset: int, timeout_s: float, replicated: Callable[[], bool]) -> bool:
        """Whether `offset` is replicated within `timeout_s`; `replicated()` says whether it
        is now (asked first and at the end)."""
        if replicated():
            await trio.lowlevel.checkpoint()
            return True
        result = False
        finished = trio.Event()

        def done(ok: bool) -> None:
            nonlocal result
            result = ok
            finished.set()

        waiter = self.add(offset, done, timeout_s, ready=False)
        try:
            # The timer answers at the deadline; this bound also holds without `run_timer`.
            with trio.move_on_at(waiter.deadline):
                await finished.wait()
        finally:
            waiter.cancel()
        return result or replicated()

    def reach(self, offset: int) -> None:
        """Raise `reached` to `offset` and answer every waiter up to it (group commit)."""
        if offset <= self.reached:
            return
        self.reached = offset
        heap = self._by_offset
        while heap and heap[0][0] <= offset:
            self._finish(heapq.heappop(heap)[2], True)

    def fail_all(self) -> None:
        """Answer every waiter False (nothing will be replicated any more)."""
        pending = [e[2] for e in self._by_offset] + self._ready
        self._by_offset.clear()
        self._ready.clear()
        self._deadlines = DeadlineHeap()
        for waiter in pending:
            self._finish(waiter, False)

    async def run_timer(self) -> None:
        """Answer the ready waiters and the expired ones, until cancelled."""
        while True:
            self._timer_wake = wake = trio.Event()
            ready, self._ready = self._ready, []
            for waiter in ready:
                self._finish(waiter, True)
            for waiter in self._deadlines.expire(trio.current_time()):
                self._finish(waiter, False)
            if self._ready:
                continue
            with trio.move_on_at(self._deadlines.next_deadline):
                await wake.wait()

    def _push(self, waiter: Waiter) -> None:
        heap = self._by_offset
        # Timed-out waiters stay in the offset heap until passed: drop them all once they
        # outnumber the live ones 4:1 (amortised O(1) per push).
        if len(heap) > _COMPACT_MIN and len(heap) > 4 * self.live:
            heap[:] = [e for e in heap if not e[2].done]
            heapq.heapify(heap)
        heapq.heappush(heap, (waiter.offset, next(self._seq), waiter))
        if self._deadlines.push(waiter.deadline, waiter, self.live):
            self._wake_timer()

    def _wake_timer(self) -> None:
        wake = self._timer_wake
        if wake is not None:
            self._timer_wake = None
            wake.set()

    def _finish(self, waiter: Waiter, ok: bool) -> None:
        if waiter.done:
            return
        waiter.done = True
        self.live -= 1
        try:
            waiter.callback(ok)
        except Exception:
            log.exception("ha_replica_callback_failed", offset=waiter.offset, ok=ok)


# -- master -------------------------------------------------------------------------------


class _SlaveConn:
    """The master's side of one HA connection. `ack` is -1 until the first valid report.

    Frames leave through `out`: `HAMaster.notify_append` writes them straight while it is
    idle (its socket is set once the start point is known), the transfer task sends the rest.
    `next_offset` is the offset of the next frame, whoever sends it.
    """

    __slots__ = (
        "ack",
        "addr",
        "end",
        "last_read",
        "last_send",
        "next_offset",
        "out",
        "reported",
        "wake",
    )

    def __init__(self, addr: str, end: End) -> None:
        self.addr = addr
        self.end = end
        self.ack = -1
        self.next_offset = -1
        self.reported = trio.Event()
        self.out = Outbox()
        # Set (and dropped) by whoever has frames for the task; made only while it waits.
        self.wake: trio.Event | None = None
        self.last_read = self.last_send = trio.current_time()

    def wake_task(self) -> None:
        wake = self.wake
        if wake is not None:
            self.wake = None
            wake.set()


class HAMaster:
    """Serves slaves on the HA port and tracks what they acknowledged.

    Args:
        store: The commitlog to replicate.
        transfer_batch_size: Largest frame body sent.
        heartbeat_interval_s: A heartbeat frame goes out after this long without a send.
        housekeeping_interval_s: A connection is closed after this long without a read, or
            when a send does not complete within it.
        max_gap_not_in_sync: `slave_ok` is False from this many unacknowledged bytes on.
        idle_poll_s: With nothing to send, look again after this long even without a
            `notify_append`.
        max_connections: Connections served at once; more are closed on accept.

    All methods are for the trio thread; `when_replicated` timeouts need `run` running.
    """

    def __init__(
        self,
        store: HAMasterStore,
        *,
        transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        housekeeping_interval_s: float = DEFAULT_HOUSEKEEPING_INTERVAL_S,
        max_gap_not_in_sync: int = DEFAULT_MAX_GAP_NOT_IN_SYNC,
        idle_poll_s: float = 0.1,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: TlsServerSettings | None = None,
    ) -> None:
        if not 0 < transfer_batch_size <= MAX_FRAME_BODY:
            raise ValueError(f"transfer_batch_size must be in 1..{MAX_FRAME_BODY}")
        self.tls = HAServerTls(tls) if tls is not None and tls.enabled else None
        self.store = store
        self.transfer_batch_size = transfer_batch_size
        self.heartbeat_interval_s = heartbeat_interval_s
        self.housekeeping_interval_s = housekeeping_interval_s
        self.max_gap_not_in_sync = max_gap_not_in_sync
        self.idle_poll_s = idle_poll_s
        self.max_connections = max_connections
        self.port = 0
        self._conns: set[_SlaveConn] = set()
        self._slave_count = 0  # of `_conns` with a valid report
        # Reached: the highest offset any slave acknowledged.
        self._waiters = ReplicationWaiters()

    # -- state ------------------------------------------------------------------------
    @property
    def acked_offset(self) -> int:
        """The highest offset any slave acknowledged since start (never decreases: what a
        slave acknowledged it holds, as RocketMQ's push2SlaveMaxOffset)."""
        return self._waiters.reached

    @property
    def _live_waiters(self) -> int:
        return self._waiters.live

    @property
    def slave_count(self) -> int:
        """Connections that sent a valid report and are still open (asked per send)."""
        return self._slave_count

    def slave_offsets(self) -> dict[str, int]:
        """Slave address -> its last acknowledged offset (connected slaves)."""
        return {c.addr: c.ack for c in self._conns if c.ack >= 0}

    def runtime_info(self) -> HARuntimeInfo:
        """RocketMQ's HA status of a master (GET_BROKER_HA_STATUS)."""
        max_offset = self.store.max_phy_offset
        conns = [
            HAConnectionRuntimeInfo(
                addr=c.addr,
                slave_ack_offset=c.ack,
                diff=max_offset - c.ack,
                in_sync=max_offset - c.ack < self.max_gap_not_in_sync,
                transfer_from_where=c.next_offset,
            )
            for c in self._conns
            if c.ack >= 0
        ]
        return HARuntimeInfo(
            master=True,
            master_commit_log_max_offset=max_offset,
            in_sync_slave_nums=sum(1 for c in conns if c.in_sync),
            ha_connection_info=conns,
        )

    def slave_ok(self, next_offset: int) -> bool:
        """A slave is connected and `next_offset` is less than `max_gap_not_in_sync` bytes
        past what slaves acknowledged (else SYNC_MASTER answers SLAVE_NOT_AVAILABLE)."""
        return (
            self.slave_count > 0 and next_offset - self._waiters.reached < self.max_gap_not_in_sync
        )

    def notify_append(self) -> None:
        """New commitlog bytes: write them to the slaves now where the socket allows it (see
        `_SlaveConn`), else wake their transfer tasks."""
        for conn in self._conns:
            if conn.out.idle:
                self._push(conn)
            else:
                conn.wake_task()

    def _push(self, conn: _SlaveConn) -> None:
        """Write `conn`'s next frames straight to its socket, at most `_PUSH_FRAMES` (the
        task goes on with more: a slave catching up is the task's work)."""
        store = self.store
        if store.max_phy_offset <= conn.next_offset:
            return  # the common case of a run's later arrivals: nothing new
        for _ in range(_PUSH_FRAMES):
            nxt = conn.next_offset
            data = store.read_commitlog(nxt, self.transfer_batch_size)
            if not data:
                return
            frame = encode_frame_header(nxt, len(data)) + data
            try:
                whole = conn.out.write_now(frame)
            except OSError as exc:
                conn.end(f"write error: {exc!r}")
                return
            conn.next_offset = nxt + len(data)
            conn.last_send = trio.current_time()
            if not whole:
                break  # the socket is full: the task sends the tail, under the stall bound
        conn.wake_task()

    # -- replication waits ------------------------------------------------------------
    def when_replicated(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> None:
        """Call `callback(True)` once a slave acknowledged `offset` (the commitlog offset
        after the record), or `callback(False)` after `timeout_s`. Never calls back from
        within this call: an offset acknowledged already is answered by the timer task."""
        self._waiters.add(offset, callback, timeout_s, ready=False)

    async def wait_replicated(self, offset: int, timeout_s: float) -> bool:
        """Whether a slave acknowledged `offset` within `timeout_s`."""
        return await self._waiters.wait(offset, timeout_s, lambda: offset <= self._waiters.reached)

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
        log.info("ha_master_listening", host=host, port=self.port, tls=tls_mode(self.tls))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._waiters.run_timer)
                await nursery.start(
                    partial(trio.serve_listeners, self._serve, listeners, handler_nursery=nursery)
                )
                task_status.started(self.port)
        finally:
            # No slave will acknowledge anything any more.
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
        conn: _SlaveConn | None = None
        try:
            async with stream, trio.open_nursery() as nursery:
                end = End(nursery.cancel_scope)
                conn = _SlaveConn(addr, end)
                self._conns.add(conn)
                log.info("ha_slave_connected", addr=conn.addr)
                nursery.start_soon(self._read_reports, stream, conn, end)
                nursery.start_soon(self._transfer, stream, conn, end)
            reason = end.reason or "closed"
        finally:
            if conn is not None:
                self._conns.discard(conn)
                if conn.ack >= 0:
                    self._slave_count -= 1
                log.info(
                    "ha_slave_lost",
                    addr=conn.addr,
                    reason=reason,
                    ack=conn.ack,
                    next=conn.next_offset,
                )

    async def _read_reports(self, stream: HAStream, conn: _SlaveConn, end: End) -> None:
        reader = ReportReader()
        reads = Reads(stream, _REPORT_READ_CHUNK)
        while True:
            data = await reads.or_end(end)
            if data is None:
                return
            conn.last_read = trio.current_time()
            report = reader.feed(data)
            if report is None:
                continue
            # Unauthenticated port: never let a report acknowledge bytes we do not have.
            max_offset = self.store.max_phy_offset
            if report < 0 or report > max_offset:
                log.warning("ha_bad_report", addr=conn.addr, report=report, max=max_offset)
                end("report out of range")
                return
            if conn.ack < 0:
                self._slave_count += 1
                conn.next_offset = report
                conn.reported.set()
                log.info("ha_slave_start", addr=conn.addr, report=report, max=max_offset)
            conn.ack = report
            self._waiters.reach(report)

    async def _transfer(self, stream: HAStream, conn: _SlaveConn, end: End) -> None:
        """Send what `notify_append` did not (see `_SlaveConn`), heartbeats, and close the
        connection when the slave is silent for the housekeeping interval."""
        hk = self.housekeeping_interval_s
        # Nothing is sent before the first report.
        while conn.ack < 0:
            due = conn.last_read + hk
            if trio.current_time() >= due:
                end("housekeeping timeout")
                return
            with trio.move_on_at(due):
                await conn.reported.wait()
        store = self.store
        nxt = conn.next_offset
        if nxt == 0:
            # An empty slave starts at the master's last file.
            max_offset = store.max_phy_offset
            nxt = max_offset - max_offset % store.config.mapped_file_size_commitlog
        conn.next_offset = nxt
        out = conn.out
        out.open(stream)
        try:
            while True:
                rest = out.rest
                if rest is None:
                    nxt = conn.next_offset
                    data = store.read_commitlog(nxt, self.transfer_batch_size)
                    if data:
                        rest = encode_frame_header(nxt, len(data)) + data
                        conn.next_offset = nxt + len(data)
                if rest is not None:
                    await out.send(stream, rest, hk)
                    conn.last_send = trio.current_time()
                    continue
                now = trio.current_time()
                # Absolute deadlines for the tests and the wait: a difference compared with
                # an interval can round below it while the wait rounds to nothing.
                silent_due = conn.last_read + hk
                if now >= silent_due:
                    end("housekeeping timeout")
                    return
                heartbeat_due = conn.last_send + self.heartbeat_interval_s
                if now >= heartbeat_due:
                    out.rest = encode_frame_header(conn.next_offset, 0)
                    continue
                # No checkpoint since the read: an append after it sets this event.
                conn.wake = wake = trio.Event()
                with trio.move_on_at(min(now + self.idle_poll_s, heartbeat_due, silent_due)):
                    await wake.wait()
                conn.wake = None
        except Stalled:
            end("send stalled")
        except IO_ERRORS as exc:
            end(f"write error: {exc!r}")


# -- slave --------------------------------------------------------------------------------


class _LocalLog(Protocol):
    @property
    def max_phy_offset(self) -> int: ...


S = TypeVar("S", bound=_LocalLog)


class HAClientBase(Generic[S]):
    """A slave's side of an HA port: connects to the master, runs one connection at a time
    (`_session`, by the subclass), reconnects after a bounded backoff, and reports its max
    offset (`_report_loop`, with the subclass's `_encode_report`).

    Args:
        store: The local commitlog.
        master_addr: The master's HA address "host:port", or None (idle until `set_master`).
        heartbeat_interval_s: A report goes out at least this often.
        housekeeping_interval_s: The connection is closed after this long without a read
            (the master sends heartbeats), or when a report cannot be sent within it.
        connect_timeout_s: Bound of one connection attempt.
        min_backoff_s, max_backoff_s: Wait before reconnecting; doubles from min to max
            while connections fail without delivering a frame.
        max_frame_body: Largest frame body accepted.
        tls: Connect with TLS (the broker's client TLS settings); None: plain TCP.
    """

    def __init__(
        self,
        store: S,
        master_addr: str | None = None,
        *,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        housekeeping_interval_s: float = DEFAULT_HOUSEKEEPING_INTERVAL_S,
        connect_timeout_s: float = 5.0,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 5.0,
        max_frame_body: int = MAX_FRAME_BODY,
        tls: TlsClientSettings | None = None,
    ) -> None:
        if master_addr is not None:
            parse_addr(master_addr)
        self.tls = tls if tls is not None and tls.enable else None
        self.store = store
        self.heartbeat_interval_s = heartbeat_interval_s
        self.housekeeping_interval_s = housekeeping_interval_s
        self.connect_timeout_s = connect_timeout_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_frame_body = max_frame_body
        self.last_report = -1
        self.last_read_ms = 0  # wall clock of the last frame received, 0 = never
        self.last_write_ms = 0  # wall clock of the last report sent
        self._master_addr = master_addr
        self._connected = False
        self._session_scope: trio.CancelScope | None = None
        self._addr_changed: trio.Event | None = None
        self._report_wake: trio.Event | None = None
        # Reports of the session: the report loop's, and `_report_grown`'s straight writes.
        self._reports = Outbox()
        self._last_report_at = 0.0
        # trio time of the session's last read: a silent master is left at housekeeping.
        self._last_read_at = 0.0
        # A failed session may ask for at least this wait before the next attempt.
        self._retry_floor_s = 0.0

    @property
    def master_addr(self) -> str | None:
        return self._master_addr

    @property
    def connected(self) -> bool:
        """A TCP connection to the master is open."""
        return self._connected

    def runtime_info(self) -> HARuntimeInfo:
        """RocketMQ's HA status of a slave (GET_BROKER_HA_STATUS)."""
        return HARuntimeInfo(
            master=False,
            ha_client_runtime_info=HAClientRuntimeInfo(
                master_addr=self._master_addr,
                max_offset=self.store.max_phy_offset,
                last_read_timestamp=self.last_read_ms,
                last_write_timestamp=self.last_write_ms,
                activated=self._connected,
            ),
        )

    def set_master(self, addr: str | None) -> None:
        """Follow `addr` from now on (None: no master). A change closes the current
        connection; `run` connects to the new address at once."""
        if addr is not None:
            parse_addr(addr)
        if addr == self._master_addr:
            return
        log.info("ha_master_address_changed", old=self._master_addr, new=addr)
        self._master_addr = addr
        if self._session_scope is not None:
            self._session_scope.cancel()
        changed = self._addr_changed
        if changed is not None:
            self._addr_changed = None
            changed.set()

    def _changed_event(self) -> trio.Event:
        if self._addr_changed is None:
            self._addr_changed = trio.Event()
        return self._addr_changed

    async def run(self) -> None:
        """Connect, replicate, reconnect, until cancelled. A store error from
        `append_replica` other than a ValueError (a refused offset or bytes) or an OSError
        (both: reconnect after the backoff) ends it, e.g. the store closing: cancel the
        slave before closing the store."""
        backoff = self.min_backoff_s
        while True:
            addr = self._master_addr
            if addr is None:
                await self._changed_event().wait()
                continue
            changed = self._changed_event()
            self._retry_floor_s = 0.0
            with trio.CancelScope() as scope:
                self._session_scope = scope
                try:
                    progressed = await self._session(addr)
                finally:
                    self._session_scope = None
            if scope.cancelled_caught:
                # The address changed: go there at once.
                backoff = self.min_backoff_s
                continue
            if progressed:
                backoff = self.min_backoff_s
            delay = max(backoff, self._retry_floor_s)
            backoff = min(backoff * 2, self.max_backoff_s)
            with trio.move_on_after(delay):
                await changed.wait()

    async def _session(self, addr: str) -> bool:
        """One connection to `addr`; True when it delivered at least one valid frame."""
        raise NotImplementedError

    async def _connect(self, addr: str) -> HAStream | None:
        """A connection to `addr` (TLS when `tls`), or None (logged) when it cannot be made
        within `connect_timeout_s`."""
        host, port = parse_addr(addr)
        tcp: trio.SocketStream | None = None
        try:
            with trio.move_on_after(self.connect_timeout_s):
                tcp = await trio.open_tcp_stream(host, port)
                if self.tls is None:
                    return tcp
                # The files are read off the event loop at each connect: a renewed
                # certificate is used from the next connection on.
                context = await self.tls.load_context()
                return await connect_tls(tcp, self.tls, context, host)
            error = "timeout"
        except OSError as exc:
            error = str(exc)
        except TlsConfigError as exc:
            error = str(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            error = f"TLS handshake failed: {describe_handshake_error(exc)}"
        if tcp is not None:
            await trio.aclose_forcefully(tcp)
        log.info("ha_connect_failed", addr=addr, error=error)
        return None

    def _encode_report(self, offset: int) -> bytes:
        """One report of `offset` on this wire."""
        raise NotImplementedError

    async def _report_loop(self, stream: HAStream, end: End) -> None:
        """Report the local max at once, after it grew when `_report_grown` could not write it,
        and every heartbeat interval; close the session when the master is silent for the
        housekeeping interval (the receive loop does not time its reads)."""
        hk = self.housekeeping_interval_s
        self._last_read_at = trio.current_time()
        out = self._reports = Outbox()
        self.last_report = -1
        try:
            while True:
                # Made before reading the max: growth during the send below sets it.
                self._report_wake = wake = trio.Event()
                now = trio.current_time()
                data = out.rest
                if data is None:
                    offset = self.store.max_phy_offset
                    if offset != self.last_report or (
                        now >= self._last_report_at + self.heartbeat_interval_s
                    ):
                        data = self._encode_report(offset)
                        self._reported(offset, now)
                if data is not None:
                    await out.send(stream, data, hk)
                    # The first report goes out before any frame: then straight writes.
                    out.open(stream)
                    continue
                silent_due = self._last_read_at + hk
                if now >= silent_due:
                    end("housekeeping timeout")
                    return
                with trio.move_on_at(
                    min(self._last_report_at + self.heartbeat_interval_s, silent_due)
                ):
                    await wake.wait()
        except Stalled:
            end("send stalled")
        except IO_ERRORS as exc:
            end(f"write error: {exc!r}")
        finally:
            self._report_wake = None
            out.close()

    def _reported(self, offset: int, now: float) -> None:
        self.last_report = offset
        self._last_report_at = now
        self.last_write_ms = int(time.time() * 1000)

    def _report_grown(self) -> None:
        """The local max grew: report it now, straight to a plain socket when the report loop
        is not inside a send and nothing is left over, else through the loop."""
        out = self._reports
        if out.idle:
            offset = self.store.max_phy_offset
            try:
                whole = out.write_now(self._encode_report(offset))
            except OSError:
                pass  # the loop's send meets the error and ends the session
            else:
                self._reported(offset, trio.current_time())
                if whole:
                    return
        wake = self._report_wake
        if wake is not None:
            wake.set()


class HASlave(HAClientBase[HASlaveStore]):
    """Follows a master's commitlog over its HA port (the 4.x wire); arguments as
    `HAClientBase`."""

    def _encode_report(self, offset: int) -> bytes:
        return encode_report(offset)

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
                nursery.start_soon(self._report_loop, stream, end)
                nursery.start_soon(self._receive_loop, stream, end, progress)
            reason = end.reason or "closed"
        finally:
            self._connected = False
            log.info(
                "ha_master_lost", addr=addr, reason=reason, local_max=self.store.max_phy_offset
            )
        return progress[0]

    async def _receive_loop(self, stream: HAStream, end: End, progress: list[bool]) -> None:
        reader = FrameReader(self.max_frame_body)
        reads = Reads(stream, _FRAME_READ_CHUNK)
        store = self.store
        while True:
            data = await reads.or_end(end)
            if data is None:
                return
            self._last_read_at = trio.current_time()
            try:
                frames = reader.feed(data)
            except HAProtocolError as exc:
                log.warning("ha_bad_frame", error=str(exc))
                end("bad frame")
                return
            if not frames:
                continue
            self.last_read_ms = int(time.time() * 1000)
            before = store.max_phy_offset
            last = len(frames) - 1
            for i, (offset, body) in enumerate(frames):
                local = store.max_phy_offset
                if local != 0 and local != offset:
                    log.warning("ha_offset_mismatch", local_max=local, frame_offset=offset)
                    end("offset mismatch")
                    return
                progress[0] = True
                if not body:
                    continue
                try:
                    # Shielded: a half-done append must not be left behind by a master change.
                    # The last frame of the read is reported once written, before dispatch.
                    with trio.CancelScope(shield=True):
                        await store.append_replica(
                            offset, body, self._report_grown if i == last else None
                        )
                except (ValueError, OSError) as exc:
                    log.warning("ha_append_failed", offset=offset, size=len(body), error=str(exc))
                    end("append failed")
                    return
            grown = store.max_phy_offset
            if grown != before and grown != self.last_report:
                self._report_grown()

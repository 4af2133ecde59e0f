"""One TCP connection carrying RemotingCommands, used by both the server and the client: the
trio transport under the sans-IO protocol state (`remoting._protocol.RemotingProtocol`: frame
decoding, request matching, deadlines, the peer's requests in flight).

A `Connection` runs a reader task and a writer task inside its own nursery. The writer drains a
bounded memory channel of encoded frames, joining whatever is queued into one write. The
reader feeds the bytes it reads to the protocol: responses complete the matching pending
request (by opaque); requests
go to their processor from the `ProcessorTable` (`remoting._processor`: the contract, the two
modes, deferred answers and the run hooks). At most `max_inflight` requests of the peer are in
flight at once (running in a task, or deferred and not yet answered): at the limit the reader
stops reading, which pushes back on the peer through TCP. Inline processors run without the
per-request log context (peer, code, opaque) that task processors get bound: binding and
resetting it would be a sizeable share of a whole send; a failure is logged with those fields
explicitly (docs/design-notes.md, "Inline send handling").

The answers produced inline while handling one `receive_some` batch leave together, in one
write per `_ANSWER_CHUNK` answers (and at the end of the batch): written straight to the socket
by the reader when the writer task is idle (nothing queued, not inside a write), which saves
waking the writer, or queued to the writer as one item otherwise. A task per request plus the
writer's wake-up cost more CPU than the work of a single send; the reader's batch is the
natural unit to coalesce. It is cut into chunks so that both ends work at once: a pipelining
client sends its whole window in one write, and answering it only at the end would leave the
client idle while the broker works through the window and the broker idle while the client
works through the answers (docs/design-notes.md, "Answer chunks"). Answers may leave in
another order than their requests arrived: RocketMQ clients match them by opaque.

The same holds for responses arriving in one batch: the reader yields to the scheduler after
waking every `_RESPONSE_CHUNK` waiting requesters, so that they run (and a pipelining caller's
next requests leave) while the rest of the batch is still to be handed out. Without it, a
window of answers released together (a SYNC_FLUSH group commit answers a whole window at once)
comes back as a window of requests only after the caller worked through all of it, and the
peer waits meanwhile: client and broker would take turns, one fsync per whole window
(docs/design-notes.md, "Response chunks").

A request is written by its caller straight to the socket when the writer is idle and at most
a few other requests are in flight (`RemotingProtocol.may_write_directly`), not counting long
polls (`invoke(...,
long_poll=True)`: pulls the peer parks until messages arrive; a push consumer keeps one parked
per queue). With a few requests in flight, at most a few can be issued together, and joining
them saves little, while waking the writer puts a task switch on the way of every request.
With many, the writer joins the requests issued together into one write. The writer writes with
`os.write` and waits for writability only when the socket buffer is full
(`SocketStream.send_all` yields once more after every successful send).
(docs/design-notes.md, "Direct request writes")

A TLS connection (given a `trio.SSLStream`, docs/security.md "TLS") reads and writes through
the SSLStream, and only its writer task writes: the direct writes above go around the stream
to the raw socket, so they are for plain connections only. The plain path is unchanged by it
(the choice is made once per connection, not per read or write).
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import structlog
import trio

from remoting._command import Body, RemotingCommand
from remoting._frame import encode_frame_parts
from remoting._processor import (
    Processor,
    ProcessorTable,
    Responder,
    RunHooks,
    abandon,
    rpc_clock,
)
from remoting._protocol import PendingBudget, RemotingProtocol
from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, SerializeType
from remoting.errors import FrameError, RemotingConnectionLost, RemotingTimeoutError

__all__ = ["Connection"]

log = structlog.get_logger()
_bind_contextvars = structlog.contextvars.bind_contextvars

_RECEIVE_SIZE = 256 * 1024
# Inline answers leave at least every this many requests of one receive batch, or once this
# many bytes are ready (see the module docstring).
_ANSWER_CHUNK = 16
_ANSWER_CHUNK_BYTES = 64 * 1024
# The reader yields to the scheduler after waking this many requesters from one receive batch
# (see the module docstring).
_RESPONSE_CHUNK = 8
# The writer joins queued frames until this many bytes, then sends.
_COALESCE_BYTES = 256 * 1024
# Answers queued but not yet written, per connection: above the high mark the reader stops
# taking requests of that connection until the writer is down to the low mark (Netty's write
# buffer water marks in RocketMQ). A client that never reads holds at most about this much.
_UNSENT_HIGH = 16 * 1024 * 1024
_UNSENT_LOW = 8 * 1024 * 1024

_ids = itertools.count(1)


def _joined(frames: list[bytes | Body]) -> tuple[bytes, Body | None]:
    """Encoded frames as one writer item (one bytes object, copied only when several)."""
    first = frames[0]
    if len(frames) == 1 and isinstance(first, bytes):
        return first, None
    return b"", b"".join(frames)


def _parts_size(parts: tuple[bytes, Body | None]) -> int:
    head, body = parts
    return len(head) if body is None else len(head) + len(body)


class ByteBudget:
    """A cap on bytes held by several connections together (the incomplete frames of a
    server's connections). `adjust` may go over it; `over` tells a connection holding some of
    it to wait (`wait_room`) before it reads more."""

    __slots__ = ("_room", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._room: trio.Event | None = None

    @property
    def over(self) -> bool:
        return self.used > self.limit

    def adjust(self, delta: int) -> None:
        self.used += delta
        if delta < 0 and self._room is not None and self.used <= self.limit:
            self._room.set()
            self._room = None

    async def wait_room(self) -> None:
        """Until `used` is within the limit (at once if it is)."""
        while self.used > self.limit:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()


_current_task = trio.lowlevel.current_task
_reschedule = trio.lowlevel.reschedule
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_ABORT_SUCCEEDED = trio.lowlevel.Abort.SUCCEEDED


class _Waiter:
    """One request waiting for its response: the invoking task parks itself on it directly
    (`trio.lowlevel.wait_task_rescheduled`), without a `trio.Event` per request (what
    `Event.wait`/`set` do, minus the object and its task set).
    (docs/design-notes.md, "Request waiters and timers")

    `done` is set once by whoever finishes it (the reader with the response, the timer, the
    connection's end with an error) or by the task's own cancellation; only then is the task
    rescheduled, exactly once.
    """

    __slots__ = ("done", "error", "response", "task", "timed_out")

    def __init__(self) -> None:
        self.done = False
        self.task: trio.lowlevel.Task | None = None
        self.response: RemotingCommand | None = None
        self.error: BaseException | None = None
        self.timed_out = False

    def finish(self) -> None:
        """Mark it done and wake its task if parked (idempotent)."""
        if self.done:
            return
        self.done = True
        task = self.task
        if task is not None:
            self.task = None
            _reschedule(task)

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self.done = True
        self.task = None
        return _ABORT_SUCCEEDED

    async def wait(self) -> None:
        """Park until `finish` (or cancelled). Returns at once, after a checkpoint, when
        already done."""
        if self.done:
            await trio.lowlevel.checkpoint()
            return
        self.task = _current_task()
        await _wait_task_rescheduled(self._abort)


def _address(sock: trio.socket.SocketType, peer: bool) -> str:
    try:
        addr = sock.getpeername() if peer else sock.getsockname()
    except OSError:
        return "?"
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{addr[1]}"
    return str(addr)


class _TlsReads:
    """The reader's wait and read steps over an SSLStream, in the shapes of
    `trio.lowlevel.wait_readable` and `os.read`: `wait` receives the next decrypted bytes
    (b"" at the end), `read` hands them over, or raises BlockingIOError when `wait` has not
    received anything since the last `read` (the reader then waits again)."""

    __slots__ = ("_data", "_ssl")

    def __init__(self, ssl_stream: trio.SSLStream[trio.SocketStream]) -> None:
        self._ssl = ssl_stream
        self._data: bytes | None = None

    async def wait(self, _sock: object) -> None:
        if self._data is None:
            # bytes() of a bytes object is that object (SSLObject.read returns bytes).
            self._data = bytes(await self._ssl.receive_some(_RECEIVE_SIZE))

    def read(self, _fd: int, _size: int) -> bytes:
        data = self._data
        if data is None:
            raise BlockingIOError
        self._data = None
        return data


class Connection:
    """One TCP connection, either side.

    Attributes:
        id: process-unique number of this connection.
        remote_address: the peer as "ip:port".
        local_address: our end as "ip:port".
        closed: True once the connection is shut (or shutting) down.
        attributes: free slots for the owner (client id, broker address, ...).
    """

    def __init__(
        self,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        processors: ProcessorTable,
        *,
        max_frame_size: int,
        outbound_queue_size: int,
        max_inflight: int,
        next_opaque: Callable[[], int] | None = None,
        pending_budget: PendingBudget | None = None,
        msgpack: bool = True,
        advertise_msgpack: bool = False,
        serialize_type: int = SerializeType.MSGPACK,
        upgrade_to_msgpack: bool = False,
        partial_budget: ByteBudget | None = None,
    ) -> None:
        self.id = next(_ids)
        # Bytes queued for the writer and not yet written (see _UNSENT_HIGH), and the event
        # the reader waits on when they are above the high mark.
        self._unsent = 0
        self._drained: trio.Event | None = None
        # The server's budget of incomplete-frame bytes, and how much of it this one holds.
        self._partial_budget = partial_budget
        self._partial_held = 0
        # The protocol state: decoder, header codec, pending requests and their deadlines, the
        # peer's requests in flight. This object does the I/O and wakes the tasks.
        self._proto: RemotingProtocol[_Waiter] = RemotingProtocol(
            max_frame_size=max_frame_size,
            max_inflight=max_inflight,
            msgpack=msgpack,
            advertise_msgpack=advertise_msgpack,
            serialize_type=serialize_type,
            upgrade_to_msgpack=upgrade_to_msgpack,
            next_opaque=next_opaque,
            budget=pending_budget,
        )
        # `_stream` is always the TCP stream: plain connections read and write its socket
        # directly. A TLS connection (`_tls`) reads and writes through the SSLStream only,
        # and only the writer task writes (see `_writer`).
        self._tls: trio.SSLStream[trio.SocketStream] | None
        if isinstance(stream, trio.SSLStream):
            self._tls = stream
            self._stream = stream.transport_stream
        else:
            self._tls = None
            self._stream = stream
        sock = self._stream.socket
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not TCP (e.g. a unix socket in tests)
            pass
        self.remote_address = _address(sock, peer=True)
        self.local_address = _address(sock, peer=False)
        self.closed = False
        self.attributes: dict[str, object] = {}
        self._processors = processors
        self._send_channel, self._receive_channel = trio.open_memory_channel[
            tuple[bytes, Body | None]
        ](outbound_queue_size)
        # True while the writer waits on an empty queue (not holding a frame, not in
        # a write): only then may the reader write to the socket itself. Whoever queues a
        # frame clears it before the writer runs again.
        self._writer_idle = False
        # The event the reader waits on while the peer's requests in flight are at the limit.
        self._room: trio.Event | None = None
        # Request timeouts without a cancel scope per request (a scope's enter/exit was a large
        # share of a producer's CPU per send): the protocol's deadlines, expired by one timer
        # task, kicked when a new deadline is the earliest.
        self._timer_kick = trio.Event()
        self._cancel_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._done = trio.Event()
        self._close_reason: str | None = None
        # Successful reads so far: what RemotingServer's idle and read timeouts look at (with
        # the bytes of an incomplete frame).
        self.reads = 0
        # For the table's RPC observer: the codes of the inline answers collected and not yet
        # written (request code, response code, ...: no tuple per answer), and when their read
        # arrived.
        self._answered: list[int] = []
        self._read_at = 0.0

    @property
    def tls_version(self) -> str | None:
        """The TLS protocol version of the connection ("TLSv1.3"), or None for plain TCP."""
        return None if self._tls is None else self._tls.version()

    @property
    def partial_frame_bytes(self) -> int:
        """Bytes received of a frame not yet complete."""
        return self._proto.buffered

    @property
    def serialize_type(self) -> int:
        """Header codec of the requests sent on this connection."""
        return self._proto.serialize_type

    @property
    def busy(self) -> bool:
        """A request of the peer is being handled (or its answer is held, as a parked pull's)."""
        return self._proto.busy > 0

    def defer(self, cmd: RemotingCommand) -> Responder:
        """Answer the request `cmd` later: its processor returns None and the `Responder`
        sends the answer (see `remoting._processor`). The request counts as in flight until
        then."""
        self._proto.admit()
        responder = Responder(self, cmd)
        if self._processors.rpc_observer is not None:
            responder._since = rpc_clock()
        return responder

    def _release(self) -> None:
        """A request of the peer left the in-flight count."""
        proto = self._proto
        proto.release()
        room = self._room
        if room is not None and not proto.at_limit:
            self._room = None
            room.set()

    async def _wait_room(self) -> None:
        """Until fewer than `max_inflight` requests of the peer are in flight."""
        while self._proto.at_limit:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    def close_with_reason(self, reason: str) -> None:
        """`close`, recording `reason` as the close reason."""
        if not self.closed:
            self._close_reason = reason
        self.close()

    def __repr__(self) -> str:
        return f"Connection(id={self.id} remote={self.remote_address} closed={self.closed})"

    # -- sending ------------------------------------------------------------
    async def send(self, cmd: RemotingCommand) -> None:
        """Encode `cmd` and queue it for the writer (waits while the queue is full).

        Raises:
            RemotingConnectionLost: the connection is closed.
            ValueError: the command cannot be encoded.
        """
        if self.closed:
            raise RemotingConnectionLost(f"connection to {self.remote_address} is closed")
        await self._send_parts(encode_frame_parts(cmd))

    async def _send_parts(self, parts: tuple[bytes, Body | None]) -> None:
        """Queue encoded frames for the writer (waits while the queue is full).

        Raises:
            RemotingConnectionLost: the connection closed.
        """
        self._writer_idle = False
        try:
            try:
                # Fast path: room in the queue, no need to go through the scheduler.
                self._send_channel.send_nowait(parts)
            except trio.WouldBlock:
                await self._send_channel.send(parts)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise RemotingConnectionLost(
                f"connection to {self.remote_address} closed while sending"
            ) from None
        self._unsent += _parts_size(parts)

    async def invoke(
        self, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> RemotingCommand:
        """Send a request to the peer and wait for its response.

        Sets `cmd.opaque` (and clears the oneway flag). The response is returned whatever
        its code. `long_poll` says the peer may hold the request until it has something to
        answer (a long-polling pull): such requests are not counted as other requests in
        flight when deciding to write a request straight to the socket (module docstring).

        Raises:
            RemotingTimeoutError: no response within `timeout_ms`.
            RemotingConnectionLost: the connection closed first.
            RemotingTooManyRequestsError: too many requests are already waiting.
        """
        if self.closed:
            raise RemotingConnectionLost(f"connection to {self.remote_address} is closed")
        proto = self._proto
        waiter = _Waiter()
        parts = proto.start_request(cmd, waiter, long_poll)
        try:
            timeout = max(timeout_ms, 0) / 1000
            try:
                if self._writer_idle and proto.may_write_directly(long_poll):
                    # Few requests in flight (parked long polls aside) and nothing queued:
                    # write it now instead of waking the writer, a task switch on the way of
                    # every request of a sequential or lightly pipelined caller. Many
                    # concurrent callers still go through the writer, which joins them.
                    rest = self._write_direct(parts)
                    if rest is not None:
                        self._writer_idle = False
                        self._send_channel.send_nowait(rest)
                        self._unsent += _parts_size(rest)
                else:
                    # Fast path: room in the outbound queue; the timer task enforces the
                    # timeout.
                    self._writer_idle = False
                    self._send_channel.send_nowait(parts)
                    self._unsent += _parts_size(parts)
            except trio.WouldBlock:
                with trio.move_on_after(timeout):
                    await self._send_parts(parts)
                    await waiter.wait()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise RemotingConnectionLost(
                    f"connection to {self.remote_address} closed while sending"
                ) from None
            else:
                if proto.set_deadline(waiter, trio.current_time() + timeout):
                    self._timer_kick.set()
                await waiter.wait()
            response = waiter.response
            if response is not None:
                waiter.response = None  # the heap may hold the waiter a while: not the body
                return response
            if waiter.error is not None:
                raise waiter.error
            raise RemotingTimeoutError(
                f"no response from {self.remote_address} within {timeout_ms} ms"
                f" (code {cmd.code}, opaque {cmd.opaque})"
            )
        finally:
            proto.end_request(cmd, waiter, long_poll)

    async def _timer(self) -> None:
        """Expire requests whose deadline passed; sleeps until the earliest pending deadline."""
        proto = self._proto
        while True:
            for waiter in proto.expire(trio.current_time()):
                waiter.timed_out = True
                waiter.finish()
            if self._timer_kick.is_set():
                self._timer_kick = trio.Event()
            with trio.move_on_at(proto.next_deadline):
                await self._timer_kick.wait()

    async def invoke_oneway(self, cmd: RemotingCommand) -> None:
        """Send a request the peer will not answer (sets the oneway flag and `cmd.opaque`).

        Raises:
            RemotingConnectionLost: the connection is closed.
        """
        if self.closed:
            raise RemotingConnectionLost(f"connection to {self.remote_address} is closed")
        await self._send_parts(self._proto.oneway(cmd))

    def close(self) -> None:
        """Shut the connection down; pending requests fail with RemotingConnectionLost."""
        if self.closed:
            return
        self.closed = True
        self._close_reason = self._close_reason or "closed locally"
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    @property
    def close_reason(self) -> str | None:
        """Why the connection closed (None while open)."""
        return self._close_reason if self.closed else None

    async def wait_closed(self) -> None:
        """Wait until the connection's tasks have finished."""
        await self._done.wait()

    # -- running ------------------------------------------------------------
    async def run(self) -> None:
        """Serve the connection until either side closes it. Closes the stream on exit."""
        try:
            async with trio.open_nursery() as nursery:
                self._cancel_scope = nursery.cancel_scope
                self._nursery = nursery
                if self.closed:
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._writer)
                nursery.start_soon(self._timer)
                await self._reader(nursery)
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            if self._partial_budget is not None and self._partial_held:
                self._partial_budget.adjust(-self._partial_held)
                self._partial_held = 0
            if self._drained is not None:
                self._drained.set()
            self._send_channel.close()
            self._fail_pending()
            self._done.set()
            await trio.aclose_forcefully(self._stream if self._tls is None else self._tls)

    def _fail_pending(self) -> None:
        pending = self._proto.fail_all()
        if not pending:
            return
        message = f"connection to {self.remote_address} lost: {self._close_reason or 'closed'}"
        for waiter in pending:
            # One exception object per waiter: each is raised in a different task.
            waiter.error = RemotingConnectionLost(message)
            waiter.finish()

    async def _reader(self, nursery: trio.Nursery) -> None:
        proto = self._proto
        receive_data = proto.receive_data
        response_for = proto.response_for
        encode_response = proto.encode_response
        stream = self._stream
        table = self._processors
        lookup = table.get
        # Encoded answers of inline processors, written together per chunk of a run.
        out: list[bytes | Body] = []
        out_count = out_bytes = 0
        # Reads bypass `SocketStream.receive_some`, which tries the recv first and, on an idle
        # connection, takes a failing recv (an exception) before waiting, then yields twice
        # around the recv that succeeds. Here: after a short read (the socket was drained),
        # wait until readable, then one recv that succeeds; after a full buffer, read again
        # at once (after a checkpoint, for fairness): no failing recv and no extra yields per
        # wake-up (docs/design-notes.md, "Socket reads in the reader").
        # `fileno()` is -1 once the socket is closed: the read fails (EBADF), never reads
        # another file that took the number.
        sock = stream.socket
        wait_readable: Callable[[Any], Awaitable[object]] = trio.lowlevel.wait_readable
        read: Callable[[int, int], bytes] = os.read
        if self._tls is not None:
            # The same two steps through the SSLStream (`_TlsReads`): the plain path keeps
            # its raw socket reads, with no test per read.
            tls_reads = _TlsReads(self._tls)
            wait_readable = tls_reads.wait
            read = tls_reads.read
        drained = True
        partial = self._partial_budget
        while True:
            if partial is not None and self._partial_held and partial.over:
                # Too many bytes of incomplete frames over all connections: read no more of
                # this one's until others complete theirs (or the read timeout closes it).
                await partial.wait_room()
            try:
                if drained:
                    await wait_readable(sock)
                else:
                    await trio.lowlevel.checkpoint()
                data = read(sock.fileno(), _RECEIVE_SIZE)
            except BlockingIOError:  # readable, then nothing to read (it happens): wait again
                drained = True
                continue
            except (OSError, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
                self._close_reason = f"receive failed: {exc}"
                return
            drained = len(data) < _RECEIVE_SIZE
            if not data:
                self._close_reason = "peer closed the connection"
                return
            self.reads += 1
            try:
                commands = receive_data(data)
            except FrameError as exc:
                self._close_reason = f"bad frame: {exc}"
                log.warning(
                    "remoting_bad_frame", peer=self.remote_address, conn=self.id, error=str(exc)
                )
                return
            except Exception as exc:
                # A decoder defect: it costs this connection, never the server's other ones.
                self._close_reason = f"undecodable frame: {type(exc).__name__}: {exc}"
                log.exception("remoting_decoder_error", peer=self.remote_address, conn=self.id)
                return
            if partial is not None and proto.buffered != self._partial_held:
                held = proto.buffered
                partial.adjust(held - self._partial_held)
                self._partial_held = held
            woken = 0
            # The inline processors of this chunk run inside the table's run hooks, if any:
            # `end` before every await below (a write of answers, a yield) and at the end of
            # the chunk, `begin` again after an await (`remoting._processor`).
            hooks = table.run_hooks
            # Read once per chunk: the observer's cost is one clock reading per chunk and one
            # append per inline answer (nothing without an observer).
            observe = table.rpc_observer
            if observe is not None:
                self._read_at = read_at = rpc_clock()
            else:
                read_at = 0.0
            if hooks is not None:
                hooks.begin()
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    waiter = response_for(cmd)
                    if waiter is None:
                        log.debug(
                            "remoting_late_response",
                            peer=self.remote_address,
                            opaque=cmd.opaque,
                            code=cmd.code,
                        )
                        continue
                    waiter.response = cmd
                    waiter.finish()
                    woken += 1
                    if woken >= _RESPONSE_CHUNK:
                        # Let the requesters run (and their next requests leave) before
                        # the rest of the batch: see the module docstring.
                        woken = 0
                        if not await self._pause(out, hooks):
                            return
                        out_count = out_bytes = 0
                    continue
                if self._unsent > _UNSENT_HIGH or proto.busy >= proto.max_inflight:
                    # The peer is not reading its answers, or has as many requests in flight
                    # as allowed: take no more of its requests until the writer has written
                    # most of what is queued, or one of them is answered (send what is
                    # ready first).
                    if not await self._pause(out, hooks, wait=True):
                        return
                    out_count = out_bytes = 0
                entry = lookup(cmd.code)
                if entry is None or not entry[1]:
                    proto.admit()
                    nursery.start_soon(
                        self._handle, table.default if entry is None else entry[0], cmd, read_at
                    )
                    continue
                # Inline: run the coroutine to its end here, no task.
                coro = entry[0](self, cmd)
                try:
                    trap = coro.send(None)
                except StopIteration as stop:
                    result = stop.value
                except Exception as exc:
                    result = self._handler_failed(cmd, exc)
                else:
                    result = self._inline_suspended(cmd, coro, trap)
                if result is not None and not cmd.flag & FLAG_ONEWAY:
                    if observe is not None:
                        answered = self._answered
                        answered.append(cmd.code)
                        answered.append(result.code)
                    head, body = encode_response(cmd, result)
                    out.append(head)
                    out_bytes += len(head)
                    if body is not None:
                        out.append(body)
                        out_bytes += len(body)
                    out_count += 1
                    if out_count >= _ANSWER_CHUNK or out_bytes >= _ANSWER_CHUNK_BYTES:
                        if not await self._pause(out, hooks, checkpoint=False):
                            return
                        out_count = out_bytes = 0
            if hooks is not None and not self._end_run(hooks):
                return
            if out:
                await self._flush_batch(out)
                out.clear()
                out_count = out_bytes = 0

    async def _pause(
        self,
        out: list[bytes | Body],
        hooks: RunHooks | None,
        *,
        checkpoint: bool = True,
        wait: bool = False,
    ) -> bool:
        """The reader's await points within a chunk: end the run, write the answers collected
        in `out` (then empty it), and yield (`checkpoint`) or wait until the peer may send
        more requests (`wait`: its answers mostly written and a request slot free); then
        begin the run again. False when the run could not end (the connection closes;
        nothing of `out` was written)."""
        if hooks is not None and not self._end_run(hooks):
            return False
        if out:
            await self._flush_batch(out)
            out.clear()
        if wait:
            await self._wait_drained()
            await self._wait_room()
        elif checkpoint:
            await trio.lowlevel.checkpoint()
        if hooks is not None:
            hooks.begin()
        return True

    def _end_run(self, hooks: RunHooks) -> bool:
        """`hooks.end()`; False (and the connection marked for closing) if it raised."""
        try:
            hooks.end()
        except Exception as exc:
            self._close_reason = f"inline run failed: {exc}"
            log.exception("remoting_inline_run_failed", peer=self.remote_address, conn=self.id)
            return False
        return True

    def _inline_suspended(
        self, cmd: RemotingCommand, coro: Coroutine[Any, Any, object], trap: object
    ) -> RemotingCommand:
        """An inline processor suspended (a defect): end it without letting what it waited on
        wake the reader later, and answer SYSTEM_ERROR."""
        withdrawn = abandon(coro, trap)
        log.error(
            "remoting_inline_processor_suspended",
            peer=self.remote_address,
            code=cmd.code,
            opaque=cmd.opaque,
            withdrawn=withdrawn,
        )
        if not withdrawn:
            # Something may still wake the reader task: serve this peer no longer.
            self.close_with_reason("an inline processor suspended and could not be withdrawn")
        return cmd.make_response(
            ResponseCode.SYSTEM_ERROR, f"the processor of request code {cmd.code} suspended"
        )

    def _handler_failed(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        log.exception(
            "remoting_handler_failed",
            peer=self.remote_address,
            code=cmd.code,
            opaque=cmd.opaque,
        )
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    async def _flush_batch(self, out: list[bytes | Body]) -> None:
        answered = self._answered
        if answered:
            # Their answers are about to be written: tell the observer (it must not keep the
            # list, which is reused).
            observer = self._processors.rpc_observer
            if observer is not None:
                observer(answered, rpc_clock() - self._read_at)
            answered.clear()
        """Send the frames in `out` as one write: straight to the socket when the writer is
        idle (no task switch), else queued to the writer as one item."""
        rest = self._write_if_idle(out)
        if rest is not None:
            await self._queue(rest)

    def _write_now(self, frames: list[bytes | Body]) -> None:
        """Join `frames` and write them without waiting: straight to the socket when the writer
        is idle, else queued to it as one item."""
        rest = self._write_if_idle(frames)
        if rest is not None:
            self._send_nowait(rest)

    def _write_if_idle(self, frames: list[bytes | Body]) -> tuple[bytes, Body | None] | None:
        """Join `frames` and write them straight to the socket if the writer is idle; what
        is left for the writer, or None (all written, or the connection is closed)."""
        if self.closed:
            return None
        parts = _joined(frames)
        if not self._writer_idle:
            return parts
        return self._write_direct(parts)

    def _write_direct(self, parts: tuple[bytes, Body | None]) -> tuple[bytes, Body | None] | None:
        """Write a frame (or joined frames) to the socket now, without the writer.

        Only while the writer is idle (`_writer_idle`): nothing queued, not inside a write,
        so the byte stream stays in order. The socket is non-blocking: `os.write` sends what
        fits in the kernel buffer. Returns what is left for the writer, or None when all was
        written (or the connection failed and is closing).
        """
        head, body = parts
        data: Body = head if body is None else head + body
        try:
            sent = os.write(self._stream.socket.fileno(), data)
        except BlockingIOError:
            return b"", data
        except OSError as exc:
            self._close_reason = f"send failed: {exc}"
            self.close()
            return None
        if sent == len(data):
            return None
        return b"", memoryview(data)[sent:]

    async def _queue(self, parts: tuple[bytes, Body | None]) -> None:
        """Queue a frame for the writer (waits while the queue is full); dropped if closed."""
        self._writer_idle = False
        try:
            try:
                self._send_channel.send_nowait(parts)
            except trio.WouldBlock:
                await self._send_channel.send(parts)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return
        self._unsent += _parts_size(parts)

    async def _wait_drained(self) -> None:
        """Until the writer is down to `_UNSENT_LOW` queued bytes (or the connection closes)."""
        while self._unsent > _UNSENT_LOW and not self.closed:
            if self._drained is None:
                self._drained = trio.Event()
            await self._drained.wait()

    def _written(self, size: int) -> None:
        self._unsent -= size
        if self._drained is not None and self._unsent <= _UNSENT_LOW:
            self._drained.set()
            self._drained = None

    async def _writer(self) -> None:
        receive = self._receive_channel
        # Over TLS the writer is the only one to write (the SSLStream's send_all): it never
        # says it is idle, so no one writes around it to the raw socket.
        may_write_around = self._tls is None
        send_all = self._send_all if self._tls is None else self._tls.send_all
        try:
            while True:
                # Take what is queued without a scheduler round trip; wait only when empty.
                try:
                    head, body = receive.receive_nowait()
                except trio.WouldBlock:
                    self._writer_idle = may_write_around
                    try:
                        head, body = await receive.receive()
                    except trio.EndOfChannel:
                        return
                    finally:
                        self._writer_idle = False
                if body is None and len(head) >= _COALESCE_BYTES:
                    await send_all(head)
                    self._written(len(head))
                    continue
                parts: list[bytes | Body] = [head]
                size = len(head)
                if body is not None:
                    parts.append(body)
                    size += len(body)
                while size < _COALESCE_BYTES:
                    try:
                        head, body = receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                    parts.append(head)
                    size += len(head)
                    if body is not None:
                        parts.append(body)
                        size += len(body)
                await send_all(parts[0] if len(parts) == 1 else b"".join(parts))
                self._written(size)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._close_reason = f"send failed: {exc}"
        finally:
            # Whatever ends the writer ends the connection.
            self.closed = True
            if self._cancel_scope is not None:
                self._cancel_scope.cancel()

    async def _send_all(self, data: Body) -> None:
        """Write all of `data` (the writer's send): non-blocking writes, waiting until the
        socket is writable only when its buffer is full.

        `SocketStream.send_all` yields to the scheduler after every successful send, one more
        task step per write for a writer that yields anyway when its queue is empty.

        Raises:
            trio.BrokenResourceError: the write failed (peer gone, socket closed).
        """
        sock = self._stream.socket
        view = memoryview(data)
        while True:
            try:
                sent = os.write(sock.fileno(), view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
            if sent == len(view):
                return
            view = view[sent:]
            await trio.lowlevel.wait_writable(sock)

    async def _handle(
        self, processor: Processor | None, cmd: RemotingCommand, read_at: float = 0.0
    ) -> None:
        """A request in a task of its own (counted in flight by the reader); `read_at`: when
        its read arrived (the RPC observer's start, 0.0 without one)."""
        # Each request runs in its own task, hence its own context copy: what is bound here is
        # seen by every log line of the processor and vanishes with the task.
        _bind_contextvars(peer=self.remote_address, code=cmd.code, opaque=cmd.opaque)
        try:
            response: RemotingCommand | None
            if processor is None:
                response = cmd.make_response(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f" request type {cmd.code} not supported",
                )
            else:
                try:
                    response = await processor(self, cmd)
                except Exception as exc:
                    response = self._handler_failed(cmd, exc)
            await self._respond(cmd, response)
            observer = self._processors.rpc_observer
            if observer is not None and read_at and response is not None and not cmd.is_oneway:
                observer((cmd.code, response.code), rpc_clock() - read_at)
        finally:
            self._release()

    def _answer_later(
        self, cmd: RemotingCommand, response: RemotingCommand | None, direct: bool
    ) -> None:
        """`Responder.respond`: free the request's slot and send its answer without waiting.

        Like a task processor's answer, it is written straight to the socket when it is the
        only request in flight and the writer is idle, else queued to the writer, which joins
        the answers released together into one send. `direct` writes it straight whenever the
        writer is idle, other requests in flight or not: for answers released one at a time
        (a held pull woken by one arrival), where waking the writer would cost a task switch
        for nothing to join. A None answer, a oneway request or a closed connection sends
        nothing.
        """
        self._release()
        if self.closed or response is None or cmd.flag & FLAG_ONEWAY:
            return
        parts = self._proto.encode_response(cmd, response)
        if self._writer_idle and (direct or self._proto.busy == 0):
            rest = self._write_direct(parts)
            if rest is None:
                return
            parts = rest
        self._send_nowait(parts)

    def _answer_many(
        self, answers: Sequence[tuple[RemotingCommand, RemotingCommand | None]]
    ) -> None:
        """`Responder.respond_all` for this connection's requests: free their slots and send
        their answers as one write (straight to the socket when the writer is idle, else
        queued to it as one item)."""
        for _ in answers:
            self._release()
        if self.closed:
            return
        frames: list[bytes | Body] = []
        add = frames.append
        for cmd, response in answers:
            if response is None or cmd.flag & FLAG_ONEWAY:
                continue
            head, body = self._proto.encode_response(cmd, response)
            add(head)
            if body is not None:
                add(body)
        if frames:
            self._write_now(frames)

    def _send_nowait(self, parts: tuple[bytes, Body | None]) -> None:
        """Queue `parts` for the writer from synchronous code (never waits)."""
        self._writer_idle = False
        try:
            self._send_channel.send_nowait(parts)
        except trio.WouldBlock:
            # The outbound queue is full: wait for room in a task of the connection.
            if self._nursery is not None:
                self._nursery.start_soon(self._queue, parts)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        else:
            self._unsent += _parts_size(parts)

    async def _respond(self, cmd: RemotingCommand, response: RemotingCommand | None) -> None:
        if response is None or cmd.flag & FLAG_ONEWAY:
            return
        parts = self._proto.encode_response(cmd, response)
        # The only request in flight (a sequential client): write now rather than wake the
        # writer. With more, the writer joins their answers into fewer sends.
        if self._writer_idle and self._proto.busy == 1:
            rest = self._write_direct(parts)
            if rest is None:
                return
            parts = rest
        await self._queue(parts)

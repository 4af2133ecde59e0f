"""How a `Connection` runs the processors of its `ProcessorTable`: inline processors answered
by the reader itself (batches written at once, inside the run hooks), task processors in tasks
of their own, the default processor, and the reader's and writer's socket handling.

A `Connection` serves one end of a unix socketpair; the test drives the other end with raw
frames, so what goes over the wire (and how many writes) is visible.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import structlog
import trio
import trio.lowlevel
import trio.testing
from structlog.testing import capture_logs

from remoting import (
    FLAG_ONEWAY,
    Connection,
    FrameDecoder,
    Processor,
    ProcessorTable,
    RemotingCommand,
    ResponseCode,
    RunHooks,
    encode_frame,
)

INLINE = 1
SLOW_INLINE = 2
BOOM = 3
PLAIN_SLOW = 4
PARK = 5
UNKNOWN = 99


class Peer:
    """The raw end of the socketpair: sends frames, reads answers."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.decoder = FrameDecoder()
        self.received: list[RemotingCommand] = []

    async def send(self, *cmds: RemotingCommand) -> None:
        data = b"".join(encode_frame(c) for c in cmds)
        while data:
            n = await self.sock.send(data)
            data = data[n:]

    async def receive(self, count: int) -> list[RemotingCommand]:
        while len(self.received) < count:
            data = await self.sock.recv(65536)
            assert data, "connection closed"
            self.received.extend(self.decoder.feed(data))
        got, self.received = self.received[:count], self.received[count:]
        return got


def processor_table(
    inline: Mapping[int, Processor],
    plain: Mapping[int, Processor] | None = None,
    *,
    default: Processor | None = None,
    hooks: RunHooks | None = None,
) -> ProcessorTable:
    """A table with the `inline` processors registered inline, the `plain` ones as task
    processors, and the given default processor and run hooks."""
    table = ProcessorTable()
    for code, processor in inline.items():
        table.register(code, processor, inline=True)
    for code, processor in (plain or {}).items():
        table.register(code, processor)
    if default is not None:
        table.set_default(default)
    if hooks is not None:
        table.set_run_hooks(hooks.begin, hooks.end)
    return table


@asynccontextmanager
async def serve(
    inline: Mapping[int, Processor],
    plain: Mapping[int, Processor] | None = None,
    *,
    default: Processor | None = None,
    hooks: RunHooks | None = None,
    max_inflight: int = 64,
) -> AsyncIterator[tuple[Connection, Peer]]:
    """A running `Connection` with those processors (`processor_table`), and its peer."""
    a, b = trio.socket.socketpair()
    conn = Connection(
        trio.SocketStream(a),
        processor_table(inline, plain, default=default, hooks=hooks),
        max_frame_size=1 << 20,
        outbound_queue_size=64,
        max_inflight=max_inflight,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        try:
            yield conn, Peer(b)
        finally:
            conn.close()
            b.close()


def request(code: int, opaque: int, body: bytes = b"") -> RemotingCommand:
    cmd = RemotingCommand.request(code, {"n": str(opaque)}, body or None)
    cmd.opaque = opaque
    return cmd


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(body=cmd.body)


def busy(conn: Connection) -> bool:
    """`conn.busy`: a request of the peer in flight (read through a call, which mypy does not
    narrow from one assertion to the next)."""
    return conn.busy


def task_name() -> str:
    return trio.lowlevel.current_task().name


def in_reader(name: str) -> bool:
    """The task is the connection's own (the reader runs in `Connection.run`)."""
    return name.endswith("Connection.run")


def in_processor_task(name: str) -> bool:
    """The task is one spawned for a request (`Connection._handle`)."""
    return name.endswith("Connection._handle")


def record_writers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the name of the task making each `os.write` (the socket writes of a
    `Connection`: by its writer task, or straight from the task that has the frame)."""
    writers: list[str] = []
    real_write = os.write

    def recording_write(fd: int, data: Any) -> int:
        writers.append(task_name())
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    return writers


def record_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of each `os.write` (a `Connection`'s socket writes)."""
    writes: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    return writes


def record_run(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], RunHooks]:
    """Run hooks and the socket writes, recorded in one list of events."""
    events: list[str] = []
    real_write = os.write

    def recording_write(fd: int, data: Any) -> int:
        events.append("write")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    return events, RunHooks(lambda: events.append("begin"), lambda: events.append("end"))


# ------------------------------------------------------------------------ inline processors
async def test_inline_answer_runs_in_the_reader_without_a_task_or_log_context() -> None:
    """An inline processor runs in the connection's own task (no task per request), without
    the per-request log context; its answer goes back with the request's opaque."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def echo_seen(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append((task_name(), structlog.contextvars.get_contextvars()))
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo_seen}) as (conn, peer):
        await peer.send(request(INLINE, 7, b"hello"))
        [resp] = await peer.receive(1)
        assert not busy(conn)  # an inline processor holds no request slot
    assert resp.opaque == 7
    assert resp.is_response
    assert resp.code == ResponseCode.SUCCESS
    assert resp.body == b"hello"
    [(name, ctx)] = seen
    assert in_reader(name)
    assert "opaque" not in ctx


async def test_an_inline_processor_that_suspends_is_answered_system_error_and_serving_goes_on() -> (
    None
):
    """An inline processor that awaits something that suspends is closed at that point (it
    never resumes), its request is answered SYSTEM_ERROR saying so and the event is logged;
    the requests after it, in the same read and later, are served as usual."""
    left: list[int] = []

    async def suspends(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            await trio.lowlevel.checkpoint()
        finally:
            left.append(cmd.opaque)
        raise AssertionError("resumed after suspending")

    async with serve({SLOW_INLINE: suspends, INLINE: echo}) as (conn, peer):
        with capture_logs() as logs:
            await peer.send(request(SLOW_INLINE, 1), request(INLINE, 2, b"same read"))
            answers = {r.opaque: r for r in await peer.receive(2)}
        assert left == [1]  # closed at the suspension
        assert not busy(conn)
        await peer.send(request(INLINE, 3, b"later"))
        [later] = await peer.receive(1)
        assert not conn.closed
    assert answers[1].code == ResponseCode.SYSTEM_ERROR
    assert "suspended" in (answers[1].remark or "")
    assert (answers[2].code, answers[2].body) == (ResponseCode.SUCCESS, b"same read")
    assert (later.opaque, later.code, later.body) == (3, ResponseCode.SUCCESS, b"later")
    suspended = [e for e in logs if e["event"] == "remoting_inline_processor_suspended"]
    assert [(e["code"], e["opaque"]) for e in suspended] == [(SLOW_INLINE, 1)]


async def test_a_suspended_inline_processor_leaves_nothing_that_wakes_the_reader_later() -> None:
    """What a suspended inline processor waited on (an event, a lock) is withdrawn as trio
    withdraws a cancelled wait, also a wait it starts while unwinding (a `finally` that
    awaits): setting that event later wakes nothing, and the connection serves on."""
    event = trio.Event()
    lock = trio.Lock()
    unwound: list[str] = []

    async def waits(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await event.wait()
        raise AssertionError("resumed")

    async def locks(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await lock.acquire()
        raise AssertionError("resumed")

    async def cleans_up(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            await trio.lowlevel.checkpoint()
        finally:
            await event.wait()  # a wait started while unwinding
            unwound.append("never")
        raise AssertionError("resumed")

    processors = {SLOW_INLINE: waits, BOOM: cleans_up, PARK: locks, INLINE: echo}
    async with serve(processors) as (conn, peer):
        await lock.acquire()
        with capture_logs() as logs:
            await peer.send(request(SLOW_INLINE, 1), request(BOOM, 2), request(PARK, 4))
            answers = {r.opaque: r for r in await peer.receive(3)}
        assert [answers[i].code for i in (1, 2, 4)] == [ResponseCode.SYSTEM_ERROR] * 3
        event.set()  # nothing registered on it any more: the reader is not woken
        lock.release()
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(request(INLINE, 3, b"after"))
        [after] = await peer.receive(1)
        assert (after.opaque, after.body) == (3, b"after")
        assert not conn.closed
    assert unwound == []
    suspended = [e for e in logs if e["event"] == "remoting_inline_processor_suspended"]
    assert [(e["opaque"], e["withdrawn"]) for e in suspended] == [(1, True), (2, True), (4, True)]


async def test_processor_exceptions_become_system_error() -> None:
    """An exception raised by an inline or a task processor answers its request
    SYSTEM_ERROR, with the exception in the remark."""

    async def boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("inline blew up")

    async def task_boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        raise KeyError("task blew up")

    async with serve({BOOM: boom}, {PLAIN_SLOW: task_boom}) as (_conn, peer):
        await peer.send(request(BOOM, 1), request(PLAIN_SLOW, 2))
        answers = {r.opaque: r for r in await peer.receive(2)}
    assert answers[1].code == ResponseCode.SYSTEM_ERROR
    assert answers[1].remark == "RuntimeError: inline blew up"
    assert answers[2].code == ResponseCode.SYSTEM_ERROR
    assert "task blew up" in (answers[2].remark or "")


async def test_answers_of_one_batch_leave_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inline answers to requests read together leave in one write."""
    writes = record_writes(monkeypatch)

    async with serve({INLINE: echo}) as (_conn, peer):
        await trio.testing.wait_all_tasks_blocked()  # the writer is idle
        await peer.send(*(request(INLINE, i, b"x" * 100) for i in range(5)))
        answers = await peer.receive(5)
    assert sorted(r.opaque for r in answers) == list(range(5))
    assert len(writes) == 1


async def test_a_long_batch_is_answered_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipelining peer's window arrives in one read; its answers leave every 16 requests
    (and by size), so the peer can work on the first answers while the rest are handled."""
    writes = record_writes(monkeypatch)
    readable_at_17th: list[int] = []
    peers: list[Peer] = []

    async def echo_peeking(c: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.opaque == 16:
            # What the peer could already read while this 17th request is handled.
            try:
                raw = socket.socket(fileno=peers[0].sock.fileno())
                try:
                    peeked = raw.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                finally:
                    raw.detach()
                readable_at_17th.append(len(peeked))
            except BlockingIOError:
                readable_at_17th.append(0)
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo_peeking}) as (_conn, peer):
        peers.append(peer)
        await trio.testing.wait_all_tasks_blocked()  # the writer is idle
        await peer.send(*(request(INLINE, i, b"x" * 100) for i in range(40)))
        answers = await peer.receive(40)
        assert sorted(r.opaque for r in answers) == list(range(40))
        assert len(writes) == 3  # 16 + 16 + 8
        assert readable_at_17th[0] == writes[0] > 0

        # Large answers leave once 64 KiB are ready: 40 KiB each, so after every second one.
        writes.clear()
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(*(request(INLINE, i, b"y" * 40_000) for i in range(3)))
        answers = await peer.receive(3)
        assert sorted(r.opaque for r in answers) == [0, 1, 2]
        assert len(writes) == 2


async def test_batch_queued_to_a_busy_writer_as_one_item() -> None:
    """With the writer busy, the reader queues a batch's answers to it; they all arrive."""
    async with serve({INLINE: echo}) as (conn, peer):
        await trio.testing.wait_all_tasks_blocked()
        conn._writer_idle = False  # as if the writer were inside send_all
        await peer.send(*(request(INLINE, i) for i in range(3)))
        answers = await peer.receive(3)
    assert sorted(r.opaque for r in answers) == [0, 1, 2]


async def test_oneway_inline_request_gets_no_answer() -> None:
    """A oneway request's inline answer is not sent."""
    async with serve({INLINE: echo}) as (_conn, peer):
        oneway = request(INLINE, 1)
        oneway.flag |= FLAG_ONEWAY
        await peer.send(oneway, request(INLINE, 2))
        [resp] = await peer.receive(1)
    assert resp.opaque == 2


async def test_answer_to_a_vanished_peer_closes_the_connection() -> None:
    """An answer that cannot be written to a peer gone closes the connection."""

    async def big(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"y" * 200_000)

    async with serve({INLINE: big}) as (conn, peer):
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(request(INLINE, 1))
        peer.sock.close()
        with trio.fail_after(5):
            await conn.wait_closed()
    assert conn.closed


# ------------------------------------------------------------------------ task processors
async def test_task_processor_runs_in_a_task_with_the_log_context() -> None:
    """A task processor runs in a task of its own, with the request's peer, code and opaque
    bound in the log context; it may await, and the inline requests after it do not wait."""
    release = trio.Event()
    seen: list[tuple[str, dict[str, Any]]] = []

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        seen.append((task_name(), structlog.contextvars.get_contextvars()))
        return cmd.make_response(body=b"late")

    async def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"now")

    async with serve({INLINE: fast}, {PLAIN_SLOW: slow}) as (conn, peer):
        await peer.send(request(PLAIN_SLOW, 1), request(INLINE, 2))
        [first] = await peer.receive(1)
        assert (first.opaque, first.body) == (2, b"now")  # the inline one did not wait
        release.set()
        [second] = await peer.receive(1)
    assert (second.opaque, second.body) == (1, b"late")
    [(name, ctx)] = seen
    assert in_processor_task(name)
    assert ctx["peer"] == conn.remote_address
    assert ctx["code"] == PLAIN_SLOW
    assert ctx["opaque"] == 1


async def test_inline_and_task_processors_answer_out_of_order() -> None:
    """Answers leave as they are ready, whatever the order of their requests."""
    release = trio.Event()

    async def plain_slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.make_response(body=b"plain")

    async def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"inline")

    async with serve({INLINE: fast}, {PLAIN_SLOW: plain_slow}) as (_conn, peer):
        await peer.send(request(PLAIN_SLOW, 1), request(INLINE, 2), request(INLINE, 3))
        early = await peer.receive(2)
        assert sorted((r.opaque, r.body) for r in early) == [(2, b"inline"), (3, b"inline")]
        release.set()
        [late] = await peer.receive(1)
    assert (late.opaque, late.body) == (1, b"plain")


async def test_inflight_limit_holds_for_task_processors() -> None:
    """A request in a task holds a slot until answered: at `max_inflight` the reader takes
    no further request (inline or not) until a slot is free again."""
    release = trio.Event()
    calls: list[int] = []

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        calls.append(cmd.opaque)
        await release.wait()
        return cmd.make_response()

    async def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        calls.append(cmd.opaque)
        return cmd.make_response()

    async with serve({INLINE: fast}, {PLAIN_SLOW: slow}, max_inflight=1) as (conn, peer):
        await peer.send(
            request(INLINE, 1), request(PLAIN_SLOW, 2), request(PLAIN_SLOW, 3), request(INLINE, 4)
        )
        # The answer made before the reader had to wait is not held back.
        [first] = await peer.receive(1)
        assert first.opaque == 1
        await trio.testing.wait_all_tasks_blocked()
        # 2 runs in its task and holds the only slot: the reader stops before 3.
        assert calls == [1, 2]
        assert busy(conn)
        release.set()
        rest = await peer.receive(3)
        await trio.testing.wait_all_tasks_blocked()
        assert not busy(conn)
    assert sorted(r.opaque for r in rest) == [2, 3, 4]
    assert calls == [1, 2, 3, 4]


async def test_peer_gone_while_a_task_processor_waits_closes_cleanly() -> None:
    """The peer closing while a task processor waits ends the connection (the task is
    cancelled with it)."""
    started = trio.Event()

    async def park(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async with serve({}, {PLAIN_SLOW: park}) as (conn, peer):
        await peer.send(request(PLAIN_SLOW, 1))
        await started.wait()
        peer.sock.close()
        with trio.fail_after(5):
            await conn.wait_closed()
    assert conn.close_reason == "peer closed the connection"


async def test_the_default_processor_handles_unknown_codes_in_a_task() -> None:
    """A request whose code has no processor goes to the table's default processor, in a
    task; registered codes still go to their own processors."""
    seen: list[str] = []

    async def fallback(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(task_name())
        return cmd.make_response(remark=f"default {cmd.code}")

    async with serve({INLINE: echo}, default=fallback) as (_conn, peer):
        await peer.send(request(UNKNOWN, 1), request(INLINE, 2, b"own"))
        answers = {r.opaque: r for r in await peer.receive(2)}
    assert (answers[1].code, answers[1].remark) == (ResponseCode.SUCCESS, f"default {UNKNOWN}")
    assert (answers[2].code, answers[2].body) == (ResponseCode.SUCCESS, b"own")
    [name] = seen
    assert in_processor_task(name)


async def test_an_unknown_code_without_a_default_processor_is_not_supported() -> None:
    """Without a default processor, a request whose code has no processor is answered
    REQUEST_CODE_NOT_SUPPORTED, naming the code."""
    async with serve({INLINE: echo}) as (conn, peer):
        await peer.send(request(UNKNOWN, 1))
        [resp] = await peer.receive(1)
        await trio.testing.wait_all_tasks_blocked()
        assert not busy(conn)
    assert resp.opaque == 1
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert str(UNKNOWN) in (resp.remark or "")


# ------------------------------------------------------------------------ direct writes
async def test_sequential_invoke_and_a_task_processors_answer_skip_the_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sequential caller's request is written by the calling task and the answer of the
    task processor by its task: the writer task is never woken."""
    writers = record_writers(monkeypatch)

    async def plain(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        return cmd.make_response(body=b"plain")

    a, b = trio.socket.socketpair()
    kw: dict[str, Any] = {"max_frame_size": 1 << 20, "outbound_queue_size": 8, "max_inflight": 8}
    server = Connection(trio.SocketStream(a), processor_table({}, {PLAIN_SLOW: plain}), **kw)
    client = Connection(trio.SocketStream(b), ProcessorTable(), **kw)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(3):
            resp = await client.invoke(request(PLAIN_SLOW, 0, b"q%d" % i))
            assert resp.body == b"plain"
            await trio.testing.wait_all_tasks_blocked()
        client.close()
        server.close()
    # One request and one (task processor's) answer per call, each written directly: by the
    # caller and by the processor's task, never by a writer.
    assert len(writers) == 6
    assert by_writer_task(writers) == []


@asynccontextmanager
async def parked_pair(
    parked: int, long_poll: bool
) -> AsyncIterator[tuple[Connection, list[str], Callable[[], Awaitable[None]]]]:
    """A client `Connection` to a server that parks PARK requests (as a broker parks pulls)
    and answers INLINE ones from its reader, with `parked` PARK requests parked (marked as
    long polls or not). Yields the client, the names of the tasks writing to either socket
    (from when the requests are parked) and a function parking one more request."""
    release = trio.Event()

    async def park(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.make_response(body=b"pulled")

    async def sent(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"sent")  # answered by the reader, as the broker does

    a, b = trio.socket.socketpair()
    kw: dict[str, Any] = {"max_frame_size": 1 << 20, "outbound_queue_size": 8, "max_inflight": 16}
    server = Connection(trio.SocketStream(a), processor_table({INLINE: sent}, {PARK: park}), **kw)
    client = Connection(trio.SocketStream(b), ProcessorTable(), **kw)
    pulled: list[bytes] = []

    async def pull() -> None:
        resp = await client.invoke(request(PARK, 0), timeout_ms=10_000, long_poll=long_poll)
        pulled.append(bytes(resp.body or b""))

    async def park_one() -> None:
        nursery.start_soon(pull)
        await trio.testing.wait_all_tasks_blocked()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.run)
            nursery.start_soon(client.run)
            await trio.testing.wait_all_tasks_blocked()  # both writers idle
            for _ in range(parked):
                await park_one()
            assert client._proto.waiting == parked
            with pytest.MonkeyPatch.context() as mp:
                yield client, record_writers(mp), park_one
            release.set()
            while client._proto.waiting:  # every parked request answered
                await trio.sleep(0.01)
            assert set(pulled) <= {b"pulled"}
            client.close()
            server.close()


async def send_three(client: Connection, writers: list[str]) -> list[str]:
    """Three sequential INLINE requests; the names of the tasks that wrote them and their
    answers."""
    for i in range(3):
        resp = await client.invoke(request(INLINE, 0, b"s%d" % i))
        assert resp.body == b"sent"
        await trio.testing.wait_all_tasks_blocked()
    return list(writers)


def by_writer_task(writers: list[str]) -> list[str]:
    return [name for name in writers if name.endswith("._writer")]


@pytest.mark.parametrize("parked", [0, 3])
async def test_a_request_with_few_others_in_flight_skips_the_writer(parked: int) -> None:
    """A lightly pipelined caller: each request is written by the task that makes it, and each
    answer by the server's reader; no writer task is woken."""
    async with parked_pair(parked, long_poll=False) as (client, writers, _):
        sends = await send_three(client, writers)
    assert len(sends) == 6
    assert by_writer_task(sends) == []


async def test_a_request_with_many_others_in_flight_goes_through_the_writer() -> None:
    """With more than `_DIRECT_MAX_OTHERS` others in flight the request is queued to the
    writer, which joins requests issued together."""
    async with parked_pair(4, long_poll=False) as (client, writers, _):
        sends = await send_three(client, writers)
    assert len(by_writer_task(sends)) == 3  # the requests; the answers still by the reader


async def test_parked_long_polls_do_not_count_as_requests_in_flight() -> None:
    """A push consumer keeps a pull parked per queue (8 here): its other requests, and each
    pull re-issued beside the parked ones, are still written at once by their tasks."""
    async with parked_pair(8, long_poll=True) as (client, writers, park_one):
        sends = await send_three(client, writers)
        writers.clear()
        await park_one()
        ninth = list(writers)
    assert len(sends) == 6
    assert by_writer_task(sends) == []
    assert len(ninth) == 1
    assert by_writer_task(ninth) == []


# ------------------------------------------------------------------------ socket handling
async def test_the_writer_writes_frames_larger_than_the_socket_buffer() -> None:
    """Queued frames of several MiB: the writer writes what fits, waits until the socket is
    writable again, and goes on; the peer gets every byte in order."""
    bodies = [os.urandom(3 * 1024 * 1024), os.urandom(5 * 1024 * 1024 + 7)]
    async with serve({}) as (conn, peer):
        peer.decoder = FrameDecoder(16 << 20)
        with trio.fail_after(20):
            for i, body in enumerate(bodies):
                await conn.send(request(INLINE, i, body))
            got = await peer.receive(2)
    assert [c.body for c in got] == bodies
    assert [c.opaque for c in got] != [None, None]


async def test_a_failed_write_closes_the_connection() -> None:
    """The peer stops reading for good (its read side shut down): the writer's write fails and
    the connection closes, with the write failure as its reason."""
    async with serve({}) as (conn, peer):
        peer.sock.shutdown(socket.SHUT_RD)
        with trio.fail_after(10):
            for i in range(4):
                if conn.closed:
                    break
                with contextlib.suppress(Exception):
                    await conn.send(request(INLINE, i, os.urandom(1024 * 1024)))
            await conn.wait_closed()
        assert (conn.close_reason or "").startswith("send failed")


async def test_reader_reads_frames_over_several_reads_and_sees_the_peer_close() -> None:
    """The reader reads the socket itself: a frame larger than its buffer (256 KiB) comes in
    full-buffer reads, read again at once; after a short read it waits until readable."""
    big = os.urandom(700 * 1024)
    async with serve({INLINE: echo}) as (conn, peer):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.send, request(INLINE, 1, big), request(INLINE, 2, b"small"))
            first, second = await peer.receive(2)
        assert (first.opaque, first.body) == (1, big)
        assert (second.opaque, second.body) == (2, b"small")
        await trio.testing.wait_all_tasks_blocked()  # the reader waits on an idle socket
        peer.sock.close()
        with trio.fail_after(5):
            await conn.wait_closed()
        assert conn.close_reason == "peer closed the connection"


async def test_reader_waiting_on_an_idle_socket_stops_at_a_local_close() -> None:
    """A local close ends a reader waiting on an idle socket."""
    async with serve({}) as (conn, _peer):
        await trio.testing.wait_all_tasks_blocked()
        conn.close()
        with trio.fail_after(5):
            await conn.wait_closed()
        assert conn.close_reason == "closed locally"


async def test_requesters_run_while_a_batch_of_responses_is_handed_out() -> None:
    """A window of answers arriving in one read (a group commit answers a whole window at
    once): the reader yields after waking every few requesters, so they run, and a pipelining
    caller's next requests leave, before the reader has worked through the whole batch."""
    count = 24
    seen: list[int] = []
    async with serve({}) as (conn, peer):

        async def call(i: int) -> None:
            resp = await conn.invoke(request(INLINE, 0, b"%d" % i), timeout_ms=5000)
            assert resp.body == b"%d" % i
            # Requests whose answers the reader has not handed out yet (private, on purpose:
            # nothing public tells how far into its batch the reader is).
            seen.append(conn._proto.waiting)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(call, i)
                requests = await peer.receive(count)
                await peer.send(*(r.make_response(body=r.body) for r in requests))
    assert len(seen) == count
    # Without the yields every requester ran after the last answer was handed out (all 0).
    assert max(seen) >= 8


# ------------------------------------------------------------------------ run hooks
async def test_the_run_ends_before_the_answers_of_its_run_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of inline processors is bracketed by begin/end, and end comes before the write of
    their answers, also at the 16-answer chunk boundary."""
    events, hooks = record_run(monkeypatch)

    async def echo_event(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        events.append("h")
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo_event}, hooks=hooks) as (_conn, peer):
        await trio.testing.wait_all_tasks_blocked()  # the writer is idle
        await peer.send(*(request(INLINE, i) for i in range(3)))
        await peer.receive(3)
        assert events == ["begin", "h", "h", "h", "end", "write"]
        events.clear()
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(*(request(INLINE, i) for i in range(20)))
        await peer.receive(20)
    run = ["begin", *["h"] * 16, "end", "write", "begin", *["h"] * 4, "end", "write"]
    assert events == run


async def test_the_run_ends_after_a_run_without_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Oneway requests answer nothing: the run still ends before the reader waits again."""
    events, hooks = record_run(monkeypatch)

    async def sink(conn: Connection, cmd: RemotingCommand) -> None:
        events.append("h")

    async with serve({INLINE: sink}, hooks=hooks) as (_conn, peer):
        await trio.testing.wait_all_tasks_blocked()
        oneway = [request(INLINE, i) for i in range(2)]
        for cmd in oneway:
            cmd.flag |= FLAG_ONEWAY
        await peer.send(*oneway)
        await trio.testing.wait_all_tasks_blocked()
    assert events == ["begin", "h", "h", "end"]


async def test_task_processors_run_after_the_run_ends() -> None:
    """Task processors of requests read with inline ones start only once the run ended; the
    run brackets the inline processors only."""
    events: list[str] = []

    async def task(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        events.append("task")
        return cmd.make_response(body=cmd.body)

    async def inline(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        events.append("h")
        return cmd.make_response(body=cmd.body)

    hooks = RunHooks(lambda: events.append("begin"), lambda: events.append("end"))
    async with serve({INLINE: inline}, {PLAIN_SLOW: task}, hooks=hooks) as (_conn, peer):
        await peer.send(
            request(PLAIN_SLOW, 1, b"a"), request(INLINE, 2, b"b"), request(PLAIN_SLOW, 3, b"c")
        )
        answers = await peer.receive(3)
    assert sorted((a.opaque, a.body) for a in answers) == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert events == ["begin", "h", "end", "task", "task"]


async def test_a_failing_run_end_closes_without_writing_the_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If the end hook raises, the connection closes and the run's answers are never
    written."""
    events, _ = record_run(monkeypatch)

    def fail() -> None:
        raise OSError(5, "Input/output error")

    async with serve({INLINE: echo}, hooks=RunHooks(lambda: None, fail)) as (conn, peer):
        await peer.send(request(INLINE, 1))
        with trio.fail_after(5):
            await conn.wait_closed()
            assert await peer.sock.recv(100) == b""  # closed, no answer
    assert "write" not in events
    assert "inline run failed" in (conn.close_reason or "")

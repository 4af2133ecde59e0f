"""Inline processors of `Connection`: answered by the reader itself, batches written at once.

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

from remoting import (
    FLAG_ONEWAY,
    Connection,
    FrameDecoder,
    Handler,
    InlineBatch,
    InlineHandler,
    RemotingCommand,
    ResponseCode,
    encode_frame,
)

INLINE = 1
SLOW_INLINE = 2
BOOM = 3
PLAIN_SLOW = 4
PARK = 5


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


@asynccontextmanager
async def serve(
    inline: Mapping[int, InlineHandler],
    plain: Mapping[int, Handler] | None = None,
    *,
    max_inflight: int = 64,
    inline_batch: InlineBatch | None = None,
) -> AsyncIterator[tuple[Connection, Peer]]:
    a, b = trio.socket.socketpair()
    conn = Connection(
        trio.SocketStream(a),
        plain or {},
        inline_processors=inline,
        max_frame_size=1 << 20,
        outbound_queue_size=64,
        max_inflight=max_inflight,
        inline_batch=inline_batch,
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


def task_name() -> str:
    return trio.lowlevel.current_task().name


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


async def test_inline_answer_runs_in_the_reader_without_a_task() -> None:
    seen: list[str] = []

    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(task_name())
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo}) as (_conn, peer):
        await peer.send(request(INLINE, 7, b"hello"))
        [resp] = await peer.receive(1)
    assert resp.opaque == 7
    assert resp.is_response
    assert resp.code == ResponseCode.SUCCESS
    assert resp.body == b"hello"
    # Called by the connection's own task (the reader runs in `Connection.run`), not a
    # spawned `_handle*` task.
    assert seen
    assert seen[0].endswith("Connection.run")


async def test_inline_returning_a_coroutine_is_awaited_in_a_task_with_log_context() -> None:
    release = trio.Event()
    seen: list[tuple[str, dict[str, Any]]] = []

    def slow(conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        async def later() -> RemotingCommand:
            await release.wait()
            seen.append((task_name(), structlog.contextvars.get_contextvars()))
            return cmd.make_response(body=b"late")

        return later()

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"now")

    async with serve({SLOW_INLINE: slow, INLINE: fast}) as (_conn, peer):
        await peer.send(request(SLOW_INLINE, 1), request(INLINE, 2))
        [first] = await peer.receive(1)
        assert (first.opaque, first.body) == (2, b"now")  # the fast one did not wait
        release.set()
        [second] = await peer.receive(1)
    assert (second.opaque, second.body) == (1, b"late")
    name, ctx = seen[0]
    assert "_handle_awaitable" in name
    assert ctx["code"] == SLOW_INLINE
    assert ctx["opaque"] == 1


async def test_inline_exception_becomes_system_error() -> None:
    def boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("inline blew up")

    def slow_boom(conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        async def later() -> RemotingCommand:
            raise KeyError("async part blew up")

        return later()

    async with serve({BOOM: boom, SLOW_INLINE: slow_boom}) as (_conn, peer):
        await peer.send(request(BOOM, 1), request(SLOW_INLINE, 2))
        answers = {r.opaque: r for r in await peer.receive(2)}
    assert answers[1].code == ResponseCode.SYSTEM_ERROR
    assert answers[1].remark == "RuntimeError: inline blew up"
    assert answers[2].code == ResponseCode.SYSTEM_ERROR
    assert answers[2].remark is not None
    assert "async part blew up" in answers[2].remark


def record_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of each `os.write` (a `Connection`'s socket writes)."""
    writes: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    return writes


async def test_answers_of_one_batch_leave_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    writes = record_writes(monkeypatch)

    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo}) as (_conn, peer):
        await trio.testing.wait_all_tasks_blocked()  # the writer is idle
        await peer.send(*(request(INLINE, i, b"x" * 100) for i in range(5)))
        answers = await peer.receive(5)
    assert sorted(r.opaque for r in answers) == list(range(5))
    assert len(writes) == 1


async def test_a_long_batch_is_answered_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipelining peer's window arrives in one read; its answers leave every 16 requests
    (and by size), so the peer can work on the first answers while the rest are handled."""
    writes: list[int] = []
    real_write = os.write
    readable_at_17th: list[int] = []

    def counting_write(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)

    async with serve({}) as (conn, peer):

        def echo(c: Connection, cmd: RemotingCommand) -> RemotingCommand:
            if cmd.opaque == 16:
                # What the peer could already read while this 17th request is handled.
                try:
                    raw = socket.socket(fileno=peer.sock.fileno())
                    try:
                        peeked = raw.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    finally:
                        raw.detach()
                    readable_at_17th.append(len(peeked))
                except BlockingIOError:
                    readable_at_17th.append(0)
            return cmd.make_response(body=cmd.body)

        conn._inline_processors = {INLINE: echo}
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
    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo}) as (conn, peer):
        await trio.testing.wait_all_tasks_blocked()
        conn._writer_idle = False  # as if the writer were inside send_all
        await peer.send(*(request(INLINE, i) for i in range(3)))
        answers = await peer.receive(3)
    assert sorted(r.opaque for r in answers) == [0, 1, 2]


async def test_inline_and_plain_handlers_answer_out_of_order() -> None:
    release = trio.Event()

    async def plain_slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.make_response(body=b"plain")

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"inline")

    async with serve({INLINE: fast}, {PLAIN_SLOW: plain_slow}) as (_conn, peer):
        await peer.send(request(PLAIN_SLOW, 1), request(INLINE, 2), request(INLINE, 3))
        early = await peer.receive(2)
        assert sorted((r.opaque, r.body) for r in early) == [(2, b"inline"), (3, b"inline")]
        release.set()
        [late] = await peer.receive(1)
    assert (late.opaque, late.body) == (1, b"plain")


async def test_inflight_limit_holds_for_spawned_slow_paths() -> None:
    release = trio.Event()
    calls: list[int] = []

    def slow(conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        calls.append(cmd.opaque)

        async def later() -> RemotingCommand:
            await release.wait()
            return cmd.make_response()

        return later()

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        calls.append(cmd.opaque)
        return cmd.make_response()

    async with serve({SLOW_INLINE: slow, INLINE: fast}, max_inflight=1) as (_conn, peer):
        await peer.send(
            request(INLINE, 1), request(SLOW_INLINE, 2), request(SLOW_INLINE, 3), request(INLINE, 4)
        )
        # The answer made before the reader had to wait is not held back.
        [first] = await peer.receive(1)
        assert first.opaque == 1
        await trio.testing.wait_all_tasks_blocked()
        # Request 3 waits for a slot (its handler ran, its slow part did not start); the
        # reader stops there, so request 4 is not handled yet.
        assert calls == [1, 2, 3]
        release.set()
        rest = await peer.receive(3)
    assert sorted(r.opaque for r in rest) == [2, 3, 4]
    assert calls == [1, 2, 3, 4]


async def test_oneway_inline_request_gets_no_answer() -> None:
    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo}) as (_conn, peer):
        oneway = request(INLINE, 1)
        oneway.flag |= FLAG_ONEWAY
        await peer.send(oneway, request(INLINE, 2))
        [resp] = await peer.receive(1)
    assert resp.opaque == 2


async def test_peer_gone_while_a_slow_path_waits_closes_cleanly() -> None:
    started = trio.Event()

    def park(conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        async def later() -> RemotingCommand:
            started.set()
            await trio.sleep_forever()
            raise AssertionError("unreachable")

        return later()

    async with serve({SLOW_INLINE: park}) as (conn, peer):
        await peer.send(request(SLOW_INLINE, 1))
        await started.wait()
        peer.sock.close()
        with trio.fail_after(5):
            await conn.wait_closed()
    assert conn.close_reason == "peer closed the connection"


async def test_answer_to_a_vanished_peer_closes_the_connection() -> None:
    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"y" * 200_000)

    async with serve({INLINE: echo}) as (conn, peer):
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(request(INLINE, 1))
        peer.sock.close()
        with trio.fail_after(5):
            await conn.wait_closed()
    assert conn.closed


async def test_plain_handler_registered_inline_runs_its_coroutine_in_a_task() -> None:
    seen: list[str] = []

    async def plain(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(task_name())
        return cmd.make_response(body=b"ok")

    handler: Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand]] = plain
    async with serve({INLINE: handler}) as (_conn, peer):
        await peer.send(request(INLINE, 5))
        [resp] = await peer.receive(1)
    assert (resp.opaque, resp.body) == (5, b"ok")
    assert "_handle_awaitable" in seen[0]


async def test_sequential_invoke_and_spawned_answer_skip_the_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writers = record_writers(monkeypatch)

    async def plain(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        return cmd.make_response(body=b"plain")

    a, b = trio.socket.socketpair()
    kw: dict[str, Any] = {"max_frame_size": 1 << 20, "outbound_queue_size": 8, "max_inflight": 8}
    server = Connection(trio.SocketStream(a), {PLAIN_SLOW: plain}, **kw)
    client = Connection(trio.SocketStream(b), {}, **kw)
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
    # One request and one (spawned handler's) answer per call, each written directly: by the
    # caller and by the handler's task, never by a writer.
    assert len(writers) == 6
    assert not [name for name in writers if name.endswith("._writer")]


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

    def sent(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"sent")  # answered by the reader, as the broker does

    a, b = trio.socket.socketpair()
    kw: dict[str, Any] = {"max_frame_size": 1 << 20, "outbound_queue_size": 8, "max_inflight": 16}
    server = Connection(trio.SocketStream(a), {PARK: park}, inline_processors={INLINE: sent}, **kw)
    client = Connection(trio.SocketStream(b), {}, **kw)
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
            assert len(client._pending) == parked
            with pytest.MonkeyPatch.context() as mp:
                yield client, record_writers(mp), park_one
            release.set()
            while client._pending:  # every parked request answered
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
    # A lightly pipelined caller (W2's 4 batches in flight): each request is written by the
    # task that makes it, and each answer by the server's reader; no writer task is woken.
    async with parked_pair(parked, long_poll=False) as (client, writers, _):
        sends = await send_three(client, writers)
    assert len(sends) == 6
    assert by_writer_task(sends) == []


async def test_a_request_with_many_others_in_flight_goes_through_the_writer() -> None:
    # The control: with more than `_DIRECT_MAX_OTHERS` others in flight the request is queued
    # to the writer, which joins requests issued together (W1's 64 in flight).
    async with parked_pair(4, long_poll=False) as (client, writers, _):
        sends = await send_three(client, writers)
    assert len(by_writer_task(sends)) == 3  # the requests; the answers still by the reader


async def test_parked_long_polls_do_not_count_as_requests_in_flight() -> None:
    # A push consumer keeps a pull parked per queue (8 here): its other requests, and each
    # pull re-issued beside the parked ones, are still written at once by their tasks.
    async with parked_pair(8, long_poll=True) as (client, writers, park_one):
        sends = await send_three(client, writers)
        writers.clear()
        await park_one()
        ninth = list(writers)
    assert len(sends) == 6
    assert by_writer_task(sends) == []
    assert len(ninth) == 1
    assert by_writer_task(ninth) == []


def pulls_and_sends(events: list[str]) -> tuple[dict[int, InlineHandler], list[RemotingCommand]]:
    """Inline handlers of a client sharing one connection for pulling and sending: SLOW_INLINE
    parks a pull (DEFERRED), INLINE answers a send (recorded as "send" in `events`) and first
    wakes the oldest parked pull, answering it with `respond_nowait`. Also the parked list."""
    parked: list[RemotingCommand] = []

    def pull(conn: Connection, cmd: RemotingCommand) -> Connection.Deferred:
        parked.append(cmd)
        return Connection.DEFERRED

    def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        events.append("send")
        if parked:
            waiting = parked.pop(0)
            conn.respond_nowait(waiting, waiting.make_response(body=b"pulled"), direct=True)
        return cmd.make_response(body=b"sent")

    return {SLOW_INLINE: pull, INLINE: send}, parked


async def park(peer: Peer, parked: list[RemotingCommand], events: list[str], *opaques: int) -> None:
    """Park a pull for each opaque (SLOW_INLINE), see them all parked, forget the events."""
    await peer.send(*(request(SLOW_INLINE, o) for o in opaques))
    await trio.testing.wait_all_tasks_blocked()
    assert len(parked) == len(opaques)
    events.clear()


async def sends_waking_parked_pulls(
    monkeypatch: pytest.MonkeyPatch, pulls: list[int], sends: list[int]
) -> tuple[list[str], list[RemotingCommand], list[str]]:
    """Park a pull for each of `pulls`, then send `sends` in one read (`pulls_and_sends`'
    handlers, an inline batch recorded): the events from the sends on, every answer, and the
    task of each write from the sends on."""
    events, batch = record_batch(monkeypatch)
    handlers, parked = pulls_and_sends(events)
    async with serve(handlers, inline_batch=batch) as (_conn, peer):
        with trio.fail_after(10):
            await park(peer, parked, events, *pulls)
            writers = record_writers(monkeypatch)
            await peer.send(*(request(INLINE, i) for i in sends))
            got = await peer.receive(len(pulls) + len(sends))
    return events, got, writers


async def test_answers_released_by_a_run_leave_together_before_the_run_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client sharing one connection for sending and pulling: its sends (inline) wake the
    # pulls it parked on the same connection (DEFERRED). The woken pulls' answers leave in one
    # write as soon as the chunk's handlers have run, before the run ends (`end`: the store's
    # commitlog write and index entries); the sends' own answers only after it.
    events, got, writers = await sends_waking_parked_pulls(monkeypatch, [1, 2], [3, 4])
    assert events == ["begin", "send", "send", "write", "end", "write"]
    assert [(c.opaque, c.body) for c in got] == [
        (1, b"pulled"),
        (2, b"pulled"),
        (3, b"sent"),
        (4, b"sent"),
    ]
    assert by_writer_task(writers) == []  # both writes by the reader, no writer task


async def test_answers_released_by_a_run_leave_before_it_ends_at_a_chunk_boundary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A run longer than a chunk (16 answers) ends and begins again at the chunk boundary: the
    # answers its first part released leave before that end, not with the last part.
    events, got, _ = await sends_waking_parked_pulls(monkeypatch, [100], list(range(18)))
    first = ["begin", *["send"] * 16, "write", "end", "write"]
    assert events == [*first, "begin", "send", "send", "end", "write"]
    assert got[0].opaque == 100
    assert got[0].body == b"pulled"


async def test_the_writer_writes_frames_larger_than_the_socket_buffer() -> None:
    # Queued frames of several MiB: the writer writes what fits, waits until the socket is
    # writable again, and goes on; the peer gets every byte in order.
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
    # The peer stops reading for good (its read side shut down): the writer's write fails and
    # the connection closes, with the write failure as its reason.
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
    # The reader reads the socket itself: a frame larger than its buffer (256 KiB) comes in
    # full-buffer reads, read again at once; after a short read it waits until readable.
    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

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
    async with serve({}) as (conn, _peer):
        await trio.testing.wait_all_tasks_blocked()
        conn.close()
        with trio.fail_after(5):
            await conn.wait_closed()
        assert conn.close_reason == "closed locally"


async def test_requesters_run_while_a_batch_of_responses_is_handed_out() -> None:
    # A window of answers arriving in one read (a group commit answers a whole window at once):
    # the reader yields after waking every few requesters, so they run, and a pipelining
    # caller's next requests leave, before the reader has worked through the whole batch.
    count = 24
    seen: list[int] = []
    async with serve({}) as (conn, peer):

        async def call(i: int) -> None:
            resp = await conn.invoke(request(INLINE, 0, b"%d" % i), timeout_ms=5000)
            assert resp.body == b"%d" % i
            # Requests whose answers the reader has not handed out yet (private, on purpose:
            # nothing public tells how far into its batch the reader is).
            seen.append(len(conn._pending))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(call, i)
                requests = await peer.receive(count)
                await peer.send(*(r.make_response(body=r.body) for r in requests))
    assert len(seen) == count
    # Without the yields every requester ran after the last answer was handed out (all 0).
    assert max(seen) >= 8


# ------------------------------------------------------------------------ inline batch
def record_batch(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], InlineBatch]:
    """An `InlineBatch` and the socket writes, recorded in one list of events."""
    events: list[str] = []
    real_write = os.write

    def recording_write(fd: int, data: Any) -> int:
        events.append("write")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    return events, InlineBatch(lambda: events.append("begin"), lambda: events.append("end"))


async def test_inline_batch_ends_before_the_answers_of_its_run_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of inline handlers is bracketed by begin/end, and end comes before the write of
    their answers, also at the 16-answer chunk boundary (see `set_inline_batch`)."""
    events, batch = record_batch(monkeypatch)

    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        events.append("h")
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo}, inline_batch=batch) as (_conn, peer):
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


async def test_inline_batch_ends_after_a_run_without_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Oneway requests answer nothing: the run still ends before the reader waits again."""
    events, batch = record_batch(monkeypatch)

    def sink(conn: Connection, cmd: RemotingCommand) -> None:
        events.append("h")

    async with serve({INLINE: sink}, inline_batch=batch) as (_conn, peer):
        await trio.testing.wait_all_tasks_blocked()
        oneway = [request(INLINE, i) for i in range(2)]
        for cmd in oneway:
            cmd.flag |= FLAG_ONEWAY
        await peer.send(*oneway)
        await trio.testing.wait_all_tasks_blocked()
    assert events == ["begin", "h", "h", "end"]


async def test_inline_batch_ends_before_a_spawned_slow_path_runs() -> None:
    """A handler's slow path (a coroutine, awaited in a task) runs only after the run ended."""
    events: list[str] = []

    async def slow_part(cmd: RemotingCommand) -> RemotingCommand:
        events.append("slow")
        return cmd.make_response(body=cmd.body)

    def slow(conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        events.append("h")
        return slow_part(cmd)

    batch = InlineBatch(lambda: events.append("begin"), lambda: events.append("end"))
    async with serve({SLOW_INLINE: slow}, inline_batch=batch) as (_conn, peer):
        await peer.send(request(SLOW_INLINE, 1, b"a"), request(SLOW_INLINE, 2, b"b"))
        answers = await peer.receive(2)
    assert sorted((a.code, a.body) for a in answers) == [(0, b"a"), (0, b"b")]
    assert events == ["begin", "h", "h", "end", "slow", "slow"]


async def test_a_failing_inline_batch_end_closes_without_writing_the_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events, _ = record_batch(monkeypatch)

    def fail() -> None:
        raise OSError(5, "Input/output error")

    def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    async with serve({INLINE: echo}, inline_batch=InlineBatch(lambda: None, fail)) as (
        conn,
        peer,
    ):
        await peer.send(request(INLINE, 1))
        with trio.fail_after(5):
            await conn.wait_closed()
            assert await peer.sock.recv(100) == b""  # closed, no answer
    assert "write" not in events
    assert "inline batch failed" in (conn._close_reason or "")

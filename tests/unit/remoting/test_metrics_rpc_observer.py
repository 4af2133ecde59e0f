"""`ProcessorTable.set_rpc_observer`: what remoting tells the metrics about each answer (codes
and a duration, nothing else), for inline, task, deferred, unknown and oneway requests."""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing

from remoting import FLAG_ONEWAY, Connection, RemotingCommand, Responder, ResponseCode
from tests.unit.remoting.test_reader_answers_inline import (
    INLINE,
    PLAIN_SLOW,
    SLOW_INLINE,
    UNKNOWN,
    echo,
    request,
    serve,
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[int, int]], float]] = []

    def __call__(self, codes: Sequence[int], seconds: float) -> None:
        # Flat (request code, response code, ...); the list is reused by the reader: copy.
        assert len(codes) % 2 == 0
        pairs = [(codes[i], codes[i + 1]) for i in range(0, len(codes), 2)]
        self.calls.append((pairs, seconds))

    @property
    def answered(self) -> list[tuple[int, int]]:
        return [pair for batch, _ in self.calls for pair in batch]


async def test_observer_hears_every_answered_request_once() -> None:
    held: list[Responder] = []

    async def later(conn: Connection, cmd: RemotingCommand) -> None:
        held.append(conn.defer(cmd))

    async def failing(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SYSTEM_BUSY, "busy")

    rec = Recorder()
    async with serve({INLINE: echo, SLOW_INLINE: later}, {PLAIN_SLOW: failing}) as (conn, peer):
        conn._processors.set_rpc_observer(rec)
        oneway = request(INLINE, 9)
        oneway.flag |= FLAG_ONEWAY
        # One read: three inline answers (one batch), a oneway (not told), a deferred one, a
        # task's and an unknown code's.
        await peer.send(
            request(INLINE, 1),
            request(INLINE, 2),
            oneway,
            request(INLINE, 3),
            request(SLOW_INLINE, 4),
            request(PLAIN_SLOW, 5),
            request(UNKNOWN, 6),
        )
        await peer.receive(5)
        await trio.testing.wait_all_tasks_blocked()
        assert rec.calls[0][0] == [(INLINE, 0)] * 3
        assert sorted(rec.answered) == sorted(
            [(INLINE, 0)] * 3
            + [(PLAIN_SLOW, ResponseCode.SYSTEM_BUSY)]
            + [(UNKNOWN, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)]
        )
        [responder] = held
        responder.respond(responder.request.make_response())
        await peer.receive(1)
        assert rec.answered[-1] == (SLOW_INLINE, 0)
        assert all(seconds >= 0 for _, seconds in rec.calls)
        # Off again: nothing more is told.
        conn._processors.set_rpc_observer(None)
        count = len(rec.calls)
        await peer.send(request(INLINE, 7))
        await peer.receive(1)
        assert len(rec.calls) == count


async def test_without_an_observer_nothing_is_collected() -> None:
    async with serve({INLINE: echo}) as (conn, peer):
        await peer.send(request(INLINE, 1), request(INLINE, 2))
        await peer.receive(2)
        assert conn._answered == []

"""`ProcessorTable.check_before` (the servers' ACL check) on a live `Connection`: a refusal
answers instead of the processor, inline and in tasks alike; a oneway refusal sends nothing; a
check that raises is answered as a failed request and the connection goes on serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from remoting import (
    FLAG_ONEWAY,
    Connection,
    ProcessorTable,
    RemotingCommand,
    ResponseCode,
)
from tests.unit.remoting.test_reader_answers_inline import Peer, request

pytestmark = pytest.mark.unit

INLINE, TASK, LATER = 1, 2, 3
REFUSED, RAISES = "refuse", "raise"


@asynccontextmanager
async def checked_server(calls: list[str]) -> AsyncIterator[Peer]:
    """A connection whose table checks every request: field `n` == "refuse" is refused
    NO_PERMISSION, "raise" makes the check raise; processors record what they served."""

    async def serve(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        calls.append((cmd.ext_fields or {})["n"])
        return cmd.make_response(remark="served")

    def check(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        n = (cmd.ext_fields or {}).get("n")
        if n == RAISES:
            raise RuntimeError("checker bug")
        if n == REFUSED:
            return cmd.make_response(ResponseCode.NO_PERMISSION, "refused")
        return None

    table = ProcessorTable()
    table.register(INLINE, serve, inline=True)
    table.register(TASK, serve)
    table.check_before(check)
    table.register(LATER, serve, inline=True)  # registered after the check: checked too
    a, b = trio.socket.socketpair()
    conn = Connection(
        trio.SocketStream(a), table, max_frame_size=1 << 20, outbound_queue_size=64, max_inflight=64
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        try:
            yield Peer(b)
        finally:
            conn.close()
            b.close()


def named(code: int, opaque: int, n: str) -> RemotingCommand:
    cmd = request(code, opaque)
    assert cmd.ext_fields is not None
    cmd.ext_fields["n"] = n
    return cmd


@pytest.mark.parametrize("code", [INLINE, TASK, LATER])
async def test_a_refusal_answers_instead_of_the_processor(code: int) -> None:
    calls: list[str] = []
    async with checked_server(calls) as peer:
        await peer.send(named(code, 1, REFUSED), named(code, 2, "ok"))
        got = {r.opaque: r for r in await peer.receive(2)}
    assert (got[1].code, got[1].remark) == (ResponseCode.NO_PERMISSION, "refused")
    assert (got[2].code, got[2].remark) == (ResponseCode.SUCCESS, "served")
    assert calls == ["ok"]


async def test_a_oneway_refusal_sends_nothing() -> None:
    calls: list[str] = []
    async with checked_server(calls) as peer:
        oneway = named(INLINE, 1, REFUSED)
        oneway.flag |= FLAG_ONEWAY
        await peer.send(oneway, named(INLINE, 2, "ok"))
        [resp] = await peer.receive(1)
    assert resp.opaque == 2
    assert calls == ["ok"]


@pytest.mark.parametrize("code", [INLINE, TASK])
async def test_a_check_that_raises_is_a_failed_request_and_the_connection_goes_on(
    code: int,
) -> None:
    calls: list[str] = []
    async with checked_server(calls) as peer:
        await peer.send(named(code, 1, RAISES))
        [failed] = await peer.receive(1)
        await peer.send(named(code, 2, "ok"))
        [served] = await peer.receive(1)
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert "checker bug" in (failed.remark or "")
    assert served.code == ResponseCode.SUCCESS
    assert calls == ["ok"]

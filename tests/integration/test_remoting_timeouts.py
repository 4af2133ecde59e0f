"""Request timeouts enforced by the connection's timer task (no cancel scope per request)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from remoting import (
    Connection,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    RemotingTimeoutError,
)

ECHO = 1
SLOW = 3


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, trio.Event]]:
    release = trio.Event()
    srv = RemotingServer()

    async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.make_response(body=b"late")

    srv.processors.register(ECHO, echo)
    srv.processors.register(SLOW, slow)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(srv.run)
        yield f"127.0.0.1:{port}", release
        release.set()
        nursery.cancel_scope.cancel()


async def test_short_timeout_behind_a_long_one_fires_on_time(
    server: tuple[str, trio.Event],
) -> None:
    addr, release = server
    async with RemotingClient() as client, trio.open_nursery() as nursery:
        long_result: list[RemotingCommand] = []

        async def long_call() -> None:
            long_result.append(
                await client.invoke(addr, RemotingCommand.request(SLOW), timeout_ms=60_000)
            )

        nursery.start_soon(long_call)
        await trio.sleep(0.1)  # the 60 s deadline is registered first
        start = trio.current_time()
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(addr, RemotingCommand.request(SLOW), timeout_ms=200)
        assert trio.current_time() - start < 5  # at its own deadline, not the 60 s one
        assert client.pending == 1  # the long call still waits
        release.set()
    assert long_result[0].body == b"late"
    assert client.pending == 0


async def test_cancelled_call_leaves_nothing_pending(server: tuple[str, trio.Event]) -> None:
    addr, _release = server
    async with RemotingClient() as client:
        with trio.move_on_after(0.2):
            await client.invoke(addr, RemotingCommand.request(SLOW), timeout_ms=60_000)
        assert client.pending == 0
        answer = await client.invoke(addr, RemotingCommand.request(ECHO), timeout_ms=5000)
        assert answer.code == 0


async def test_answered_calls_do_not_pile_up(server: tuple[str, trio.Event]) -> None:
    addr, _release = server
    async with RemotingClient() as client:
        for i in range(3000):
            answer = await client.invoke(
                addr, RemotingCommand.request(ECHO, body=str(i).encode()), timeout_ms=60_000
            )
            assert answer.body == str(i).encode()
        conn = client.connection(addr)
        assert conn is not None
        # Deadlines of answered calls are dropped as the heap grows: bounded, not 3000, and
        # small (their entries die young: see `_DEADLINES_COMPACT_MIN`).
        assert len(conn._proto._deadlines) <= 100

"""RemotingClient.invoke: an open connection's invoke is the call's coroutine (no connect,
no clock reads); otherwise the connect-then-invoke path with the timeout covering both."""

from __future__ import annotations

import pytest
import trio

from remoting import RemotingClient, RemotingCommand, RemotingTimeoutError
from remoting._connection import Connection
from remoting.codes import LanguageCode, SerializeType


class _Conn:
    """What RemotingClient.invoke reads of a Connection."""

    def __init__(self, closed: bool = False) -> None:
        self.closed = closed
        self.serialize_type = int(SerializeType.JSON)  # the connection's codec
        self.calls: list[tuple[RemotingCommand, int]] = []
        self.long_polls: list[bool] = []

    async def invoke(
        self, cmd: RemotingCommand, timeout_ms: int, *, long_poll: bool = False
    ) -> RemotingCommand:
        self.calls.append((cmd, timeout_ms))
        self.long_polls.append(long_poll)
        await trio.lowlevel.checkpoint()
        return cmd.make_response(body=b"answer")


def _client(conn: _Conn | None, connect_to: _Conn) -> tuple[RemotingClient, list[str]]:
    client = RemotingClient(serialize_type=SerializeType.JSON, language=LanguageCode.JAVA)
    if conn is not None:
        client._connections["a:1"] = conn  # type: ignore[assignment]
    connects: list[str] = []

    async def get_connection(addr: str) -> Connection:
        connects.append(addr)
        await trio.sleep(0.25)  # the connect takes a while
        return connect_to  # type: ignore[return-value]

    client._get_connection = get_connection  # type: ignore[method-assign]
    return client, connects


async def test_open_connection_is_used_directly_with_the_whole_timeout() -> None:
    conn, other = _Conn(), _Conn()
    client, connects = _client(conn, other)
    cmd = RemotingCommand.request(1, None, b"x")
    resp = await client.invoke("a:1", cmd, 1234)
    assert resp.body == b"answer"
    assert conn.calls == [(cmd, 1234)]
    assert (cmd.serialize_type, cmd.language) == (SerializeType.JSON, LanguageCode.JAVA)
    assert connects == []
    assert other.calls == []


@pytest.mark.parametrize("state", ["open", "missing"])
async def test_long_poll_reaches_the_connection(state: str, autojump_clock: trio.abc.Clock) -> None:
    conn = _Conn()
    client, _ = _client(conn if state == "open" else None, conn)
    await client.invoke("a:1", RemotingCommand.request(11), 1000, long_poll=True)
    await client.invoke("a:1", RemotingCommand.request(1), 1000)
    assert conn.long_polls == [True, False]


async def test_invoke_does_nothing_until_awaited() -> None:
    conn = _Conn()
    client, _ = _client(conn, _Conn())
    call = client.invoke("a:1", RemotingCommand.request(1), 100)
    assert conn.calls == []
    await call
    assert len(conn.calls) == 1


@pytest.mark.parametrize("state", ["missing", "closed"])
async def test_no_open_connection_connects_and_the_timeout_covers_the_connect(
    state: str, autojump_clock: trio.abc.Clock
) -> None:
    conn = _Conn()
    client, connects = _client(None if state == "missing" else _Conn(closed=True), conn)
    cmd = RemotingCommand.request(1)
    resp = await client.invoke("a:1", cmd, 1000)
    assert resp.body == b"answer"
    assert connects == ["a:1"]
    assert conn.calls == [(cmd, 750)]  # 1000 ms minus the 250 ms connect
    assert (cmd.serialize_type, cmd.language) == (SerializeType.JSON, LanguageCode.JAVA)


async def test_a_connect_using_the_whole_timeout_is_a_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    conn = _Conn()
    client, _ = _client(None, conn)
    with pytest.raises(RemotingTimeoutError, match="used the whole 200 ms"):
        await client.invoke("a:1", RemotingCommand.request(1), 200)
    assert conn.calls == []


async def test_a_timeout_under_one_ms_takes_the_checked_path(
    autojump_clock: trio.abc.Clock,
) -> None:
    conn = _Conn()
    client, connects = _client(conn, conn)
    with pytest.raises(RemotingTimeoutError, match="used the whole 0 ms"):
        await client.invoke("a:1", RemotingCommand.request(1), 0)
    assert connects == ["a:1"]
    assert conn.calls == []

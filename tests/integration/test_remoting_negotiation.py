"""Choosing the header codec: a client that starts in JSON moves to msgpack only when a trimq
server says it reads it; a server in Apache mode (`msgpack_headers=False`) never says so and
refuses msgpack frames; clients other than trimq's never see the advertisement."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from remoting import (
    Connection,
    LanguageCode,
    RemotingClient,
    RemotingCommand,
    RemotingConnectionLost,
    RemotingServer,
    SerializeType,
)
from remoting._protocol import MSGPACK_ADVERT_FIELD

pytestmark = pytest.mark.integration

RECORD = 7


@asynccontextmanager
async def _server(*, msgpack_headers: bool) -> AsyncIterator[tuple[str, list[int]]]:
    seen: list[int] = []

    async def record(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(cmd.serialize_type)
        return cmd.make_response(body=b"ok")

    server = RemotingServer("127.0.0.1", 0, msgpack_headers=msgpack_headers)
    server.processors.register(RECORD, record)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield f"127.0.0.1:{port}", seen
        nursery.cancel_scope.cancel()


async def _calls(client: RemotingClient, addr: str, n: int) -> list[RemotingCommand]:
    return [await client.invoke(addr, RemotingCommand.request(RECORD)) for _ in range(n)]


async def test_json_client_moves_to_msgpack_with_a_trimq_server() -> None:
    async with (
        _server(msgpack_headers=True) as (addr, seen),
        RemotingClient(serialize_type=SerializeType.JSON, upgrade_to_msgpack=True) as client,
    ):
        answers = await _calls(client, addr, 3)
    assert seen == [SerializeType.JSON, SerializeType.MSGPACK, SerializeType.MSGPACK]
    assert answers[0].ext_fields == {MSGPACK_ADVERT_FIELD: "JSON,ROCKETMQ,MSGPACK"}
    assert answers[1].ext_fields is None


async def test_json_client_stays_json_with_an_apache_mode_server() -> None:
    async with (
        _server(msgpack_headers=False) as (addr, seen),
        RemotingClient(serialize_type=SerializeType.JSON, upgrade_to_msgpack=True) as client,
    ):
        answers = await _calls(client, addr, 3)
    assert seen == [SerializeType.JSON] * 3
    assert all(a.ext_fields is None for a in answers)


@pytest.mark.parametrize("language", [LanguageCode.JAVA, LanguageCode.CPP, LanguageCode.GO])
async def test_other_clients_never_see_the_advertisement(language: LanguageCode) -> None:
    async with (
        _server(msgpack_headers=True) as (addr, seen),
        RemotingClient(serialize_type=SerializeType.JSON, language=language) as client,
    ):
        answers = await _calls(client, addr, 2)
    assert seen == [SerializeType.JSON] * 2
    assert all(a.ext_fields is None for a in answers)


async def test_fixed_json_client_is_not_moved() -> None:
    async with (
        _server(msgpack_headers=True) as (addr, seen),
        RemotingClient(serialize_type=SerializeType.JSON) as client,
    ):
        await _calls(client, addr, 2)
    assert seen == [SerializeType.JSON] * 2


async def test_msgpack_frame_to_an_apache_mode_server_closes_that_connection_only() -> None:
    async with (
        _server(msgpack_headers=False) as (addr, seen),
        RemotingClient(serialize_type=SerializeType.JSON) as good,
        RemotingClient(serialize_type=SerializeType.MSGPACK) as bad,
    ):
        await _calls(good, addr, 1)
        with pytest.raises(RemotingConnectionLost):
            await _calls(bad, addr, 1)
        await _calls(good, addr, 1)  # the other connection is undisturbed
        assert good.connection(addr) is not None
    assert seen == [SerializeType.JSON] * 2

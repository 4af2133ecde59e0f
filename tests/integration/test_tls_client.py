"""The client (`ClientConfig.use_tls`, `mqadmin --tls`) against a RemotingServer that enforces
TLS, standing in for a NameServer: it answers GET_ALL_TOPIC_LIST_FROM_NAMESERVER."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from client import ClientConfig
from client.cli import mqadmin
from client.instance import ClientInstance
from remoting import (
    Connection,
    RemotingCommand,
    RemotingConnectionLost,
    RemotingServer,
    RequestCode,
    TlsServerSettings,
)
from tests.integration.test_tls_remoting import Pki, make_pki

TOPICS = ["TopicA", "TopicB"]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


def _server(pki: Pki, **kw: Any) -> RemotingServer:
    tls = TlsServerSettings(
        mode="enforcing", cert_path=pki.server_cert, key_path=pki.server_key, **kw
    )
    server = RemotingServer(tls=tls)
    seen: list[str | None] = []

    async def topic_list(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(conn.tls_version)
        return cmd.make_response(body=json.dumps({"topicList": TOPICS}).encode())

    server.processors.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, topic_list)
    server.seen = seen  # type: ignore[attr-defined]
    return server


@pytest.fixture
async def namesrv(pki: Pki) -> AsyncIterator[tuple[RemotingServer, str]]:
    server = _server(pki)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield server, f"127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


async def test_client_instance_with_use_tls(namesrv: tuple[RemotingServer, str], pki: Pki) -> None:
    server, addr = namesrv
    cfg = ClientConfig(namesrv_addr=addr, use_tls=True, tls_trust_cert_path=pki.ca)
    async with ClientInstance(cfg) as inst:
        assert await inst.api.get_topic_list_from_namesrv() == TOPICS
    assert len(server.seen) == 1  # type: ignore[attr-defined]
    assert str(server.seen[0]).startswith("TLSv1.")  # type: ignore[attr-defined]


async def test_client_instance_without_tls_is_refused(
    namesrv: tuple[RemotingServer, str],
) -> None:
    _server, addr = namesrv
    cfg = ClientConfig(namesrv_addr=addr, mq_client_api_timeout_ms=5000)
    async with ClientInstance(cfg) as inst:
        with pytest.raises(RemotingConnectionLost):
            await inst.api.get_topic_list_from_namesrv()


async def test_client_instance_mutual_tls(pki: Pki) -> None:
    server = _server(pki, client_auth="require", trust_cert_path=pki.client_ca)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        addr = f"127.0.0.1:{port}"
        cfg = ClientConfig(
            namesrv_addr=addr,
            use_tls=True,
            tls_trust_cert_path=pki.ca,
            tls_cert_path=pki.client_cert,
            tls_key_path=pki.client_key,
        )
        async with ClientInstance(cfg) as inst:
            assert await inst.api.get_topic_list_from_namesrv() == TOPICS
        nursery.cancel_scope.cancel()


@pytest.fixture
def namesrv_in_thread(pki: Pki) -> Iterator[str]:
    """The TLS server on a trio loop of its own thread (mqadmin runs its own trio.run)."""
    ready: list[str] = []
    started = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []
    stop: list[trio.CancelScope] = []

    async def main() -> None:
        server = _server(pki)
        with trio.CancelScope() as scope:
            stop.append(scope)
            token.append(trio.lowlevel.current_trio_token())
            async with trio.open_nursery() as nursery:
                port = await nursery.start(server.run)
                ready.append(f"127.0.0.1:{port}")
                started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert started.wait(10)
    yield ready[0]
    trio.from_thread.run_sync(stop[0].cancel, trio_token=token[0])
    thread.join(10)


def test_mqadmin_with_tls(namesrv_in_thread: str, pki: Pki) -> None:
    addr = namesrv_in_thread
    runner = CliRunner()
    result = runner.invoke(
        mqadmin.cli, ["--tls", "--tls-trust-cert", pki.ca, "topicList", "-n", addr]
    )
    assert result.exit_code == 0, result.output
    assert result.output.split() == TOPICS
    # Another CA: a clear error, exit 1.
    result = runner.invoke(
        mqadmin.cli, ["--tls", "--tls-trust-cert", pki.other_ca, "topicList", "-n", addr]
    )
    assert result.exit_code == 1
    assert "certificate verify failed" in result.output

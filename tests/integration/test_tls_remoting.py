"""TLS on RemotingServer and RemotingClient over real sockets on 127.0.0.1: the three server
modes against plain and TLS clients, mutual TLS, server verification, hostile handshakes,
certificate reloads. Certificates come from `trustme` (one CA for servers, one for clients,
one nobody trusts)."""

from __future__ import annotations

import os
import shutil
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from remoting import (
    Connection,
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingConnectionLost,
    RemotingServer,
    RequestCode,
    ResponseCode,
    TlsClientSettings,
    TlsConfigError,
    TlsServerSettings,
)
from tests.helpers import wait_until

ECHO = 1
ASK_CLIENT = 4


@dataclass(frozen=True)
class Pki:
    """PEM files of a test PKI."""

    ca: str  # the CA of the server certificates
    server_cert: str  # chain for localhost and 127.0.0.1
    server_key: str
    localhost_cert: str  # names localhost only (no IP address)
    localhost_key: str
    client_ca: str  # the CA of client certificates
    client_cert: str
    client_key: str
    rogue_cert: str  # a client certificate from a CA nobody trusts
    rogue_key: str
    other_ca: str  # a CA that signed none of the server certificates


def _write_leaf(leaf: trustme.LeafCert, cert: Path, key: Path) -> tuple[str, str]:
    for i, blob in enumerate(leaf.cert_chain_pems):
        blob.write_to_path(str(cert), append=i > 0)
    leaf.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


def make_pki(directory: Path) -> Pki:
    ca, client_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(directory / "client-ca.pem"))
    other_ca.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    server = _write_leaf(
        ca.issue_cert("localhost", "127.0.0.1"),
        directory / "server.pem",
        directory / "server.key",
    )
    localhost = _write_leaf(
        ca.issue_cert("localhost"), directory / "localhost.pem", directory / "localhost.key"
    )
    client = _write_leaf(
        client_ca.issue_cert("client-1"), directory / "client.pem", directory / "client.key"
    )
    rogue = _write_leaf(
        other_ca.issue_cert("client-1"), directory / "rogue.pem", directory / "rogue.key"
    )
    return Pki(
        ca=str(directory / "ca.pem"),
        server_cert=server[0],
        server_key=server[1],
        localhost_cert=localhost[0],
        localhost_key=localhost[1],
        client_ca=str(directory / "client-ca.pem"),
        client_cert=client[0],
        client_key=client[1],
        rogue_cert=rogue[0],
        rogue_key=rogue[1],
        other_ca=str(directory / "other-ca.pem"),
    )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


async def _echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(ext_fields=cmd.ext_fields, body=cmd.body)


async def _ask_client(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    question = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"q": "state?"})
    answer = await conn.invoke(question, timeout_ms=5000)
    return cmd.make_response(answer.code, remark=answer.remark, body=answer.body)


@asynccontextmanager
async def serving(
    tls: TlsServerSettings | None, **kw: Any
) -> AsyncIterator[tuple[RemotingServer, str]]:
    """A RemotingServer with ECHO and ASK_CLIENT; yields it and its address."""
    server = RemotingServer(tls=tls, **kw)
    server.processors.register(ECHO, _echo)
    server.processors.register(ASK_CLIENT, _ask_client)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield server, f"127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def server_tls(pki: Pki, mode: str = "enforcing", **kw: object) -> TlsServerSettings:
    return TlsServerSettings(
        mode=mode,  # type: ignore[arg-type]
        cert_path=pki.server_cert,
        key_path=pki.server_key,
        **kw,  # type: ignore[arg-type]
    )


def client_tls(pki: Pki, **kw: object) -> TlsClientSettings:
    return TlsClientSettings(trust_cert_path=pki.ca, **kw)  # type: ignore[arg-type]


async def echo_once(addr: str, tls: TlsClientSettings | None, body: bytes = b"ping") -> bytes:
    async with RemotingClient(tls=tls) as client:
        answer = await client.invoke(addr, RemotingCommand.request(ECHO, body=body), 5000)
        assert answer.code == ResponseCode.SUCCESS
        return answer.body_bytes()


async def echo_fails(
    addr: str,
    tls: TlsClientSettings | None,
    expected: type[Exception] | tuple[type[Exception], ...],
    match: str | None = None,
) -> None:
    """One request from a new client fails with `expected` (raised inside the client's
    `async with`, whose nursery would wrap it in a group)."""
    async with RemotingClient(tls=tls) as client:
        with pytest.raises(expected, match=match):
            await client.invoke(addr, RemotingCommand.request(ECHO), 5000)


# -- modes ---------------------------------------------------------------------------------


async def test_enforcing_serves_tls_and_refuses_plain(pki: Pki) -> None:
    async with serving(server_tls(pki, "enforcing")) as (server, addr):
        async with RemotingClient(tls=client_tls(pki)) as client:
            answer = await client.invoke(addr, RemotingCommand.request(ECHO, body=b"hi"), 5000)
            assert answer.body_bytes() == b"hi"
            conn = client.connection(addr)
            assert conn is not None
            assert conn.tls_version in ("TLSv1.2", "TLSv1.3")
            assert [c.tls_version for c in server.connections] == [conn.tls_version]
        await echo_fails(addr, None, RemotingConnectionLost)


@pytest.mark.parametrize("tls", [None, "disabled"])
async def test_disabled_serves_plain_and_refuses_tls(pki: Pki, tls: str | None) -> None:
    settings = None if tls is None else TlsServerSettings(mode="disabled")
    async with serving(settings) as (server, addr):
        assert server.tls is None
        assert await echo_once(addr, None) == b"ping"
        await echo_fails(addr, client_tls(pki), RemotingConnectError, "TLS handshake")


async def test_permissive_serves_plain_and_tls_on_one_port(pki: Pki) -> None:
    async with (
        serving(server_tls(pki, "permissive")) as (server, addr),
        RemotingClient() as plain,
        RemotingClient(tls=client_tls(pki)) as secured,
    ):
        # The plain client's first byte is peeked, not consumed: its frames arrive whole.
        for i in range(3):
            for client in (plain, secured):
                body = b"x%d" % i
                answer = await client.invoke(addr, RemotingCommand.request(ECHO, body=body))
                assert answer.body_bytes() == body
        versions = sorted(str(c.tls_version) for c in server.connections)
        assert len(versions) == 2
        assert "None" in versions
        assert any(v.startswith("TLSv1.") for v in versions)


async def test_large_bodies_many_requests_and_server_requests_over_tls(pki: Pki) -> None:
    async def check_state(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=b"committed:" + (cmd.field("q") or "").encode())

    async with (
        serving(server_tls(pki)) as (_server, addr),
        RemotingClient(tls=client_tls(pki)) as client,
    ):
        client.processors.register(RequestCode.CHECK_TRANSACTION_STATE, check_state)
        big = os.urandom(3 * 1024 * 1024)  # many TLS records, several reads of 256 KiB
        answer = await client.invoke(addr, RemotingCommand.request(ECHO, body=big), 10_000)
        assert answer.body_bytes() == big
        results: dict[int, bytes] = {}

        async def one(i: int) -> None:
            cmd = RemotingCommand.request(ECHO, {"i": str(i)}, b"p%d" % i)
            results[i] = (await client.invoke(addr, cmd, 10_000)).body_bytes()

        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(one, i)
        assert results == {i: b"p%d" % i for i in range(300)}
        answer = await client.invoke(addr, RemotingCommand.request(ASK_CLIENT), 5000)
        assert answer.body_bytes() == b"committed:state?"


# -- client certificates (mutual TLS) ------------------------------------------------------


async def test_client_auth_require(pki: Pki) -> None:
    tls = server_tls(pki, client_auth="require", trust_cert_path=pki.client_ca)
    async with serving(tls) as (server, addr):
        signed = client_tls(pki, cert_path=pki.client_cert, key_path=pki.client_key)
        assert await echo_once(addr, signed) == b"ping"
        # TLS 1.3: the client's handshake ends before the server checks its certificate,
        # so the refusal shows on the first request (TLS 1.2: at the connect).
        await echo_fails(addr, client_tls(pki), (RemotingConnectError, RemotingConnectionLost))
        rogue = client_tls(pki, cert_path=pki.rogue_cert, key_path=pki.rogue_key)
        await echo_fails(addr, rogue, (RemotingConnectError, RemotingConnectionLost))
        # Still serving.
        assert await echo_once(addr, signed) == b"ping"
        await wait_until(lambda: server.connections == [], what="every connection closed")


async def test_client_auth_optional(pki: Pki) -> None:
    tls = server_tls(pki, client_auth="optional", trust_cert_path=pki.client_ca)
    async with serving(tls) as (_server, addr):
        assert await echo_once(addr, client_tls(pki)) == b"ping"
        signed = client_tls(pki, cert_path=pki.client_cert, key_path=pki.client_key)
        assert await echo_once(addr, signed) == b"ping"
        rogue = client_tls(pki, cert_path=pki.rogue_cert, key_path=pki.rogue_key)
        await echo_fails(addr, rogue, (RemotingConnectError, RemotingConnectionLost))


async def test_tls_1_2_client_without_certificate_fails_at_connect(pki: Pki) -> None:
    """With TLS 1.2 the client sees the refusal in its handshake: a RemotingConnectError."""
    tls = server_tls(pki, client_auth="require", trust_cert_path=pki.client_ca)
    async with serving(tls) as (_server, addr), RemotingClient(tls=client_tls(pki)) as client:
        assert client._ssl_context is not None
        client._ssl_context.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(RemotingConnectError, match="TLS handshake with"):
            await client.invoke(addr, RemotingCommand.request(ECHO), 5000)


# -- the server's certificate, seen from the client ----------------------------------------


async def test_server_certificate_verification(pki: Pki) -> None:
    async with serving(server_tls(pki)) as (_server, addr):
        await echo_fails(
            addr,
            TlsClientSettings(trust_cert_path=pki.other_ca),
            RemotingConnectError,
            "certificate verify failed",
        )
        # The system's trust store does not know the test CA either.
        await echo_fails(
            addr, TlsClientSettings(), RemotingConnectError, "certificate verify failed"
        )
        # RocketMQ's default (tls.client.authServer=false): any certificate.
        insecure = TlsClientSettings(trust_cert_path=pki.other_ca, verify_server=False)
        assert await echo_once(addr, insecure) == b"ping"


async def test_host_name_checks(pki: Pki) -> None:
    tls = TlsServerSettings(
        mode="enforcing", cert_path=pki.localhost_cert, key_path=pki.localhost_key
    )
    async with serving(tls) as (_server, addr):
        # The certificate names localhost, not 127.0.0.1.
        await echo_fails(addr, client_tls(pki), RemotingConnectError, "certificate verify failed")
        assert await echo_once(addr, client_tls(pki, server_hostname="localhost")) == b"ping"
        assert await echo_once(addr, client_tls(pki, check_hostname=False)) == b"ping"
        # Checking the chain only still refuses another CA's certificate.
        chain_only = TlsClientSettings(trust_cert_path=pki.other_ca, check_hostname=False)
        await echo_fails(addr, chain_only, RemotingConnectError, "certificate verify failed")


async def test_client_with_tls_disabled_in_its_settings_is_plain(pki: Pki) -> None:
    async with (
        serving(server_tls(pki, "permissive")) as (server, addr),
        RemotingClient(tls=client_tls(pki, enable=False)) as client,
    ):
        assert client.tls is None
        await client.invoke(addr, RemotingCommand.request(ECHO), 5000)
        assert [c.tls_version for c in server.connections] == [None]


async def test_bad_files_fail_at_start(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    server = RemotingServer(tls=TlsServerSettings(mode="enforcing", cert_path=missing))
    with pytest.raises(TlsConfigError, match="no such file"):
        await server.run()  # before listening
    with pytest.raises(TlsConfigError, match="no such file"):
        async with RemotingClient(tls=TlsClientSettings(trust_cert_path=missing)):
            pass


# -- hostile peers -------------------------------------------------------------------------


async def _raw(addr: str) -> trio.SocketStream:
    host, port = addr.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def _closed_within(stream: trio.SocketStream, seconds: float) -> float:
    """Read (and drop) what the server sends until it closes; the time it took."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # a reset: closed with our bytes unread
                break
            if not data:
                break
    await stream.aclose()
    return trio.current_time() - start


def _client_hello() -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, bytes]:
    """A TLS client in memory and its ClientHello."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return obj, incoming, outgoing, outgoing.read()


async def _silent(addr: str) -> trio.SocketStream:
    return await _raw(addr)


async def _tls_byte_then_nothing(addr: str) -> trio.SocketStream:
    stream = await _raw(addr)
    await stream.send_all(b"\x16")
    return stream


async def _half_client_hello(addr: str) -> trio.SocketStream:
    stream = await _raw(addr)
    hello = _client_hello()[3]
    await stream.send_all(hello[: len(hello) // 2])
    return stream


async def _stall_after_server_hello(addr: str) -> trio.SocketStream:
    """A whole ClientHello; the server answers (ServerHello...), the client never finishes."""
    stream = await _raw(addr)
    await stream.send_all(_client_hello()[3])
    return stream


HOSTILE = [_silent, _tls_byte_then_nothing, _half_client_hello, _stall_after_server_hello]


async def test_stalled_handshakes_are_closed_and_others_served(pki: Pki) -> None:
    timeout_ms = 1500
    async with serving(server_tls(pki, handshake_timeout_ms=timeout_ms)) as (server, addr):
        start = trio.current_time()
        streams = [await make(addr) for make in HOSTILE for _ in range(3)]
        # While they stall, others are served at once.
        with trio.fail_after(timeout_ms / 1000 / 2):
            assert await echo_once(addr, client_tls(pki)) == b"ping"
        elapsed: list[float] = []
        async with trio.open_nursery() as nursery:
            for stream in streams:

                async def watch(s: trio.SocketStream = stream) -> None:
                    elapsed.append(await _closed_within(s, 10))

                nursery.start_soon(watch)
        assert len(elapsed) == len(streams)
        total = trio.current_time() - start
        # Closed by the handshake timeout (not before it, not long after it).
        assert timeout_ms / 1000 * 0.9 <= total < timeout_ms / 1000 + 3
        assert await echo_once(addr, client_tls(pki)) == b"ping"
        await wait_until(lambda: server.connections == [], what="every connection closed")


async def test_garbage_after_tls_byte_is_closed_at_once(pki: Pki) -> None:
    async with serving(server_tls(pki, "permissive", handshake_timeout_ms=30_000)) as (_, addr):
        stream = await _raw(addr)
        await stream.send_all(b"\x16" + b"\x00\xff" * 200)
        # Not the 30 s handshake timeout: the handshake fails on the bytes.
        assert await _closed_within(stream, 5) < 5
        assert await echo_once(addr, client_tls(pki)) == b"ping"
        assert await echo_once(addr, None) == b"ping"


async def test_permissive_first_byte_waits_the_idle_timeout(pki: Pki) -> None:
    """A silent connection to a permissive server is closed by the idle timeout (a plain
    client may be slow to send); a TLS one that stops after its first byte by the handshake
    timeout, though the idle timeout is long."""
    tls = server_tls(pki, "permissive", handshake_timeout_ms=600)
    async with serving(tls, idle_timeout_ms=60_000) as (_server, addr):
        stream = await _tls_byte_then_nothing(addr)
        assert await _closed_within(stream, 5) < 5
        silent = await _silent(addr)
        with pytest.raises(trio.TooSlowError):
            await _closed_within(silent, 1.5)  # longer than the handshake timeout
        await silent.aclose()
    async with serving(tls, idle_timeout_ms=800) as (_server, addr):
        silent = await _silent(addr)
        assert 0.5 < await _closed_within(silent, 5) < 5


async def test_disabled_closes_a_tls_client_hello(pki: Pki) -> None:
    async with serving(None) as (_server, addr):
        stream = await _raw(addr)
        await stream.send_all(_client_hello()[3])
        # The hello reads as a frame length far above the limit.
        assert struct.unpack(">i", _client_hello()[3][:4])[0] > 16 * 1024 * 1024
        assert await _closed_within(stream, 5) < 5


async def test_enforcing_closes_plain_bytes_at_once(pki: Pki) -> None:
    async with serving(server_tls(pki, handshake_timeout_ms=30_000)) as (_server, addr):
        stream = await _raw(addr)
        await stream.send_all(b"\x00\x00\x00\x10")  # a plain frame's length
        assert await _closed_within(stream, 5) < 5


# -- reloads -------------------------------------------------------------------------------


@pytest.fixture
def live_files(pki: Pki, tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the server's certificate and key, for a test to replace."""
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    return cert, key


async def test_certificate_reload(pki: Pki, tmp_path: Path, live_files: tuple[Path, Path]) -> None:
    cert, key = live_files
    tls = TlsServerSettings(
        mode="enforcing", cert_path=str(cert), key_path=str(key), reload_interval_ms=50
    )
    new_ca = trustme.CA()
    new_ca.cert_pem.write_to_path(str(tmp_path / "new-ca.pem"))
    trusts_new = TlsClientSettings(trust_cert_path=str(tmp_path / "new-ca.pem"))
    async with serving(tls) as (_server, addr), RemotingClient(tls=client_tls(pki)) as old:
        await old.invoke(addr, RemotingCommand.request(ECHO), 5000)
        await echo_fails(addr, trusts_new, RemotingConnectError, "certificate verify failed")
        # A new certificate and key (written one after the other).
        _write_leaf(new_ca.issue_cert("127.0.0.1"), cert, key)

        async def new_one_served() -> bool:
            async with RemotingClient(tls=trusts_new) as client:
                try:
                    await client.invoke(addr, RemotingCommand.request(ECHO), 5000)
                except RemotingConnectError:
                    return False
                return True

        await wait_until(new_one_served, what="the new certificate in use")
        # The connection opened before keeps its session.
        answer = await old.invoke(addr, RemotingCommand.request(ECHO, body=b"old"), 5000)
        assert answer.body_bytes() == b"old"
        # A file that does not load leaves the certificate in force.
        await trio.Path(cert).write_text("not a certificate")
        await trio.sleep(0.3)
        assert await echo_once(addr, trusts_new) == b"ping"

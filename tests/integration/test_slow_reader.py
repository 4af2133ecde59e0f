"""A client that pipelines requests and never reads the answers cannot take the broker's memory
or stall other clients: unsent answer bytes are bounded per connection
(the broker stops reading that connection's requests until it drains), and the bytes held for
incomplete frames are bounded across all connections."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from remoting import (
    RemotingClient,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    encode_frame,
)
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_broker_process import pull_request, send_request

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BODY = 128 * 1024  # 32 of them: one pull answer of 4 MiB
PULLS = 2000  # 8 GiB of answers if all were built


def _rss_mib(pid: int | None) -> float:
    assert pid is not None, "the broker is not running"
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


async def test_a_client_that_never_reads_is_held_back_alone(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        for i in range(32):
            resp = await client.invoke(
                broker.addr, send_request("Big", bytes([i]) * BODY, queue_id=0)
            )
            assert resp.code == ResponseCode.SUCCESS, resp
        base = _rss_mib(broker.pid)
        hostile = _connect(broker.addr)
        frames = b"".join(
            encode_frame(_opaque(pull_request("Big", 0, max_msgs=32, suspend_ms=0), i))
            for i in range(PULLS)
        )
        hostile.setblocking(False)
        sent = 0
        peak = base
        worst = 0.0
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                sent += hostile.send(frames[sent : sent + 65536])
            except BlockingIOError:
                pass
            # Another client keeps being answered while the hostile one is held back.
            t0 = time.monotonic()
            resp = await client.invoke(
                broker.addr,
                RemotingCommand.request(
                    RequestCode.GET_MAX_OFFSET,
                    {"topic": "Big", "queueId": "0"},
                    serialize_type=SerializeType.JSON,
                ),
                timeout_ms=20_000,
            )
            worst = max(worst, time.monotonic() - t0)
            assert resp.code == ResponseCode.SUCCESS
            peak = max(peak, _rss_mib(broker.pid))
            await trio.sleep(0.05)
        hostile.close()
    print(f"rss base {base:.0f} MiB, peak {peak:.0f} MiB; requests sent {sent}; "
          f"worst other-client answer {worst * 1000:.0f} ms")  # fmt: skip
    assert peak - base < 256, f"broker RSS grew by {peak - base:.0f} MiB"


def _opaque(cmd: RemotingCommand, n: int) -> RemotingCommand:
    cmd.opaque = n
    return cmd


async def test_partial_frames_are_bounded_across_connections(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr)
    base = _rss_mib(broker.pid)
    socks = [_connect(broker.addr) for _ in range(20)]
    chunk = b"\0" * (1024 * 1024)
    peak = base
    try:
        for sock in socks:
            sock.setblocking(False)
            # A frame of 16 MiB - 1 declared, never completed.
            try:
                sock.send(struct.pack(">ii", 16 * 1024 * 1024 - 1, 100))
            except BlockingIOError:
                pass
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            for sock in socks:
                try:
                    sock.send(chunk)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
            peak = max(peak, _rss_mib(broker.pid))
            await trio.sleep(0.02)
        async with RemotingClient(serialize_type=SerializeType.JSON) as client:
            with trio.fail_after(10):
                resp = await client.invoke(
                    broker.addr,
                    RemotingCommand.request(
                        RequestCode.GET_BROKER_RUNTIME_INFO, serialize_type=SerializeType.JSON
                    ),
                )
            assert resp.code == ResponseCode.SUCCESS
    finally:
        for sock in socks:
            sock.close()
    print(f"rss base {base:.0f} MiB, peak {peak:.0f} MiB")
    assert peak - base < 200, f"broker RSS grew by {peak - base:.0f} MiB"

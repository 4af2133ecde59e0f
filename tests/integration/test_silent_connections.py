"""Silent and half-frame connections are closed by the broker and the NameServer: idle ones
after `channel_idle_timeout_ms`, ones stuck inside a frame after `channel_read_timeout_ms`,
while a client that keeps talking is left alone."""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Callable

import pytest

from remoting import RemotingCommand, RequestCode, SerializeType, encode_frame
from tests.integration.procs import BrokerProc, NamesrvProc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = {"TRIMQ_CHANNEL_IDLE_TIMEOUT_MS": "1500", "TRIMQ_CHANNEL_READ_TIMEOUT_MS": "1000"}
# Nothing may be closed for this long after the timeouts are due (1.25x + one scan).
DEADLINE_S = 8.0


def _connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_peer(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _heartbeat(sock: socket.socket, opaque: int) -> None:
    cmd = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO, None, None,
                                  serialize_type=SerializeType.JSON)  # fmt: skip
    cmd.opaque = opaque
    sock.sendall(encode_frame(cmd))
    sock.settimeout(5)
    length = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    assert len(sock.recv(length, socket.MSG_WAITALL)) == length


@pytest.mark.parametrize("server", ["broker", "namesrv"])
def test_silent_and_half_frame_connections_are_closed(
    server: str,
    start_namesrv: Callable[..., NamesrvProc],
    start_broker: Callable[..., BrokerProc],
) -> None:
    namesrv = start_namesrv(env=FAST)
    proc = start_broker(namesrv.addr, env=FAST) if server == "broker" else namesrv
    silent = [_connect(proc.addr) for _ in range(50)]
    half = [_connect(proc.addr) for _ in range(10)]
    for sock in half:
        # A length word promising 1,000 bytes, then the start of the header word only.
        sock.sendall(struct.pack(">i", 1000) + b"\x00\x00")
    talker = _connect(proc.addr)
    start = time.monotonic()
    opaque = 0
    open_ = silent + half
    while open_ and time.monotonic() - start < DEADLINE_S:
        opaque += 1
        _heartbeat(talker, opaque)
        open_ = [s for s in open_ if not _closed_by_peer(s)]
        time.sleep(0.25)
    try:
        assert not open_, f"{len(open_)} of 60 silent connections still open after {DEADLINE_S} s"
        _heartbeat(talker, opaque + 1)  # the talking client was never cut off
        log = proc.log_text()
        assert "remoting_read_timeout" in log
        assert "remoting_idle_closed" in log
    finally:
        for sock in [*silent, *half, talker]:
            sock.close()

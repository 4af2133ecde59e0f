"""Container health check: `trimq-healthcheck namesrv|broker` (exit 0 = healthy).

namesrv: the NameServer on this container answers GET_BROKER_CLUSTER_INFO.
broker:  at least one NameServer of TRIMQ_NAMESRV_ADDR lists this broker (TRIMQ_BROKER_NAME,
         TRIMQ_BROKER_ID) at its advertised address (TRIMQ_ADVERTISE), i.e. it is registered.

Standalone on purpose (stdlib only, one JSON RemotingCommand over a plain socket): it starts
fast and checks the wire protocol exactly as a client sees it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

GET_BROKER_CLUSTER_INFO = 106
TIMEOUT_S = 2.0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def cluster_info(addr: str) -> dict[str, object]:
    """Ask the NameServer at `addr` for cluster info; the decoded JSON body."""
    host, _, port = addr.strip().rpartition(":")
    header = json.dumps(
        {
            "code": GET_BROKER_CLUSTER_INFO,
            "flag": 0,
            "language": "PYTHON",
            "opaque": 1,
            "serializeTypeCurrentRPC": "JSON",
            "version": 0,
            "extFields": {},
        }
    ).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(frame)
        (total,) = struct.unpack(">I", _recv_exact(sock, 4))
        data = _recv_exact(sock, total)
    (mark,) = struct.unpack(">I", data[:4])
    if mark >> 24 != 0:
        raise ValueError("expected a JSON header")
    header_len = mark & 0xFFFFFF
    reply = json.loads(data[4 : 4 + header_len])
    if reply.get("code") != 0:
        raise ValueError(f"code {reply.get('code')}: {reply.get('remark')}")
    body = data[4 + header_len :]
    return json.loads(body) if body else {}


def broker_registered(info: dict[str, object], name: str, broker_id: str, addr: str) -> bool:
    table = info.get("brokerAddrTable")
    if not isinstance(table, dict):
        return False
    entry = table.get(name)
    if not isinstance(entry, dict):
        return False
    addrs = entry.get("brokerAddrs")
    return isinstance(addrs, dict) and addrs.get(broker_id) == addr


def main(argv: list[str]) -> int:
    role = argv[1] if len(argv) > 1 else "broker"
    env = os.environ
    if role == "namesrv":
        port = env.get("TRIMQ_LISTEN", "0.0.0.0:9876").rpartition(":")[2]
        try:
            cluster_info(f"127.0.0.1:{port}")
        except (OSError, ValueError) as exc:
            print(f"namesrv not answering: {exc}")
            return 1
        return 0
    name = env.get("TRIMQ_BROKER_NAME", "broker-a")
    broker_id = env.get("TRIMQ_BROKER_ID", "0")
    addr = env.get("TRIMQ_ADVERTISE", "")
    errors = []
    for ns in filter(None, (a.strip() for a in env.get("TRIMQ_NAMESRV_ADDR", "").split(";"))):
        try:
            if broker_registered(cluster_info(ns), name, broker_id, addr):
                return 0
            errors.append(f"{ns}: not listed")
        except (OSError, ValueError) as exc:
            errors.append(f"{ns}: {exc}")
    print(f"{name} at {addr} not registered: " + "; ".join(errors or ["no NameServer"]))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

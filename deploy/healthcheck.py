"""Container health check: `trimq-healthcheck namesrv|broker` (exit 0 = healthy).

namesrv: the NameServer on this container answers GET_BROKER_CLUSTER_INFO.
broker:  at least one NameServer of TRIMQ_NAMESRV_ADDR lists this broker (TRIMQ_BROKER_NAME,
         TRIMQ_BROKER_ID) at its advertised address (TRIMQ_ADVERTISE), i.e. it is registered;
         a SLAVE (TRIMQ_BROKER_ROLE) also has its HA connection to its master open (its own
         GET_BROKER_HA_STATUS: `haClientRuntimeInfo.activated`). A master's health does not
         depend on its slaves (it serves without one); a SYNC_MASTER's output shows how many are
         in sync (`inSyncSlaveNums`; with none, its sends are answered SLAVE_NOT_AVAILABLE).

Standalone on purpose (stdlib only, one JSON RemotingCommand over a plain socket): it starts
fast and checks the wire protocol exactly as a client sees it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from collections.abc import Mapping

GET_BROKER_CLUSTER_INFO = 106
GET_BROKER_HA_STATUS = 907
TIMEOUT_S = 2.0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def request(addr: str, code: int) -> dict[str, object]:
    """Send request `code` (no fields, no body) to `addr`; the decoded JSON body of a
    successful answer (ValueError for any other)."""
    host, _, port = addr.strip().rpartition(":")
    header = json.dumps(
        {
            "code": code,
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
    decoded = json.loads(body) if body else {}
    return decoded if isinstance(decoded, dict) else {}


def cluster_info(addr: str) -> dict[str, object]:
    """Ask the NameServer at `addr` for cluster info; the decoded JSON body."""
    return request(addr, GET_BROKER_CLUSTER_INFO)


def broker_registered(info: dict[str, object], name: str, broker_id: str, addr: str) -> bool:
    table = info.get("brokerAddrTable")
    if not isinstance(table, dict):
        return False
    entry = table.get(name)
    if not isinstance(entry, dict):
        return False
    addrs = entry.get("brokerAddrs")
    return isinstance(addrs, dict) and addrs.get(broker_id) == addr


def ha_status(env: Mapping[str, str]) -> dict[str, object]:
    """This broker's GET_BROKER_HA_STATUS, asked on its own listen port."""
    port = env.get("TRIMQ_LISTEN", "0.0.0.0:10911").rpartition(":")[2]
    return request(f"127.0.0.1:{port}", GET_BROKER_HA_STATUS)


def slave_linked(env: Mapping[str, str]) -> str | None:
    """None when this slave's HA client is connected to its master, else why not."""
    try:
        status = ha_status(env)
    except (OSError, ValueError) as exc:
        return f"no HA status: {exc}"
    client = status.get("haClientRuntimeInfo")
    if not isinstance(client, dict) or not client.get("activated"):
        master = client.get("masterAddr") if isinstance(client, dict) else None
        return f"HA connection to master {master} not open"
    return None


def master_note(env: Mapping[str, str]) -> str:
    """A master's slaves in sync, for the check's output (never a reason to fail)."""
    try:
        status = ha_status(env)
    except (OSError, ValueError) as exc:
        return f"HA status unknown ({exc})"
    return f"{status.get('inSyncSlaveNums', 0)} slave(s) in sync"


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
    broker_role = env.get("TRIMQ_BROKER_ROLE", "ASYNC_MASTER").upper()
    addr = env.get("TRIMQ_ADVERTISE", "")
    errors = []
    registered = False
    for ns in filter(None, (a.strip() for a in env.get("TRIMQ_NAMESRV_ADDR", "").split(";"))):
        try:
            if broker_registered(cluster_info(ns), name, broker_id, addr):
                registered = True
                break
            errors.append(f"{ns}: not listed")
        except (OSError, ValueError) as exc:
            errors.append(f"{ns}: {exc}")
    if not registered:
        print(f"{name} at {addr} not registered: " + "; ".join(errors or ["no NameServer"]))
        return 1
    if broker_role == "SLAVE":
        why = slave_linked(env)
        if why is not None:
            print(f"{name} slave {broker_id} at {addr} registered, but {why}")
            return 1
        print(f"{name} slave {broker_id} at {addr} registered, replicating")
        return 0
    if broker_role == "SYNC_MASTER":
        print(f"{name} SYNC_MASTER at {addr} registered; {master_note(env)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

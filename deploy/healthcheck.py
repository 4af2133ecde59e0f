"""Container health check: `trimq-healthcheck namesrv|broker|controller|etcd` (exit 0 =
healthy).

namesrv:    the NameServer on this container answers GET_BROKER_CLUSTER_INFO.
broker:     at least one NameServer of TRIMQ_NAMESRV_ADDR lists this broker (TRIMQ_BROKER_NAME,
            TRIMQ_BROKER_ID) at its advertised address (TRIMQ_ADVERTISE), i.e. it is registered;
            a SLAVE (TRIMQ_BROKER_ROLE) also has its HA connection to its master open (its own
            GET_BROKER_HA_STATUS: `haClientRuntimeInfo.activated`). A master's health does not
            depend on its slaves (it serves without one); a SYNC_MASTER's output shows how many
            are in sync (`inSyncSlaveNums`; with none, its sends are answered
            SLAVE_NOT_AVAILABLE). In controller mode (TRIMQ_ENABLE_CONTROLLER_MODE) the
            controllers assign the id: listed under its name at its address with any id (0 as
            master), i.e. it has a role; the output names it.
controller: the controller on this container answers CONTROLLER_GET_METADATA_INFO and names a
            leader (with etcd unreachable there is none, and nothing can be elected).
etcd:       the member's /health on its client port (ETCD_LISTEN_CLIENT_URLS' port, 2379)
            says true: it is part of a cluster that has a leader.

Secured servers (deploy/docker-compose.secure.yml): a port whose TRIMQ_TLS_MODE is enforcing is
spoken to with TLS, and so are the NameServers a broker connects to with TLS (TRIMQ_TLS_ENABLE,
else its tls_mode enforcing), as the server itself would: trust TRIMQ_TLS_CLIENT_TRUST_CERT_PATH
(else TRIMQ_TLS_SERVER_TRUST_CERT_PATH; neither: any certificate, the check being about
liveness), host names checked unless TRIMQ_TLS_CLIENT_CHECK_HOSTNAME is false, the certificate
TRIMQ_TLS_CLIENT_CERT_PATH/_KEY_PATH presented (else, when the server asks for client
certificates, the server's own, TRIMQ_TLS_SERVER_CERT_PATH/_KEY_PATH). With
TRIMQ_ACL_ACCESS_KEY and TRIMQ_ACL_SECRET_KEY (a broker's own account) every request is signed
as RocketMQ's clients sign (HmacSHA1 over the extField values in key order, then the body); a
NameServer's route reads need no account.

Standalone on purpose (stdlib only, one JSON RemotingCommand over a socket): it starts fast and
checks the wire protocol exactly as a client sees it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import socket
import ssl
import struct
import sys
from collections.abc import Mapping

GET_BROKER_CLUSTER_INFO = 106
GET_BROKER_HA_STATUS = 907
CONTROLLER_GET_METADATA_INFO = 1005
TIMEOUT_S = 2.0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


class Security:
    """How to reach a server: TLS context (None: plain TCP) and ACL account (None: unsigned).

    A plain class: the integration tests load this file without registering it as a module,
    which a dataclass cannot take."""

    def __init__(
        self,
        tls: ssl.SSLContext | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.tls = tls
        self.access_key = access_key
        self.secret_key = secret_key

    def sign(self, fields: dict[str, str], body: bytes = b"") -> dict[str, str]:
        """`fields` with AccessKey and Signature (common.acl.RequestSigner's rule), or as they
        are without an account."""
        if not self.access_key or not self.secret_key:
            return fields
        signed = {**fields, "AccessKey": self.access_key}
        content = "".join(signed[k] for k in sorted(signed)).encode() + body
        digest = hmac.new(self.secret_key.encode(), content, hashlib.sha1).digest()
        return {**signed, "Signature": base64.b64encode(digest).decode()}


PLAIN = Security()


def _truthy(value: str | None, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """The client context of the TRIMQ_TLS_* settings (module docstring)."""
    trust = env.get("TRIMQ_TLS_CLIENT_TRUST_CERT_PATH") or env.get(
        "TRIMQ_TLS_SERVER_TRUST_CERT_PATH"
    )
    ctx = ssl.create_default_context(cafile=trust) if trust else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    verify = _truthy(env.get("TRIMQ_TLS_CLIENT_VERIFY_SERVER"), True) and bool(trust)
    ctx.check_hostname = verify and _truthy(env.get("TRIMQ_TLS_CLIENT_CHECK_HOSTNAME"), True)
    if not verify:
        ctx.verify_mode = ssl.CERT_NONE
    cert, key = env.get("TRIMQ_TLS_CLIENT_CERT_PATH"), env.get("TRIMQ_TLS_CLIENT_KEY_PATH")
    password = env.get("TRIMQ_TLS_CLIENT_KEY_PASSWORD")
    if not cert and env.get("TRIMQ_TLS_SERVER_NEED_CLIENT_AUTH", "none").lower() != "none":
        cert, key = env.get("TRIMQ_TLS_SERVER_CERT_PATH"), env.get("TRIMQ_TLS_SERVER_KEY_PATH")
        password = env.get("TRIMQ_TLS_SERVER_KEY_PASSWORD")
    if cert:
        ctx.load_cert_chain(cert, key or None, password or None)
    return ctx


def securities(env: Mapping[str, str]) -> tuple[Security, Security]:
    """(for this container's own port, for the NameServers it connects to)."""
    mode = env.get("TRIMQ_TLS_MODE", "disabled").strip().lower()
    enable = env.get("TRIMQ_TLS_ENABLE", "").strip()
    outgoing = _truthy(enable, False) if enable else mode == "enforcing"
    # A permissive port takes plain and TLS alike: TLS there only when the broker uses it.
    own = mode == "enforcing" or (mode == "permissive" and outgoing)
    ctx = tls_context(env) if own or outgoing else None
    ak, sk = env.get("TRIMQ_ACL_ACCESS_KEY"), env.get("TRIMQ_ACL_SECRET_KEY")
    return (
        Security(ctx if own else None, ak, sk),
        Security(ctx if outgoing else None, ak, sk),
    )


def request(addr: str, code: int, security: Security = PLAIN) -> dict[str, object]:
    """Send request `code` (no fields, no body) to `addr`; the decoded JSON body of a
    successful answer (ValueError for any other)."""
    _, body = call(addr, code, security)
    return body


def call(
    addr: str, code: int, security: Security = PLAIN
) -> tuple[dict[str, object], dict[str, object]]:
    """Send request `code` (no fields, no body) to `addr`; the answer's header fields
    (extFields) and decoded JSON body when it succeeded (ValueError for any other answer;
    OSError, ssl.SSLError included, when it cannot be reached)."""
    host, _, port = addr.strip().rpartition(":")
    header = json.dumps(
        {
            "code": code,
            "flag": 0,
            "language": "PYTHON",
            "opaque": 1,
            "serializeTypeCurrentRPC": "JSON",
            "version": 0,
            "extFields": security.sign({}),
        }
    ).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as raw:
        sock = (
            raw
            if security.tls is None
            else security.tls.wrap_socket(raw, server_hostname=host.strip("[]"))
        )
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
    fields = reply.get("extFields")
    return (
        fields if isinstance(fields, dict) else {},
        decoded if isinstance(decoded, dict) else {},
    )


def cluster_info(addr: str, security: Security = PLAIN) -> dict[str, object]:
    """Ask the NameServer at `addr` for cluster info; the decoded JSON body."""
    return request(addr, GET_BROKER_CLUSTER_INFO, security)


def registered_ids(info: dict[str, object], name: str, addr: str) -> list[str]:
    """The broker ids the cluster info lists `addr` under for broker name `name`."""
    table = info.get("brokerAddrTable")
    if not isinstance(table, dict):
        return []
    entry = table.get(name)
    if not isinstance(entry, dict):
        return []
    addrs = entry.get("brokerAddrs")
    if not isinstance(addrs, dict):
        return []
    return [str(bid) for bid, a in addrs.items() if a == addr]


def broker_registered(info: dict[str, object], name: str, broker_id: str, addr: str) -> bool:
    return broker_id in registered_ids(info, name, addr)


def _flag(env: Mapping[str, str], key: str) -> bool:
    return env.get(key, "").strip().lower() in ("1", "true", "yes", "on")


def _listen_port(env: Mapping[str, str], default: str) -> str:
    return env.get("TRIMQ_LISTEN", f"0.0.0.0:{default}").rpartition(":")[2]


def controller_health(env: Mapping[str, str]) -> tuple[bool, str]:
    """(healthy, output) of the controller on this container."""
    addr = f"127.0.0.1:{_listen_port(env, '9878')}"
    try:
        fields, _ = call(addr, CONTROLLER_GET_METADATA_INFO)
    except (OSError, ValueError) as exc:
        return False, f"controller not answering: {exc}"
    leader = fields.get("controllerLeaderAddress")
    if not leader:
        return False, "controller answering, but the controllers have no leader"
    me = "leader" if str(fields.get("isLeader")).lower() == "true" else "follower"
    return True, f"controller {me}; leader {leader}"


def etcd_health(env: Mapping[str, str]) -> tuple[bool, str]:
    """(healthy, output) of the etcd member on this container (GET /health)."""
    urls = env.get("ETCD_LISTEN_CLIENT_URLS", "http://127.0.0.1:2379")
    port = int(urls.split(",")[0].rstrip("/").rpartition(":")[2])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", "/health")
        answer = conn.getresponse()
        text = answer.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return False, f"etcd not answering: {exc}"
    finally:
        conn.close()
    try:
        healthy = answer.status == 200 and json.loads(text).get("health") == "true"
    except ValueError:
        healthy = False
    return healthy, f"etcd /health: {answer.status} {text.strip()}"


def ha_status(env: Mapping[str, str]) -> dict[str, object]:
    """This broker's GET_BROKER_HA_STATUS, asked on its own listen port."""
    port = env.get("TRIMQ_LISTEN", "0.0.0.0:10911").rpartition(":")[2]
    return request(f"127.0.0.1:{port}", GET_BROKER_HA_STATUS, securities(env)[0])


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
        try:
            cluster_info(f"127.0.0.1:{_listen_port(env, '9876')}", securities(env)[0])
        except (OSError, ValueError) as exc:
            print(f"namesrv not answering: {exc}")
            return 1
        return 0
    if role in ("controller", "etcd"):
        healthy, output = (controller_health if role == "controller" else etcd_health)(env)
        print(output)
        return 0 if healthy else 1
    name = env.get("TRIMQ_BROKER_NAME", "broker-a")
    controller_mode = _flag(env, "TRIMQ_ENABLE_CONTROLLER_MODE")
    broker_id = env.get("TRIMQ_BROKER_ID", "0")
    broker_role = env.get("TRIMQ_BROKER_ROLE", "ASYNC_MASTER").upper()
    addr = env.get("TRIMQ_ADVERTISE", "")
    errors = []
    ids: list[str] = []
    try:
        to_namesrv = securities(env)[1]
    except (OSError, ValueError) as exc:
        print(f"{name}: TLS settings unusable: {exc}")
        return 1
    for ns in filter(None, (a.strip() for a in env.get("TRIMQ_NAMESRV_ADDR", "").split(";"))):
        try:
            ids = registered_ids(cluster_info(ns, to_namesrv), name, addr)
        except (OSError, ValueError) as exc:
            errors.append(f"{ns}: {exc}")
            continue
        if ids and (controller_mode or broker_id in ids):
            break
        ids = []
        errors.append(f"{ns}: not listed")
    if not ids:
        print(f"{name} at {addr} not registered: " + "; ".join(errors or ["no NameServer"]))
        return 1
    if controller_mode:
        as_master = "0" in ids
        print(f"{name} at {addr} registered as {'master' if as_master else 'slave'} (id {ids[0]})")
        return 0
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

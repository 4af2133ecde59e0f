"""The secured trimq systems of the peers harness: ACL (`trimq-acl`) and TLS (`trimq-tls`).

Both are trimq-async (a NameServer and an ASYNC_FLUSH broker) with one security feature on for
both servers, set up from files generated per run in the system's scratch directory:

  - acl: `plain_acl.yml` with a broker account (the broker registers with it), an admin
    account (the harness creates the topics with it) and a bench account holding PUB|SUB on the
    bench topics and groups only; the clients sign every request with the bench account;
  - tls: a CA, a server certificate for 127.0.0.1 (`trustme`), `tls_mode = "enforcing"` on
    both servers (the broker connects to the NameServer with TLS too); the clients connect
    with TLS and the CA as their trust, verifying the certificate and its host name.

Secrets are random per run (`secrets.token_urlsafe`); files are written 0600. Servers read a
TOML `--config`; clients get their settings through the environment (TRIMQ_ACCESS_KEY, ...,
read by `ClientConfig`), so no secret is on a command line.

Once the servers are up, `verify` checks that the system really is secured, so a row can never
measure an open broker: with ACL, an unsigned request and one signed with a wrong secret are
refused NO_PERMISSION by the broker and the NameServer and a signed one is served; with TLS, a
plain connection gets no answer from either server and a TLS one does.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import trio

from common.acl import RequestSigner
from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode
from remoting.logs import configure_logging
from remoting.protocol.headers import GetMaxOffsetRequestHeader
from remoting.tls import TlsClientSettings

MODES = ("acl", "tls")
TOPICS = ("Bench", "BenchE2E", "BenchSeq")
# The consumer groups of W3 (mqbench consumer -g) and W4 (trimq_e2e).
GROUPS = ("bench_w3", "bench_w4")
BROKER_KEY = "bench-broker"
ADMIN_KEY = "bench-admin"
BENCH_KEY = "bench-client"
CLUSTER = "DefaultCluster"
NO_PERMISSION = 16
SUCCESS = 0


@dataclass
class Material:
    """What one secured system runs with: each server's settings and the clients'."""

    # Every field but the mode and the CA may hold a secret key: none is in the repr.
    mode: str
    namesrv: dict[str, object] = field(default_factory=dict, repr=False)
    broker: dict[str, object] = field(default_factory=dict, repr=False)
    # The bench clients' (mqbench, trimq_e2e) and the admin's (mqadmin updateTopic) variables.
    client_env: dict[str, str] = field(default_factory=dict, repr=False)
    admin_env: dict[str, str] = field(default_factory=dict, repr=False)
    bench_secret: str = field(default="", repr=False)
    ca: str = ""


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` 0600 before the secret goes in (replacing any earlier file)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def acl_yaml(broker_secret: str, admin_secret: str, bench_secret: str) -> str:
    """The accounts: broker (bound to the cluster), admin, and the bench account with PUB|SUB
    on `TOPICS` and `GROUPS` and nothing else (default DENY)."""
    q = json.dumps  # a JSON string is a YAML double-quoted scalar
    lines = [
        "globalWhiteRemoteAddresses: []",
        "accounts:",
        f"  - accessKey: {q(BROKER_KEY)}",
        f"    secretKey: {q(broker_secret)}",
        "    broker: true",
        f"    brokerClusters: [{q(CLUSTER)}]",
        f"  - accessKey: {q(ADMIN_KEY)}",
        f"    secretKey: {q(admin_secret)}",
        "    admin: true",
        f"  - accessKey: {q(BENCH_KEY)}",
        f"    secretKey: {q(bench_secret)}",
        "    defaultTopicPerm: DENY",
        "    defaultGroupPerm: DENY",
        "    topicPerms:",
        *(f"      - {q(t + '=PUB|SUB')}" for t in TOPICS),
        "    groupPerms:",
        *(f"      - {q(g + '=PUB|SUB')}" for g in GROUPS),
    ]
    return "\n".join(lines) + "\n"


def make_material(mode: str, directory: Path) -> Material:
    """Generate `mode`'s files in `directory` (created 0700) and the settings that use them."""
    if mode not in MODES:
        raise ValueError(f"unknown secured mode {mode!r} ({', '.join(MODES)})")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    if mode == "acl":
        broker_secret, admin_secret, bench_secret = (secrets.token_urlsafe(24) for _ in range(3))
        acl = directory / "plain_acl.yml"
        _write_private(acl, acl_yaml(broker_secret, admin_secret, bench_secret).encode())
        on = {"acl_enable": True, "acl_file": str(acl)}
        return Material(
            mode,
            namesrv=dict(on),
            broker={**on, "acl_access_key": BROKER_KEY, "acl_secret_key": broker_secret},
            client_env={"TRIMQ_ACCESS_KEY": BENCH_KEY, "TRIMQ_SECRET_KEY": bench_secret},
            admin_env={"TRIMQ_ACCESS_KEY": ADMIN_KEY, "TRIMQ_SECRET_KEY": admin_secret},
            bench_secret=bench_secret,
        )
    import trustme  # the dev extra's (the TLS tests'); only this mode needs it

    ca = trustme.CA(organization_name="trimq bench")
    leaf = ca.issue_cert("127.0.0.1", "localhost", common_name="trimq-bench-server")
    ca_path, cert, key = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    _write_private(key, leaf.private_key_pem.bytes())
    server = {
        "tls_mode": "enforcing",
        "tls_server_cert_path": str(cert),
        "tls_server_key_path": str(key),
    }
    env = {"TRIMQ_USE_TLS": "true", "TRIMQ_TLS_TRUST_CERT_PATH": str(ca_path)}
    return Material(
        mode,
        namesrv=dict(server),
        # The broker's own connections (registration) use TLS as tls_mode is enforcing.
        broker={**server, "tls_client_trust_cert_path": str(ca_path)},
        client_env=dict(env),
        admin_env=dict(env),
        ca=str(ca_path),
    )


def write_toml(path: Path, settings: Mapping[str, object]) -> Path:
    """`settings` as a flat TOML file (0600: it may hold the broker's secret key)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]  # JSON scalars are TOML
    _write_private(path, ("\n".join(lines) + "\n").encode())
    return path


# ---- the check that the system is secured ----------------------------------------------------


def _max_offset_request() -> RemotingCommand:
    fields = GetMaxOffsetRequestHeader(topic=TOPICS[0], queue_id=0).to_fields()
    return RemotingCommand.request(RequestCode.GET_MAX_OFFSET, fields)


def _delete_kv_request() -> RemotingCommand:
    fields = {"namespace": "bench-acl-probe", "key": "absent"}
    return RemotingCommand.request(RequestCode.DELETE_KV_CONFIG, fields)


async def _code(client: RemotingClient, addr: str, cmd: RemotingCommand) -> int:
    return int((await client.invoke(addr, cmd, 5000)).code)


async def _verify_acl(material: Material, ns: str, broker: str) -> list[str]:
    signed = RequestSigner(BENCH_KEY, material.bench_secret)
    forged = RequestSigner(BENCH_KEY, material.bench_secret + "x")
    async with (
        RemotingClient() as plain,
        RemotingClient(before_send=signed) as good,
        RemotingClient(before_send=forged) as bad,
    ):
        got = {
            "broker unsigned": await _code(plain, broker, _max_offset_request()),
            "broker wrong secret": await _code(bad, broker, _max_offset_request()),
            "broker signed": await _code(good, broker, _max_offset_request()),
            # A code for broker and admin accounts only (a key nobody wrote: harmless if served).
            "namesrv unsigned": await _code(plain, ns, _delete_kv_request()),
            "namesrv bench account": await _code(good, ns, _delete_kv_request()),
        }
    want = {
        "broker unsigned": NO_PERMISSION,
        "broker wrong secret": NO_PERMISSION,
        "broker signed": SUCCESS,
        "namesrv unsigned": NO_PERMISSION,
        "namesrv bench account": NO_PERMISSION,
    }
    wrong = [f"{k}: code {got[k]} (expected {v})" for k, v in want.items() if got[k] != v]
    if wrong:
        raise RuntimeError("trimq-acl is not secured as it should be: " + "; ".join(wrong))
    return [f"{k}: code {got[k]}" for k in want]


async def _verify_tls(material: Material, ns: str, broker: str) -> list[str]:
    out = []
    tls = TlsClientSettings(trust_cert_path=material.ca)
    probes = (
        ("namesrv", ns, RequestCode.GET_BROKER_CLUSTER_INFO),
        ("broker", broker, RequestCode.GET_BROKER_RUNTIME_INFO),
    )
    async with RemotingClient() as plain, RemotingClient(tls=tls) as secured:
        for name, addr, code in probes:
            try:
                got = await _code(plain, addr, RemotingCommand.request(code))
            except RemotingError as exc:
                out.append(f"{name} plain: no answer ({type(exc).__name__})")
            else:
                raise RuntimeError(f"trimq-tls: {name} answered a plain connection (code {got})")
            got = await _code(secured, addr, RemotingCommand.request(code))
            if got != SUCCESS:
                raise RuntimeError(f"trimq-tls: {name} answered code {got} over TLS")
            out.append(f"{name} TLS: code {got}")
    return out


def verify(material: Material, ns: str, broker: str) -> list[str]:
    """Check the system is secured (see the module's docstring); what was seen, one line per
    probe. Raises RuntimeError when it is not."""
    configure_logging("error")  # the harness's console: no client connection events
    probe = _verify_acl if material.mode == "acl" else _verify_tls
    return trio.run(probe, material, ns, broker)

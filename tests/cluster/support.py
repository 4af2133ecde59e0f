"""Helpers of the cluster tests: the compose cluster, a steady producer load, consumer host
processes, and the per-scenario accounting (sent, acked, consumed, duplicates, lost)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

import client.producer as producer_module
from client import ClientConfig, Message, MessageQueue, Producer, SendResult, SendStatus
from common.message import MessageDecodeError, decode_offset_msg_id
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol.route import ClusterInfo, TopicRouteData
from tests.helpers import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
# The secured variant: an overlay on COMPOSE_FILE (ACL and TLS enforcing), and the script that
# makes its certificates, accounts and secrets.
SECURE_OVERLAY = REPO / "deploy" / "docker-compose.secure.yml"
MAKE_SECURE = REPO / "deploy" / "make_secure.py"
# Masters (broker id 0) and their slaves (the master's broker name, broker id 1).
BROKERS = ("broker-a", "broker-b", "broker-c")
SLAVES = ("broker-a-s", "broker-b-s", "broker-c-s")
ALL_BROKERS = (*BROKERS, *SLAVES)
MASTER_OF = dict(zip(SLAVES, BROKERS, strict=True))
NAMESRVS = ("namesrv1", "namesrv2")
CLUSTER_NAME = "DefaultCluster"
BROKER_ROLE = "SYNC_MASTER"
# The compose project's ports: NameServers, masters, masters' HA ports, slaves.
PORT_COUNT = len(NAMESRVS) + 2 * len(BROKERS) + len(SLAVES)

# Short timings for the tests (the compose file's defaults are RocketMQ's).
REGISTER_PERIOD_MS = 2000
BROKER_EXPIRED_MS = 6000
NAMESRV_SCAN_MS = 1000
REBALANCE_MS = 2000
SEND_TIMEOUT_MS = 3000
# A SYNC_MASTER's wait for its slave: well under the send timeout, so a send to a master whose
# slave is gone is answered FLUSH_SLAVE_TIMEOUT (and moved elsewhere) rather than timing out.
SLAVE_TIMEOUT_MS = 1500
SLAVE_SYNC_INTERVAL_MS = 1000
HA_HEARTBEAT_MS = 1000
HA_HOUSEKEEPING_MS = 5000
# The commitlog file size of the test cluster (small: files are preallocated).
COMMITLOG_FILE_SIZE = 64 * 1024 * 1024


def compose_command() -> list[str]:
    """`docker compose` when the plugin is there, else `docker-compose`."""
    probe = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, check=False, timeout=30
    )
    if probe.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise RuntimeError("neither `docker compose` nor `docker-compose` is available")


def _env_key(service: str) -> str:
    """broker-a -> BROKER_A, broker-a-s -> BROKER_A_S (the compose file's port variables)."""
    return service.upper().replace("-", "_")


class ComposeProject:
    """One compose project of a compose file (or a file and overlays), driven through
    `docker-compose` / `docker`.

    `env` is the environment compose runs with (ports and settings of the file);
    `services` what `wait_healthy` waits for by default.
    """

    def __init__(
        self,
        project: str,
        compose_file: Path | Sequence[Path],
        env: dict[str, str],
        services: Sequence[str],
    ) -> None:
        self.project = project
        self.services = tuple(services)
        files = [compose_file] if isinstance(compose_file, Path) else list(compose_file)
        self.base = [*compose_command(), "-p", project, *(a for f in files for a in ("-f", str(f)))]
        self.env = {**os.environ, **env}
        # Where the logs of removed containers are saved (conftest sets it).
        self.logdir: Path | None = None
        self._removed = 0

    # -- docker ---------------------------------------------------------------------------
    def compose(self, *args: str, timeout: float = 180) -> str:
        """Run a compose command; its output, or RuntimeError with the output."""
        proc = subprocess.run(
            [*self.base, *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"compose {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    def container(self, service: str) -> str:
        """The container id of a service (by compose labels: much faster than `compose ps`)."""
        out = subprocess.run(
            [
                "docker",
                "ps",
                "-aq",
                "--no-trunc",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--filter",
                f"label=com.docker.compose.service={service}",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        ids = out.stdout.split()
        if len(ids) != 1:
            raise RuntimeError(f"expected one container for {service}, found {ids}")
        return ids[0]

    def health(self, service: str) -> str:
        out = subprocess.run(
            [
                "docker",
                "inspect",
                "-f",
                "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}",
                self.container(service),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        return out.stdout.strip() or "unknown"

    def network(self, name: str | None = None) -> str:
        """The project's network `name` (the compose file's key), or its only network."""
        labels = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if name is not None:
            labels += ["--filter", f"label=com.docker.compose.network={name}"]
        out = subprocess.run(
            ["docker", "network", "ls", "-q", *labels, "--format", "{{.Name}}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        names = out.stdout.split()
        if len(names) != 1:
            raise RuntimeError(f"expected one network {name or ''} of {self.project}: {names}")
        return names[0]

    def docker(self, *args: str) -> None:
        subprocess.run(["docker", *args], capture_output=True, check=True, timeout=60)

    def disconnect(self, service: str, network: str | None = None) -> None:
        """Cut the service's container off the project's network (`network()`)."""
        self.docker("network", "disconnect", self.network(network), self.container(service))

    def reconnect(self, service: str, network: str | None = None) -> None:
        """Connect it again under its service name: the other containers reach it by that
        name (a plain `network connect` would drop the alias compose gave it)."""
        self.docker(
            "network",
            "connect",
            "--alias",
            service,
            self.network(network),
            self.container(service),
        )

    def volumes(self, service: str) -> list[str]:
        """The broker's store volume (`<service>-store` of the compose file), if it exists."""
        out = subprocess.run(
            [
                "docker",
                "volume",
                "ls",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--filter",
                f"label=com.docker.compose.volume={service}-store",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return out.stdout.split()

    def kill(self, *services: str) -> None:
        """SIGKILL the services' containers (docker directly: compose takes seconds)."""
        self.docker("kill", "-s", "KILL", *(self.container(s) for s in services))

    def start(self, *services: str) -> None:
        """Start the services' stopped containers again (same volumes and networks)."""
        self.docker("start", *(self.container(s) for s in services))

    def save_logs(self, service: str) -> None:
        """Keep the logs of a container about to be removed (`compose logs` shows only the
        containers there at the end)."""
        if self.logdir is None:
            return
        self._removed += 1
        path = self.logdir / f"{self.project}.removed-{self._removed}-{service}.log"
        proc = subprocess.run(
            ["docker", "logs", self.container(service)],
            capture_output=True,
            check=False,
            timeout=60,
        )
        path.write_bytes(proc.stdout + proc.stderr)

    def save_all_logs(self) -> Path | None:
        """`compose logs` of the project into the log directory; the file."""
        if self.logdir is None:
            return None
        path = self.logdir / f"{self.project}.log"
        path.write_text(self.compose("logs", "--no-color", "--timestamps", timeout=120))
        return path

    def remove_with_store(self, service: str) -> None:
        """Remove a broker's container (killed first when running) and its store volume: a lost
        machine. `compose up -d --no-deps <service>` brings it back empty."""
        self.compose("kill", "-s", "SIGKILL", service)
        try:
            self.save_logs(service)
        except RuntimeError:
            pass  # no container (removed before)
        self.compose("rm", "-f", service)
        for volume in self.volumes(service):
            self.docker("volume", "rm", volume)

    def commitlog_digest(self, service: str, start: int, end: int) -> tuple[str, int]:
        """sha256 of the broker's commitlog bytes [start, end) and how many bytes were read
        (fewer than end - start when the files do not cover the range)."""
        out = subprocess.run(
            [
                "docker",
                "exec",
                self.container(service),
                "python3",
                "-c",
                _DIGEST_SCRIPT,
                "/data/store/commitlog",
                str(start),
                str(end),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        digest, covered = out.stdout.split()
        return digest, int(covered)

    def wait_healthy(self, services: Sequence[str] | None = None, total: float = 90) -> None:
        deadline = time.monotonic() + total
        states: dict[str, str] = {}
        while True:
            states = {s: self.health(s) for s in services or self.services}
            if all(v == "healthy" for v in states.values()):
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"not healthy after {total}s: {states}")
            time.sleep(0.5)

    async def await_healthy(self, services: Sequence[str] | None = None, total: float = 90) -> None:
        await trio.to_thread.run_sync(lambda: self.wait_healthy(services, total))

    async def run(self, *args: str) -> str:
        """`compose(...)` from trio (in a worker thread: it blocks on a subprocess)."""
        return await trio.to_thread.run_sync(lambda: self.compose(*args))

    # -- clients --------------------------------------------------------------------------
    def client_settings(self, account: str = "app") -> dict[str, object]:
        """ClientConfig settings clients of this project need besides the NameServers (none
        here; a secured project's credentials and TLS, `SecureCluster`)."""
        return {}

    def client_env(self, account: str = "app") -> dict[str, str]:
        """The same as TRIMQ_* variables, for client processes."""
        return {}

    def remoting_client(self) -> RemotingClient:
        """A bare remoting client for the tests' own requests to NameServers and brokers."""
        return RemotingClient()


class Cluster(ComposeProject):
    """One compose project of deploy/docker-compose.yml with its own free ports.

    `ports`: PORT_COUNT distinct ports: the NameServers', the masters', the masters' HA ports,
    the slaves'. The masters run as BROKER_ROLE (SYNC_MASTER: an acknowledged send is on the
    slave too).
    """

    secure = False

    def __init__(
        self,
        project: str,
        ports: Sequence[int],
        image: str = "trimq:latest",
        *,
        compose_files: Sequence[Path] = (COMPOSE_FILE,),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        if len(ports) != PORT_COUNT:
            raise ValueError(f"expected {PORT_COUNT} ports, got {len(ports)}")
        n_ns, n_b = len(NAMESRVS), len(BROKERS)
        self.ns_ports = dict(zip(NAMESRVS, ports[:n_ns], strict=True))
        masters = ports[n_ns : n_ns + n_b]
        self.ha_ports = dict(zip(BROKERS, ports[n_ns + n_b : n_ns + 2 * n_b], strict=True))
        slaves = ports[n_ns + 2 * n_b :]
        self.broker_ports = {
            **dict(zip(BROKERS, masters, strict=True)),
            **dict(zip(SLAVES, slaves, strict=True)),
        }
        # Prometheus's published port: one more free port, outside the scenario's list.
        self.prometheus_port = _free_port()
        env = {
            "TRIMQ_IMAGE": image,
            "PROMETHEUS_PORT": str(self.prometheus_port),
            **{f"{_env_key(s)}_PORT": str(p) for s, p in self.ns_ports.items()},
            **{f"{_env_key(b)}_PORT": str(p) for b, p in self.broker_ports.items()},
            **{f"{_env_key(b)}_HA_PORT": str(p) for b, p in self.ha_ports.items()},
            "BROKER_ROLE": BROKER_ROLE,
            "FLUSH_DISK_TYPE": "SYNC_FLUSH",
            "NAMESRV_SCAN_INTERVAL_MS": str(NAMESRV_SCAN_MS),
            "BROKER_EXPIRED_MS": str(BROKER_EXPIRED_MS),
            "BROKER_REGISTER_PERIOD_MS": str(REGISTER_PERIOD_MS),
            "SLAVE_TIMEOUT_MS": str(SLAVE_TIMEOUT_MS),
            "SLAVE_SYNC_INTERVAL_MS": str(SLAVE_SYNC_INTERVAL_MS),
            "HA_HEARTBEAT_INTERVAL_MS": str(HA_HEARTBEAT_MS),
            "HA_HOUSEKEEPING_INTERVAL_MS": str(HA_HOUSEKEEPING_MS),
            "COMMITLOG_FILE_SIZE": str(COMMITLOG_FILE_SIZE),
            "CONSUME_QUEUE_FILE_SIZE": str(60_000 * 20),
            "HEALTH_INTERVAL": "1s",
            **(extra_env or {}),
        }
        super().__init__(project, compose_files, env, (*NAMESRVS, *ALL_BROKERS))

    def scenario_suffix(self) -> str:
        """What makes a scenario's topic and group names unique in this project."""
        return uuid.uuid4().hex[:8]

    # -- addresses ------------------------------------------------------------------------
    def ns_addr(self, service: str) -> str:
        return f"127.0.0.1:{self.ns_ports[service]}"

    @property
    def namesrv_addr(self) -> str:
        return ";".join(self.ns_addr(s) for s in NAMESRVS)

    def broker_addr(self, service: str) -> str:
        return f"127.0.0.1:{self.broker_ports[service]}"


class SecureCluster(Cluster):
    """The secured variant: deploy/docker-compose.yml with deploy/docker-compose.secure.yml
    (ACL on the NameServers and brokers, TLS enforcing with client certificates required).

    `secure_dir` is made by deploy/make_secure.py (`make_material`): the CA, the certificates,
    plain_acl.yml and the accounts' settings. The application account may use only the topics
    and groups `scenario_names` gives (`topic_of` / `group_of`), so the scenarios' names are
    fixed per project (`run_id`) instead of per scenario.
    """

    secure = True

    def __init__(
        self,
        project: str,
        ports: Sequence[int],
        secure_dir: Path,
        run_id: str,
        image: str = "trimq:latest",
    ) -> None:
        self.secure_dir = secure_dir
        self.run_id = run_id
        super().__init__(
            project,
            ports,
            image,
            compose_files=(COMPOSE_FILE, SECURE_OVERLAY),
            extra_env={"SECURE_DIR": str(secure_dir)},
        )
        self.accounts = {
            account: read_env_file(secure_dir / f"{account}.env") for account in ("admin", "app")
        }

    @staticmethod
    def topic_of(name: str, run_id: str) -> str:
        return f"cluster_{name}_{run_id}"

    @staticmethod
    def group_of(name: str, run_id: str) -> str:
        return f"cg_{name}_{run_id}"

    @classmethod
    def make_material(cls, secure_dir: Path, run_id: str, scenario_names: Sequence[str]) -> None:
        """Run deploy/make_secure.py: a topic and a group per scenario name for the
        application account."""
        args = [sys.executable, str(MAKE_SECURE), str(secure_dir), "--cluster", CLUSTER_NAME]
        for name in scenario_names:
            args += ["--topic", cls.topic_of(name, run_id), "--group", cls.group_of(name, run_id)]
        subprocess.run(args, check=True, capture_output=True, timeout=120)

    def scenario_suffix(self) -> str:
        return self.run_id

    def client_env(self, account: str = "app") -> dict[str, str]:
        return dict(self.accounts[account])

    def client_settings(self, account: str = "app") -> dict[str, object]:
        env = self.accounts[account]
        return {
            "access_key": env["TRIMQ_ACCESS_KEY"],
            "secret_key": env["TRIMQ_SECRET_KEY"],
            "use_tls": True,
            "tls_trust_cert_path": env["TRIMQ_TLS_TRUST_CERT_PATH"],
            "tls_cert_path": env["TRIMQ_TLS_CERT_PATH"],
            "tls_key_path": env["TRIMQ_TLS_KEY_PATH"],
        }

    def remoting_client(self) -> RemotingClient:
        """Signed with the admin account, over TLS with the client certificate."""
        config = ClientConfig(namesrv_addr=self.namesrv_addr, **self.client_settings("admin"))  # type: ignore[arg-type]
        return RemotingClient(tls=config.tls_settings(), before_send=config.request_signer())


def read_env_file(path: Path) -> dict[str, str]:
    """The KEY='value' lines deploy/make_secure.py writes."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip().strip("'")
    return out


# Run inside a broker's container: sha256 over the commitlog bytes [start, end) (files named by
# their 20-digit start offset), then the number of bytes read.
_DIGEST_SCRIPT = """
import hashlib, os, sys
root, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = hashlib.sha256()
covered = 0
for name in sorted(n for n in os.listdir(root) if len(n) == 20 and n.isdigit()):
    base = int(name)
    path = os.path.join(root, name)
    lo, hi = max(start, base), min(end, base + os.path.getsize(path))
    if lo >= hi:
        continue
    with open(path, "rb") as f:
        f.seek(lo - base)
        left = hi - lo
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            covered += len(chunk)
            left -= len(chunk)
print(h.hexdigest(), covered)
"""


# -- NameServer queries (a plain remoting client, no routing state) ----------------------------
async def ns_cluster_info(client: RemotingClient, addr: str) -> ClusterInfo | None:
    """The NameServer's cluster info, or None when it does not answer."""
    try:
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout_ms=2000
        )
    except Exception:
        return None
    if resp.code != ResponseCode.SUCCESS:
        return None
    return ClusterInfo.from_json(resp.body_bytes())


async def ns_brokers(client: RemotingClient, addr: str) -> dict[str, str] | None:
    """broker name -> master address as one NameServer sees them (None: not answering)."""
    info = await ns_cluster_info(client, addr)
    if info is None:
        return None
    out = {}
    for name, bd in info.broker_addr_table.items():
        master = bd.broker_addrs.get(0)
        if master:
            out[name] = master
    return out


async def ns_broker_addrs(client: RemotingClient, addr: str) -> dict[str, dict[int, str]] | None:
    """broker name -> {broker id: address} as one NameServer sees them (None: not answering)."""
    info = await ns_cluster_info(client, addr)
    if info is None:
        return None
    return {
        name: {int(k): v for k, v in bd.broker_addrs.items()}
        for name, bd in info.broker_addr_table.items()
    }


async def ns_route_brokers(client: RemotingClient, addr: str, topic: str) -> set[str] | None:
    """Broker names in the topic's route that have a master, i.e. where sends go, from one
    NameServer (None: no answer). A group whose master is gone stays in the route with its
    slave (for reads) and is not counted."""
    try:
        resp = await client.invoke(
            addr,
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
            timeout_ms=2000,
        )
    except Exception:
        return None
    if resp.code != ResponseCode.SUCCESS:
        return set() if resp.code == ResponseCode.TOPIC_NOT_EXIST else None
    route = TopicRouteData.from_json(resp.body_bytes())
    masters = {b.broker_name for b in route.broker_datas if 0 in map(int, b.broker_addrs)}
    return {q.broker_name for q in route.queue_datas} & masters


class NameServed(Protocol):
    """A compose project with NameServers clients on this host reach."""

    @property
    def namesrv_addr(self) -> str: ...

    def client_settings(self, account: str = "app") -> dict[str, object]: ...

    def client_env(self, account: str = "app") -> dict[str, str]: ...


def client_config(cluster: NameServed, account: str = "app", **kw: object) -> ClientConfig:
    """A client of the project (`account`: "app" for producers and consumers, "admin" for
    administration, where the project has accounts)."""
    values: dict[str, object] = {
        **cluster.client_settings(account),
        "namesrv_addr": cluster.namesrv_addr,
        "client_ip": "127.0.0.1",
        "poll_name_server_interval_ms": 1000,
        "heartbeat_broker_interval_ms": 1000,
        "send_timeout_ms": SEND_TIMEOUT_MS,
        "mq_client_api_timeout_ms": 3000,
    }
    values.update(kw)
    return ClientConfig(**values)  # type: ignore[arg-type]


# -- load ----------------------------------------------------------------------------------
def store_addr(result: SendResult) -> str:
    """The address of the broker that stored a sent message, from its offset message id (the
    store host: a broker's advertised address); "" when the id names none."""
    try:
        (host, port), _ = decode_offset_msg_id(result.offset_msg_id.split(",")[0])
    except MessageDecodeError:
        return ""
    return f"{host}:{port}"


@contextlib.contextmanager
def observed_send_results(observe: Callable[[SendResult], None]) -> Iterator[None]:
    """Call `observe` with every send answer the producers of this process get, also the ones
    a producer then tries again on another broker (retry_another_broker_when_not_store_ok),
    which the application never sees. The client has no send hook: this wraps the function
    its send path builds results with."""
    name = "send_result"  # AttributeError here when the send path no longer has it
    build: Callable[[RemotingCommand, MessageQueue, str], SendResult] = getattr(
        producer_module, name
    )

    def observing(resp: RemotingCommand, mq: MessageQueue, msg_id: str) -> SendResult:
        result = build(resp, mq, msg_id)
        observe(result)
        return result

    setattr(producer_module, name, observing)
    try:
        yield
    finally:
        setattr(producer_module, name, build)


@dataclass
class Load:
    """A steady producer load: `senders` tasks, each sending one message after another.

    A message counts as acknowledged only with SEND_OK. The producer should have
    `retry_another_broker_when_not_store_ok` set: an answer other than SEND_OK
    (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT: stored on the master, not on a slave) is tried
    again on another broker within its retries; every such answer is counted in `not_ok`. A
    send that failed, or whose last answer was not SEND_OK, is retried by the application with
    the same key until it is acknowledged or the load stops, so `sent` counts distinct
    messages and `errors` failed attempts. Times are `time.time()` (shared with the consumer
    processes).

    `ordered`: each sender owns a sharding key (`<tag>-s<n>`) and sends with it (ordered sends:
    one queue per key, no move to another broker); `by_shard` lists each key's messages in
    send order, each sent only once the one before it was acknowledged.
    """

    producer: Producer
    topic: str
    tag: str
    senders: int = 4
    pause_s: float = 0.02
    ordered: bool = False
    by_shard: dict[str, list[str]] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)
    acked: dict[str, tuple[float, str]] = field(default_factory=dict)
    errors: list[tuple[float, str]] = field(default_factory=list)
    # (time, broker, status) of every answer other than SEND_OK.
    not_ok: list[tuple[float, str, SendStatus]] = field(default_factory=list)
    # The same answers with the address of the broker that gave them (`store_addr`).
    not_ok_at: list[tuple[float, str, SendStatus]] = field(default_factory=list)
    # key -> address of the broker that acknowledged it, and (queue id, queue offset) there.
    acked_by: dict[str, str] = field(default_factory=dict)
    acked_queue: dict[str, tuple[int, int]] = field(default_factory=dict)
    ack_times: list[float] = field(default_factory=list)
    _seq: int = 0
    _stopping: bool = False
    _done: trio.Event = field(default_factory=trio.Event)

    def _next_key(self) -> str:
        self._seq += 1
        return f"{self.tag}-{self._seq:07d}"

    def observe(self, result: SendResult) -> None:
        """Count a send answer of this load's topic (`observed_send_results`)."""
        if result.status is SendStatus.SEND_OK or result.message_queue.topic != self.topic:
            return
        now = time.time()
        self.not_ok.append((now, result.message_queue.broker_name, result.status))
        self.not_ok_at.append((now, store_addr(result), result.status))

    async def send_one(self, producer: Producer, key: str, shard: str | None = None) -> bool:
        """One send (the producer's own retries included), with sharding key `shard` if given;
        True when acknowledged (recorded), False on failure (recorded) or an answer other than
        SEND_OK (counted as it came)."""
        self.sent.setdefault(key, time.time())
        try:
            result = await producer.send(Message(self.topic, key, keys=key), sharding_key=shard)
        except Exception as exc:
            self.errors.append((time.time(), f"{type(exc).__name__}: {exc}"[:200]))
            return False
        if result.status is not SendStatus.SEND_OK:
            return False
        now = time.time()
        self.acked.setdefault(key, (now, result.message_queue.broker_name))
        self.acked_by.setdefault(key, store_addr(result))
        self.acked_queue.setdefault(key, (result.message_queue.queue_id, result.queue_offset))
        self.ack_times.append(now)
        return True

    async def _sender(self, index: int) -> None:
        shard = f"{self.tag}-s{index}" if self.ordered else None
        while not self.stopping():
            key = self._next_key()
            if shard is not None:
                self.by_shard.setdefault(shard, []).append(key)
            while not await self.send_one(self.producer, key, shard):
                if self.stopping():
                    return
                await trio.sleep(0.1)
            await trio.sleep(self.pause_s)

    async def run(self, *, observe: bool = True) -> None:
        """Send until stopped. `observe=False` when the caller observes the answers itself
        (several loads at once: one `observed_send_results` for all)."""
        try:
            with observed_send_results(self.observe) if observe else contextlib.nullcontext():
                async with trio.open_nursery() as nursery:
                    for index in range(self.senders):
                        nursery.start_soon(self._sender, index)
        finally:
            self._done.set()

    def stop(self) -> None:
        self._stopping = True

    def stopping(self) -> bool:
        return self._stopping

    async def stopped(self, total: float = 2 * SEND_TIMEOUT_MS / 1000 + 2) -> None:
        """Stop and wait until no send is in flight any more (each ends within its timeout)."""
        self.stop()
        with trio.fail_after(total):
            await self._done.wait()

    def max_ack_gap(self, start: float, end: float) -> float:
        """The longest time without any acknowledgement within [start, end]."""
        times = sorted(t for t in self.ack_times if start <= t <= end)
        points = [start, *times, end]
        return max(b - a for a, b in itertools.pairwise(points))

    def acks_by_broker(self, start: float = 0.0, end: float = float("inf")) -> dict[str, int]:
        out: dict[str, int] = {}
        for t, broker in self.acked.values():
            if start <= t <= end:
                out[broker] = out.get(broker, 0) + 1
        return out

    def not_ok_by_broker(
        self, start: float = 0.0, end: float = float("inf")
    ) -> dict[str, dict[str, int]]:
        """broker -> {status name: count} of the answers other than SEND_OK in [start, end]."""
        out: dict[str, dict[str, int]] = {}
        for t, broker, status in self.not_ok:
            if start <= t <= end:
                per = out.setdefault(broker, {})
                per[status.value] = per.get(status.value, 0) + 1
        return out


# -- consumers -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Consumed:
    key: str
    broker: str
    queue_id: int
    offset: int
    at: float
    consumer: int


class ConsumerProcs:
    """Consumer host processes (tests/cluster/consumer_proc.py) of one group, subscribed to
    `topic` (or to each of several)."""

    def __init__(
        self, cluster: NameServed, workdir: Path, topic: str | Sequence[str], group: str
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.topics = [topic] if isinstance(topic, str) else list(topic)
        self.group = group
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []

    def start(self, n: int) -> None:
        script = Path(__file__).with_name("consumer_proc.py")
        for i in range(len(self.procs), len(self.procs) + n):
            out = self.workdir / f"consumed-{i}.tsv"
            log = self.workdir / f"consumer-{i}.log"
            with log.open("wb") as fh:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        str(script),
                        "--namesrv",
                        self.cluster.namesrv_addr,
                        *(arg for t in self.topics for arg in ("--topic", t)),
                        "--group",
                        self.group,
                        "--out",
                        str(out),
                        "--name",
                        f"{self.group}-{i}",
                        "--offset-dir",
                        str(self.workdir / "offsets"),
                        "--rebalance-ms",
                        str(REBALANCE_MS),
                    ],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    env={**os.environ, **self.cluster.client_env("app")},
                )
            self.procs.append(proc)
            self.outs.append(out)

    def ready(self) -> bool:
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise AssertionError(f"consumer {i} exited: {self.log_tail(i)}")
        return all(
            "ready" in (self.workdir / f"consumer-{i}.log").read_text(errors="replace")
            for i in range(len(self.procs))
        )

    def log_tail(self, i: int) -> str:
        return (self.workdir / f"consumer-{i}.log").read_text(errors="replace")[-2000:]

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP every consumer process (messages pile up unconsumed)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        # A stopped process acts on SIGTERM only once continued.
        self.resume()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def records(self) -> list[Consumed]:
        out = []
        for i, path in enumerate(self.outs):
            if not path.exists():
                continue
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split("\t")
                if len(parts) != 5:
                    continue
                key, broker, qid, offset, at = parts
                out.append(Consumed(key, broker, int(qid), int(offset), float(at), i))
        return out


@dataclass
class Row:
    scenario: str
    sent: int
    acked: int
    consumed: int
    duplicates: int
    lost: int
    recover_s: float
    errors: int
    not_ok: int = 0
    note: str = ""

    HEADER = (
        f"{'scenario':<32} {'sent':>6} {'acked':>6} {'consumed':>8} {'dups':>5} {'lost':>4} "
        f"{'recover_s':>9} {'errors':>6} {'not_ok':>6}  note"
    )

    def line(self) -> str:
        return (
            f"{self.scenario:<32} {self.sent:>6} {self.acked:>6} {self.consumed:>8} "
            f"{self.duplicates:>5} {self.lost:>4} {self.recover_s:>9.2f} {self.errors:>6} "
            f"{self.not_ok:>6}  {self.note}"
        )


def account(
    scenario: str,
    load: Load | Sequence[Load],
    records: list[Consumed],
    recover_s: float,
    note: str = "",
) -> tuple[Row, set[str]]:
    """The row for a scenario (of one load, or of several added up) and the set of lost keys
    (acked, never consumed)."""
    loads = [load] if isinstance(load, Load) else list(load)
    tags = tuple(f"{ld.tag}-" for ld in loads)
    mine = [r for r in records if r.key.startswith(tags)]
    unique = {r.key for r in mine}
    acked = {k for ld in loads for k in ld.acked}
    lost = acked - unique
    row = Row(
        scenario=scenario,
        sent=sum(len(ld.sent) for ld in loads),
        acked=len(acked),
        consumed=len(unique),
        duplicates=len(mine) - len(unique),
        lost=len(lost),
        recover_s=recover_s,
        errors=sum(len(ld.errors) for ld in loads),
        not_ok=sum(len(ld.not_ok) for ld in loads),
        note=note,
    )
    return row, lost


def order_violations(load: Load, records: list[Consumed]) -> list[str]:
    """Where an ordered load's acknowledged messages break their sharding key's order: each
    key's messages must sit in one queue (broker name and queue id) at increasing offsets in
    send order. A message stored more than once (an answer lost, sent again) counts at its
    first offset. Messages never consumed are left to the lost count."""
    first: dict[str, Consumed] = {}
    for r in records:
        if r.key not in first or r.offset < first[r.key].offset:
            first[r.key] = r
    problems = []
    for shard, keys in load.by_shard.items():
        placed = [first[k] for k in keys if k in load.acked and k in first]
        queues = {(r.broker, r.queue_id) for r in placed}
        if len(queues) > 1:
            problems.append(f"{shard}: in {len(queues)} queues {sorted(queues)}")
        for a, b in itertools.pairwise(placed):
            if b.offset <= a.offset:
                problems.append(
                    f"{shard}: {b.key} at offset {b.offset} after {a.key} at {a.offset}"
                )
                break
    return problems

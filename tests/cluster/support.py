"""Helpers of the cluster tests: the compose cluster, a steady producer load, consumer host
processes, and the per-scenario accounting (sent, acked, consumed, duplicates, lost)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from client import ClientConfig, Message, Producer
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol.route import ClusterInfo, TopicRouteData

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
BROKERS = ("broker-a", "broker-b", "broker-c")
NAMESRVS = ("namesrv1", "namesrv2")
CLUSTER_NAME = "DefaultCluster"

# Short timings for the tests (the compose file's defaults are RocketMQ's).
REGISTER_PERIOD_MS = 2000
BROKER_EXPIRED_MS = 6000
NAMESRV_SCAN_MS = 1000
REBALANCE_MS = 2000
SEND_TIMEOUT_MS = 3000


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


class Cluster:
    """One compose project of deploy/docker-compose.yml with its own free ports."""

    def __init__(self, project: str, ports: Sequence[int], image: str = "trimq:latest") -> None:
        self.project = project
        self.ns_ports = {"namesrv1": ports[0], "namesrv2": ports[1]}
        self.broker_ports = dict(zip(BROKERS, ports[2:5], strict=True))
        self.base = [*compose_command(), "-p", project, "-f", str(COMPOSE_FILE)]
        self.env = {
            **os.environ,
            "TRIMQ_IMAGE": image,
            "NAMESRV1_PORT": str(ports[0]),
            "NAMESRV2_PORT": str(ports[1]),
            "BROKER_A_PORT": str(ports[2]),
            "BROKER_B_PORT": str(ports[3]),
            "BROKER_C_PORT": str(ports[4]),
            "FLUSH_DISK_TYPE": "SYNC_FLUSH",
            "NAMESRV_SCAN_INTERVAL_MS": str(NAMESRV_SCAN_MS),
            "BROKER_EXPIRED_MS": str(BROKER_EXPIRED_MS),
            "BROKER_REGISTER_PERIOD_MS": str(REGISTER_PERIOD_MS),
            "COMMITLOG_FILE_SIZE": str(64 * 1024 * 1024),
            "CONSUME_QUEUE_FILE_SIZE": str(60_000 * 20),
            "HEALTH_INTERVAL": "1s",
        }

    # -- addresses ------------------------------------------------------------------------
    def ns_addr(self, service: str) -> str:
        return f"127.0.0.1:{self.ns_ports[service]}"

    @property
    def namesrv_addr(self) -> str:
        return ";".join(self.ns_addr(s) for s in NAMESRVS)

    def broker_addr(self, service: str) -> str:
        return f"127.0.0.1:{self.broker_ports[service]}"

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

    def network(self) -> str:
        out = subprocess.run(
            [
                "docker",
                "network",
                "ls",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--format",
                "{{.Name}}",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        names = out.stdout.split()
        if len(names) != 1:
            raise RuntimeError(f"expected one network of {self.project}, found {names}")
        return names[0]

    def docker(self, *args: str) -> None:
        subprocess.run(["docker", *args], capture_output=True, check=True, timeout=60)

    def wait_healthy(
        self, services: Sequence[str] = (*NAMESRVS, *BROKERS), total: float = 90
    ) -> None:
        deadline = time.monotonic() + total
        states: dict[str, str] = {}
        while True:
            states = {s: self.health(s) for s in services}
            if all(v == "healthy" for v in states.values()):
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"cluster not healthy after {total}s: {states}")
            time.sleep(0.5)

    async def await_healthy(
        self, services: Sequence[str] = (*NAMESRVS, *BROKERS), total: float = 90
    ) -> None:
        await trio.to_thread.run_sync(lambda: self.wait_healthy(services, total))

    async def run(self, *args: str) -> str:
        """`compose(...)` from trio (in a worker thread: it blocks on a subprocess)."""
        return await trio.to_thread.run_sync(lambda: self.compose(*args))


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


async def ns_route_brokers(client: RemotingClient, addr: str, topic: str) -> set[str] | None:
    """Broker names in the topic's route from one NameServer (None: no answer)."""
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
    return {q.broker_name for q in route.queue_datas}


def client_config(cluster: Cluster, **kw: object) -> ClientConfig:
    values: dict[str, object] = {
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
@dataclass
class Load:
    """A steady producer load: `senders` tasks, each sending one message after another.

    A failed send is retried by the application with the same key until it is acknowledged
    or the load stops, so `sent` counts distinct messages and `errors` failed attempts.
    Times are `time.time()` (shared with the consumer processes).
    """

    producer: Producer
    topic: str
    tag: str
    senders: int = 4
    pause_s: float = 0.02
    sent: dict[str, float] = field(default_factory=dict)
    acked: dict[str, tuple[float, str]] = field(default_factory=dict)
    errors: list[tuple[float, str]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    _seq: int = 0
    _stopping: bool = False

    def _next_key(self) -> str:
        self._seq += 1
        return f"{self.tag}-{self._seq:07d}"

    async def send_one(self, producer: Producer, key: str) -> str | None:
        """One attempt; the broker name on success (recorded), None on failure (recorded)."""
        self.sent.setdefault(key, time.time())
        try:
            result = await producer.send(Message(self.topic, key, keys=key))
        except Exception as exc:
            self.errors.append((time.time(), f"{type(exc).__name__}: {exc}"[:200]))
            return None
        now = time.time()
        self.acked.setdefault(key, (now, result.message_queue.broker_name))
        self.ack_times.append(now)
        return result.message_queue.broker_name

    async def _sender(self) -> None:
        while not self.stopping():
            key = self._next_key()
            while await self.send_one(self.producer, key) is None:
                if self.stopping():
                    return
                await trio.sleep(0.1)
            await trio.sleep(self.pause_s)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.senders):
                nursery.start_soon(self._sender)

    def stop(self) -> None:
        self._stopping = True

    def stopping(self) -> bool:
        return self._stopping

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
    """Consumer host processes (tests/cluster/consumer_proc.py) of one group."""

    def __init__(self, cluster: Cluster, workdir: Path, topic: str, group: str) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.topic = topic
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
                        "--topic",
                        self.topic,
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

    def stop_all(self) -> None:
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
    note: str = ""

    HEADER = (
        f"{'scenario':<22} {'sent':>6} {'acked':>6} {'consumed':>8} {'dups':>5} {'lost':>4} "
        f"{'recover_s':>9} {'errors':>6}  note"
    )

    def line(self) -> str:
        return (
            f"{self.scenario:<22} {self.sent:>6} {self.acked:>6} {self.consumed:>8} "
            f"{self.duplicates:>5} {self.lost:>4} {self.recover_s:>9.2f} {self.errors:>6}  "
            f"{self.note}"
        )


def account(
    scenario: str, load: Load, records: list[Consumed], recover_s: float, note: str = ""
) -> tuple[Row, set[str]]:
    """The row for a scenario and the set of lost keys (acked, never consumed)."""
    mine = [r for r in records if r.key.startswith(load.tag + "-")]
    unique = {r.key for r in mine}
    lost = set(load.acked) - unique
    row = Row(
        scenario=scenario,
        sent=len(load.sent),
        acked=len(load.acked),
        consumed=len(unique),
        duplicates=len(mine) - len(unique),
        lost=len(lost),
        recover_s=recover_s,
        errors=len(load.errors),
        note=note,
    )
    return row, lost

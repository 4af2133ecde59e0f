"""trimq against NATS JetStream and Redis Streams: the same workloads, one table.

    .venv/bin/python -m bench.peers            # full: 100,000 messages, median of 3 runs
    .venv/bin/python -m bench.peers --quick    # small counts, one run, < 2 minutes
    .venv/bin/python -m bench.peers --only trimq-async,nats --out /tmp/peers.json

Every system runs on 127.0.0.1 with an empty data directory of its own, started here and
stopped by PID in a `finally`:
  - trimq-async / trimq-sync: `mqnamesrv` + `mqbroker --flush async|sync`, topics of 8 queues;
  - trimq-acl / trimq-tls (only with --only): trimq-async with ACL on both servers and every
    client request signed, or with TLS enforcing on both and TLS clients (bench/peers/secure.py:
    accounts, certificates and secrets generated per run; checked secured before W1);
  - trimq-metrics (only with --only): trimq-async with Prometheus metrics on at both servers
    (every other trimq system runs with metrics off), scraped every 5 s as deploy/prometheus.yml
    does (bench/peers/scrape.py); checked exporting before W1 and, after W5, that the broker's
    counters equal the messages the workloads sent;
  - nats: Debian's `nats-server -js` (file storage, JetStream's defaults);
  - redis-everysec / redis-always: `redis-server --appendonly yes --appendfsync everysec|always`;
  - rocketmq-rust (optional, `make bench-rmqrs`): rocketmq-rust's NameServer + broker,
    ASYNC_FLUSH, driven by trimq's own client with JSON headers (bench/peers/rmqrs.py);
    rocketmq-rust-shipped: the same with its defaults as shipped (only with --only);
  - trimq-sync-master: `mqnamesrv` + a SYNC_MASTER broker + its SLAVE (same broker name, id 1),
    both ASYNC_FLUSH, each with its own store; measured once the slave is in sync (every send
    must answer SEND_OK), against the master; after W5, W1 runs again while a separate process
    (`ha_lag`) samples the replication lag every 5 ms with GET_BROKER_HA_STATUS (the W1 row
    itself runs without the sampler, whose polls would take CPU from it). Server CPU is all
    three's.
Each workload runs in a separate client process with the system's own Python client (trimq:
`mqbench --json`, and `bench.peers.trimq_e2e` for W4; nats-py; redis-py + hiredis), 1 KiB bodies:
  W1 durable publish, 64 in flight    W2 batches of 32 (4 in flight)
  W3 consume from the start, 32 per pull, with commit/ack
  W4 end-to-end latency at a fixed 2,000 msgs/s for 10 s
  W5 sequential publish, 1 in flight, 20,000 messages
Also measured: the disk (MB/s with fdatasync, 1 KiB fsyncs/s) and CPU seconds of the server
and client processes per workload. trimq-async is compared with nats and redis-everysec,
trimq-sync with redis-always, trimq-async with rocketmq-rust, trimq-sync-master, trimq-acl,
trimq-tls and trimq-metrics with trimq-async; ratios are trimq/peer (the first over the second)
from this run.
Sends answered other than SEND_OK are failures (not throughput), named under the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import _cpu, _disk, rmqrs, scrape, secure
from ._proc import (
    ClientRun,
    Server,
    Sidecar,
    System,
    free_port,
    host_busy_seconds,
    run_client,
)
from ._stats import BODY_POOL

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PY = sys.executable
WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
CONFIGS = {
    "trimq-async": ("trimq", "async"),
    "nats": ("nats", ""),
    "redis-everysec": ("redis", "everysec"),
    "trimq-sync": ("trimq", "sync"),
    "redis-always": ("redis", "always"),
    "rocketmq-rust": ("rmqrs", "tuned"),
    "rocketmq-rust-shipped": ("rmqrs", "shipped"),
    "trimq-sync-master": ("trimq", "sync-master"),
    "trimq-acl": ("trimq", "acl"),
    "trimq-tls": ("trimq", "tls"),
    "trimq-metrics": ("trimq", "metrics"),
}
# Run only when named in --only.
OPT_IN = ("rocketmq-rust-shipped", "trimq-acl", "trimq-tls", "trimq-metrics")
PAIRS = (
    ("trimq-async", "nats"),
    ("trimq-async", "redis-everysec"),
    ("trimq-sync", "redis-always"),
    ("trimq-async", "rocketmq-rust"),
    ("trimq-async", "rocketmq-rust-shipped"),
    ("trimq-sync-master", "trimq-async"),
    ("trimq-acl", "trimq-async"),
    ("trimq-tls", "trimq-async"),
    ("trimq-metrics", "trimq-async"),
)
# The workload during which a config's replication lag is sampled (`ha_lag`, every 5 ms).
LAG_SAMPLED = {"trimq-sync-master": "W1"}
LAG_INTERVAL_MS = 5.0
# The client each kind of system runs (rocketmq-rust runs trimq's).
CLIENT_OF = {"trimq": "trimq", "nats": "nats", "redis": "redis", "rmqrs": "trimq"}

console = Console(width=int(os.environ.get("COLUMNS", "160")))


@dataclass(frozen=True)
class Sizes:
    w1: int
    w2: int
    w3: int
    w4_rate: int
    w4_seconds: float
    w5: int
    limit: float  # seconds a client may run before it is killed

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(2_000, 4_000, 4_000, 2_000, 1.5, 300, 60.0)
        return cls(100_000, 100_000, 100_000, 2_000, 10.0, 20_000, 300.0)


# ---- systems --------------------------------------------------------------------------------


def _start_trimq(
    root: Path, flush: str, log: Any, secured: str | None = None, metrics: bool = False
) -> System:
    """NameServer and broker; `secured` ("acl", "tls"): with an ASYNC_FLUSH broker, that
    feature on for both (`secure.make_material`), checked once the topics exist. Metrics are
    off unless `metrics`: then both export on free ports, scraped while the system runs."""
    ns_port, br_port = free_port(), free_port()
    ns_addr = f"127.0.0.1:{ns_port}"
    ns_metrics = br_metrics = ""
    if metrics:
        ns_metrics, br_metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    material = secure.make_material(secured, root / "secure") if secured else None
    ns_conf: list[str] = []
    br_conf: list[str] = []
    if material is not None:
        ns_toml = secure.write_toml(root / "secure" / "namesrv.toml", material.namesrv)
        br_toml = secure.write_toml(root / "secure" / "broker.toml", material.broker)
        ns_conf, br_conf = ["--config", str(ns_toml)], ["--config", str(br_toml)]
    ns = Server(
        "mqnamesrv",
        [str(BIN / "mqnamesrv"), "--listen", ns_addr, *ns_conf, "--log-level", "warning",
         "--metrics-listen", ns_metrics],
        log,
        ns_port,
    )  # fmt: skip
    br = Server(
        "mqbroker",
        [str(BIN / "mqbroker"), "-n", ns_addr, "--listen", f"127.0.0.1:{br_port}", *br_conf,
         "--store-dir", str(root / "store"), "--flush", flush, "--log-level", "warning",
         "--metrics-listen", br_metrics],
        log,
        br_port,
    )  # fmt: skip
    name = "trimq-metrics" if metrics else f"trimq-{secured or flush}"
    system = System(name, [ns, br], client_env=material.client_env if material else {})
    try:
        ns.start()
        br.start()
        admin_env = dict(os.environ, **material.admin_env) if material else None
        for topic in ("Bench", "BenchE2E", "BenchSeq"):
            _create_topic(ns_addr, topic, env=admin_env)
        if material is not None:
            system.checks = secure.verify(material, ns_addr, f"127.0.0.1:{br_port}")
        if metrics:
            urls = [f"http://{br_metrics}/metrics", f"http://{ns_metrics}/metrics"]
            system.checks = _verify_exporting(urls)
            scraper = scrape.Scraper(urls)
            scraper.start()
            system.stop_hooks.append(scraper.stop)
            system.final_check = lambda results: _check_counts(urls[0], results, scraper)
    except BaseException:
        system.stop()
        raise
    return system


def _verify_exporting(urls: Sequence[str]) -> list[str]:
    """Both servers answer `/metrics` with RocketMQ's gauges: the broker knows the bench topics,
    the NameServer its broker."""
    broker, ns = (scrape.fetch(u) for u in urls)
    topics = scrape.sample_value(broker, "rocketmq_topic_number", {})
    if topics is None or topics < 3:
        raise RuntimeError(f"trimq-metrics: the broker exports rocketmq_topic_number={topics}")
    if "rocketmq_" not in ns:
        raise RuntimeError("trimq-metrics: the NameServer exports no rocketmq_ metric")
    return [f"broker exports rocketmq_topic_number {topics:g}", "NameServer exports"]


def _check_counts(url: str, results: Mapping[str, Any], scraper: scrape.Scraper) -> list[str]:
    """After W5: the broker counted every message the workloads stored (W1 + W2 into Bench,
    W5 into BenchSeq, each with its warm-up message) and at least W3's count out to bench_w3;
    RuntimeError if not."""
    text = scrape.fetch(url)

    def sent(*ws: str) -> int:
        # mqbench's producer sends one more message first (it warms the route and connection)
        return sum(int(results[w]["result"].get("messages", -1)) + 1 for w in ws)

    got = {
        "in Bench": scrape.sample_value(text, "rocketmq_messages_in_total", {"topic": "Bench"}),
        "in BenchSeq": scrape.sample_value(
            text, "rocketmq_messages_in_total", {"topic": "BenchSeq"}
        ),
        "out Bench bench_w3": scrape.sample_value(
            text, "rocketmq_messages_out_total", {"topic": "Bench", "consumer_group": "bench_w3"}
        ),
    }
    want = {"in Bench": sent("W1", "W2"), "in BenchSeq": sent("W5")}
    wrong = [f"{k}: {got[k]} (sent {v})" for k, v in want.items() if got[k] != v]
    out = got["out Bench bench_w3"]
    if out is None or out < _count("W3"):
        wrong.append(f"out Bench bench_w3: {out} (consumed {_count('W3')})")
    if wrong or scraper.failures:
        raise RuntimeError(f"trimq-metrics counts: {wrong}; scrape failures {scraper.failures[:3]}")
    return [f"{k} {v:g}" for k, v in got.items() if v is not None] + [
        f"{scraper.scrapes} scrapes, none failed"
    ]


def _start_trimq_sync_master(root: Path, log: Any) -> System:
    """NameServer, SYNC_MASTER and its SLAVE (same broker name, id 1), both ASYNC_FLUSH, each
    with its own store; returns once the master counts the slave in sync (before that every
    send would answer SLAVE_NOT_AVAILABLE)."""
    ns_port, m_port, m_ha, s_port = free_port(), free_port(), free_port(), free_port()
    ns_addr = f"127.0.0.1:{ns_port}"

    def broker(name: str, port: int, role: str, extra: list[str]) -> Server:
        return Server(
            name,
            [str(BIN / "mqbroker"), "-n", ns_addr, "--listen", f"127.0.0.1:{port}",
             "--name", "broker-a", "--store-dir", str(root / name), "--flush", "async",
             "--role", role, *extra, "--log-level", "warning", "--metrics-listen", ""],
            log,
            port,
        )  # fmt: skip

    ns = Server(
        "mqnamesrv",
        [str(BIN / "mqnamesrv"), "--listen", ns_addr, "--log-level", "warning",
         "--metrics-listen", ""],
        log,
        ns_port,
    )  # fmt: skip
    master = broker("master", m_port, "sync_master", ["--id", "0", "--ha-port", str(m_ha)])
    slave = broker("slave", s_port, "slave", ["--id", "1"])
    system = System("trimq-sync-master", [ns, master, slave])
    try:
        ns.start()
        master.start()
        # A fixed master address: the slave does not depend on the NameServer's answer.
        slave.start(env=dict(os.environ, TRIMQ_HA_MASTER_ADDRESS=f"127.0.0.1:{m_ha}"))
        for topic in ("Bench", "BenchE2E", "BenchSeq"):
            _create_topic(ns_addr, topic)
        wait_in_sync(ns_addr, f"127.0.0.1:{m_port}")
    except BaseException:
        system.stop()
        raise
    return system


def wait_in_sync(ns_addr: str, master_addr: str, timeout: float = 60.0) -> None:
    """Until `mqadmin haStatus` shows the master with a slave in sync."""
    args = [str(BIN / "mqadmin"), "haStatus", "-n", ns_addr, "-b", master_addr, "--json"]
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=30)
        if done.returncode == 0:
            info = json.loads(done.stdout).get(master_addr, {})
            if info.get("inSyncSlaveNums", 0) >= 1:
                return
            last = done.stdout.strip()
        else:
            last = done.stderr.strip()
        time.sleep(0.2)
    raise RuntimeError(f"no slave in sync with {master_addr} within {timeout} s: {last}")


def _create_topic(
    ns_addr: str, topic: str, options: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> None:
    """`mqadmin updateTopic` (8 queues), retried until the broker is registered; `env`: the
    admin's environment (credentials, TLS) when not the harness's own."""
    args = [str(BIN / "mqadmin"), *options, "updateTopic", "-n", ns_addr, "-c", "DefaultCluster",
            "-t", topic, "-r", "8", "-w", "8"]  # fmt: skip
    last = ""
    for _ in range(100):  # bounded: the broker registers within a few seconds
        done = subprocess.run(
            args, capture_output=True, text=True, check=False, timeout=30, env=env
        )
        if done.returncode == 0:
            return
        last = done.stderr.strip()
        time.sleep(0.2)
    raise RuntimeError(f"mqadmin updateTopic {topic} failed: {last}")


def _start_nats(root: Path, log: Any) -> System:
    port = free_port()
    srv = Server(
        "nats-server",
        ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(root / "nats")],
        log,
        port,
    )
    system = System("nats", [srv])
    srv.start()
    return system


def _start_redis(root: Path, fsync: str, log: Any) -> System:
    port = free_port()
    data = root / "redis"
    data.mkdir()
    srv = Server(
        "redis-server",
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
         "--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no"],
        log,
        port,
    )  # fmt: skip
    system = System(f"redis-{fsync}", [srv])
    srv.start()
    return system


def start_system(config: str, root: Path, log: Any) -> tuple[System, Callable[[str], list[str]]]:
    """Start one system; return it and a function mapping a workload to its client command."""
    kind, mode = CONFIGS[config]
    if kind == "trimq":
        if mode == "sync-master":
            system = _start_trimq_sync_master(root, log)
        elif mode in secure.MODES:
            system = _start_trimq(root, "async", log, secured=mode)
        elif mode == "metrics":
            system = _start_trimq(root, "async", log, metrics=True)
        else:
            system = _start_trimq(root, mode, log)
        ns = f"127.0.0.1:{system.servers[0].port}"
        return system, lambda w: _trimq_args(w, ns)
    if kind == "rmqrs":
        system = rmqrs.start(root, log, _create_topic, tuned=mode == "tuned")
        ns = f"127.0.0.1:{system.servers[0].port}"
        return system, lambda w: _trimq_args(w, ns, rmqrs.SERIALIZE)
    if kind == "nats":
        system = _start_nats(root, log)
        url = f"nats://127.0.0.1:{system.servers[0].port}"
        return system, lambda w: [PY, "-m", "bench.peers.nats_client", "--url", url,
                                  "--workload", w, *_peer_sizes(w)]  # fmt: skip
    system = _start_redis(root, mode, log)
    port = str(system.servers[0].port)
    return system, lambda w: [PY, "-m", "bench.peers.redis_client", "--port", port,
                              "--workload", w, *_peer_sizes(w)]  # fmt: skip


SIZES = Sizes.for_mode(False)


def _count(w: str) -> int:
    return {"W1": SIZES.w1, "W2": SIZES.w2, "W3": SIZES.w3, "W5": SIZES.w5}.get(w, 0)


def _peer_sizes(w: str) -> list[str]:
    return ["--count", str(_count(w)), "--limit", str(SIZES.limit),
            "--rate", str(SIZES.w4_rate), "--seconds", str(SIZES.w4_seconds)]  # fmt: skip


def _trimq_args(w: str, ns: str, options: Sequence[str] = ()) -> list[str]:
    """trimq's client for workload `w`; `options` go before mqbench's command (W4: none)."""
    bench = [str(BIN / "mqbench"), "--log-level", "error", *options]
    common = ["-n", ns, "-s", "1024", "-c", str(_count(w)), "-d", str(SIZES.limit), "--json"]
    pool = ["--body-pool", str(BODY_POOL)]
    if w == "W1":
        return [*bench, "producer", "-t", "Bench", "-w", "64", *pool, *common]
    if w == "W2":
        return [*bench, "producer", "-t", "Bench", "-w", "4", "-b", "32", *pool, *common]
    if w == "W3":
        return [*bench, "consumer", "-n", ns, "-t", "Bench", "-g", "bench_w3", "--from", "first",
                "--batch", "32", "-c", str(SIZES.w3), "-d", str(SIZES.limit), "--json"]  # fmt: skip
    if w == "W4":
        return [PY, "-m", "bench.peers.trimq_e2e", "-n", ns, "-t", "BenchE2E",
                "--rate", str(SIZES.w4_rate), "--seconds", str(SIZES.w4_seconds)]  # fmt: skip
    return [*bench, "producer", "-t", "BenchSeq", "-w", "1", *pool, *common]


def _lag_args(system: System) -> list[str]:
    """The replication-lag sampler (`ha_lag`) against a master/slave system's master."""
    ns, master = system.servers[0], system.servers[1]
    return [PY, "-m", "bench.peers.ha_lag", "-n", f"127.0.0.1:{ns.port}",
            "-b", f"127.0.0.1:{master.port}", "--interval-ms", str(LAG_INTERVAL_MS)]  # fmt: skip


def lag_line(lag: dict[str, Any]) -> str:
    """A sampler's summary in one line (what the figures are: upper bounds, per poll)."""
    if not lag or "lag_ms" not in lag:
        return "replication lag: not measured"
    ms, poll = lag["lag_ms"], lag["poll_interval_ms"]
    return (
        f"replication lag p50 {ms['p50']:.1f} p99 {ms['p99']:.1f} max {ms['max']:.1f} ms over "
        f"{lag['samples']:,} samples ({lag['unresolved']} never acknowledged, "
        f"{lag.get('failed_polls', 0)} polls unanswered); polled every "
        f"{poll['mean']:.2f} ms on average (asked {lag['interval_ms']:g}, largest gap "
        f"{poll['max']:.1f} ms): each lag is an upper bound, by less than one poll interval"
    )


# ---- one run --------------------------------------------------------------------------------


def _startup_cpu(scratch: Path, env: dict[str, str], repeats: int = 3) -> dict[str, float]:
    """CPU seconds a client process spends starting (imports), subtracted from client CPU."""
    probes = {
        "trimq": "import client.cli.mqbench, bench.peers.trimq_e2e",
        "nats": "import bench.peers.nats_client",
        "redis": "import bench.peers.redis_client",
    }
    out: dict[str, float] = {}
    for kind, code in probes.items():
        runs = [run_client([PY, "-c", code], 60, REPO, env, scratch).cpu_s for _ in range(repeats)]
        out[kind] = min(runs)
    return out


def run_config(
    config: str, scratch: Path, env: dict[str, str], startup: dict[str, float]
) -> dict[str, Any]:
    """Start `config`'s system on an empty directory, run W1-W5, stop it."""
    root = Path(tempfile.mkdtemp(prefix=f"{config}-", dir=scratch))
    results: dict[str, Any] = {}
    with open(root / "servers.log", "wb") as log:
        system, client_args = start_system(config, root, log)
        client_env = {**env, **system.client_env}
        if system.checks:
            key = "secured" if CONFIGS[config][1] in secure.MODES else "checked"
            results[key] = system.checks
            console.print(f"  {config:15} {key}: {'; '.join(system.checks)}", highlight=False)
        try:
            lag_workload = LAG_SAMPLED.get(config)
            # Every workload first without the sampler (its polls and their answers cost the
            # 2 cores CPU the throughput figures must not pay), then the sampled one again.
            for w in [*WORKLOADS, *([lag_workload] if lag_workload else [])]:
                sampled = lag_workload == w and w in results
                before, host_before = system.cpu(), host_busy_seconds()
                by_server = [s.cpu() for s in system.servers]
                sampler: ClientRun | None = None
                if sampled:
                    with Sidecar(_lag_args(system), REPO, env, root, "ha-lag") as sidecar:
                        try:
                            sidecar.wait_ready()
                        except RuntimeError as exc:  # the workload runs; its lag is not measured
                            console.print(f"[red]{config} {w}: {exc}[/]")
                        cr: ClientRun = run_client(
                            client_args(w), SIZES.limit + 60, REPO, client_env, root
                        )
                        sampler = sidecar.finish()
                else:
                    cr = run_client(client_args(w), SIZES.limit + 60, REPO, client_env, root)
                server_cpu = system.cpu() - before
                sampler_cpu = sampler.cpu_s if sampler is not None else 0.0
                others = host_busy_seconds() - host_before - server_cpu - cr.cpu_s - sampler_cpu
                r = cr.result
                if cr.returncode != 0 or not r:
                    console.print(f"[red]{config} {w}: client exit {cr.returncode}[/]\n{cr.stderr}")
                client_cpu = max(0.0, cr.cpu_s - startup[CLIENT_OF[CONFIGS[config][0]]])
                if sampled:
                    # The sampled repeat: its lag, and its own rate for reference.
                    results[w]["replication_lag"] = sampler.result if sampler else {}
                    results[w]["sampler_cpu_s"] = round(sampler.cpu_s, 2) if sampler else 0.0
                    results[w]["sampled_msgs_per_s"] = r.get("msgs_per_s", 0)
                    if sampler is not None and (sampler.returncode != 0 or not sampler.result):
                        console.print(
                            f"[red]{config} {w}: lag sampler exit {sampler.returncode}[/]\n"
                            f"{sampler.stderr}"
                        )
                    console.print(
                        f"  {config:15} {w} again, sampled: {r.get('msgs_per_s', 0):>10,.0f} msg/s",
                        highlight=False,
                    )
                    if sampler is not None:
                        console.print(f"  {'':15} {w}: {lag_line(sampler.result)}", highlight=False)
                    continue
                results[w] = {
                    "result": r,
                    "server_cpu_s": round(server_cpu, 2),
                    "client_cpu_s": round(client_cpu, 2),
                    "wall_s": round(cr.wall_s, 2),
                    # cores' worth of CPU that processes outside the run used meanwhile
                    "others_cores": round(max(0.0, others) / max(cr.wall_s, 1e-9), 2),
                }
                if len(system.servers) > 2:  # which server the CPU went to (master, slave)
                    results[w]["server_cpu_by_name_s"] = {
                        s.name: round(s.cpu() - b, 2)
                        for s, b in zip(system.servers, by_server, strict=True)
                    }
                lat = r.get("latency_ms", {})
                console.print(
                    f"  {config:15} {w}: {r.get('msgs_per_s', 0):>10,.0f} msg/s  "
                    f"p50 {lat.get('p50', 0):7.2f}  p99 {lat.get('p99', 0):7.2f} ms  "
                    f"errors {r.get('errors', '?')}  cpu server {server_cpu:5.2f} s "
                    f"client {client_cpu:5.2f} s  others {results[w]['others_cores']:.2f} cores",
                    highlight=False,
                )
            if system.final_check is not None:
                results["final_check"] = system.final_check(results)
                console.print(
                    f"  {config:15} checked: {'; '.join(results['final_check'])}", highlight=False
                )
        finally:
            system.stop()
    return results


# ---- table ----------------------------------------------------------------------------------

# (label, workload, path into the client's summary, higher is better)
METRICS: list[tuple[str, str, tuple[str, ...], bool]] = [
    ("W1 publish, 64 in flight: msgs/s", "W1", ("msgs_per_s",), True),
    ("W1 ack latency p50 ms", "W1", ("latency_ms", "p50"), False),
    ("W1 ack latency p99 ms", "W1", ("latency_ms", "p99"), False),
    ("W2 batches of 32: msgs/s", "W2", ("msgs_per_s",), True),
    ("W3 consume, 32 per pull: msgs/s", "W3", ("msgs_per_s",), True),
    ("W4 e2e at 2,000/s: p50 ms", "W4", ("latency_ms", "p50"), False),
    ("W4 e2e p99 ms", "W4", ("latency_ms", "p99"), False),
    ("W4 e2e max ms", "W4", ("latency_ms", "max"), False),
    ("W5 sequential: msgs/s", "W5", ("msgs_per_s",), True),
    ("W5 latency p50 ms", "W5", ("latency_ms", "p50"), False),
    ("W5 latency p99 ms", "W5", ("latency_ms", "p99"), False),
]


# (label, workload, path into the lag sampler's summary): replication lag, upper bounds
LAG_METRICS: list[tuple[str, str, tuple[str, ...]]] = [
    ("W1 replication lag p50 ms", "W1", ("lag_ms", "p50")),
    ("W1 replication lag p99 ms", "W1", ("lag_ms", "p99")),
    ("W1 replication lag max ms", "W1", ("lag_ms", "max")),
]


def pair_label(a: str, b: str) -> str:
    """A ratio column's heading: `a` without the "trimq-" prefix, over `b`."""
    return f"{a.removeprefix('trimq-')}/{b}"


def metric(
    runs: list[dict[str, Any]], w: str, path: tuple[str, ...], source: str = "result"
) -> float | None:
    """Median over runs of one figure (None when no run produced it); `source` is the key of
    the workload's entry it is read from (the client's summary, or "replication_lag")."""
    vals = []
    for run in runs:
        cur: Any = run.get(w, {}).get(source, {})
        for key in path:
            cur = cur.get(key) if isinstance(cur, dict) else None
        if isinstance(cur, int | float):
            vals.append(float(cur))
    return statistics.median(vals) if vals else None


def cpu_metric(runs: list[dict[str, Any]], w: str, key: str) -> float | None:
    vals = [float(r[w][key]) for r in runs if w in r]
    return statistics.median(vals) if vals else None


def cpu_per_msg_us(runs: list[dict[str, Any]], w: str, key: str) -> float | None:
    """Median over runs of CPU microseconds per message (steadier than msgs/s on a busy box)."""
    vals = []
    for r in runs:
        n = r.get(w, {}).get("result", {}).get("messages")
        if n:
            vals.append(float(r[w][key]) / n * 1e6)
    return statistics.median(vals) if vals else None


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def build_table(all_runs: dict[str, list[dict[str, Any]]]) -> Table:
    configs = [c for c in CONFIGS if c in all_runs]
    pairs = [p for p in PAIRS if p[0] in all_runs and p[1] in all_runs]
    table = Table(title="trimq vs peers (medians; ratios = trimq / peer)")
    table.add_column("metric")
    for c in configs:
        table.add_column(c, justify="right")
    for a, b in pairs:
        table.add_column(pair_label(a, b), justify="right")
    for label, w, path, _higher in METRICS:
        vals = {c: metric(all_runs[c], w, path) for c in configs}
        table.add_row(
            label, *(_fmt(vals[c]) for c in configs), *(_ratio(vals[a], vals[b]) for a, b in pairs)
        )
    if any(c in LAG_SAMPLED for c in configs):
        for label, w, path in LAG_METRICS:
            vals = {c: metric(all_runs[c], w, path, "replication_lag") for c in configs}
            table.add_row(label, *(_fmt(vals[c]) for c in configs), *("-" for _ in pairs))
    for w in WORKLOADS:
        for key, name in (("server_cpu_s", "server"), ("client_cpu_s", "client")):
            vals = {c: cpu_per_msg_us(all_runs[c], w, key) for c in configs}
            table.add_row(
                f"{w} {name} CPU us/msg",
                *(_fmt(vals[c]) for c in configs),
                *(_ratio(vals[a], vals[b]) for a, b in pairs),
            )
    return table


def client_bound(all_runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Workloads where the client used >= 85% of a core while the server used less."""
    notes = []
    for config, runs in all_runs.items():
        for w in WORKLOADS:
            secs = metric(runs, w, ("seconds",))
            cli, srv = cpu_metric(runs, w, "client_cpu_s"), cpu_metric(runs, w, "server_cpu_s")
            if not secs or cli is None or srv is None or w == "W4":
                continue
            if cli / secs >= 0.85 and cli > srv:
                notes.append(
                    f"{config} {w}: client-bound (client {cli / secs:.0%} of a core, "
                    f"server {srv / secs:.0%})"
                )
    return notes


# ---- main -----------------------------------------------------------------------------------


def usable_configs(configs: list[str], say: Callable[[str], None] | None = None) -> list[str]:
    """`configs` without the optional ones not built here (rocketmq-rust), with a message."""
    rust = [c for c in configs if CONFIGS[c][0] == "rmqrs"]
    why = rmqrs.missing() if rust else None
    if why is None:
        return configs
    (say or (lambda text: console.print(f"[yellow]{text}[/]", highlight=False)))(why)
    return [c for c in configs if c not in rust]


def _version(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10, check=False)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


def machine_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "nats-server": _version(["nats-server", "--version"]),
        "redis-server": _version(["redis-server", "--version"]),
        "nats-py": pkg("nats-py"),
        "redis-py": pkg("redis"),
        "hiredis": pkg("hiredis"),
        "trimq": pkg("trimq"),
        "rocketmq-rust": rmqrs.version(),
        "loadavg_start": os.getloadavg(),
    }


def cpu_reference_line(info: dict[str, Any]) -> str:
    """The run's CPU reference (`_cpu.reference`) as one line, for the table's reader."""
    ref = info.get("cpu_reference")
    if not ref:
        return "cpu reference: not measured"
    line = (
        f"cpu reference ({ref['cpu_model']}): {ref['interp_ns']} ns per Python loop iteration, "
        f"{ref['trio_checkpoint_us']} us per trio checkpoint, {ref['loopback_rtt_us']} us per "
        "1 KiB loopback round trip"
    )
    wake = ref.get("idle_wake_us")  # runs saved before it was measured lack it
    if wake:
        line += (
            f"; CPU per idle wake-up: {wake['epoll']} us (bare epoll loop), {wake['asyncio']} us"
            f" (asyncio), {wake['trio']} us (trio)"
        )
    return line


def main(argv: list[str] | None = None) -> None:
    global SIZES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts, one run (< 2 minutes)")
    ap.add_argument("--runs", type=int, default=None, help="runs per system (default 3, quick 1)")
    ap.add_argument("--only", default=None, help="comma-separated configs: " + ",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=None, help="write all figures as JSON here")
    ap.add_argument("--no-disk", action="store_true", help="skip the disk measurements")
    opts = ap.parse_args(argv)
    SIZES = Sizes.for_mode(opts.quick)
    runs = opts.runs or (1 if opts.quick else 3)
    default = [c for c in CONFIGS if c not in OPT_IN]
    configs = [c.strip() for c in opts.only.split(",")] if opts.only else default
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r}")
    configs = usable_configs(configs)
    needed = {CONFIGS[c][0] for c in configs}
    for kind, exe in (("nats", "nats-server"), ("redis", "redis-server")):
        if kind in needed and shutil.which(exe) is None:
            ap.error(f"{exe} not found: `make bench` installs it (apt-get install {exe})")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    info = machine_info()
    console.print(
        f"[bold]bench.peers[/] {'quick' if opts.quick else 'full'}, {runs} run(s): {info}"
    )
    started = time.monotonic()
    all_runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="trimq-peers-") as tmp:
        scratch = Path(tmp)
        # Before any system starts: how fast this (shared) machine runs Python right now.
        info["cpu_reference"] = _cpu.reference()
        console.print(f"cpu reference: {info['cpu_reference']}")
        disk: dict[str, float] = {}
        if not opts.no_disk:
            disk["seq_mb_per_s"] = round(
                _disk.sequential_mb_per_s(scratch, 32 if opts.quick else 512), 1
            )
            disk["fsyncs_per_s"] = round(
                _disk.fsyncs_per_s(scratch, 500 if opts.quick else 10000), 1
            )
            console.print(
                f"disk: {disk['seq_mb_per_s']:,.0f} MB/s with fdatasync, "
                f"{disk['fsyncs_per_s']:,.0f} 1 KiB fsyncs/s"
            )
        startup = _startup_cpu(scratch, env, 1 if opts.quick else 3)
        for i in range(runs):
            for c in configs:
                console.print(f"[bold]run {i + 1}/{runs}: {c}[/]")
                all_runs[c].append(run_config(c, scratch, env, startup))
    info["loadavg_end"] = os.getloadavg()
    info["elapsed_s"] = round(time.monotonic() - started, 1)
    console.print(build_table(all_runs))
    console.print(
        f"disk: {disk.get('seq_mb_per_s', 0):,.0f} MB/s sequential with fdatasync, "
        f"{disk.get('fsyncs_per_s', 0):,.0f} fsyncs/s (1 KiB appends); load average "
        f"{info['loadavg_start'][0]:.1f} at start, {info['loadavg_end'][0]:.1f} at end; "
        f"client CPU excludes interpreter start-up ({startup})"
    )
    console.print(cpu_reference_line(info), highlight=False)
    from .report import (  # report imports this module
        disturbed,
        failures,
        lag_notes,
        secured_notes,
        targets,
    )

    for note in [*lag_notes(all_runs), *secured_notes(all_runs)]:
        console.print(note, highlight=False)

    for desc, ok, figures in targets(all_runs):
        mark = "[green]met[/]" if ok else ("[yellow]n/a[/]" if ok is None else "[red]missed[/]")
        console.print(f"  {mark:18} {desc}: {figures}")
    for note in [*failures(all_runs), *client_bound(all_runs), *disturbed(all_runs)]:
        console.print(f"  note: {note}")
    console.print(f"elapsed {info['elapsed_s']} s")
    if opts.out:
        opts.out.write_text(
            json.dumps(
                {"machine": info, "disk": disk, "startup_cpu_s": startup, "runs": all_runs},
                indent=1,
                sort_keys=True,
            )
        )


if __name__ == "__main__":
    main()

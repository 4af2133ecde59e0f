"""The same-protocol peer: rocketmq-rust (crates.io `rocketmq-namesrv`, `rocketmq-broker`).

Built once by `make bench-rmqrs` into `.bench/rmqrs` (or `$TRIMQ_RMQRS_ROOT`); the system is
skipped with a message when its binaries are absent. Each run starts its own NameServer and
broker on free loopback ports with a temporary `ROCKETMQ_HOME` (and `HOME`, which the broker's
defaults derive paths from) and a Java-style `broker.properties`: ASYNC_FLUSH (compared with
trimq-async), ASYNC_MASTER, store under the run's directory. Topics are created with trimq's
`mqadmin updateTopic` (8 queues, as on trimq), and the workloads run trimq's own client
(`mqbench`, `bench.peers.trimq_e2e`) with RocketMQ's JSON header codec.

`rocketmq-rust` runs with `TUNING` (its fastest settings found here), `rocketmq-rust-shipped`
with the defaults as shipped; why: bench/RESULTS.md, "Same protocol: rocketmq-rust 1.0.0".

The broker's remoting listener binds 0.0.0.0: rocketmq-rust 1.0.0 maps no Java property to
its `brokerServerConfig.bindAddress` (an unknown key is refused). It also opens a "fast"
listener on listenPort - 2 and the HA listener on haListenPort (set to 127.0.0.1 here).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._proc import Server, System, free_port

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.0.0"
NAMESRV_BIN = "rocketmq-namesrv-rust"
BROKER_BIN = "rocketmq-broker-rust"
CLUSTER = "DefaultCluster"
BROKER_NAME = "rmqrs-bench"
# The JSON codec on every request, as trimq's client chooses (`auto`) for any non-trimq broker.
SERIALIZE = ["--serialize-type", "json"]
# No CommitLog micro-batching: its wait (a tokio timer, 1 ms at least) bounds every send.
TUNING = {"commitLogMicroBatchEnabled": "false"}


def install_root() -> Path:
    """Where `make bench-rmqrs` installs the binaries (`$TRIMQ_RMQRS_ROOT` overrides)."""
    return Path(os.environ.get("TRIMQ_RMQRS_ROOT") or REPO / ".bench" / "rmqrs")


def binaries(root: Path | None = None) -> tuple[Path, Path]:
    """(namesrv, broker) executables under `root`/bin."""
    bindir = (root or install_root()) / "bin"
    return bindir / NAMESRV_BIN, bindir / BROKER_BIN


def missing(root: Path | None = None) -> str | None:
    """Why rocketmq-rust cannot run (a message naming `make bench-rmqrs`), or None."""
    absent = [p for p in binaries(root) if not os.access(p, os.X_OK)]
    if not absent:
        return None
    names = ", ".join(str(p) for p in absent)
    return (
        f"rocketmq-rust skipped: {names} not built "
        f"(`make bench-rmqrs` builds rocketmq-rust {VERSION} from crates.io, about 25 minutes)"
    )


def broker_properties(
    *,
    namesrv: str,
    listen_port: int,
    ha_port: int,
    store: Path,
    flush: str = "ASYNC_FLUSH",
    tuned: bool = True,
) -> str:
    """The broker's Java-style `broker.properties` (keys of Apache RocketMQ's BrokerConfig and
    MessageStoreConfig, which rocketmq-rust maps; any key it does not know is an error)."""
    if flush not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        raise ValueError(f"flush type {flush!r}")
    props = {
        "brokerClusterName": CLUSTER,
        "brokerName": BROKER_NAME,
        "brokerId": "0",
        "brokerRole": "ASYNC_MASTER" if flush == "ASYNC_FLUSH" else "SYNC_MASTER",
        "flushDiskType": flush,
        "brokerIP1": "127.0.0.1",
        "listenPort": str(listen_port),
        "haListenAddress": "127.0.0.1",
        "haListenPort": str(ha_port),
        "namesrvAddr": namesrv,
        "storePathRootDir": str(store),
        "storePathCommitLog": str(store / "commitlog"),
    }
    if tuned:
        props.update(TUNING)
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def broker_ports(
    pick: Callable[[], int] = free_port, is_free: Callable[[int], bool] = _port_free
) -> tuple[int, int]:
    """(listenPort, haListenPort): listenPort - 2 (the broker's fast listener) free as well."""
    port = next((p for p in (pick() for _ in range(100)) if p > 1026 and is_free(p - 2)), None)
    ha = next((h for h in (pick() for _ in range(100)) if h not in (port, (port or 0) - 2)), None)
    if port is None or ha is None:
        raise RuntimeError("no free pair of ports (P, P - 2) for the rocketmq-rust broker")
    return port, ha


def env_for(home: Path) -> dict[str, str]:
    """The servers' environment: `ROCKETMQ_HOME` and `HOME` in the run's directory."""
    env = dict(os.environ, ROCKETMQ_HOME=str(home), HOME=str(home))
    env.pop("RUST_LOG", None)  # the servers' log filter comes from --log-filter
    env.pop("NAMESRV_ADDR", None)
    return env


def start(
    root: Path,
    log: Any,
    create_topic: Callable[[str, str, list[str]], None],
    tuned: bool = True,
) -> System:
    """Start a NameServer and a broker under `root` (`TUNING` unless not `tuned`); create the
    bench topics.

    `create_topic(ns_addr, topic, extra_mqadmin_options)` is run.py's mqadmin helper.
    """
    why = missing()
    if why:
        raise RuntimeError(why)
    namesrv_bin, broker_bin = binaries()
    home = root / "rmqrs-home"
    (home / "conf").mkdir(parents=True)
    env = env_for(home)
    ns_port = free_port()
    ns_addr = f"127.0.0.1:{ns_port}"
    br_port, ha_port = broker_ports()
    props = home / "conf" / "broker.properties"
    text = broker_properties(
        namesrv=ns_addr, listen_port=br_port, ha_port=ha_port, store=root / "store", tuned=tuned
    )
    props.write_text(text)
    ns = Server(
        "rocketmq-namesrv-rust",
        [str(namesrv_bin), "--listenPort", str(ns_port), "--bindAddress", "127.0.0.1",
         "--rocketmqHome", str(home), "--kvConfigPath", str(home / "kvConfig.json"),
         "--log-filter", "warn"],
        log,
        ns_port,
    )  # fmt: skip
    br = Server(
        "rocketmq-broker-rust",
        [str(broker_bin), "-c", str(props), "-n", ns_addr, "--log-filter", "warn"],
        log,
        br_port,
    )
    system = System("rocketmq-rust" if tuned else "rocketmq-rust-shipped", [ns, br])
    try:
        ns.start(env)
        br.start(env)
        for topic in ("Bench", "BenchE2E", "BenchSeq"):
            create_topic(ns_addr, topic, SERIALIZE)
    except BaseException:
        system.stop()
        raise
    return system


def version(root: Path | None = None) -> str:
    """The broker binary's `--version` line ("absent" when not built)."""
    broker = binaries(root)[1]
    if not os.access(broker, os.X_OK):
        return "absent"
    try:
        out = subprocess.run(
            [str(broker), "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return " ".join(lines[:2]) or "?"

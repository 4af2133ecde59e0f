"""The Spark suite's fixtures: one local[2] SparkSession and one cluster for the whole session.

- `cluster`: a NameServer and two brokers (`broker-a`, `broker-b`) as real processes, plus
  `broker-lossy`, which deletes old commitlog files at once (for the data-loss test). They
  start in a background thread while the JVM starts.
- `spark`: a session-scoped `local[2]` SparkSession with the `rocketmq` source registered;
  workers run this venv's Python (`PYSPARK_PYTHON`), the JVM logs at ERROR only. It is
  tuned for a short run on 2 shared cores (C1-only JIT, serial GC, workers import pyspark
  from site-packages rather than from `pyspark.zip`; see `_spark_home_without_zips`).
- `mq`: a blocking helper to create topics, send messages and read offsets.

Each test uses its own topics (`unique_topic`) and `tmp_path` checkpoints.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    # py4j/pyspark may warn at import time (deprecated stdlib APIs); not ours to fix.
    warnings.simplefilter("ignore")
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")

from tests.integration.procs import BrokerProc, NamesrvProc
from tests.spark.support import MQ

# Spark/py4j warnings seen while tests run (not raised by our code).
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:py4j"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            for mark in pytestmark:
                item.add_marker(mark)


LOSSY_BROKER_ENV = {
    # Tiny commitlog files, deleted as soon as a newer one exists (disk "always full").
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(64 * 1024),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * 50),
    "TRIMQ_DISK_MAX_USED_RATIO": "0.0001",
    # Unconsumed messages too: by default cleanup keeps what a group has not consumed.
    "TRIMQ_CLEAN_FILE_FORCIBLY_ENABLE": "true",
    "TRIMQ_CLEAN_RESOURCE_INTERVAL_MS": "200",
    "TRIMQ_MESSAGE_INDEX_ENABLE": "false",
}


class Cluster:
    def __init__(
        self, namesrv: NamesrvProc, brokers: list[BrokerProc], root: Path, lossy: BrokerProc
    ) -> None:
        self.namesrv = namesrv
        self.brokers = brokers
        self.root = root
        self._lossy = lossy

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    def lossy_broker(self) -> str:
        """Name of a third broker that deletes old commitlog files at once."""
        return self._lossy.broker_name


def _start_cluster(root: Path, started: list[Any]) -> Cluster:
    """Start the NameServer, then `broker-a`, `broker-b` and the lossy broker in parallel.

    Every process started is appended to `started` (even if a later one fails), so the
    caller can stop them all.
    """
    ns = NamesrvProc(root / "namesrv")
    ns.start()
    started.append(ns)
    brokers = [BrokerProc(root / name, ns.addr, name=name) for name in ("broker-a", "broker-b")]
    lossy = BrokerProc(root / "broker-lossy", ns.addr, name="broker-lossy", env=LOSSY_BROKER_ENV)
    # Each start() mostly waits for a port to open: overlap the three waits.
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(b.start) for b in (*brokers, lossy)]
        for b, f in zip((*brokers, lossy), futures, strict=True):
            if f.exception() is None:
                started.append(b)
        for f in futures:
            f.result()
    return Cluster(ns, brokers, root, lossy)


def _stop(proc: Any) -> None:
    try:
        proc.stop()
    except Exception:
        proc.kill()


@pytest.fixture(scope="session")
def _cluster_boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[Cluster]]:
    """Starts the cluster in a background thread, so it overlaps the JVM's start-up."""
    root = tmp_path_factory.mktemp("spark-cluster")
    started: list[Any] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        boot = pool.submit(_start_cluster, root, started)
        try:
            yield boot
        finally:
            try:
                boot.result()
            except Exception:
                pass
            # Brokers first (in parallel: each stop mostly waits for an exit), then the
            # NameServer.
            brokers = [p for p in started if isinstance(p, BrokerProc)]
            with ThreadPoolExecutor(max_workers=max(1, len(brokers))) as stopper:
                list(stopper.map(_stop, brokers))
            for p in started:
                if not isinstance(p, BrokerProc):
                    _stop(p)


@pytest.fixture(scope="session")
def cluster(_cluster_boot: Future[Cluster]) -> Cluster:
    return _cluster_boot.result(timeout=120)


@pytest.fixture(scope="session")
def mq(cluster: Cluster) -> Iterator[MQ]:
    helper = MQ(cluster.namesrv_addr)
    try:
        yield helper
    finally:
        helper.close()


def _spark_home_without_zips(root: Path) -> Path:
    """A SPARK_HOME of symlinks to the pip-installed pyspark, minus `python/lib/*.zip`.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's
    PYTHONPATH. Modules imported from a zip are compiled from source in each new process
    (no .pyc), which costs ~0.4 s CPU per worker, daemon and streaming source runner
    (about 20 per suite run). Without the zips the workers import the same installed
    pyspark from site-packages, with its cached bytecode.
    """
    import pyspark

    real = Path(pyspark.__file__).parent
    home = root / "spark-home"
    home.mkdir()
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    return home


@pytest.fixture(scope="session")
def spark(
    tmp_path_factory: pytest.TempPathFactory, _cluster_boot: Future[Cluster]
) -> Iterator[Any]:
    # `_cluster_boot` first: the brokers start while the JVM does.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    own_home = "SPARK_HOME" not in os.environ
    if own_home:
        os.environ["SPARK_HOME"] = str(
            _spark_home_without_zips(tmp_path_factory.mktemp("spark-home"))
        )
    from pyspark.sql import SparkSession

    import client.spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("trimq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.default.parallelism", "2")
        # The suite is short-lived: C1-only JIT and the serial GC halve the JVM's CPU time
        # (measured ~18-19 s -> ~10 s for start-up plus a few jobs on 2 shared cores).
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    client.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
        if own_home:
            del os.environ["SPARK_HOME"]


_counter = itertools.count()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    return f"Spark_{name}_{os.getpid()}_{next(_counter)}"

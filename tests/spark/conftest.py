"""The Spark suite's fixtures: one local[2] SparkSession and one cluster for the whole session.

- `cluster`: a NameServer and two brokers (`broker-a`, `broker-b`) as real processes.
- `spark`: a session-scoped `local[2]` SparkSession with the `rocketmq` source registered;
  workers run this venv's Python (`PYSPARK_PYTHON`), the JVM logs at ERROR only.
- `mq`: a blocking helper to create topics, send messages and read offsets.

Each test uses its own topics (`unique_topic`) and `tmp_path` checkpoints.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import Iterator
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
    "TRIMQ_CLEAN_RESOURCE_INTERVAL_MS": "200",
    "TRIMQ_MESSAGE_INDEX_ENABLE": "false",
}


class Cluster:
    def __init__(self, namesrv: NamesrvProc, brokers: list[BrokerProc], root: Path) -> None:
        self.namesrv = namesrv
        self.brokers = brokers
        self.root = root
        self._lossy: BrokerProc | None = None

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    def lossy_broker(self) -> str:
        """Name of a third broker that deletes old commitlog files at once (started lazily)."""
        if self._lossy is None:
            b = BrokerProc(
                self.root / "broker-lossy",
                self.namesrv.addr,
                name="broker-lossy",
                env=LOSSY_BROKER_ENV,
            )
            b.start()
            self.brokers.append(b)
            self._lossy = b
        return self._lossy.broker_name


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    ns = NamesrvProc(root / "namesrv")
    started: list[Any] = []
    cl: Cluster | None = None
    try:
        ns.start()
        started.append(ns)
        brokers = []
        for name in ("broker-a", "broker-b"):
            b = BrokerProc(root / name, ns.addr, name=name)
            b.start()
            started.append(b)
            brokers.append(b)
        cl = Cluster(ns, brokers, root)
        yield cl
    finally:
        extra = [b for b in cl.brokers if b not in started] if cl is not None else []
        for p in reversed(started + extra):
            try:
                p.stop()
            except Exception:
                p.kill()


@pytest.fixture(scope="session")
def mq(cluster: Cluster) -> Iterator[MQ]:
    helper = MQ(cluster.namesrv_addr)
    try:
        yield helper
    finally:
        helper.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
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
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    client.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


_counter = itertools.count()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    return f"Spark_{name}_{os.getpid()}_{next(_counter)}"

"""One failover scenario against the compose cluster: its topic, consumers, load, accounting.

Each scenario creates its own topic (4 queues on each of broker-a/b/c), starts consumer host
processes of its own group, runs a steady producer load (4 senders; an answer other than
SEND_OK is tried again on another broker by the producer, retry_another_broker_when_not_store_ok;
a send that failed or was never answered SEND_OK is retried by the application with the same
key), breaks something, heals it, stops the load, and waits until every acknowledged
(SEND_OK) message has been consumed. It asserts lost == 0 (acknowledged but never consumed)
plus the scenario's own bounds, and prints its row of the table: scenario, sent, acked,
consumed (distinct), duplicates, lost, seconds to recover, failed send attempts, answers other
than SEND_OK.

The load's producer uses a shortened fault table (a failed broker is avoided for 10 s instead of
RocketMQ's 600 s) so a broker that comes back is used again within the scenario.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from client import Admin, Producer
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from tests.cluster.support import (
    ALL_BROKERS,
    BROKERS,
    CLUSTER_NAME,
    MASTER_OF,
    NAMESRVS,
    SLAVES,
    Cluster,
    ConsumerProcs,
    Load,
    Row,
    account,
    client_config,
    ns_broker_addrs,
    ns_brokers,
)
from tests.helpers import wait_until

# The load runs this long before the fault (every fault then waits for what it needs, e.g.
# acknowledgements by the broker it breaks).
WARMUP_S = 2.0
DRAIN_TIMEOUT_S = 90.0
# The load producer's fault table: RocketMQ's latency thresholds, shorter not-available
# durations. A failed (isolated) send counts as 30 s of latency -> the last entry, which must
# outlast pause_broker_b's freeze after its first timeouts (8 s - 3 s) or the frozen broker
# would be picked again while still frozen.
LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 1000, 2000, 4000, 6000, 10000)


@dataclass
class Ctx:
    cluster: Cluster
    load: Load
    consumers: ConsumerProcs
    rc: RemotingClient
    admin: Admin
    topic: str
    name: str
    # Failed checks that do not stop the scenario: reported after its row, with `lost`.
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        """Record `what` as a failure unless `ok`; `ok`."""
        if not ok:
            print(f"{self.name}: FAILED: {what}")
            self.failures.append(what)
        return ok


Fault = Callable[[Ctx], Awaitable[tuple[float, str]]]
Cleanup = Callable[[Ctx], Awaitable[None]]
# A whole scenario (it calls `run_scenario`), run against a plain or a secured project.
Scenario = Callable[[Cluster, Path, list[Row]], Awaitable[None]]


async def run_scenario(
    cluster: Cluster,
    tmp_path: Path,
    rows: list[Row],
    name: str,
    fault: Fault,
    *,
    consumers: int = 2,
    cleanup: Cleanup | None = None,
) -> Row:
    """Run one scenario; `fault(ctx)` breaks and heals, returning (recover_s, note).

    `cleanup(ctx)` runs once the acknowledged messages were consumed (or the drain gave up),
    also when the fault failed: it puts the cluster back as the next scenario expects it.
    """
    t_start = time.monotonic()
    phases: list[tuple[str, float]] = []
    await cluster.await_healthy()
    # A broker's container is healthy once one NameServer lists it (deploy/healthcheck.py),
    # and `create_topic` below asks one NameServer for the cluster's masters: a broker that
    # missed a NameServer at start (it was not listening yet) is listed there only after its
    # next registration period. Wait for every NameServer to list every broker.
    async with cluster.remoting_client() as rc:
        await wait_until(
            lambda: ns_list(rc, cluster, ALL_BROKERS),
            total=30,
            interval=0.2,
            what="every NameServer listing every broker",
        )
    suffix = cluster.scenario_suffix()
    topic = f"cluster_{name}_{suffix}"
    group = f"cg_{name}_{suffix}"
    # The secured project's rows are told apart by a suffix; topics keep the scenario's name
    # (its ACL names them).
    label = f"{name} acl+tls" if cluster.secure else name
    procs = ConsumerProcs(cluster, tmp_path, topic, group)
    async with (
        Admin(client_config(cluster, "admin")) as admin,
        cluster.remoting_client() as rc,
    ):
        created = await admin.create_topic(
            topic, cluster=CLUSTER_NAME, read_queue_nums=4, write_queue_nums=4
        )
        assert len(created) == 3, created
        ctx: Ctx | None = None
        try:
            # The consumer processes start (seconds of interpreter start-up) while the slaves
            # copy the topic.
            procs.start(consumers)
            # A slave learns the topic from its master (slave_sync_interval_ms); reads from a
            # slave whose master is gone need it there.
            for slave in SLAVES:
                await wait_until(
                    lambda s=slave: slave_knows_topic(rc, cluster, s, topic),  # type: ignore[misc]
                    total=20,
                    interval=0.2,
                    what=f"{slave} copying topic {topic} from its master",
                )
            await wait_until(procs.ready, total=30, interval=0.2, what="consumer processes ready")
            async with Producer(
                f"pg_{name}_{suffix}",
                client_config(
                    cluster,
                    latency_max_ms=LATENCY_MAX_MS,
                    not_available_duration_ms=NOT_AVAILABLE_DURATION_MS,
                    retry_another_broker_when_not_store_ok=True,
                ),
            ) as producer:
                load = Load(producer, topic, tag=f"{name}-{suffix}")
                ctx = Ctx(cluster, load, procs, rc, admin, topic, label)
                phases.append(("setup", time.monotonic()))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(load.run)
                    await trio.sleep(WARMUP_S)
                    try:
                        recover_s, note = await fault(ctx)
                    finally:
                        load.stop()
                phases.append(("fault", time.monotonic()))
            # A fault may have paused the consumers; they must read everything now.
            procs.resume()

            def drained() -> bool:
                consumed = {r.key for r in procs.records()}
                return set(load.acked) <= consumed

            try:
                await wait_until(drained, total=DRAIN_TIMEOUT_S, interval=0.5, what="drain")
            except AssertionError:
                pass  # counted as lost below, with the keys in the message
            row, lost = account(label, load, procs.records(), recover_s, note)
            phases.append(("drain", time.monotonic()))
        finally:
            procs.stop_all()
            if cleanup is not None and ctx is not None:
                await cleanup(ctx)
    phases.append(("teardown", time.monotonic()))
    rows.append(row)
    print(f"\n{Row.HEADER}\n{row.line()}")
    print(phase_line(label, t_start, phases))
    problems = list(ctx.failures)
    if row.lost:
        problems.append(f"{row.lost} acknowledged messages never consumed: {sorted(lost)[:20]}")
    if row.acked <= 100:
        problems.append(f"too little load to judge: {row}")
    assert not problems, "; ".join(problems)
    return row


def phase_line(name: str, start: float, phases: list[tuple[str, float]]) -> str:
    """`name: setup 4.1s, fault 12.0s, ...`: where a scenario's time went (its phases' ends,
    `time.monotonic()`, in order)."""
    parts, last = [], start
    for phase, end in phases:
        parts.append(f"{phase} {end - last:.1f}s")
        last = end
    return f"{name}: " + ", ".join(parts) + f" (total {last - start:.1f}s)"


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], *, total: float, what: str, interval: float = 0.2
) -> float:
    """Poll an async predicate; the seconds it took (AssertionError after `total`)."""
    start = time.time()
    await wait_until(predicate, total=total, interval=interval, what=what)
    return time.time() - start


async def answers(ctx: Ctx, addr: str) -> bool:
    return await ns_brokers(ctx.rc, addr) is not None


async def all_ns_lack(ctx: Ctx, broker: str) -> bool:
    """No NameServer lists a master of `broker` (its slave may still be listed)."""
    for ns in NAMESRVS:
        brokers = await ns_brokers(ctx.rc, ctx.cluster.ns_addr(ns))
        if brokers is None or broker in brokers:
            return False
    return True


def _ident(service: str) -> tuple[str, int]:
    """A service's (broker name, broker id)."""
    if service in MASTER_OF:
        return MASTER_OF[service], 1
    assert service in BROKERS, service
    return service, 0


async def ns_list(rc: RemotingClient, cluster: Cluster, services: Sequence[str]) -> bool:
    """Every NameServer lists each of the brokers `services` (masters or slaves) at its
    address."""
    for ns in NAMESRVS:
        table = await ns_broker_addrs(rc, cluster.ns_addr(ns))
        if table is None:
            return False
        for service in services:
            name, bid = _ident(service)
            if table.get(name, {}).get(bid) != cluster.broker_addr(service):
                return False
    return True


async def all_ns_list(ctx: Ctx, broker: str) -> bool:
    return await ns_list(ctx.rc, ctx.cluster, (broker,))


async def slave_knows_topic(rc: RemotingClient, cluster: Cluster, slave: str, topic: str) -> bool:
    """The slave has the topic's config (it answers GET_TOPIC_STATS_INFO for it)."""
    try:
        resp = await rc.invoke(
            cluster.broker_addr(slave),
            RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}),
            timeout_ms=2000,
        )
    except Exception:
        return False
    return resp.code == ResponseCode.SUCCESS

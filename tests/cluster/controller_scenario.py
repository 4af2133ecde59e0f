"""One failover scenario against the controller-mode compose project: its topics, consumers,
loads and accounting (the controller counterpart of tests/cluster/scenario.py).

Each scenario creates two topics: `ctl_<name>_<id>` (4 queues on broker-a and on broker-b),
sent to by a load of 4 senders whose producer moves an answer other than SEND_OK to another
broker (retry_another_broker_when_not_store_ok), and `ctlo_<name>_<id>` (4 queues on broker-a
only), sent to by an ordered load: 4 sharding keys, each message sent once the one before it
was acknowledged (a failed or refused send is sent again with the same key). One consumer host
process reads both. The scenario breaks and heals something; then the loads stop and every
acknowledged (SEND_OK) message must be consumed (lost = 0), each sharding key's messages in
one queue of broker-a in send order. Its row adds both loads up.

The compose project is shared by the scenarios of a module: a scenario may leave a replica
down for the next (`ControllerCluster.left_down`); the next one starts it again unless it takes
it over (`keep_down`), and waits until broker-a has a master with both replicas in its
SyncStateSet.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from client import Admin, Producer, SendResult
from client.controller_admin import ControllerAdmin
from remoting import RemotingClient
from tests.cluster.controller_support import (
    CLUSTER_NAME,
    GROUP,
    REPLICAS,
    SEND_TIMEOUT_MS,
    ControllerCluster,
    controller_master,
    group_ready,
    knows_topic,
    ns_master,
    offsets,
)
from tests.cluster.scenario import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_DURATION_MS,
    WARMUP_S,
    phase_line,
)
from tests.cluster.support import (
    Consumed,
    ConsumerProcs,
    Load,
    Row,
    account,
    client_config,
    observed_send_results,
    order_violations,
)
from tests.helpers import wait_until

DRAIN_TIMEOUT_S = 30.0
# The bound of the brief: the other replica is master this soon after the master is lost.
PROMOTE_BOUND_S = 10.0
# Answers around a kill or a cut may still have been acknowledged just before it.
IN_FLIGHT_S = 1.0


@dataclass
class CtlCtx:
    cc: ControllerCluster
    load: Load
    ordered: Load
    consumers: ConsumerProcs
    rc: RemotingClient
    admin: Admin
    ctl: ControllerAdmin
    name: str
    # broker-a's master when the scenario started (None with no master yet).
    master: str | None
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        """Record `what` as a failure unless `ok` (reported after the row); `ok`."""
        if not ok:
            print(f"{self.name}: FAILED: {what}")
            self.failures.append(what)
        return ok

    @property
    def loads(self) -> tuple[Load, Load]:
        return self.load, self.ordered

    def group_acks(self, start: float = 0.0, end: float = float("inf")) -> dict[str, int]:
        """Acknowledgements of broker-a in [start, end] by the address that gave them."""
        out: dict[str, int] = {}
        for ld in self.loads:
            for key, (t, broker) in ld.acked.items():
                if broker == GROUP and start <= t <= end:
                    addr = ld.acked_by.get(key, "")
                    out[addr] = out.get(addr, 0) + 1
        return out

    def first_group_ack(self, after: float, by: str | None = None) -> float | None:
        """The time of the first acknowledgement of broker-a after `after` (by the replica
        `by` if given), None if none yet."""
        addr = None if by is None else self.cc.addr(by)
        times = [
            t
            for ld in self.loads
            for key, (t, broker) in ld.acked.items()
            if broker == GROUP and t > after and (addr is None or ld.acked_by.get(key) == addr)
        ]
        return min(times, default=None)

    def group_not_ok(self, by: str, start: float) -> dict[str, int]:
        """Answers other than SEND_OK the replica `by` gave since `start`, by status."""
        addr = self.cc.addr(by)
        out: dict[str, int] = {}
        for ld in self.loads:
            for t, a, status in ld.not_ok_at:
                if a == addr and t >= start:
                    out[status.value] = out.get(status.value, 0) + 1
        return out

    def errors_since(self, start: float) -> int:
        return sum(1 for ld in self.loads for t, _ in ld.errors if t >= start)

    async def stop_loads(self) -> None:
        for ld in self.loads:
            ld.stop()
        for ld in self.loads:
            await ld.stopped()

    async def is_master(self, service: str) -> bool:
        """The controllers name `service` broker-a's master."""
        return await controller_master(self.cc, self.ctl) == service

    async def ns_names_master(self, service: str) -> bool:
        return await ns_master(self.rc, self.cc) == service


CtlFault = Callable[[CtlCtx], Awaitable[tuple[float, str]]]
CtlCleanup = Callable[[CtlCtx], Awaitable[None]]


async def bring_back(cc: ControllerCluster) -> None:
    """Start the replica a scenario left down, if any."""
    if cc.left_down is not None:
        down, cc.left_down = cc.left_down, None
        await trio.to_thread.run_sync(lambda: cc.start(down))


async def run_ctl_scenario(
    cc: ControllerCluster,
    tmp_path: Path,
    rows: list[Row],
    name: str,
    fault: CtlFault,
    *,
    keep_down: bool = False,
    cleanup: CtlCleanup | None = None,
) -> Row:
    """Run one scenario; `fault(ctx)` breaks and heals, returning (recover_s, note).
    `keep_down`: a replica left down by the previous scenario stays down (the fault takes it
    over). `cleanup(ctx)` runs after the drain, also when the fault failed."""
    t_start = time.monotonic()
    t_load = time.time()  # when the loads started (set again then)
    phases: list[tuple[str, float]] = []
    if not keep_down:
        await bring_back(cc)
    up = [s for s in cc.services if s != cc.left_down]
    await cc.await_healthy(up, total=90)
    suffix = uuid.uuid4().hex[:8]
    topic, otopic = f"ctl_{name}_{suffix}", f"ctlo_{name}_{suffix}"
    procs = ConsumerProcs(cc, tmp_path, [topic, otopic], f"cg_{name}_{suffix}")
    async with (
        Admin(client_config(cc)) as admin,
        RemotingClient() as rc,
        ControllerAdmin(cc.controller_addrs, timeout_ms=2000) as ctl,
    ):

        async def ready() -> bool:
            if cc.left_down is None:
                return await group_ready(cc, ctl, rc)
            master = await controller_master(cc, ctl)
            return master is not None and await ns_master(rc, cc) == master

        await wait_until(ready, total=60, interval=0.2, what="broker-a master and SyncStateSet")
        master = await controller_master(cc, ctl)
        assert master is not None
        created = await admin.create_topic(
            topic, cluster=CLUSTER_NAME, read_queue_nums=4, write_queue_nums=4
        )
        assert sorted(created) == sorted([cc.addr(master), cc.addr("broker-b")]), created
        await admin.create_topic(
            otopic, broker_addr=cc.addr(master), read_queue_nums=4, write_queue_nums=4
        )
        ctx: CtlCtx | None = None
        try:
            procs.start(1)
            # The slave copies the topics from the master (slave_sync_interval_ms): as the next
            # master it must have them.
            for replica in REPLICAS:
                if replica in (master, cc.left_down):
                    continue
                for t in (topic, otopic):
                    await wait_until(
                        lambda r=replica, t=t: knows_topic(rc, cc, r, t),  # type: ignore[misc]
                        total=20,
                        interval=0.2,
                        what=f"{replica} copying topic {t}",
                    )
            await wait_until(procs.ready, total=30, interval=0.2, what="consumer process ready")
            async with Producer(
                f"pg_{name}_{suffix}",
                client_config(
                    cc,
                    send_timeout_ms=SEND_TIMEOUT_MS,
                    latency_max_ms=LATENCY_MAX_MS,
                    not_available_duration_ms=NOT_AVAILABLE_DURATION_MS,
                    retry_another_broker_when_not_store_ok=True,
                ),
            ) as producer:
                load = Load(producer, topic, tag=f"{name}-{suffix}")
                ordered = Load(producer, otopic, tag=f"{name}-o-{suffix}", ordered=True)
                ctx = CtlCtx(cc, load, ordered, procs, rc, admin, ctl, name, master)
                phases.append(("setup", time.monotonic()))
                t_load = time.time()

                def observe(result: SendResult) -> None:
                    load.observe(result)
                    ordered.observe(result)

                with observed_send_results(observe):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(lambda: load.run(observe=False))
                        nursery.start_soon(lambda: ordered.run(observe=False))
                        await trio.sleep(WARMUP_S)
                        try:
                            recover_s, note = await fault(ctx)
                        finally:
                            load.stop()
                            ordered.stop()
                phases.append(("fault", time.monotonic()))

            def drained() -> bool:
                consumed = {r.key for r in procs.records()}
                return all(set(ld.acked) <= consumed for ld in (load, ordered))

            try:
                await wait_until(drained, total=DRAIN_TIMEOUT_S, interval=0.5, what="drain")
            except AssertionError:
                pass  # counted as lost below, with the keys in the message
            records = procs.records()
            row, lost = account(name, [load, ordered], records, recover_s, note)
            disorder = order_violations(ordered, records)
            phases.append(("drain", time.monotonic()))
        finally:
            procs.stop_all()
            if cleanup is not None and ctx is not None:
                await cleanup(ctx)
    phases.append(("teardown", time.monotonic()))
    rows.append(row)
    print(f"\n{Row.HEADER}\n{row.line()}")
    print(phase_line(name, t_start, phases))
    problems = list(ctx.failures)
    if row.lost:
        problems.append(f"{row.lost} acknowledged messages never consumed: {sorted(lost)[:20]}")
        for line in lost_report(cc, (load, ordered), records, lost, t_load):
            print(f"{name}: {line}")
    if disorder:
        problems.append(f"order per sharding key broken: {disorder[:10]}")
    if len(load.acked) <= 100 or len(ordered.acked) <= 20:
        problems.append(f"too little load to judge: {len(load.acked)}, {len(ordered.acked)}")
    if problems and cc.logdir is not None:
        dump = cc.logdir / f"{cc.project}.{name}.json"
        dump.write_text(json.dumps(load_dump(cc, (load, ordered), records, t_load)))
        print(f"{name}: sends, answers and consumed records in {dump}")
    if lost and shadowed((load, ordered), records, lost) == lost:
        problems.append(SHADOWED_BUG)
    assert not problems, "; ".join(problems)
    return row


# How acknowledged messages were lost when every one of them fits `shadowed`: said in the
# failure, so that the cause is named (a master serving reads past its confirm offset).
SHADOWED_BUG = (
    "the consumer read, at their queue offsets, messages the old master stored but never "
    "acknowledged (served past the offset its SyncStateSet confirmed), so it skipped what "
    "the new master acknowledged at those offsets"
)


def shadowed(loads: tuple[Load, ...], records: list[Consumed], lost: set[str]) -> set[str]:
    """The lost keys whose queue offset (topic, broker, queue, offset where they were
    acknowledged) the consumer read with other messages, none of them acknowledged there:
    records a master stored and served but never acknowledged, later replaced by another
    master's at the same offsets."""

    def load_of(key: str) -> Load:
        return next(ld for ld in loads if key.startswith(f"{ld.tag}-"))

    at: dict[tuple[str, str, int, int], list[str]] = {}
    for r in records:
        at.setdefault((load_of(r.key).topic, r.broker, r.queue_id, r.offset), []).append(r.key)
    out = set()
    for key in lost:
        ld = load_of(key)
        place = (ld.topic, ld.acked[key][1], *ld.acked_queue.get(key, (-1, -1)))
        others = [k for k in at.get(place, []) if k != key]
        if others and all(
            (ld.acked.get(k, (0.0, ""))[1], *ld.acked_queue.get(k, (-1, -1))) != place[1:]
            for k in others
        ):
            out.add(key)
    return out


def lost_report(
    cc: ControllerCluster,
    loads: tuple[Load, ...],
    records: list[Consumed],
    lost: set[str],
    t0: float,
) -> list[str]:
    """For each lost key (20 at most): when (seconds after the load started) and by which
    broker it was acknowledged, at which queue offset, and what was consumed at that offset."""
    at: dict[tuple[str, int, int], list[str]] = {}
    for r in records:
        at.setdefault((r.broker, r.queue_id, r.offset), []).append(r.key)
    out = []
    for key in sorted(lost)[:20]:
        ld = next(ld for ld in loads if key in ld.acked)
        t, broker = ld.acked[key]
        qid, offset = ld.acked_queue.get(key, (-1, -1))
        by = cc.service_at(ld.acked_by.get(key)) or ld.acked_by.get(key)
        seen = at.get((broker, qid, offset), [])
        out.append(
            f"lost {key}: acked {t - t0:.2f}s by {by} at {broker}:{qid}@{offset}; "
            f"consumed there: {seen or 'nothing'}"
        )
    return out


def load_dump(
    cc: ControllerCluster, loads: tuple[Load, ...], records: list[Consumed], t0: float
) -> dict[str, object]:
    """Everything a failed scenario's loads and consumer saw (times after the load start)."""
    return {
        "t0": t0,
        "loads": [
            {
                "topic": ld.topic,
                "acked": {
                    k: [t - t0, b, cc.service_at(ld.acked_by.get(k)), *ld.acked_queue.get(k, ())]
                    for k, (t, b) in ld.acked.items()
                },
                "sent": {k: t - t0 for k, t in ld.sent.items()},
                "not_ok": [[t - t0, cc.service_at(a) or a, st.value] for t, a, st in ld.not_ok_at],
                "errors": [[t - t0, e] for t, e in ld.errors],
                "by_shard": ld.by_shard,
            }
            for ld in loads
        ],
        "consumed": [[r.key, r.broker, r.queue_id, r.offset, r.at - t0] for r in records],
    }


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], *, total: float, what: str, interval: float = 0.1
) -> float:
    """Poll an async predicate; the seconds it took (AssertionError after `total`)."""
    start = time.time()
    await wait_until(predicate, total=total, interval=interval, what=what)
    return time.time() - start


async def same_commitlogs(ctx: CtlCtx, a: str, b: str) -> tuple[bool, str]:
    """Whether both replicas hold identical commitlog bytes over the range both hold, the
    range reaching both ends (equal max offsets); the detail."""
    oa, ob = await offsets(ctx.admin, ctx.cc, a), await offsets(ctx.admin, ctx.cc, b)
    if oa is None or ob is None:
        return False, f"no offsets: {a} {oa}, {b} {ob}"
    start, end = max(oa[0], ob[0]), min(oa[1], ob[1])
    if end <= start:
        return False, f"no common range: {a} {oa}, {b} {ob}"
    cc = ctx.cc
    (da, na), (db, nb) = [
        await trio.to_thread.run_sync(lambda s=s: cc.commitlog_digest(s, start, end))  # type: ignore[misc]
        for s in (a, b)
    ]
    detail = (
        f"[{start}, {end}) {end - start} bytes: {a} {da[:12]} ({na} read), "
        f"{b} {db[:12]} ({nb} read); max {oa[1]} / {ob[1]}"
    )
    return da == db and na == nb == end - start and oa[1] == ob[1], detail


async def caught_up(ctx: CtlCtx, slave: str, master: str) -> bool:
    """The slave's commitlog ends where the master's does."""
    so = await offsets(ctx.admin, ctx.cc, slave)
    mo = await offsets(ctx.admin, ctx.cc, master)
    return so is not None and mo is not None and so[1] == mo[1]

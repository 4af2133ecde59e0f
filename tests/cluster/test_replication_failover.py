"""Replication failover scenarios against the compose cluster: SYNC_MASTER masters broker-a/b/c,
each with a slave (broker-a-s...). How a scenario runs and what its row shows:
tests/cluster/scenario.py. An acknowledged (SEND_OK) send is on the master and its slave.

- lose_master_a: broker-a's machine is lost (SIGKILL, container and store volume removed): what
  it acknowledged is read from broker-a-s, sends go on via b and c.
- kill_slave_a: broker-a-s is SIGKILLed: sends to a are answered SLAVE_NOT_AVAILABLE or
  FLUSH_SLAVE_TIMEOUT and go to b/c; restarted on its volume, it catches up with identical bytes.
- partition_slave_a: broker-a-s is cut off the network for 7 s; reconnected, it catches up.
- master_returns_empty: broker-a comes back on an empty store while broker-a-s holds its data:
  it gets the slave's bytes back before it takes writes; nothing acknowledged is lost.

The commitlog comparisons hash the byte range both brokers hold ([larger min offset, smaller
max offset)) inside each container, with the load stopped and the slave caught up.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from remoting.protocol.bodies import HARuntimeInfo
from tests.cluster.scenario import Ctx, Scenario, run_scenario, wait_for
from tests.cluster.support import (
    SEND_TIMEOUT_MS,
    SLAVE_TIMEOUT_MS,
    Cluster,
    ConsumerProcs,
    Row,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # each scenario runs tens of seconds against the cluster

SEND_TIMEOUT_S = SEND_TIMEOUT_MS / 1000
SLAVE_TIMEOUT_S = SLAVE_TIMEOUT_MS / 1000
# Consumers are paused this long before broker-a goes, so messages it acknowledged are left
# unconsumed and must be read after it is gone.
BACKLOG_S = 2.0
# How long a broker stays broken while the load runs: enough for b and c to take well over
# 50 sends; a partition outlasts HA_HOUSEKEEPING_MS, so the master drops the silent link.
OUTAGE_S = 5.0
PARTITION_S = 7.0
# The bound of the brief: consumers read broker-a's messages from its slave this soon.
RESUME_BOUND_S = 10.0
# A master back on an empty store has its slave's bytes back this soon.
REFILL_BOUND_S = 60.0
# A send answered around a kill may still have been acknowledged by the slave before it went.
IN_FLIGHT_S = 1.0
REFUSED = {"SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT"}


# -- broker state --------------------------------------------------------------------------
async def runtime(ctx: Ctx, service: str) -> dict[str, str] | None:
    """The broker's runtime info (GET_BROKER_RUNTIME_INFO), None when it does not answer."""
    try:
        return await ctx.admin.broker_status(ctx.cluster.broker_addr(service))
    except Exception:
        return None


async def offsets(ctx: Ctx, service: str) -> tuple[int, int] | None:
    """The broker's commitlog (min, max) offsets."""
    info = await runtime(ctx, service)
    if info is None:
        return None
    try:
        return int(info["commitLogMinOffset"]), int(info["commitLogMaxOffset"])
    except (KeyError, ValueError):
        return None


async def max_offset(ctx: Ctx, service: str) -> int | None:
    found = await offsets(ctx, service)
    return None if found is None else found[1]


async def pulled_from(ctx: Ctx, service: str) -> int | None:
    """Messages the broker has served to pulls (`msgGetTotalTodayNow`)."""
    info = await runtime(ctx, service)
    raw = None if info is None else info.get("msgGetTotalTodayNow")
    return int(raw) if raw is not None and raw.isdigit() else None


async def ha_status(ctx: Ctx, service: str) -> HARuntimeInfo | None:
    try:
        return await ctx.admin.ha_status(ctx.cluster.broker_addr(service))
    except Exception:
        return None


async def caught_up(ctx: Ctx, master: str) -> bool:
    """The master has a slave connection with nothing left to send, and the slave's commitlog
    ends where the master's does."""
    status = await ha_status(ctx, master)
    if status is None or not any(c.diff == 0 for c in status.ha_connection_info):
        return False
    mine, theirs = await max_offset(ctx, master), await max_offset(ctx, f"{master}-s")
    return mine is not None and mine == theirs


async def compare_commitlogs(ctx: Ctx, master: str) -> tuple[bool, str]:
    """Whether the commitlog bytes both the master and its slave hold are identical; the
    detail (range, digests)."""
    slave = f"{master}-s"
    mo, so = await offsets(ctx, master), await offsets(ctx, slave)
    if mo is None or so is None:
        return False, f"no offsets: {master} {mo}, {slave} {so}"
    start, end = max(mo[0], so[0]), min(mo[1], so[1])
    if end <= start:
        return False, f"no common range: {master} {mo}, {slave} {so}"
    c = ctx.cluster
    (da, na), (ds, ns) = [
        await trio.to_thread.run_sync(lambda s=s: c.commitlog_digest(s, start, end))  # type: ignore[misc]
        for s in (master, slave)
    ]
    detail = (
        f"[{start}, {end}) {end - start} bytes: {master} {da[:12]} ({na} read), "
        f"{slave} {ds[:12]} ({ns} read); max {mo[1]} / {so[1]}"
    )
    return da == ds and na == ns == end - start, detail


def consumed_from(procs: ConsumerProcs, broker: str, since: float = 0.0) -> int:
    return sum(1 for r in procs.records() if r.broker == broker and r.at >= since)


def acked_on(ctx: Ctx, broker: str) -> set[str]:
    return {k for k, (_, b) in ctx.load.acked.items() if b == broker}


async def reset_pair(cluster: Cluster, master: str) -> None:
    """Both brokers of the group back on empty stores (the state the next scenario needs when
    this one left them apart)."""
    slave = f"{master}-s"
    for service in (slave, master):
        await trio.to_thread.run_sync(lambda s=service: cluster.remove_with_store(s))  # type: ignore[misc]
    await cluster.run("up", "-d", "--no-deps", master, slave)
    await cluster.await_healthy([master, slave], total=90)


def refused_summary(ctx: Ctx, broker: str, start: float, end: float) -> dict[str, int]:
    return ctx.load.not_ok_by_broker(start, end).get(broker, {})


# -- scenarios -----------------------------------------------------------------------------
async def lose_master_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """broker-a's machine is lost under load: what it acknowledged is consumed from broker-a-s
    (first message served by the slave within 10 s of the kill); sends go on via b and c."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load, procs, c = ctx.load, ctx.consumers, ctx.cluster
        await wait_until(
            lambda: consumed_from(procs, "broker-a") > 0,
            total=20,
            interval=0.2,
            what="consumers reading broker-a",
        )
        procs.pause()
        await trio.sleep(BACKLOG_S)
        # Counted with the consumers paused: what the slave serves from here on is read after
        # the kill.
        served_before = await pulled_from(ctx, "broker-a-s")
        assert served_before is not None, "broker-a-s gives no runtime info"
        t_kill = time.time()
        await trio.to_thread.run_sync(lambda: c.kill("broker-a"))
        procs.resume()
        acked_a = acked_on(ctx, "broker-a")
        backlog = acked_a - {r.key for r in procs.records()}

        async def slave_serving() -> bool:
            n = await pulled_from(ctx, "broker-a-s")
            return n is not None and n > served_before

        async with trio.open_nursery() as nursery:
            # The machine is gone for good: container and store removed while clients go on.
            nursery.start_soon(trio.to_thread.run_sync, lambda: c.remove_with_store("broker-a"))
            await wait_until(
                slave_serving,
                total=RESUME_BOUND_S + 10,
                interval=0.1,
                what="broker-a-s serving broker-a's messages",
            )
            resumed = time.time() - t_kill

        def backlog_read() -> bool:
            return acked_a <= {r.key for r in procs.records()}

        await wait_until(backlog_read, total=30, interval=0.2, what="broker-a's messages read")
        drained = time.time() - t_kill
        await trio.sleep(max(0.0, t_kill + OUTAGE_S - time.time()))
        t_end = time.time()
        during = load.acks_by_broker(t_kill + IN_FLIGHT_S, t_end)
        assert "broker-a" not in during, during
        assert sum(during.values()) > 50, f"sends did not go on via b and c: {during}"
        gap = load.max_ack_gap(t_kill, t_end)
        assert gap <= SEND_TIMEOUT_S + 2, f"sends stalled {gap:.2f}s after the kill"
        assert backlog, "no message of broker-a was left to read from its slave"
        assert resumed <= RESUME_BOUND_S, f"the slave served broker-a's messages after {resumed}"
        return resumed, (
            f"a had acked {len(acked_a)}, {len(backlog)} unread at the kill; slave served "
            f"{resumed:.1f}s, all of a's read {drained:.1f}s after the kill; send gap {gap:.1f}s"
        )

    async def cleanup(ctx: Ctx) -> None:
        await reset_pair(ctx.cluster, "broker-a")

    await run_scenario(cluster, tmp_path, rows, "lose_master_a", fault, cleanup=cleanup)


async def _replica_back(ctx: Ctx, t_heal: float, what: str) -> tuple[float, str]:
    """After broker-a-s is back at `t_heal`: broker-a acknowledges sends again (its slave is in
    sync); then, with the load stopped, the slave catches up and both commitlogs hold the same
    bytes. (seconds to acknowledged again, detail)."""
    load = ctx.load

    def acked_again() -> bool:
        return load.acks_by_broker(t_heal).get("broker-a", 0) > 0

    await wait_until(acked_again, total=60, interval=0.1, what=f"broker-a acknowledging {what}")
    first = min(t for t, b in load.acked.values() if b == "broker-a" and t >= t_heal)
    await load.stopped()
    caught = await wait_for(
        lambda: caught_up(ctx, "broker-a"), total=30, what="broker-a-s caught up (diff 0)"
    )
    same, detail = await compare_commitlogs(ctx, "broker-a")
    assert same, f"commitlogs differ: {detail}"
    print(f"{ctx.name}: commitlogs identical: {detail}")
    return first - t_heal, f"caught up {caught:.1f}s after the load stopped; {detail}"


async def kill_slave_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """SIGKILL broker-a-s under load: sends to broker-a are answered SLAVE_NOT_AVAILABLE or
    FLUSH_SLAVE_TIMEOUT and go to b/c; restarted on its volume it catches up with the same
    bytes as broker-a."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load, c = ctx.load, ctx.cluster
        await wait_until(
            lambda: len(acked_on(ctx, "broker-a")) > 20,
            total=20,
            interval=0.2,
            what="broker-a acknowledging",
        )
        t_kill = time.time()
        await trio.to_thread.run_sync(lambda: c.kill("broker-a-s"))
        await trio.sleep(OUTAGE_S)
        t_restart = time.time()
        refused = refused_summary(ctx, "broker-a", t_kill, t_restart)
        acks_a = load.acks_by_broker(t_kill + IN_FLIGHT_S, t_restart).get("broker-a", 0)
        during = load.acks_by_broker(t_kill, t_restart)
        gap = load.max_ack_gap(t_kill, t_restart)
        await c.run("start", "broker-a-s")
        back, detail = await _replica_back(ctx, t_restart, "after the slave's restart")
        assert acks_a == 0, f"broker-a acknowledged {acks_a} sends without its slave"
        assert refused, "no send reached broker-a while its slave was down"
        assert set(refused) <= REFUSED, refused
        assert sum(during.values()) > 50, f"sends did not go on via b and c: {during}"
        assert gap <= SEND_TIMEOUT_S + 2, f"sends stalled {gap:.2f}s"
        return back, f"a refused {refused}; acked again {back:.1f}s after restart; {detail}"

    await run_scenario(cluster, tmp_path, rows, "kill_slave_a", fault)


async def partition_slave_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """Cut broker-a-s off the network for 7 s under load: broker-a acknowledges nothing
    meanwhile (its sends go to b/c); reconnected, the slave catches up with the same bytes."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load, c = ctx.load, ctx.cluster
        await wait_until(
            lambda: len(acked_on(ctx, "broker-a")) > 20,
            total=20,
            interval=0.2,
            what="broker-a acknowledging",
        )
        t_cut = time.time()
        await trio.to_thread.run_sync(lambda: c.disconnect("broker-a-s"))
        await trio.sleep(PARTITION_S)
        t_heal = time.time()
        await trio.to_thread.run_sync(lambda: c.reconnect("broker-a-s"))
        refused = refused_summary(ctx, "broker-a", t_cut, t_heal)
        acks_a = load.acks_by_broker(t_cut + IN_FLIGHT_S, t_heal).get("broker-a", 0)
        during = load.acks_by_broker(t_cut, t_heal)
        gap = load.max_ack_gap(t_cut, t_heal)
        back, detail = await _replica_back(ctx, t_heal, "after the reconnect")
        assert acks_a == 0, f"broker-a acknowledged {acks_a} sends while its slave was cut off"
        assert set(refused) <= REFUSED, refused
        assert sum(during.values()) > 50, f"sends did not go on via b and c: {during}"
        # A send waits for the slave at most SLAVE_TIMEOUT_MS before it moves on.
        assert gap <= SEND_TIMEOUT_S + 2, f"sends stalled {gap:.2f}s"
        return back, f"a refused {refused}; acked again {back:.1f}s after reconnect; {detail}"

    await run_scenario(cluster, tmp_path, rows, "partition_slave_a", fault)


async def master_returns_empty(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """broker-a comes back on an empty store while broker-a-s holds its data: within 60 s its
    commitlog reaches the slave's (the slave's bytes copied back, no write taken before), the
    bytes both hold are identical, and every acknowledged message is consumed."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load, procs, c = ctx.load, ctx.consumers, ctx.cluster
        await wait_until(
            lambda: consumed_from(procs, "broker-a") > 0,
            total=20,
            interval=0.2,
            what="consumers reading broker-a",
        )
        procs.pause()
        await trio.sleep(BACKLOG_S)
        t_kill = time.time()
        await trio.to_thread.run_sync(lambda: c.kill("broker-a"))
        acked_a = acked_on(ctx, "broker-a")
        backlog = acked_a - {r.key for r in procs.records()}
        slave_max = await max_offset(ctx, "broker-a-s")
        assert slave_max is not None, "broker-a-s gives no runtime info"
        assert slave_max > 0, "broker-a-s holds nothing"
        await trio.to_thread.run_sync(lambda: c.remove_with_store("broker-a"))
        await c.run("up", "-d", "--no-deps", "broker-a")
        t_back = time.time()
        behind_at = t_back

        async def refilled() -> bool:
            nonlocal behind_at
            mine = await max_offset(ctx, "broker-a")
            if mine is not None and mine >= slave_max:
                return True
            behind_at = time.time()
            return False

        try:
            refill_s: float = await wait_for(
                refilled, total=REFILL_BOUND_S, what="broker-a's commitlog reaching its slave's"
            )
        except AssertionError:
            refill_s = -1.0
        now_max = await max_offset(ctx, "broker-a")
        ctx.check(
            refill_s >= 0,
            f"broker-a's commitlog max offset {now_max} did not reach broker-a-s's {slave_max} "
            f"within {REFILL_BOUND_S:.0f}s of its return",
        )
        try:
            await c.await_healthy(["broker-a"], total=60)
            healthy = time.time() - t_back
        except AssertionError:
            healthy = -1.0
        ctx.check(healthy >= 0, "broker-a not registered 60 s after its return")
        # The consumers read on from the returned master (its slave's data copied back).
        procs.resume()
        t_registered = time.time()

        def acknowledging() -> bool:
            return load.acks_by_broker(t_registered).get("broker-a", 0) > 0

        try:
            await wait_until(
                acknowledging, total=30, interval=0.1, what="broker-a acknowledging again"
            )
            writable = time.time() - t_back
        except AssertionError:
            writable = -1.0
        ctx.check(writable >= 0, "broker-a acknowledged no send 30 s after it registered")
        # Any answer but an error means the message was stored: broker-a took a write while
        # still behind its slave, at offsets the slave holds other bytes at.
        taken = load.acks_by_broker(t_back, behind_at).get("broker-a", 0) + sum(
            refused_summary(ctx, "broker-a", t_back, behind_at).values()
        )
        ctx.check(
            taken == 0,
            f"broker-a stored {taken} sends while behind its slave (last seen behind "
            f"{behind_at - t_back:.1f}s after its return)",
        )
        acks_a = load.acks_by_broker(t_back).get("broker-a", 0)
        refused = refused_summary(ctx, "broker-a", t_back, time.time())
        await load.stopped()
        try:
            await wait_for(
                lambda: caught_up(ctx, "broker-a"), total=30, what="broker-a-s caught up"
            )
            in_sync = True
        except AssertionError:
            in_sync = False
        ctx.check(in_sync, "broker-a and broker-a-s not in sync (diff 0) 30 s after the load")
        same, detail = await compare_commitlogs(ctx, "broker-a")
        ctx.check(same, f"commitlogs differ: {detail}")
        return refill_s, (
            f"a had acked {len(acked_a)} ({len(backlog)} unread) up to the kill at slave max "
            f"{slave_max}; started again {t_back - t_kill:.1f}s later; refilled "
            f"{'never' if refill_s < 0 else f'{refill_s:.1f}s'}, registered "
            f"{'never' if healthy < 0 else f'{healthy:.1f}s'}, acknowledging "
            f"{'never' if writable < 0 else f'{writable:.1f}s'} after; a acked {acks_a} after "
            f"its return, refused {refused}; {detail}"
        )

    async def cleanup(ctx: Ctx) -> None:
        consistent = False
        with trio.move_on_after(15):
            try:
                await wait_until(
                    lambda: caught_up(ctx, "broker-a"), total=10, interval=0.5, what="in sync"
                )
                consistent = (await compare_commitlogs(ctx, "broker-a"))[0]
            except AssertionError:
                consistent = False
        if not consistent:
            await reset_pair(ctx.cluster, "broker-a")

    await run_scenario(cluster, tmp_path, rows, "master_returns_empty", fault, cleanup=cleanup)


# -- the scenarios against the plain cluster (the secured one: test_acl_tls_failover.py) --
async def test_lose_master_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await lose_master_a(cluster, tmp_path, rows)


async def test_kill_slave_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await kill_slave_a(cluster, tmp_path, rows)


async def test_partition_slave_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await partition_slave_a(cluster, tmp_path, rows)


async def test_master_returns_empty(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await master_returns_empty(cluster, tmp_path, rows)


SCENARIOS: dict[str, Scenario] = {
    "lose_master_a": lose_master_a,
    "kill_slave_a": kill_slave_a,
    "partition_slave_a": partition_slave_a,
    "master_returns_empty": master_returns_empty,
}

"""Failover scenarios of the masters, the NameServers and the consumers against the compose
cluster (deploy/docker-compose.yml; masters SYNC_MASTER, each with a slave). How a scenario
runs and what its row shows: tests/cluster/scenario.py.

Bounds are generous multiples of the configured timings (send timeout 3 s, registration every
2 s, NameServer expiry 6 s, scan 1 s, rebalance 2 s); the measured values are printed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from tests.cluster.scenario import (
    NOT_AVAILABLE_DURATION_MS,
    Ctx,
    Scenario,
    all_ns_lack,
    all_ns_list,
    answers,
    run_scenario,
    wait_for,
)
from tests.cluster.support import (
    BROKER_EXPIRED_MS,
    BROKERS,
    NAMESRV_SCAN_MS,
    NAMESRVS,
    REBALANCE_MS,
    REGISTER_PERIOD_MS,
    SEND_TIMEOUT_MS,
    Cluster,
    Row,
    ns_brokers,
    ns_route_brokers,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # each scenario runs tens of seconds against the cluster

SEND_TIMEOUT_S = SEND_TIMEOUT_MS / 1000
REGISTER_PERIOD_S = REGISTER_PERIOD_MS / 1000
ISOLATION_S = NOT_AVAILABLE_DURATION_MS[-1] / 1000
PAUSE_S = 8.0
OUTAGE_S = 3.0


async def kill_broker_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """SIGKILL broker-a under load: sends go on via b/c at once; after restart all it
    acknowledged is consumed."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load = ctx.load
        t0 = time.time()
        await ctx.cluster.run("kill", "-s", "SIGKILL", "broker-a")
        t_killed = time.time()
        dropped = await wait_for(
            lambda: all_ns_lack(ctx, "broker-a"), total=20, what="NameServers drop broker-a"
        )
        # Long enough for b and c to take well over 50 sends while a is gone.
        await trio.sleep(OUTAGE_S)
        t_down_end = time.time()
        during = load.acks_by_broker(t_killed, t_down_end)
        assert "broker-a" not in during, during
        assert sum(during.values()) > 50, f"sends did not go on during the outage: {during}"
        gap = load.max_ack_gap(t0, t_down_end)
        acked_on_a = sum(1 for _, b in load.acked.values() if b == "broker-a")
        await ctx.cluster.run("start", "broker-a")
        await ctx.cluster.await_healthy(["broker-a"])
        back = time.time() - t_down_end
        await trio.sleep(1)
        # Sends never stalled beyond one send timeout (with slack).
        assert gap <= SEND_TIMEOUT_S + 2, f"sends stalled {gap:.2f}s after the kill"
        return gap, (
            f"ns dropped a {dropped:.1f}s after kill; a had acked {acked_on_a}; "
            f"restart->healthy {back:.1f}s"
        )

    await run_scenario(cluster, tmp_path, rows, "kill_broker_a", fault)


async def pause_broker_b(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """Freeze broker-b: sends time out at most for one send timeout after the freeze, then go
    elsewhere (the fault table isolates b); after unpause b registers again and the load's own
    producer uses it again once its not-available duration is over."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load = ctx.load
        t0 = time.time()
        await ctx.cluster.run("pause", "broker-b")
        t_paused = time.time()
        await trio.sleep(PAUSE_S)
        t_unpause = time.time()
        await ctx.cluster.run("unpause", "broker-b")
        late = [t - t_paused for t, _ in load.errors if t >= t0]
        window = SEND_TIMEOUT_S + 2
        for t, err in load.errors:
            print(f"pause_broker_b: send error {t - t_paused:+.2f}s after pause: {err}")
        # Only the sends already waiting on b (or started before the first of them timed out)
        # fail: every attempt that ends at the timeout charges b, so no second wave.
        assert all(d <= window for d in late), load.errors
        settled = load.acks_by_broker(t_paused + window, t_unpause)
        assert "broker-b" not in settled, settled
        gap = load.max_ack_gap(t0, t_unpause)
        assert gap <= window, f"sends stalled {gap:.2f}s while broker-b was frozen"
        back = await wait_for(
            lambda: all_ns_list(ctx, "broker-b"), total=30, what="broker-b registered again"
        )

        def used_again() -> bool:
            return load.acks_by_broker(t_unpause).get("broker-b", 0) > 0

        # The load's producer itself sends to b again: b's isolation (from its first timeouts,
        # about one send timeout after the freeze) ends ISOLATION_S later.
        await wait_until(
            used_again,
            total=SEND_TIMEOUT_S + ISOLATION_S + 20,
            interval=0.1,
            what="the load producer sends to broker-b again",
        )
        first_b = min(t for t, b in load.acked.values() if b == "broker-b" and t >= t_unpause)
        used_at = first_b - t_unpause
        late_after = [t - t_paused for t, _ in load.errors if t >= t0]
        assert late_after == late, f"send errors after unpause: {load.errors}"
        return gap, (
            f"{len(late)} timed-out sends, last {max(late, default=0):.1f}s after pause; "
            f"registered again {back:.1f}s, load used b again {used_at:.1f}s after unpause"
        )

    await run_scenario(cluster, tmp_path, rows, "pause_broker_b", fault)


async def stop_one_namesrv(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """Stop namesrv1: brokers and clients go on with namesrv2; restarted, namesrv1 knows all
    brokers again after one registration round."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load = ctx.load
        ns2 = ctx.cluster.ns_addr("namesrv2")
        t0 = time.time()
        await ctx.cluster.run("stop", "-t", "5", "namesrv1")
        # Three registration rounds with one NameServer down: namesrv2 keeps every broker.
        for _ in range(12):
            brokers = await ns_brokers(ctx.rc, ns2)
            assert brokers is not None
            assert set(brokers) == set(BROKERS), brokers
            await trio.sleep(0.5)
        await ctx.cluster.run("start", "namesrv1")
        ns1 = ctx.cluster.ns_addr("namesrv1")
        # The container's process needs a moment to listen; count from its first answer.
        boot = await wait_for(
            lambda: answers(ctx, ns1), total=60, interval=0.05, what="namesrv1 answering"
        )

        async def full() -> bool:
            brokers = await ns_brokers(ctx.rc, ns1)
            return brokers is not None and set(brokers) == set(BROKERS)

        full_s = await wait_for(full, total=30, interval=0.05, what="namesrv1 full again")
        errors = [t for t, _ in load.errors if t >= t0]
        assert not errors, f"send errors while a NameServer was down: {load.errors[-5:]}"
        # One registration round (plus the round trip) after it answers.
        assert full_s <= REGISTER_PERIOD_S + 1.5, f"namesrv1 full only after {full_s:.1f}s"
        return full_s, (
            f"namesrv1 answering {boot:.1f}s after start, full {full_s:.1f}s later "
            f"(period {REGISTER_PERIOD_S:.0f}s)"
        )

    await run_scenario(cluster, tmp_path, rows, "stop_namesrv1", fault)


async def disconnect_broker_c(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """Cut broker-c off the network: the NameServers drop it after the expiry interval and
    routes no longer list it; reconnected, it is back."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load = ctx.load
        t0 = time.time()
        await trio.to_thread.run_sync(lambda: ctx.cluster.disconnect("broker-c"))
        expiry_s = (BROKER_EXPIRED_MS + NAMESRV_SCAN_MS) / 1000
        dropped = await wait_for(
            lambda: all_ns_lack(ctx, "broker-c"),
            total=expiry_s + 20,
            what="NameServers drop broker-c",
        )
        for ns in NAMESRVS:
            route = await ns_route_brokers(ctx.rc, ctx.cluster.ns_addr(ns), ctx.topic)
            assert route == {"broker-a", "broker-b"}, (ns, route)
        assert dropped <= expiry_s + 4, f"dropped only after {dropped:.1f}s"
        await trio.sleep(1)
        await trio.to_thread.run_sync(lambda: ctx.cluster.reconnect("broker-c"))
        back = await wait_for(
            lambda: all_ns_list(ctx, "broker-c"), total=60, what="broker-c registered again"
        )
        for ns in NAMESRVS:
            route = await ns_route_brokers(ctx.rc, ctx.cluster.ns_addr(ns), ctx.topic)
            assert route == set(BROKERS), (ns, route)
        # Its slave follows it again too (its health needs the HA connection).
        await ctx.cluster.await_healthy(["broker-c", "broker-c-s"])
        gap = load.max_ack_gap(t0, time.time())
        assert gap <= SEND_TIMEOUT_S + 2, f"sends stalled {gap:.2f}s"
        return gap, (
            f"ns dropped c {dropped:.1f}s after disconnect (expiry {expiry_s:.0f}s); "
            f"back in routes {back:.1f}s after reconnect"
        )

    await run_scenario(cluster, tmp_path, rows, "disconnect_broker_c", fault)


async def kill_one_consumer(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """SIGKILL one of three consumer processes: its queues move to the other two within a
    rebalance interval and consumption resumes from the committed offsets."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        procs = ctx.consumers

        def each_consumed() -> bool:
            return {r.consumer for r in procs.records()} == {0, 1, 2}

        await wait_until(each_consumed, total=30, interval=0.2, what="all consumers consuming")
        # Let the allocation settle (consumers joined one by one) and offsets be committed.
        await trio.sleep(REBALANCE_MS / 1000 + 2)
        # The queues consumer 0 owns now: consumed by it, and by no one else, lately.
        recent_from = time.time() - 1.5
        records = procs.records()
        others_recent = {
            (r.broker, r.queue_id) for r in records if r.consumer != 0 and r.at >= recent_from
        }
        before = [r for r in records if r.consumer == 0]
        owned = {(r.broker, r.queue_id) for r in before if r.at >= recent_from} - others_recent
        assert owned, "consumer 0 consumed nothing lately"
        t_kill = time.time()
        procs.kill(0)
        # What it consumed up to the kill (it went on consuming after the snapshot above; its
        # file holds whole lines only, and no more come once `kill` has reaped it).
        before = [r for r in procs.records() if r.consumer == 0 and (r.broker, r.queue_id) in owned]
        last_off = {q: max(r.offset for r in before if (r.broker, r.queue_id) == q) for q in owned}

        def moved() -> bool:
            got = {
                (r.broker, r.queue_id)
                for r in procs.records()
                if r.consumer != 0 and r.at >= t_kill
            }
            return owned <= got

        await wait_until(moved, total=30, interval=0.2, what="queues moved to the others")
        after = [r for r in procs.records() if r.consumer != 0 and r.at >= t_kill]
        takeover = 0.0
        redelivered = 0
        for q in owned:
            on_q = [r for r in after if (r.broker, r.queue_id) == q]
            takeover = max(takeover, min(r.at for r in on_q) - t_kill)
            first = min(r.offset for r in on_q)
            # Resumed from the committed offset: no gap after what the killed one consumed ...
            assert first <= last_off[q] + 1, (q, first, last_off[q])
            redelivered += sum(1 for r in on_q if r.offset <= last_off[q])
        # ... and not from the start of the queues.
        assert redelivered < len(before), (redelivered, len(before))
        assert takeover <= REBALANCE_MS / 1000 + 5, f"queues moved only after {takeover:.1f}s"
        await trio.sleep(1)
        return takeover, (
            f"{len(owned)} queues moved in {takeover:.1f}s (rebalance {REBALANCE_MS / 1000:.0f}s);"
            f" {redelivered} redelivered of {len(before)} consumed by the killed one"
        )

    await run_scenario(cluster, tmp_path, rows, "kill_one_consumer", fault, consumers=3)


async def rolling_restart(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    """Restart broker-a, -b, -c one at a time under load: nothing acknowledged is lost and
    send errors happen only inside the restart windows."""

    async def fault(ctx: Ctx) -> tuple[float, str]:
        load = ctx.load
        windows: list[tuple[float, float]] = []
        t0 = time.time()
        for broker in BROKERS:
            start = time.time()
            await ctx.cluster.run("restart", "-t", "20", broker)
            await ctx.cluster.await_healthy([broker])
            windows.append((start, time.time()))
            await trio.sleep(1)
        outside = [
            (t, e)
            for t, e in load.errors
            if t >= t0 and not any(a <= t <= b + SEND_TIMEOUT_S for a, b in windows)
        ]
        assert not outside, f"send errors outside the restart windows: {outside[:5]}"
        gap = load.max_ack_gap(t0, time.time())
        assert gap <= SEND_TIMEOUT_S + 2, f"sends stalled {gap:.2f}s"
        spans = ", ".join(f"{b - a:.1f}s" for a, b in windows)
        return gap, f"restart->healthy {spans}"

    await run_scenario(cluster, tmp_path, rows, "rolling_restart", fault)


# -- the scenarios against the plain cluster (the secured one: test_acl_tls_failover.py) --
async def test_kill_broker_a(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await kill_broker_a(cluster, tmp_path, rows)


async def test_pause_broker_b(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await pause_broker_b(cluster, tmp_path, rows)


async def test_stop_one_namesrv(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await stop_one_namesrv(cluster, tmp_path, rows)


async def test_disconnect_broker_c(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await disconnect_broker_c(cluster, tmp_path, rows)


async def test_kill_one_consumer(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await kill_one_consumer(cluster, tmp_path, rows)


async def test_rolling_restart(cluster: Cluster, tmp_path: Path, rows: list[Row]) -> None:
    await rolling_restart(cluster, tmp_path, rows)


SCENARIOS: dict[str, Scenario] = {
    "kill_broker_a": kill_broker_a,
    "pause_broker_b": pause_broker_b,
    "stop_namesrv1": stop_one_namesrv,
    "disconnect_broker_c": disconnect_broker_c,
    "kill_one_consumer": kill_one_consumer,
    "rolling_restart": rolling_restart,
}

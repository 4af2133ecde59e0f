"""Controller-mode failover scenarios against deploy/docker-compose.controller.yml: broker-a's
two replicas (broker-a-0, broker-a-1) in controller mode with all_ack_in_sync_state_set (a send
is acknowledged once every SyncStateSet member has it), three controllers on a 3-member etcd,
broker-b a plain master. How a scenario runs and what its row shows:
tests/cluster/controller_scenario.py. The five share one compose project, in this order:

- kill_master_a_promotes: SIGKILL broker-a's master under load: the other replica is master
  within 10 s, sends to broker-a (plain and keyed) go on under the same broker name; the
  killed one is left down for the next scenario.
- old_master_rejoins: the killed master, with a tail the group never acknowledged written into
  its store, starts again: it rejoins as a slave, its tail is cut, and after catching up its
  commitlog is byte-identical to the new master's.
- kill_controller_leader: SIGKILL the leading controller: another leads; then SIGKILL the
  master: still promoted.
- etcd_down: SIGKILL all three etcd members: the controllers have no leader, the brokers keep
  serving sends and pulls and the master stays master; etcd back, a master loss is handled.
- partition_master_from_controller: cut the master off the controllers, the NameServer and its
  peer (not off clients): the other replica is promoted, the cut-off one acknowledges nothing;
  healed, it rejoins as a slave with identical bytes.

Bounds are multiples of the configured timings (controller heartbeat timeout 3 s, scan 1 s,
lease ttl 3 s, metadata sync 1 s); the measured values are printed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from tests.cluster.controller_scenario import (
    IN_FLIGHT_S,
    PROMOTE_BOUND_S,
    CtlCtx,
    caught_up,
    run_ctl_scenario,
    same_commitlogs,
    wait_for,
)
from tests.cluster.controller_support import (
    CONTROLLERS,
    ETCDS,
    GROUP,
    HEARTBEAT_TIMEOUT_MS,
    LEASE_TTL_S,
    MESH,
    ControllerCluster,
    group_ready,
    group_view,
    in_sync_addrs,
    leader_of,
    ns_group,
    offsets,
)
from tests.cluster.support import Row
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # each scenario runs tens of seconds against the cluster

HEARTBEAT_TIMEOUT_S = HEARTBEAT_TIMEOUT_MS / 1000
# How long the load runs on the promoted master before a scenario moves on.
AFTER_S = 2.0
# A returning replica is back in the SyncStateSet this soon.
REJOIN_BOUND_S = 45.0
# etcd stays down this long: past the heartbeat timeout twice, so a controller or broker that
# acted on a silent etcd (an election, a role change) would have done so.
ETCD_DOWN_S = 2 * HEARTBEAT_TIMEOUT_S
# Records written into the killed master's store that the group never acknowledged.
TAIL_RECORDS = 5


async def _lose_master(ctx: CtlCtx, kill: bool = True) -> tuple[str, str, float, float, float]:
    """Kill (or, `kill=False`, cut off the mesh network) broker-a's master under load; wait
    until the controllers name the other replica, the NameServer lists it as id 0, and it
    acknowledges. (lost master, new master, time lost, promoted after, first ack after)."""
    cc = ctx.cc

    def acking() -> bool:
        return sum(ctx.group_acks().values()) > 20 and len(ctx.ordered.acked) > 10

    await wait_until(acking, total=20, interval=0.1, what="broker-a acknowledging")
    master = await _current_master(ctx)
    other = cc.other_replica(master)
    t_lost = time.time()
    if kill:
        await trio.to_thread.run_sync(lambda: cc.kill(master))
        cc.left_down = master
    else:
        await trio.to_thread.run_sync(lambda: cc.disconnect(master, MESH))
    promoted = await wait_for(
        lambda: ctx.is_master(other),
        total=PROMOTE_BOUND_S + 20,
        what=f"the controllers naming {other} master",
    )
    await wait_for(
        lambda: ctx.ns_names_master(other), total=20, what=f"the NameServer listing {other} as 0"
    )
    await wait_until(
        lambda: ctx.first_group_ack(t_lost, by=other) is not None,
        total=20,
        interval=0.1,
        what=f"{other} acknowledging",
    )
    first = ctx.first_group_ack(t_lost, by=other)
    assert first is not None
    ctx.check(
        promoted <= PROMOTE_BOUND_S,
        f"{other} named master {promoted:.1f}s after {master} was lost (bound {PROMOTE_BOUND_S}s)",
    )
    return master, other, t_lost, promoted, first - t_lost


async def _current_master(ctx: CtlCtx) -> str:
    view = await group_view(ctx.ctl)
    master = None if view is None else ctx.cc.service_at(view.get("masterAddress"))
    assert master is not None, f"broker-a has no master: {view}"
    return master


def _keyed_after(ctx: CtlCtx, t: float) -> int:
    return sum(1 for t_ack, _ in ctx.ordered.acked.values() if t_ack > t)


async def test_kill_master_a_promotes(
    controller_cluster: ControllerCluster, tmp_path: Path, rows: list[Row]
) -> None:
    """SIGKILL broker-a's master under load: the other replica is master within 10 s; plain and
    keyed sends to broker-a go on under the same broker name; everything acknowledged is
    consumed, each key in order."""

    async def fault(ctx: CtlCtx) -> tuple[float, str]:
        master, other, t_kill, promoted, first_ack = await _lose_master(ctx)
        t_promoted = t_kill + promoted
        await wait_until(
            lambda: _keyed_after(ctx, t_promoted) > 0,
            total=20,
            interval=0.1,
            what="keyed sends acknowledged by the new master",
        )
        await trio.sleep(AFTER_S)
        late = {
            a: n for a, n in ctx.group_acks(t_kill + IN_FLIGHT_S).items() if a != ctx.cc.addr(other)
        }
        ctx.check(not late, f"broker-a acknowledgements after the kill not by {other}: {late}")
        keyed = _keyed_after(ctx, t_promoted)
        plain = ctx.group_acks(t_promoted).get(ctx.cc.addr(other), 0)
        return first_ack, (
            f"{master} killed; {other} master {promoted:.1f}s, first ack {first_ack:.1f}s after; "
            f"then {plain} acks on broker-a, {keyed} keyed"
        )

    await run_ctl_scenario(controller_cluster, tmp_path, rows, "kill_master_a_promotes", fault)


async def test_old_master_rejoins(
    controller_cluster: ControllerCluster, tmp_path: Path, rows: list[Row]
) -> None:
    """The killed master (of the previous scenario, or killed here) starts again with a tail
    the group never acknowledged in its store: it rejoins as a slave of the new master, the
    tail is cut, and once caught up both commitlogs hold the same bytes up to the same end."""

    async def fault(ctx: CtlCtx) -> tuple[float, str]:
        cc = ctx.cc
        if cc.left_down is None:
            await _lose_master(ctx)
        old = cc.left_down
        assert old is not None
        new = cc.other_replica(old)
        ctx.check(await ctx.is_master(new), f"{new} is not master before {old} returns")
        tail_start, tail_end = await trio.to_thread.run_sync(
            lambda: cc.add_unacknowledged_tail(old, TAIL_RECORDS)
        )
        await trio.to_thread.run_sync(lambda: cc.start(old))
        cc.left_down = None

        async def rejoined() -> bool:
            view = await group_view(ctx.ctl)
            if view is None or cc.service_at(view.get("masterAddress")) != new:
                return False
            if cc.addr(old) not in in_sync_addrs(view):
                return False
            group = await ns_group(ctx.rc, cc)
            return group is not None and any(
                bid >= 1 and addr == cc.addr(old) for bid, addr in group.items()
            )

        back = await wait_for(
            rejoined,
            total=REJOIN_BOUND_S,
            interval=0.2,
            what=f"{old} in {new}'s SyncStateSet, listed as a slave",
        )
        ctx.check(await ctx.is_master(new), f"{new} no longer master after {old} returned")
        await ctx.stop_loads()
        caught = await wait_for(
            lambda: caught_up(ctx, old, new), total=30, what=f"{old} caught up with {new}"
        )
        # The new master wrote its own records from where its epoch began, at or before the
        # tail's start: equal bytes over the tail's range mean the tail was cut.
        same, detail = await same_commitlogs(ctx, old, new)
        ctx.check(same, f"commitlogs differ after the rejoin: {detail}")
        new_off = await offsets(ctx.admin, cc, new)
        ctx.check(
            new_off is not None and new_off[1] >= tail_end,
            f"{new} wrote too little to cover the tail [{tail_start}, {tail_end}): {new_off}",
        )
        print(f"{ctx.name}: {detail}")
        return back, (
            f"{old}'s unacknowledged tail [{tail_start}, {tail_end}) ({TAIL_RECORDS} records); "
            f"in the SyncStateSet {back:.1f}s after its start, caught up {caught:.1f}s after the "
            f"load; {detail}"
        )

    await run_ctl_scenario(
        controller_cluster, tmp_path, rows, "old_master_rejoins", fault, keep_down=True
    )


async def test_kill_controller_leader(
    controller_cluster: ControllerCluster, tmp_path: Path, rows: list[Row]
) -> None:
    """SIGKILL the leading controller: another leads within the lease ttl (+ slack); then
    SIGKILL broker-a's master: the new leader promotes the other replica within 10 s."""
    killed: list[str] = []

    async def fault(ctx: CtlCtx) -> tuple[float, str]:
        cc = ctx.cc
        leader = await leader_of(cc, ctx.ctl, CONTROLLERS[0])
        for c in CONTROLLERS[1:]:
            leader = leader or await leader_of(cc, ctx.ctl, c)
        assert leader in CONTROLLERS, f"no controller leader: {leader}"
        others = [c for c in CONTROLLERS if c != leader]
        t_kill = time.time()
        await trio.to_thread.run_sync(lambda: cc.kill(leader))
        killed.append(leader)

        async def new_leader() -> bool:
            for c in others:
                if await leader_of(cc, ctx.ctl, c) in others:
                    return True
            return False

        takeover = await wait_for(
            new_leader, total=LEASE_TTL_S + 15, what="another controller leading"
        )
        ctx.check(
            takeover <= LEASE_TTL_S + 3,
            f"a new leader only {takeover:.1f}s after the leader died (ttl {LEASE_TTL_S}s)",
        )
        successor = await leader_of(cc, ctx.ctl, others[0])
        master, other, _, promoted, first_ack = await _lose_master(ctx)
        await trio.sleep(AFTER_S)
        return first_ack, (
            f"{leader} killed, {successor} leading {takeover:.1f}s after; then {master} killed "
            f"{time.time() - t_kill:.0f}s in: {other} master {promoted:.1f}s, first ack "
            f"{first_ack:.1f}s after"
        )

    async def cleanup(ctx: CtlCtx) -> None:
        if killed:
            await trio.to_thread.run_sync(lambda: ctx.cc.start(*killed))

    await run_ctl_scenario(
        controller_cluster, tmp_path, rows, "kill_controller_leader", fault, cleanup=cleanup
    )


async def test_etcd_down(
    controller_cluster: ControllerCluster, tmp_path: Path, rows: list[Row]
) -> None:
    """SIGKILL every etcd member: the controllers lose their leader, nothing is elected, the
    master stays master and broker-a keeps acknowledging and serving pulls; etcd back, a
    leader returns and a master loss is handled again."""
    stopped: list[bool] = []

    async def fault(ctx: CtlCtx) -> tuple[float, str]:
        cc = ctx.cc
        master = await _current_master(ctx)
        await wait_until(
            lambda: ctx.first_group_ack(time.time() - 1) is not None,
            total=20,
            interval=0.1,
            what="broker-a acknowledging",
        )
        t_down = time.time()
        await trio.to_thread.run_sync(lambda: cc.kill(*ETCDS))
        stopped.append(True)

        async def no_leader() -> bool:
            return all([await leader_of(cc, ctx.ctl, c) is None for c in CONTROLLERS])

        lost_s = await wait_for(
            no_leader, total=LEASE_TTL_S + 10, what="the controllers without a leader"
        )
        await trio.sleep(max(0.0, t_down + ETCD_DOWN_S - time.time()))
        t_up = time.time()
        ctx.check(
            await ctx.ns_names_master(master), f"{master} not listed as master with etcd down"
        )
        during = ctx.group_acks(t_down, t_up)
        ctx.check(
            set(during) == {cc.addr(master)} and during[cc.addr(master)] > 50,
            f"broker-a acknowledgements with etcd down: {during} (want > 50, by {master})",
        )
        pulled = sum(1 for r in ctx.consumers.records() if r.broker == GROUP and t_down <= r.at)
        ctx.check(pulled > 0, "nothing consumed from broker-a with etcd down")
        gap = ctx.load.max_ack_gap(t_down, t_up)
        await trio.to_thread.run_sync(lambda: cc.start(*ETCDS))
        stopped.clear()

        async def leader() -> bool:
            return any([await leader_of(cc, ctx.ctl, c) is not None for c in CONTROLLERS])

        back = await wait_for(leader, total=60, what="a controller leader after etcd's return")

        async def serving() -> bool:
            return await group_view(ctx.ctl) is not None

        # A new leader reads the state from etcd before it answers for it.
        await wait_for(serving, total=20, what="the leader answering for broker-a")
        ctx.check(await ctx.is_master(master), f"{master} not master after etcd's return")
        lost_master, other, _, promoted, first_ack = await _lose_master(ctx)
        await trio.sleep(AFTER_S)
        return first_ack, (
            f"etcd down {t_up - t_down:.1f}s: no leader after {lost_s:.1f}s, {master} acked "
            f"{sum(during.values())} (ack gap {gap:.1f}s), {pulled} consumed from broker-a; "
            f"leader {back:.1f}s after etcd's start; {lost_master} killed: {other} master "
            f"{promoted:.1f}s, first ack {first_ack:.1f}s after"
        )

    async def cleanup(ctx: CtlCtx) -> None:
        if stopped:
            await trio.to_thread.run_sync(lambda: ctx.cc.start(*ETCDS))

    await run_ctl_scenario(controller_cluster, tmp_path, rows, "etcd_down", fault, cleanup=cleanup)


async def test_partition_master_from_controller(
    controller_cluster: ControllerCluster, tmp_path: Path, rows: list[Row]
) -> None:
    """Cut broker-a's master off the controllers, the NameServer and its peer, not off the
    clients (its published port is on its own network): the other replica is promoted, the
    cut-off one acknowledges no send from just after the cut, so no write is acknowledged on
    both sides; healed, it rejoins as a slave and ends with identical bytes."""
    cut: list[str] = []

    async def fault(ctx: CtlCtx) -> tuple[float, str]:
        cc = ctx.cc
        master, other, t_cut, promoted, first_ack = await _lose_master(ctx, kill=False)
        cut.append(master)
        # Clients whose routes still name the cut-off master go on sending to it meanwhile.
        await trio.sleep(AFTER_S)
        t_heal = time.time()
        await trio.to_thread.run_sync(lambda: cc.reconnect(master, MESH))
        cut.clear()
        isolated_acks = ctx.group_acks(t_cut + IN_FLIGHT_S).get(cc.addr(master), 0)
        refused = ctx.group_not_ok(master, t_cut + IN_FLIGHT_S)
        errors = ctx.errors_since(t_cut)
        ctx.check(
            isolated_acks == 0,
            f"{master} acknowledged {isolated_acks} sends while cut off from the controllers",
        )
        back = await wait_for(
            lambda: group_ready(cc, ctx.ctl, ctx.rc),
            total=REJOIN_BOUND_S,
            interval=0.2,
            what=f"{master} back as {other}'s slave, in its SyncStateSet",
        )
        ctx.check(await ctx.is_master(other), f"{other} not master after the heal")
        await ctx.stop_loads()
        await wait_for(lambda: caught_up(ctx, master, other), total=30, what=f"{master} caught up")
        same, detail = await same_commitlogs(ctx, master, other)
        ctx.check(same, f"commitlogs differ after the heal: {detail}")
        return first_ack, (
            f"{master} cut off: {other} master {promoted:.1f}s, first ack {first_ack:.1f}s "
            f"after; {master} acked 0 after the cut (refused {refused}, {errors} failed sends); "
            f"healed {t_heal - t_cut:.1f}s after the cut, slave again {back:.1f}s later; {detail}"
        )

    async def cleanup(ctx: CtlCtx) -> None:
        if cut:
            await trio.to_thread.run_sync(lambda: ctx.cc.reconnect(cut[0], MESH))

    await run_ctl_scenario(
        controller_cluster,
        tmp_path,
        rows,
        "partition_master_from_controller",
        fault,
        cleanup=cleanup,
    )

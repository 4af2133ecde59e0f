"""controller.election against an in-memory etcd on trio's fake clock: who leads when, and
that a leader cut off from etcd gives up before anyone else can win."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
import trio
import trio.testing

from controller.election import LeaderElection, NotLeader
from controller.etcd import (
    Compare,
    CompareTarget,
    DeleteResponse,
    EtcdUnavailable,
    Key,
    KeyValue,
    LeaseExpired,
    Op,
    OpResponse,
    PutResponse,
    RangeResponse,
    TxnResult,
)

KEY = "/trimq/controller/leader"
TTL = 6


class FakeEtcd:
    """Keys, revisions and leases as etcd keeps them; a lease expires `ttl` after the grant or
    the last keepalive that reached it (checked at every call)."""

    def __init__(self) -> None:
        self.revision = 1
        self.kvs: dict[bytes, KeyValue] = {}
        self.leases: dict[int, tuple[int, float]] = {}
        self.next_lease = 100

    def expire(self) -> None:
        now = trio.current_time()
        for lease, (_, expiry) in list(self.leases.items()):
            if expiry <= now:
                self.drop_lease(lease)

    def drop_lease(self, lease: int) -> bool:
        if self.leases.pop(lease, None) is None:
            return False
        gone = [k for k, kv in self.kvs.items() if kv.lease == lease]
        if gone:
            self.revision += 1
            for k in gone:
                del self.kvs[k]
        return True

    def holds(self, c: Compare) -> bool:
        kv = self.kvs.get(c.key)
        if c.target is CompareTarget.VALUE:
            if kv is None:
                return False
            actual: bytes | int = kv.value
        else:
            field = {
                CompareTarget.VERSION: "version",
                CompareTarget.CREATE_REVISION: "create_revision",
                CompareTarget.MOD_REVISION: "mod_revision",
                CompareTarget.LEASE: "lease",
            }[c.target]
            actual = getattr(kv, field) if kv is not None else 0
        a, b = actual, c.operand
        return {
            "==": a == b,
            "!=": a != b,
            "<": a < b,  # type: ignore[operator]
            ">": a > b,  # type: ignore[operator]
        }[c.op]

    def apply(self, ops: Sequence[Op], revision: int) -> tuple[OpResponse, ...]:
        out: list[OpResponse] = []
        for op in ops:
            if op.kind == "put":
                if op.lease and op.lease not in self.leases:
                    raise LeaseExpired("etcdserver: requested lease not found")
                old = self.kvs.get(op.key)
                self.kvs[op.key] = KeyValue(
                    op.key,
                    op.value,
                    old.create_revision if old else revision,
                    revision,
                    old.version + 1 if old else 1,
                    op.lease,
                )
                out.append(PutResponse(revision))
            elif op.kind == "get":
                kv = self.kvs.get(op.key)
                out.append(RangeResponse((kv,) if kv else (), int(kv is not None), False))
            else:
                out.append(DeleteResponse(int(self.kvs.pop(op.key, None) is not None)))
        return tuple(out)


class FakeClient:
    """One process's view of `FakeEtcd`: `down` fails calls at once, `silent` never answers
    (the caller's own bound must end the call)."""

    def __init__(self, etcd: FakeEtcd) -> None:
        self.etcd = etcd
        self.down = False
        self.silent = False
        self.keepalives = 0
        # Next txn: applied, then reported as a timeout (the outcome unknown to the caller).
        self.lose_txn_answer = False

    async def _reach(self) -> None:
        await trio.sleep(0.01)
        if self.silent:
            await trio.sleep_forever()
        if self.down:
            raise EtcdUnavailable("fake etcd down")
        self.etcd.expire()

    async def get(self, key: Key) -> KeyValue | None:
        await self._reach()
        return self.etcd.kvs.get(key.encode() if isinstance(key, str) else key)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()
    ) -> TxnResult:
        await self._reach()
        ok = all(self.etcd.holds(c) for c in compares)
        ops = success if ok else failure
        writes = any(o.kind != "get" for o in ops)
        revision = self.etcd.revision + 1 if writes else self.etcd.revision
        responses = self.etcd.apply(ops, revision)
        self.etcd.revision = revision
        if self.lose_txn_answer:
            self.lose_txn_answer = False
            raise EtcdUnavailable("answer lost", maybe_applied=True)
        return TxnResult(ok, responses, revision)

    async def lease_grant(self, ttl_s: int) -> int:
        await self._reach()
        self.etcd.next_lease += 1
        self.etcd.leases[self.etcd.next_lease] = (ttl_s, trio.current_time() + ttl_s)
        return self.etcd.next_lease

    async def lease_keepalive(self, lease_id: int) -> int:
        await self._reach()
        self.keepalives += 1
        if lease_id not in self.etcd.leases:
            raise LeaseExpired("lease not found")
        ttl = self.etcd.leases[lease_id][0]
        self.etcd.leases[lease_id] = (ttl, trio.current_time() + ttl)
        return ttl

    async def lease_revoke(self, lease_id: int) -> bool:
        await self._reach()
        return self.etcd.drop_lease(lease_id)


def leading(e: LeaderElection) -> bool:
    """`e.is_leader`, read afresh (mypy would narrow a property read twice)."""
    return e.is_leader


def leader_value(etcd: FakeEtcd) -> bytes | None:
    kv = etcd.kvs.get(KEY.encode())
    return kv.value if kv is not None else None


async def test_first_candidate_wins_and_keeps_the_key(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    client = FakeClient(etcd)
    async with LeaderElection(client, KEY, "a", ttl_s=TTL) as a:
        assert not leading(a)
        with pytest.raises(NotLeader):
            a.fence()
        term = await a.campaign()
        assert leading(a)
        assert await a.campaign() is term
        assert a.fence() == Compare.create_revision(KEY, "==", term.revision)
        kv = etcd.kvs[KEY.encode()]
        assert (kv.value, kv.lease, kv.create_revision) == (b"a", term.lease_id, term.revision)
        # Many ttls later: still leader, renewed about every ttl/3.
        await trio.sleep(TTL * 10)
        assert leading(a)
        assert not term.lost.is_set()
        assert 25 <= client.keepalives <= 31
        assert await a.current_leader() == b"a"
    # Leaving resigns: the lease is revoked and the key gone.
    assert term.lost_reason == "resigned"
    assert etcd.kvs == {}
    assert etcd.leases == {}


async def test_second_candidate_waits_then_wins_on_resign(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    ended: list[str] = []
    async with (
        LeaderElection(FakeClient(etcd), KEY, "a", ttl_s=TTL, on_lost=ended.append) as a,
        LeaderElection(FakeClient(etcd), KEY, "b", ttl_s=TTL, poll_interval_s=0.5) as b,
        trio.open_nursery() as nursery,
    ):
        term_a = await a.campaign()
        b_won = trio.Event()

        async def run_b() -> None:
            await b.campaign()
            b_won.set()

        nursery.start_soon(run_b)
        await trio.sleep(TTL * 5)
        assert not b_won.is_set()
        assert not leading(b)
        # The waiting candidate left no lease behind.
        assert list(etcd.leases) == [term_a.lease_id]

        resigned_at = trio.current_time()
        await a.resign()
        assert ended == ["resigned"]
        assert not leading(a)
        await b_won.wait()
        assert trio.current_time() - resigned_at <= 0.5 + 0.1
        assert leader_value(etcd) == b"b"
        assert b.fence() != Compare.create_revision(KEY, "==", term_a.revision)
        # A new campaign of a waits in turn.
        with trio.move_on_after(TTL * 3):
            await a.campaign()
        assert not leading(a)


@pytest.mark.parametrize("failure", ["down", "silent"])
async def test_cut_off_leader_gives_up_before_another_can_win(
    autojump_clock: trio.testing.MockClock, failure: str
) -> None:
    etcd = FakeEtcd()
    ca, cb = FakeClient(etcd), FakeClient(etcd)
    async with (
        LeaderElection(ca, KEY, "a", ttl_s=TTL) as a,
        LeaderElection(cb, KEY, "b", ttl_s=TTL, poll_interval_s=0.25) as b,
        trio.open_nursery() as nursery,
    ):
        term_a = await a.campaign()
        b_won_at: list[float] = []

        async def run_b() -> None:
            await b.campaign()
            b_won_at.append(trio.current_time())

        nursery.start_soon(run_b)
        await trio.sleep(TTL * 2 + 0.7)
        setattr(ca, failure, True)
        cut = trio.current_time()
        await term_a.lost.wait()
        a_lost_at = trio.current_time()
        assert term_a.lost_reason is not None
        assert "ttl" in term_a.lost_reason
        assert not leading(a)
        # Within the ttl of the cut, and not before the last renewal's ttl ran out.
        assert cut < a_lost_at <= cut + TTL
        assert a_lost_at >= cut + TTL - TTL / 3 - 0.1
        while not b_won_at:
            await trio.sleep(0.1)
        # Never two leaders: b wins only once a has given up.
        assert b_won_at[0] >= a_lost_at
        assert b_won_at[0] - a_lost_at < 1.0
        assert leader_value(etcd) == b"b"
        nursery.cancel_scope.cancel()


async def test_is_leader_turns_false_at_the_deadline_even_if_the_keepalive_task_lags(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    client = FakeClient(etcd)
    async with LeaderElection(client, KEY, "a", ttl_s=TTL) as a:
        term = await a.campaign()
        client.silent = True
        assert leading(a)
        await trio.sleep_until(term.valid_until)
        assert not leading(a)
        with pytest.raises(NotLeader):
            a.fence()


async def test_lease_expired_ends_the_term(autojump_clock: trio.testing.MockClock) -> None:
    etcd = FakeEtcd()
    async with LeaderElection(FakeClient(etcd), KEY, "a", ttl_s=TTL) as a:
        term = await a.campaign()
        etcd.drop_lease(term.lease_id)  # e.g. revoked by an operator
        with trio.fail_after(TTL / 3 + 1):
            await term.lost.wait()
        assert term.lost_reason == "lease expired"


async def test_key_replaced_ends_the_term(autojump_clock: trio.testing.MockClock) -> None:
    etcd = FakeEtcd()
    async with LeaderElection(FakeClient(etcd), KEY, "a", ttl_s=TTL) as a:
        term = await a.campaign()
        kv = etcd.kvs[KEY.encode()]
        etcd.kvs[KEY.encode()] = replace(kv, lease=0, create_revision=kv.create_revision + 5)
        with trio.fail_after(TTL / 3 + 1):
            await term.lost.wait()
        assert term.lost_reason == "leader key deleted or replaced"
        # Its lease is revoked on the way out (just after the loss is reported).
        await trio.sleep(1)
        assert term.lease_id not in etcd.leases


async def test_txn_answer_lost_but_applied_still_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    client = FakeClient(etcd)
    client.lose_txn_answer = True
    async with LeaderElection(client, KEY, "a", ttl_s=TTL) as a:
        with trio.fail_after(1):
            term = await a.campaign()
        assert etcd.kvs[KEY.encode()].lease == term.lease_id
        assert etcd.kvs[KEY.encode()].create_revision == term.revision


async def test_campaign_keeps_trying_while_etcd_is_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    client = FakeClient(etcd)
    client.down = True
    async with LeaderElection(client, KEY, "a", ttl_s=TTL) as a, trio.open_nursery() as nursery:
        nursery.start_soon(a.campaign)
        await trio.sleep(30)
        assert not leading(a)
        client.down = False
        await trio.sleep(1.5)
        assert leading(a)
        assert list(etcd.leases) == [a.term.lease_id if a.term else -1]


def test_arguments_are_checked() -> None:
    client = FakeClient(FakeEtcd())
    with pytest.raises(ValueError):
        LeaderElection(client, KEY, "a", ttl_s=0)
    with pytest.raises(ValueError):
        LeaderElection(client, "", "a")
    with pytest.raises(ValueError):
        LeaderElection(client, KEY, "a", poll_interval_s=0)

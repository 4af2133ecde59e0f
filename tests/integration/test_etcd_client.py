"""controller.etcd and controller.election against a real etcd (3.4, JSON gateway)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from controller.election import LeaderElection, NotLeader
from controller.etcd import (
    DEFAULT_MAX_REQUEST_BYTES,
    Compare,
    DeleteResponse,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaseExpired,
    Op,
    PutResponse,
    RangeResponse,
)
from tests.helpers import free_port, wait_until
from tests.integration.etcd_support import EtcdProc, etcd_procs, open_tcp_proxy

# Generous bound on a call that must fail by its timeout: the timeout plus scheduling slack
# on a loaded 2-core host. Only "not a hang" is asserted, never a precise duration.
SLACK_S = 3.0


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProc]:
    """One etcd for the tests that do not stop it; each test uses its own key prefix."""
    with etcd_procs(tmp_path_factory.mktemp("etcd")) as start:
        yield start()


@pytest.fixture
def start_etcd(tmp_path: Path) -> Iterator[Callable[..., EtcdProc]]:
    """etcd processes of this test alone (the test may stop, pause or kill them)."""
    with etcd_procs(tmp_path) as start:
        yield start


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return f"/test/{request.node.name}/"


def leading(e: LeaderElection) -> bool:
    """`e.is_leader`, read afresh (mypy would narrow a property read twice)."""
    return e.is_leader


# -- KV -------------------------------------------------------------------------------------


async def test_put_get_prefix_delete(shared_etcd: EtcdProc, prefix: str) -> None:
    async with EtcdClient([shared_etcd.url], timeout_s=5) as c:
        assert await c.get(prefix + "a") is None
        r1 = await c.put(prefix + "a", b"1")
        r2 = await c.put(prefix + "b", "two")
        r3 = await c.put(prefix + "a", b"1bis")
        await c.put(prefix.rstrip("/") + "X", b"outside the prefix")
        # The first key after the prefix's range (its range end) is outside too.
        await c.put(prefix[:-1] + "0", b"outside the prefix")
        assert r1 < r2 < r3

        kv = await c.get(prefix + "a")
        assert kv == KeyValue(
            key=(prefix + "a").encode(),
            value=b"1bis",
            create_revision=r1,
            mod_revision=r3,
            version=2,
            lease=0,
        )
        assert [(k.key, k.value) for k in await c.get_prefix(prefix)] == [
            ((prefix + "a").encode(), b"1bis"),
            ((prefix + "b").encode(), b"two"),
        ]
        assert len(await c.get_prefix(prefix, limit=1)) == 1

        assert await c.delete(prefix + "a") == 1
        assert await c.delete(prefix + "a") == 0
        assert await c.get(prefix + "a") is None
        await c.put(prefix + "c", b"")
        empty = await c.get(prefix + "c")
        assert empty is not None
        assert empty.value == b""
        assert await c.delete(prefix, prefix=True) == 2
        assert await c.get_prefix(prefix) == []
        assert await c.get(prefix.rstrip("/") + "X") is not None
        assert await c.get(prefix[:-1] + "0") is not None


async def test_binary_keys_and_values(shared_etcd: EtcdProc, prefix: str) -> None:
    base = prefix.encode() + b"\xff\xff"
    async with EtcdClient([shared_etcd.url]) as c:
        await c.put(base + b"\x00", bytes(range(256)))
        await c.put(base + b"\xff", b"\xff")
        kvs = await c.get_prefix(base)
        assert [kv.key for kv in kvs] == [base + b"\x00", base + b"\xff"]
        assert kvs[0].value == bytes(range(256))
        # A 1 MiB value is well within etcd's request limit.
        big = bytes(range(256)) * 4096
        await c.put(base + b"big", big)
        got = await c.get(base + b"big")
        assert got is not None
        assert got.value == big


# -- transactions ---------------------------------------------------------------------------


async def test_txn_each_compare_target_both_branches(shared_etcd: EtcdProc, prefix: str) -> None:
    k = prefix + "k"
    async with EtcdClient([shared_etcd.url]) as c:
        # create_revision == 0: the key does not exist yet.
        absent = Compare.create_revision(k, "==", 0)
        res = await c.txn([absent], [Op.put(k, b"v1")], [Op.get(k)])
        assert res.succeeded
        assert res.responses == (PutResponse(res.revision),)
        created = res.revision
        res = await c.txn([absent], [Op.put(k, b"never")], [Op.get(k)])
        assert not res.succeeded
        assert isinstance(res.responses[0], RangeResponse)
        assert [kv.value for kv in res.responses[0].kvs] == [b"v1"]
        assert res.revision == created  # a failed txn without writes leaves the revision

        cases: list[tuple[Compare, bool]] = [
            (Compare.value(k, "==", b"v1"), True),
            (Compare.value(k, "==", b"v2"), False),
            (Compare.value(k, "!=", b"v2"), True),
            (Compare.value(k, ">", b"v0"), True),
            (Compare.value(k, "<", b"v0"), False),
            (Compare.version(k, "==", 1), True),
            (Compare.version(k, ">", 1), False),
            (Compare.version(k, "<", 2), True),
            (Compare.version(k, "!=", 1), False),
            (Compare.create_revision(k, "==", created), True),
            (Compare.create_revision(k, "!=", created), False),
            (Compare.create_revision(k, "<", created), False),
            (Compare.create_revision(k, ">", created - 1), True),
            (Compare.mod_revision(k, "==", created), True),
            (Compare.mod_revision(k, "<", created), False),
            (Compare.mod_revision(k, ">", created), False),
            (Compare.mod_revision(k, "!=", created + 1), True),
            (Compare.lease(k, "==", 0), True),
            (Compare.lease(k, "!=", 0), False),
        ]
        marker = prefix + "marker"
        for compare, expected in cases:
            res = await c.txn([compare], [Op.get(k)], [Op.get(marker)])
            assert res.succeeded is expected, compare
            assert isinstance(res.responses[0], RangeResponse)
            assert len(res.responses[0].kvs) == (1 if expected else 0), compare

        # All compares must hold; one false one takes the failure branch.
        both = [Compare.value(k, "==", b"v1"), Compare.version(k, "==", 1)]
        assert (await c.txn(both)).succeeded
        assert not (await c.txn([*both, Compare.version(k, "==", 7)])).succeeded
        # A value compare on a missing key is false, whatever the op.
        assert not (await c.txn([Compare.value(prefix + "missing", "!=", b"x")])).succeeded


async def test_txn_ops_and_their_responses(shared_etcd: EtcdProc, prefix: str) -> None:
    async with EtcdClient([shared_etcd.url]) as c:
        await c.put(prefix + "old/1", b"x")
        await c.put(prefix + "old/2", b"y")
        res = await c.txn(
            [],
            [
                Op.put(prefix + "new", b"n"),
                Op.delete(prefix + "old/", prefix=True),
                Op.get(prefix, prefix=True),
                Op.delete(prefix + "nothing"),
            ],
        )
        assert res.succeeded
        put, deleted, got, nothing = res.responses
        assert put == PutResponse(res.revision)
        assert deleted == DeleteResponse(2)
        assert nothing == DeleteResponse(0)
        assert isinstance(got, RangeResponse)
        assert [kv.key for kv in got.kvs] == [(prefix + "new").encode()]
        assert got.count == 1
        assert not got.more


async def test_txn_refused_by_etcd_is_a_clear_error(shared_etcd: EtcdProc, prefix: str) -> None:
    async with EtcdClient([shared_etcd.url]) as c:
        with pytest.raises(EtcdError, match="duplicate key") as info:
            await c.txn([], [Op.put(prefix + "d", b"1"), Op.put(prefix + "d", b"2")])
        assert info.value.code == 3
        assert not isinstance(info.value, EtcdUnavailable)
        assert await c.get(prefix + "d") is None


# -- leases ---------------------------------------------------------------------------------


async def test_lease_grant_keepalive_revoke(shared_etcd: EtcdProc, prefix: str) -> None:
    async with EtcdClient([shared_etcd.url]) as c:
        lease = await c.lease_grant(30)
        assert lease > 0
        rev = await c.put(prefix + "owned", b"v", lease=lease)
        kv = await c.get(prefix + "owned")
        assert kv is not None
        assert kv.lease == lease
        assert kv.mod_revision == rev
        assert 0 < await c.lease_time_to_live(lease) <= 30
        assert await c.lease_keepalive(lease) == 30
        res = await c.txn([Compare.lease(prefix + "owned", "==", lease)])
        assert res.succeeded

        assert await c.lease_revoke(lease) is True
        assert await c.get(prefix + "owned") is None
        assert await c.lease_revoke(lease) is False
        with pytest.raises(LeaseExpired):
            await c.lease_keepalive(lease)
        with pytest.raises(LeaseExpired):
            await c.lease_time_to_live(lease)
        with pytest.raises(LeaseExpired):
            await c.put(prefix + "owned", b"v", lease=lease)
        assert await c.get(prefix + "owned") is None


@pytest.mark.slow
async def test_leased_key_lives_with_keepalives_and_goes_after_the_ttl(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    key = prefix + "ephemeral"
    async with EtcdClient([shared_etcd.url]) as c:
        lease = await c.lease_grant(2)
        await c.put(key, b"v", lease=lease)
        # Kept alive for longer than the ttl: still there.
        end = trio.current_time() + 2.5
        while trio.current_time() < end:
            assert await c.lease_keepalive(lease) >= 1
            assert await c.get(key) is not None
            await trio.sleep(0.4)
        # No more keepalives: gone after the ttl (etcd checks expiry every 500 ms).
        stopped = trio.current_time()
        await wait_until(lambda: _absent(c, key), total=10, interval=0.1, what="key expiry")
        assert trio.current_time() - stopped >= 1.0  # not before the ttl (with clock slack)
        with pytest.raises(LeaseExpired):
            await c.lease_keepalive(lease)


async def _absent(c: EtcdClient, key: str) -> bool:
    return await c.get(key) is None


# -- hostile inputs -------------------------------------------------------------------------


async def test_empty_key_is_refused(shared_etcd: EtcdProc) -> None:
    async with EtcdClient([shared_etcd.url]) as c:
        for call in (
            lambda: c.get(""),
            lambda: c.get_prefix(b""),
            lambda: c.put("", b"v"),
            lambda: c.delete(""),
        ):
            with pytest.raises(EtcdError, match="empty"):
                await call()
        with pytest.raises(EtcdError, match="empty"):
            Op.put("", b"v")
        with pytest.raises(EtcdError, match="empty"):
            Compare.version("", "==", 0)


async def test_values_over_the_request_limit_are_clear_errors(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    key = prefix + "huge"
    async with EtcdClient([shared_etcd.url], timeout_s=10) as c:
        # Refused before sending.
        with pytest.raises(EtcdError, match="too large"):
            await c.put(key, b"x" * (2 * 1024 * 1024))
        with pytest.raises(EtcdError, match="too large"):
            await c.txn([], [Op.put(key, b"x" * (DEFAULT_MAX_REQUEST_BYTES + 1))])
        # Below the client's estimate but over etcd's limit once framed: etcd's own error.
        with pytest.raises(EtcdError, match="too large") as info:
            await c.put(key, b"x" * (DEFAULT_MAX_REQUEST_BYTES - 16))
        assert not isinstance(info.value, EtcdUnavailable)
        assert await c.get(key) is None
    async with EtcdClient([shared_etcd.url], timeout_s=10, max_request_bytes=None) as c:
        # Without the client check: etcd's gRPC limit (2 MiB) answers, no hang.
        with pytest.raises(EtcdError) as info:
            await c.put(key, b"x" * (3 * 1024 * 1024))
        assert not isinstance(info.value, EtcdUnavailable)
        assert await c.get(key) is None


# -- endpoints and unavailability -----------------------------------------------------------


async def test_dead_first_endpoint_fails_over(shared_etcd: EtcdProc, prefix: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with EtcdClient([dead, shared_etcd.url], timeout_s=5) as c:
        assert c.endpoint == dead
        # A refused connection never sent the request: writes move on too.
        await c.put(prefix + "k", b"v")
        assert c.endpoint == shared_etcd.url
        kv = await c.get(prefix + "k")
        assert kv is not None
        assert kv.value == b"v"


async def test_silent_first_endpoint_fails_over_for_reads(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    async with (
        open_tcp_proxy(shared_etcd.port) as proxy,
        EtcdClient([proxy.url, shared_etcd.url], timeout_s=2) as c,
    ):
        await c.put(prefix + "k", b"v")
        assert c.endpoint == proxy.url
        proxy.partition()
        start = trio.current_time()
        kv = await c.get(prefix + "k")
        assert kv is not None
        assert trio.current_time() - start < 2 + SLACK_S
        assert c.endpoint == shared_etcd.url


async def test_write_to_a_silent_endpoint_is_unavailable_maybe_applied(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    async with (
        open_tcp_proxy(shared_etcd.port) as proxy,
        EtcdClient([proxy.url, shared_etcd.url], timeout_s=1) as c,
    ):
        await c.get(prefix + "warm")
        proxy.partition()
        start = trio.current_time()
        with pytest.raises(EtcdUnavailable) as info:
            await c.put(prefix + "k", b"v")
        assert info.value.maybe_applied
        assert trio.current_time() - start < 1 + SLACK_S


async def test_write_whose_connection_drops_is_not_sent_again(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    async with (
        open_tcp_proxy(shared_etcd.port) as proxy,
        EtcdClient([proxy.url, shared_etcd.url], timeout_s=5) as c,
    ):
        proxy.drop_requests = True
        for write in (
            lambda: c.put(prefix + "k", b"v"),
            lambda: c.delete(prefix + "k"),
            lambda: c.txn([], [Op.put(prefix + "k", b"v")]),
        ):
            with pytest.raises(EtcdUnavailable) as info:
                await write()
            assert info.value.maybe_applied
            assert c.endpoint == proxy.url
        # Reads are safe to send again: the next endpoint answers.
        assert await c.get(prefix + "k") is None
        assert (await c.txn([], [Op.get(prefix + "k")])).succeeded
        assert c.endpoint == shared_etcd.url
        # Now preferred, the live endpoint takes writes.
        await c.put(prefix + "k", b"v")


@pytest.mark.slow
async def test_etcd_down_is_unavailable_within_the_timeout(
    start_etcd: Callable[..., EtcdProc], prefix: str
) -> None:
    etcd = start_etcd()
    async with EtcdClient([etcd.url], timeout_s=1) as c:
        await c.put(prefix + "k", b"v")
        await etcd.astop()
        for call in (lambda: c.get(prefix + "k"), lambda: c.put(prefix + "k", b"w")):
            start = trio.current_time()
            with pytest.raises(EtcdUnavailable) as info:
                await call()
            assert not info.value.maybe_applied  # refused: never sent
            assert trio.current_time() - start < 1 + SLACK_S

        # A frozen etcd accepts connections and never answers.
        await etcd.astart()
        await c.get(prefix + "k")
        etcd.pause()
        try:
            start = trio.current_time()
            with pytest.raises(EtcdUnavailable, match="within"):
                await c.get(prefix + "k")
            with pytest.raises(EtcdUnavailable) as info:
                await c.put(prefix + "k", b"w")
            assert info.value.maybe_applied
            assert trio.current_time() - start < 2 + SLACK_S
        finally:
            etcd.resume()
        # Back: the same client works again.
        await wait_until(lambda: _answers(c, prefix + "k"), total=10, what="etcd back")


async def _answers(c: EtcdClient, key: str) -> bool:
    try:
        await c.get(key)
    except EtcdUnavailable:
        return False
    return True


# -- election -------------------------------------------------------------------------------


async def test_two_candidates_one_leader_then_resign_hands_over(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    key = prefix + "leader"
    async with (
        EtcdClient([shared_etcd.url]) as ca,
        EtcdClient([shared_etcd.url]) as cb,
        LeaderElection(ca, key, "a", ttl_s=5, poll_interval_s=0.1) as a,
        LeaderElection(cb, key, "b", ttl_s=5, poll_interval_s=0.1) as b,
        trio.open_nursery() as nursery,
    ):
        won: list[str] = []

        async def run(e: LeaderElection, name: str) -> None:
            await e.campaign()
            won.append(name)

        nursery.start_soon(run, a, "a")
        nursery.start_soon(run, b, "b")
        await wait_until(lambda: len(won) >= 1, total=10, what="a leader")
        await trio.sleep(0.5)  # several polls of the waiting candidate
        assert len(won) == 1
        first, other = (a, b) if won == ["a"] else (b, a)
        assert leading(first)
        assert not leading(other)
        assert await other.current_leader() == won[0].encode()
        with pytest.raises(NotLeader):
            other.fence()

        # The leader's fenced write succeeds.
        fence = first.fence()
        state = prefix + "state"
        assert (await ca.txn([fence], [Op.put(state, b"1")])).succeeded

        await first.resign()
        assert not leading(first)
        assert first.term is not None
        assert first.term.lost_reason == "resigned"
        await wait_until(lambda: len(won) == 2, total=10, what="the other candidate")
        assert leading(other)
        assert await first.current_leader() == won[1].encode()
        # The old term's writes are fenced off.
        assert not (await ca.txn([fence], [Op.put(state, b"stale")])).succeeded
        assert (await cb.txn([other.fence()], [Op.put(state, b"2")])).succeeded
        kv = await cb.get(state)
        assert kv is not None
        assert kv.value == b"2"


@pytest.mark.slow
async def test_leader_cut_off_from_etcd_loses_and_the_other_takes_over(
    shared_etcd: EtcdProc, prefix: str
) -> None:
    key = prefix + "leader"
    ttl = 2
    lost_reasons: list[str] = []
    async with (
        open_tcp_proxy(shared_etcd.port) as proxy,
        EtcdClient([proxy.url], timeout_s=1) as ca,
        EtcdClient([shared_etcd.url], timeout_s=1) as cb,
        LeaderElection(ca, key, "a", ttl_s=ttl, on_lost=lost_reasons.append) as a,
        LeaderElection(cb, key, "b", ttl_s=ttl, poll_interval_s=0.1) as b,
        trio.open_nursery() as nursery,
    ):
        term_a = await a.campaign()
        b_won = trio.Event()

        async def run_b() -> None:
            await b.campaign()
            b_won.set()

        nursery.start_soon(run_b)
        # Keepalives hold the key for several ttls.
        await trio.sleep(ttl * 1.5)
        assert leading(a)
        assert not b_won.is_set()

        proxy.partition()
        cut = trio.current_time()
        with trio.fail_after(ttl + SLACK_S):
            await term_a.lost.wait()
        a_lost_at = trio.current_time()
        assert not leading(a)
        assert lost_reasons == [term_a.lost_reason]
        assert term_a.lost_reason is not None
        assert "ttl" in term_a.lost_reason
        # The lease counted from before the cut: A gave up within the ttl of it (slack for
        # a busy host), and B could not win before A gave up.
        assert a_lost_at - cut < ttl + 1.0
        with trio.fail_after(ttl + 2 + SLACK_S):
            await b_won.wait()
        assert leading(b)
        assert b.term is not None
        assert b.term.revision > term_a.revision
        assert await cb.get(key) is not None
        stale = Compare.create_revision(key, "==", term_a.revision)
        assert not (await cb.txn([stale], [Op.put(prefix + "state", b"stale")])).succeeded
        proxy.heal()
        nursery.cancel_scope.cancel()

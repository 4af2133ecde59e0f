"""Leader election on etcd: one key held with a lease.

A candidate becomes leader by creating the key in a transaction ("create_revision == 0", the
key does not exist) with a fresh lease of `ttl_s` attached; the key's create revision names the
term and fences it: a state write of the leader is a transaction that also compares
`create_revision(key) == term.revision` (`LeaderElection.fence()`), so once the key is gone
(lease expired, revoked, deleted) no write of that term can succeed, even one sent earlier.

The leader renews its lease every ttl/3. It must assume it lost leadership, without hearing
from etcd, when `ttl` has passed since it sent the last renewal etcd confirmed: etcd may have
expired the lease then (it counts from when it received that renewal, which is later). A
leader also loses when etcd says the lease is gone, or the key no longer carries its term.
The other candidates poll the key (every `poll_interval_s`) and try again when it is gone.

Time is `trio.current_time()`, so tests can drive it with a fake clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

import structlog
import trio

from controller.etcd import (
    Compare,
    EtcdError,
    EtcdUnavailable,
    Key,
    KeyValue,
    LeaseExpired,
    Op,
    TxnResult,
    Value,
)

__all__ = ["ElectionStore", "LeaderElection", "NotLeader", "Term"]

log = structlog.get_logger()

# Pause after a failed etcd call before the next, while campaigning.
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0


class ElectionStore(Protocol):
    """The etcd calls an election makes (`controller.etcd.EtcdClient` has them)."""

    async def get(self, key: Key) -> KeyValue | None: ...

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult: ...

    async def lease_grant(self, ttl_s: int) -> int: ...

    async def lease_keepalive(self, lease_id: int) -> int: ...

    async def lease_revoke(self, lease_id: int) -> bool: ...


class NotLeader(Exception):
    """The candidate holds no live term."""


@dataclass(eq=False)
class Term:
    """One leadership: from winning the key to losing or resigning it.

    `revision`: the create revision of the leader key, the fencing token. `valid_until`:
    `trio.current_time()` until which the lease surely lives. `lost` is set exactly once,
    when the term ends for any reason (`lost_reason`)."""

    lease_id: int
    revision: int
    valid_until: float
    lost: trio.Event = field(default_factory=trio.Event)
    lost_reason: str | None = None


class LeaderElection:
    """Campaign for `key` with `value` (this candidate's id or address).

    Use as `async with LeaderElection(client, key, value, ttl_s=6) as election:`; leaving the
    block resigns. `campaign()` returns once leader; then `is_leader`, `term.lost`, `fence()`.

    Args:
        client: the etcd client (anything with `ElectionStore`'s calls).
        key: the leader key.
        value: what `current_leader()` answers while this candidate leads.
        ttl_s: lease ttl, whole seconds >= 1: how long a dead leader blocks the others and
            how long a leader cut off from etcd keeps acting as leader.
        poll_interval_s: how often a waiting candidate reads the key (default ttl/4, <= 1 s).
        on_lost: called with the reason when a term ends (loss or resignation), from the
            task that noticed; it must not block.
    """

    def __init__(
        self,
        client: ElectionStore,
        key: Key,
        value: Value,
        *,
        ttl_s: int = 10,
        poll_interval_s: float | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 1:
            raise ValueError(f"ttl_s must be a whole number of seconds >= 1: {ttl_s!r}")
        self.key = key.encode() if isinstance(key, str) else bytes(key)
        self.value = value.encode() if isinstance(value, str) else bytes(value)
        if not self.key:
            raise ValueError("empty election key")
        self.ttl_s = ttl_s
        self.poll_interval_s = (
            poll_interval_s if poll_interval_s is not None else min(1.0, ttl_s / 4)
        )
        if not (self.poll_interval_s > 0 and math.isfinite(self.poll_interval_s)):
            raise ValueError(f"poll_interval_s must be positive: {poll_interval_s!r}")
        self.keepalive_interval_s = ttl_s / 3
        self.on_lost = on_lost
        self._client = client
        self._term: Term | None = None
        self._keepalive_scope: trio.CancelScope | None = None
        self._campaigning = False
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def __aenter__(self) -> LeaderElection:
        if self._stack is not None:
            raise RuntimeError("LeaderElection entered twice")
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        try:
            with trio.CancelScope(shield=True):
                await self.resign()
        finally:
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            self._nursery = None
            if stack is not None:
                await stack.__aexit__(exc_type, exc, tb)
        return None

    # -- state ------------------------------------------------------------------------------
    @property
    def term(self) -> Term | None:
        """The current term, or the last one (its `lost` set), or None before any."""
        return self._term

    @property
    def is_leader(self) -> bool:
        """A term is live and its lease surely alive at this instant."""
        t = self._term
        return t is not None and not t.lost.is_set() and trio.current_time() < t.valid_until

    def fence(self) -> Compare:
        """The compare every state write of this term must include: it fails once the term's
        key is gone, whatever this process believes.

        Raises:
            NotLeader: no live term.
        """
        t = self._term
        if t is None or not self.is_leader:
            raise NotLeader(f"not the leader of {self.key!r}")
        return Compare.create_revision(self.key, "==", t.revision)

    async def current_leader(self) -> bytes | None:
        """The value of the leader key: the current leader's, or None when there is none."""
        kv = await self._client.get(self.key)
        return kv.value if kv is not None else None

    # -- campaign ---------------------------------------------------------------------------
    async def campaign(self) -> Term:
        """Wait until this candidate holds the key, and keep it alive. Returns the new term
        (or the live one). Keeps trying while etcd is unreachable; bound it with a cancel
        scope if needed."""
        nursery = self._nursery
        if nursery is None:
            raise RuntimeError("LeaderElection used outside `async with`")
        if self._term is not None and not self._term.lost.is_set():
            return self._term
        if self._campaigning:
            raise RuntimeError("campaign() already running")
        self._campaigning = True
        try:
            pause = RETRY_MIN_S
            while True:
                try:
                    term = await self._try_acquire()
                except EtcdError as exc:
                    log.warning("election_etcd_error", key=self.key, error=str(exc))
                    await trio.sleep(pause)
                    pause = min(RETRY_MAX_S, pause * 2)
                    continue
                pause = RETRY_MIN_S
                if term is not None:
                    break
                await self._wait_vacant()
        finally:
            self._campaigning = False
        self._term = term
        scope = trio.CancelScope()
        self._keepalive_scope = scope
        nursery.start_soon(self._keep_alive, term, scope)
        log.info("election_won", key=self.key, revision=term.revision, lease=term.lease_id)
        return term

    async def _wait_vacant(self) -> None:
        """Poll until the key is absent (errors count as "maybe": try again)."""
        while True:
            await trio.sleep(self.poll_interval_s)
            try:
                if await self._client.get(self.key) is None:
                    return
            except EtcdError as exc:
                log.warning("election_etcd_error", key=self.key, error=str(exc))

    async def _try_acquire(self) -> Term | None:
        """One attempt: a fresh lease and the create-if-absent transaction. None: another
        candidate holds the key."""
        sent = trio.current_time()
        lease = await self._client.lease_grant(self.ttl_s)
        # The lease lives at least ttl from when we asked for it.
        valid_until = sent + self.ttl_s
        try:
            res = await self._client.txn(
                [Compare.create_revision(self.key, "==", 0)],
                [Op.put(self.key, self.value, lease=lease)],
                [Op.get(self.key)],
            )
        except EtcdUnavailable as exc:
            if not exc.maybe_applied:
                await self._revoke_quietly(lease)
                raise
            # The transaction may have won: the key carries our lease if it did.
            try:
                kv = await self._client.get(self.key)
            except BaseException:
                await self._revoke_quietly(lease)
                raise
            if kv is not None and kv.lease == lease:
                return Term(lease, kv.create_revision, valid_until)
            await self._revoke_quietly(lease)
            raise
        except BaseException:
            await self._revoke_quietly(lease)
            raise
        if res.succeeded:
            return Term(lease, res.revision, valid_until)
        await self._revoke_quietly(lease)
        return None

    # -- keeping the term -------------------------------------------------------------------
    async def _keep_alive(self, term: Term, scope: trio.CancelScope) -> None:
        """Renew the lease every ttl/3 and check the key still names the term, until the term
        ends. Ends it when `valid_until` passes without a confirmed renewal."""
        with scope:
            next_at = trio.current_time() + self.keepalive_interval_s
            while not term.lost.is_set():
                await trio.sleep_until(min(next_at, term.valid_until))
                if trio.current_time() >= term.valid_until:
                    self._end(term, "lease not renewed within its ttl (etcd unreachable?)")
                    return
                renewed = False
                sent = trio.current_time()
                with trio.move_on_at(term.valid_until) as bound:
                    try:
                        ttl = await self._client.lease_keepalive(term.lease_id)
                        term.valid_until = max(term.valid_until, sent + min(self.ttl_s, ttl))
                        bound.deadline = term.valid_until
                        renewed = True
                        kv = await self._client.get(self.key)
                    except LeaseExpired:
                        self._end(term, "lease expired")
                        return
                    except EtcdError as exc:
                        log.warning("election_keepalive_failed", key=self.key, error=str(exc))
                    else:
                        if kv is None or kv.create_revision != term.revision:
                            self._end(term, "leader key deleted or replaced")
                            await self._revoke_quietly(term.lease_id)
                            return
                now = trio.current_time()
                if renewed:
                    next_at = sent + self.keepalive_interval_s
                else:
                    # Retry soon: the time left is what is left of the ttl.
                    next_at = now + min(
                        self.keepalive_interval_s, max(RETRY_MIN_S, self.ttl_s / 10)
                    )

    def _end(self, term: Term, reason: str) -> None:
        if term.lost.is_set():
            return
        term.lost_reason = reason
        term.lost.set()
        log.warning("election_term_ended", key=self.key, revision=term.revision, reason=reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    async def resign(self) -> None:
        """End the current term (if any) and revoke its lease, which deletes the key. If etcd
        cannot be reached, the key goes when the lease expires."""
        term = self._term
        if term is None or term.lost.is_set():
            return
        self._end(term, "resigned")
        if self._keepalive_scope is not None:
            self._keepalive_scope.cancel()
            self._keepalive_scope = None
        await self._revoke_quietly(term.lease_id)

    async def _revoke_quietly(self, lease_id: int) -> None:
        """Best effort, bounded, even while being cancelled: an unrevoked lease expires."""
        with trio.CancelScope(shield=True), trio.move_on_after(max(1.0, self.ttl_s / 2)):
            try:
                await self._client.lease_revoke(lease_id)
            except EtcdError as exc:
                log.warning("election_revoke_failed", lease=lease_id, error=str(exc))

"""A master that starts takes back what its slaves hold beyond it, before it registers.

A master whose disk was lost (or whose unflushed tail was) comes back with a shorter
commitlog than its slave. Taking sends then would write new records at offsets the slave
already holds with other bytes: the two logs diverge and what the slave has past the
master's end can no longer be replicated or read through the master. So before a master
registers with the NameServers (clients keep reading from the slave meanwhile) it asks
them which slaves of its broker name are alive, asks each for its commitlog range, and
copies the bytes it lacks from the one that holds the most (READ_COMMITLOG, appended with
`MessageStore.append_replica`: the records are checked and dispatched as on a slave). It
then takes what the slaves kept outside the commitlog: topics and subscription groups it
lacks, and every consumer and delay-level offset that is larger on a slave (consumers
commit to the slave while the master is away).

The first attempt runs before the master listens (nobody can write meanwhile). When it
fails, the master listens with `fence` up, and sends, pulls and offset queries are refused
with the reason while the attempt is retried every `retry_s`; it registers once one
succeeds. An attempt fails when a slave stops answering mid-copy, when a slave's log begins
past this master's end (the bytes between are in neither), and when a slave the NameServers
list does not answer: it may hold more; the wait ends when it answers or the NameServers
drop it (at once when its connection closes, else after their broker expiry). Without any
NameServer answer there is nothing to check and the master starts as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
import trio

from broker.processors.admin import READ_COMMITLOG_MAX_BYTES
from broker.slave_sync import fetch_metadata
from remoting import RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.bodies import KVTable
from remoting.protocol.headers import ReadCommitlogRequestHeader, ReadCommitlogResponseHeader
from remoting.protocol.route import MASTER_ID, ClusterInfo

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["MasterCatchUp"]

log = structlog.get_logger()

CHECKING = "this master is checking whether a slave holds more of its commitlog"


class CatchUpError(Exception):
    """A step failed; the message says why (it becomes the fence)."""


@dataclass(slots=True, frozen=True)
class _SlaveRange:
    addr: str
    min_offset: int
    max_offset: int


class MasterCatchUp:
    """See the module docstring.

    Args:
        ctrl: The master's controller (its client, store and managers).
        retry_s: Wait between attempts that failed.
        timeout_ms: Bound of each request.
        chunk: Bytes asked for per READ_COMMITLOG.
    """

    def __init__(
        self,
        ctrl: BrokerController,
        *,
        retry_s: float = 2.0,
        timeout_ms: int = 3000,
        chunk: int = READ_COMMITLOG_MAX_BYTES,
    ) -> None:
        self.ctrl = ctrl
        self.retry_s = retry_s
        self.timeout_ms = timeout_ms
        self.chunk = chunk
        self._fence: str | None = None
        self.copied_bytes = 0

    @property
    def fence(self) -> str | None:
        """Why writes and reads are refused now, or None."""
        return self._fence

    @fence.setter
    def fence(self, reason: str | None) -> None:
        self._fence = reason
        self.ctrl.commits.read_only = reason

    async def try_once(self) -> bool:
        """One attempt; True when done. On failure `fence` stays up with the reason."""
        if self.fence is None:
            self.fence = CHECKING
        try:
            await self.attempt()
        except CatchUpError as exc:
            self.fence = str(exc)
            log.warning("master_catch_up_failed", reason=str(exc), retry_s=self.retry_s)
            return False
        self.fence = None
        return True

    async def run(self, stop: trio.Event) -> bool:
        """Attempt until done (True) or until `stop` is set (False); `fence` is up meanwhile."""
        while not await self.try_once():
            with trio.move_on_after(self.retry_s):
                await stop.wait()
            if stop.is_set():
                return False
        return True

    async def attempt(self) -> None:
        """One pass: find the slaves, copy back, merge their metadata.

        Raises:
            CatchUpError: a step failed (the message says which and why).
        """
        addrs = await self._slave_addrs()
        if addrs is None:
            log.warning("master_catch_up_skipped", reason="no NameServer answered")
            return
        ranges = []
        silent = []
        for addr in addrs:
            found = await self._range(addr)
            if found is None:
                silent.append(addr)
            else:
                ranges.append(found)
        if silent:
            # Listed, so alive as far as the NameServers know, and maybe ahead of this
            # master: wait until it answers or they drop it (their broker expiry).
            raise CatchUpError(
                f"slave {', '.join(silent)} is listed by the NameServers but does not answer; "
                "sends are refused until it answers or is dropped from the route"
            )
        if not ranges:
            return
        best = max(ranges, key=lambda r: r.max_offset)
        store = self.ctrl.store
        if best.max_offset > store.max_phy_offset:
            await self._copy_back(best)
        for r in ranges:
            await self._merge_metadata(r.addr)

    async def _slave_addrs(self) -> list[str] | None:
        """Addresses the NameServers list for this broker name with an id > 0; None when
        no NameServer answered."""
        ctrl = self.ctrl
        for ns in ctrl.config.namesrv_addrs:
            try:
                resp = await ctrl.client.invoke(
                    ns,
                    RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO),
                    self.timeout_ms,
                )
            except RemotingError as exc:
                log.info("master_catch_up_namesrv_failed", namesrv=ns, error=str(exc))
                continue
            if resp.code != ResponseCode.SUCCESS:
                continue
            try:
                info = ClusterInfo.from_json(resp.body_bytes())
            except ValueError as exc:
                log.warning("master_catch_up_bad_cluster_info", namesrv=ns, error=str(exc))
                continue
            data = info.broker_addr_table.get(ctrl.config.broker_name)
            if data is None:
                return []
            return [a for bid, a in sorted(data.broker_addrs.items()) if int(bid) != MASTER_ID]
        return None

    async def _range(self, addr: str) -> _SlaveRange | None:
        """The commitlog range a slave reports, None when it does not answer."""
        cmd = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        try:
            resp = await self.ctrl.client.invoke(addr, cmd, self.timeout_ms)
        except RemotingError as exc:
            log.warning("master_catch_up_slave_unknown", slave=addr, error=str(exc))
            return None
        if resp.code != ResponseCode.SUCCESS:
            log.warning("master_catch_up_slave_unknown", slave=addr, code=resp.code)
            return None
        try:
            table = KVTable.from_json(resp.body_bytes()).table
            lo, hi = int(table["commitLogMinOffset"]), int(table["commitLogMaxOffset"])
        except (ValueError, KeyError) as exc:
            log.warning("master_catch_up_slave_unknown", slave=addr, error=str(exc))
            return None
        return _SlaveRange(addr, lo, hi)

    async def _copy_back(self, slave: _SlaveRange) -> None:
        store = self.ctrl.store
        own = store.max_phy_offset
        start = own
        if own == 0:
            start = slave.min_offset  # an empty store may begin where the slave's does
        elif own < slave.min_offset:
            raise CatchUpError(
                f"this master's commitlog ends at {own} and its slave {slave.addr} holds "
                f"{slave.min_offset}..{slave.max_offset}: the bytes between are in neither; "
                "sends are refused (move the slave's commitlog to this master by hand)"
            )
        self.fence = (
            f"this master's commitlog ends at {own}, its slave {slave.addr} holds up to "
            f"{slave.max_offset}: sends are refused until the missing bytes are copied back"
        )
        log.warning(
            "master_behind_slave", own_max=own, slave=slave.addr, slave_max=slave.max_offset
        )
        offset = start
        while offset < slave.max_offset:
            data = await self._read(slave.addr, offset)
            try:
                # Shielded: a half-done append must not be left behind by a shutdown.
                with trio.CancelScope(shield=True):
                    await store.append_replica(offset, data)
            except (ValueError, OSError) as exc:
                raise CatchUpError(
                    f"copying back from {slave.addr} at {offset}: {exc}; sends are refused"
                ) from exc
            offset = store.max_phy_offset
            self.copied_bytes += len(data)
        log.info("master_caught_up", slave=slave.addr, max=offset, copied=self.copied_bytes)

    async def _read(self, addr: str, offset: int) -> bytes:
        hdr = ReadCommitlogRequestHeader(offset=offset, max_bytes=self.chunk)
        try:
            resp = await self.ctrl.client.invoke(
                addr,
                RemotingCommand.request(RequestCode.READ_COMMITLOG, hdr.to_fields()),
                self.timeout_ms,
            )
        except RemotingError as exc:
            raise CatchUpError(f"reading {addr}'s commitlog at {offset}: {exc}") from exc
        if resp.code != ResponseCode.SUCCESS:
            raise CatchUpError(f"reading {addr}'s commitlog at {offset}: {resp.remark}")
        data = resp.body_bytes()
        if not data:
            rh = ReadCommitlogResponseHeader.from_fields(resp.ext_fields)
            raise CatchUpError(
                f"{addr} returned nothing at {offset} (its commitlog: {rh.min_offset}.."
                f"{rh.max_offset})"
            )
        return data

    async def _merge_metadata(self, addr: str) -> None:
        ctrl = self.ctrl
        meta = await fetch_metadata(ctrl.client, addr, self.timeout_ms)
        if meta.topics is not None:
            added = ctrl.topics.add_missing(meta.topics.topic_config_table)
            if added:
                ctrl.on_topics_changed()
                log.info("master_took_topics", slave=addr, topics=len(added))
        if meta.groups is not None:
            ctrl.subscriptions.add_missing(meta.groups)
        if meta.offsets is not None:
            moved = ctrl.offsets.merge_max(meta.offsets)
            if moved:
                log.info("master_took_offsets", slave=addr, queues=moved)
        if meta.delay_offsets is not None:
            schedule = ctrl.schedule
            for level, offset in meta.delay_offsets.items():
                if offset > schedule.offsets.get(level, 0):
                    schedule.offsets[level] = offset
                    schedule.dirty = True
        if not meta.complete:
            raise CatchUpError(f"could not read all metadata of slave {addr}; retrying")
        await ctrl.persist_all()

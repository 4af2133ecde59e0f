"""A broker in controller mode (RocketMQ 5.x `ReplicasManager`): the controllers decide
whether it is its group's master or a slave (docs/controller.md).

Identity. The broker holds a controller-assigned id >= 1, kept in `<store>/brokerIdentity`
(`cluster#brokerName#id`). The first start asks the leader for the next free id (1012),
writes it with its check code to `brokerIdentity-temp`, applies it (1013: the id is held by
that check code; a restart that finds the temp file applies the same one again), then makes
it final. To the NameServers and clients the master registers as id 0 and slaves with their
id, so 4.x clients see plain master/slave.

Roles. Until the controller gives one, the broker serves reads but refuses writes and is not
registered with the NameServers. It registers with the controller (1003) and heartbeats to
every controller (904, oneway) every `broker_heartbeat_interval_ms` with its last epoch and
max offset (what the controller elects by). Every `sync_broker_metadata_period_ms` it reads
its group (1004), and it is told of elections at once (1008). It acts on a master epoch
newer than the one it serves only, so a late or stale answer never rolls it back:

- this broker named master: the undispatched tail was never written (appends are whole
  runs), so it appends the epoch entry (epoch, max offset), serves slaves on its HA port
  (`broker.ha_autoswitch`), takes writes with the SyncStateSet rule, runs the services a
  master runs (delayed delivery, transaction checks), registers as id 0;
- another named master: it follows it over HA (truncating what the group never
  acknowledged, from the epoch entries), copies its metadata, registers with its own id;
- no master: it asks for an election (1002); the controller elects from the live
  SyncStateSet only.

SyncStateSet upkeep (master). A slave joins the set once it has caught up with the master
(acknowledged the master's max offset as of a transfer) and holds the current epoch's
start; a member leaves when it has not caught up for `ha_max_time_slave_not_catchup_ms` or
its HA connection is gone. Changes go to the controller (1001) and are used only once it
confirms them: a master cut off from the controller keeps its set, so with
`all_ack_in_sync_state_set` it stops acknowledging as soon as a member stops following.

With the controllers unreachable (or etcd down) nothing changes: the roles stay as they
are and the broker keeps serving.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import trio

from common.fileio import write_atomically
from remoting import RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.headers import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
)

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["GroupView", "ReplicasManager", "read_identity"]

log = structlog.get_logger()

# The controller's refusals the broker acts on (RocketMQ's ResponseCode.CONTROLLER_*).
NOT_LEADER = 2007
METADATA_NOT_EXIST = 2008
BROKER_ID_INVALID = 2014

IDENTITY_FILE = "brokerIdentity"
IDENTITY_TEMP_FILE = "brokerIdentity-temp"

_RETRY_S = 1.0  # between failed attempts to reach the controller leader
_REREGISTER_S = 1.0  # a slave re-registers this often until the NameServers name its master


class ControllerUnavailable(Exception):
    """No controller leader answered, or it refused; the message says which and why."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class IdentityError(Exception):
    """The identity file names another cluster or broker name than the configuration."""


@dataclass(frozen=True, slots=True)
class GroupView:
    """The controller's view of this broker's group (1003/1004/1008 answers)."""

    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int


def _parse_set(body: bytes | None) -> tuple[frozenset[int], int]:
    try:
        raw = json.loads(body or b"{}")
        members = frozenset(int(i) for i in raw.get("syncStateSet") or [])
        epoch = int(raw.get("syncStateSetEpoch") or 0)
    except (ValueError, TypeError, AttributeError):
        return frozenset(), 0
    return members, epoch


def read_identity(store_dir: Path) -> tuple[str, str, int] | None:
    """(cluster, broker name, id) from `<store>/brokerIdentity`, or None. Blocking."""
    try:
        text = (store_dir / IDENTITY_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    parts = text.split("#")
    if len(parts) != 3 or not parts[2].isdigit() or int(parts[2]) < 1:
        raise IdentityError(f"damaged {IDENTITY_FILE}: {text!r}")
    return parts[0], parts[1], int(parts[2])


def _read_temp(store_dir: Path) -> tuple[str, str, int, str] | None:
    try:
        text = (store_dir / IDENTITY_TEMP_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    parts = text.split("#")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2]), parts[3]


class ReplicasManager:
    """Runs a controller-mode broker's side of the controller protocol (module docstring).

    Args:
        ctrl: The broker (its client, store, HA and role switches).
    """

    def __init__(self, ctrl: BrokerController) -> None:
        self.ctrl = ctrl
        cfg = ctrl.config
        self.cfg = cfg
        self.addrs = cfg.controller_addrs
        self.timeout_ms = 3000
        self.leader: str | None = None
        self.broker_id: int | None = None  # the controller's id of this broker (>= 1)
        self.master_epoch = -1  # the newest epoch acted on
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = -1
        self.view: GroupView | None = None
        self.registered = False
        self._wake_sync = trio.Event()
        self._wake_check = trio.Event()
        self._role_lock = trio.Lock()

    # -- talking to controllers ----------------------------------------------------------
    async def find_leader(self) -> str | None:
        """The leader's address as the first answering controller names it."""
        for addr in self.addrs:
            try:
                resp = await self.ctrl.client.invoke(
                    addr,
                    RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO),
                    self.timeout_ms,
                )
            except RemotingError:
                continue
            if resp.code != ResponseCode.SUCCESS:
                continue
            hdr = GetMetaDataResponseHeader.from_fields(resp.ext_fields)
            if hdr.controller_leader_address:
                return hdr.controller_leader_address
        return None

    async def call_leader(self, cmd_factory: Callable[[], RemotingCommand]) -> RemotingCommand:
        """Send a request to the leader (found first when unknown, again after NOT_LEADER);
        the answer when SUCCESS.

        Raises:
            ControllerUnavailable: no leader, no answer, or a refusal (its code kept).
        """
        for _ in range(2):
            leader = self.leader or await self.find_leader()
            if leader is None:
                raise ControllerUnavailable("no controller leader known")
            self.leader = leader
            try:
                resp = await self.ctrl.client.invoke(leader, cmd_factory(), self.timeout_ms)
            except RemotingError as exc:
                self.leader = None
                raise ControllerUnavailable(f"controller {leader}: {exc}") from exc
            if resp.code == NOT_LEADER:
                self.leader = None
                continue
            if resp.code != ResponseCode.SUCCESS:
                raise ControllerUnavailable(
                    f"controller {leader} refused (code {resp.code}): {resp.remark}", resp.code
                )
            return resp
        raise ControllerUnavailable("the controllers keep naming another leader")

    # -- identity ---------------------------------------------------------------------------
    async def _identity(self) -> int:
        """This broker's controller id, applied for on the first start."""
        cfg = self.cfg
        store_dir = cfg.store_path
        # Small files; still disk reads and fsyncs: a worker thread.
        known = await trio.to_thread.run_sync(read_identity, store_dir)
        if known is not None:
            cluster, name, bid = known
            if (cluster, name) != (cfg.broker_cluster_name, cfg.broker_name):
                raise IdentityError(
                    f"{store_dir / IDENTITY_FILE} belongs to {cluster}/{name}, "
                    f"not {cfg.broker_cluster_name}/{cfg.broker_name}"
                )
            return bid
        temp = await trio.to_thread.run_sync(_read_temp, store_dir)
        if temp is not None and temp[:2] == (cfg.broker_cluster_name, cfg.broker_name):
            bid, code = temp[2], temp[3]
        else:
            resp = await self.call_leader(
                lambda: RemotingCommand.request(
                    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                    GetNextBrokerIdRequestHeader(
                        cluster_name=cfg.broker_cluster_name, broker_name=cfg.broker_name
                    ).to_fields(),
                )
            )
            nxt = GetNextBrokerIdResponseHeader.from_fields(resp.ext_fields).next_broker_id
            if nxt is None or nxt < 1:
                raise ControllerUnavailable(f"the controller gave no broker id ({nxt})")
            bid, code = nxt, f"{self.ctrl.addr};{int(time.time() * 1000)}"
            text = f"{cfg.broker_cluster_name}#{cfg.broker_name}#{bid}#{code}"
            await trio.to_thread.run_sync(
                write_atomically, store_dir / IDENTITY_TEMP_FILE, text.encode()
            )
        try:
            await self.call_leader(
                lambda: RemotingCommand.request(
                    RequestCode.CONTROLLER_APPLY_BROKER_ID,
                    ApplyBrokerIdRequestHeader(
                        cluster_name=cfg.broker_cluster_name,
                        broker_name=cfg.broker_name,
                        applied_broker_id=bid,
                        register_check_code=code,
                    ).to_fields(),
                )
            )
        except ControllerUnavailable as exc:
            if exc.code == BROKER_ID_INVALID:
                # Another broker took the id meanwhile: start over with a new one.
                await trio.to_thread.run_sync(_unlink, store_dir / IDENTITY_TEMP_FILE)
            raise
        final = f"{cfg.broker_cluster_name}#{cfg.broker_name}#{bid}"
        await trio.to_thread.run_sync(write_atomically, store_dir / IDENTITY_FILE, final.encode())
        await trio.to_thread.run_sync(_unlink, store_dir / IDENTITY_TEMP_FILE)
        log.info("controller_broker_id_applied", broker_id=bid)
        return bid

    # -- the loops -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Identity, registration, then heartbeats, group reads and set upkeep until
        cancelled. An identity file of another group stops the broker."""
        while self.broker_id is None:
            try:
                self.broker_id = await self._identity()
            except IdentityError as exc:
                log.error("controller_identity_mismatch", error=str(exc))  # noqa: TRY400
                self.ctrl.stop()
                return
            except (ControllerUnavailable, OSError) as exc:
                log.info("controller_identity_pending", error=str(exc))
                await trio.sleep(_RETRY_S + random.random())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self._sync_loop)
            nursery.start_soon(self._check_loop)

    def heartbeat_command(self) -> RemotingCommand:
        ctrl = self.ctrl
        cfg = self.cfg
        last = ctrl.epochs.last
        assert self.broker_id is not None
        return RemotingCommand.request(
            RequestCode.BROKER_HEARTBEAT,
            BrokerHeartbeatRequestHeader(
                cluster_name=cfg.broker_cluster_name,
                broker_addr=ctrl.addr,
                broker_name=cfg.broker_name,
                broker_id=self.broker_id,
                epoch=last.epoch if last is not None else 0,
                max_offset=ctrl.store.max_phy_offset,
                confirm_offset=ctrl.confirm_offset(),
                heartbeat_timeout_mills=cfg.controller_heartbeat_timeout_ms,
                election_priority=cfg.broker_election_priority,
            ).to_fields(),
        )

    async def _heartbeat_loop(self) -> None:
        period = self.cfg.broker_heartbeat_interval_ms / 1000

        async def one(addr: str) -> None:
            try:
                with trio.move_on_after(max(period, 1.0)):
                    await self.ctrl.client.invoke_oneway(addr, self.heartbeat_command())
            except RemotingError as exc:
                log.debug("controller_heartbeat_failed", controller=addr, error=str(exc))

        while True:
            async with trio.open_nursery() as nursery:
                for addr in self.addrs:
                    nursery.start_soon(one, addr)
            await trio.sleep(period)

    async def _sync_loop(self) -> None:
        period = self.cfg.sync_broker_metadata_period_ms / 1000
        while True:
            try:
                if not self.registered:
                    await self._register()
                else:
                    await self._read_group()
            except ControllerUnavailable as exc:
                if exc.code == METADATA_NOT_EXIST:
                    self.registered = False
                log.info("controller_sync_failed", error=str(exc))
            except (OSError, ValueError):
                # A role switch failed locally (the HA port taken, the epoch file refused):
                # the broker stays without the role and tries again.
                log.exception("controller_role_switch_failed")
            # Unregistered or without a master: retry soon; else every period.
            delay = period if self.registered and self._has_master() else _RETRY_S
            with trio.move_on_after(delay):
                await self._wake_sync.wait()
            self._wake_sync = trio.Event()

    def _has_master(self) -> bool:
        return self.view is not None and self.view.master_id is not None

    async def _register(self) -> None:
        cfg = self.cfg
        assert self.broker_id is not None
        bid = self.broker_id
        # A heartbeat first: the controller elects (and names a live master) by heartbeats.
        for addr in self.addrs:
            try:
                await self.ctrl.client.invoke_oneway(addr, self.heartbeat_command())
            except RemotingError:
                pass
        resp = await self.call_leader(
            lambda: RemotingCommand.request(
                RequestCode.CONTROLLER_REGISTER_BROKER,
                RegisterBrokerToControllerRequestHeader(
                    cluster_name=cfg.broker_cluster_name,
                    broker_name=cfg.broker_name,
                    broker_id=bid,
                    broker_address=self.ctrl.addr,
                ).to_fields(),
            )
        )
        hdr = RegisterBrokerToControllerResponseHeader.from_fields(resp.ext_fields)
        members, set_epoch = _parse_set(resp.body_bytes())
        self.registered = True
        log.info(
            "controller_registered",
            broker_id=bid,
            master_id=hdr.master_broker_id,
            master_epoch=hdr.master_epoch,
        )
        await self.apply(
            GroupView(
                hdr.master_broker_id,
                hdr.master_address,
                hdr.master_epoch or 0,
                members,
                hdr.sync_state_set_epoch if hdr.sync_state_set_epoch is not None else set_epoch,
            )
        )

    async def _read_group(self) -> None:
        cfg = self.cfg
        resp = await self.call_leader(
            lambda: RemotingCommand.request(
                RequestCode.CONTROLLER_GET_REPLICA_INFO,
                GetReplicaInfoRequestHeader(broker_name=cfg.broker_name).to_fields(),
            )
        )
        hdr = GetReplicaInfoResponseHeader.from_fields(resp.ext_fields)
        members, set_epoch = _parse_set(resp.body_bytes())
        await self.apply(
            GroupView(
                hdr.master_broker_id,
                hdr.master_address,
                hdr.master_epoch or 0,
                members,
                set_epoch,
            )
        )

    async def on_role_changed(self, cmd: RemotingCommand) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED from a controller (oneway)."""
        hdr = NotifyBrokerRoleChangedRequestHeader.from_fields(cmd.ext_fields)
        members, set_epoch = _parse_set(cmd.body_bytes())
        if self.broker_id is None or hdr.master_epoch is None:
            return
        await self.apply(
            GroupView(
                hdr.master_broker_id,
                hdr.master_address,
                hdr.master_epoch,
                members,
                hdr.sync_state_set_epoch if hdr.sync_state_set_epoch is not None else set_epoch,
            )
        )

    # -- acting on the controller's word --------------------------------------------------
    async def apply(self, view: GroupView) -> None:
        """Take the role `view` gives, if its epoch is newer than the one served; adopt a
        newer SyncStateSet of the same epoch while master."""
        async with self._role_lock:
            self.view = view
            me = self.broker_id
            if view.master_epoch > self.master_epoch or (
                view.master_epoch == self.master_epoch and self.ctrl.role_pending
            ):
                if view.master_id is None:
                    await self._elect()
                    return
                if view.master_id == me:
                    await self._become_master(view)
                elif view.master_addr:
                    await self._become_slave(view)
                return
            if view.master_id is None and self.ctrl.role_pending:
                await self._elect()
                return
            if (
                view.master_epoch == self.master_epoch
                and view.master_id == me
                and view.sync_state_set_epoch > self.sync_state_set_epoch
            ):
                self._adopt_set(view.sync_state_set, view.sync_state_set_epoch)

    async def _elect(self) -> None:
        """Ask for an election (no master known); the answer is acted on like a read."""
        cfg = self.cfg
        assert self.broker_id is not None
        bid = self.broker_id
        try:
            resp = await self.call_leader(
                lambda: RemotingCommand.request(
                    RequestCode.CONTROLLER_ELECT_MASTER,
                    ElectMasterRequestHeader(
                        cluster_name=cfg.broker_cluster_name,
                        broker_name=cfg.broker_name,
                        broker_id=bid,
                    ).to_fields(),
                )
            )
        except ControllerUnavailable as exc:
            log.info("controller_elect_failed", error=str(exc))
            return
        hdr = ElectMasterResponseHeader.from_fields(resp.ext_fields)
        members: frozenset[int] = frozenset()
        try:
            raw = json.loads(resp.body_bytes() or b"{}")
            members = frozenset(int(i) for i in raw.get("syncStateSet") or [])
        except (ValueError, TypeError, AttributeError):
            pass
        view = GroupView(
            hdr.master_broker_id,
            hdr.master_address,
            hdr.master_epoch or 0,
            members,
            hdr.sync_state_set_epoch or 0,
        )
        self.view = view
        if view.master_id is None or view.master_epoch < self.master_epoch:
            return
        if view.master_id == bid:
            await self._become_master(view)
        elif view.master_addr:
            await self._become_slave(view)

    async def _become_master(self, view: GroupView) -> None:
        log.info(
            "controller_role_master",
            broker_id=self.broker_id,
            master_epoch=view.master_epoch,
            sync_state_set=sorted(view.sync_state_set),
        )
        self.master_epoch = view.master_epoch
        self.sync_state_set = view.sync_state_set
        self.sync_state_set_epoch = view.sync_state_set_epoch
        assert self.broker_id is not None
        await self.ctrl.change_to_master(view.master_epoch, self.broker_id, view.sync_state_set)
        self._wake_check.set()

    async def _become_slave(self, view: GroupView) -> None:
        assert view.master_addr is not None
        assert self.broker_id is not None
        log.info(
            "controller_role_slave",
            broker_id=self.broker_id,
            master_id=view.master_id,
            master=view.master_addr,
            master_epoch=view.master_epoch,
        )
        self.master_epoch = view.master_epoch
        self.sync_state_set = frozenset()
        self.sync_state_set_epoch = -1
        await self.ctrl.change_to_slave(self.broker_id, view.master_addr)

    def _adopt_set(self, members: frozenset[int], epoch: int) -> None:
        if epoch <= self.sync_state_set_epoch:
            return
        log.info("controller_sync_state_set", members=sorted(members), epoch=epoch)
        self.sync_state_set = members
        self.sync_state_set_epoch = epoch
        ha = self.ctrl.ha_master_autoswitch
        if ha is not None and self.broker_id is not None:
            ha.set_sync_state_set(self.broker_id, members)

    # -- SyncStateSet upkeep (master) -------------------------------------------------------
    def slave_disconnected(self, slave_id: int) -> None:
        """The HA master lost a slave: look at the set now rather than at the next period."""
        if slave_id in self.sync_state_set:
            self._wake_check.set()

    def wanted_set(self, now_ms: int) -> frozenset[int]:
        """The set the master's HA view supports (members may leave, caught-up slaves join)."""
        ha = self.ctrl.ha_master_autoswitch
        me = self.broker_id
        if ha is None or me is None:
            return self.sync_state_set
        limit = self.cfg.ha_max_time_slave_not_catchup_ms
        states = ha.slave_states()
        last = self.ctrl.epochs.last
        epoch_start = last.start_offset if last is not None else 0
        wanted = {me}
        for sid in self.sync_state_set:
            st = states.get(sid)
            if (
                sid != me
                and st is not None
                and st.connected
                and now_ms - st.last_caught_up_ms <= limit
            ):
                wanted.add(sid)
        for sid, st in states.items():
            if (
                sid not in wanted
                and st.connected
                and not st.async_learner
                and st.last_caught_up_ms > 0
                and now_ms - st.last_caught_up_ms <= limit
                and st.ack >= epoch_start
            ):
                wanted.add(sid)
        return frozenset(wanted)

    async def _check_loop(self) -> None:
        period = self.cfg.check_sync_state_set_period_ms / 1000
        # Joining is checked often (a caught-up slave should count soon); leaving by period
        # or at once on a disconnect.
        tick = min(period, 1.0)
        last_shrink = trio.current_time()
        while True:
            with trio.move_on_after(tick):
                await self._wake_check.wait()
            woke = self._wake_check.is_set()
            self._wake_check = trio.Event()
            if self.ctrl.ha_master_autoswitch is None:
                continue
            now = trio.current_time()
            wanted = self.wanted_set(int(time.time() * 1000))
            shrink_due = woke or now - last_shrink >= period
            if shrink_due:
                last_shrink = now
                target = wanted
            else:
                target = wanted | self.sync_state_set
            if target != self.sync_state_set:
                await self._alter(target)

    async def _alter(self, members: frozenset[int]) -> None:
        me = self.broker_id
        assert me is not None
        body = json.dumps(
            {"syncStateSet": sorted(members), "syncStateSetEpoch": self.sync_state_set_epoch}
        ).encode()
        hdr = AlterSyncStateSetRequestHeader(
            broker_name=self.cfg.broker_name, master_broker_id=me, master_epoch=self.master_epoch
        ).to_fields()
        try:
            resp = await self.call_leader(
                lambda: RemotingCommand.request(
                    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, hdr, body=body
                )
            )
        except ControllerUnavailable as exc:
            # Kept as it is: only the controller's confirmation changes the set in use.
            log.info("controller_alter_sync_state_set_failed", error=str(exc))
            return
        out = AlterSyncStateSetResponseHeader.from_fields(resp.ext_fields)
        new_members, _ = _parse_set(resp.body_bytes())
        async with self._role_lock:
            if self.ctrl.ha_master_autoswitch is not None:
                self._adopt_set(new_members or members, out.new_sync_state_set_epoch)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

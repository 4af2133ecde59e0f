"""`ControllerServer`: one `mqcontroller` process (RocketMQ 5.x controller requests over
RemotingCommand, state in etcd; docs/controller.md).

Every process answers BROKER_HEARTBEAT (904, kept in memory: each controller has its own view
of who is alive) and CONTROLLER_GET_METADATA_INFO (1005). The requests that read or change a
group's state (1001-1004, 1006, 1012, 1013) are served by the leader only; the others answer
CONTROLLER_NOT_LEADER (2007) naming the leader. The leader applies changes one at a time (a
lock: RocketMQ's single event queue), each as `controller.replicas` computes it, written
with a transaction that compares the group key's revision and the leader's term
(`LeaderElection.fence`), so a deposed leader's write can never land.

The leader also scans, every `scan_inactive_master_interval_ms`, for groups whose master has
not heartbeated within its timeout, elects a new master from the live SyncStateSet (or fences
the dead one when there is none) and tells the group's live replicas (1008). A new leader
waits one heartbeat timeout before its first scan: until then it has not heard from every
live broker.

Security (docs/security.md): the remoting port takes the broker's TLS settings (`tls_mode`,
`tls_server_*`); with `acl_enable` every request is checked against `acl_file` before it is
served (common.acl's table: what brokers send needs a broker or admin account, reads any
account, the controller's administration codes an admin account) and a designated election
(an admin's `electMaster`) needs an admin account as well. What the controller sends to
brokers is signed with `acl_access_key` and goes over TLS when `tls_enable` (or an enforcing
`tls_mode`) says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

import structlog
import trio

from common.acl import (
    ACCESS_KEY,
    AclChecker,
    AclFileWatcher,
    AclRules,
    load_acl_file,
    server_check,
)
from controller.config import ControllerConfig
from controller.election import LeaderElection, NotLeader
from controller.etcd import Compare, EtcdClient, EtcdError, Op
from controller.keys import KeyLayout
from controller.replicas import (
    BrokerLiveness,
    ControllerCode,
    ControllerError,
    GroupState,
    Heartbeat,
    alter_sync_state_set,
    apply_broker_id,
    elect_master,
    register_broker,
)
from remoting import (
    Connection,
    HeaderError,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    RequestCode,
)
from remoting import ResponseCode as RC
from remoting.protocol.headers import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    ApplyBrokerIdResponseHeader,
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
from remoting.tls import server_settings

__all__ = ["ControllerServer"]

log = structlog.get_logger()

MAX_NAME = 127  # longest cluster / broker name taken (they become etcd keys)
_WRITE_RETRIES = 3  # a write that lost a race re-reads and recomputes this many times


def _sync_state_body(state: GroupState) -> bytes:
    return json.dumps(
        {
            "syncStateSet": sorted(state.sync_state_set),
            "syncStateSetEpoch": state.sync_state_set_epoch,
        }
    ).encode()


class AccountRefused(Exception):
    """The requester's broker account is bound to other clusters (`brokerClusters`)."""


def _check_name(what: str, name: str) -> None:
    if not name or len(name) > MAX_NAME or any(c.isspace() for c in name):
        raise ControllerError(ControllerCode.INVALID_REQUEST, f"bad {what} {name!r}")


class ControllerServer:
    """One controller process (see the module docstring).

    Args:
        config: The settings.
        clock: Wall-clock seconds for heartbeat ages (tests pass their own).
    """

    def __init__(
        self, config: ControllerConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        host, _, port = config.listen.rpartition(":")
        self._server = RemotingServer(host, int(port), tls=server_settings(config))
        # What the controller sends brokers (1008) is signed with its own account and uses
        # TLS as its client settings say: brokers may run with ACL and an enforcing port.
        self._client = RemotingClient(before_send=config.request_signer(), tls=config.client_tls())
        self.layout = KeyLayout(config.etcd_root)
        self.liveness = BrokerLiveness()
        self._clock = clock
        self._lock = trio.Lock()
        self._etcd: EtcdClient | None = None
        self._election: LeaderElection | None = None
        self._leader_since: float | None = None
        self.port = 0
        self.address = ""
        self.elections = 0
        self._stack: Any = None
        for code, handler in self._handlers().items():
            self._server.processors.register(code, handler)
        # Codes not served here pass the ACL check too (an admin account for most), so a
        # stranger learns nothing of what the controller serves.
        self._server.processors.set_default(self._not_supported)
        # Access control: the accounts are read at start (`run`), before anything is served.
        self.acl: AclChecker | None = None
        if config.acl_enable:
            self.acl = AclChecker(AclRules({}, ()))
            self._server.processors.check_before(self._acl_check(self.acl))

    @staticmethod
    def _acl_check(checker: AclChecker) -> Callable[[Any, Any], Any]:
        """The table's check (common.acl), then one rule of the controller's own: an election
        that designates the master (an admin's `electMaster`) needs an admin account, while
        a broker may ask for an ordinary election (the same code, 1002) with its own."""
        table = server_check(checker)

        def check(conn: Any, cmd: Any) -> Any:
            refusal = table(conn, cmd)
            if refusal is not None or cmd.code != RequestCode.CONTROLLER_ELECT_MASTER:
                return refusal
            # Read as the processor reads it, so what it acts on is what was checked.
            try:
                designated = ElectMasterRequestHeader.from_fields(cmd.ext_fields).designate_elect
            except HeaderError:
                return None  # the processor answers INVALID_REQUEST
            if not designated:
                return None
            fields = cmd.ext_fields or {}
            rules = checker.rules
            peer = conn.remote_address
            # White-listed addresses pass as they pass the table's admin codes.
            if any(p.match(peer) for p in rules.global_white):
                return None
            account = rules.accounts.get(fields.get(ACCESS_KEY) or "")
            if account is None:
                return None  # unreachable: the table's check refused it already
            white = account.white_remote_address
            if account.admin or (white is not None and white.match(peer)):
                return None
            remark = (
                "ACL: a designated election (request code 1002 with designateElect) needs an"
                f" admin account; accessKey={account.access_key} is not admin"
            )
            log.info("acl_refused", code=cmd.code, peer=peer, remark=remark)
            return cmd.make_response(RC.NO_PERMISSION, remark)

        return check

    def _bound_clusters(self, cmd: RemotingCommand) -> frozenset[str] | None:
        """The clusters the request's broker account may act on (`brokerClusters`); None:
        any (ACL off, no account named, an admin account, or an unbound broker account).
        The checker has verified the account before any processor runs."""
        if self.acl is None:
            return None
        key = (cmd.ext_fields or {}).get(ACCESS_KEY)
        account = self.acl.rules.accounts.get(key) if key else None
        if account is None or account.admin or not account.broker:
            return None
        return account.broker_clusters

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; `task_status.started(port)` once listening."""
        cfg = self.config
        async with (
            EtcdClient(cfg.endpoints, timeout_s=cfg.etcd_timeout_ms / 1000) as etcd,
            self._client,
            trio.open_nursery() as nursery,
        ):
            self._etcd = etcd
            if self.acl is not None:
                assert cfg.acl_file is not None
                # A file read: worker thread. A bad file stops the start (AclFileError).
                self.acl.replace(await trio.to_thread.run_sync(load_acl_file, cfg.acl_file))
                watcher = AclFileWatcher(
                    cfg.acl_file, self.acl, interval_s=cfg.acl_reload_interval_ms / 1000
                )
                nursery.start_soon(watcher.run)
            self.port = int(await nursery.start(self._server.run))
            self.address = cfg.address(self.port)
            election = LeaderElection(etcd, self.layout.leader, self.address, ttl_s=cfg.lease_ttl_s)
            async with election:
                self._election = election
                nursery.start_soon(self._lead)
                log.info("controller_started", addr=self.address, etcd=cfg.endpoints)
                task_status.started(self.port)
                await trio.sleep_forever()

    async def __aenter__(self) -> ControllerServer:
        from contextlib import AsyncExitStack

        stack = AsyncExitStack()
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        try:
            await nursery.start(self.run)
        except BaseException:
            # A start that failed (a file that does not load, a port taken) leaves no nursery
            # open behind: its error comes out of the stack's close.
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    @property
    def is_leader(self) -> bool:
        return self._election is not None and self._election.is_leader

    async def _lead(self) -> None:
        """Campaign; while leader, scan for dead masters; campaign again after a loss."""
        election = self._election
        assert election is not None
        interval = self.config.scan_inactive_master_interval_ms / 1000
        while True:
            term = await election.campaign()
            self._leader_since = self._clock()
            log.info("controller_leader", addr=self.address, term=term.revision)
            with trio.move_on_after(self.config.broker_heartbeat_timeout_ms / 1000):
                await term.lost.wait()
            while not term.lost.is_set():
                try:
                    await self.scan_inactive_masters()
                except (EtcdError, NotLeader) as exc:
                    log.warning("controller_scan_failed", error=str(exc))
                with trio.move_on_after(interval):
                    await term.lost.wait()
            self._leader_since = None
            log.warning("controller_leadership_lost", addr=self.address, reason=term.lost_reason)

    # -- state in etcd ------------------------------------------------------------------------
    async def _load(self, broker_name: str) -> tuple[GroupState | None, int]:
        assert self._etcd is not None
        kv = await self._etcd.get(self.layout.group(broker_name))
        if kv is None:
            return None, 0
        return GroupState.from_json(kv.value), kv.mod_revision

    async def _save(self, state: GroupState, revision: int) -> bool:
        """Write `state` if the group key is still at `revision` (0: absent) and this process
        still leads; False when another write came first."""
        assert self._etcd is not None
        assert self._election is not None
        key = self.layout.group(state.broker_name)
        guard = (
            Compare.create_revision(key, "==", 0)
            if revision == 0
            else Compare.mod_revision(key, "==", revision)
        )
        result = await self._etcd.txn(
            [self._election.fence(), guard], [Op.put(key, state.to_json())]
        )
        return result.succeeded

    async def update(
        self,
        cluster: str,
        broker_name: str,
        change: Callable[[GroupState], GroupState],
        *,
        create: bool = False,
        clusters: frozenset[str] | None = None,
    ) -> GroupState:
        """Apply `change` to the group's state and store it (nothing stored when unchanged).

        Args:
            clusters: the clusters the requester's broker account is bound to (None: any);
                a group of another cluster is refused NO_PERMISSION.

        Raises:
            ControllerError: the change refused; BROKER_METADATA_NOT_EXIST for an unknown
                group (unless `create`); NOT_LEADER when leadership ended meanwhile.
            AccountRefused: the group's cluster is not among `clusters`.
            EtcdError: etcd could not be reached.
        """
        for _ in range(_WRITE_RETRIES):
            state, revision = await self._load(broker_name)
            if state is None:
                if not create:
                    raise ControllerError(
                        ControllerCode.BROKER_METADATA_NOT_EXIST, f"no group {broker_name}"
                    )
                state = GroupState(cluster, broker_name)
            if clusters is not None and state.cluster not in clusters:
                raise AccountRefused(
                    f"ACL: group {broker_name} is in cluster {state.cluster}; the account"
                    f" may act on brokers of {', '.join(sorted(clusters))} only"
                )
            new = change(state)
            if new == state and revision:
                return state
            try:
                if await self._save(new, revision):
                    return new
            except NotLeader as exc:
                raise ControllerError(ControllerCode.NOT_LEADER, "no longer the leader") from exc
        raise ControllerError(
            ControllerCode.ELECT_MASTER_FAILED, f"group {broker_name} kept changing; try again"
        )

    async def groups(self) -> list[GroupState]:
        assert self._etcd is not None
        out = []
        for kv in await self._etcd.get_prefix(self.layout.groups_prefix):
            try:
                out.append(GroupState.from_json(kv.value))
            except ValueError as exc:
                log.warning("controller_bad_group_state", key=kv.key, error=str(exc))
        return out

    # -- elections --------------------------------------------------------------------------
    def _alive(self, state: GroupState) -> dict[int, Heartbeat]:
        return self.liveness.alive(state.cluster, state.broker_name, self._clock())

    async def scan_inactive_masters(self) -> None:
        """Elect where a master is dead (leader only; see the module docstring)."""
        for state in await self.groups():
            if state.master_id is None and state.master_epoch == 0:
                continue  # never had a master: its brokers ask for the first election
            alive = self._alive(state)
            if state.master_id is not None and state.master_id in alive:
                continue
            no_member = not any(i in alive for i in state.sync_state_set)
            unclean = self.config.enable_elect_unclean_master and bool(alive)
            if state.master_id is None and no_member and not unclean:
                continue  # fenced already; waits for a member to come back
            await self._elect(state.cluster, state.broker_name, None, by_controller=True)

    async def _elect(
        self,
        cluster: str,
        broker_name: str,
        designated: int | None,
        *,
        by_controller: bool,
        clusters: frozenset[str] | None = None,
    ) -> GroupState:
        async with self._lock:
            before: list[GroupState] = []

            def change(state: GroupState) -> GroupState:
                before.append(state)
                res = elect_master(
                    state,
                    self._alive(state),
                    designated=designated,
                    unclean=self.config.enable_elect_unclean_master,
                    by_controller=by_controller,
                )
                return res.state

            new = await self.update(cluster, broker_name, change, clusters=clusters)
        old = before[-1] if before else new
        if new.master_epoch != old.master_epoch:
            self.elections += 1
            log.warning(
                "controller_master_elected"
                if new.master_id is not None
                else "controller_master_fenced",
                broker_name=broker_name,
                master=new.master_id,
                address=new.master_address,
                epoch=new.master_epoch,
                sync_state_set=sorted(new.sync_state_set),
                by_controller=by_controller,
            )
            if self.config.notify_broker_role_changed:
                await self._notify(new)
        return new

    async def _notify(self, state: GroupState) -> None:
        hdr = NotifyBrokerRoleChangedRequestHeader(
            master_address=state.master_address,
            master_epoch=state.master_epoch,
            sync_state_set_epoch=state.sync_state_set_epoch,
            master_broker_id=state.master_id,
        )
        body = _sync_state_body(state)
        for hb in self._alive(state).values():
            cmd = RemotingCommand.request(
                RequestCode.NOTIFY_BROKER_ROLE_CHANGED, hdr.to_fields(), body=body
            )
            try:
                await self._client.invoke_oneway(hb.address, cmd)
            except Exception as exc:  # the broker learns it from its next sync anyway
                log.info("controller_notify_failed", broker=hb.address, error=str(exc))

    # -- processors -------------------------------------------------------------------------
    def _handlers(
        self,
    ) -> dict[
        int, Callable[[Connection, RemotingCommand], Coroutine[Any, Any, RemotingCommand | None]]
    ]:
        R = RequestCode
        return {
            R.BROKER_HEARTBEAT: self._heartbeat,
            R.CONTROLLER_GET_METADATA_INFO: self._metadata,
            R.CONTROLLER_ALTER_SYNC_STATE_SET: self._leader_only(self._alter),
            R.CONTROLLER_ELECT_MASTER: self._leader_only(self._elect_request),
            R.CONTROLLER_REGISTER_BROKER: self._leader_only(self._register),
            R.CONTROLLER_GET_REPLICA_INFO: self._leader_only(self._replica_info),
            R.CONTROLLER_GET_SYNC_STATE_DATA: self._leader_only(self._sync_state_data),
            R.CONTROLLER_GET_NEXT_BROKER_ID: self._leader_only(self._next_id),
            R.CONTROLLER_APPLY_BROKER_ID: self._leader_only(self._apply_id),
        }

    def _leader_only(
        self, handler: Callable[[RemotingCommand], Coroutine[Any, Any, RemotingCommand]]
    ) -> Callable[[Connection, RemotingCommand], Coroutine[Any, Any, RemotingCommand | None]]:
        async def process(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
            if not self.is_leader:
                leader = None
                if self._election is not None:
                    try:
                        leader = await self._election.current_leader()
                    except EtcdError:
                        leader = None
                return cmd.make_response(
                    ControllerCode.NOT_LEADER,
                    f"not the leader; the leader is {leader.decode() if leader else 'unknown'}",
                )
            try:
                return await handler(cmd)
            except ControllerError as exc:
                return cmd.make_response(exc.code, exc.remark)
            except AccountRefused as exc:
                log.info("acl_refused", code=cmd.code, peer=conn.remote_address, remark=str(exc))
                return cmd.make_response(RC.NO_PERMISSION, str(exc))
            except HeaderError as exc:
                return cmd.make_response(ControllerCode.INVALID_REQUEST, str(exc))
            except (ValueError, TypeError) as exc:
                return cmd.make_response(ControllerCode.INVALID_REQUEST, f"bad request: {exc}")
            except EtcdError as exc:
                return cmd.make_response(RC.SYSTEM_ERROR, f"etcd: {exc}")

        return process

    async def _not_supported(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        return cmd.make_response(
            RC.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
        )

    async def _heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        try:
            hdr = BrokerHeartbeatRequestHeader.from_fields(cmd.ext_fields)
            _check_name("cluster", hdr.cluster_name)
            _check_name("broker name", hdr.broker_name)
        except (HeaderError, ControllerError) as exc:
            return cmd.make_response(ControllerCode.INVALID_REQUEST, str(exc))
        clusters = self._bound_clusters(cmd)
        if clusters is not None and hdr.cluster_name not in clusters:
            remark = (
                f"ACL: a heartbeat for cluster {hdr.cluster_name}; the account may act on"
                f" brokers of {', '.join(sorted(clusters))} only"
            )
            log.info("acl_refused", code=cmd.code, peer=conn.remote_address, remark=remark)
            return cmd.make_response(RC.NO_PERMISSION, remark)
        timeout_ms = hdr.heartbeat_timeout_mills or self.config.broker_heartbeat_timeout_ms
        self.liveness.beat(
            hdr.cluster_name,
            hdr.broker_name,
            Heartbeat(
                broker_id=hdr.broker_id,
                address=hdr.broker_addr,
                epoch=hdr.epoch or 0,
                max_offset=hdr.max_offset or 0,
                confirm_offset=hdr.confirm_offset or 0,
                at=self._clock(),
                timeout_s=max(0.1, min(timeout_ms, 600_000) / 1000),
                priority=hdr.election_priority if hdr.election_priority is not None else 2**31 - 1,
            ),
        )
        return cmd.make_response(RC.SUCCESS, "Heart beat success")

    async def _metadata(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        leader = None
        if self._election is not None:
            try:
                leader = await self._election.current_leader()
            except EtcdError as exc:
                log.info("controller_leader_unknown", error=str(exc))
        hdr = GetMetaDataResponseHeader(
            group=self.layout.root,
            controller_leader_id=leader.decode() if leader else None,
            controller_leader_address=leader.decode() if leader else None,
            is_leader=self.is_leader,
            peers=self.address,
        )
        return cmd.make_response(RC.SUCCESS, ext_fields=hdr.to_fields())

    async def _apply_id(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = ApplyBrokerIdRequestHeader.from_fields(cmd.ext_fields)
        _check_name("cluster", hdr.cluster_name)
        _check_name("broker name", hdr.broker_name)
        async with self._lock:
            await self.update(
                hdr.cluster_name,
                hdr.broker_name,
                lambda s: apply_broker_id(s, hdr.applied_broker_id, hdr.register_check_code),
                create=True,
                clusters=self._bound_clusters(cmd),
            )
        out = ApplyBrokerIdResponseHeader(
            cluster_name=hdr.cluster_name, broker_name=hdr.broker_name
        )
        return cmd.make_response(RC.SUCCESS, ext_fields=out.to_fields())

    async def _next_id(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = GetNextBrokerIdRequestHeader.from_fields(cmd.ext_fields)
        _check_name("broker name", hdr.broker_name)
        state, _ = await self._load(hdr.broker_name)
        out = GetNextBrokerIdResponseHeader(
            cluster_name=hdr.cluster_name,
            broker_name=hdr.broker_name,
            next_broker_id=state.next_broker_id if state is not None else 1,
        )
        return cmd.make_response(RC.SUCCESS, ext_fields=out.to_fields())

    async def _register(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = RegisterBrokerToControllerRequestHeader.from_fields(cmd.ext_fields)
        _check_name("broker name", hdr.broker_name)
        async with self._lock:
            state = await self.update(
                hdr.cluster_name,
                hdr.broker_name,
                lambda s: register_broker(s, hdr.broker_id, hdr.broker_address),
                clusters=self._bound_clusters(cmd),
            )
        alive = self._alive(state)
        master_alive = state.master_id is not None and state.master_id in alive
        out = RegisterBrokerToControllerResponseHeader(
            cluster_name=state.cluster,
            broker_name=state.broker_name,
            master_broker_id=state.master_id if master_alive else None,
            master_address=state.master_address if master_alive else None,
            master_epoch=state.master_epoch if master_alive else None,
            sync_state_set_epoch=state.sync_state_set_epoch if master_alive else None,
        )
        return cmd.make_response(
            RC.SUCCESS, ext_fields=out.to_fields(), body=_sync_state_body(state)
        )

    async def _replica_info(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = GetReplicaInfoRequestHeader.from_fields(cmd.ext_fields)
        _check_name("broker name", hdr.broker_name)
        state, _ = await self._load(hdr.broker_name)
        if state is None:
            raise ControllerError(
                ControllerCode.BROKER_METADATA_NOT_EXIST, f"no group {hdr.broker_name}"
            )
        out = GetReplicaInfoResponseHeader(
            master_broker_id=state.master_id,
            master_address=state.master_address,
            master_epoch=state.master_epoch,
        )
        return cmd.make_response(
            RC.SUCCESS, ext_fields=out.to_fields(), body=_sync_state_body(state)
        )

    async def _elect_request(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = ElectMasterRequestHeader.from_fields(cmd.ext_fields)
        _check_name("broker name", hdr.broker_name)
        designated = hdr.broker_id if hdr.designate_elect and hdr.broker_id > 0 else None
        state = await self._elect(
            hdr.cluster_name,
            hdr.broker_name,
            designated,
            by_controller=False,
            clusters=self._bound_clusters(cmd),
        )
        out = ElectMasterResponseHeader(
            master_broker_id=state.master_id,
            master_address=state.master_address,
            master_epoch=state.master_epoch,
            sync_state_set_epoch=state.sync_state_set_epoch,
        )
        body = json.dumps(
            {
                "brokerMemberGroup": {
                    "cluster": state.cluster,
                    "brokerName": state.broker_name,
                    "brokerAddrs": {str(i): r.address for i, r in sorted(state.replicas.items())},
                },
                "syncStateSet": sorted(state.sync_state_set),
            }
        ).encode()
        return cmd.make_response(RC.SUCCESS, ext_fields=out.to_fields(), body=body)

    async def _alter(self, cmd: RemotingCommand) -> RemotingCommand:
        hdr = AlterSyncStateSetRequestHeader.from_fields(cmd.ext_fields)
        _check_name("broker name", hdr.broker_name)
        try:
            raw = json.loads(cmd.body_bytes() or b"{}")
            members = [int(i) for i in raw["syncStateSet"]]
            set_epoch = int(raw["syncStateSetEpoch"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ControllerError(
                ControllerCode.INVALID_REQUEST, f"bad SyncStateSet body: {exc}"
            ) from exc
        async with self._lock:
            state = await self.update(
                "",
                hdr.broker_name,
                lambda s: alter_sync_state_set(
                    s, hdr.master_broker_id, hdr.master_epoch, set_epoch, members, self._alive(s)
                ),
                clusters=self._bound_clusters(cmd),
            )
        out = AlterSyncStateSetResponseHeader(new_sync_state_set_epoch=state.sync_state_set_epoch)
        return cmd.make_response(
            RC.SUCCESS, ext_fields=out.to_fields(), body=_sync_state_body(state)
        )

    async def _sync_state_data(self, cmd: RemotingCommand) -> RemotingCommand:
        try:
            raw = json.loads(cmd.body_bytes() or b"[]")
        except ValueError as exc:
            raise ControllerError(
                ControllerCode.INVALID_REQUEST, f"bad broker name list: {exc}"
            ) from exc
        if not isinstance(raw, list):
            raise ControllerError(
                ControllerCode.INVALID_REQUEST, "the body must be a JSON array of broker names"
            )
        names = [str(n) for n in raw]
        table: dict[str, Any] = {}
        now = self._clock()
        for name in names[:1024]:
            _check_name("broker name", name)
            state, _ = await self._load(name)
            if state is None:
                continue
            alive = self.liveness.alive(state.cluster, name, now)

            def member(
                i: int, state: GroupState = state, alive: dict[int, Heartbeat] = alive
            ) -> dict[str, Any]:
                return {
                    "brokerName": state.broker_name,
                    "brokerId": i,
                    "brokerAddress": state.replicas[i].address,
                    "alive": i in alive,
                }

            table[name] = {
                "masterBrokerId": state.master_id,
                "masterAddress": state.master_address,
                "masterEpoch": state.master_epoch,
                "syncStateSetEpoch": state.sync_state_set_epoch,
                "inSyncReplicas": [
                    member(i) for i in sorted(state.sync_state_set) if i in state.replicas
                ],
                "notInSyncReplicas": [
                    member(i) for i in sorted(state.replicas) if i not in state.sync_state_set
                ],
            }
        return cmd.make_response(RC.SUCCESS, body=json.dumps({"replicasInfoTable": table}).encode())

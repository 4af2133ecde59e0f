"""The controller's rules for one broker group, without I/O (RocketMQ 5.x controller mode).

Per broker name the controller keeps a `GroupState`: the replicas that registered (each with a
controller-assigned id >= 1 and its address), the master's id, the master epoch, the
SyncStateSet (the replicas that hold everything the master acknowledged) with its own epoch,
and the history of master epochs with the commitlog offset each began at. Every change here
is a pure function from a state to a new state (or a `ControllerError` with RocketMQ's code);
the caller stores the new state with a compare on the old one's revision, so two controllers
can never both apply a change to the same state.

Liveness is not state: brokers heartbeat to every controller, and each keeps `Heartbeat`s in
memory (`BrokerLiveness`); an election reads the leader's.

Election (RocketMQ's `DefaultElectPolicy`): the first election of a group (no master ever)
may pick any live replica (RocketMQ: the one that asked); later, candidates are the live
members of the SyncStateSet; with none and `unclean` allowed, every live replica (losing
what the others did not copy). A designated id (admin) wins only if it is a candidate;
otherwise a live old master stays master (MASTER_STILL_EXIST); otherwise the best candidate
by epoch (desc), max offset (desc), election priority (asc), id (asc). A new master raises
the master epoch and the set epoch, and the set becomes {new master}. With no candidate, a
controller-triggered election leaves the group without master (epoch raised: the old master
is fenced).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

__all__ = [
    "BrokerLiveness",
    "ControllerCode",
    "ControllerError",
    "ElectResult",
    "EpochEntry",
    "GroupState",
    "Heartbeat",
    "Replica",
    "alter_sync_state_set",
    "apply_broker_id",
    "elect_master",
    "register_broker",
]


class ControllerCode(IntEnum):
    """RocketMQ's controller response codes (`ResponseCode.CONTROLLER_*`)."""

    FENCED_MASTER_EPOCH = 2000
    FENCED_SYNC_STATE_SET_EPOCH = 2001
    INVALID_MASTER = 2002
    INVALID_REPLICAS = 2003
    MASTER_NOT_AVAILABLE = 2004
    INVALID_REQUEST = 2005
    BROKER_NOT_ALIVE = 2006
    NOT_LEADER = 2007
    BROKER_METADATA_NOT_EXIST = 2008
    INVALID_CLEAN_BROKER_METADATA = 2009
    BROKER_NEED_TO_BE_REGISTERED = 2010
    MASTER_STILL_EXIST = 2011
    ELECT_MASTER_FAILED = 2012
    ALTER_SYNC_STATE_SET_FAILED = 2013
    BROKER_ID_INVALID = 2014


class ControllerError(Exception):
    """A refused change: RocketMQ's code and a remark for the wire."""

    def __init__(self, code: ControllerCode, remark: str) -> None:
        super().__init__(f"{code.name}: {remark}")
        self.code = code
        self.remark = remark


@dataclass(frozen=True, slots=True)
class Replica:
    """A registered replica: its controller id, address and the check code it applied with."""

    broker_id: int
    address: str
    register_check_code: str = ""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """A master epoch and the commitlog offset its master began writing at."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class GroupState:
    """One broker group's replicated state (stored as JSON, `to_json`/`from_json`)."""

    cluster: str
    broker_name: str
    replicas: Mapping[int, Replica] = field(default_factory=dict)
    next_broker_id: int = 1
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0
    epochs: tuple[EpochEntry, ...] = ()

    @property
    def master_address(self) -> str | None:
        if self.master_id is None:
            return None
        replica = self.replicas.get(self.master_id)
        return replica.address if replica is not None else None

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "cluster": self.cluster,
                "brokerName": self.broker_name,
                "replicas": [
                    {
                        "brokerId": r.broker_id,
                        "address": r.address,
                        "checkCode": r.register_check_code,
                    }
                    for r in sorted(self.replicas.values(), key=lambda r: r.broker_id)
                ],
                "nextBrokerId": self.next_broker_id,
                "masterBrokerId": self.master_id,
                "masterEpoch": self.master_epoch,
                "syncStateSet": sorted(self.sync_state_set),
                "syncStateSetEpoch": self.sync_state_set_epoch,
                "epochs": [[e.epoch, e.start_offset] for e in self.epochs],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> GroupState:
        """Raises ValueError on anything but what `to_json` writes."""
        try:
            raw: dict[str, Any] = json.loads(data)
            replicas = {
                int(r["brokerId"]): Replica(
                    int(r["brokerId"]), str(r["address"]), str(r["checkCode"])
                )
                for r in raw["replicas"]
            }
            master = raw["masterBrokerId"]
            return cls(
                cluster=str(raw["cluster"]),
                broker_name=str(raw["brokerName"]),
                replicas=replicas,
                next_broker_id=int(raw["nextBrokerId"]),
                master_id=None if master is None else int(master),
                master_epoch=int(raw["masterEpoch"]),
                sync_state_set=frozenset(int(i) for i in raw["syncStateSet"]),
                sync_state_set_epoch=int(raw["syncStateSetEpoch"]),
                epochs=tuple(EpochEntry(int(e), int(s)) for e, s in raw["epochs"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad group state: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a broker last told this controller (BROKER_HEARTBEAT)."""

    broker_id: int
    address: str
    epoch: int
    max_offset: int
    confirm_offset: int
    at: float
    timeout_s: float
    priority: int

    def alive(self, now: float) -> bool:
        return self.at + self.timeout_s >= now


class BrokerLiveness:
    """Heartbeats per (cluster, broker name, id), in memory. A later heartbeat replaces an
    earlier one's time; epoch and offsets only grow (RocketMQ's heartbeat manager)."""

    def __init__(self) -> None:
        self._beats: dict[tuple[str, str], dict[int, Heartbeat]] = {}

    def beat(self, cluster: str, broker_name: str, hb: Heartbeat) -> None:
        group = self._beats.setdefault((cluster, broker_name), {})
        old = group.get(hb.broker_id)
        if old is not None and (old.epoch, old.max_offset) > (hb.epoch, hb.max_offset):
            hb = replace(hb, epoch=old.epoch, max_offset=old.max_offset)
        group[hb.broker_id] = hb

    def forget(self, cluster: str, broker_name: str, broker_id: int) -> None:
        self._beats.get((cluster, broker_name), {}).pop(broker_id, None)

    def of(self, cluster: str, broker_name: str) -> Mapping[int, Heartbeat]:
        return self._beats.get((cluster, broker_name), {})

    def alive(self, cluster: str, broker_name: str, now: float) -> dict[int, Heartbeat]:
        return {i: h for i, h in self.of(cluster, broker_name).items() if h.alive(now)}

    def groups(self) -> list[tuple[str, str]]:
        return list(self._beats)


def apply_broker_id(state: GroupState, broker_id: int, check_code: str) -> GroupState:
    """Reserve `broker_id` for the replica identified by `check_code` ("addr;ms"): the next
    free id, or one it already holds (CONTROLLER_APPLY_BROKER_ID).

    Raises:
        ControllerError: BROKER_ID_INVALID, the id belongs to another check code or is < 1.
    """
    if broker_id < 1:
        raise ControllerError(ControllerCode.BROKER_ID_INVALID, f"broker id {broker_id} < 1")
    held = state.replicas.get(broker_id)
    if held is not None:
        if held.register_check_code != check_code:
            raise ControllerError(
                ControllerCode.BROKER_ID_INVALID,
                f"broker id {broker_id} of {state.broker_name} is held by another replica",
            )
        return state
    address = check_code.split(";", 1)[0]
    replicas = dict(state.replicas)
    replicas[broker_id] = Replica(broker_id, address, check_code)
    return replace(
        state, replicas=replicas, next_broker_id=max(state.next_broker_id, broker_id + 1)
    )


def register_broker(state: GroupState, broker_id: int, address: str) -> GroupState:
    """A registered replica (re)starts, perhaps at a new address (CONTROLLER_REGISTER_BROKER).

    Raises:
        ControllerError: BROKER_NEED_TO_BE_REGISTERED for an id never applied for.
    """
    held = state.replicas.get(broker_id)
    if held is None:
        raise ControllerError(
            ControllerCode.BROKER_NEED_TO_BE_REGISTERED,
            f"broker id {broker_id} of {state.broker_name} has not applied for an id",
        )
    if held.address == address:
        return state
    replicas = dict(state.replicas)
    replicas[broker_id] = replace(held, address=address)
    return replace(state, replicas=replicas)


@dataclass(frozen=True, slots=True)
class ElectResult:
    """The state after an election and whether it has a master."""

    state: GroupState
    elected: bool


def elect_master(
    state: GroupState,
    alive: Mapping[int, Heartbeat],
    *,
    designated: int | None = None,
    unclean: bool = False,
    by_controller: bool = False,
) -> ElectResult:
    """Elect a master for the group (CONTROLLER_ELECT_MASTER); see the module docstring.

    Args:
        state: The group's current state.
        alive: The live replicas' heartbeats (the leader's view).
        designated: An admin's choice (`electMaster -b`); it must be a candidate.
        unclean: `enableElectUncleanMaster`: with no live SyncStateSet member, any live
            replica may be elected, losing what it lacks.
        by_controller: The controller's own trigger (dead master): with no candidate the
            group is left without master and its epoch raised instead of an error.

    Raises:
        ControllerError: MASTER_STILL_EXIST (the old master is alive and a candidate, and no
            designated replica), ELECT_MASTER_FAILED (no candidate, or the designated id is
            not one), BROKER_METADATA_NOT_EXIST (nothing registered).
    """
    if not state.replicas:
        raise ControllerError(
            ControllerCode.BROKER_METADATA_NOT_EXIST, f"no replica of {state.broker_name}"
        )
    registered_alive = {i: h for i, h in alive.items() if i in state.replicas}
    if state.master_epoch == 0 and state.master_id is None and designated is None:
        # The first election: any live registered replica (the requester in RocketMQ).
        candidates = set(registered_alive)
    else:
        candidates = {i for i in state.sync_state_set if i in registered_alive}
        if not candidates and unclean:
            candidates = set(registered_alive)
    if designated is not None:
        if designated not in candidates:
            raise ControllerError(
                ControllerCode.ELECT_MASTER_FAILED,
                f"broker {designated} of {state.broker_name} is not an alive replica in sync",
            )
        winner: int | None = designated
    elif state.master_id is not None and state.master_id in candidates:
        raise ControllerError(
            ControllerCode.MASTER_STILL_EXIST,
            f"the master {state.master_id} of {state.broker_name} is still alive",
        )
    elif candidates:
        winner = min(
            candidates,
            key=lambda i: (
                -registered_alive[i].epoch,
                -registered_alive[i].max_offset,
                registered_alive[i].priority,
                i,
            ),
        )
    else:
        winner = None
    if winner is None:
        if not by_controller:
            raise ControllerError(
                ControllerCode.ELECT_MASTER_FAILED,
                f"no alive replica of {state.broker_name} in the SyncStateSet "
                f"{sorted(state.sync_state_set)}",
            )
        if state.master_id is None:
            return ElectResult(state, False)
        # Fence the dead master: a new epoch without master, the set kept.
        return ElectResult(
            replace(state, master_id=None, master_epoch=state.master_epoch + 1), False
        )
    if winner == state.master_id:
        return ElectResult(state, True)
    epoch = state.master_epoch + 1
    start = registered_alive[winner].max_offset
    return ElectResult(
        replace(
            state,
            master_id=winner,
            master_epoch=epoch,
            sync_state_set=frozenset({winner}),
            sync_state_set_epoch=state.sync_state_set_epoch + 1,
            epochs=(*state.epochs, EpochEntry(epoch, start)),
        ),
        True,
    )


def alter_sync_state_set(
    state: GroupState,
    master_id: int,
    master_epoch: int,
    sync_state_set_epoch: int,
    new_set: Iterable[int],
    alive: Mapping[int, Heartbeat],
) -> GroupState:
    """The master changes its SyncStateSet (CONTROLLER_ALTER_SYNC_STATE_SET).

    Raises:
        ControllerError: INVALID_MASTER (not the master), FENCED_MASTER_EPOCH /
            FENCED_SYNC_STATE_SET_EPOCH (stale epochs), INVALID_REPLICAS (unregistered
            member), BROKER_NOT_ALIVE (a member not alive), ALTER_SYNC_STATE_SET_FAILED
            (the set lacks the master or does not change).
    """
    if state.master_id != master_id:
        raise ControllerError(
            ControllerCode.INVALID_MASTER,
            f"{master_id} is not the master of {state.broker_name} ({state.master_id})",
        )
    if master_epoch != state.master_epoch:
        raise ControllerError(
            ControllerCode.FENCED_MASTER_EPOCH,
            f"master epoch {master_epoch} is not the current {state.master_epoch}",
        )
    if sync_state_set_epoch != state.sync_state_set_epoch:
        raise ControllerError(
            ControllerCode.FENCED_SYNC_STATE_SET_EPOCH,
            f"set epoch {sync_state_set_epoch} is not the current {state.sync_state_set_epoch}",
        )
    members = frozenset(new_set)
    for i in sorted(members):
        if i not in state.replicas:
            raise ControllerError(ControllerCode.INVALID_REPLICAS, f"replica {i} is not registered")
        if i != master_id and i not in alive:
            raise ControllerError(ControllerCode.BROKER_NOT_ALIVE, f"replica {i} is not alive")
    if master_id not in members or members == state.sync_state_set:
        raise ControllerError(
            ControllerCode.ALTER_SYNC_STATE_SET_FAILED,
            f"the new set {sorted(members)} must hold the master {master_id} and change",
        )
    return replace(
        state, sync_state_set=members, sync_state_set_epoch=state.sync_state_set_epoch + 1
    )

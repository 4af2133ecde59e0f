"""The controller's group rules: ids, registration, elections and SyncStateSet changes, with
RocketMQ's refusal codes."""

from __future__ import annotations

import pytest

from controller.replicas import (
    BrokerLiveness,
    ControllerCode,
    ControllerError,
    EpochEntry,
    GroupState,
    Heartbeat,
    alter_sync_state_set,
    apply_broker_id,
    elect_master,
    register_broker,
)

pytestmark = pytest.mark.unit


def _hb(i: int, epoch: int = 0, offset: int = 0, priority: int = 0, at: float = 0.0) -> Heartbeat:
    return Heartbeat(i, f"127.0.0.1:1091{i}", epoch, offset, offset, at, 10.0, priority)


def _group(*ids: int) -> GroupState:
    state = GroupState("C", "broker-a")
    for i in ids:
        state = apply_broker_id(state, i, f"127.0.0.1:1091{i};{i}")
    return state


def _code(exc: pytest.ExceptionInfo[ControllerError]) -> ControllerCode:
    return exc.value.code


def test_ids_are_reserved_per_check_code() -> None:
    state = _group(1, 2)
    assert sorted(state.replicas) == [1, 2]
    assert state.next_broker_id == 3
    assert apply_broker_id(state, 1, "127.0.0.1:10911;1") is state  # the holder again
    with pytest.raises(ControllerError) as exc:
        apply_broker_id(state, 1, "127.0.0.1:10919;9")
    assert _code(exc) is ControllerCode.BROKER_ID_INVALID
    with pytest.raises(ControllerError):
        apply_broker_id(state, 0, "x;1")


def test_register_records_a_new_address_and_refuses_unknown_ids() -> None:
    state = register_broker(_group(1), 1, "127.0.0.1:10917")
    assert state.replicas[1].address == "127.0.0.1:10917"
    with pytest.raises(ControllerError) as exc:
        register_broker(state, 5, "127.0.0.1:10915")
    assert _code(exc) is ControllerCode.BROKER_NEED_TO_BE_REGISTERED


def test_first_election_picks_the_best_live_replica_and_opens_epoch_one() -> None:
    state = _group(1, 2)
    res = elect_master(state, {1: _hb(1, offset=10), 2: _hb(2, offset=50)})
    assert res.elected
    s = res.state
    assert (s.master_id, s.master_epoch, s.sync_state_set, s.sync_state_set_epoch) == (
        2,
        1,
        frozenset({2}),
        1,
    )
    assert s.master_address == "127.0.0.1:10912"
    assert s.epochs == (EpochEntry(1, 50),)


def _with_set(members: set[int], master: int = 1) -> GroupState:
    state = elect_master(_group(1, 2, 3), {master: _hb(master)}).state
    alive = {i: _hb(i) for i in members}
    if members != {master}:
        state = alter_sync_state_set(
            state, master, state.master_epoch, state.sync_state_set_epoch, members, alive
        )
    return state


def test_only_sync_state_set_members_are_promoted() -> None:
    state = _with_set({1, 2})  # 3 registered but never in sync
    alive = {2: _hb(2, epoch=1, offset=100), 3: _hb(3, epoch=1, offset=999)}
    res = elect_master(state, alive, by_controller=True)
    assert res.state.master_id == 2
    assert res.state.master_epoch == state.master_epoch + 1
    assert res.state.sync_state_set == frozenset({2})


def test_candidates_rank_by_epoch_then_offset_then_priority_then_id() -> None:
    state = _with_set({1, 2, 3})

    def pick(alive: dict[int, Heartbeat]) -> int | None:
        return elect_master(state, alive, by_controller=True).state.master_id

    assert pick({2: _hb(2, epoch=2, offset=1), 3: _hb(3, epoch=1, offset=9)}) == 2
    assert pick({2: _hb(2, epoch=1, offset=5), 3: _hb(3, epoch=1, offset=9)}) == 3
    assert pick({2: _hb(2, offset=9, priority=5), 3: _hb(3, offset=9, priority=1)}) == 3
    assert pick({2: _hb(2, offset=9), 3: _hb(3, offset=9)}) == 2


def test_a_live_master_stays_unless_an_admin_designates_another() -> None:
    state = _with_set({1, 2})
    alive = {1: _hb(1), 2: _hb(2)}
    with pytest.raises(ControllerError) as exc:
        elect_master(state, alive)
    assert _code(exc) is ControllerCode.MASTER_STILL_EXIST
    moved = elect_master(state, alive, designated=2).state
    assert moved.master_id == 2
    with pytest.raises(ControllerError) as exc:
        elect_master(state, alive, designated=3)  # registered, not in sync
    assert _code(exc) is ControllerCode.ELECT_MASTER_FAILED


def test_no_candidate_fences_the_dead_master_or_elects_unclean() -> None:
    state = _with_set({1, 2})
    only_3 = {3: _hb(3, offset=5)}
    with pytest.raises(ControllerError) as exc:
        elect_master(state, only_3)
    assert _code(exc) is ControllerCode.ELECT_MASTER_FAILED
    fenced = elect_master(state, only_3, by_controller=True)
    assert not fenced.elected
    assert fenced.state.master_id is None
    assert fenced.state.master_epoch == state.master_epoch + 1
    assert fenced.state.sync_state_set == state.sync_state_set
    # Fenced already: a second scan changes nothing.
    assert elect_master(fenced.state, only_3, by_controller=True).state == fenced.state
    unclean = elect_master(state, only_3, unclean=True).state
    assert unclean.master_id == 3


def test_alter_checks_master_epochs_members_and_change() -> None:
    state = _with_set({1})
    alive = {1: _hb(1), 2: _hb(2)}
    m, me, se = 1, state.master_epoch, state.sync_state_set_epoch
    grown = alter_sync_state_set(state, m, me, se, {1, 2}, alive)
    assert grown.sync_state_set == frozenset({1, 2})
    assert grown.sync_state_set_epoch == se + 1
    cases = [
        ((2, me, se, {1, 2}, alive), ControllerCode.INVALID_MASTER),
        ((m, me - 1, se, {1, 2}, alive), ControllerCode.FENCED_MASTER_EPOCH),
        ((m, me, se + 1, {1, 2}, alive), ControllerCode.FENCED_SYNC_STATE_SET_EPOCH),
        ((m, me, se, {1, 9}, alive), ControllerCode.INVALID_REPLICAS),
        ((m, me, se, {1, 3}, alive), ControllerCode.BROKER_NOT_ALIVE),
        ((m, me, se, {2}, alive), ControllerCode.ALTER_SYNC_STATE_SET_FAILED),
        ((m, me, se, {1}, alive), ControllerCode.ALTER_SYNC_STATE_SET_FAILED),
    ]
    for args, code in cases:
        with pytest.raises(ControllerError) as exc:
            alter_sync_state_set(state, *args)
        assert _code(exc) is code, args


def test_state_round_trips_through_json_and_refuses_garbage() -> None:
    state = _with_set({1, 2})
    assert GroupState.from_json(state.to_json()) == state
    for bad in (b"", b"[]", b"{}", b'{"cluster": 1}', b"\xff"):
        with pytest.raises(ValueError, match="bad group state"):
            GroupState.from_json(bad)


def test_liveness_keeps_the_largest_epoch_and_offset_and_expires() -> None:
    live = BrokerLiveness()
    live.beat("C", "broker-a", _hb(1, epoch=2, offset=100, at=0.0))
    live.beat("C", "broker-a", _hb(1, epoch=1, offset=50, at=5.0))
    hb = live.of("C", "broker-a")[1]
    assert (hb.epoch, hb.max_offset, hb.at) == (2, 100, 5.0)
    assert set(live.alive("C", "broker-a", 15.0)) == {1}
    assert live.alive("C", "broker-a", 15.1) == {}
    live.forget("C", "broker-a", 1)
    assert live.of("C", "broker-a") == {}

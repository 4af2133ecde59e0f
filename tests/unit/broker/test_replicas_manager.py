"""`ReplicasManager` decisions against a fake broker and a scripted controller: ids applied
once and kept, roles taken only on a newer master epoch, an election asked for when the group
has no master, the SyncStateSet changed only on the controller's confirmation, and who may
join or must leave it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import BrokerConfig
from broker.replicas_manager import (
    IDENTITY_FILE,
    IDENTITY_TEMP_FILE,
    GroupView,
    IdentityError,
    ReplicasManager,
    read_identity,
)
from remoting import RemotingCommand, RequestCode, ResponseCode
from store.epoch_file import EpochFile

pytestmark = pytest.mark.unit

R = RequestCode


@dataclass
class _SlaveState:
    ack: int
    last_caught_up_ms: int
    connected: bool = True
    async_learner: bool = False


@dataclass
class _FakeHA:
    states: dict[int, _SlaveState] = field(default_factory=dict)
    sets: list[tuple[int, frozenset[int]]] = field(default_factory=list)

    def slave_states(self) -> dict[int, _SlaveState]:
        return self.states

    def set_sync_state_set(self, master_id: int, members: frozenset[int]) -> None:
        self.sets.append((master_id, members))


class _FakeStore:
    max_phy_offset = 1000


class _FakeClient:
    """Answers requests with a script: code -> function(cmd) -> response."""

    def __init__(self, script: dict[int, Any]) -> None:
        self.script = script
        self.calls: list[int] = []

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int = 0) -> RemotingCommand:
        self.calls.append(cmd.code)
        answer = self.script[cmd.code]
        out: RemotingCommand = answer(cmd) if callable(answer) else answer
        return out

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.calls.append(cmd.code)


class _FakeBroker:
    def __init__(self, tmp_path: Path, client: _FakeClient) -> None:
        self.config = BrokerConfig(
            store_dir=str(tmp_path),
            enable_controller_mode=True,
            controller_addr="127.0.0.1:9878",
            broker_name="broker-a",
        )
        self.client = client
        self.addr = "127.0.0.1:10911"
        self.store = _FakeStore()
        self.epochs = EpochFile(tmp_path / "epochFileCheckpoint")
        self.role_pending = True
        self.ha_master_autoswitch: _FakeHA | None = None
        self.changes: list[tuple[str, Any]] = []
        self.stopped = False

    def confirm_offset(self) -> int:
        return 0

    async def change_to_master(self, epoch: int, my_id: int, members: frozenset[int]) -> None:
        self.changes.append(("master", epoch))
        self.role_pending = False
        self.ha_master_autoswitch = _FakeHA()

    async def change_to_slave(self, my_id: int, master_addr: str) -> None:
        self.changes.append(("slave", master_addr))
        self.role_pending = False
        self.ha_master_autoswitch = None

    def stop(self) -> None:
        self.stopped = True


def _ok(fields: dict[str, str] | None = None, body: bytes | None = None) -> RemotingCommand:
    req = RemotingCommand.request(0)
    return req.make_response(ResponseCode.SUCCESS, ext_fields=fields or {}, body=body)


_LEADER = _ok({"controllerLeaderAddress": "127.0.0.1:9878", "isLeader": "true"})


def _manager(tmp_path: Path, script: dict[int, Any]) -> tuple[ReplicasManager, _FakeBroker]:
    broker = _FakeBroker(tmp_path, _FakeClient({R.CONTROLLER_GET_METADATA_INFO: _LEADER, **script}))
    return ReplicasManager(broker), broker  # type: ignore[arg-type]


async def test_an_id_is_applied_once_and_kept(tmp_path: Path) -> None:
    mgr, broker = _manager(
        tmp_path,
        {
            R.CONTROLLER_GET_NEXT_BROKER_ID: _ok({"nextBrokerId": "3"}),
            R.CONTROLLER_APPLY_BROKER_ID: _ok(),
        },
    )
    assert await mgr._identity() == 3
    assert read_identity(tmp_path) == ("DefaultCluster", "broker-a", 3)
    assert not (tmp_path / IDENTITY_TEMP_FILE).exists()
    # A restart reads the file: no request.
    calls = len(broker.client.calls)
    assert await mgr._identity() == 3
    assert len(broker.client.calls) == calls


async def test_a_pending_id_is_applied_again_after_a_crash(tmp_path: Path) -> None:
    (tmp_path / IDENTITY_TEMP_FILE).write_text("DefaultCluster#broker-a#5#127.0.0.1:1;9")
    applied: list[str] = []

    def apply(cmd: RemotingCommand) -> RemotingCommand:
        assert cmd.ext_fields is not None
        applied.append(
            cmd.ext_fields["appliedBrokerId"] + "/" + cmd.ext_fields["registerCheckCode"]
        )
        return _ok()

    mgr, broker = _manager(tmp_path, {R.CONTROLLER_APPLY_BROKER_ID: apply})
    assert await mgr._identity() == 5
    assert applied == ["5/127.0.0.1:1;9"]
    assert R.CONTROLLER_GET_NEXT_BROKER_ID not in broker.client.calls


async def test_an_identity_of_another_group_stops_the_broker(tmp_path: Path) -> None:
    (tmp_path / IDENTITY_FILE).write_text("DefaultCluster#broker-b#1")
    mgr, _ = _manager(tmp_path, {})
    with pytest.raises(IdentityError, match="broker-b"):
        await mgr._identity()
    (tmp_path / IDENTITY_FILE).write_text("garbage")
    with pytest.raises(IdentityError, match="damaged"):
        read_identity(tmp_path)


async def test_roles_follow_newer_epochs_only(tmp_path: Path) -> None:
    mgr, broker = _manager(tmp_path, {})
    mgr.broker_id = 2
    await mgr.apply(GroupView(1, "127.0.0.1:1", 3, frozenset({1, 2}), 4))
    assert broker.changes == [("slave", "127.0.0.1:1")]
    # The same or an older epoch changes nothing (a late answer of a stale leader).
    await mgr.apply(GroupView(2, "127.0.0.1:2", 3, frozenset({2}), 5))
    await mgr.apply(GroupView(2, "127.0.0.1:2", 2, frozenset({2}), 5))
    assert broker.changes == [("slave", "127.0.0.1:1")]
    await mgr.apply(GroupView(2, "127.0.0.1:2", 4, frozenset({2}), 5))
    assert broker.changes[-1] == ("master", 4)
    assert mgr.sync_state_set == frozenset({2})
    # A newer set of the same epoch is adopted; an older one is not.
    ha = broker.ha_master_autoswitch
    assert ha is not None
    await mgr.apply(GroupView(2, "127.0.0.1:2", 4, frozenset({1, 2}), 6))
    await mgr.apply(GroupView(2, "127.0.0.1:2", 4, frozenset({2}), 5))
    assert ha.sets == [(2, frozenset({1, 2}))]
    assert mgr.sync_state_set == frozenset({1, 2})


async def test_no_master_asks_for_an_election(tmp_path: Path) -> None:
    elected = _ok({"masterBrokerId": "2", "masterAddress": "127.0.0.1:2", "masterEpoch": "1"})
    mgr, broker = _manager(tmp_path, {R.CONTROLLER_ELECT_MASTER: elected})
    mgr.broker_id = 2
    await mgr.apply(GroupView(None, None, 0, frozenset(), 0))
    assert R.CONTROLLER_ELECT_MASTER in broker.client.calls
    assert broker.changes == [("master", 1)]


async def test_the_set_changes_only_when_the_controller_confirms(tmp_path: Path) -> None:
    answers: list[RemotingCommand | Exception] = []

    def alter(cmd: RemotingCommand) -> RemotingCommand:
        body = json.loads(cmd.body_bytes())
        assert body["syncStateSetEpoch"] == mgr.sync_state_set_epoch
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    mgr, broker = _manager(tmp_path, {R.CONTROLLER_ALTER_SYNC_STATE_SET: alter})
    mgr.broker_id = 1
    await mgr.apply(GroupView(1, "127.0.0.1:1", 1, frozenset({1}), 1))
    ha = broker.ha_master_autoswitch
    assert ha is not None
    refused = RemotingCommand.request(0).make_response(2013, "no")
    answers.append(refused)
    await mgr._alter(frozenset({1, 2}))
    assert mgr.sync_state_set == frozenset({1})
    answers.append(
        _ok({"newSyncStateSetEpoch": "2"}, json.dumps({"syncStateSet": [1, 2]}).encode())
    )
    await mgr._alter(frozenset({1, 2}))
    assert mgr.sync_state_set == frozenset({1, 2})
    assert mgr.sync_state_set_epoch == 2
    assert ha.sets[-1] == (1, frozenset({1, 2}))


async def test_who_joins_and_who_leaves(tmp_path: Path) -> None:
    mgr, broker = _manager(tmp_path, {})
    mgr.broker_id = 1
    await mgr.apply(GroupView(1, "127.0.0.1:1", 2, frozenset({1, 3}), 1))
    broker.epochs.entries = []
    broker.epochs.append(1, 0)
    broker.epochs.append(2, 500)
    ha = broker.ha_master_autoswitch
    assert ha is not None
    now = 100_000
    limit = broker.config.ha_max_time_slave_not_catchup_ms
    ha.states = {
        2: _SlaveState(ack=600, last_caught_up_ms=now - 10),  # caught up, past the epoch start
        3: _SlaveState(ack=900, last_caught_up_ms=now - limit - 1),  # member, fell behind
        4: _SlaveState(ack=400, last_caught_up_ms=now - 10),  # before the epoch start
        5: _SlaveState(ack=1000, last_caught_up_ms=0),  # never caught up
    }
    assert mgr.wanted_set(now) == frozenset({1, 2})
    del ha.states[2]
    ha.states[3] = _SlaveState(ack=900, last_caught_up_ms=now - 5)
    assert mgr.wanted_set(now) == frozenset({1, 3})
    ha.states[3] = _SlaveState(ack=900, last_caught_up_ms=now - 5, connected=False)
    assert mgr.wanted_set(now) == frozenset({1})
    ha.states[6] = _SlaveState(ack=900, last_caught_up_ms=now - 5, async_learner=True)
    assert mgr.wanted_set(now) == frozenset({1})


async def test_heartbeats_carry_the_last_epoch_and_offsets(tmp_path: Path) -> None:
    mgr, broker = _manager(tmp_path, {})
    mgr.broker_id = 2
    broker.epochs.append(7, 100)
    cmd = mgr.heartbeat_command()
    assert cmd.code == R.BROKER_HEARTBEAT
    assert cmd.ext_fields is not None
    assert cmd.ext_fields["epoch"] == "7"
    assert cmd.ext_fields["maxOffset"] == "1000"
    assert cmd.ext_fields["brokerId"] == "2"
    await trio.lowlevel.checkpoint()

"""The broker's inline processors (send, pull, offsets, heartbeat) over a real connection, with
an in-process controller: SYNC_FLUSH sends, held pulls and error mapping still behave."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Literal

import pytest
import trio
import trio.lowlevel

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.message import decode_records
from remoting import (
    Connection,
    FrameDecoder,
    RemotingClient,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode_frame,
)
from tests.helpers import StagingGuard, free_port
from tests.integration.test_broker_process import (
    PULL_COMMIT,
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    pull_request,
    send_request,
)
from tests.unit.store.test_staged_appends import record_pwrites

# Every in-process store here keeps the staging rule (the test fails otherwise).
pytestmark = pytest.mark.usefixtures("staging_guard")


def config(tmp_path: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"]) -> BrokerConfig:
    return BrokerConfig(
        listen=f"127.0.0.1:{free_port()}",
        store_dir=str(tmp_path / "store"),
        mapped_file_size_commitlog=1024 * 1024,
        mapped_file_size_consume_queue=20_000,
        flush_disk_type=flush,
    )


async def test_sync_flush_send_answers_after_the_group_commit(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "SYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            resps: list[RemotingCommand] = []

            async def send(i: int) -> None:
                resps.append(await client.invoke(addr, send_request("SyncT", b"m%d" % i)))

            async with trio.open_nursery() as n:
                for i in range(20):
                    n.start_soon(send, i)
        assert [r.code for r in resps] == [ResponseCode.SUCCESS] * 20
        assert all(r.ext_fields and r.ext_fields["msgId"] for r in resps)
        assert sorted(int(r.ext_fields["queueOffset"]) for r in resps if r.ext_fields) == list(
            range(20)
        )
        mfq = ctrl.store.commitlog.mfq
        assert mfq.flushed_where == mfq.max_offset


async def send_run(port: int, frames: list[RemotingCommand]) -> dict[int, RemotingCommand]:
    """Send `frames` in one write (one read, one run of inline handlers); their answers by
    opaque (opaques 1..n)."""
    for opaque, cmd in enumerate(frames, 1):
        cmd.opaque = opaque
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"".join(encode_frame(c) for c in frames))
        decoder = FrameDecoder()
        answers: list[RemotingCommand] = []
        while len(answers) < len(frames):
            answers.extend(decoder.feed(await stream.receive_some(1 << 20)))
    return {a.opaque: a for a in answers}


def fields(cmd: RemotingCommand) -> dict[str, str]:
    assert cmd.ext_fields is not None
    return cmd.ext_fields


def record_answers(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The opaques of the answers given later: one list per `Responder.respond_all` write to a
    connection, a list of one per `Responder.respond`."""
    calls: list[list[int]] = []
    many, one = Connection._answer_many, Connection._answer_later

    def recording_many(self: Connection, answers: Any) -> None:
        calls.append([cmd.opaque for cmd, _ in answers])
        many(self, answers)

    def recording_one(self: Connection, cmd: RemotingCommand, response: Any, direct: bool) -> None:
        calls.append([cmd.opaque])
        one(self, cmd, response, direct)

    monkeypatch.setattr(Connection, "_answer_many", recording_many)
    monkeypatch.setattr(Connection, "_answer_later", recording_one)
    return calls


async def test_sync_flush_sends_of_one_read_are_answered_together_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of SYNC_FLUSH sends waits for one group commit, and their answers leave in one
    write; a send with WAIT=false in the run is answered at once."""
    async with BrokerController(config(tmp_path, "SYNC_FLUSH")) as ctrl:
        async with RemotingClient() as client:  # the topic exists before the counted run
            addr = f"127.0.0.1:{ctrl.port}"
            assert (await client.invoke(addr, send_request("RunT", b"m0"))).code == 0
        calls = record_answers(monkeypatch)
        frames = [send_request("RunT", b"m%d" % i) for i in range(1, 6)]
        frames.append(send_request("RunT", b"nowait", props={"WAIT": "false"}))
        with trio.fail_after(10):
            answers = await send_run(ctrl.port, frames)
        assert [answers[i].code for i in range(1, 7)] == [ResponseCode.SUCCESS] * 6
        assert sorted(int(fields(answers[i])["queueOffset"]) for i in range(1, 7)) == list(
            range(1, 7)
        )
        assert calls == [[1, 2, 3, 4, 5]]
        mfq = ctrl.store.commitlog.mfq
        assert mfq.flushed_where == mfq.max_offset


async def test_a_sync_flush_run_not_durable_in_time_is_answered_flush_disk_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, "SYNC_FLUSH").model_copy(update={"sync_flush_timeout_ms": 100})
    async with BrokerController(cfg) as ctrl:
        async with RemotingClient() as client:
            addr = f"127.0.0.1:{ctrl.port}"
            assert (await client.invoke(addr, send_request("RunT", b"m0"))).code == 0
        calls = record_answers(monkeypatch)
        with trio.fail_after(10):
            async with ctrl.store.flush_service.commitlog_lock:  # no group commit can run
                answers = await send_run(
                    ctrl.port, [send_request("RunT", b"m%d" % i) for i in range(1, 4)]
                )
        assert [answers[i].code for i in (1, 2, 3)] == [ResponseCode.FLUSH_DISK_TIMEOUT] * 3
        # Stored all the same: the answers carry their ids and offsets.
        assert sorted(int(fields(answers[i])["queueOffset"]) for i in (1, 2, 3)) == [1, 2, 3]
        assert all(fields(answers[i])["msgId"] for i in (1, 2, 3))
        assert calls == [[1, 2, 3]]


async def test_send_errors_keep_their_mapping_and_region_fields(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            bad = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "1"}, b"x")
            resp = await client.invoke(addr, bad)
            assert resp.code == ResponseCode.MESSAGE_ILLEGAL
            assert resp.remark is not None
            assert resp.remark.startswith("bad request header")
            assert resp.ext_fields is not None
            assert "MSG_REGION" in resp.ext_fields
            empty = await client.invoke(addr, send_request("ErrT", b""))
            assert empty.code == ResponseCode.MESSAGE_ILLEGAL


async def test_pull_answers_at_once_or_holds_until_a_message_arrives(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            ok = await client.invoke(addr, send_request("PullT", b"first"))
            assert ok.code == ResponseCode.SUCCESS
            found = await client.invoke(addr, pull_request("PullT", 0))
            assert found.code == ResponseCode.SUCCESS
            assert [m.body for m in decode_records(found.body_bytes())] == [b"first"]

            held: list[RemotingCommand] = []
            flags = PULL_SUBSCRIPTION | PULL_SUSPEND | PULL_COMMIT

            async def hold() -> None:
                cmd = pull_request("PullT", 1, sys_flag=flags, suspend_ms=20_000, commit_offset=1)
                held.append(await client.invoke(addr, cmd, timeout_ms=30_000))

            async with trio.open_nursery() as n:
                n.start_soon(hold)
                with trio.fail_after(10):
                    while not ctrl.long_polling.parked_count:
                        await trio.sleep(0.01)
                # Stored when the pull arrived, not when it is answered.
                assert ctrl.offsets.query("CG", "PullT", 0) == 1
                ok = await client.invoke(addr, send_request("PullT", b"second"))
                assert ok.code == ResponseCode.SUCCESS
            [resp] = held
            assert resp.code == ResponseCode.SUCCESS
            assert [m.body for m in decode_records(resp.body_bytes())] == [b"second"]


async def test_async_flush_sends_of_one_read_are_one_commitlog_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sends arriving together (a pipelining producer) are appended with one pwrite, written
    before any of their answers leaves; a pull in the same read sees them."""
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:  # the topic exists before the counted read
            assert (await client.invoke(addr, send_request("StageT", b"m0"))).code == 0
        # What the flush service does every flush interval: reserve blocks for staging.
        assert await trio.to_thread.run_sync(ctrl.store.commitlog.reserve_ahead)
        before = ctrl.store.commitlog.max_offset
        writes = record_pwrites(monkeypatch)
        frames = [send_request("StageT", b"m%d" % i) for i in range(1, 11)]
        frames.append(pull_request("StageT", 0))
        with trio.fail_after(10):
            by_opaque = await send_run(ctrl.port, frames)
        assert [by_opaque[i].code for i in range(1, 11)] == [ResponseCode.SUCCESS] * 10
        pulled = decode_records(by_opaque[11].body_bytes())
        assert [m.body for m in pulled] == [b"m%d" % i for i in range(11)]
        # One write for the ten records (the pull drained them, or the end of the run did).
        assert writes == [ctrl.store.commitlog.max_offset - before]
        assert not any(mf.staged for mf in ctrl.store.commitlog.mfq.files)


async def test_the_hot_path_processors_are_registered_inline(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        table = ctrl.server.processors
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
            RequestCode.PULL_MESSAGE,
            RequestCode.QUERY_CONSUMER_OFFSET,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            RequestCode.HEART_BEAT,
        ):
            entry = table.get(code)
            assert entry is not None, code
            assert entry[1], code
            assert inspect.iscoroutinefunction(entry[0])
        entry = table.get(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert entry is not None
        assert not entry[1]


async def test_held_pulls_skip_filtered_arrivals_time_out_and_survive_their_peer(
    tmp_path: Path,
) -> None:
    flags = PULL_SUBSCRIPTION | PULL_SUSPEND
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            ok = await client.invoke(addr, send_request("HoldT", b"zero", tags="TagA"))
            assert ok.code == ResponseCode.SUCCESS
            got: dict[str, RemotingCommand] = {}

            async def pull(name: str, cmd: RemotingCommand) -> None:
                got[name] = await client.invoke(addr, cmd, timeout_ms=30_000)

            async with trio.open_nursery() as n:
                # Waits for TagB from offset 1; a TagA arrival moves it on without an answer.
                filtered = pull_request(
                    "HoldT", 1, sys_flag=flags, subscription="TagB", suspend_ms=20_000
                )
                n.start_soon(pull, "filtered", filtered)
                # Nothing arrives on queue 1: answered PULL_NOT_FOUND when its time is up.
                short = pull_request("HoldT", 0, queue_id=1, sys_flag=flags, suspend_ms=300)
                n.start_soon(pull, "timeout", short)
                with trio.fail_after(10):
                    while ctrl.long_polling.parked_count < 2:
                        await trio.sleep(0.01)
                ok = await client.invoke(addr, send_request("HoldT", b"one", tags="TagA"))
                assert ok.code == ResponseCode.SUCCESS
                await trio.sleep(0.05)
                assert "filtered" not in got
                ok = await client.invoke(addr, send_request("HoldT", b"two", tags="TagB"))
                assert ok.code == ResponseCode.SUCCESS
            assert got["filtered"].code == ResponseCode.SUCCESS
            assert [m.body for m in decode_records(got["filtered"].body_bytes())] == [b"two"]
            assert got["timeout"].code == ResponseCode.PULL_NOT_FOUND
            assert ctrl.long_polling.parked_count == 0

        # A pull held for a peer that goes away: the arrival finds a closed connection, the
        # answer is dropped and the pull leaves; the broker keeps serving.
        async with RemotingClient() as gone:
            held = pull_request("HoldT", 3, sys_flag=flags, subscription="*", suspend_ms=20_000)
            with trio.move_on_after(0.3):
                await gone.invoke(addr, held, timeout_ms=30_000)
            assert ctrl.long_polling.parked_count == 1
        async with RemotingClient() as client:
            ok = await client.invoke(addr, send_request("HoldT", b"three"))
            assert ok.code == ResponseCode.SUCCESS
            assert ctrl.long_polling.parked_count == 0
            found = await client.invoke(addr, pull_request("HoldT", 3))
            assert [m.body for m in decode_records(found.body_bytes())] == [b"three"]


async def test_the_staging_guard_sees_the_runs_and_catches_a_yield(
    tmp_path: Path, staging_guard: StagingGuard
) -> None:
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            for i in range(3):
                resp = await client.invoke(addr, send_request("GuardT", b"m%d" % i))
                assert resp.code == ResponseCode.SUCCESS
        assert staging_guard.runs > 0  # the broker's runs went through the guard
        assert staging_guard.violations == []
        # A run that yields is caught (the check can fail).
        ctrl.store.begin_staging()
        await trio.lowlevel.checkpoint()
        ctrl.store.end_staging()
        assert staging_guard.violations
        staging_guard.violations.clear()

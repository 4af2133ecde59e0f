"""`CommitBatcher`: the broker's one append path. Appends happen only inside a run, arrivals of
a run are told only once its records are written, replies wait for the group commit of their
run, and a run whose write fails acknowledges nothing and tells no one."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from broker.commit import CommitBatcher
from remoting import Connection, RemotingCommand, Responder, ResponseCode
from store import MessageStore, PutMessageResult, PutMessageStatus
from store._mapped_file import MappedFile
from tests.unit.store.test_staged_appends import _cfg, _msg

pytestmark = pytest.mark.unit


class _Conn:
    """Records what a `Responder` hands to its connection."""

    def __init__(self) -> None:
        self.writes: list[list[tuple[int, int | None]]] = []

    def _answer_later(self, cmd: RemotingCommand, response: Any, direct: bool) -> None:
        self.writes.append([(cmd.opaque, None if response is None else response.code)])

    def _answer_many(self, answers: Any) -> None:
        self.writes.append([(c.opaque, None if r is None else r.code) for c, r in answers])


def _responder(conn: _Conn, opaque: int) -> Responder:
    cmd = RemotingCommand.request(310, {})
    cmd.opaque = opaque
    return Responder(cast(Connection, conn), cmd)


def _ok(result: PutMessageResult) -> RemotingCommand:
    code = ResponseCode.SUCCESS if result.status is PutMessageStatus.PUT_OK else 10
    return RemotingCommand(code)


async def test_appends_happen_only_inside_a_run_and_puts_only_outside(tmp_path: Path) -> None:
    async with MessageStore(_cfg(tmp_path)) as store:
        commits = CommitBatcher(store)
        with pytest.raises(RuntimeError, match="outside a commit run"):
            commits.append([_msg(0)])
        commits.begin()
        with pytest.raises(RuntimeError, match="already open"):
            commits.begin()
        ticket = commits.append([_msg(1)])
        assert ticket.settled
        assert ticket.result.ok
        put = commits.put([_msg(2)])
        with pytest.raises(RuntimeError, match="inside a commit run"):
            await put
        commits.end()
        assert not commits.in_run
        assert (await commits.put([_msg(3)])).ok
        assert store.max_phy_offset > 0


async def test_arrivals_of_a_run_are_told_after_its_records_are_written(tmp_path: Path) -> None:
    async with MessageStore(_cfg(tmp_path)) as store:
        commits = CommitBatcher(store)
        assert (await commits.put([_msg(9)])).ok  # the first file, then its staging room
        await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
        told: list[tuple[int, bool]] = []

        def listener(topic: str, queue_id: int, max_offset: int) -> None:
            staged = any(mf.staged for mf in store.commitlog.mfq.files)
            told.append((max_offset, staged))

        store.add_arrival_listener(listener)
        commits.begin()
        commits.append([_msg(0)])
        commits.append([_msg(1)])
        assert store.commitlog.mfq.files[-1].staged  # the run's records are in memory only
        assert told == []
        commits.end()
        assert told == [(3, False)]  # once per queue, its latest max, nothing staged
        # Outside a run, an append is written and told at once.
        assert (await commits.put([_msg(2)])).ok
        assert told[-1] == (4, False)


async def test_a_run_that_fails_to_write_tells_no_one_and_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MessageStore(_cfg(tmp_path, "SYNC_FLUSH")) as store:
        commits = CommitBatcher(store)
        assert (await commits.put([_msg(9)])).ok  # the first file, then its staging room
        cl = store.commitlog
        await trio.to_thread.run_sync(cl.reserve_ahead)
        # SYNC_FLUSH stages in zeroed blocks (the flush service may have zeroed these first).
        cl.zero_ahead(4096, 1024)
        last = cl.mfq.files[-1]
        assert last.reserved_to >= last.wrote_position + 1024
        told: list[int] = []
        store.add_arrival_listener(lambda t, q, m: told.append(m))
        conn = _Conn()
        commits.begin()
        ticket = commits.append([_msg(0)])
        assert not ticket.settled
        assert cl.mfq.files[-1].staged
        ticket.reply(_responder(conn, 1), _ok)

        def broken(self: MappedFile, data: object, pos: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(MappedFile, "_pwrite_all", broken)
        with pytest.raises(OSError):
            commits.end()
        monkeypatch.undo()
        await trio.sleep(0.3)  # group commits come and go
        assert told == []
        assert conn.writes == []  # never acknowledged (the reader closes the connection)
        assert not commits.in_run


async def test_replies_of_a_sync_run_settle_together_after_the_group_commit(
    tmp_path: Path,
) -> None:
    async with MessageStore(_cfg(tmp_path, "SYNC_FLUSH")) as store:
        commits = CommitBatcher(store)
        a, b = _Conn(), _Conn()
        commits.begin()
        tickets = [commits.append([_msg(i)]) for i in range(3)]
        assert not any(t.settled for t in tickets)
        tickets[0].reply(_responder(a, 1), _ok)
        tickets[1].reply(_responder(b, 2), _ok)
        tickets[2].reply(_responder(a, 3), _ok)
        assert a.writes == b.writes == []  # nothing before the run ends and is durable
        commits.end()
        assert a.writes == b.writes == []  # the group commit answers, never `end` itself
        with trio.fail_after(5):
            while not a.writes or not b.writes:
                await trio.sleep(0.01)
        assert a.writes == [[(1, 0), (3, 0)]]  # one write per connection
        assert b.writes == [[(2, 0)]]
        assert store.flush_service.is_flushed(tickets[2].flush_end)
        # Outside a run, a ticket's reply is answered on its own once durable.
        conn = _Conn()
        result, end = store.put_messages_nowait([_msg(9)])
        from broker.commit import CommitTicket

        CommitTicket(commits, result, end).reply(_responder(conn, 7), _ok)
        with trio.fail_after(5):
            while not conn.writes:
                await trio.sleep(0.01)
        assert conn.writes == [[(7, 0)]]


async def test_settled_replies_of_a_run_leave_at_its_end_and_a_failed_build_is_an_error(
    tmp_path: Path,
) -> None:
    async with MessageStore(_cfg(tmp_path)) as store:
        commits = CommitBatcher(store)
        conn = _Conn()
        commits.begin()
        ticket = commits.append([_msg(0)])

        def broken(result: PutMessageResult) -> RemotingCommand:
            raise KeyError("x")

        ticket.reply(_responder(conn, 5), broken)
        ticket.reply(_responder(conn, 6), _ok)
        assert conn.writes == []  # settled, but a reply leaves only once the run is written
        commits.end()
        assert conn.writes == [[(5, ResponseCode.SYSTEM_ERROR), (6, ResponseCode.SUCCESS)]]


class FakeReplication:
    """A SYNC_MASTER's slave as the batcher sees it: in sync or not, and its reports."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok
        self.waits: list[tuple[int, Callable[[bool], None], float]] = []

    def slave_ok(self, next_offset: int) -> bool:
        return self.ok

    def when_replicated(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> None:
        self.waits.append((offset, callback, timeout_s))


def _status(result: PutMessageResult) -> RemotingCommand:
    return RemotingCommand(
        {
            PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
            PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
            PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
        }[result.status]
    )


async def test_a_sync_master_without_a_slave_in_sync_answers_slave_not_available(
    tmp_path: Path,
) -> None:
    async with MessageStore(_cfg(tmp_path)) as store:
        repl = FakeReplication(ok=False)
        commits = CommitBatcher(store, replication=repl)
        commits.begin()
        ticket = commits.append([_msg(0)])
        commits.end()
        assert ticket.settled  # stored, not waited for
        assert ticket.result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        assert ticket.result.append is not None
        assert repl.waits == []


async def test_replies_of_a_sync_master_run_wait_for_one_slave_report(tmp_path: Path) -> None:
    async with MessageStore(_cfg(tmp_path)) as store:
        repl = FakeReplication(ok=True)
        commits = CommitBatcher(store, replication=repl, slave_timeout_s=2.5)
        conn = _Conn()
        commits.begin()
        tickets = [commits.append([_msg(i)]) for i in range(3)]
        nowait = _msg(3)
        nowait.properties["WAIT"] = "false"
        nowait.properties_string = None
        free = commits.append([nowait])
        for i, t in enumerate(tickets):
            t.reply(_responder(conn, i + 1), _status)
        free.reply(_responder(conn, 9), _status)
        assert not any(t.settled for t in tickets)
        assert free.settled  # WAIT=false: answered once written, not replicated
        commits.end()
        assert conn.writes == [[(9, ResponseCode.SUCCESS)]]
        [(offset, callback, timeout)] = repl.waits  # one wait for the whole run
        assert offset == tickets[-1].replica_end
        assert timeout == 2.5
        callback(True)
        assert conn.writes[1] == [(1, 0), (2, 0), (3, 0)]
        # Not reported in time: FLUSH_SLAVE_TIMEOUT, the record kept.
        commits.begin()
        late = commits.append([_msg(4)])
        late.reply(_responder(conn, 5), _status)
        commits.end()
        repl.waits[-1][1](False)
        assert conn.writes[-1] == [(5, ResponseCode.FLUSH_SLAVE_TIMEOUT)]


async def test_a_put_outside_a_run_waits_for_the_slave_and_a_slave_refuses_appends(
    tmp_path: Path,
) -> None:
    async with MessageStore(_cfg(tmp_path)) as store:
        repl = FakeReplication(ok=True)
        commits = CommitBatcher(store, replication=repl)
        async with trio.open_nursery() as nursery:
            results: list[PutMessageResult] = []

            async def put() -> None:
                results.append(await commits.put([_msg(0)]))

            nursery.start_soon(put)
            await trio.testing.wait_all_tasks_blocked()
            assert results == []
            repl.waits[0][1](True)
        assert results[0].status is PutMessageStatus.PUT_OK
    async with MessageStore(_cfg(tmp_path / "slave")) as store:
        slave = CommitBatcher(store, read_only="the broker is a slave")
        refused = await slave.put([_msg(0)])
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert refused.remark == "the broker is a slave"
        assert store.max_phy_offset == 0

"""Inline handlers that answer later (`Connection.DEFERRED` + `respond_nowait`), and the store's
task-free SYNC_FLUSH completion (`MessageStore.when_put_durable`) they are built for."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from common.message import MessageInner
from remoting import FLAG_ONEWAY, Connection, InlineHandler, RemotingCommand
from store import MessageStore, PutMessageResult, PutMessageStatus, StoreConfig
from tests.unit.remoting.test_reader_answers_inline import (
    INLINE,
    SLOW_INLINE,
    park,
    record_batch,
    record_writes,
    request,
    serve,
)


async def test_deferred_answer_is_sent_by_respond_nowait_without_a_task() -> None:
    held: list[tuple[Connection, RemotingCommand]] = []

    def later(conn: Connection, cmd: RemotingCommand) -> Connection.Deferred:
        held.append((conn, cmd))
        return Connection.DEFERRED

    async with serve({SLOW_INLINE: later}) as (server, peer):
        await peer.send(request(SLOW_INLINE, 1), request(SLOW_INLINE, 2))
        await trio.testing.wait_all_tasks_blocked()
        assert [c.opaque for _, c in held] == [1, 2]
        # No task per request: the connection's nursery holds its writer and timer only.
        assert server._nursery is not None
        assert len(server._nursery.child_tasks) == 2
        conn, cmd = held[1]
        conn.respond_nowait(cmd, cmd.make_response(remark="two"))
        [first] = await peer.receive(1)
        assert (first.opaque, first.remark) == (2, "two")
        conn, cmd = held[0]
        conn.respond_nowait(cmd, cmd.make_response(remark="one"))
        [second] = await peer.receive(1)
        assert (second.opaque, second.remark) == (1, "one")


async def test_deferred_requests_count_in_flight_until_answered() -> None:
    held: list[RemotingCommand] = []
    calls: list[int] = []

    def later(conn: Connection, cmd: RemotingCommand) -> Connection.Deferred:
        calls.append(cmd.opaque)
        held.append(cmd)
        return Connection.DEFERRED

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        calls.append(cmd.opaque)
        return cmd.make_response()

    async with serve({SLOW_INLINE: later, INLINE: fast}, max_inflight=1) as (conn, peer):
        await peer.send(
            request(INLINE, 1),
            request(SLOW_INLINE, 2),
            request(SLOW_INLINE, 3),
            request(INLINE, 4),
        )
        [first] = await peer.receive(1)
        assert first.opaque == 1
        await trio.testing.wait_all_tasks_blocked()
        # 2 holds the only slot; 3 was handled but waits for one, and the reader with it: 4 is
        # not handled yet (as for a spawned slow path).
        assert calls == [1, 2, 3]
        conn.respond_nowait(held[0], held[0].make_response())
        got = await peer.receive(2)
        assert sorted(r.opaque for r in got) == [2, 4]
        assert calls == [1, 2, 3, 4]
        conn.respond_nowait(held[1], held[1].make_response())
        [last] = await peer.receive(1)
        assert last.opaque == 3


async def test_respond_nowait_after_close_is_dropped() -> None:
    held: list[tuple[Connection, RemotingCommand]] = []

    def later(conn: Connection, cmd: RemotingCommand) -> Connection.Deferred:
        held.append((conn, cmd))
        return Connection.DEFERRED

    async with serve({SLOW_INLINE: later}) as (conn, peer):
        await peer.send(request(SLOW_INLINE, 1))
        await trio.testing.wait_all_tasks_blocked()
        conn.close()
        await conn.wait_closed()
        c, cmd = held[0]
        c.respond_nowait(cmd, cmd.make_response())  # no error, nothing sent


def holding() -> tuple[list[RemotingCommand], InlineHandler]:
    """An inline handler that answers later (DEFERRED), and the requests it holds."""
    held: list[RemotingCommand] = []

    def later(conn: Connection, cmd: RemotingCommand) -> Connection.Deferred:
        held.append(cmd)
        return Connection.DEFERRED

    return held, later


async def test_respond_many_answers_in_one_write_and_frees_every_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held, later = holding()

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(remark="fast")

    async with serve({SLOW_INLINE: later, INLINE: fast}, max_inflight=3) as (conn, peer):
        await peer.send(*(request(SLOW_INLINE, i) for i in (1, 2, 3, 4)), request(INLINE, 5))
        await trio.testing.wait_all_tasks_blocked()
        assert [c.opaque for c in held] == [1, 2, 3, 4]  # 4 waits for a slot, 5 is not read
        writes = record_writes(monkeypatch)
        conn.respond_many([(c, c.make_response(remark=f"r{c.opaque}")) for c in held[:3]])
        assert len(writes) == 1  # the three answers, straight from the caller
        got = await peer.receive(4)
        assert [(r.opaque, r.remark) for r in got[:3]] == [(1, "r1"), (2, "r2"), (3, "r3")]
        assert (got[3].opaque, got[3].remark) == (5, "fast")  # the slots were freed
        conn.respond_many([(held[3], held[3].make_response(remark="r4"))])
        [last] = await peer.receive(1)
        assert (last.opaque, last.remark) == (4, "r4")


async def test_respond_many_frees_the_slots_of_none_answers_and_drops_after_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held, later = holding()
    async with serve({SLOW_INLINE: later}, max_inflight=1) as (conn, peer):
        oneway = request(SLOW_INLINE, 2)
        oneway.flag |= FLAG_ONEWAY
        await peer.send(request(SLOW_INLINE, 1), oneway, request(SLOW_INLINE, 3))
        await trio.testing.wait_all_tasks_blocked()
        assert [c.opaque for c in held] == [1, 2]  # 2 waits for the only slot
        writes = record_writes(monkeypatch)
        conn.respond_many([(held[0], None)])  # nothing to send, the slot is free again
        await trio.testing.wait_all_tasks_blocked()
        assert [c.opaque for c in held] == [1, 2, 3]  # 2 took it, 3 waits
        conn.respond_many([(held[1], held[1].make_response())])  # oneway: no answer either
        await peer.send(request(SLOW_INLINE, 4))
        await trio.testing.wait_all_tasks_blocked()
        assert [c.opaque for c in held] == [1, 2, 3, 4]  # 3 took the slot 2 freed, 4 waits
        assert writes == []
        conn.close()
        await conn.wait_closed()
        conn.respond_many([(held[2], held[2].make_response())])  # no error, nothing sent
        assert writes == []


async def test_respond_many_from_an_inline_handler_joins_the_answers_it_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events, batch = record_batch(monkeypatch)
    parked: list[RemotingCommand] = []

    def pull(conn: Connection, cmd: RemotingCommand) -> Connection.Deferred:
        parked.append(cmd)
        return Connection.DEFERRED

    def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        conn.respond_many([(c, c.make_response(body=b"pulled")) for c in parked])
        parked.clear()
        events.append("send")  # after the call: a write from within it would come first
        return cmd.make_response(body=b"sent")

    async with serve({SLOW_INLINE: pull, INLINE: send}, inline_batch=batch) as (_conn, peer):
        with trio.fail_after(10):
            await park(peer, parked, events, 1, 2)
            await peer.send(request(INLINE, 3))
            got = await peer.receive(3)
    # The woken pulls' answers leave together once the chunk's handlers ran, before the end.
    assert events == ["begin", "send", "write", "end", "write"]
    assert [(c.opaque, c.body) for c in got] == [(1, b"pulled"), (2, b"pulled"), (3, b"sent")]


def store_cfg(root: Path, **kw: object) -> StoreConfig:
    return StoreConfig.model_validate(
        {
            "store_path_root_dir": root,
            "mapped_file_size_commitlog": 64 * 1024,
            "mapped_file_size_consume_queue": 100 * 20,
            "flush_disk_type": "SYNC_FLUSH",
            **kw,
        }
    )


def msg() -> MessageInner:
    return MessageInner(
        "T",
        b"x" * 100,
        queue_id=0,
        born_timestamp=1,
        born_host=("192.0.2.1", 1234),
        store_host=("192.0.2.2", 10911),
    )


async def test_when_put_durable_calls_back_after_the_fsync(tmp_path: Path) -> None:
    async with MessageStore(store_cfg(tmp_path)) as store:
        seen: list[tuple[PutMessageStatus, int]] = []
        mfq = store.commitlog.mfq

        def done(final: PutMessageResult) -> None:
            seen.append((final.status, mfq.flushed_where))

        result, flush_end = store.put_messages_nowait([msg()])
        assert flush_end >= 0
        store.when_put_durable(result, flush_end, done)
        assert seen == []  # never from within the call
        with trio.fail_after(5):
            while not seen:
                await trio.sleep(0.001)
        assert seen[0][0] is PutMessageStatus.PUT_OK
        assert seen[0][1] >= flush_end  # durable when the callback ran


async def test_when_put_durable_reports_the_timeout_and_the_close(tmp_path: Path) -> None:
    async with MessageStore(store_cfg(tmp_path, sync_flush_timeout_ms=50)) as store:
        seen: list[PutMessageResult] = []
        async with store.flush_service.commitlog_lock:  # the flusher cannot run
            result, flush_end = store.put_messages_nowait([msg()])
            store.when_put_durable(result, flush_end, seen.append)
            with trio.fail_after(5):
                while not seen:
                    await trio.sleep(0.005)
        assert seen[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert seen[0].append is result.append
    seen.clear()
    async with MessageStore(store_cfg(tmp_path)) as store, store.flush_service.commitlog_lock:
        result, flush_end = store.put_messages_nowait([msg()])
        # A failing callback is logged and does not keep the next one from being called.
        store.when_put_durable(result, flush_end, lambda _r: 1 / 0)
        store.when_put_durable(result, flush_end, seen.append)
    # Leaving the store stops the flusher: the callback still comes.
    assert len(seen) == 1

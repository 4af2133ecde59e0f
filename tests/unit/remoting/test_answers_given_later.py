"""Processors that answer later (`Connection.defer` + `Responder`), and the store's task-free
SYNC_FLUSH completion (`MessageStore.when_put_durable`) they are built for."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from common.message import MessageInner
from remoting import FLAG_ONEWAY, Connection, Processor, RemotingCommand, Responder
from store import MessageStore, PutMessageResult, PutMessageStatus, StoreConfig
from tests.unit.remoting.test_reader_answers_inline import (
    INLINE,
    PLAIN_SLOW,
    SLOW_INLINE,
    Peer,
    busy,
    by_writer_task,
    in_reader,
    record_run,
    record_writers,
    record_writes,
    request,
    serve,
)


def holding() -> tuple[list[Responder], Processor]:
    """A processor that answers later (defers and returns None), and the responders of the
    requests it holds."""
    held: list[Responder] = []

    async def later(conn: Connection, cmd: RemotingCommand) -> None:
        held.append(conn.defer(cmd))

    return held, later


async def test_deferred_answer_is_sent_by_the_responder_without_a_task() -> None:
    """An inline processor that defers spawns no task; each responder sends its request's
    answer, in the order they respond."""
    held, later = holding()

    async with serve({SLOW_INLINE: later}) as (server, peer):
        await peer.send(request(SLOW_INLINE, 1), request(SLOW_INLINE, 2))
        await trio.testing.wait_all_tasks_blocked()
        assert [r.request.opaque for r in held] == [1, 2]
        assert all(r.connection is server for r in held)
        # No task per request: the connection's nursery holds its writer and timer only.
        assert server._nursery is not None
        assert len(server._nursery.child_tasks) == 2
        second = held[1]
        second.respond(second.request.make_response(remark="two"))
        assert second.answered
        [first] = await peer.receive(1)
        assert (first.opaque, first.remark) == (2, "two")
        one = held[0]
        one.respond(one.request.make_response(remark="one"))
        [last] = await peer.receive(1)
        assert (last.opaque, last.remark) == (1, "one")
        assert not busy(server)


async def test_deferred_requests_count_in_flight_until_answered() -> None:
    """A deferred request holds a request slot until its responder responds: at
    `max_inflight` the reader takes no further request until then."""
    held, later = holding()
    calls: list[int] = []

    async def counted_later(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        calls.append(cmd.opaque)
        return await later(conn, cmd)

    async def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        calls.append(cmd.opaque)
        return cmd.make_response()

    async with serve({SLOW_INLINE: counted_later, INLINE: fast}, max_inflight=1) as (conn, peer):
        await peer.send(
            request(INLINE, 1),
            request(SLOW_INLINE, 2),
            request(SLOW_INLINE, 3),
            request(INLINE, 4),
        )
        [first] = await peer.receive(1)
        assert first.opaque == 1
        await trio.testing.wait_all_tasks_blocked()
        # 2 holds the only slot: the reader stops before 3.
        assert calls == [1, 2]
        assert busy(conn)
        held[0].respond(held[0].request.make_response())
        [second] = await peer.receive(1)
        assert second.opaque == 2
        await trio.testing.wait_all_tasks_blocked()
        assert calls == [1, 2, 3]  # 3 took the freed slot; 4 waits for it
        held[1].respond(held[1].request.make_response())
        got = await peer.receive(2)
        assert sorted(r.opaque for r in got) == [3, 4]
        assert calls == [1, 2, 3, 4]
        assert not busy(conn)


async def test_an_answer_after_close_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Responding on a closed connection raises nothing and sends nothing."""
    held, later = holding()

    async with serve({SLOW_INLINE: later}) as (conn, peer):
        await peer.send(request(SLOW_INLINE, 1))
        await trio.testing.wait_all_tasks_blocked()
        conn.close()
        await conn.wait_closed()
        writes = record_writes(monkeypatch)
        [responder] = held
        responder.respond(responder.request.make_response())
        assert writes == []


async def test_a_second_respond_raises() -> None:
    """A responder answers once: a second `respond` raises RuntimeError and sends nothing."""
    held, later = holding()

    async with serve({SLOW_INLINE: later, INLINE: later}) as (conn, peer):
        await peer.send(request(SLOW_INLINE, 1))
        await trio.testing.wait_all_tasks_blocked()
        [responder] = held
        responder.respond(responder.request.make_response(remark="first"))
        with pytest.raises(RuntimeError):
            responder.respond(responder.request.make_response(remark="second"))
        with pytest.raises(RuntimeError):
            responder.respond(None)
        assert not busy(conn)  # freed once, not again
        # Another request and its answer: the next thing the peer reads after the first.
        await peer.send(request(INLINE, 2))
        await trio.testing.wait_all_tasks_blocked()
        held[1].respond(held[1].request.make_response(remark="next"))
        got = await peer.receive(2)
    assert [(r.opaque, r.remark) for r in got] == [(1, "first"), (2, "next")]


async def test_a_task_processor_that_defers_is_answered_when_the_responder_responds() -> None:
    """A task processor may defer too: its task ends without an answer, the request stays in
    flight, and the responder's answer is what the peer gets."""
    held, later = holding()

    async with serve({}, {PLAIN_SLOW: later}) as (conn, peer):
        await peer.send(request(PLAIN_SLOW, 1))
        await trio.testing.wait_all_tasks_blocked()
        [responder] = held
        assert conn._nursery is not None
        assert len(conn._nursery.child_tasks) == 2  # the processor's task is over
        assert busy(conn)
        responder.respond(responder.request.make_response(body=b"later"))
        [resp] = await peer.receive(1)
        assert not busy(conn)
    assert (resp.opaque, resp.body) == (1, b"later")


async def test_respond_all_answers_in_one_write_and_frees_every_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Responder.respond_all` writes the answers of one connection together and frees all
    their slots, so the reader goes on."""
    held, later = holding()

    async def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(remark="fast")

    async with serve({SLOW_INLINE: later, INLINE: fast}, max_inflight=3) as (conn, peer):
        await peer.send(*(request(SLOW_INLINE, i) for i in (1, 2, 3, 4)), request(INLINE, 5))
        await trio.testing.wait_all_tasks_blocked()
        # 1-3 hold every slot: 4 and 5 are not taken yet.
        assert [r.request.opaque for r in held] == [1, 2, 3]
        writes = record_writes(monkeypatch)
        Responder.respond_all(
            [(r, r.request.make_response(remark=f"r{r.request.opaque}")) for r in held]
        )
        assert len(writes) == 1  # the three answers, straight from the caller
        got = await peer.receive(4)
        assert [(r.opaque, r.remark) for r in got[:3]] == [(1, "r1"), (2, "r2"), (3, "r3")]
        assert (got[3].opaque, got[3].remark) == (5, "fast")  # the slots were freed
        assert [r.request.opaque for r in held] == [1, 2, 3, 4]
        fourth = held[3]
        Responder.respond_all([(fourth, fourth.request.make_response(remark="r4"))])
        [last] = await peer.receive(1)
        assert (last.opaque, last.remark) == (4, "r4")
        assert not busy(conn)


async def test_respond_all_writes_once_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers of requests from two connections, released together: one write for each."""
    held, later = holding()

    async with (
        serve({SLOW_INLINE: later}) as (_one, peer_one),
        serve({SLOW_INLINE: later}) as (_two, peer_two),
    ):
        await peer_one.send(request(SLOW_INLINE, 1), request(SLOW_INLINE, 2))
        await peer_two.send(request(SLOW_INLINE, 3), request(SLOW_INLINE, 4))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(r.request.opaque for r in held) == [1, 2, 3, 4]
        writes = record_writes(monkeypatch)
        Responder.respond_all([(r, r.request.make_response()) for r in held])
        assert len(writes) == 2
        got_one = await peer_one.receive(2)
        got_two = await peer_two.receive(2)
    assert [r.opaque for r in got_one] == [1, 2]
    assert [r.opaque for r in got_two] == [3, 4]


async def test_respond_all_frees_the_slots_of_none_answers_and_drops_after_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A None answer, or one to a oneway request, sends nothing but frees the slot; after
    the close every answer is dropped."""
    held, later = holding()
    async with serve({SLOW_INLINE: later}, max_inflight=1) as (conn, peer):
        oneway = request(SLOW_INLINE, 2)
        oneway.flag |= FLAG_ONEWAY
        await peer.send(request(SLOW_INLINE, 1), oneway, request(SLOW_INLINE, 3))
        await trio.testing.wait_all_tasks_blocked()
        assert [r.request.opaque for r in held] == [1]  # 1 holds the only slot
        writes = record_writes(monkeypatch)
        Responder.respond_all([(held[0], None)])  # nothing to send, the slot is free again
        await trio.testing.wait_all_tasks_blocked()
        assert [r.request.opaque for r in held] == [1, 2]  # 2 took it, 3 waits
        Responder.respond_all([(held[1], held[1].request.make_response())])  # oneway: no answer
        await peer.send(request(SLOW_INLINE, 4))
        await trio.testing.wait_all_tasks_blocked()
        assert [r.request.opaque for r in held] == [1, 2, 3]  # 3 took the slot 2 freed, 4 waits
        assert writes == []
        conn.close()
        await conn.wait_closed()
        Responder.respond_all([(held[2], held[2].request.make_response())])  # nothing sent
        assert writes == []


async def test_respond_all_refuses_an_answered_or_twice_listed_responder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`respond_all` raises RuntimeError when one of its responders has answered already or
    is listed twice, and then answers none of them."""
    held, later = holding()
    async with serve({SLOW_INLINE: later}) as (conn, peer):
        await peer.send(request(SLOW_INLINE, 1), request(SLOW_INLINE, 2))
        await trio.testing.wait_all_tasks_blocked()
        answered, waiting = held
        answered.respond(answered.request.make_response())
        [first] = await peer.receive(1)
        assert first.opaque == 1
        writes = record_writes(monkeypatch)
        with pytest.raises(RuntimeError):
            Responder.respond_all(
                [
                    (waiting, waiting.request.make_response()),
                    (answered, answered.request.make_response()),
                ]
            )
        with pytest.raises(RuntimeError):
            Responder.respond_all([(waiting, None), (waiting, waiting.request.make_response())])
        assert writes == []
        assert not waiting.answered
        assert busy(conn)  # 2 still holds its slot
        Responder.respond_all([(waiting, waiting.request.make_response(remark="once"))])
        [second] = await peer.receive(1)
    assert (second.opaque, second.remark) == (2, "once")


# ------------------------------------------------------------------------ answers released in a run
def pulls_and_sends(
    events: list[str], *, direct: bool, respond_all: bool = False
) -> tuple[dict[int, Processor], list[Responder]]:
    """Inline processors of a client sharing one connection for pulling and sending:
    SLOW_INLINE parks a pull (defers), INLINE answers a send (recorded as "send" in `events`,
    after) and first wakes the oldest parked pull through its responder (`direct` as given),
    or every parked pull with `Responder.respond_all`. Also the parked responders."""
    parked: list[Responder] = []

    async def pull(conn: Connection, cmd: RemotingCommand) -> None:
        parked.append(conn.defer(cmd))

    async def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if respond_all:
            Responder.respond_all([(r, r.request.make_response(body=b"pulled")) for r in parked])
            parked.clear()
        elif parked:
            waiting = parked.pop(0)
            waiting.respond(waiting.request.make_response(body=b"pulled"), direct=direct)
        events.append("send")  # after the call: a write from within it comes first
        return cmd.make_response(body=b"sent")

    return {SLOW_INLINE: pull, INLINE: send}, parked


async def park(peer: Peer, parked: list[Responder], events: list[str], *opaques: int) -> None:
    """Park a pull for each opaque (SLOW_INLINE), see them all parked, forget the events."""
    await peer.send(*(request(SLOW_INLINE, o) for o in opaques))
    await trio.testing.wait_all_tasks_blocked()
    assert len(parked) == len(opaques)
    events.clear()


@pytest.mark.parametrize(
    ("direct", "pulls"),
    [(True, [1]), (True, [1, 2]), (False, [1])],
    ids=["direct", "direct-with-others-in-flight", "only-request-in-flight"],
)
async def test_an_answer_released_in_a_run_is_written_at_once_when_the_writer_is_idle(
    monkeypatch: pytest.MonkeyPatch, direct: bool, pulls: list[int]
) -> None:
    """An answer released through a responder from within an inline processor, with the
    writer idle, is written straight to the socket by the respond call itself (`direct`, or
    the only request in flight): before the run ends and before the run's own answers."""
    events, hooks = record_run(monkeypatch)
    processors, parked = pulls_and_sends(events, direct=direct)
    async with serve(processors, hooks=hooks) as (_conn, peer):
        with trio.fail_after(10):
            await park(peer, parked, events, *pulls)
            writers = record_writers(monkeypatch)
            await peer.send(request(INLINE, 10))
            got = await peer.receive(2)
    assert events == ["begin", "write", "send", "end", "write"]
    assert [(c.opaque, c.body) for c in got] == [(1, b"pulled"), (10, b"sent")]
    assert all(in_reader(name) for name in writers)


async def test_an_answer_released_in_a_run_with_others_in_flight_leaves_after_the_run_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Released from within an inline processor while other requests are in flight (not
    `direct`), the answer is queued to the writer, which runs only once the reader yields:
    after the run ended, in one write with the run's answers."""
    events, hooks = record_run(monkeypatch)
    processors, parked = pulls_and_sends(events, direct=False)
    async with serve(processors, hooks=hooks) as (_conn, peer):
        with trio.fail_after(10):
            await park(peer, parked, events, 1, 2)
            writers = record_writers(monkeypatch)
            await peer.send(request(INLINE, 10))
            got = await peer.receive(2)
    assert events == ["begin", "send", "end", "write"]
    assert [(c.opaque, c.body) for c in got] == [(1, b"pulled"), (10, b"sent")]
    assert len(by_writer_task(writers)) == 1


async def test_respond_all_from_an_inline_processor_writes_the_released_answers_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`respond_all` called from within an inline processor with the writer idle writes the
    answers it releases in one write, from within the call: before the run ends and before
    the run's own answer."""
    events, hooks = record_run(monkeypatch)
    processors, parked = pulls_and_sends(events, direct=False, respond_all=True)
    async with serve(processors, hooks=hooks) as (_conn, peer):
        with trio.fail_after(10):
            await park(peer, parked, events, 1, 2)
            await peer.send(request(INLINE, 3))
            got = await peer.receive(3)
    assert events == ["begin", "write", "send", "end", "write"]
    assert [(c.opaque, c.body) for c in got] == [(1, b"pulled"), (2, b"pulled"), (3, b"sent")]


# ------------------------------------------------------------------------ the store's side
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

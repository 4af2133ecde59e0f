"""The broker's one path for appending messages, and when a put may be acknowledged.

Every append of the broker goes through its `CommitBatcher`:

- `append(msgs)`, inside a run: the remoting run hooks (`begin`, `end`) bracket the inline
  processors of the requests one connection read together (`remoting._processor`). The run's
  single-record appends are staged and written by `end` with one ``pwrite``, their index
  entries built together, and the arrivals they cause (long-poll wake-ups, delayed-message
  timers) are told only after that write (`MessageStore.end_staging`): no answer and no
  reader ever sees a record of the run before it is in the commitlog.
- `await put(msgs)`, outside any run (delayed delivery, transaction ends, send-back): one
  append and its wait.

An append gives a `CommitTicket`: its `result`, and whether that result is final (`settled`).
A put that must wait is not settled: under SYNC_FLUSH for the group commit (`durable`), on a
SYNC_MASTER for a slave to report the bytes (`replicated`, through the `Replication` the
broker gives); `reply(responder, build)` sends `build(final_result)` through the request's
`Responder` once it is. The waiting replies of one run settle together, on one group commit
and one slave report, in one write per connection. A SYNC_MASTER with no slave in sync answers
SLAVE_NOT_AVAILABLE at once, one whose slave does not report in time FLUSH_SLAVE_TIMEOUT (the
records are stored either way); a replica status overrides the flush status.

The structure keeps the invariants: `append` outside a run raises (nothing would write what it
stages), `put` inside a run raises (it would await inside the run), a run's replies are
registered only once `end` has written its records, and a run whose records could not be
written acknowledges none of its puts (the reader closes that connection).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog
import trio

from common.message import PROPERTY_WAIT, MessageInner
from remoting import RemotingCommand, Responder, ResponseCode
from store import MessageStore, PutMessageResult, PutMessageStatus

__all__ = ["CommitBatcher", "CommitTicket", "Put", "Replication"]

log = structlog.get_logger()

Build = Callable[[PutMessageResult], RemotingCommand | None]
# `CommitBatcher.put`, as the services that append from their own tasks receive it.
Put = Callable[[Sequence[MessageInner]], Awaitable[PutMessageResult]]


class Replication(Protocol):
    """What a SYNC_MASTER's appends wait on (the HA service)."""

    def slave_ok(self, next_offset: int) -> bool:
        """A slave is connected and close enough behind to wait for."""
        ...

    def when_replicated(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> None:
        """`callback(True)` once a slave reported `offset`, `callback(False)` after
        `timeout_s`; later, on the event loop, never from within the call."""
        ...


class CommitTicket:
    """One append's result and when it may be acknowledged.

    Attributes:
        result: the put's result; final when `settled`, else PUT_OK (or SLAVE_NOT_AVAILABLE)
            until the waits say otherwise.
        flush_end: the commitlog offset that must be durable first, or -1.
        replica_end: the commitlog offset a slave must report first, or -1.
    """

    __slots__ = ("_batcher", "flush_end", "replica_end", "result")

    def __init__(
        self,
        batcher: CommitBatcher,
        result: PutMessageResult,
        flush_end: int,
        replica_end: int = -1,
    ) -> None:
        self._batcher = batcher
        self.result = result
        self.flush_end = flush_end
        self.replica_end = replica_end

    @property
    def settled(self) -> bool:
        """The result is final: the answer may be sent now."""
        return self.flush_end < 0 and self.replica_end < 0

    def reply(self, responder: Responder, build: Build) -> None:
        """Answer through `responder` with `build(final result)` once settled (at once if it
        is). `build` runs on the event loop and must not block; if it raises, the request is
        answered SYSTEM_ERROR."""
        self._batcher._reply(self, responder, build)


class _Group:
    """Tickets settled together: by one durability and one replication wait (those needed)."""

    __slots__ = ("_batcher", "_callback", "_durable", "_pending", "_replicated", "tickets")

    def __init__(
        self,
        batcher: CommitBatcher,
        tickets: list[CommitTicket],
        callback: Callable[[list[PutMessageResult]], None],
    ) -> None:
        self._batcher = batcher
        self.tickets = tickets
        self._callback = callback
        self._durable = True
        self._replicated = True
        self._pending = 0

    def start(self) -> None:
        flush_end = max(t.flush_end for t in self.tickets)
        replica_end = max(t.replica_end for t in self.tickets)
        batcher = self._batcher
        if flush_end >= 0:
            self._pending += 1
        if replica_end >= 0:
            self._pending += 1
        if flush_end >= 0:
            batcher._store.when_durable(flush_end, self._flushed)
        if replica_end >= 0:
            assert batcher._replication is not None
            batcher._replication.when_replicated(
                replica_end, self._copied, batcher._slave_timeout_s
            )

    def _flushed(self, durable: bool) -> None:
        self._durable = durable
        self._one_done()

    def _copied(self, replicated: bool) -> None:
        self._replicated = replicated
        self._one_done()

    def _one_done(self) -> None:
        self._pending -= 1
        if self._pending:
            return
        store = self._batcher._store
        finals = []
        for t in self.tickets:
            final = t.result
            if final.status is PutMessageStatus.PUT_OK:
                if t.flush_end >= 0 and not self._durable:
                    final = store.not_durable(final)
                if t.replica_end >= 0 and not self._replicated:
                    # A replica status overrides the flush status.
                    final = PutMessageResult(
                        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
                        final.append,
                        "no slave reported the message in time",
                    )
            finals.append(final)
        self._callback(finals)


class CommitBatcher:
    """Runs of staged appends over one `MessageStore` (see the module docstring).

    Args:
        store: the store appended to.
        replication: what SYNC_MASTER appends wait on; None: appends do not wait for a slave.
        slave_timeout_s: how long they wait before FLUSH_SLAVE_TIMEOUT.
        read_only: why every append is refused (a slave), or None; `read_only` may be
            changed later (a master refuses appends while it catches up with its slave).
    """

    def __init__(
        self,
        store: MessageStore,
        *,
        replication: Replication | None = None,
        slave_timeout_s: float = 3.0,
        read_only: str | None = None,
    ) -> None:
        self._store = store
        self._replication = replication
        self._slave_timeout_s = slave_timeout_s
        self.read_only = read_only
        self._refusal: Callable[[], str | None] | None = None
        self._open = False
        # Replies of the open run, answered once `end` wrote it.
        self._waiting: list[tuple[CommitTicket, Responder, Build]] = []

    def set_replication(
        self, replication: Replication | None, refusal: Callable[[], str | None] | None
    ) -> None:
        """Change what appends wait on (a controller-mode broker changing role); `refusal`
        gives why a put is refused before it is stored (IN_SYNC_REPLICAS_NOT_ENOUGH)."""
        self._replication = replication
        self._refusal = refusal

    @property
    def in_run(self) -> bool:
        return self._open

    def begin(self) -> None:
        """Open a run (the remoting run hook)."""
        if self._open:
            raise RuntimeError("a commit run is already open")
        self._store.begin_staging()
        self._open = True

    def end(self) -> None:
        """Close the run: write its staged records, tell their arrivals, then answer its
        settled replies and start the waits of the others.

        Raises:
            OSError: the records could not be written; none of the run is acknowledged.
        """
        self._open = False
        waiting = self._waiting
        self._waiting = []
        self._store.end_staging()
        if not waiting:
            return
        settled: list[tuple[CommitTicket, Responder, Build]] = []
        unsettled: list[tuple[CommitTicket, Responder, Build]] = []
        for w in waiting:
            (settled if w[0].settled else unsettled).append(w)
        if settled:
            _answer(settled, [t.result for t, _, _ in settled])
        if unsettled:
            self._wait(unsettled)

    def append(self, msgs: Sequence[MessageInner]) -> CommitTicket:
        """Append `msgs` (one topic and queue) within the open run.

        Raises:
            RuntimeError: no run is open.
        """
        if not self._open:
            raise RuntimeError("append outside a commit run")
        return self._append(msgs)

    def _append(self, msgs: Sequence[MessageInner]) -> CommitTicket:
        if self.read_only is not None:
            refused = PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, self.read_only)
            return CommitTicket(self, refused, -1)
        if self._refusal is not None:
            why = self._refusal()
            if why is not None:
                refused = PutMessageResult(PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, None, why)
                return CommitTicket(self, refused, -1)
        result, flush_end = self._store.put_messages_nowait(msgs)
        replication = self._replication
        if (
            replication is None
            or result.status is not PutMessageStatus.PUT_OK
            or result.append is None
            or msgs[0].properties.get(PROPERTY_WAIT) == "false"
        ):
            return CommitTicket(self, result, flush_end)
        end = result.append.wrote_offset + result.append.wrote_bytes
        if not replication.slave_ok(end):
            unavailable = PutMessageResult(
                PutMessageStatus.SLAVE_NOT_AVAILABLE, result.append, "no slave in sync"
            )
            return CommitTicket(self, unavailable, flush_end)
        return CommitTicket(self, result, flush_end, end)

    async def put(self, msgs: Sequence[MessageInner]) -> PutMessageResult:
        """Append `msgs` outside any run and wait until the put is settled.

        Raises:
            RuntimeError: called inside a run.
        """
        if self._open:
            raise RuntimeError("put inside a commit run: use append")
        ticket = self._append(msgs)
        if ticket.settled:
            return ticket.result
        done = trio.Event()
        finals: list[PutMessageResult] = []

        def settled(results: list[PutMessageResult]) -> None:
            finals.extend(results)
            done.set()

        _Group(self, [ticket], settled).start()
        await done.wait()
        return finals[0]

    def _reply(self, ticket: CommitTicket, responder: Responder, build: Build) -> None:
        if self._open:
            # Answered once `end` wrote the run: at once then when settled, else with the
            # rest of the run.
            self._waiting.append((ticket, responder, build))
        elif ticket.settled:
            responder.respond(_built(build, ticket.result, responder))
        else:
            self._wait([(ticket, responder, build)])

    def _wait(self, waiting: list[tuple[CommitTicket, Responder, Build]]) -> None:
        """Answer `waiting` together once their waits are over."""
        _Group(self, [t for t, _, _ in waiting], lambda finals: _answer(waiting, finals)).start()


def _answer(
    waiting: Sequence[tuple[CommitTicket, Responder, Build]], finals: Sequence[PutMessageResult]
) -> None:
    Responder.respond_all(
        (responder, _built(build, final, responder))
        for (_, responder, build), final in zip(waiting, finals, strict=True)
    )


def _built(build: Build, result: PutMessageResult, responder: Responder) -> RemotingCommand | None:
    try:
        return build(result)
    except Exception as exc:
        log.exception("commit_reply_failed", code=responder.request.code)
        return responder.request.make_response(
            ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
        )

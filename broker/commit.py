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
Under SYNC_FLUSH a put that must wait for the group commit is not settled; `reply(responder,
build)` sends `build(final_result)` through the request's `Responder` once it is. The waiting
replies of one run settle together on one group commit, in one write per connection.

The structure keeps the invariants: `append` outside a run raises (nothing would write what it
stages), `put` inside a run raises (it would await inside the run), a run's replies are
registered only once `end` has written its records, and a run whose records could not be
written acknowledges none of its puts (the reader closes that connection).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import structlog

from common.message import MessageInner
from remoting import RemotingCommand, Responder, ResponseCode
from store import MessageStore, PutMessageResult

__all__ = ["CommitBatcher", "CommitTicket", "Put"]

log = structlog.get_logger()

Build = Callable[[PutMessageResult], RemotingCommand | None]
# `CommitBatcher.put`, as the services that append from their own tasks receive it.
Put = Callable[[Sequence[MessageInner]], Awaitable[PutMessageResult]]


class CommitTicket:
    """One append's result and when it may be acknowledged.

    Attributes:
        result: the put's result; final when `settled`, else PUT_OK until the group commit
            says otherwise (FLUSH_DISK_TIMEOUT when it does not make the records durable in
            time).
        flush_end: the commitlog offset that must be durable before the put is acknowledged,
            or -1 (settled).
    """

    __slots__ = ("_batcher", "flush_end", "result")

    def __init__(self, batcher: CommitBatcher, result: PutMessageResult, flush_end: int) -> None:
        self._batcher = batcher
        self.result = result
        self.flush_end = flush_end

    @property
    def settled(self) -> bool:
        """The result is final: the answer may be sent now."""
        return self.flush_end < 0

    def reply(self, responder: Responder, build: Build) -> None:
        """Answer through `responder` with `build(final result)` once settled (at once if it
        is). `build` runs on the event loop and must not block; if it raises, the request is
        answered SYSTEM_ERROR."""
        self._batcher._reply(self, responder, build)


class CommitBatcher:
    """Runs of staged appends over one `MessageStore` (see the module docstring)."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._open = False
        # Replies of the open run waiting for the group commit, and the largest of their ends.
        self._waiting: list[tuple[CommitTicket, Responder, Build]] = []
        self._waiting_end = -1

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
        """Close the run: write its staged records, tell their arrivals, then register its
        waiting replies with the group commit.

        Raises:
            OSError: the records could not be written; none of the run is acknowledged.
        """
        self._open = False
        waiting = self._waiting
        self._waiting = []
        self._store.end_staging()
        if not waiting:
            return
        settled = [w for w in waiting if w[0].flush_end < 0]
        if settled:
            self._settle(settled, True)
            waiting = [w for w in waiting if w[0].flush_end >= 0]
            if not waiting:
                return
        self._store.when_durable(self._waiting_end, lambda durable: self._settle(waiting, durable))

    def append(self, msgs: Sequence[MessageInner]) -> CommitTicket:
        """Append `msgs` (one topic and queue) within the open run.

        Raises:
            RuntimeError: no run is open.
        """
        if not self._open:
            raise RuntimeError("append outside a commit run")
        result, flush_end = self._store.put_messages_nowait(msgs)
        return CommitTicket(self, result, flush_end)

    async def put(self, msgs: Sequence[MessageInner]) -> PutMessageResult:
        """Append `msgs` outside any run and wait until the put is settled.

        Raises:
            RuntimeError: called inside a run.
        """
        if self._open:
            raise RuntimeError("put inside a commit run: use append")
        return await self._store.put_messages(msgs)

    def _reply(self, ticket: CommitTicket, responder: Responder, build: Build) -> None:
        if self._open:
            # Answered once `end` wrote the run: at once then when settled, else with the
            # rest of the run on its group commit (ends only grow).
            self._waiting.append((ticket, responder, build))
            if ticket.flush_end >= 0:
                self._waiting_end = ticket.flush_end
        elif ticket.flush_end < 0:
            responder.respond(_built(build, ticket.result, responder))
        else:
            self._store.when_put_durable(
                ticket.result,
                ticket.flush_end,
                lambda final: responder.respond(_built(build, final, responder)),
            )

    def _settle(self, waiting: list[tuple[CommitTicket, Responder, Build]], durable: bool) -> None:
        """Answer a run's waiting replies: PUT_OK, or FLUSH_DISK_TIMEOUT (records kept) for all
        of them when the group commit did not reach the run's end in time."""
        store = self._store
        answers = []
        for ticket, responder, build in waiting:
            final = ticket.result if durable else store.not_durable(ticket.result)
            answers.append((responder, _built(build, final, responder)))
        Responder.respond_all(answers)


def _built(build: Build, result: PutMessageResult, responder: Responder) -> RemotingCommand | None:
    try:
        return build(result)
    except Exception as exc:
        log.exception("commit_reply_failed", code=responder.request.code)
        return responder.request.make_response(
            ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
        )

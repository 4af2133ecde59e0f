"""The processor contract: how a request reaches the code that answers it.

Every processor is ``async def process(ctx, cmd) -> RemotingCommand | None`` where `ctx` is the
`Connection` the request came on (the peer's address, its attributes, `defer`) and `cmd` the
request. What it returns is the answer (None: no answer, as for a oneway request or one that
is answered later). A processor that answers later calls ``responder = ctx.defer(cmd)``,
returns None, and later calls ``responder.respond(answer)`` exactly once, from any task on the
event loop; the request counts as in flight on its connection until then (RocketMQ's
asynchronous processor shape: the answer goes through a callback).

A `ProcessorTable` maps request codes to processors; a server and a client each hold one and
their connections read it. A processor is registered in one of two modes:

- **task** (the default): each request runs in a task of its own, with the request's log
  context (peer, code, opaque) bound; it may await anything.
- **inline**: the connection's reader runs the coroutine itself, to completion, without a task
  (the fast path for sends, pulls and offsets: a task per request costs more than the work of
  a small one). An inline processor must never suspend: it does its work synchronously and,
  when it would have to wait (a group commit, a held pull), it defers and answers through its
  `Responder`. A suspension is a bug: the coroutine is closed and the request answered
  SYSTEM_ERROR, and the event is logged.

The inline processors of the requests read together run inside the table's `RunHooks`, if set:
`begin()` before the first of them and `end()` before the reader writes any of their answers
or yields to another task (then `begin()` again). Between the two nothing else runs on the
event loop, so a processor may stage work (the broker stages its appends) that `end()`
completes before any answer the reader writes reports it. If `end()` raises, the connection
closes without writing the run's answers. An answer a processor releases through a
`Responder` during the run may be written at once, before `end()`: such answers must not
report the run's staged work (the broker's commit batcher releases its replies in `end()`).

A table may carry an `RpcObserver` (`set_rpc_observer`): it is told, for the requests answered,
their request code, the answer's code and the seconds from the read that brought the request
to its answer being handed to the writer. The codes come as one flat sequence, request code
then response code for each answer (`[310, 0, 310, 0, ...]`): the reader collects them without
allocating a tuple per request (allocations drive the garbage collector). Remoting gives
only these numbers (what they mean is the owner's business: the broker's and NameServer's
metrics). Inline answers of one read
are told together, one call per batch of answers written (they share their read and their
write, so their duration is one figure); a task's answer and a deferred one (`Responder`) are
told one by one. Oneway requests and requests never answered are not told. The observer runs
on the event loop and must be quick and never raise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeAlias

import structlog
import trio

from remoting._command import RemotingCommand

if TYPE_CHECKING:
    from remoting._connection import Connection

__all__ = [
    "Processor",
    "ProcessorTable",
    "Responder",
    "RpcObserver",
    "RunHooks",
    "abandon",
    "run_inline",
]

log = structlog.get_logger()

Processor: TypeAlias = Callable[
    ["Connection", RemotingCommand], Coroutine[Any, Any, RemotingCommand | None]
]


Check: TypeAlias = Callable[["Connection", RemotingCommand], RemotingCommand | None]

RpcObserver: TypeAlias = Callable[[Sequence[int], float], None]
"""``observer(codes, seconds)``: request code, response code, request code, ... of the requests
answered (two entries each), and the seconds from the read that brought them to their answers'
write (module docstring). `codes` is valid during the call only (the reader reuses it)."""

# The clock of the RPC durations (monotonic, sub-microsecond).
rpc_clock = time.perf_counter


class RunHooks(NamedTuple):
    """Callbacks around each run of inline processors (see the module docstring)."""

    begin: Callable[[], None]
    end: Callable[[], None]


class ProcessorTable:
    """Request code -> processor and mode, plus a default for unknown codes and the run hooks.

    Changes apply to requests read from then on, on every connection that holds the table.
    """

    __slots__ = ("_entries", "_wrapper", "default", "rpc_observer", "run_hooks")

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Processor, bool]] = {}
        self.default: Processor | None = None
        self.run_hooks: RunHooks | None = None
        self.rpc_observer: RpcObserver | None = None
        self._wrapper: Callable[[Processor], Processor] | None = None

    def register(self, code: int, processor: Processor, *, inline: bool = False) -> None:
        """Route requests with `code` to `processor` (replacing any earlier one); `inline`
        runs it in the connection's reader (it must never suspend)."""
        if self._wrapper is not None:
            processor = self._wrapper(processor)
        self._entries[int(code)] = (processor, inline)

    def set_default(self, processor: Processor) -> None:
        """Handle every code without a processor of its own (in a task)."""
        if self._wrapper is not None:
            processor = self._wrapper(processor)
        self.default = processor

    def check_before(self, check: Check) -> None:
        """Run `check(conn, cmd)` before every processor, those registered later included
        (access control): a response it returns answers the request instead (nothing is sent
        for a oneway request), None lets the processor run. `check` must not suspend (it runs
        in inline processors too). Once per table."""
        if self._wrapper is not None:
            raise RuntimeError("the table has a check already")

        def wrap(processor: Processor) -> Processor:
            # A plain function: a request let through runs the processor's own coroutine (no
            # coroutine wrapping it: one frame less per request, each a send on the hot path).
            def checked(
                conn: Connection, cmd: RemotingCommand
            ) -> Coroutine[Any, Any, RemotingCommand | None]:
                try:
                    refusal = check(conn, cmd)
                except Exception as exc:
                    # Raised where the processor's would be: answered as a failed request.
                    return _fail(exc)
                if refusal is not None:
                    return _answer(None if cmd.is_oneway else refusal)
                return processor(conn, cmd)

            return checked

        self._wrapper = wrap
        self._entries = {code: (wrap(p), inline) for code, (p, inline) in self._entries.items()}
        if self.default is not None:
            self.default = wrap(self.default)

    def set_run_hooks(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        """Bracket each run of inline processors with `begin()` and `end()` (both quick,
        never blocking)."""
        self.run_hooks = RunHooks(begin, end)

    def set_rpc_observer(self, observer: RpcObserver | None) -> None:
        """Tell `observer` the code, answer code and duration of the requests answered from
        now on (None: stop); see the module docstring."""
        self.rpc_observer = observer

    def get(self, code: int) -> tuple[Processor, bool] | None:
        """The processor for `code` and whether it is inline, or None."""
        return self._entries.get(code)

    def __contains__(self, code: int) -> bool:
        return code in self._entries


async def _answer(response: RemotingCommand | None) -> RemotingCommand | None:
    """A processor's coroutine that answers `response` at once (a check's refusal)."""
    return response


async def _fail(exc: Exception) -> RemotingCommand | None:
    """A processor's coroutine that raises `exc` (a check that failed unexpectedly)."""
    raise exc


class Responder:
    """Answers one deferred request (`Connection.defer`), exactly once."""

    __slots__ = ("_cmd", "_conn", "_since", "answered")

    def __init__(self, conn: Connection, cmd: RemotingCommand) -> None:
        self._conn = conn
        self._cmd = cmd
        self.answered = False
        # When it was deferred (the request's read, near enough), set by `Connection.defer`
        # while its table has an RPC observer; 0.0: not timed.
        self._since = 0.0

    @property
    def connection(self) -> Connection:
        return self._conn

    @property
    def request(self) -> RemotingCommand:
        return self._cmd

    def respond(self, response: RemotingCommand | None, *, direct: bool = False) -> None:
        """Send the answer (None: none) and free the request's in-flight slot. Never blocks;
        on a closed connection the answer is dropped. `direct` writes it straight to the
        socket whenever the connection's writer is idle (an answer released on its own, with
        nothing to join it to).

        Raises:
            RuntimeError: the request was answered already.
        """
        if self.answered:
            raise RuntimeError(f"request {self._cmd.opaque} answered twice")
        self.answered = True
        self._conn._answer_later(self._cmd, response, direct)
        self._observe(response)

    def _observe(self, response: RemotingCommand | None) -> None:
        """Tell the table's RPC observer, if any, about this answer."""
        if not self._since or response is None or self._cmd.is_oneway:
            return
        observer = self._conn._processors.rpc_observer
        if observer is not None:
            observer((self._cmd.code, response.code), rpc_clock() - self._since)

    @staticmethod
    def respond_all(answers: Iterable[tuple[Responder, RemotingCommand | None]]) -> None:
        """`respond` for many requests released together (one group commit), in one write per
        connection.

        Raises:
            RuntimeError: one of them was answered already or is listed twice (none of them
                is then sent).
        """
        by_conn: dict[Connection, list[tuple[RemotingCommand, RemotingCommand | None]]] = {}
        pairs = list(answers)
        if any(r.answered for r, _ in pairs) or len({id(r) for r, _ in pairs}) != len(pairs):
            raise RuntimeError("a request answered twice")
        for responder, response in pairs:
            responder.answered = True
            group = by_conn.get(responder._conn)
            if group is None:
                group = by_conn[responder._conn] = []
            group.append((responder._cmd, response))
        for conn, group in by_conn.items():
            conn._answer_many(group)
        for responder, response in pairs:
            responder._observe(response)


def _withdraw(trap: object) -> bool:
    """Undo what a coroutine registered before it yielded `trap` to trio, as trio does when the
    wait is cancelled: call the wait's abort function. True when nothing is left that could
    reschedule the task (trio's own primitives abort successfully)."""
    abort = getattr(trap, "abort_func", None)
    if abort is None:  # a checkpoint: nothing registered
        return True

    def raise_cancel() -> NoReturn:
        raise RuntimeError("an inline processor suspended")

    try:
        return bool(abort(raise_cancel) is trio.lowlevel.Abort.SUCCEEDED)
    except Exception:
        return False


def abandon(coro: Coroutine[Any, Any, object], trap: object) -> bool:
    """End a coroutine that suspended where it must not: withdraw its wait, then throw
    GeneratorExit into it, withdrawing any wait it starts while unwinding (a `finally` that
    awaits). False when a wait could not be withdrawn or it would not end."""
    clean = True
    for _ in range(_ABANDON_ROUNDS):
        clean = _withdraw(trap) and clean
        try:
            trap = coro.throw(GeneratorExit())
        except (GeneratorExit, StopIteration):
            return clean
        except Exception:
            log.exception("remoting_inline_processor_unwind_failed")
            return clean
    return False


# Waits an abandoned inline coroutine may start while it unwinds before it is given up on.
_ABANDON_ROUNDS = 8


def run_inline(
    processor: Processor, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | None:
    """Run an inline processor to its end as a connection's reader does, outside one (tools,
    tests).

    Raises:
        RuntimeError: it suspended (it is abandoned as the reader abandons it).
    """
    coro = processor(conn, cmd)
    try:
        trap = coro.send(None)
    except StopIteration as stop:
        result: RemotingCommand | None = stop.value
        return result
    abandon(coro, trap)
    raise RuntimeError(f"the inline processor of request code {cmd.code} suspended")

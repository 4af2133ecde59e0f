"""The protocol state of one connection, without I/O (sans-IO, as h11 is for HTTP).

`RemotingProtocol` turns received bytes into commands and commands into frame bytes, and keeps
the state the exchange depends on: the frame decoder, the header codec of the requests sent and
the peer's msgpack advert, the requests waiting for a response (by opaque) with their
deadlines, and the count of the peer's requests in flight. It never touches a socket, a clock
or a task: the transport (`remoting._connection.Connection`, on trio) feeds it the bytes it
reads and the current time, writes the bytes it returns, and wakes the tasks behind the
`Pending` objects it hands back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Generic, Protocol, TypeVar

import structlog

from common.deadlines import DeadlineHeap
from remoting._command import Body, RemotingCommand
from remoting._frame import FrameDecoder, encode_frame_parts
from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode, ResponseCode, SerializeType
from remoting.errors import RemotingTooManyRequestsError

__all__ = [
    "MSGPACK_ADVERT_FIELD",
    "Pending",
    "PendingBudget",
    "RemotingProtocol",
    "opaque_counter",
]

log = structlog.get_logger()

Parts = tuple[bytes, Body | None]

_OPAQUE_MASK = 0x7FFFFFFF
_MSGPACK = int(SerializeType.MSGPACK)
_PYTHON = int(LanguageCode.PYTHON)
# The response extFields entry by which a trimq server tells a trimq client the header codecs it
# reads (docs/protocol.md, "Choosing the header codec").
MSGPACK_ADVERT_FIELD = "trimqSerializeTypes"
_ADVERT_VALUE = "JSON,ROCKETMQ,MSGPACK"
# A caller may write its request itself while at most this many other requests are in flight
# (long polls aside); with more, the transport's writer joins the requests issued together.
_DIRECT_MAX_OTHERS = 3


def opaque_counter() -> Callable[[], int]:
    """A source of request ids: 0, 1, 2, ... wrapping within the positive int32 range."""
    counter = itertools.count()

    def next_opaque() -> int:
        return next(counter) & _OPAQUE_MASK

    return next_opaque


class PendingBudget:
    """A cap on requests waiting for a response, shared by the connections of one owner."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def acquire(self) -> None:
        if self.count >= self.limit:
            raise RemotingTooManyRequestsError(f"{self.count} requests already waiting")
        self.count += 1

    def release(self) -> None:
        self.count -= 1


class Pending(Protocol):
    """What the transport attaches to a request waiting for its response: `done` once it was
    finished (answered, timed out, failed), after which its deadline entry is dropped."""

    done: bool


P = TypeVar("P", bound=Pending)


class RemotingProtocol(Generic[P]):
    """One connection's protocol state (see the module docstring).

    Args:
        max_frame_size: frames declaring a larger length are a `FrameError`.
        max_inflight: the peer's requests in flight at most (`at_limit`).
        msgpack: read trimq's msgpack headers (False: RocketMQ's codecs only).
        advertise_msgpack: tell a trimq client sending another codec that this end reads
            msgpack (server side).
        serialize_type: header codec of the requests sent.
        upgrade_to_msgpack: switch `serialize_type` to msgpack once the peer advertises it
            (client side).
        next_opaque: request ids (shared by the connections of one owner).
        budget: cap on requests waiting for a response (shared likewise).
    """

    __slots__ = (
        "_advertise",
        "_budget",
        "_deadlines",
        "_next_opaque",
        "_pending",
        "_upgrade",
        "busy",
        "decoder",
        "long_polls",
        "max_inflight",
        "serialize_type",
    )

    def __init__(
        self,
        *,
        max_frame_size: int,
        max_inflight: int,
        msgpack: bool = True,
        advertise_msgpack: bool = False,
        serialize_type: int = SerializeType.MSGPACK,
        upgrade_to_msgpack: bool = False,
        next_opaque: Callable[[], int] | None = None,
        budget: PendingBudget | None = None,
    ) -> None:
        self.decoder = FrameDecoder(max_frame_size, msgpack=msgpack)
        self.serialize_type = int(serialize_type)
        self._upgrade = upgrade_to_msgpack
        self._advertise = advertise_msgpack and msgpack
        self._next_opaque = next_opaque or opaque_counter()
        self._budget = budget or PendingBudget(65536)
        self._pending: dict[int, P] = {}
        # Of those, requests the peer may hold until it has an answer (long polls).
        self.long_polls = 0
        # The pending requests by deadline (finished ones dropped lazily).
        self._deadlines: DeadlineHeap[P] = DeadlineHeap()
        # The peer's requests in flight (running, or deferred and not yet answered).
        self.busy = 0
        self.max_inflight = max_inflight

    # -- bytes in ----------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[RemotingCommand]:
        """The complete frames in `data` (and what came before it), decoded.

        Raises:
            FrameError: the peer broke the framing; the connection must close.
        """
        return self.decoder.feed(data)

    @property
    def buffered(self) -> int:
        """Bytes received of a frame not yet complete."""
        return self.decoder.buffered

    def response_for(self, response: RemotingCommand) -> P | None:
        """The request `response` answers (no longer pending), or None when it answers none
        (late: timed out or never sent). Notes the peer's msgpack advert."""
        if self._upgrade and response.ext_fields is not None:
            self._upgrade_on_advert(response.ext_fields)
        return self._pending.pop(response.opaque, None)

    def _upgrade_on_advert(self, ext: Mapping[str, str]) -> None:
        codecs = ext.get(MSGPACK_ADVERT_FIELD)
        if codecs is not None and "MSGPACK" in codecs.split(","):
            self._upgrade = False
            self.serialize_type = _MSGPACK
            log.debug("remoting_header_codec_upgraded")

    # -- requests out ------------------------------------------------------------------------
    def start_request(self, cmd: RemotingCommand, pending: P, long_poll: bool) -> Parts:
        """Register `cmd` as waiting for its response (sets its opaque, clears the oneway and
        response flags) and encode it. End it with `end_request` whatever happens.

        Raises:
            RemotingTooManyRequestsError: too many requests are already waiting.
            ValueError: it cannot be encoded (nothing is registered).
        """
        self._budget.acquire()
        opaque = self._next_opaque()
        cmd.opaque = opaque
        cmd.flag &= ~(FLAG_ONEWAY | FLAG_RESPONSE)
        try:
            parts = encode_frame_parts(cmd)
        except BaseException:
            self._budget.release()
            raise
        self._pending[opaque] = pending
        if long_poll:
            self.long_polls += 1
        return parts

    def may_write_directly(self, long_poll: bool) -> bool:
        """Whether a request just started may be written by its caller rather than queued to
        the writer: at most a few others in flight, parked long polls aside."""
        others = len(self._pending) - self.long_polls - (0 if long_poll else 1)
        return others <= _DIRECT_MAX_OTHERS

    def set_deadline(self, pending: P, deadline: float) -> bool:
        """`expire` hands `pending` back once the clock passes `deadline` unless it is done by
        then. True when that is earlier than every other deadline (re-arm the timer)."""
        return self._deadlines.push(deadline, pending, len(self._pending))

    def end_request(self, cmd: RemotingCommand, pending: P, long_poll: bool) -> None:
        """The caller is done with a request started by `start_request`."""
        if long_poll:
            self.long_polls -= 1
        if self._pending.get(cmd.opaque) is pending:
            del self._pending[cmd.opaque]
        self._budget.release()

    def expire(self, now: float) -> list[P]:
        """The pending requests whose deadline is at or before `now` (their entries removed;
        finish them); `next_deadline` is then the earliest remaining one."""
        return self._deadlines.expire(now)

    @property
    def next_deadline(self) -> float:
        """The earliest deadline held (inf: none)."""
        return self._deadlines.next_deadline

    def fail_all(self) -> list[P]:
        """Every request still waiting (the connection ended); none is pending after."""
        pending, self._pending = self._pending, {}
        return list(pending.values())

    @property
    def waiting(self) -> int:
        """Requests waiting for a response."""
        return len(self._pending)

    def oneway(self, cmd: RemotingCommand) -> Parts:
        """Encode `cmd` as a request the peer does not answer (sets its opaque and flags).

        Raises:
            ValueError: it cannot be encoded.
        """
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        return encode_frame_parts(cmd)

    # -- the peer's requests -----------------------------------------------------------------
    @property
    def at_limit(self) -> bool:
        """As many of the peer's requests in flight as allowed: read no more of them."""
        return self.busy >= self.max_inflight

    def admit(self) -> None:
        """A request of the peer is in flight (running, or deferred)."""
        self.busy += 1

    def release(self) -> None:
        """A request of the peer left."""
        self.busy -= 1

    def encode_response(self, cmd: RemotingCommand, response: RemotingCommand) -> Parts:
        """Mark `response` as the answer to `cmd` and encode it (a SYSTEM_ERROR answer if it
        cannot be encoded)."""
        if self._advertise and cmd.serialize_type != _MSGPACK and cmd.language == _PYTHON:
            # A trimq client starts in JSON, which every RocketMQ server reads, and moves to
            # msgpack when an answer carries this field. Other clients (Java, C++, Go) never
            # see it; to a Python client that is not trimq it is an unknown field, ignored.
            ext = response.ext_fields
            response.ext_fields = (
                {MSGPACK_ADVERT_FIELD: _ADVERT_VALUE}
                if ext is None
                else {**ext, MSGPACK_ADVERT_FIELD: _ADVERT_VALUE}
            )
        response.opaque = cmd.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = cmd.serialize_type
        try:
            return encode_frame_parts(response)
        except ValueError as exc:
            log.exception("remoting_response_unencodable", code=cmd.code, opaque=cmd.opaque)
            fallback = cmd.make_response(
                ResponseCode.SYSTEM_ERROR, f"response could not be encoded: {exc}"
            )
            fallback.opaque = cmd.opaque
            fallback.flag |= FLAG_RESPONSE
            return encode_frame_parts(fallback)

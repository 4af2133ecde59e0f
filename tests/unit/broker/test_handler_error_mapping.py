"""`guarded_inline` / `guarded_send_inline`: the error mapping of `guarded` for inline handlers,
in their synchronous part and in the awaitable they may return."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, cast

import pytest

from broker.processors._common import InlineResult, guarded_inline, guarded_send_inline
from remoting import Connection, HeaderError, RemotingCommand, ResponseCode


class _Conn:
    remote_address = "192.0.2.1:1"


CONN = cast(Connection, _Conn())


class Family:
    def __init__(self, exc: Exception | None, later: bool) -> None:
        self.exc = exc
        self.later = later

    def region_fields(self) -> dict[str, str]:
        return {"MSG_REGION": "R", "TRACE_ON": "true"}

    def _run(self, cmd: RemotingCommand) -> InlineResult:
        if not self.later:
            if self.exc is not None:
                raise self.exc
            return cmd.make_response(ResponseCode.SUCCESS)

        async def slow() -> RemotingCommand:
            if self.exc is not None:
                raise self.exc
            return cmd.make_response(ResponseCode.SUCCESS)

        return slow()

    @guarded_inline()
    def plain(self, conn: Connection, cmd: RemotingCommand) -> InlineResult:
        return self._run(cmd)

    @guarded_send_inline
    def send(self, conn: Connection, cmd: RemotingCommand) -> InlineResult:
        return self._run(cmd)


async def answer(result: InlineResult) -> RemotingCommand:
    if not isinstance(result, RemotingCommand):
        assert result is not None
        result = await cast(Awaitable[RemotingCommand], result)
    assert isinstance(result, RemotingCommand)
    return result


@pytest.mark.parametrize("later", [False, True])
@pytest.mark.parametrize(
    ("exc", "plain_code", "send_code", "remark"),
    [
        (None, ResponseCode.SUCCESS, ResponseCode.SUCCESS, None),
        (HeaderError("topic", "missing"), 1, ResponseCode.MESSAGE_ILLEGAL, "bad request header"),
        (ValueError("bad number"), 1, 1, "bad request: bad number"),
        (RuntimeError("boom"), 1, 1, "RuntimeError: boom"),
    ],
)
async def test_error_mapping(
    later: bool, exc: Exception | None, plain_code: int, send_code: int, remark: Any
) -> None:
    fam = Family(exc, later)
    cmd = RemotingCommand.request(10, {})
    # Inline when it can be: a command now, a coroutine only for the slow path.
    first = fam.plain(CONN, cmd)
    assert isinstance(first, RemotingCommand) is (not later)
    plain = await answer(first)
    send = await answer(fam.send(CONN, cmd))
    assert plain.code == plain_code
    assert send.code == send_code
    if remark is not None:
        assert plain.remark is not None
        assert plain.remark.startswith(remark)
        assert send.ext_fields == {"MSG_REGION": "R", "TRACE_ON": "true"}

"""`guarded` / `guarded_send`: a processor's exceptions become answers, the same whether it runs
inline (its coroutine run to the end by the reader) or in a task (awaited, after a suspension)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio

from broker.processors._common import guarded, guarded_send
from remoting import Connection, HeaderError, RemotingCommand, ResponseCode
from tests.helpers import call_inline


class _Conn:
    remote_address = "192.0.2.1:1"


CONN = cast(Connection, _Conn())


class Family:
    def __init__(self, exc: Exception | None, suspend: bool) -> None:
        self.exc = exc
        self.suspend = suspend

    def region_fields(self) -> dict[str, str]:
        return {"MSG_REGION": "R", "TRACE_ON": "true"}

    async def _run(self, cmd: RemotingCommand) -> RemotingCommand:
        if self.suspend:
            await trio.lowlevel.checkpoint()
        if self.exc is not None:
            raise self.exc
        return cmd.make_response(ResponseCode.SUCCESS)

    @guarded()
    async def plain(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        return await self._run(cmd)

    @guarded_send
    async def send(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        return await self._run(cmd)


@pytest.mark.parametrize("suspend", [False, True])
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
    suspend: bool, exc: Exception | None, plain_code: int, send_code: int, remark: Any
) -> None:
    fam = Family(exc, suspend)
    cmd = RemotingCommand.request(10, {})
    if suspend:  # a task processor
        plain = await fam.plain(CONN, cmd)
        send = await fam.send(CONN, cmd)
    else:  # an inline one
        plain = call_inline(fam.plain, CONN, cmd)
        send = call_inline(fam.send, CONN, cmd)
    assert plain is not None
    assert send is not None
    assert plain.code == plain_code
    assert send.code == send_code
    if remark is not None:
        assert plain.remark is not None
        assert plain.remark.startswith(remark)
        assert send.ext_fields == {"MSG_REGION": "R", "TRACE_ON": "true"}


def test_an_inline_processor_that_suspends_is_caught() -> None:
    fam = Family(None, suspend=True)
    with pytest.raises(AssertionError, match="suspended"):
        call_inline(fam.plain, CONN, RemotingCommand.request(10, {}))

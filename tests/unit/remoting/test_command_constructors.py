"""The codecs' positional command constructor builds exactly what the keyword one does."""

from __future__ import annotations

import pytest

from remoting import RemotingCommand, encode_frame
from remoting._command import new_command
from remoting._frame import FrameDecoder
from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode, SerializeType

SLOTS = RemotingCommand.__slots__


def _state(cmd: RemotingCommand) -> dict[str, object]:
    return {name: getattr(cmd, name) for name in SLOTS}


def test_new_command_sets_every_slot_like_the_constructor() -> None:
    fast = new_command(12, 5, 1, "r", {"k": "v"}, b"b", 3, 409, SerializeType.JSON)
    slow = RemotingCommand(
        12,
        opaque=5,
        flag=1,
        remark="r",
        ext_fields={"k": "v"},
        body=b"b",
        language=3,
        version=409,
        serialize_type=SerializeType.JSON,
    )
    assert _state(fast) == _state(slow)


@pytest.mark.parametrize("oneway", [False, True])
def test_request_and_response_keep_their_defaults(oneway: bool) -> None:
    fields = {"a": "1"}
    req = RemotingCommand.request(310, fields, b"x", oneway=oneway)
    assert req.ext_fields == fields
    assert req.ext_fields is not fields  # still a copy of the caller's map
    assert (req.opaque, req.remark, req.language, req.version) == (
        0,
        None,
        LanguageCode.PYTHON,
        409,
    )
    assert req.flag == (FLAG_ONEWAY if oneway else 0)
    assert req.serialize_type == SerializeType.MSGPACK
    req.opaque = 9
    resp = req.make_response(1, "no", {"x": "y"})
    assert _state(resp) == _state(
        RemotingCommand(
            1,
            opaque=9,
            flag=FLAG_RESPONSE,
            remark="no",
            ext_fields={"x": "y"},
            serialize_type=SerializeType.MSGPACK,
        )
    )


@pytest.mark.parametrize(
    "serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ, SerializeType.MSGPACK]
)
def test_decoded_commands_carry_every_field(serialize_type: int) -> None:
    cmd = RemotingCommand(
        310,
        opaque=77,
        flag=FLAG_ONEWAY,
        remark="remark",
        ext_fields={"a": "pg", "b": "T"},
        body=b"body",
        language=LanguageCode.JAVA,
        version=373,
        serialize_type=serialize_type,
    )
    (back,) = FrameDecoder().feed(encode_frame(cmd))
    assert _state(back) == _state(cmd)

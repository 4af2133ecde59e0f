"""Native frame codec, msgpack/ROCKETMQ header codecs and typed-header decoder
(remoting/_speedups.c); see remoting._header_codec."""

from collections.abc import Callable, Mapping
from typing import Any

from remoting._command import Body, RemotingCommand

def setup(
    cmd_type: type[RemotingCommand],
    py_decode_header: Callable[[int, bytes], RemotingCommand],
    py_encode_header: Callable[[RemotingCommand], bytes],
    frame_error: type[Exception],
    too_large_error: type[Exception],
    lang_valid: tuple[int, ...],
    lang_other: int,
    lang_names: tuple[str | None, ...],
    /,
) -> None: ...
def parse_frames(
    src: bytes | bytearray | memoryview, max_len: int, out: list[RemotingCommand], /
) -> int: ...
def decode_header(serialize_type: int, data: bytes, /) -> RemotingCommand: ...
def encode_header(cmd: RemotingCommand, /) -> bytes: ...
def encode_frame_parts(cmd: RemotingCommand, /) -> tuple[bytes, Body | None]: ...

class FieldsDecoder:
    """A typed header from an extFields dict; uncommon input goes to `fallback`."""

    def __init__(
        self,
        cls: type[Any],
        table: tuple[tuple[str, str, int, bool, object], ...],
        fallback: Callable[[type[Any], Mapping[str, str] | None], Any],
        /,
    ) -> None: ...
    def __call__(self, cls: type[Any], fields: Mapping[str, str] | None, /) -> Any: ...

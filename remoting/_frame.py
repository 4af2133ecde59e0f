"""Sans-IO frame codec: `FrameDecoder` turns received bytes into RemotingCommands, `encode_frame`
turns a command into the bytes to send.

A frame is `[int32 length][int32 (serializeType << 24) | headerLen][header][body]`, where
`length` counts everything after itself (so it is at least 4). See docs/protocol.md.

With the C extension `remoting._speedups` (see remoting._header_codec), `encode_frame_parts` and
the frame loop of `FrameDecoder.feed` are native; `py_encode_frame_parts` and `py_parse_frames`
are the pure-Python reference they must match byte for byte and error for error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from remoting._command import Body, RemotingCommand
from remoting._header_codec import native, py_decode_header, py_encode_header
from remoting.codes import SerializeType
from remoting.errors import FrameError, FrameTooLargeError

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FrameDecoder",
    "encode_frame",
    "encode_frame_parts",
    "py_encode_frame_parts",
    "py_parse_frames",
]

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024

_PREFIX = struct.Struct(">iI")  # length, header word
_PREFIX_SIZE = _PREFIX.size
_unpack_prefix = _PREFIX.unpack_from
_unpack_length = struct.Struct(">i").unpack_from
_pack_prefix = _PREFIX.pack
_MAX_HEADER_LEN = 0xFFFFFF
_MSGPACK = int(SerializeType.MSGPACK)


def py_encode_frame_parts(cmd: RemotingCommand) -> tuple[bytes, Body | None]:
    """The frame as (length + header word + header, body), so a writer can join many at once.

    Raises:
        ValueError: the header cannot be encoded, or the frame is too large to describe.
    """
    header = py_encode_header(cmd)
    header_len = len(header)
    if header_len > _MAX_HEADER_LEN:
        raise ValueError(f"header of {header_len} bytes does not fit in 24 bits")
    body = cmd.body
    body_len = 0 if body is None else len(body)
    length = 4 + header_len + body_len
    if length > 0x7FFFFFFF:
        raise ValueError(f"frame of {length} bytes does not fit in int32")
    prefix = _pack_prefix(length, (cmd.serialize_type << 24) | header_len)
    if not body_len:
        body = None
    return prefix + header, body


def py_parse_frames(src: bytes | memoryview, max_len: int, out: list[RemotingCommand]) -> int:
    """Decode every complete frame in `src` into `out`; return the bytes consumed.

    Raises:
        FrameTooLargeError: a frame declares a length above `max_len`.
        FrameError: a frame has an impossible length or an undecodable header.
    """
    end = len(src)
    pos = 0
    while end - pos >= 4:
        if end - pos >= _PREFIX_SIZE:
            length, word = _unpack_prefix(src, pos)
        else:
            (length,) = _unpack_length(src, pos)
            word = 0
        if length > max_len:
            raise FrameTooLargeError(f"frame length {length} above the maximum {max_len}")
        if length < 4:
            raise FrameError(f"frame length {length} is below 4")
        frame_end = pos + 4 + length
        if frame_end > end:
            break
        header_len = word & 0xFFFFFF
        if header_len > length - 4:
            raise FrameError(f"header length {header_len} exceeds frame length {length}")
        header_start = pos + _PREFIX_SIZE
        body_start = header_start + header_len
        cmd = py_decode_header(word >> 24, bytes(src[header_start:body_start]))
        if body_start < frame_end:
            cmd.body = bytes(src[body_start:frame_end])
        out.append(cmd)
        pos = frame_end
    return pos


encode_frame_parts: Callable[[RemotingCommand], tuple[bytes, Body | None]] = py_encode_frame_parts
_parse_frames: Callable[[bytes | memoryview, int, list[RemotingCommand]], int] = py_parse_frames
if native is not None:
    encode_frame_parts = native.encode_frame_parts
    _parse_frames = native.parse_frames


def encode_frame(cmd: RemotingCommand) -> bytes:
    """Encode `cmd` as one frame, header in `cmd.serialize_type`.

    Args:
        cmd: the command to encode.

    Returns:
        The frame bytes.

    Raises:
        ValueError: the header cannot be encoded, or the frame is too large to describe.
    """
    head, body = encode_frame_parts(cmd)
    if body is None:
        return head
    return b"".join((head, body))


class FrameDecoder:
    """Incremental frame decoder.

    Feed it whatever the socket returned; it returns the complete commands and keeps the rest.
    Once it has raised, the stream is unusable and the connection should be closed.

    Args:
        max_frame_size: largest accepted `length` field; larger raises `FrameTooLargeError`
            as soon as the length is seen, before any of the body is buffered.
        msgpack: accept trimq's msgpack headers; False reads only RocketMQ's own codecs (JSON
            and ROCKETMQ) and fails a msgpack frame as an unknown serialize type, as an Apache
            peer does.
    """

    __slots__ = ("_buf", "_max", "_msgpack")

    def __init__(
        self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, *, msgpack: bool = True
    ) -> None:
        self._buf = bytearray()
        self._max = max_frame_size
        self._msgpack = msgpack

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Add received bytes; return the commands completed by them (possibly none).

        Raises:
            FrameTooLargeError: a frame declares a length above the maximum.
            FrameError: a frame has an impossible length or an undecodable header.
        """
        buf = self._buf
        out: list[RemotingCommand] = []
        if buf:
            buf += data
            view = memoryview(buf)
            try:
                pos = _parse_frames(view, self._max, out)
            finally:
                view.release()
            if pos:
                # bytearray drops a prefix in amortised O(1) (it moves its start pointer).
                del buf[:pos]
        else:
            # Fast path: nothing pending, parse straight from the received bytes.
            src = data if type(data) is bytes else bytes(data)
            pos = _parse_frames(src, self._max, out)
            if pos < len(src):
                buf += src[pos:] if pos else src
        if not self._msgpack:
            for cmd in out:
                if cmd.serialize_type == _MSGPACK:
                    raise FrameError(f"unknown serialize type {_MSGPACK}")
        return out

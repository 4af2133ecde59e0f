"""The HA wire codec without I/O: reports, frame headers, and readers fed split input."""

from __future__ import annotations

import struct

import pytest

from broker.ha import (
    FRAME_HEADER_SIZE,
    MAX_FRAME_BODY,
    FrameReader,
    HAProtocolError,
    ReportReader,
    encode_frame_header,
    encode_report,
    parse_addr,
)


def test_report_is_a_big_endian_int64() -> None:
    assert encode_report(0) == bytes(8)
    assert encode_report(0x0102030405060708) == bytes(range(1, 9))
    assert encode_report(2**63 - 1) == b"\x7f" + b"\xff" * 7
    for bad in (-1, 2**63):
        with pytest.raises(ValueError):
            encode_report(bad)


def test_frame_header_layout() -> None:
    assert FRAME_HEADER_SIZE == 12
    assert encode_frame_header(0x0102030405060708, 0x0A0B0C0D) == bytes(range(1, 9)) + bytes(
        [10, 11, 12, 13]
    )
    assert encode_frame_header(5, 0) == struct.pack(">qi", 5, 0)
    for off, size in ((-1, 0), (0, -1), (0, 2**31)):
        with pytest.raises(ValueError):
            encode_frame_header(off, size)


def test_report_reader_split_at_every_position_keeps_the_latest() -> None:
    stream = encode_report(7) + encode_report(1 << 40) + encode_report(123_456)
    for cut in range(len(stream) + 1):
        for cut2 in range(cut, len(stream) + 1):
            reader = ReportReader()
            seen = [reader.feed(stream[:cut]), reader.feed(stream[cut:cut2])]
            seen.append(reader.feed(stream[cut2:]))
            got = [v for v in seen if v is not None]
            # The last read that completes a value reports the newest complete one.
            assert got[-1] == 123_456
            assert reader.pending == 0
            for part_end, value in zip((cut, cut2), seen[:2], strict=True):
                if value is not None:
                    assert value == [7, 1 << 40, 123_456][part_end // 8 - 1]


def test_report_reader_byte_by_byte_and_partial_remainder() -> None:
    reader = ReportReader()
    data = encode_report(99) + encode_report(100)[:5]
    out = [reader.feed(data[i : i + 1]) for i in range(len(data))]
    assert out[7] == 99
    assert [v for i, v in enumerate(out) if i != 7] == [None] * (len(data) - 1)
    assert reader.pending == 5
    assert reader.feed(encode_report(100)[5:]) == 100
    assert reader.feed(b"") is None
    # A negative value is decoded as sent; the master decides what to do with it.
    assert reader.feed(b"\xff" * 8) == -1


def _frames() -> tuple[bytes, list[tuple[int, bytes]]]:
    frames = [(0, b"abc"), (3, b""), (3, bytes(range(40))), (1 << 33, b"z" * 17)]
    return b"".join(encode_frame_header(o, len(b)) + b for o, b in frames), frames


def test_frame_reader_split_at_every_position() -> None:
    stream, frames = _frames()
    for cut in range(len(stream) + 1):
        for cut2 in range(cut, len(stream) + 1):
            reader = FrameReader()
            got = reader.feed(stream[:cut]) + reader.feed(stream[cut:cut2])
            got += reader.feed(stream[cut2:])
            assert got == frames
            assert reader.pending == 0


def test_frame_reader_byte_by_byte() -> None:
    stream, frames = _frames()
    reader = FrameReader()
    got: list[tuple[int, bytes]] = []
    for i in range(len(stream)):
        got += reader.feed(stream[i : i + 1])
    assert got == frames


@pytest.mark.parametrize(
    "header",
    [
        struct.pack(">qi", 0, -1),
        struct.pack(">qi", 0, MAX_FRAME_BODY + 1),
        struct.pack(">qi", 0, 2**31 - 1),
        struct.pack(">qi", -5, 3),
    ],
)
def test_frame_reader_refuses_bad_headers_before_buffering_the_body(header: bytes) -> None:
    reader = FrameReader()
    assert reader.feed(header[:11]) == []
    with pytest.raises(HAProtocolError):
        reader.feed(header[11:] + b"x" * 100)
    assert reader.pending == 0
    # Once failed, the stream stays refused.
    with pytest.raises(HAProtocolError):
        reader.feed(encode_frame_header(0, 0))


def test_frame_reader_cap_is_configurable_and_bounds_the_buffer() -> None:
    reader = FrameReader(max_body=16)
    assert reader.feed(encode_frame_header(0, 16) + b"a" * 10) == []
    assert reader.pending == 22
    assert reader.feed(b"b" * 6) == [(0, b"a" * 10 + b"b" * 6)]
    with pytest.raises(HAProtocolError):
        reader.feed(encode_frame_header(16, 17))


def test_parse_addr() -> None:
    assert parse_addr("127.0.0.1:10912") == ("127.0.0.1", 10912)
    assert parse_addr("[::1]:1") == ("::1", 1)
    assert parse_addr(" host.example:65535 ") == ("host.example", 65535)
    for bad in ("", "host", ":1", "h:0", "h:65536", "h:x", "h:-1"):
        with pytest.raises(ValueError):
            parse_addr(bad)

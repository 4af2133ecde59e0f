"""Fuzz of the decoders a peer's bytes reach: frames, headers, typed headers, bodies.

Valid input is mutated (bit flips, truncation, length words overwritten, random insertions,
deletions, duplicated slices) and fed to:

- `FrameDecoder` (`parse_frames`, native and Python) in random chunks, and every header codec
  (`decode_header`, native and Python, also under the wrong serialize type): FrameError only;
- the typed headers' `from_fields` (native `FieldsDecoder` and the generated Python decoder)
  with random extFields maps and with the extFields of the fuzzed frames: HeaderError only;
- the JSON bodies of remoting/protocol/bodies.py and route.py (`from_json`, and
  `RegisterBrokerBody.decode` in both forms): ValueError only (RouteDecodeError is one).

Native and Python must agree (the same command, header or exception type and message).
A segfault in the native code fails `test_native_decoders_survive_a_mutation_campaign`, which
runs a seeded campaign over every native decoder in a child process (run this module as
`python -m tests.unit.remoting.test_hostile_bytes SEED COUNT` to replay one); the in-process
tests run under pytest's faulthandler, so a crash there also ends the run with a traceback and
a failure.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import FrameError, HeaderError, RemotingCommand, SerializeType
from remoting._frame import py_parse_frames
from remoting._header_codec import py_decode_header, py_encode_header
from remoting.protocol import bodies, route
from tests.unit.remoting import test_answer_bodies_apache5, test_json_bodies, test_route_bodies
from tests.unit.remoting.test_native_codec_matches_python import (
    NATIVE,
    ROOT,
    _feed_all,
    _frame_bytes,
    _outcome,
    _same_command_outcome,
    valid_commands,
)
from tests.unit.remoting.test_native_header_fields_match_python import TABLES, field_maps
from tests.unit.remoting.test_native_header_fields_match_python import _outcome as _header_outcome

pytestmark = pytest.mark.unit

_SERIALIZE_TYPES = (
    int(SerializeType.JSON),
    int(SerializeType.ROCKETMQ),
    int(SerializeType.MSGPACK),
)
# Words a length field is overwritten with: the edges of int32 and of small sizes.
_WORDS = [0, 1, 3, 4, 5, 0x7F, 0xFF, 0xFFFF, 0xFFFFFF, 0x1000000, 0x7FFFFFFF, 0x80000000, 2**32 - 1]
# Bytes that mean something to one of the codecs.
_TOKENS = [
    b"{", b"}", b"[", b"]", b'"', b"\\", b":", b",", b"\\u", b"\\ud800", b"null", b"true", b"-",
    b"1e999", b"9" * 30, b"\x00", b"\xff", b"\xc0", b"\xdf", b"\xdb\xff\xff\xff\xff",
    b"\x80", b"\xe9", b"\xed\xa0\x80", b'{"a":', b"[" * 200, b"[" * 5000, b'{"a":' * 3000,
]  # fmt: skip


def mutate(data: bytes, rnd: random.Random, rounds: int) -> bytes:
    """`data` changed `rounds` times; frames (`[length][header word]...`) get their two
    leading words overwritten more often than other positions."""
    buf = bytearray(data)
    for _ in range(rounds):
        op = rnd.randrange(7)
        at = rnd.randrange(len(buf) + 1)
        if op == 0 and buf:  # one bit
            i = min(at, len(buf) - 1)
            buf[i] ^= 1 << rnd.randrange(8)
        elif op == 1:  # truncation
            del buf[at:]
        elif op == 2:  # random bytes inserted
            buf[at:at] = rnd.randbytes(rnd.randrange(1, 9))
        elif op == 3:  # a meaningful token inserted
            buf[at:at] = rnd.choice(_TOKENS)
        elif op == 4 and buf:  # a slice removed or repeated
            end = min(len(buf), at + rnd.randrange(1, 17))
            if rnd.random() < 0.5:
                del buf[at:end]
            else:
                buf[at:at] = buf[at:end]
        elif op == 5 and len(buf) >= 4:  # a length word overwritten
            pos = rnd.choice([0, 4, 0, 4, rnd.randrange(len(buf) - 3)])
            pos = min(pos, len(buf) - 4)
            word = rnd.choice(_WORDS) if rnd.random() < 0.7 else rnd.randrange(2**32)
            if rnd.random() < 0.3:
                word = (word + rnd.choice([-1, 1, len(buf)])) % 2**32
            buf[pos : pos + 4] = word.to_bytes(4, "big")
        elif buf:  # one byte replaced
            buf[min(at, len(buf) - 1)] = rnd.randrange(256)
    return bytes(buf)


def _chunks(data: bytes, rnd: random.Random) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        step = rnd.choice([1, 3, 7, 64, 4096])
        out.append(data[pos : pos + step])
        pos += step
    return out


# --- frames and headers -----------------------------------------------------------------------


def _check_stream(stream: bytes, rnd: random.Random) -> list[RemotingCommand]:
    """Feed `stream` to a native and a Python FrameDecoder: the same commands, the same error
    (a FrameError); the commands decoded."""
    chunks = _chunks(stream, rnd)
    max_len = rnd.choice([64, 1 << 24])
    native = _feed_all(NATIVE.parse_frames, chunks, max_len)
    python = _feed_all(py_parse_frames, chunks, max_len)
    assert native == python
    if native[1][0] == "err":
        assert issubclass(native[1][1][0], FrameError), native[1]
    out: list[RemotingCommand] = []
    py_parse_frames(stream[: _whole_frames(stream, max_len)], max_len, out)
    return out


def _whole_frames(stream: bytes, max_len: int) -> int:
    try:
        return py_parse_frames(stream, max_len, [])
    except FrameError:
        return 0


def _check_header(raw: bytes, serialize_type: int) -> None:
    native = _outcome(NATIVE.decode_header, serialize_type, raw)
    python = _outcome(py_decode_header, serialize_type, raw)
    _same_command_outcome(native, python)
    if native[0] == "err":
        assert issubclass(native[1][0], FrameError), native[1]


def _check_typed(cls: type[Any], table: Any, py_decode: Any, fields: Any) -> None:
    """The native FieldsDecoder and the Python decoder agree; only HeaderError is raised for
    a map of str to str (what every header codec yields)."""
    from remoting.protocol import headers

    decoder = headers.native_decoder(NATIVE, cls, table, py_decode)
    native = _header_outcome(decoder, cls, fields)
    python = _header_outcome(py_decode, cls, fields)
    assert native == python
    if native[0] == "err" and all(type(v) is str for v in (fields or {}).values()):
        assert native[1][0] is HeaderError, native[1]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(valid_commands(), min_size=1, max_size=3), st.randoms(use_true_random=False))
def test_mutated_frames_give_the_same_frame_error_or_commands(
    cmds: list[RemotingCommand], rnd: random.Random
) -> None:
    stream = mutate(b"".join(_frame_bytes(c) for c in cmds), rnd, rnd.randrange(1, 6))
    for cmd in _check_stream(stream, rnd):
        if cmd.ext_fields is not None:  # a fuzzed frame's extFields into a typed header
            _check_typed(*rnd.choice(TABLES), cmd.ext_fields)


@settings(max_examples=300, deadline=None)
@given(valid_commands(), st.randoms(use_true_random=False), st.sampled_from(_SERIALIZE_TYPES))
def test_mutated_headers_give_the_same_frame_error_or_command(
    cmd: RemotingCommand, rnd: random.Random, read_as: int
) -> None:
    raw = py_encode_header(cmd)
    _check_header(mutate(raw, rnd, rnd.randrange(1, 5)), cmd.serialize_type)
    _check_header(raw, read_as)  # another codec's bytes


# Keys a typed header reads, and others; values that parse, do not, or leave a type's range.
_WIRE = sorted({row[1] for _, table, _ in TABLES for row in table})
_VALUE = st.one_of(
    st.text(max_size=8),
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from(["", "true", "TRUE", "-", "+1", " 1", "1_0", "٣", "2147483648", "-0"]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(TABLES),
    st.dictionaries(st.one_of(st.sampled_from(_WIRE), st.text(max_size=4)), _VALUE, max_size=16),
    st.data(),
)
def test_typed_headers_from_random_ext_fields(
    entry: tuple[type[Any], Any, Any], fields: dict[str, str], data: st.DataObject
) -> None:
    cls, table, py_decode = entry
    _check_typed(cls, table, py_decode, fields)
    _check_typed(cls, table, py_decode, data.draw(field_maps(table)))


# --- bodies -----------------------------------------------------------------------------------


def _body_classes() -> list[type[Any]]:
    out = []
    for module in (bodies, route):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and hasattr(obj, "from_json"):
                out.append(obj)
    return out


BODY_CLASSES = _body_classes()
_REGISTER = route.RegisterBrokerBody.from_json(test_route_bodies.REGISTER_JSON)
BODY_SEEDS = [
    test_json_bodies.JAVA_HEARTBEAT,
    test_route_bodies.ROUTE_JSON,
    test_route_bodies.REGISTER_JSON,
    test_answer_bodies_apache5.APACHE_ROUTE_FASTJSON,
    test_answer_bodies_apache5.APACHE_STATIC_ROUTE,
    test_answer_bodies_apache5.APACHE_CLUSTER_INFO,
    test_answer_bodies_apache5.APACHE_CONSUME_STATS,
    test_answer_bodies_apache5.APACHE_GROUP,
    b'{"consumerIdList":["a@1","b@2"]}',
    b'{"offsetTable":{0:12,"1":13},"topicList":["T"],"table":{"k":"v"}}',
    b"[]",
    b"",
]


def _check_body(decode: Callable[[], object], cls: type[Any]) -> None:
    try:
        result = decode()
    except ValueError:
        return
    assert isinstance(result, cls)


def test_body_classes_are_found() -> None:
    names = {c.__name__ for c in BODY_CLASSES}
    assert {"HeartbeatData", "TopicRouteData", "RegisterBrokerBody", "ConsumeStats"} <= names


@pytest.mark.parametrize("text", [b"[" * 5000, b'{"a":' * 5000, b"{0:" * 5000])
def test_deeply_nested_bodies_are_a_value_error(text: bytes) -> None:
    for cls in BODY_CLASSES:  # json.loads raised RecursionError through every from_json
        with pytest.raises(ValueError, match="nests too deeply"):
            cls.from_json(text)


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(BODY_CLASSES),
    st.sampled_from(BODY_SEEDS),
    st.randoms(use_true_random=False),
)
def test_mutated_bodies_decode_or_raise_value_error(
    cls: type[Any], seed: bytes, rnd: random.Random
) -> None:
    data = mutate(seed, rnd, rnd.randrange(0, 4))
    _check_body(lambda: cls.from_json(data), cls)
    if cls is route.RegisterBrokerBody:
        packed = mutate(_REGISTER.encode_compressed(), rnd, rnd.randrange(1, 4))
        _check_body(lambda: route.RegisterBrokerBody.decode(packed, compressed=True), cls)


# --- the native decoders in a child process: a segfault is a failure, not a lost run ----------


def campaign(seed: int, count: int) -> int:
    """`count` mutated frames, headers and extFields maps through the native decoders and
    their Python references (asserting they agree); returns the number of inputs."""
    rnd = random.Random(seed)
    seeds = [
        RemotingCommand(
            rnd.randrange(-(2**15), 2**15),
            opaque=rnd.randrange(2**31),
            remark=rnd.choice([None, "", "remark é", "x" * 40]),
            ext_fields={w: rnd.choice(["0", "-1", "2147483647", "true", "T", "é"]) for w in _WIRE}
            if rnd.random() < 0.8
            else None,
            body=rnd.choice([None, b"body", rnd.randbytes(50)]),
            serialize_type=st_type,
        )
        for st_type in _SERIALIZE_TYPES
        for _ in range(4)
    ]
    done = 0
    for _ in range(count):
        cmd = rnd.choice(seeds)
        frames = b"".join(_frame_bytes(rnd.choice(seeds)) for _ in range(rnd.randrange(1, 3)))
        for decoded in _check_stream(mutate(frames, rnd, rnd.randrange(1, 6)), rnd):
            if decoded.ext_fields is not None:
                _check_typed(*rnd.choice(TABLES), decoded.ext_fields)
        raw = py_encode_header(cmd)
        _check_header(mutate(raw, rnd, rnd.randrange(1, 5)), rnd.choice(_SERIALIZE_TYPES))
        fields = {
            rnd.choice(_WIRE): mutate(
                rnd.choice([b"12", b"-2147483649", b"true", b"x"]), rnd, 1
            ).decode("utf-8", "replace")
            for _ in range(rnd.randrange(12))
        }
        _check_typed(*rnd.choice(TABLES), fields)
        done += 3
    return done


_CAMPAIGN = 8000


def test_native_decoders_survive_a_mutation_campaign() -> None:
    seed = random.randrange(2**32)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "tests.unit.remoting.test_hostile_bytes",
            str(seed),
            str(_CAMPAIGN),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (
        f"native decoders failed (exit {proc.returncode}) on campaign seed {seed}; replay with "
        f"`python -m tests.unit.remoting.test_hostile_bytes {seed} {_CAMPAIGN}`\n"
        f"{proc.stderr[-3000:]}"
    )
    assert proc.stdout.startswith("inputs "), proc.stdout
    assert time.monotonic() - started < 60


if __name__ == "__main__":
    print(f"inputs {campaign(int(sys.argv[1]), int(sys.argv[2]))}")

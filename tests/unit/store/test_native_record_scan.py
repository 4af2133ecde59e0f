"""Recovery's record checks natively (`common.speedups.check_record` / `scan_records`) against
the Python reference (`common.message._py_check_record`, `store._recovery.RecordScanner`'s own
loop): the same outcome, end and requests, field for field, for valid and damaged bytes.

Native against Python only when the accelerators are in use (built, and TRIMQ_NO_NATIVE not
set); otherwise only the test of which path is selected runs.
"""

from __future__ import annotations

import random
import sys
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import pytest

import store._recovery as rec
from common import message as m
from common.message import (
    BLANK_MAGIC_CODE,
    COMPRESSED_FLAG,
    INNER_BATCH_FLAG,
    MESSAGE_MAGIC_CODE,
    MULTI_TAGS_FLAG,
    NEED_UNWRAP_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    BatchItem,
    DispatchRequest,
    DispatchStatus,
    MessageInner,
    encode_batch_body,
    encode_blank,
    encode_record,
)
from common.schedule import SCHEDULE_TOPIC
from store._recovery import FileScanner, RecordScanner
from store._replica import ReplicaScan, scan_replica
from store.errors import ReplicaDataError

pytestmark = pytest.mark.unit

native_only = pytest.mark.skipif(
    not m.NATIVE, reason="the accelerators are not in use (not built, or TRIMQ_NO_NATIVE set)"
)

MAX = 4 * 1024 * 1024
FROM = 3 * 1024 * 1024  # file_from of the generated files: records claim FROM + position


# ------------------------------------------------------------------ records
TOPICS = ["Bench", "主题-topic", "emoji-\U0001f600", "", "t" * 127, SCHEDULE_TOPIC]
HOSTS = [("127.0.0.1", 5555), ("::1", 10911), ("fe80::1:2", 1), ("192.0.2.3", 65535)]
SYS_FLAGS = [
    0,
    COMPRESSED_FLAG,
    MULTI_TAGS_FLAG,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    NEED_UNWRAP_FLAG | INNER_BATCH_FLAG,
    INNER_BATCH_FLAG,
]


def _properties(rng: random.Random, i: int) -> dict[str, str] | str:
    """Every property combination the encoder produces, and odd strings given as text."""
    kind = i % 12
    if kind == 0:
        return {}
    if kind == 1:
        return {"TAGS": "TagA"}
    if kind == 2:
        return {"KEYS": "k1", "UNIQ_KEY": f"{rng.getrandbits(128):032X}"}
    if kind == 3:
        return {"TAGS": "标签\U0001f600", "KEYS": "a b  c", "UNIQ_KEY": "U" * 32, "WAIT": "false"}
    if kind == 4:  # a delay-level record as the broker stores it
        return {
            "DELAY": str(rng.randint(1, 18)),
            "REAL_TOPIC": "Bench",
            "REAL_QID": "3",
            "TAGS": "t",
            "UNIQ_KEY": "0A" * 16,
        }
    if kind == 5:
        return {"TAGS": "", "KEYS": "", "user": "välue", "ключ": "значение"}
    if kind == 6:  # duplicates (a later one wins), empty names and values, no separators
        return "TAGS\x01a\x02TAGS\x01b\x02\x01x\x02y\x01\x02noseparator\x02\x02KEYS\x01k"
    if kind == 7:
        return "\x02\x02\x01\x01\x02"
    if kind == 8:
        return {f"p{k}": "v" * rng.randint(1, 40) for k in range(rng.randint(1, 30))}
    if kind == 9:
        return {"KEYS": " ".join(f"key{k}" for k in range(40)), "UNIQ_KEY": "0" * 32}
    if kind == 10:
        return {"TAGS": "Tag\U00010000"}  # a Java surrogate pair in the hash
    return {"MIN_OFFSET": "0", "MAX_OFFSET": "9", "TRAN_MSG": "true", "PGROUP": "pg"}


def _body(rng: random.Random, i: int) -> bytes:
    kind = i % 6
    if kind == 0:
        return b""
    if kind == 1:
        return b"\x00"
    if kind == 2:
        return rng.randbytes(1024)
    if kind == 3:
        return encode_batch_body([BatchItem(0, b"one", "a\x01b"), BatchItem(1, b"", "")])
    if kind == 4:
        return rng.randbytes(rng.randint(1, 300))
    return b"\x00" * 40


def make_message(rng: random.Random, i: int) -> MessageInner:
    props = _properties(rng, i)
    kw: dict[str, Any] = (
        {"properties_string": props} if isinstance(props, str) else {"properties": props}
    )
    return MessageInner(
        TOPICS[i % len(TOPICS)],
        _body(rng, i // 2),
        queue_id=rng.randint(0, 15),
        flag=rng.randint(-(2**31), 2**31 - 1),
        sys_flag=SYS_FLAGS[i % len(SYS_FLAGS)],
        born_timestamp=rng.randint(0, 2**62),
        born_host=HOSTS[i % len(HOSTS)],
        store_host=HOSTS[(i // len(HOSTS)) % len(HOSTS)],
        reconsume_times=rng.randint(0, 16),
        prepared_transaction_offset=rng.randint(-1, 2**40),
        **kw,
    )


def make_file(
    rng: random.Random, count: int, *, first: int = 0, tail: str = "blank", slack: int = 0
) -> tuple[bytes, list[int]]:
    """`count` records back to back from relative position 0, claiming FROM + position, then
    the file's end: "blank" (BLANK padding of `slack` + 8 bytes), "zeros" (`slack` zero bytes)
    or "none" (the file ends with the last record). Returns (file, record starts)."""
    out = bytearray()
    starts = []
    for k in range(count):
        starts.append(len(out))
        msg = make_message(rng, first + k)
        out += encode_record(msg, rng.randint(0, 2**40), FROM + len(out), rng.randint(0, 2**45))
    if tail == "blank":
        out += encode_blank(slack + 8) + bytes(slack)
    elif tail == "zeros":
        out += bytes(slack)
    return bytes(out), starts


# ------------------------------------------------------------------ both implementations
def implementation(native: bool, window: int | None = None) -> AbstractContextManager[Any]:
    """RecordScanner (and scan_replica through it) on one implementation, with reads of
    `window` bytes."""
    attrs: dict[str, Any] = {
        "native_scan_records": m._native_scan_records if native else None,
        "check_record": m._native_check_record if native else m._py_check_record,
    }
    if window is not None:
        attrs["_WINDOW"] = window
    patch: AbstractContextManager[Any] = mock.patch.multiple(rec, **attrs)
    return patch


Scan = tuple[list[DispatchRequest], int, DispatchStatus]


def scan(
    data: bytes,
    *,
    native: bool,
    file_size: int | None = None,
    start: int = 0,
    check_crc: bool = True,
    max_size: int = MAX,
    window: int | None = None,
) -> Scan:
    """RecordScanner over `data` (the first bytes of a file of `file_size`, all of it when
    None), as recovery and the replica path run it."""
    size = len(data) if file_size is None else file_size

    def read(pos: int, n: int) -> bytes:
        return data[pos : pos + n]

    with implementation(native, window):
        sc = RecordScanner(read, FROM, size, start, check_crc=check_crc, max_size=max_size)
        reqs = list(sc)
    return reqs, sc.end, sc.outcome


def same_request(a: DispatchRequest, b: DispatchRequest) -> None:
    assert type(a) is DispatchRequest
    assert type(b) is DispatchRequest
    assert a == b
    assert [type(x) for x in a] == [type(x) for x in b]
    assert a.status is b.status


def same_scan(a: Scan, b: Scan) -> None:
    assert (len(a[0]), a[1], a[2]) == (len(b[0]), b[1], b[2])
    assert a[2] is b[2]
    for x, y in zip(a[0], b[0], strict=True):
        same_request(x, y)


def both(data: bytes, **kw: Any) -> Scan:
    """Scan with both; they must agree. Returns the reference's result."""
    ref = scan(data, native=False, **kw)
    same_scan(ref, scan(data, native=True, **kw))
    return ref


def check_both(buf: bytes | bytearray | memoryview, offset: int, **kw: Any) -> DispatchRequest:
    ref = m._py_check_record(buf, offset, **kw)
    same_request(ref, m._native_check_record(buf, offset, **kw))
    return ref


def replica_both(buf: bytes, buf_from: int, file_size: int) -> ReplicaScan | str:
    """scan_replica with both; the same scan or the same ReplicaDataError."""
    got: list[ReplicaScan | str] = []
    for native in (False, True):
        with implementation(native):
            try:
                got.append(scan_replica(buf, buf_from, FROM, file_size, max_size=MAX))
            except ReplicaDataError as exc:
                got.append(f"error: {exc}")
    ref, nat = got
    if isinstance(ref, str) or isinstance(nat, str):
        assert ref == nat
        return ref
    assert (ref.next_pos, ref.need) == (nat.next_pos, nat.need)
    assert len(ref.records) == len(nat.records)
    for x, y in zip(ref.records, nat.records, strict=True):
        same_request(x, y)
    return ref


# ------------------------------------------------------------------ the selected path
def test_the_selected_path() -> None:
    chosen = vars(rec)
    if m.NATIVE:
        assert chosen["native_scan_records"] is m._native_scan_records
        assert chosen["check_record"] is m._native_check_record
    else:
        assert chosen["native_scan_records"] is None
        assert chosen["check_record"] is m._py_check_record
    data, starts = make_file(random.Random(1), 30, slack=100)
    reqs, end, outcome = scan(data, native=False)
    assert [r.commit_log_offset for r in reqs] == [FROM + s for s in starts]
    assert outcome is DispatchStatus.BLANK
    assert end == len(data) - 108


# ------------------------------------------------------------------ valid records
@native_only
@pytest.mark.parametrize("window", [None, 97, 1000, 4096])
def test_every_generated_record_the_same(window: int | None) -> None:
    rng = random.Random(7)
    data, starts = make_file(rng, 400, slack=500)
    reqs, end, outcome = both(data, window=window)
    assert (len(reqs), end, outcome) == (400, len(data) - 508, DispatchStatus.BLANK)
    for start in starts[:60]:
        both(data, start=start, window=window)
        both(data, start=start, check_crc=False, window=window)


@native_only
def test_record_fields() -> None:
    rng = random.Random(3)
    for i in range(600):
        msg = make_message(rng, i)
        raw = bytes(encode_record(msg, i, FROM + i, 1000 + i))
        req = check_both(raw, 0)
        props = m._py_decode_properties(msg.encoded_properties())
        assert req.status is DispatchStatus.OK
        assert req.topic == msg.topic
        assert req.properties == props
        assert req.tags_code == m.tags_code(props.get("TAGS"))
        assert req.keys == props.get("KEYS", "")
        assert req.uniq_key == props.get("UNIQ_KEY")
        assert (req.queue_offset, req.commit_log_offset, req.store_timestamp) == (
            i,
            FROM + i,
            1000 + i,
        )
        assert req.born_timestamp == msg.born_timestamp
        assert req.prepared_transaction_offset == msg.prepared_transaction_offset
        assert req.sys_flag & ~0x30 == msg.sys_flag
        # the record inside a larger buffer, and as bytearray / memoryview
        padded = b"\xff" * 5 + raw + b"\x00" * 3
        check_both(padded, 5)
        check_both(bytearray(padded), 5, check_crc=False)
        check_both(memoryview(padded), 5)


@native_only
def test_large_body_crc() -> None:
    # a body past the size whose CRC runs without the GIL
    msg = MessageInner("Big", random.Random(5).randbytes(200_000), properties={"KEYS": "k"})
    raw = bytearray(encode_record(msg, 0, FROM, 1))
    data = bytes(raw) + encode_blank(8)
    reqs, _end, outcome = both(data)
    assert len(reqs) == 1
    assert outcome is DispatchStatus.BLANK
    raw[100_000] ^= 1
    assert both(bytes(raw) + encode_blank(8))[2] is DispatchStatus.INVALID
    assert both(bytes(raw) + encode_blank(8), check_crc=False)[0][0].size == len(raw)


# ------------------------------------------------------------------ damaged bytes
@native_only
def test_every_single_byte_flip() -> None:
    rng = random.Random(11)
    data, starts = make_file(rng, 4, first=1, slack=20)
    assert len(data) < 3000
    for k in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[k] ^= mask
            both(bytes(bad))
            both(bytes(bad), window=starts[2] + 3)
            # the same bytes as replica bytes of a larger file
            both(bytes(bad), file_size=len(data) + 4096)
        if k % 7 == 0:
            bad = bytearray(data)
            bad[k] = 0
            both(bytes(bad))


@native_only
def test_check_record_at_every_offset_of_damaged_bytes() -> None:
    rng = random.Random(13)
    data, _starts = make_file(rng, 3, first=2, slack=10)
    for k in range(0, len(data), 3):
        bad = bytearray(data)
        bad[k] ^= 0x5A
        for offset in range(-2, len(bad) + 2):
            check_both(bytes(bad), offset)
        check_both(bytes(bad), 0, max_size=len(bad) // 2)


@native_only
def test_truncated_at_every_length() -> None:
    rng = random.Random(17)
    data, _starts = make_file(rng, 5, first=3, slack=40)
    for n in range(len(data) + 1):
        cut = data[:n]
        both(cut)  # a file of n bytes
        both(cut, file_size=len(data))  # replica bytes ending there
        both(cut, file_size=len(data), window=300)


@native_only
def test_zeroed_tails() -> None:
    rng = random.Random(19)
    data, _starts = make_file(rng, 6, first=5, tail="zeros", slack=64)
    for k in range(0, len(data), 5):
        torn = data[:k] + bytes(len(data) - k)
        both(torn)
        both(torn, window=256)
    reqs, end, outcome = both(data)
    assert (len(reqs), outcome) == (6, DispatchStatus.END)
    assert end == len(data) - 64


@native_only
def test_blank_fillers_right_and_wrong() -> None:
    rng = random.Random(23)
    records, _starts = make_file(rng, 3, first=4, tail="none")
    n = len(records)
    cases = {
        "right": encode_blank(40) + bytes(32),
        "right, minimal": encode_blank(8),
        "short of the end": encode_blank(39) + bytes(32),
        "past the end": encode_blank(41) + bytes(32),
        "below 8": encode_blank(7) + bytes(32),
        "negative": encode_blank(-1) + bytes(32),
        "zero": encode_blank(0) + bytes(32),
        "under 8 bytes left": b"\x00\x00\x00\x07\xcb\xd4\x31",
        "non-zero under 8 bytes": b"\x00\x01",
        "zeros under 8 bytes": bytes(5),
    }
    for name, tail in cases.items():
        data = records + tail
        reqs, end, _outcome = both(data)
        assert len(reqs) == 3, name
        assert end == n, name
        for size in (len(data) + 1, len(data) + 100):
            both(data, file_size=size)
        check_both(data, n)
        check_both(tail, 0)
    assert both(records + encode_blank(40) + bytes(32))[2] is DispatchStatus.BLANK


@native_only
def test_totalsize_out_of_range() -> None:
    rng = random.Random(29)
    data, starts = make_file(rng, 3, first=8, slack=64)
    at = starts[1]
    size = int.from_bytes(data[at : at + 4], "big")
    for total in (0, 1, 8, 90, 91, size - 1, size + 1, len(data), 2**31 - 1, -1, -(2**31)):
        bad = bytearray(data)
        bad[at : at + 4] = total.to_bytes(4, "big", signed=True)
        both(bytes(bad))
        both(bytes(bad), file_size=len(data) + 10_000)
        both(bytes(bad), max_size=size)
        check_both(bytes(bad), at)
    for max_size in (0, 90, size - 1, size, 2**70, -(2**70)):
        both(data, max_size=max_size)
        check_both(data, at, max_size=max_size)
    # a magic code that is neither, and the V2 magic code (not taken by the V1 check)
    for magic in (0, 1, MESSAGE_MAGIC_CODE + 4, BLANK_MAGIC_CODE ^ 1):
        bad = bytearray(data)
        bad[at + 4 : at + 8] = magic.to_bytes(4, "big")
        both(bytes(bad))
    zero_head = bytearray(data)
    zero_head[at : at + 8] = bytes(8)
    assert both(bytes(zero_head))[2] is DispatchStatus.END


@native_only
def test_not_utf8_wrong_offset_and_nul() -> None:
    rng = random.Random(31)
    base, _ = make_file(rng, 1, tail="none")
    for topic in (b"\xff", b"\xed\xa0\x80", b"\xc0\x80", b"ok\xe4\xb8", b"a\x00b"):
        for where in ("topic", "props"):
            msg = MessageInner("T" * len(topic), b"body", properties={"K": "v" * len(topic)})
            raw = bytearray(encode_record(msg, 0, FROM, 0))
            pos = raw.index(b"T" * len(topic)) if where == "topic" else raw.rindex(b"v")
            if where == "props":
                pos -= len(topic) - 1
            raw[pos : pos + len(topic)] = topic
            data = bytes(raw) + base + encode_blank(8)
            assert both(data)[2] is DispatchStatus.INVALID
            check_both(bytes(raw), 0)
    # a record claiming another commitlog offset, and one crossing the file size
    data, starts = make_file(rng, 3, slack=0)
    other = bytearray(data)
    other[starts[1] + 28 : starts[1] + 36] = (FROM + starts[1] + 1).to_bytes(8, "big")
    reqs, end, outcome = both(bytes(other))
    assert (len(reqs), end, outcome) == (1, starts[1], DispatchStatus.INVALID)
    for cut in (starts[2] + 100, len(data) - 9):
        # the record's bytes there, the file ending inside it
        reqs, end, outcome = both(data, file_size=cut)
        assert (len(reqs), end, outcome) == (2, starts[2], DispatchStatus.INVALID)
        # the file's bytes ending inside it
        reqs, end, outcome = both(data[:cut], file_size=cut)
        assert (len(reqs), end, outcome) == (2, starts[2], DispatchStatus.INVALID)


@native_only
def test_the_same_reads() -> None:
    rng = random.Random(47)
    data, starts = make_file(rng, 30, slack=64)
    bad = bytearray(data)
    bad[starts[20] + 9] ^= 1
    cases = [(data, None), (bytes(bad), None), (data[: starts[12] + 50], len(data))]
    for buf, size in cases:
        for window in (None, 97, 700, 5000):
            logs: list[list[tuple[int, int]]] = []
            for native in (False, True):
                log: list[tuple[int, int]] = []

                def read(
                    pos: int, n: int, log: list[tuple[int, int]] = log, buf: bytes = buf
                ) -> bytes:
                    log.append((pos, n))
                    return buf[pos : pos + n]

                with implementation(native, window):
                    sc = RecordScanner(read, FROM, size or len(buf), 0, max_size=MAX)
                    list(sc)
                logs.append(log)
            assert logs[0] == logs[1]


@native_only
def test_replica_scans_the_same() -> None:
    rng = random.Random(37)
    data, starts = make_file(rng, 20, slack=300)
    size = len(data)
    cuts = sorted({*starts, *(s + d for s in starts for d in (1, 7, 8, 9, 100)), size - 1})
    for a in starts[:6]:
        for b in cuts:
            if b > a:
                replica_both(data[a:b], FROM + a, size)
        replica_both(data[a:], FROM + a, size)
    for k in range(0, size, 11):
        bad = bytearray(data)
        bad[k] ^= 0x10
        replica_both(bytes(bad), FROM, size)


@native_only
def test_file_scanner_over_damage_the_same() -> None:
    rng = random.Random(41)
    data, starts = make_file(rng, 12, slack=100)
    bad = bytearray(data)
    bad[starts[3] + 50] ^= 1
    bad[starts[8] : starts[8] + 4] = b"\x7f\xff\xff\xff"

    def read(pos: int, n: int) -> bytes:
        return bytes(bad[pos : pos + n])

    got = []
    for native in (False, True):
        with implementation(native):
            fs = FileScanner(read, FROM, len(bad), 0, check_crc=True, max_size=MAX)
            got.append((list(fs), fs.gaps, fs.tail_from, fs.complete, fs.records))
    (ra, *rest_a), (rb, *rest_b) = got
    assert rest_a == rest_b
    for x, y in zip(ra, rb, strict=True):
        same_request(x, y)


@native_only
def test_fuzz_fixed_seed() -> None:
    rng = random.Random(20261128)
    for round_ in range(250):
        data, starts = make_file(
            rng, rng.randint(1, 8), first=rng.randint(0, 100), tail=rng.choice(["blank", "zeros"]),
            slack=rng.randint(0, 50),
        )  # fmt: skip
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(len(bad))
            bad[k] = rng.randrange(256)
        if round_ % 5 == 0:  # a random stretch of garbage or zeros
            k = rng.randrange(len(bad))
            n = rng.randint(1, 64)
            bad[k : k + n] = bytes(n) if rng.random() < 0.5 else rng.randbytes(n)
        extra = rng.choice([0, 0, 13, 5000])
        window = rng.choice([None, 64, 200, 1500])
        start = rng.choice(starts)
        both(bytes(bad), file_size=len(bad) + extra, window=window, start=start)
        both(bytes(bad), check_crc=False, max_size=rng.choice([MAX, 500]))
        check_both(bytes(bad), rng.choice(starts) + rng.randint(-3, 3))


# ------------------------------------------------------------------ references
@native_only
def test_no_references_kept() -> None:
    rng = random.Random(43)
    data, _starts = make_file(rng, 40, slack=10)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    watched: list[object] = [*DispatchStatus, DispatchRequest, None]
    before: list[int] = []
    for round_ in range(51):
        if round_ == 1:  # after a first round that warms whatever caches there are
            before = [sys.getrefcount(o) for o in watched]
        for buf in (data, bytes(bad), data[:-30]):
            scan(buf, native=True)
            scan(buf, native=True, window=500)
            for offset in (0, 3, len(buf) - 8, len(buf)):
                m._native_check_record(buf, offset)
    assert [sys.getrefcount(o) for o in watched] == before


@native_only
def test_argument_errors_raise() -> None:
    sp = pytest.importorskip("common.speedups")
    statuses = tuple(DispatchStatus)
    with pytest.raises(TypeError):
        sp.check_record("text", 0, True, MAX, DispatchRequest, statuses)
    with pytest.raises(TypeError):
        sp.check_record(b"", 0, True, MAX, dict, statuses)
    with pytest.raises(ValueError, match="outside"):
        sp.scan_records(b"abc", 10, 0, 0, 100, True, MAX, DispatchRequest, statuses)
    with pytest.raises(ValueError, match="outside"):
        sp.scan_records(b"abc", 1, 2, 0, 100, True, MAX, DispatchRequest, statuses)

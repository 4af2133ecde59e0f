"""Native versions of the store's per-message loops (common/speedups.c).

The pure-Python functions named in each docstring are the reference; callers go through
`common.message.load_native`, which honours TRIMQ_NO_NATIVE.
"""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

_T = TypeVar("_T")
_S = TypeVar("_S")

def crc32(data: bytes | bytearray | memoryview, value: int = 0, /) -> int:
    """`zlib.crc32` (IEEE polynomial), with carry-less multiplication when the CPU has it."""

def java_string_hash(s: str, /) -> int:
    """`common.message._py_java_string_hash`."""

def key_hash2(prefix: str, key: str, /) -> int:
    """`store.index_file.key_hash(prefix + key)` without building the string."""

def decode_properties(text: str, /) -> dict[str, str]:
    """`common.message._py_decode_properties`."""

def encode_records(
    msgs: Sequence[Any],
    pack_ip: Callable[[str], bytes],
    encode_error: type[Exception],
    size_error: type[Exception],
    /,
) -> tuple[bytearray, list[int], list[int] | None, tuple[str, int] | None]:
    """`common.message._py_encode_records` as the fields of an `EncodedRecords`."""

def patch_records(
    buf: bytearray,
    sizes: list[int],
    ts_positions: list[int] | None,
    start: int,
    stop: int,
    buf_pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    phy_out: list[int],
    /,
) -> None:
    """`common.message._py_patch_records` on the fields of an `EncodedRecords`."""

def offset_msg_ids(host_hex: str, phys: Sequence[int], /) -> list[str]:
    """``[f"{host_hex}{p:016X}" for p in phys]`` (offsets must be >= 0)."""

def pack_cq_units(phys: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int], /) -> bytes:
    """``b"".join(map(struct.Struct(">qiq").pack, phys, sizes, tags_codes))``."""

def index_hashes(
    prefix: str,
    phy_offsets: Sequence[int],
    uniq_keys: Sequence[str | None],
    keys: Sequence[str | None],
    end: int,
    indexed: bool,
    /,
) -> tuple[list[int], list[int]]:
    """The (hashes, offsets) `IndexService.build_index_batch` writes."""

def index_put_hashes(
    mm: Any,
    slot_num: int,
    entries_pos: int,
    count: int,
    hashes: list[int],
    phys: list[int],
    start: int,
    stop: int,
    time_diff: int,
    /,
) -> int:
    """The entry / slot writes of `IndexFile.put_hashes`; returns how many slots were new."""

def decode_batch_body(
    body: bytes | bytearray | memoryview, item_type: type[_T], decode_error: type[Exception], /
) -> list[_T]:
    """`common.message._py_decode_batch_body`, items built as `item_type`."""

def build_batch_messages(
    items: Sequence[tuple[int, bytes, str]],
    msg_type: type[_T],
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_host: tuple[str, int],
    batch_props: dict[str, str],
    override: set[str] | frozenset[str],
    suffix: str,
    max_props: int,
    reuse_properties: Callable[[str, dict[str, str], str], str | None],
    /,
) -> tuple[list[_T], int, int]:
    """`SendProcessor.send_batch`'s per-message loop: (messages, error index, error kind)."""

def decode_records_into(buf: bytes, cls: type[_T], broker_name: str, /) -> list[_T] | None:
    """The records of a pull body as new `cls` objects (slots set, `__init__` not run), or
    None when the body needs the Python decoder (see `common.message.decode_records_into`)."""

def decode_records_columns(
    buf: bytes, end: int, /
) -> (
    tuple[
        int,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
    ]
    | None
):
    """The records below queue offset `end` as Arrow column buffers, or None when the body
    needs the Python decoder (see `common.message.decode_records_columns`)."""

def check_record(
    buf: bytes | bytearray | memoryview,
    offset: int,
    check_crc: bool,
    max_size: int,
    req_type: type[_T],
    statuses: tuple[Any, ...],
    /,
) -> _T:
    """`common.message._py_check_record`: the request of the record at `offset`, built as
    `req_type` (`DispatchRequest`) with the status members `statuses` (OK, BLANK, END,
    INVALID). Bytes that are no record never raise."""

def scan_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    base: int,
    file_from: int,
    file_size: int,
    check_crc: bool,
    max_size: int,
    req_type: type[_T],
    statuses: tuple[_S, ...],
    /,
) -> tuple[list[_T], int, _S | None]:
    """`store._recovery.RecordScanner`'s loop over `buf` (the bytes of one file from relative
    position `base` on) from relative position `pos`: the valid records, the relative position
    after the last of them, and the scanner's outcome (BLANK, END, INVALID), or None where the
    scanner would read the file again before that position's record."""

class FsyncWorker:
    """The SYNC_FLUSH group commit's fsync thread, in C (Linux only): syncs rounds of
    ``(address, length, fd)`` ranges (address 0: fdatasync `fd`) in submission order without
    the GIL, and signals an eventfd when one is done (`store._flush._NativeFsyncThread`)."""

    def start(self) -> None: ...
    def submit(self, round_id: int, ranges: Sequence[tuple[int, int, int]], /) -> None: ...
    def extend(self, round_id: int, ranges: Sequence[tuple[int, int, int]], /) -> bool: ...
    def collect(self) -> list[tuple[int, int]]: ...
    def fileno(self) -> int: ...
    def stop(self) -> None: ...

class UniqKeys:
    """`common.message.UniqKeyGenerator`'s state with the wall clock (CLOCK_REALTIME ms):
    `next` / `next_many` return None when the clock left [month_start, month_end); the caller
    passes the new local month to `set_month` and calls again."""

    def __init__(self, prefix: str, month_start: int, month_end: int, counter: int) -> None: ...
    def next(self) -> str | None: ...
    def next_many(self, n: int, /) -> list[str] | None: ...
    def set_month(self, month_start: int, month_end: int, /) -> None: ...

"""Random damage to the newest commitlog bytes never stops recovery nor yields a corrupt record:
whatever survives is a prefix of what was written, byte for byte, and appends continue."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.message import MessageInner
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig
from store.paths import commitlog_dir, offset_to_file_name

FILE = 4096


def _cfg(root: Path) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commitlog=FILE,
        mapped_file_size_consume_queue=16 * 20,
        max_hash_slot_num=32,
        max_index_num=256,
    )


async def _write(root: Path, n: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    async with MessageStore(_cfg(root)) as store:
        for i in range(n):
            m = MessageInner("F", bytes([i]) * (20 + 37 * i % 300), properties={"KEYS": f"k{i}"})
            r = await store.put_message(m)
            assert r.status is PutMessageStatus.PUT_OK
            assert r.append is not None
            raw = store.read_record(r.append.wrote_offset)
            assert raw is not None
            out.append((r.append.wrote_offset, raw))
        store.simulate_crash()
    return out


async def _reopen_and_check(root: Path, written: list[tuple[int, bytes]]) -> None:
    async with MessageStore(_cfg(root)) as store:
        got: list[bytes] = []
        off = 0
        for _ in range(1000):
            res = await store.get_message("g", "F", 0, off, 32, 1 << 20)
            if res.status is not GetMessageStatus.FOUND:
                break
            got.extend(res.buffers)
            off = res.next_begin_offset
        assert got == [raw for _, raw in written[: len(got)]]
        end = written[len(got) - 1][0] + len(written[len(got) - 1][1]) if got else 0
        # the end of the last kept record, or the start of the next file when it was the
        # last of a file completed with BLANK padding
        assert store.max_phy_offset in (end, end - end % FILE + FILE)
        r = await store.put_message(MessageInner("F", b"after"))
        assert r.append is not None
        assert r.append.queue_offset == len(got)


def _body_span(raw: bytes) -> tuple[int, int]:
    body_len = int.from_bytes(raw[84:88], "big")
    return 88, 88 + body_len


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["flip_body", "zero_tail", "garbage_tail", "cut"]),
    where=st.floats(0, 1),
    victim=st.integers(1, 6),
    length=st.integers(1, 400),
    seed=st.integers(0, 2**32),
)
def test_random_damage_to_last_file(
    kind: str, where: float, victim: int, length: int, seed: int
) -> None:
    """Damage kinds of the issue: cut anywhere (torn write), zeroed tail from anywhere, garbage
    after the written data, a flipped body byte (the CRC covers bodies only)."""
    root = Path(tempfile.mkdtemp(prefix="trimq-fuzz-"))
    try:
        written = trio.run(_write, root, 30)
        end = written[-1][0] + len(written[-1][1])
        start = end - end % FILE
        path = commitlog_dir(root) / offset_to_file_name(start)
        rel_end = end - start
        pos = int(where * rel_end)
        rnd = random.Random(seed)
        if kind == "cut":
            os.truncate(path, pos)
        elif kind == "zero_tail":
            with path.open("r+b") as f:
                f.seek(pos)
                f.write(b"\0" * (FILE - pos))
        elif kind == "garbage_tail":
            with path.open("r+b") as f:
                f.seek(rel_end)
                f.write(rnd.randbytes(min(length, FILE - rel_end)))
        else:
            phy, raw = written[-victim]
            if phy < start:
                return
            b0, b1 = _body_span(raw)
            at = phy - start + b0 + int(where * (b1 - b0 - 1))
            with path.open("r+b") as f:
                f.seek(at)
                old = f.read(1)
                f.seek(at)
                f.write(bytes([old[0] ^ (1 << rnd.randrange(8))]))
        trio.run(_reopen_and_check, root, written)
    finally:
        shutil.rmtree(root, ignore_errors=True)

"""The native index helpers (common.speedups) against store.index_file's Python reference.

Hashes and the bytes of whole index files are compared; skipped when the extension is not
built.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.message import UniqKeyGenerator
from store import index_file as ix

sp = pytest.importorskip("common.speedups")

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_keys = st.one_of(
    st.none(),
    st.just(""),
    st.text(alphabet=st.sampled_from("ab \U0001f600é"), max_size=12),
)


@SETTINGS
@given(
    st.text(max_size=10),
    st.lists(st.tuples(_keys, _keys), max_size=12),
    st.integers(-1, 30),
    st.booleans(),
)
def test_index_hashes_equivalent(
    topic: str, recs: list[tuple[str | None, str | None]], end: int, indexed: bool
) -> None:
    phys = [i * 3 for i in range(len(recs))]
    uniq = [r[0] for r in recs]
    keys = [r[1] for r in recs]
    prefix = topic + "#"
    assert sp.index_hashes(prefix, phys, uniq, keys, end, indexed) == ix._batch_hashes(
        prefix, phys, uniq, keys, end, indexed
    )


def test_index_hashes_of_real_uniq_keys() -> None:
    gen = UniqKeyGenerator(ip="192.0.2.3", pid=1, seed=2)
    uniq: list[str | None] = [gen.next() for _ in range(64)]
    keys: list[str | None] = [None, "k1 k2", " ", "a  b "] * 16
    phys = list(range(0, 64 * 100, 100))
    assert sp.index_hashes("Topic#", phys, uniq, keys, 0, True) == ix._batch_hashes(
        "Topic#", phys, uniq, keys, 0, True
    )


def test_index_hashes_length_mismatch() -> None:
    with pytest.raises(ValueError):
        sp.index_hashes("T#", [1, 2], ["a"], [None], 0, False)
    with pytest.raises(ValueError):
        ix._batch_hashes("T#", [1, 2], ["a"], [None], 0, False)


@SETTINGS
@given(st.text(max_size=20), st.text(max_size=60))
def test_uniq_key_hash(prefix: str, key: str) -> None:
    assert sp.key_hash2(prefix, key) == ix._py_uniq_key_hash(prefix, key)


def _fill(path: Path, batches: list[list[int]], native: bool) -> bytes:
    f = ix.IndexFile(path, slot_num=7, index_num=40)
    phy = 0
    for batch in batches:
        phys = []
        for _ in batch:
            phys.append(phy)
            phy += 10
        done = 0
        while done < len(batch):
            count = f.index_count
            n = min(len(batch) - done, f.index_num - count)
            if n <= 0:
                break
            if native:
                new = sp.index_put_hashes(
                    f._mm, f.slot_num, f._entries_pos, count, batch, phys, done, done + n, 5
                )
            else:
                new = f._put_hashes_py(batch, phys, done, done + n, count, 5)
            f.hash_slot_count += new
            f.index_count = count + n
            done += n
        f.write_header()
        if f.is_full:
            break
    data = bytes(f._mm)
    f.destroy()
    return data


@SETTINGS
@given(st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=9), max_size=8))
def test_index_put_hashes_same_file_bytes(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[int]]
) -> None:
    root = tmp_path_factory.mktemp("ix")
    assert _fill(root / "a", batches, False) == _fill(root / "b", batches, True)


def test_index_put_hashes_bounds(tmp_path: Path) -> None:
    f = ix.IndexFile(tmp_path / "f", slot_num=4, index_num=3)
    try:
        # struct.error, as pack_into beyond the mapping or out of range in the Python version
        with pytest.raises(struct.error):  # entry 3 is beyond the 3 entries of the file
            f._put_hashes_py([1], [0], 0, 1, 3, 0)
        with pytest.raises(struct.error):
            sp.index_put_hashes(f._mm, 4, f._entries_pos, 3, [1], [0], 0, 1, 0)
        with pytest.raises(struct.error):  # more slots than the mapping holds
            sp.index_put_hashes(f._mm, 10**6, f._entries_pos, 1, [1], [0], 0, 1, 0)
        with pytest.raises(struct.error):
            f._put_hashes_py([2**31], [0], 0, 1, 1, 0)
        with pytest.raises(struct.error):
            sp.index_put_hashes(f._mm, 4, f._entries_pos, 1, [2**31], [0], 0, 1, 0)
        with pytest.raises(TypeError):
            sp.index_put_hashes(bytes(100), 4, 56, 1, [1], [0], 0, 1, 0)
    finally:
        f.destroy()
    with pytest.raises(ValueError):  # a closed mapping
        sp.index_put_hashes(f._mm, 4, f._entries_pos, 1, [1], [0], 0, 1, 0)


def test_build_index_batch_same_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = UniqKeyGenerator(ip="192.0.2.3", pid=1, seed=2)
    uniq: list[str | None] = [gen.next() for _ in range(50)]
    keys: list[str | None] = ["k1 k2", None, "x"] * 16 + [None, None]
    phys = list(range(0, 5000, 100))

    def run(root: Path) -> list[bytes]:
        svc = ix.IndexService(root, slot_num=11, index_num=30)
        svc.build_index_batch("T", phys[:20], uniq[:20], keys[:20], 1_700_000_000_000)
        svc.build_index_batch("T", phys[20:], uniq[20:], keys[20:], 1_700_000_005_000)
        out = [bytes(f._mm) for f in svc.files]
        svc.destroy()
        return out

    native = run(tmp_path / "n")
    monkeypatch.setattr(ix, "NATIVE", False)
    python = run(tmp_path / "p")
    assert len(native) > 1  # the batch rolled over to new files
    assert native == python

"""The epoch file: RocketMQ's text format with CRC, `.bak` fallback, ordering rules, and the
consistent point a returning master truncates to."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from store.epoch_file import EpochEntry, EpochFile, EpochFileError, consistent_point, decode, encode

pytestmark = pytest.mark.unit

E = EpochEntry


def test_format_matches_rocketmq() -> None:
    data = encode([E(7, 7000), E(8, 8000)])
    count, crc, *rest = data.decode().split("\n")
    assert (count, rest) == ("2", ["7-7000", "8-8000", ""])
    assert int(crc) == zlib.crc32(b"7-7000\n8-8000\n") & 0x7FFFFFFF
    assert decode(data) == [E(7, 7000), E(8, 8000)]
    assert decode(b"1\n0\n3-10\n") == [E(3, 10)]  # CRC 0: unchecked


@pytest.mark.parametrize(
    "bad",
    [b"", b"x\n0\n", b"2\n0\n1-1\n", b"1\n0\n1:1\n", b"1\n5\n1-1\n", b"\xff", b"1\n0\n1-1\nextra"],
)
def test_damaged_files_are_refused(bad: bytes) -> None:
    with pytest.raises(EpochFileError):
        decode(bad)


def test_save_load_and_bak_fallback(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochFileCheckpoint")
    f.load()
    assert f.entries == []
    f.save()  # nothing written for an empty list
    assert not f.path.exists()
    assert f.append(1, 0)
    f.save()
    assert f.append(2, 500)
    f.save()
    assert (tmp_path / "epochFileCheckpoint.bak").exists()
    g = EpochFile(f.path)
    g.load()
    assert g.entries == [E(1, 0), E(2, 500)]
    f.path.write_bytes(b"garbage")  # damaged: the previous version is read
    g.load()
    assert g.entries == [E(1, 0)]
    (tmp_path / "epochFileCheckpoint.bak").write_bytes(b"junk")
    with pytest.raises(EpochFileError):
        g.load()


def test_entries_only_grow() -> None:
    f = EpochFile(Path("/nonexistent/epochFileCheckpoint"))
    assert f.append(3, 100)
    assert not f.append(3, 100)
    for epoch, start in ((3, 200), (2, 300), (4, 50)):
        with pytest.raises(EpochFileError):
            f.append(epoch, start)
    assert f.append(4, 100)  # a master that wrote nothing in its epoch
    f.truncate_from(100)
    assert f.entries == []


def test_consistent_point() -> None:
    master = [E(1, 0), E(2, 1000), E(4, 2500)]
    # The old master of epoch 2 wrote up to 3000, the group moved on at 2500 (epoch 4).
    assert consistent_point([E(1, 0), E(2, 1000)], 3000, master, 4000) == 2500
    # It also had a private epoch 3 the group never saw: back to the end of epoch 2.
    assert consistent_point([E(1, 0), E(2, 1000), E(3, 2800)], 3100, master, 4000) == 2500
    # Behind the master: everything it has is kept.
    assert consistent_point([E(1, 0), E(2, 1000)], 1800, master, 4000) == 1800
    # Same epoch, different start: not the same history.
    assert consistent_point([E(2, 999)], 1500, master, 4000) is None
    assert consistent_point([], 0, master, 4000) is None

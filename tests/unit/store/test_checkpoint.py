"""store.checkpoint: the 4096-byte checkpoint file."""

from __future__ import annotations

import struct
from pathlib import Path

from store.checkpoint import CHECKPOINT_FILE_SIZE, StoreCheckpoint


def test_missing_file_reads_as_zeros(tmp_path: Path) -> None:
    cp = StoreCheckpoint(tmp_path / "checkpoint")
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (0, 0, 0)
    assert cp.min_timestamp() == 0
    assert cp.min_timestamp_index() == 0
    assert not (tmp_path / "checkpoint").exists()


def test_write_flush_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store" / "checkpoint"
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp = 1_700_000_010_000
    cp.logics_msg_timestamp = 1_700_000_005_000
    cp.index_msg_timestamp = 1_700_000_001_000
    cp.flush()
    data = path.read_bytes()
    assert len(data) == CHECKPOINT_FILE_SIZE == 4096
    assert struct.unpack_from(">qqq", data, 0) == (
        1_700_000_010_000,
        1_700_000_005_000,
        1_700_000_001_000,
    )
    assert data[24:] == bytes(4096 - 24)
    assert not path.with_name("checkpoint.tmp").exists()
    again = StoreCheckpoint(path)
    assert again.physic_msg_timestamp == 1_700_000_010_000
    assert again.logics_msg_timestamp == 1_700_000_005_000
    assert again.index_msg_timestamp == 1_700_000_001_000
    assert again.min_timestamp() == 1_700_000_005_000 - 3000
    assert again.min_timestamp_index() == 1_700_000_001_000
    again.index_msg_timestamp = 1_800_000_000_000
    assert again.min_timestamp_index() == again.min_timestamp()
    again.physic_msg_timestamp = 42
    again.close()
    assert StoreCheckpoint(path).physic_msg_timestamp == 42


def test_min_timestamp_never_negative(tmp_path: Path) -> None:
    cp = StoreCheckpoint(tmp_path / "checkpoint")
    cp.physic_msg_timestamp = 1000
    cp.logics_msg_timestamp = 5000
    assert cp.min_timestamp() == 0


def test_reads_rocketmq_layout_and_short_files(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    # a file as RocketMQ 5.x writes it: extra fields after the first three are ignored
    path.write_bytes(struct.pack(">qqqqq", 11, 22, 33, 44, 55) + bytes(4096 - 40))
    cp = StoreCheckpoint(path)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
        11,
        22,
        33,
    )
    path.write_bytes(b"\x00\x01")
    cp = StoreCheckpoint(path)
    assert cp.physic_msg_timestamp == 0

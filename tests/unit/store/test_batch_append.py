"""The batch append path (one encode buffer, one write per file, one `DispatchBatch`) must leave
exactly the bytes the record-by-record path leaves: commitlog, consume queues and index files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    MessageEncodeError,
    MessageInner,
    PropertiesSizeExceededError,
    decode_records,
    encode_record,
    encode_record_template,
    encode_records,
    patch_records,
)
from store import MessageStore, PutMessageStatus, StoreConfig
from store._mapped_file import MappedFile
from store._mapped_file_queue import MappedFileQueue
from store.commitlog import CommitLog, DispatchBatch
from store.consume_queue import CQ_UNIT_SIZE, ConsumeQueue
from store.paths import commitlog_dir, consume_queue_root, offset_to_file_name

NOW = 1_700_000_000_123
COMMITLOG_FILE = 8192


def _msg(i: int, *, topic: str = "T", queue_id: int = 0, **kw: object) -> MessageInner:
    props = {"UNIQ_KEY": f"7F0000011F9018B4AAC2{i:012X}"}
    if i % 3 == 0:
        props["KEYS"] = f"k{i} shared"
    if i % 5 == 0:
        props["TAGS"] = "TagA"
    m = MessageInner(
        topic,
        bytes([i % 251]) * (40 + (i * 37) % 400),
        queue_id=queue_id,
        properties=None if i % 7 == 4 else props,
        born_timestamp=1_000 + i,
        born_host=("192.0.2.5", 40000 + i),
        store_host=("192.0.2.9", 10911),
        **kw,  # type: ignore[arg-type]
    )
    return m


def _variety() -> list[MessageInner]:
    out = [_msg(i) for i in range(6)]
    out[1].born_host = ("2001:db8::1", 5)
    out[2].store_host = ("2001:db8::2", 6)
    out[3].properties_string = "PRESET\x01yes"
    out[4].body = b""
    out.append(_msg(9, topic="Other"))
    out.append(_msg(10, sys_flag=TRANSACTION_COMMIT_TYPE))
    return out


# ---------------------------------------------------------------------------------- codec
@pytest.mark.parametrize("count", [1, 2, 8])
def test_encode_records_is_the_concatenation_of_templates(count: int) -> None:
    msgs = _variety()[:count] if count < 8 else _variety()
    enc = encode_records(msgs)
    templates = [bytes(encode_record_template(m)) for m in msgs]
    assert bytes(enc.buf) == b"".join(templates)
    assert enc.sizes == [len(t) for t in templates]
    assert len(enc) == len(msgs)


def test_encode_records_store_host_only_when_shared() -> None:
    same = [_msg(i) for i in range(3)]
    assert encode_records(same).store_host == ("192.0.2.9", 10911)
    mixed = _variety()
    assert encode_records(mixed).store_host is None


def test_patch_records_gives_encode_record_bytes() -> None:
    msgs = _variety()
    enc = encode_records(msgs)
    phys: list[int] = []
    start, stop = 2, 7
    buf_pos = sum(enc.sizes[:start])
    patch_records(enc, start, stop, buf_pos, 40, 1_000_000, NOW, phys)
    expected: list[bytes] = []
    phy = 1_000_000
    for k in range(start, stop):
        expected.append(bytes(encode_record(msgs[k], 40 + k - start, phy, NOW)))
        assert phys[k - start] == phy
        phy += enc.sizes[k]
    assert bytes(enc.buf[buf_pos : buf_pos + sum(enc.sizes[start:stop])]) == b"".join(expected)


def test_encode_records_refuses_what_the_template_refuses() -> None:
    with pytest.raises(MessageEncodeError):
        encode_records([_msg(1), _msg(2, topic="x" * 128)])
    big = _msg(3)
    big.properties = {"P": "v" * 40_000}
    with pytest.raises(PropertiesSizeExceededError):
        encode_records([_msg(1), big])
    with pytest.raises(MessageEncodeError):
        encode_records([_msg(1), _msg(2, queue_id=2**40)])
    bad_host = _msg(4)
    bad_host.born_host = ("not-an-ip", 1)
    with pytest.raises(MessageEncodeError):
        encode_records([_msg(1), bad_host])


# ---------------------------------------------------------------------------------- on disk
def _cfg(root: Path) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commitlog=COMMITLOG_FILE,
        mapped_file_size_consume_queue=10 * CQ_UNIT_SIZE,
        max_hash_slot_num=16,
        max_index_num=24,
    )


def _batches() -> list[list[MessageInner]]:
    """Batches of one queue each: big enough to roll commitlog, consume-queue and index files
    mid-batch, some with PREPARED records (the record-by-record fallback)."""
    out: list[list[MessageInner]] = []
    i = 0
    for size, queue_id in [(32, 0), (1, 0), (5, 1), (17, 0), (12, 1), (3, 2), (32, 1), (2, 0)]:
        out.append([_msg(i + k, queue_id=queue_id) for k in range(size)])
        i += size
    prepared = [_msg(i + k, queue_id=2) for k in range(4)]
    prepared[1].sys_flag = TRANSACTION_PREPARED_TYPE
    out.append(prepared)
    return out


def _tree(root: Path, sub: str) -> list[tuple[str, bytes]]:
    base = root / sub
    return sorted(
        (str(p.relative_to(base)), p.read_bytes()) for p in base.rglob("*") if p.is_file()
    )


def _index_contents(root: Path) -> list[bytes]:
    # Index file names are creation times (wall clock): compare contents, in name order.
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


async def test_batch_path_writes_the_same_bytes_as_one_by_one(tmp_path: Path) -> None:
    batched, single = tmp_path / "batched", tmp_path / "single"
    ids_b: list[str] = []
    ids_s: list[str] = []
    async with MessageStore(_cfg(batched), clock=lambda: NOW / 1000) as store:
        for group in _batches():
            res = await store.put_messages(group)
            assert res.status is PutMessageStatus.PUT_OK
            assert res.append is not None
            assert res.append.msg_num == len(group)
            ids_b.extend(res.append.msg_ids)
    async with MessageStore(_cfg(single), clock=lambda: NOW / 1000) as store:
        for group in _batches():
            for m in group:
                res = await store.put_messages([m])
                assert res.status is PutMessageStatus.PUT_OK
                assert res.append is not None
                ids_s.extend(res.append.msg_ids)
    assert ids_b == ids_s
    assert len(list(commitlog_dir(batched).iterdir())) > 2  # the batches did roll files
    assert _tree(batched, "commitlog") == _tree(single, "commitlog")
    assert _tree(batched, "consumequeue") == _tree(single, "consumequeue")
    assert len(_index_contents(batched)) > 2
    assert _index_contents(batched) == _index_contents(single)


async def test_append_result_of_a_batch(tmp_path: Path) -> None:
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        first = await store.put_messages([_msg(i, queue_id=3) for i in range(4)])
        second = await store.put_messages([_msg(i, queue_id=3) for i in range(4, 9)])
        assert first.append is not None
        assert second.append is not None
        a = second.append
        assert a.queue_offset == 4
        assert a.msg_num == 5
        assert (
            a.wrote_offset
            == a.phy_offsets[0]
            == first.append.wrote_offset + first.append.wrote_bytes
        )
        assert a.wrote_bytes == sum(
            len(encode_record_template(_msg(i, queue_id=3))) for i in range(4, 9)
        )
        assert a.store_timestamp == NOW
        raw = b"".join(store.read_record(p) or b"" for p in a.phy_offsets)
        got = decode_records(raw)
        assert [m.queue_offset for m in got] == [4, 5, 6, 7, 8]
        assert [m.commit_log_offset for m in got] == a.phy_offsets
        assert all(m.store_timestamp == NOW for m in got)
        assert [m.msg_id for m in got] == a.msg_ids


async def test_listeners_hear_a_batch_once_with_its_new_max(tmp_path: Path) -> None:
    heard: list[tuple[str, int, int]] = []
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        store.add_arrival_listener(lambda t, q, m: heard.append((t, q, m)))
        await store.put_messages([_msg(i, queue_id=1) for i in range(7)])
        await store.put_messages([_msg(7, queue_id=1)])
    assert heard == [("T", 1, 7), ("T", 1, 8)]


async def test_crash_mid_batch_keeps_the_records_before_the_cut(tmp_path: Path) -> None:
    store = MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000)
    async with store:
        await store.put_messages([_msg(i, queue_id=0) for i in range(3)])
        res = await store.put_messages([_msg(i, queue_id=0) for i in range(3, 9)])
        assert res.append is not None
        phys = res.append.phy_offsets
        store.simulate_crash()
    # Tear the 4th record of the batch (header written, rest lost) and everything after it.
    cut = phys[3]
    start = cut - cut % COMMITLOG_FILE
    path = commitlog_dir(tmp_path) / offset_to_file_name(start)
    os.truncate(path, cut - start + 12)
    for later in commitlog_dir(tmp_path).iterdir():
        if later.name > path.name:
            later.unlink()
    async with MessageStore(_cfg(tmp_path), clock=lambda: NOW / 1000) as store:
        assert store.recovery is not None
        assert store.recovery.valid_end == cut
        assert store.get_max_offset_in_queue("T", 0) == 6
        kept = await store.get_message("g", "T", 0, 0, 100, 1 << 24)
        assert [m.queue_offset for m in decode_records(b"".join(kept.buffers))] == list(range(6))
        assert store.query_message("T", "k6", 10, 0, 2**62).buffers == []
        assert len(store.query_message("T", "k3", 10, 0, 2**62).buffers) == 1
        again = await store.put_messages([_msg(i, queue_id=0) for i in range(20, 23)])
        assert again.append is not None
        assert again.append.queue_offset == 6
        assert again.append.wrote_offset == cut
    assert (consume_queue_root(tmp_path) / "T" / "0").is_dir()


# ---------------------------------------------------------------------------------- units
def test_consume_queue_put_batch_fast_path_and_fallback(tmp_path: Path) -> None:
    one = ConsumeQueue(tmp_path / "a", "T", 0, 4 * CQ_UNIT_SIZE)
    other = ConsumeQueue(tmp_path / "b", "T", 0, 4 * CQ_UNIT_SIZE)
    phys = [100 * k for k in range(7)]
    sizes = [90 + k for k in range(7)]
    tags = [k - 3 for k in range(7)]
    assert one.put_batch(0, phys[:3], sizes[:3], tags[:3])  # first file, empty queue
    assert one.put_batch(3, phys[3:], sizes[3:], tags[3:])  # crosses into the next file
    assert not one.put_batch(2, phys[2:4], sizes[2:4], tags[2:4])  # already there
    assert not one.put_batch(0, [], [], [])
    for k in range(7):
        assert other.put(phys[k], sizes[k], tags[k], k)
    assert one.max_offset_in_queue == other.max_offset_in_queue == 7
    assert one.max_physic_offset == other.max_physic_offset == phys[-1] + sizes[-1]
    for k in range(7):
        assert one.get_unit(k) == other.get_unit(k) == (phys[k], sizes[k], tags[k])


def test_dispatch_batch_columns() -> None:
    msgs = [_msg(i, queue_id=5) for i in range(3)]
    b = DispatchBatch(msgs, 10, [0, 100, 200], [100, 100, 100], NOW)
    assert (b.topic, b.queue_id, len(b)) == ("T", 5, 3)


def test_batch_stopped_by_a_failed_new_file_keeps_offsets_of_written_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cl = CommitLog(tmp_path, 4096)
    msgs = [_msg(i, queue_id=0) for i in range(12)]
    records = cl.encode(msgs)
    assert sum(records.sizes) > 4096
    fit = 0
    used = 0
    while used + records.sizes[fit] + 8 <= 4096:
        used += records.sizes[fit]
        fit += 1
    real = MappedFileQueue.file_for_append

    def no_second_file(self: MappedFileQueue, start_offset: int = 0) -> MappedFile:
        if self.files and self.files[-1].is_full:
            raise OSError("cannot create the next file")
        return real(self, start_offset)

    monkeypatch.setattr(MappedFileQueue, "file_for_append", no_second_file)
    with pytest.raises(OSError):
        cl.append(msgs, records, NOW)
    assert cl.topic_queue_table[("T", 0)] == fit
    assert cl.max_offset == 4096  # the records that fit, then the BLANK padding
    monkeypatch.setattr(MappedFileQueue, "file_for_append", real)
    again = cl.encode([_msg(50, queue_id=0), _msg(51, queue_id=0)])
    result, _ = cl.append([_msg(50, queue_id=0), _msg(51, queue_id=0)], again, NOW)
    assert result.queue_offset == fit
    assert result.wrote_offset == 4096


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_single_sends_write_the_same_bytes_through_pwrite_or_the_map(
    tmp_path: Path, flush: str
) -> None:
    """Both flush modes append single records with pwrite (SYNC_FLUSH into blocks it zeroes
    ahead): the files are the same as the batch path's, and what was written is readable
    through the map at once."""
    msgs = [m for group in _batches() for m in group]
    cfg = _cfg(tmp_path / flush).model_copy(update={"flush_disk_type": flush})
    async with MessageStore(cfg, clock=lambda: NOW / 1000) as store:
        assert store.commitlog._pwrite_appends
        assert store.commitlog._zero_blocks is (flush == "SYNC_FLUSH")
        for m in msgs:
            res = await store.put_messages([m])
            assert res.status is PutMessageStatus.PUT_OK
            assert res.append is not None
            got = store.commitlog.read_record(res.append.wrote_offset)
            assert got is not None
            assert len(got) == res.append.wrote_bytes
    ref = tmp_path / "reference"
    async with MessageStore(_cfg(ref), clock=lambda: NOW / 1000) as store:
        for group in _batches():
            assert (await store.put_messages(group)).status is PutMessageStatus.PUT_OK
    assert _tree(tmp_path / flush, "commitlog") == _tree(ref, "commitlog")
    assert _tree(tmp_path / flush, "consumequeue") == _tree(ref, "consumequeue")


@pytest.mark.parametrize("pwrite", [True, False])
def test_a_failed_single_append_gives_its_queue_offset_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pwrite: bool
) -> None:
    cl = CommitLog(tmp_path, COMMITLOG_FILE, pwrite_appends=pwrite)
    first = [_msg(0, queue_id=4)]
    cl.append(first, cl.encode(first), NOW)

    def disk_full(self: MappedFile, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MappedFile, "pwrite_append" if pwrite else "append", disk_full)
    failed = [_msg(1, queue_id=4)]
    with pytest.raises(OSError):
        cl.append(failed, cl.encode(failed), NOW)
    assert cl.topic_queue_table[("T", 4)] == 1
    monkeypatch.undo()
    again = [_msg(2, queue_id=4)]
    result, _ = cl.append(again, cl.encode(again), NOW)
    assert result.queue_offset == 1
    assert result.wrote_offset == cl.max_offset - result.wrote_bytes

"""Index entries of a run of puts (`MessageStore.begin_staging` .. `end_staging`) are written
together when the run ends, in both flush modes: the index files end up byte for byte as with
the same puts indexed one by one, nothing of the run is in the index before it ends, a run
whose write failed leaves no entry, and an index failure never fails the run."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import trio

from common.message import MessageInner
from store import MessageStore, PutMessageStatus
from store._mapped_file import MappedFile
from store.index_file import IndexService
from tests.unit.store.test_batch_append import NOW, _index_contents
from tests.unit.store.test_staged_appends import _cfg

pytestmark = pytest.mark.unit

Flush = Literal["ASYNC_FLUSH", "SYNC_FLUSH"]


def _msg(i: int, topic: str = "T", queue_id: int = 0, keys: str | None = None) -> MessageInner:
    props = {"UNIQ_KEY": f"7F0000011F9018B4AAC2{i:012X}"}
    props["KEYS"] = keys if keys is not None else f"k{i} j{i % 3}"
    return MessageInner(
        topic,
        bytes([i % 251]) * (60 + (i * 37) % 300),
        queue_id=queue_id,
        properties=props,
        born_timestamp=1_000 + i,
        born_host=("192.0.2.5", 40000 + i),
        store_host=("192.0.2.9", 10911),
    )


class _Clock:
    def __init__(self) -> None:
        self.ms = NOW

    def __call__(self) -> float:
        return self.ms / 1000


def _put(store: MessageStore, msgs: list[MessageInner]) -> None:
    result, _flush_end = store.put_messages_nowait(msgs)
    assert result.status is PutMessageStatus.PUT_OK, result.remark


# Each step: ("one", message) or ("batch", messages) or ("tick", ms), in runs.
def _steps() -> list[list[tuple[str, object]]]:
    runs: list[list[tuple[str, object]]] = []
    i = 0
    for r in range(7):
        run: list[tuple[str, object]] = []
        for k in range(6):
            topic = "T" if (r + k) % 3 else "U"
            run.append(("one", _msg(i, topic, queue_id=k % 2)))
            i += 1
            if k == 2:
                run.append(("tick", 1500))  # a new store time inside the run
            if k == 3 and r % 2:
                run.append(("batch", [_msg(i + b, "T", queue_id=1) for b in range(3)]))
                i += 3
        runs.append(run)
    return runs


def _play(store: MessageStore, clock: _Clock, run: list[tuple[str, object]]) -> None:
    for kind, what in run:
        if kind == "tick":
            assert isinstance(what, int)
            clock.ms += what
        elif kind == "one":
            assert isinstance(what, MessageInner)
            _put(store, [what])
        else:
            assert isinstance(what, list)
            _put(store, what)


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_runs_leave_the_index_of_one_by_one(tmp_path: Path, flush: Flush) -> None:
    """Runs mixing topics, queues, store times and batch puts, over several index files
    (64 entries each): the same files as the same puts indexed one by one, and every key
    found."""
    clock = _Clock()
    async with MessageStore(_cfg(tmp_path / "runs", flush), clock=clock) as store:
        for run in _steps():
            await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
            store.begin_staging()
            _play(store, clock, run)
            store.end_staging()
        index = store.dispatcher.index
        assert index is not None
        assert len(index.files) >= 3
        assert index.query("T", "k5", 8, 0, NOW + 10**7)[0]
        assert len(index.query("U", "j0", 64, 0, NOW + 10**7)[0]) >= 3
    clock = _Clock()
    async with MessageStore(_cfg(tmp_path / "plain", flush), clock=clock) as store:
        for run in _steps():
            _play(store, clock, run)
    assert _index_contents(tmp_path / "runs") == _index_contents(tmp_path / "plain")


async def test_a_runs_entries_are_written_when_it_ends(tmp_path: Path) -> None:
    async with MessageStore(_cfg(tmp_path, "SYNC_FLUSH"), clock=_Clock()) as store:
        index = store.dispatcher.index
        assert index is not None
        store.begin_staging()
        _put(store, [_msg(1, keys="alpha")])
        assert index.query("T", "alpha", 8, 0, NOW + 10**7)[0] == []
        store.end_staging()
        assert len(index.query("T", "alpha", 8, 0, NOW + 10**7)[0]) == 1
        _put(store, [_msg(2, keys="beta")])  # outside a run: indexed at once
        assert len(index.query("T", "beta", 8, 0, NOW + 10**7)[0]) == 1
        store.begin_staging()
        store.end_staging()  # a run without puts (a read of pulls)
        _put(store, [_msg(3, keys="gamma")])  # outside a run again: indexed at once
        assert len(index.query("T", "gamma", 8, 0, NOW + 10**7)[0]) == 1


async def test_a_failed_write_drops_the_runs_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MessageStore(_cfg(tmp_path), clock=_Clock()) as store:
        index = store.dispatcher.index
        assert index is not None
        _put(store, [_msg(0)])
        await trio.to_thread.run_sync(store.commitlog.reserve_ahead)
        store.begin_staging()
        _put(store, [_msg(1, keys="lost")])

        def broken(self: MappedFile, data: object, pos: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(MappedFile, "_pwrite_all", broken)
        with pytest.raises(OSError, match="Input/output"):
            store.end_staging()
        monkeypatch.undo()
        assert index.query("T", "lost", 8, 0, NOW + 10**7)[0] == []
        assert not index.deferring
        assert index.kept == []


async def test_an_index_failure_does_not_fail_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MessageStore(_cfg(tmp_path, "SYNC_FLUSH"), clock=_Clock()) as store:
        index = store.dispatcher.index
        assert index is not None

        def failing(*args: object) -> None:
            raise OSError(28, "No space left on device")

        store.begin_staging()
        _put(store, [_msg(1, keys="gamma")])
        monkeypatch.setattr(IndexService, "_index_runs", failing)
        store.end_staging()  # logged, not raised: the record is stored
        monkeypatch.undo()
        assert store.commitlog.max_offset > 0
        store.begin_staging()
        _put(store, [_msg(2, keys="delta")])
        store.end_staging()
        assert len(index.query("T", "delta", 8, 0, NOW + 10**7)[0]) == 1

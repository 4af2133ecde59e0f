"""Hypothesis state machine over the store: puts, batch puts, reads, clean restarts and crashes
that lose every unflushed byte.

The store runs in a trio loop hosted by a background thread (`TrioHost`), so it stays open across
rules; rules call into it with `trio.from_thread.run`. A crash stops the store without its clean
close, then truncates every commitlog and consume-queue file to the flushed position recorded
just before (what a power cut leaves of a sparse, mapped file). After each restart every message
acknowledged under SYNC_FLUSH must be readable with the same offsets and bytes, and nothing else.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from common.message import MessageInner, decode_records
from store import GetMessageStatus, MessageStore, PutMessageStatus, StoreConfig
from store.paths import file_name_to_offset

T = TypeVar("T")
QUEUES = 3


class TrioHost:
    """A trio loop in a thread, hosting one `MessageStore` at a time."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def open_store(self, cfg: StoreConfig) -> tuple[MessageStore, Callable[[bool], None]]:
        """Open a store in a host task; returns it and a `close(crash)` function."""

        async def host(task_status: trio.TaskStatus[Any]) -> None:
            closing = trio.Event()
            crash = [False]
            async with MessageStore(cfg) as store:
                task_status.started((store, closing, crash))
                await closing.wait()
                if crash[0]:
                    store.simulate_crash()
            done.set()

        done = threading.Event()

        async def start() -> Any:
            assert self._nursery is not None
            return await self._nursery.start(host)

        store, closing, crash = self.run(start)

        def close(do_crash: bool) -> None:
            crash[0] = do_crash
            trio.from_thread.run_sync(closing.set, trio_token=self._token)
            assert done.wait(30)

        return store, close

    def stop(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)


def _truncate_dir(directory: Path, flushed_where: int, file_size: int) -> None:
    """Cut every file of a mapped-file directory to what was durable."""
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        start = file_name_to_offset(p.name)
        if start is None:
            continue
        keep = min(max(flushed_where - start, 0), file_size)
        if keep < file_size:
            os.truncate(p, keep)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="trimq-sm-"))
        self.cfg = StoreConfig(
            store_path_root_dir=self.root,
            mapped_file_size_commitlog=4096,
            mapped_file_size_consume_queue=6 * 20,
            flush_disk_type="SYNC_FLUSH",
            flush_interval_commitlog_ms=50,
            flush_interval_consume_queue_ms=50,
            message_index_enable=False,
            sync_flush_timeout_ms=30_000,
        )
        self.host = TrioHost()
        # model: per queue, list of (queue_offset, phy, raw record, acked)
        self.model: dict[int, list[tuple[int, int, bytes, bool]]] = {q: [] for q in range(QUEUES)}
        self.counter = 0
        self._open()

    def _open(self) -> None:
        self.store, self._close = self.host.open_store(self.cfg)

    def teardown(self) -> None:
        try:
            self._close(False)
        finally:
            self.host.stop()
            shutil.rmtree(self.root, ignore_errors=True)

    def _msg(self, queue: int, size: int, wait: bool) -> MessageInner:
        self.counter += 1
        props = {"UNIQ_KEY": f"{self.counter:032X}"}
        if not wait:
            props["WAIT"] = "false"
        body = (f"{self.counter}:".encode() * (size // 4 + 1))[:size]
        return MessageInner("SM", body, queue_id=queue, properties=props, born_timestamp=1)

    def _record(self, queue: int, phys: list[int], first_qoff: int, acked: bool) -> None:
        for i, phy in enumerate(phys):
            raw = self.store.read_record(phy)
            assert raw is not None
            self.model[queue].append((first_qoff + i, phy, raw, acked))

    @rule(
        queue=st.integers(0, QUEUES - 1),
        size=st.integers(0, 700),
        wait=st.booleans(),
    )
    def put(self, queue: int, size: int, wait: bool) -> None:
        m = self._msg(queue, size, wait)
        r = self.host.run(self.store.put_message, m)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        assert r.append.queue_offset == len(self.model[queue])
        self._record(queue, r.append.phy_offsets, r.append.queue_offset, wait)

    @rule(queue=st.integers(0, QUEUES - 1), n=st.integers(1, 6), size=st.integers(0, 400))
    def put_batch(self, queue: int, n: int, size: int) -> None:
        msgs = [self._msg(queue, size, True) for _ in range(n)]
        r = self.host.run(self.store.put_messages, msgs)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        assert r.append.queue_offset == len(self.model[queue])
        assert r.append.msg_num == n
        self._record(queue, r.append.phy_offsets, r.append.queue_offset, True)

    @rule(queue=st.integers(0, QUEUES - 1), data=st.data())
    def read_some(self, queue: int, data: st.DataObject) -> None:
        entries = self.model[queue]
        offset = data.draw(st.integers(0, len(entries) + 1))
        res = self.host.run(self.store.get_message, "g", "SM", queue, offset, 4, 1 << 20)
        if offset < len(entries):
            assert res.status is GetMessageStatus.FOUND
            assert res.buffers[0] == entries[offset][2]
            assert res.queue_offsets[0] == offset
        elif entries:
            assert res.status in (
                GetMessageStatus.OFFSET_OVERFLOW_ONE,
                GetMessageStatus.OFFSET_OVERFLOW_BADLY,
            )

    @rule()
    def flush_consume_queues(self) -> None:
        # Consume queues may become durable ahead of an unflushed (WAIT=false) commitlog tail.
        self.host.run(self.store.flush_service.flush_consume_queues)

    @rule()
    def let_time_pass(self) -> None:
        self.host.run(trio.sleep, 0.06)

    @rule()
    def clean_restart(self) -> None:
        self._close(False)
        self._open()
        self._check_all()

    @rule()
    def crash_restart(self) -> None:
        store = self.store
        self._close(True)
        cl_flushed = store.commitlog.mfq.flushed_where
        _truncate_dir(store.commitlog.mfq.directory, cl_flushed, 4096)
        for cq in store.dispatcher.consume_queues.values():
            _truncate_dir(cq.mfq.directory, cq.mfq.flushed_where, cq.mfq.file_size)
        for q, entries in self.model.items():
            survivors = [e for e in entries if e[1] + len(e[2]) <= cl_flushed]
            # every acknowledged message was durable
            assert all(e in survivors for e in entries if e[3])
            self.model[q] = survivors
        self._open()
        self._check_all()

    def _check_all(self) -> None:
        for q, entries in self.model.items():
            got: list[bytes] = []
            offs: list[int] = []
            off = 0
            for _ in range(10_000):
                res = self.host.run(self.store.get_message, "g", "SM", q, off, 32, 1 << 20)
                if res.status is not GetMessageStatus.FOUND:
                    break
                got.extend(res.buffers)
                offs.extend(res.queue_offsets)
                off = res.next_begin_offset
            assert offs == [e[0] for e in entries]
            assert got == [e[2] for e in entries]
            assert [m.commit_log_offset for m in decode_records(b"".join(got))] == [
                e[1] for e in entries
            ]
            assert self.store.get_max_offset_in_queue("SM", q) == len(entries)

    @invariant()
    def offsets_match_model(self) -> None:
        for q, entries in self.model.items():
            assert self.store.get_max_offset_in_queue("SM", q) == len(entries)


StoreMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.pytestmark = [pytest.mark.slow]  # type: ignore[attr-defined]

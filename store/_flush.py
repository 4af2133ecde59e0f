"""Flushing: async (periodic) and sync (group commit) commitlog flush, consume-queue flush.

fsync runs in worker threads (``trio.to_thread.run_sync``) and never on the event loop. A file's
descriptor stays open while it is being fsync'ed because deletion takes the same lock.

Group commit (SYNC_FLUSH): a put appends, then waits in `wait_flushed(end)` (or registers a
callback with `on_flushed(end, callback)`, no task needed); one flusher task takes everything
appended so far, runs one fsync round in a thread, and wakes every waiter (calls every callback)
whose end is now durable. Puts that arrive during the fsync share the next round, which goes to
the thread as soon as the previous one ends, before its waiters are answered. The group commit's
fsync rounds go to one long-lived thread (`_FsyncThread`): a hand-off costs about half the CPU
of a `trio.to_thread.run_sync` call, and a sequential SYNC_FLUSH producer pays one per message.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable

import structlog
import trio

from store._mapped_file import MappedFile
from store.commitlog import CommitLog
from store.config import StoreConfig
from store.consume_queue import ConsumeQueue

__all__ = ["FlushService"]

log = structlog.get_logger()

PAGE_SIZE = 4096

PREFAULT_INTERVAL_S = 0.02
"""How often the commitlog pages ahead of the write position are faulted in (worker thread)."""

PREFAULT_AHEAD = 2 << 20
"""How far ahead: well over what is appended in one interval plus a journal stall (~20 ms)."""


def _fsync_files(files: list[MappedFile]) -> None:
    for mf in files:
        mf.fsync()


def _sync_ranges(ranges: list[tuple[MappedFile, int, int]]) -> None:
    for mf, start, end in ranges:
        mf.sync_range(start, end)


def _call(callback: Callable[[], object]) -> None:
    """Run a waiter's callback; a failing one must not stop the flusher or the timer."""
    try:
        callback()
    except Exception:
        log.exception("flush_callback_failed")


class _Round:
    """One fsync round handed to `_FsyncThread`."""

    __slots__ = ("box", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.box: list[BaseException | None] = []

    async def wait(self) -> None:
        """Until the round is over (shielded: the files stay open until then); raises what the
        sync raised."""
        with trio.CancelScope(shield=True):
            await self.done.wait()
        if self.box and self.box[0] is not None:
            raise self.box[0]


class _FsyncThread:
    """A dedicated worker thread for fsync rounds, fed through a queue; completion comes back
    to trio through the run's token (`run_sync_soon`)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[
            tuple[list[tuple[MappedFile, int, int]], trio.Event, list[BaseException | None]] | None
        ] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None

    def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        threading.Thread(target=self._main, name="trimq-fsync", daemon=True).start()

    def stop(self) -> None:
        if self._token is not None:
            self._token = None
            self._queue.put(None)

    @property
    def running(self) -> bool:
        return self._token is not None

    def submit(self, ranges: list[tuple[MappedFile, int, int]]) -> _Round:
        """Start syncing the file `ranges` in the thread; `await round.wait()` for the end.
        The files must stay open until then."""
        rnd = _Round()
        self._queue.put((ranges, rnd.done, rnd.box))
        return rnd

    async def fsync(self, ranges: list[tuple[MappedFile, int, int]]) -> None:
        """Sync the file `ranges` in the thread. Not cancellable (as `to_thread.run_sync`):
        the files must stay open until the sync is over."""
        await self.submit(ranges).wait()

    def _main(self) -> None:
        token = self._token
        assert token is not None
        while True:
            item = self._queue.get()
            if item is None:
                return
            ranges, done, box = item
            try:
                _sync_ranges(ranges)
                box.append(None)
            except BaseException as exc:  # handed to the waiting task
                box.append(exc)
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                return


class FlushService:
    """Owns the flush tasks of one store (started with ``nursery.start(service.run)``).

    Args:
        commitlog: The commitlog.
        config: Store configuration (flush type and intervals).
        consume_queues: Returns the consume queues to flush.
        on_commitlog_flushed: Called with the store timestamp of the newest durable record.
        on_consume_queues_flushed: Called (in a worker thread) after a consume-queue round with
            the store timestamp of the newest record they cover; it flushes the checkpoint.
    """

    def __init__(
        self,
        commitlog: CommitLog,
        config: StoreConfig,
        *,
        consume_queues: Callable[[], list[ConsumeQueue]],
        on_commitlog_flushed: Callable[[int], None],
        on_consume_queues_flushed: Callable[[int], None],
    ) -> None:
        self._cl = commitlog
        self._cfg = config
        self._cqs = consume_queues
        self._on_cl = on_commitlog_flushed
        self._on_cq = on_consume_queues_flushed
        self.commitlog_lock = trio.Lock()
        self.cq_lock = trio.Lock()
        # (end offset, callback, deadline) in arrival order: both the ends and the deadlines
        # (one timeout for all) only grow, so releases and expiries both pop from the left. The
        # callback is a waiting task's `Event.set` or an `on_flushed` caller's function.
        self._waiters: collections.deque[tuple[int, Callable[[], object], float]] = (
            collections.deque()
        )
        self._wake = trio.Event()
        self.flush_rounds = 0
        self._fsync_thread = _FsyncThread()

    @property
    def sync(self) -> bool:
        """True under SYNC_FLUSH."""
        return self._cfg.flush_disk_type == "SYNC_FLUSH"

    # ------------------------------------------------------------------ commitlog
    async def flush_commitlog(self, least_pages: int = 0) -> bool:
        """Make everything appended so far durable if at least `least_pages` pages are dirty.

        Returns True if an fsync ran.
        """
        async with self.commitlog_lock:
            mfq = self._cl.mfq
            target = mfq.max_offset
            dirty = target - mfq.flushed_where
            if dirty <= 0 or dirty < least_pages * PAGE_SIZE:
                return False
            # Only the range not yet durable: an fdatasync of the whole file would also write
            # back (and clean) the pages pre-faulted ahead of the write position.
            plan = mfq.flush_ranges(target)
            ts = self._cl.last_store_timestamp
            # msync blocks for milliseconds: keep it off the event loop.
            if self._fsync_thread.running:
                await self._fsync_thread.fsync(plan)
            else:
                await trio.to_thread.run_sync(_sync_ranges, plan)
            mfq.flushed_to(target)
            self.flush_rounds += 1
        self._on_cl(ts)
        self._release_waiters()
        return True

    def _release_waiters(self) -> None:
        flushed = self._cl.mfq.flushed_where
        waiters = self._waiters
        while waiters and waiters[0][0] <= flushed:
            _call(waiters.popleft()[1])

    def is_flushed(self, end_offset: int) -> bool:
        """True if the commitlog is durable up to `end_offset` already."""
        return self._cl.mfq.flushed_where >= end_offset

    async def wait_flushed(self, end_offset: int) -> bool:
        """Wait (group commit) until the commitlog is durable up to `end_offset`.

        Returns False if `sync_flush_timeout_ms` passed first (the data stays written). The
        timeout is enforced by one timer task for all waiters (`_timeout_loop`), not a cancel
        scope each: a scope's deadline bookkeeping cost ~5.5 us per wait.
        """
        if self._cl.mfq.flushed_where >= end_offset:
            return True
        ev = trio.Event()
        self.on_flushed(end_offset, ev.set)
        await ev.wait()
        return self._cl.mfq.flushed_where >= end_offset

    def on_flushed(self, end_offset: int, callback: Callable[[], object]) -> None:
        """Call `callback()` (on the event loop, from the flusher or the timer) once the
        commitlog is durable up to `end_offset`, or once `sync_flush_timeout_ms` passed, or
        when the service stops; the callee tells which with `is_flushed(end_offset)`.

        `wait_flushed` without a task: under SYNC_FLUSH an answer can be sent from the
        callback. The callback must not block; an exception it raises is logged.
        """
        self._waiters.append(
            (end_offset, callback, trio.current_time() + self._cfg.sync_flush_timeout_ms / 1000)
        )
        self._wake.set()

    async def _timeout_loop(self) -> None:
        """Wake the waiters whose deadline passed (they see the data not yet durable).

        Nobody signals this task (a wake-up per put would cost what the cancel scopes did):
        it sleeps until the oldest waiter's deadline, or a quarter of the timeout when none
        waits, so it always sees a new waiter well before that waiter's deadline.
        """
        waiters = self._waiters
        period = self._cfg.sync_flush_timeout_ms / 4000
        while True:
            now = trio.current_time()
            while waiters and waiters[0][2] <= now:
                _call(waiters.popleft()[1])
            await trio.sleep_until(min(waiters[0][2], now + period) if waiters else now + period)

    def _wake_all_waiters(self) -> None:
        waiters = self._waiters
        while waiters:
            _call(waiters.popleft()[1])

    async def _group_commit_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self._group_commit_rounds()
            except OSError:
                log.exception("commitlog_flush_failed")
                await trio.sleep(0.1)
            self._release_waiters()

    async def _group_commit_rounds(self) -> None:
        """fsync rounds back to back while puts wait for one (SYNC_FLUSH).

        The next round goes to the fsync thread as soon as the previous one is over, before
        that one's waiters are answered: the disk works while the loop answers, instead of
        waiting for the answers to go out and for a scheduler pass.
        """
        if not self._fsync_thread.running:
            await self.flush_commitlog()
            return
        mfq = self._cl.mfq
        waiters = self._waiters
        async with self.commitlog_lock:
            current = self._start_round()
            try:
                while current is not None:
                    target, ts, sync = current
                    current = None
                    await sync.wait()
                    mfq.flushed_to(target)
                    self.flush_rounds += 1
                    if waiters and waiters[-1][0] > target:
                        # Someone waits for what was appended meanwhile: the next round now,
                        # unless the service is stopping (nothing may be in flight then).
                        await trio.lowlevel.checkpoint_if_cancelled()
                        current = self._start_round()
                    self._on_cl(ts)
                    self._release_waiters()
            finally:
                if current is not None:  # leaving with a round in flight: it ends first
                    await current[2].wait()

    def _start_round(self) -> tuple[int, int, _Round] | None:
        """Hand everything appended so far to the fsync thread: (target, timestamp, round),
        or None when it is all durable already. Under `commitlog_lock`."""
        mfq = self._cl.mfq
        target = mfq.max_offset
        if target <= mfq.flushed_where:
            return None
        ts = self._cl.last_store_timestamp
        # Only the range not yet durable (see `flush_commitlog`); msync blocks for
        # milliseconds: the fsync thread runs it, never the event loop.
        return target, ts, self._fsync_thread.submit(mfq.flush_ranges(target))

    async def _async_flush_loop(self) -> None:
        cfg = self._cfg
        last_thorough = trio.current_time()
        while True:
            await trio.sleep(cfg.flush_interval_commitlog_ms / 1000)
            now = trio.current_time()
            least = cfg.flush_commitlog_least_pages
            if now - last_thorough >= cfg.flush_commitlog_thorough_interval_ms / 1000:
                last_thorough = now
                least = 0
            try:
                await self.flush_commitlog(least)
                # Creating the next file maps it: do it ahead of time, off the loop.
                await trio.to_thread.run_sync(self._cl.mfq.prepare_next)
                # Blocks for staged appends (`CommitLog.begin_staging`); fallocate may wait on
                # the journal: off the loop too.
                await trio.to_thread.run_sync(self._cl.reserve_ahead)
            except OSError:
                log.exception("commitlog_flush_failed")

    async def _prefault_loop(self) -> None:
        """Keep the commitlog pages ahead of the write position faulted in for writing.

        The first write to a page (and the first after an fsync cleaned it) takes a page fault
        that waits on the ext4 journal while any fsync commits it; this moves that wait to a
        worker thread (`MappedFile.prefault`), off the event loop's appends.
        """
        mfq = self._cl.mfq
        while True:
            await trio.sleep(PREFAULT_INTERVAL_S)
            if not await trio.to_thread.run_sync(mfq.prefault_ahead, PREFAULT_AHEAD):
                return  # the kernel cannot (no MADV_POPULATE_WRITE): stop trying

    # ------------------------------------------------------------------ consume queues
    async def flush_consume_queues(self) -> None:
        """fsync every dirty consume queue, then report (checkpoint)."""
        async with self.cq_lock:
            ts = self._cl.last_store_timestamp
            work: list[tuple[ConsumeQueue, int, list[MappedFile]]] = []
            for cq in self._cqs():
                mfq = cq.mfq
                target = mfq.max_offset
                if target > mfq.flushed_where:
                    work.append((cq, target, mfq.flush_plan(target)))
            files = [mf for _, _, plan in work for mf in plan]
            # fsync blocks: worker thread.
            await trio.to_thread.run_sync(_fsync_files, files)
            for cq, target, _ in work:
                cq.mfq.flushed_to(target)
            # The index write-back (fdatasync) and the checkpoint write block: worker thread too.
            await trio.to_thread.run_sync(self._on_cq, ts)

    async def _cq_flush_loop(self) -> None:
        while True:
            await trio.sleep(self._cfg.flush_interval_consume_queue_ms / 1000)
            try:
                await self.flush_consume_queues()
            except OSError:
                log.exception("consume_queue_flush_failed")

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the flush tasks until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._async_flush_loop)
                nursery.start_soon(self._cq_flush_loop)
                if self._cfg.warm_mapped_file_enable:
                    nursery.start_soon(self._prefault_loop)
                if self.sync:
                    self._fsync_thread.start()
                    nursery.start_soon(self._group_commit_loop)
                    nursery.start_soon(self._timeout_loop)
                task_status.started()
        finally:
            self._fsync_thread.stop()
            # Nobody flushes or expires any more: let waiters see where the data stands.
            self._wake_all_waiters()

    async def flush_all(self) -> None:
        """Flush commitlog and consume queues now (at close)."""
        await self.flush_commitlog()
        await self.flush_consume_queues()

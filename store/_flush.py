"""Flushing: async (periodic) and sync (group commit) commitlog flush, consume-queue flush.

fsync runs in worker threads (``trio.to_thread.run_sync``) and never on the event loop. A file's
descriptor stays open while it is being fsync'ed because deletion takes the same lock.

Group commit (SYNC_FLUSH): a put appends, then waits in `wait_flushed(end)` (or registers a
callback with `on_flushed(end, callback)`, no task needed); one flusher task takes everything
appended so far, runs one fsync round in a thread, and wakes every waiter (calls every callback)
whose end is now durable. Puts that arrive during the fsync share the next round, which goes to
the thread as soon as the previous one ends, before its waiters are answered. The group commit's
fsync rounds go to one long-lived thread: a hand-off to it is cheaper than a
`trio.to_thread.run_sync` call, and a sequential SYNC_FLUSH producer pays one per message. That
thread is native (`_NativeFsyncThread`, a C thread that never takes the GIL) when the store's
accelerators are built, else a Python thread (`_FsyncThread`).
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
import trio

from common.message import NATIVE
from store._mapped_file import ZERO_PIECE, MappedFile, is_out_of_space
from store._mapped_file_queue import MappedFileQueue
from store.commitlog import CommitLog
from store.config import StoreConfig
from store.consume_queue import ConsumeQueue

if TYPE_CHECKING:
    from common.speedups import FsyncWorker

_native: Any = None  # common.speedups when in use (its FsyncWorker is Linux only)
if NATIVE:
    import common.speedups as _native

__all__ = ["FlushService"]

log = structlog.get_logger()

PAGE_SIZE = 4096

PREFAULT_INTERVAL_S = 0.02
"""How often the commitlog pages ahead of the write position are faulted in (worker thread)."""

PREFAULT_AHEAD = 2 << 20
"""How far ahead: well over what is appended in one interval plus a journal stall (~20 ms)."""

ZERO_INTERVAL_S = 0.02
"""SYNC_FLUSH: how often the commitlog blocks ahead of the write position are checked for
zeroing (`CommitLog.zero_ahead`)."""

ZERO_RETRY_S = 1.0
"""After a failed zero write (ENOSPC, EIO), the zero loop waits this long before trying again."""

ZERO_AHEAD = 4 << 20
"""How far ahead they are zeroed (refilled once less than half is left): ~0.1 s of SYNC_FLUSH
appends at 30,000 1 KiB sends/s, written and synced in pieces of `ZERO_PIECE`."""


def _fsync_files(files: list[MappedFile]) -> None:
    for mf in files:
        mf.fsync()


def _prepare_next_files(queues: list[MappedFileQueue]) -> tuple[OSError, int] | None:
    """`prepare_next` of each queue (the ones written since the last round); the first
    failure and its file size, if any (the other queues are still prepared)."""
    failure: tuple[OSError, int] | None = None
    for mfq in queues:
        try:
            mfq.prepare_next()
        except OSError as exc:
            if failure is None:
                failure = (exc, mfq.file_size)
    return failure


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
    """One fsync round handed to `_FsyncThread`: the file ranges to sync and, for a group
    commit round, the commitlog offset they make durable and its store timestamp.

    Until the thread takes it (`taken`), the event loop may still extend a queued round to
    what was appended since (`_FsyncThread.extend`)."""

    __slots__ = ("box", "done", "lo", "ranges", "rid", "taken", "target", "ts")

    def __init__(
        self, ranges: list[tuple[MappedFile, int, int]], lo: int = 0, target: int = 0, ts: int = 0
    ) -> None:
        self.done = trio.Event()
        self.box: list[BaseException | None] = []
        self.ranges = ranges
        self.lo = lo
        self.target = target
        self.ts = ts
        self.taken = False
        self.rid = 0  # its id with the native worker

    def retarget(self, ranges: list[tuple[MappedFile, int, int]], target: int, ts: int) -> None:
        """Sync `ranges` (up to commitlog offset `target`, store time `ts`) instead: the round
        was extended before the thread took it."""
        self.ranges = ranges
        self.target = target
        self.ts = ts

    async def wait(self) -> None:
        """Until the round is over (shielded: the files stay open until then); raises what the
        sync raised."""
        with trio.CancelScope(shield=True):
            await self._until_done()
        if self.box and self.box[0] is not None:
            raise self.box[0]

    async def _until_done(self) -> None:
        await self.done.wait()


class _FsyncThread:
    """A dedicated worker thread for fsync rounds, fed through a queue; completion comes back
    to trio through the run's token (`run_sync_soon`).

    The thread takes the next queued round as soon as it has synced the previous one, without
    waiting for the event loop to see that one end: under load the loop notices an end only
    after the run of sends it is handling, and the disk would sit idle meanwhile
    (docs/design-notes.md, "Pipelined group commit")."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Round | None] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None
        # Orders `extend` (loop) against the thread taking a round: a round's ranges are
        # either extended before the thread reads them or not at all.
        self._lock = threading.Lock()

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

    def submit(
        self, ranges: list[tuple[MappedFile, int, int]], lo: int = 0, target: int = 0, ts: int = 0
    ) -> _Round:
        """Start syncing the file `ranges` in the thread; `await round.wait()` for the end.
        The files must stay open until then."""
        rnd = _Round(ranges, lo, target, ts)
        self._queue.put(rnd)
        return rnd

    def extend(
        self, rnd: _Round, ranges: list[tuple[MappedFile, int, int]], target: int, ts: int
    ) -> bool:
        """Make a submitted round sync `ranges` (up to commitlog offset `target`) instead, if
        the thread has not taken it yet; False if it has (the round stays as it was)."""
        with self._lock:
            if rnd.taken:
                return False
            rnd.retarget(ranges, target, ts)
            return True

    async def fsync(self, ranges: list[tuple[MappedFile, int, int]]) -> None:
        """Sync the file `ranges` in the thread. Not cancellable (as `to_thread.run_sync`):
        the files must stay open until the sync is over."""
        await self.submit(ranges).wait()

    def _main(self) -> None:
        token = self._token
        assert token is not None
        lock = self._lock
        while True:
            rnd = self._queue.get()
            if rnd is None:
                return
            with lock:
                rnd.taken = True
                ranges = rnd.ranges
            try:
                _sync_ranges(ranges)
                rnd.box.append(None)
            except BaseException as exc:  # handed to the waiting task
                rnd.box.append(exc)
            try:
                token.run_sync_soon(rnd.done.set)
            except trio.RunFinishedError:
                return


class _NativeRound(_Round):
    """A round of the native worker: its waiter also collects the worker's results
    (`_NativeFsyncThread.wait_done`)."""

    __slots__ = ("owner",)

    def __init__(
        self,
        owner: _NativeFsyncThread,
        ranges: list[tuple[MappedFile, int, int]],
        lo: int = 0,
        target: int = 0,
        ts: int = 0,
    ) -> None:
        super().__init__(ranges, lo, target, ts)
        self.owner = owner

    async def _until_done(self) -> None:
        await self.owner.wait_done(self)


class _NativeFsyncThread:
    """`_FsyncThread` with the thread in C (`common.speedups.FsyncWorker`): it syncs a round's
    ranges, and signals an eventfd, without ever taking the GIL.

    A Python thread needs the GIL after every msync and again to hand the end to trio; the
    event loop holds it while it works through a read of sends and lets go only at its next
    system call, so a round's end reaches the loop late, and the next round starts late
    (docs/design-notes.md, "Native fsync thread"). Same interface and guarantees: rounds are
    synced one at a time, in submission order; a queued round may be extended until the
    thread takes it; `stop` lets the thread finish the rounds queued before it.

    No task delivers the results: whoever waits for a round waits on the eventfd and hands
    every finished round its result. Rounds are waited for under the flush service's
    `commitlog_lock`, one waiter at a time; a lock keeps a second one (should there be one)
    from waiting on the descriptor at the same time. So the descriptor is never waited on once
    the service stops, and it closes with the worker.
    """

    def __init__(self, native: Any) -> None:
        self._native = native
        self._worker: FsyncWorker | None = None
        self._rounds: dict[int, _NativeRound] = {}
        self._ids = itertools.count(1)
        self._poll_lock = trio.Lock()

    def start(self) -> None:
        worker = self._native.FsyncWorker()
        worker.start()
        self._worker = worker

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    @property
    def running(self) -> bool:
        return self._worker is not None

    def _running(self) -> FsyncWorker:
        worker = self._worker
        if worker is None:
            raise RuntimeError("the fsync thread is not running")
        return worker

    @staticmethod
    def _plan(ranges: list[tuple[MappedFile, int, int]]) -> list[tuple[int, int, int]]:
        plan = []
        for mf, start, end in ranges:
            step = mf.sync_plan(start, end)
            if step is not None:
                plan.append(step)
        return plan

    def submit(
        self, ranges: list[tuple[MappedFile, int, int]], lo: int = 0, target: int = 0, ts: int = 0
    ) -> _NativeRound:
        """As `_FsyncThread.submit`."""
        rnd = _NativeRound(self, ranges, lo, target, ts)
        rnd.rid = next(self._ids)
        self._running().submit(rnd.rid, self._plan(ranges))
        self._rounds[rnd.rid] = rnd
        return rnd

    def extend(
        self, rnd: _Round, ranges: list[tuple[MappedFile, int, int]], target: int, ts: int
    ) -> bool:
        """As `_FsyncThread.extend`."""
        if not self._running().extend(rnd.rid, self._plan(ranges)):
            return False
        rnd.retarget(ranges, target, ts)
        return True

    async def fsync(self, ranges: list[tuple[MappedFile, int, int]]) -> None:
        """As `_FsyncThread.fsync`."""
        await self.submit(ranges).wait()

    async def wait_done(self, rnd: _NativeRound) -> None:
        """Until `rnd` is done, handing every round the worker finished its result."""
        while not rnd.done.is_set():
            async with self._poll_lock:
                if rnd.done.is_set():
                    break
                worker = self._running()
                await trio.lowlevel.wait_readable(worker.fileno())
                for rid, err in worker.collect():
                    done = self._rounds.pop(rid)
                    done.box.append(
                        OSError(err, f"msync failed: {os.strerror(err)}") if err else None
                    )
                    done.done.set()


def _fsync_thread() -> _FsyncThread | _NativeFsyncThread:
    """The native fsync thread when the accelerators are in use and have it, else the
    Python one."""
    if _native is not None and hasattr(_native, "FsyncWorker"):
        return _NativeFsyncThread(_native)
    return _FsyncThread()


class FlushService:
    """Owns the flush tasks of one store (started with ``nursery.start(service.run)``).

    Args:
        commitlog: The commitlog.
        config: Store configuration (flush type and intervals).
        consume_queues: Returns the consume queues to flush.
        on_commitlog_flushed: Called with the store timestamp of the newest durable record.
        on_consume_queues_flushed: Called (in a worker thread) after a consume-queue round with
            the store timestamp of the newest record they cover; it flushes the checkpoint.
        on_out_of_space: Called on the event loop with the error, the file size and what
            kind of file ("commitlog", "consume queue") when a file could not be created ahead
            of time for want of space.
    """

    def __init__(
        self,
        commitlog: CommitLog,
        config: StoreConfig,
        *,
        consume_queues: Callable[[], list[ConsumeQueue]],
        on_commitlog_flushed: Callable[[int], None],
        on_consume_queues_flushed: Callable[[int], None],
        on_out_of_space: Callable[[OSError, int, str], None] | None = None,
    ) -> None:
        self._cl = commitlog
        self._on_out_of_space = on_out_of_space
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
        self._fsync_thread = _fsync_thread()
        # Group commit rounds handed to the fsync thread and not yet seen to end, oldest
        # first; each covers the commitlog from the previous one's target (or what was durable)
        # to its own. Only `_group_commit_rounds` (which holds `commitlog_lock` meanwhile) and
        # `on_flushed` touch it.
        self._rounds: collections.deque[_Round] = collections.deque()

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
        scope each, whose deadline bookkeeping every put would pay.
        (docs/design-notes.md, "Request waiters and timers")
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
        rounds = self._rounds
        if rounds and end_offset > rounds[-1].target:
            self._queue_round(rounds[-1])
        self._wake.set()

    def _queue_round(self, last: _Round) -> None:
        """Rounds are in flight and a put waits beyond them: extend the last round to
        everything appended so far if the thread has not taken it yet, else queue a round for
        the rest, which the thread starts right after the last one ends."""
        mfq = self._cl.mfq
        # Every append below max_offset is complete and in the page cache: only SYNC_FLUSH
        # puts wait (and so get here), and never within a run of staged appends (a run's
        # puts wait from its end, after `end_staging` wrote them).
        target = mfq.max_offset
        ts = self._cl.last_store_timestamp
        if self._fsync_thread.extend(last, mfq.flush_ranges(target, last.lo), target, ts):
            return
        self._rounds.append(
            self._fsync_thread.submit(
                mfq.flush_ranges(target, last.target), last.target, target, ts
            )
        )

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

        A put that waits while rounds are in flight extends the last round not yet taken by
        the fsync thread, or queues the next one (`on_flushed`), so the thread goes on to it
        as soon as it has synced the previous one, before the loop has seen that one end.
        Otherwise the next round goes to the thread as soon as the loop sees the previous one
        end, before that one's waiters are answered. A round is counted durable only when all
        rounds before it succeeded.
        """
        if not self._fsync_thread.running:
            await self.flush_commitlog()
            return
        mfq = self._cl.mfq
        waiters = self._waiters
        rounds = self._rounds
        async with self.commitlog_lock:
            self._start_round()
            try:
                while rounds:
                    rnd = rounds[0]
                    await rnd.wait()
                    rounds.popleft()
                    mfq.flushed_to(rnd.target)
                    self.flush_rounds += 1
                    if not rounds and waiters and waiters[-1][0] > rnd.target:
                        # Someone waits for what was appended meanwhile: the next round now,
                        # unless the service is stopping (nothing may be in flight then).
                        await trio.lowlevel.checkpoint_if_cancelled()
                        self._start_round()
                    self._on_cl(rnd.ts)
                    self._release_waiters()
            finally:
                # Leaving (cancelled, or a round failed) with rounds in flight: they end
                # first, and none counts (a later round's range is durable, an earlier one's
                # may not be: the next round starts again from what is durable).
                while rounds:
                    try:
                        await rounds[0].wait()
                    except Exception:
                        # The first failure (above) is what propagates; the others only
                        # have to end before the lock is released.
                        pass
                    rounds.popleft()

    def _start_round(self) -> None:
        """Hand everything appended so far to the fsync thread (a round in `_rounds`), unless
        it is all durable already. Under `commitlog_lock`, with no round in flight."""
        mfq = self._cl.mfq
        target = mfq.max_offset
        lo = mfq.flushed_where
        if target <= lo:
            return
        ts = self._cl.last_store_timestamp
        # Only the range not yet durable (see `flush_commitlog`); msync blocks for
        # milliseconds: the fsync thread runs it, never the event loop.
        self._rounds.append(self._fsync_thread.submit(mfq.flush_ranges(target), lo, target, ts))

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
            except OSError:
                log.exception("commitlog_flush_failed")
            try:
                # Creating the next file reserves its space (fallocate) and maps it: ahead of
                # time, off the loop.
                await trio.to_thread.run_sync(self._cl.mfq.prepare_next)
                # Blocks for staged appends (`CommitLog.begin_staging`); fallocate may wait on
                # the journal: off the loop too.
                await trio.to_thread.run_sync(self._cl.reserve_ahead)
            except OSError as exc:
                self._file_failed(exc, self._cl.file_size, "commitlog")

    def _file_failed(self, exc: OSError, size: int, what: str) -> None:
        if is_out_of_space(exc) and self._on_out_of_space is not None:
            self._on_out_of_space(exc, size, what)
        else:
            log.error("mapped_file_prepare_failed", what=what, error=str(exc))

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

    async def _zero_loop(self) -> None:
        """SYNC_FLUSH: keep the commitlog blocks ahead of the write position zeroed and synced
        (`CommitLog.zero_ahead`), so the group commit's rounds commit no block metadata.

        The zeros are written on the event loop, a piece at a time (a page-cache write, as
        the appends), and each piece is synced in a worker thread (msync of its range: it
        waits on the disk) before the next: small syncs delay a concurrent group-commit round
        less than one large one (docs/design-notes.md, "Zeroed blocks ahead").
        """
        cl = self._cl
        most = 2 * ZERO_AHEAD // ZERO_PIECE  # bounded even while appends keep moving ahead
        while True:
            await trio.sleep(ZERO_INTERVAL_S)
            if not cl.zeros_due(ZERO_AHEAD):
                continue
            try:
                for _ in range(most):
                    mf = cl.zero_ahead(ZERO_AHEAD, ZERO_PIECE)
                    if mf is None:
                        break
                    end = mf.reserved_to
                    # Still mapped: cleanup never takes the last file and the store closes
                    # its files after this task has ended. Only a forced cleanup (disk full)
                    # of a file that rolled meanwhile could unmap it first: msync then fails,
                    # logged below.
                    await trio.to_thread.run_sync(mf.sync_range, max(0, end - ZERO_PIECE), end)
            except OSError:
                # Appends past the zeroed blocks are written at once, and fail themselves if
                # the disk is full; try again later, without a log line every interval.
                log.exception("commitlog_zero_failed")
                await trio.sleep(ZERO_RETRY_S)

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
        # The queues written to get their next file ahead of time (created, reserved with
        # fallocate and mapped in a worker thread) once their last one is half full.
        failure = await trio.to_thread.run_sync(_prepare_next_files, [cq.mfq for cq, _, _ in work])
        if failure is not None:
            self._file_failed(failure[0], failure[1], "consume queue")

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
                    nursery.start_soon(self._zero_loop)
                task_status.started()
        finally:
            self._fsync_thread.stop()
            # Nobody flushes or expires any more: let waiters see where the data stands.
            self._wake_all_waiters()

    async def flush_all(self) -> None:
        """Flush commitlog and consume queues now (at close)."""
        await self.flush_commitlog()
        await self.flush_consume_queues()

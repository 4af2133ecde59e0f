"""NATS JetStream side of W1-W5, with nats-py (the standard Python client), one JSON line out.

    python -m bench.peers.nats_client --url nats://127.0.0.1:4222 --workload W1 --count 100000

Streams use file storage and JetStream's defaults otherwise. W3 is a durable pull consumer
(fetch 32, AckAll on the last message of each batch: an offset commit); W4 publishes at a fixed
rate with up to 64 acks pending while a pull consumer on the same process measures
publish-to-receive latency from the time stamped in the body.

Publishes never pass `wait_stall` (with it, nats-py acquires its pending semaphore through
`asyncio.wait_for`, a task per publish). W1, W2 and W5 send the bodies of `_stats.body_pool`
in turn, as every system does. The connection and JetStream-context knobs are options
(`--help`); their defaults are the best settings of `bench.peers.nats_sweep`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import itertools
import json
import time
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api

from ._stats import WARMUP_S, body_pool, e2e_body, e2e_latency_ms, random_body, summary

STREAMS = {"W1": "BENCH", "W2": "BENCH", "W3": "BENCH", "W4": "E2E", "W5": "SEQ"}
# Acks pending at most (nats-py's `publish_async_max_pending`): W1's window is 64 on every
# system; W2 never has more than its 4 batches of 32 pending.
MAX_PENDING = {"W1": 64, "W2": 4 * 32, "W4": 64}
# The connection's knobs (nats.connect): pending buffer bytes (a publish that takes it past
# this waits for the flusher), flusher queue size, forced-flush timeout, and whether each
# publish's subjects are checked (a regex search each).
PENDING_SIZE = 64 * 1024  # nats-py's default: 2 MiB
FLUSHER_QUEUE_SIZE = 1024  # nats-py's default
FLUSH_TIMEOUT: float | None = None  # nats-py's default
SKIP_SUBJECT_VALIDATION = True  # the subjects are constants of this module


async def _stream(js: Any, name: str) -> str:
    subject = name.lower()
    with contextlib.suppress(Exception):  # already there (W3 reads what W1/W2 wrote)
        await js.add_stream(name=name, subjects=[subject], storage=api.StorageType.FILE)
    return subject


async def w_publish(
    nc: Any, subject_name: str, count: int, limit: float, window: int
) -> dict[str, Any]:
    """W1: publish_async with `window` acks pending; latency = publish to ack.

    A publish's clock starts once `publish_async` returns (its slot in the window taken, the
    message in the client's buffer), as a trimq sender's starts when its worker is free.
    """
    js = nc.jetstream(publish_async_max_pending=window, timeout=10)
    subject = await _stream(js, subject_name)
    bodies = body_pool()
    lat: list[float] = []
    errors = [0]
    last = [0.0]

    def done(t0: float, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            errors[0] += 1
            return
        now = time.perf_counter()
        lat.append((now - t0) * 1000.0)
        last[0] = now

    start = time.perf_counter()
    deadline = start + limit
    sent = 0
    while sent < count and time.perf_counter() < deadline:
        fut = await js.publish_async(subject, bodies[sent % len(bodies)])
        fut.add_done_callback(functools.partial(done, time.perf_counter()))
        sent += 1
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            js.publish_async_completed(), timeout=max(1.0, deadline - time.perf_counter())
        )
    elapsed = (last[0] or time.perf_counter()) - start
    return summary("nats-publish", len(lat), elapsed, lat, sent - len(lat))


async def w_batch(
    nc: Any,
    subject_name: str,
    count: int,
    limit: float,
    max_pending: int,
    workers: int = 4,
    batch: int = 32,
) -> dict[str, Any]:
    """W2: batches of 32 (publish_async 32, then wait for the 32 acks), 4 batches in flight."""
    js = nc.jetstream(publish_async_max_pending=max_pending, timeout=10)
    subject = await _stream(js, subject_name)
    bodies = body_pool()
    next_body = itertools.cycle(bodies).__next__
    lat: list[float] = []
    state = {"left": count, "done": 0, "errors": 0}
    start = time.perf_counter()
    deadline = start + limit

    async def worker() -> None:
        while state["left"] > 0 and time.perf_counter() < deadline:
            n = min(batch, state["left"])
            state["left"] -= n
            t0 = time.perf_counter()
            futs = [await js.publish_async(subject, next_body()) for _ in range(n)]
            results = await asyncio.gather(*futs, return_exceptions=True)
            bad = sum(1 for r in results if isinstance(r, BaseException))
            state["errors"] += bad
            state["done"] += n - bad
            lat.append((time.perf_counter() - t0) * 1000.0)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), timeout=limit + 5)
    return summary("nats-batch", state["done"], time.perf_counter() - start, lat, state["errors"])


async def w_consume(nc: Any, subject_name: str, count: int, limit: float) -> dict[str, Any]:
    """W3: durable pull consumer from the first message, fetch 32, AckAll per batch."""
    js = nc.jetstream(timeout=10)
    subject = await _stream(js, subject_name)
    cfg = api.ConsumerConfig(
        durable_name="bench_w3",
        deliver_policy=api.DeliverPolicy.ALL,
        ack_policy=api.AckPolicy.ALL,
    )
    sub = await js.pull_subscribe(subject, durable="bench_w3", stream=subject_name, config=cfg)
    got = 0
    start = time.perf_counter()
    deadline = start + limit
    while got < count and time.perf_counter() < deadline:
        try:
            msgs = await sub.fetch(32, timeout=2)
        except NatsTimeoutError:
            continue
        got += len(msgs)
        await msgs[-1].ack()
    elapsed = time.perf_counter() - start
    await nc.flush()
    return summary("nats-consume", got, elapsed, [])


async def w_e2e(
    nc: Any, subject_name: str, rate: int, seconds: float, max_pending: int
) -> dict[str, Any]:
    """W4: publish at a fixed rate; a pull consumer (fetch 32) measures end-to-end latency."""
    js = nc.jetstream(publish_async_max_pending=max_pending, timeout=10)
    subject = await _stream(js, subject_name)
    cfg = api.ConsumerConfig(
        durable_name="bench_w4",
        deliver_policy=api.DeliverPolicy.NEW,
        ack_policy=api.AckPolicy.ALL,
    )
    sub = await js.pull_subscribe(subject, durable="bench_w4", stream=subject_name, config=cfg)
    pad = random_body(1024 - 16)
    lat: list[float] = []
    ready = asyncio.Event()
    total = int(rate * seconds)
    stop_at = [time.perf_counter() + seconds + 60]

    async def consume() -> None:
        seen = 0
        while seen < total and time.perf_counter() < stop_at[0]:
            try:
                msgs = await sub.fetch(32, timeout=0.5)
            except NatsTimeoutError:
                continue
            for m in msgs:
                seq, ms = e2e_latency_ms(m.data)
                if seq < 0:
                    ready.set()
                else:
                    lat.append(ms)
                    seen += 1
            await msgs[-1].ack()

    consumer = asyncio.create_task(consume())
    for _ in range(200):  # warm-up probes until the consumer sees one (bounded: 20 s)
        await js.publish(subject, e2e_body(-1, pad))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready.wait(), timeout=0.1)
            break
    # As trimq_e2e.freeze_startup_heap: start-up objects out of the collector's reach, so
    # full collections during the paced loop scan only what the run allocates.
    gc.collect()
    gc.freeze()
    pending: set[asyncio.Future[Any]] = set()
    start = time.perf_counter()
    warm = int(WARMUP_S * rate)  # paced warm-up (seq -1, not measured)
    for i in range(-warm, total):
        delay = start + (i + warm) / rate - time.perf_counter()
        # Always yield (sleep 0 when behind): a sender that is late must not starve the
        # consumer task of the same process.
        await asyncio.sleep(max(delay, 0))
        fut = await js.publish_async(subject, e2e_body(max(i, -1), pad))
        pending.add(fut)
        fut.add_done_callback(pending.discard)
    stop_at[0] = time.perf_counter() + 10
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consumer, timeout=11)
    return summary("nats-e2e", len(lat), seconds, lat, total - len(lat), rate=rate)


async def w_sequential(nc: Any, subject_name: str, count: int, limit: float) -> dict[str, Any]:
    """W5: one publish at a time, each waiting for its ack."""
    js = nc.jetstream(timeout=10)
    subject = await _stream(js, subject_name)
    bodies = body_pool()
    lat: list[float] = []
    start = time.perf_counter()
    deadline = start + limit
    for i in range(count):
        if time.perf_counter() >= deadline:
            break
        t0 = time.perf_counter()
        await js.publish(subject, bodies[i % len(bodies)])
        lat.append((time.perf_counter() - t0) * 1000.0)
    return summary("nats-sequential", len(lat), time.perf_counter() - start, lat)


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    nc = await nats.connect(
        opts.url,
        connect_timeout=5,
        max_reconnect_attempts=0,
        pending_size=opts.pending_size,
        flusher_queue_size=opts.flusher_queue_size,
        flush_timeout=opts.flush_timeout,
        skip_subject_validation=opts.skip_subject_validation,
    )
    try:
        stream = STREAMS[opts.workload]
        pending = opts.max_pending or MAX_PENDING.get(opts.workload, 0)
        if opts.workload == "W1":
            return await w_publish(nc, stream, opts.count, opts.limit, pending)
        if opts.workload == "W2":
            return await w_batch(nc, stream, opts.count, opts.limit, pending)
        if opts.workload == "W3":
            return await w_consume(nc, stream, opts.count, opts.limit)
        if opts.workload == "W4":
            return await w_e2e(nc, stream, opts.rate, opts.seconds, pending)
        return await w_sequential(nc, stream, opts.count, opts.limit)
    finally:
        await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--workload", choices=sorted(STREAMS), required=True)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--limit", type=float, default=120.0, help="seconds at most")
    ap.add_argument("--rate", type=int, default=2000, help="W4 messages/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="W4 duration")
    knobs = ap.add_argument_group("nats-py knobs (defaults: the sweep's best)")
    knobs.add_argument(
        "--max-pending",
        type=int,
        default=0,
        help=f"publish_async_max_pending (0: the workload's, {MAX_PENDING})",
    )
    knobs.add_argument("--pending-size", type=int, default=PENDING_SIZE, help="bytes")
    knobs.add_argument("--flusher-queue-size", type=int, default=FLUSHER_QUEUE_SIZE)
    knobs.add_argument(
        "--flush-timeout", type=float, default=FLUSH_TIMEOUT, help="seconds (default: none)"
    )
    knobs.add_argument(
        "--skip-subject-validation",
        action=argparse.BooleanOptionalAction,
        default=SKIP_SUBJECT_VALIDATION,
    )
    opts = ap.parse_args()
    print(json.dumps(asyncio.run(run(opts)), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()

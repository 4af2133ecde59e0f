"""Redis Streams side of W1-W5, with redis-py + hiredis (the standard client), one JSON line out.

    python -m bench.peers.redis_client --port 6379 --workload W1 --count 100000

W1 keeps a window of 64 XADDs in flight as two connections each pipelining 32; W2 is 4
connections each pipelining batches of 32; W3 is a consumer group read from the start, 32 per
XREADGROUP, the XACK of a batch pipelined with the next read; W4 is paced XADDs (up to 64 in
flight) while a consumer group reader (BLOCK, COUNT 32) measures end-to-end latency; W5 is one
XADD at a time. W1, W2 and W5 send the bodies of `_stats.body_pool` in turn, as every system does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import time
from typing import Any

import redis.asyncio as aioredis

from ._stats import WARMUP_S, body_pool, e2e_body, e2e_latency_ms, random_body, summary

STREAMS = {"W1": "bench", "W2": "bench", "W3": "bench", "W4": "e2e", "W5": "seq"}


async def w_pipelined(
    r: Any, stream: str, count: int, limit: float, conns: int, depth: int, kind: str
) -> dict[str, Any]:
    """`conns` connections, each sending pipelines of `depth` XADDs (latency = pipeline RTT)."""
    next_body = itertools.cycle(body_pool()).__next__
    lat: list[float] = []
    state = {"left": count, "done": 0, "errors": 0}
    start = time.perf_counter()
    deadline = start + limit
    last = [start]

    async def worker() -> None:
        while state["left"] > 0 and time.perf_counter() < deadline:
            n = min(depth, state["left"])
            state["left"] -= n
            t0 = time.perf_counter()
            async with r.pipeline(transaction=False) as pipe:
                for _ in range(n):
                    pipe.xadd(stream, {"b": next_body()})
                try:
                    await pipe.execute()
                except Exception:
                    state["errors"] += n
                    continue
            now = time.perf_counter()
            ms = (now - t0) * 1000.0
            lat.extend([ms] * n if kind == "redis-publish" else [ms])
            state["done"] += n
            last[0] = now

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(conns))), timeout=limit + 5)
    return summary(kind, state["done"], last[0] - start, lat, state["errors"])


async def w_consume(r: Any, stream: str, count: int, limit: float) -> dict[str, Any]:
    """W3: XREADGROUP COUNT 32 from the start; each batch's XACK rides with the next read."""
    with contextlib.suppress(Exception):  # group exists
        await r.xgroup_create(stream, "bench_w3", id="0", mkstream=True)
    got = 0
    ids: list[bytes] = []
    start = time.perf_counter()
    deadline = start + limit
    while got < count and time.perf_counter() < deadline:
        async with r.pipeline(transaction=False) as pipe:
            if ids:
                pipe.xack(stream, "bench_w3", *ids)
            pipe.xreadgroup("bench_w3", "c1", {stream: ">"}, count=32, block=1000)
            res = await pipe.execute()
        batch = res[-1][0][1] if res[-1] else []
        ids = [mid for mid, _ in batch]
        got += len(batch)
    elapsed = time.perf_counter() - start
    if ids:
        await r.xack(stream, "bench_w3", *ids)
    return summary("redis-consume", got, elapsed, [])


async def w_e2e(r: Any, stream: str, rate: int, seconds: float) -> dict[str, Any]:
    """W4: paced XADDs (64 in flight at most), consumer group reader measures latency."""
    with contextlib.suppress(Exception):
        await r.xgroup_create(stream, "bench_w4", id="$", mkstream=True)
    pad = random_body(1024 - 16)
    lat: list[float] = []
    total = int(rate * seconds)
    stop_at = [time.perf_counter() + seconds + 60]

    async def consume() -> None:
        seen = 0
        ids: list[bytes] = []
        while seen < total and time.perf_counter() < stop_at[0]:
            async with r.pipeline(transaction=False) as pipe:
                if ids:
                    pipe.xack(stream, "bench_w4", *ids)
                pipe.xreadgroup("bench_w4", "c1", {stream: ">"}, count=32, block=500)
                res = await pipe.execute()
            batch = res[-1][0][1] if res[-1] else []
            ids = [mid for mid, _ in batch]
            for _, fields in batch:
                seq, ms = e2e_latency_ms(fields[b"b"])
                if seq >= 0:
                    lat.append(ms)
                    seen += 1

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.2)  # the reader's first XREADGROUP is blocking on the server
    # As trimq_e2e.freeze_startup_heap: start-up objects out of the collector's reach, so
    # full collections during the paced loop scan only what the run allocates.
    gc.collect()
    gc.freeze()
    sem = asyncio.Semaphore(64)
    tasks: set[asyncio.Task[Any]] = set()

    async def send(i: int) -> None:
        try:
            await r.xadd(stream, {"b": e2e_body(i, pad)})
        finally:
            sem.release()

    start = time.perf_counter()
    warm = int(WARMUP_S * rate)  # paced warm-up (seq -1, not measured)
    for i in range(-warm, total):
        delay = start + (i + warm) / rate - time.perf_counter()
        # Always yield (sleep 0 when behind): a sender that is late must not starve the
        # consumer task of the same process.
        await asyncio.sleep(max(delay, 0))
        await sem.acquire()
        t = asyncio.create_task(send(max(i, -1)))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    stop_at[0] = time.perf_counter() + 10
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consumer, timeout=11)
    return summary("redis-e2e", len(lat), seconds, lat, total - len(lat), rate=rate)


async def w_sequential(r: Any, stream: str, count: int, limit: float) -> dict[str, Any]:
    """W5: one XADD at a time."""
    bodies = body_pool()
    lat: list[float] = []
    start = time.perf_counter()
    deadline = start + limit
    for i in range(count):
        if time.perf_counter() >= deadline:
            break
        t0 = time.perf_counter()
        await r.xadd(stream, {"b": bodies[i % len(bodies)]})
        lat.append((time.perf_counter() - t0) * 1000.0)
    return summary("redis-sequential", len(lat), time.perf_counter() - start, lat)


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    r = aioredis.Redis(host="127.0.0.1", port=opts.port, socket_timeout=30, max_connections=128)
    try:
        stream = STREAMS[opts.workload]
        if opts.workload == "W1":
            return await w_pipelined(r, stream, opts.count, opts.limit, 2, 32, "redis-publish")
        if opts.workload == "W2":
            return await w_pipelined(r, stream, opts.count, opts.limit, 4, 32, "redis-batch")
        if opts.workload == "W3":
            return await w_consume(r, stream, opts.count, opts.limit)
        if opts.workload == "W4":
            return await w_e2e(r, stream, opts.rate, opts.seconds)
        return await w_sequential(r, stream, opts.count, opts.limit)
    finally:
        await r.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workload", choices=sorted(STREAMS), required=True)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--limit", type=float, default=120.0, help="seconds at most")
    ap.add_argument("--rate", type=int, default=2000, help="W4 messages/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="W4 duration")
    opts = ap.parse_args()
    print(json.dumps(asyncio.run(run(opts)), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()

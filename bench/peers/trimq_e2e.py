"""trimq side of W4 (mqbench has no fixed-rate mode): end-to-end latency at a fixed rate.

    python -m bench.peers.trimq_e2e -n 127.0.0.1:9876 -t BenchE2E --rate 2000 --seconds 10

One process, trimq's own client library: a Producer sends at the fixed rate (up to 64 sends in
flight, so a slow ack never delays the schedule) while a PushConsumer (long-poll pulls of 32)
measures publish-to-receive latency from the time stamped in the body. Prints one JSON line.

Once both clients are started, the start-up heap (imports, configuration, routes) is moved
out of the garbage collector's reach with `gc.freeze()`, as latency-sensitive Python
services do: otherwise every full (generation 2) collection, about one every 4-5 s at this
rate, rescans those ~48,000 objects and stalls the process for 14-38 ms (measured on the
bench box) while collecting nothing. The peers' W4 clients (`nats_client.py`,
`redis_client.py`) need the same two lines at the same point (once started, before the paced
loop) for the comparison to stay equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from client import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendStatus,
)
from client.cli.mqbench import freeze_startup_heap as freeze_startup_heap  # re-exported
from remoting.logs import configure_logging

from ._stats import WARMUP_S, e2e_body, e2e_latency_ms, random_body, summary

WINDOW = 64  # sends in flight at most (as the peers' W4 clients)


async def paced(
    rate: float,
    seqs: Sequence[int],
    send: Callable[[int], Awaitable[None]],
    window: int = WINDOW,
) -> None:
    """Start `send(seq)` for each of `seqs` at `rate` per second, each in its own task, with at
    most `window` in flight (a slow ack never delays the schedule); returns when all ended.

    The loop always yields once per message (sleep 0 when behind), so a late sender cannot
    starve the consumer task of the same process. A free slot is taken without a second
    yield, as `asyncio.Semaphore` does in the peers' clients (trio's `acquire()` always
    checkpoints: one more scheduler round, with its epoll call, per message); only a full
    window waits.
    """
    limiter = trio.Semaphore(window)

    async def one(seq: int) -> None:
        try:
            await send(seq)
        finally:
            limiter.release()

    async with trio.open_nursery() as nursery:
        start = time.perf_counter()
        for k, seq in enumerate(seqs):
            await trio.sleep(max(start + k / rate - time.perf_counter(), 0))
            try:
                limiter.acquire_nowait()
            except trio.WouldBlock:
                await limiter.acquire()
            nursery.start_soon(one, seq)


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    cfg = ClientConfig(
        namesrv_addr=opts.namesrv,
        instance_name=f"bench-e2e-{os.getpid()}",
        pull_batch_size=32,
        consume_message_batch_max_size=32,
    )
    pad = random_body(1024 - 16)
    lat: list[float] = []
    total = int(opts.rate * opts.seconds)
    ready = trio.Event()
    all_seen = trio.Event()
    not_ok: dict[str, int] = {}

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            seq, ms = e2e_latency_ms(m.body)
            if seq < 0:
                ready.set()
            else:
                lat.append(ms)
        if len(lat) >= total:
            all_seen.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        "bench_w4",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
    )
    consumer.subscribe(opts.topic, "*")
    async with Producer("bench_w4_producer", cfg) as producer, consumer:
        for _ in range(300):  # warm-up probes until the consumer sees one (bounded: 30 s)
            await producer.send(Message(opts.topic, e2e_body(-1, pad)))
            with trio.move_on_after(0.1):
                await ready.wait()
            if ready.is_set():
                break
        freeze_startup_heap()  # both clients started, before the paced loop

        async def send(i: int) -> None:
            try:
                res = await producer.send(Message(opts.topic, e2e_body(i, pad)))
            except Exception:
                return  # never received: counted as missing
            if res.status is not SendStatus.SEND_OK and i >= 0:
                not_ok[res.status.value] = not_ok.get(res.status.value, 0) + 1

        warm = int(WARMUP_S * opts.rate)  # paced warm-up (seq -1, not measured)
        await paced(opts.rate, [max(i, -1) for i in range(-warm, total)], send)
        with trio.move_on_after(10):
            await all_seen.wait()
    # Errors: messages never received, and sends answered other than SEND_OK (stored, so
    # received, but not as asked: a SYNC_MASTER without a slave in sync).
    errors = total - len(lat) + sum(not_ok.values())
    return summary("trimq-e2e", len(lat), opts.seconds, lat, errors, rate=opts.rate, not_ok=not_ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", "--namesrv", required=True)
    ap.add_argument("-t", "--topic", default="BenchE2E")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0)
    opts = ap.parse_args()
    configure_logging("error")
    print(json.dumps(trio.run(run, opts), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()

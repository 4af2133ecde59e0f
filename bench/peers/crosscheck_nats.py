"""A plain nats-py publisher, independent of the harness, to check its NATS W1 figure.

    .venv/bin/python -m bench.peers.crosscheck_nats --url nats://127.0.0.1:4222 [--count 100000]

Only nats-py and the standard library: a file-storage stream, `count` 1 KiB bodies drawn from
4,096 random ones, `publish_async` with 64 acks pending (nats-py's own window), then
`publish_async_completed`. Prints one JSON line: msgs/s from the first publish to the last ack.
The connection's knobs are the harness's (`nats_client`'s defaults, the sweep's best).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import nats
from nats.js import api

PENDING_SIZE = 64 * 1024
SKIP_SUBJECT_VALIDATION = True


async def publish(url: str, count: int, window: int) -> dict[str, float]:
    nc = await nats.connect(
        url, pending_size=PENDING_SIZE, skip_subject_validation=SKIP_SUBJECT_VALIDATION
    )
    try:
        js = nc.jetstream(publish_async_max_pending=window)
        await js.add_stream(name="CHECK", subjects=["check"], storage=api.StorageType.FILE)
        bodies = [os.urandom(1024) for _ in range(4096)]
        await js.publish("check", bodies[0])  # stream and reply inbox ready
        t0 = time.perf_counter()
        for i in range(count):
            await js.publish_async("check", bodies[i % 4096])
        await js.publish_async_completed()
        secs = time.perf_counter() - t0
        info = await js.stream_info("CHECK")
    finally:
        await nc.close()
    return {"messages": count, "seconds": round(secs, 3), "msgs_per_s": round(count / secs, 1),
            "stream_messages": info.state.messages}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=64)
    opts = ap.parse_args()
    print(json.dumps(asyncio.run(publish(opts.url, opts.count, opts.window))), flush=True)


if __name__ == "__main__":
    main()

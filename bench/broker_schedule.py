"""Delayed delivery in-process: exact-timestamp lateness and delay-level delivery rate.

An in-process `MessageStore` (temp directory) and `ScheduleService` on the real clock:
- timer: N messages with delivery times spread over N/2 ms (2000/s), starting after all
  are sent, sent in random order; prints the
  lateness (delivered store time - asked time) p50/p99/max and the delivery rate;
- levels: N messages at level 1 (1 s), all due together; prints the delivery rate.

    python bench/broker_schedule.py            # 20000 messages each
    python bench/broker_schedule.py --quick    # 2000
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import trio

from broker.schedule import ScheduleService, wall_ms
from common.message import MessageInner, decode_records
from common.schedule import parse_delay_levels
from store import MessageStore, StoreConfig

HOST = ("127.0.0.1", 10911)


def msg(i: int) -> MessageInner:
    return MessageInner(
        "Real",
        b"x" * 256,
        queue_id=0,
        properties={"UNIQ_KEY": f"U{i}"},
        born_timestamp=wall_ms(),
        born_host=HOST,
        store_host=HOST,
    )


async def reached(store: MessageStore, topic: str, n: int) -> None:
    """Return once queue 0 of `topic` holds `n` messages (woken by the store's arrivals)."""
    done = trio.Event()

    def on_arrival(t: str, _qid: int, max_offset: int) -> None:
        if t == topic and max_offset >= n:
            done.set()

    store.add_arrival_listener(on_arrival)
    if store.get_max_offset_in_queue(topic, 0) < n:
        await done.wait()


async def run(n: int, window_ms: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        svc = ScheduleService(root, parse_delay_levels("1s 2s"), lambda: HOST)
        cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commitlog=256 << 20)
        async with MessageStore(cfg) as store:
            store.add_arrival_listener(svc.on_arrival)
            async with trio.open_nursery() as nursery:
                await nursery.start(svc.run, store)
                # -- timer
                start = wall_ms() + 2000 + n // 4  # after all puts (~6k/s in-process)
                dues = [start + random.randrange(window_ms) for _ in range(n)]
                for i, due in enumerate(dues):
                    m = msg(i)
                    svc.route_timer(m, due)
                    await store.put_message(m)
                await reached(store, "Real", n)
                done = wall_ms()
                res = await store.get_message("B", "Real", 0, 0, n, 1 << 30)
                recs = decode_records(b"".join(res.buffers))
                want = {f"U{i}": due for i, due in enumerate(dues)}
                lateness = sorted(r.store_timestamp - want[r.uniq_key or ""] for r in recs)
                p = lateness
                print(
                    f"timer: {n} msgs over {window_ms} ms: lateness p50={p[len(p) // 2]} ms "
                    f"p99={p[int(len(p) * 0.99)]} ms max={p[-1]} ms min={p[0]} ms; "
                    f"finished {done - max(dues)} ms after the last due time"
                )
                # -- levels
                t0 = time.monotonic()
                for i in range(n):
                    m = msg(i)
                    m.topic = "Lvl"
                    m.properties["DELAY"] = "1"
                    svc.route_delay(m)
                    await store.put_message(m)
                put_s = time.monotonic() - t0
                first_due = time.monotonic() + 1 - put_s
                await reached(store, "Lvl", n)
                took = time.monotonic() - max(first_due, t0 + put_s)
                print(
                    f"levels: {n} msgs at level 1 delivered in ~{took:.2f} s after due "
                    f"(~{n / max(took, 1e-3):.0f} msg/s)"
                )
                nursery.cancel_scope.cancel()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 2000 if args.quick else 20000
    trio.run(run, n, n // 2)  # 2000 deliveries/s asked for


if __name__ == "__main__":
    main()

"""Replication lag of a master/slave pair, measured from outside the brokers.

    python -m bench.peers.ha_lag -n 127.0.0.1:9876 -b 127.0.0.1:10911 --interval-ms 5

A separate process (so it takes no CPU from the load client's process) polls the master with
RocketMQ's GET_BROKER_HA_STATUS (907) every `--interval-ms`: each answer gives the master's
commitlog max offset M and the slaves' acknowledged offsets (the highest counts: one slave
suffices for a SYNC_MASTER, as in RocketMQ). It samples until its standard input closes, then
until the slave has acknowledged the last M seen (at most `--tail-s` more seconds), and prints
one JSON line: the lag figures (`summarize`) and the poll interval achieved.

The lag of a sample taken at t with max M is the time from t to the first sample at or after
it whose acknowledged offset is >= M (0 when the same answer already shows it: the broker reads
both offsets in one step). The acknowledgement happened after the previous poll, so each figure
is an upper bound on the time from t to the slave's acknowledgement, by less than one poll
interval. Only samples while the master's log grows count: from the first that shows it grown
to the last that shows it growing (the idle samples before and after the load would add zeros).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import trio


class Sample(NamedTuple):
    """One poll: monotonic seconds at the answer, the master's commitlog max offset, and the
    highest offset a slave acknowledged (-1: no slave connected)."""

    t: float
    master_max: int
    slave_ack: int


class Lags(NamedTuple):
    """Per-sample lags (ms) of the growing window, and its samples never acknowledged."""

    lags_ms: list[float]
    unresolved: int


def growing_window(samples: Sequence[Sample]) -> range:
    """Indices from the first sample whose max exceeds the first sample's through the last
    sample whose max exceeds its predecessor's; empty when the max never grew."""
    if not samples:
        return range(0)
    base = samples[0].master_max
    first = next((i for i, s in enumerate(samples) if s.master_max > base), None)
    if first is None:
        return range(0)
    last = max(
        i for i in range(first, len(samples)) if samples[i].master_max > samples[i - 1].master_max
    )
    return range(first, last + 1)


def lags(samples: Sequence[Sample]) -> Lags:
    """The lag of every sample of the growing window (see the module's docstring).

    The master's max never decreases, so the first acknowledging sample of a later sample is
    never before an earlier one's: one forward scan suffices.
    """
    out: list[float] = []
    unresolved = 0
    j = 0
    n = len(samples)
    for i in growing_window(samples):
        target = samples[i].master_max
        j = max(j, i)
        while j < n and samples[j].slave_ack < target:
            j += 1
        if j == n:
            unresolved += 1
            continue
        out.append((samples[j].t - samples[i].t) * 1000.0)
    return Lags(out, unresolved)


def _pct(sorted_vals: Sequence[float], p: float) -> float:
    # The same rank rule as the clients' summaries (bench.peers._stats.summary).
    return sorted_vals[min(len(sorted_vals) - 1, int(p * len(sorted_vals)))] if sorted_vals else 0.0


def summarize(samples: Sequence[Sample], interval_ms: float) -> dict[str, Any]:
    """The sampler's JSON summary: lag p50/p99/max (ms) over the growing window, the sample
    counts, and the poll interval achieved (mean and largest gap between answers)."""
    result = lags(samples)
    lat = sorted(result.lags_ms)
    gaps = sorted((b.t - a.t) * 1000.0 for a, b in itertools.pairwise(samples))
    return {
        "kind": "ha-lag",
        "interval_ms": interval_ms,
        "polls": len(samples),
        "samples": len(lat),
        "unresolved": result.unresolved,
        "lag_ms": {
            "p50": round(_pct(lat, 0.50), 3),
            "p99": round(_pct(lat, 0.99), 3),
            "max": round(lat[-1], 3) if lat else 0.0,
        },
        "poll_interval_ms": {
            "mean": round(sum(gaps) / len(gaps), 3) if gaps else 0.0,
            "p99": round(_pct(gaps, 0.99), 3),
            "max": round(gaps[-1], 3) if gaps else 0.0,
        },
        "bytes": samples[-1].master_max - samples[0].master_max if samples else 0,
    }


async def sample(opts: argparse.Namespace, failed: list[int]) -> list[Sample]:
    """Poll until standard input closes, then until the last max is acknowledged (bounded);
    `failed[0]` counts the polls that got no answer."""
    from client import Admin, ClientConfig  # the client's imports only in the sampler process

    interval = opts.interval_ms / 1000.0
    samples: list[Sample] = []
    stopped = trio.Event()

    async def watch_stdin() -> None:
        stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        async with stream:
            while await stream.receive_some(4096):
                pass
        stopped.set()

    cfg = ClientConfig(namesrv_addr=opts.namesrv, instance_name=f"bench-ha-lag-{os.getpid()}")
    async with Admin(cfg) as admin, trio.open_nursery() as nursery:
        nursery.start_soon(watch_stdin)
        tail_end = float("inf")
        next_t = trio.current_time()
        while True:
            try:
                info = await admin.ha_status(opts.broker)
            except Exception:  # e.g. a timeout under load: a gap in the series, counted
                failed[0] += 1
                if not samples and failed[0] > 100:
                    raise
            else:
                acks = [c.slave_ack_offset for c in info.ha_connection_info]
                t = time.monotonic()
                samples.append(Sample(t, info.master_commit_log_max_offset, max(acks, default=-1)))
            if len(samples) == 1 and opts.ready:
                await trio.Path(opts.ready).touch()
            if stopped.is_set() and samples:
                if tail_end == float("inf"):
                    tail_end = trio.current_time() + opts.tail_s
                top = max(s.master_max for s in samples)
                if samples[-1].slave_ack >= top or trio.current_time() >= tail_end:
                    break
            # A late answer moves the schedule on rather than polling in a burst to catch up.
            next_t = max(next_t + interval, trio.current_time())
            await trio.sleep_until(next_t)
        nursery.cancel_scope.cancel()
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", "--namesrv", required=True)
    ap.add_argument("-b", "--broker", required=True, help="the master's address HOST:PORT")
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--tail-s", type=float, default=10.0, help="catch-up wait after stdin closes")
    ap.add_argument("--ready", default=None, help="touch this file after the first answer")
    opts = ap.parse_args()
    from remoting.logs import configure_logging

    configure_logging("error")
    failed = [0]
    samples = trio.run(sample, opts, failed)
    summary = summarize(samples, opts.interval_ms)
    summary["failed_polls"] = failed[0]
    print(json.dumps(summary, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()

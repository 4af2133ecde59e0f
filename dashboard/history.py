"""A bounded in-memory history of TPS and lag, sampled periodically for the live charts."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from client.admin import Admin
from dashboard import service

log = structlog.get_logger()

# At most this many groups are charted (the busiest by lag); a sample stays bounded whatever
# the cluster holds.
MAX_CHART_GROUPS = 16


@dataclass(slots=True, frozen=True)
class Sample:
    ts_ms: int
    tps_in: float
    tps_out: float
    lag: dict[str, int]  # group -> total lag

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts_ms, "tpsIn": self.tps_in, "tpsOut": self.tps_out, "lag": self.lag}


@dataclass
class History:
    """The last `max_samples` samples (oldest dropped)."""

    max_samples: int = 120
    samples: deque[Sample] = field(init=False)
    last_error: str | None = None

    def __post_init__(self) -> None:
        if self.max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.samples = deque(maxlen=self.max_samples)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": [s.to_dict() for s in self.samples],
            "error": self.last_error,
        }


async def take_sample(admin: Admin, *, now_ms: int | None = None) -> Sample:
    """Cluster TPS (masters' put/get TPS summed) and every non-system group's total lag."""
    rows = await service.brokers(admin)
    masters = [r for r in rows if r.broker_id == 0]
    tps_in = sum(r.tps_in or 0.0 for r in masters)
    tps_out = sum(r.tps_out or 0.0 for r in masters)
    addrs = [r.addr for r in masters if r.reachable]
    lag: dict[str, int] = {}
    for group in await service.group_names(admin):
        if service.is_system_group(group):
            continue
        lag[group] = (await service.group_stats(admin, group, addrs)).total_lag
    top = sorted(lag.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_CHART_GROUPS]
    ts = now_ms if now_ms is not None else int(time.time() * 1000)
    return Sample(ts, round(tps_in, 2), round(tps_out, 2), dict(sorted(top)))


async def run_sampler(admin: Admin, history: History, interval_s: float) -> None:
    """Sample every `interval_s` seconds until cancelled; a failed sample is logged and kept as
    the page's error line, the loop goes on."""
    while True:
        try:
            with trio.fail_after(max(5.0, interval_s * 2)):
                history.add(await take_sample(admin))
            history.last_error = None
        except Exception as exc:  # the cluster may be down for a while: keep sampling
            history.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("dashboard_sample_failed", error=history.last_error)
        await trio.sleep(interval_s)

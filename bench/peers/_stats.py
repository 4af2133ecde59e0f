"""Summary shared by the peer clients: the same JSON shape as `mqbench --json`."""

from __future__ import annotations

import os
import struct
import time
from typing import Any

BODY_SIZE = 1024
# W1, W2 and W5 send bodies in turn from a pool of this many distinct random bodies, on every
# system (trimq: `mqbench --body-pool`), so no client sends one cached buffer over and over.
BODY_POOL = 4096
# W4 body head: sequence number (negative for warm-up probes) and send time (time.time()).
E2E_HEAD = struct.Struct(">qd")
# W4 sends this many seconds of paced messages (sequence -1, not measured) before measuring, so
# connection pools, consumers and caches are warm on every system.
WARMUP_S = 0.5


def random_body(size: int = BODY_SIZE) -> bytes:
    """`size` random bytes (1 KiB by default), drawn once per run."""
    return os.urandom(size)


def body_pool(count: int = BODY_POOL, size: int = BODY_SIZE) -> list[bytes]:
    """`count` distinct random bodies of `size` bytes, drawn once per run."""
    return [os.urandom(size) for _ in range(count)]


def e2e_body(seq: int, pad: bytes) -> bytes:
    """A W4 body: sequence number and send time, then padding up to 1 KiB."""
    return E2E_HEAD.pack(seq, time.time()) + pad


def e2e_latency_ms(body: bytes) -> tuple[int, float]:
    """(sequence number, milliseconds since the body was made) of a W4 body."""
    seq, sent = E2E_HEAD.unpack_from(body)
    return seq, (time.time() - sent) * 1000.0


def summary(
    kind: str,
    messages: int,
    seconds: float,
    latencies_ms: list[float],
    errors: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """The summary object: msgs/s and latency avg/p50/p99/max, as mqbench prints it."""
    lat = sorted(latencies_ms)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

    secs = max(seconds, 1e-9)
    return {
        "kind": kind,
        **extra,
        "seconds": round(secs, 3),
        "messages": messages,
        "errors": errors,
        "msgs_per_s": round(messages / secs, 1),
        "mb_per_s": round(messages * BODY_SIZE / secs / 1e6, 3),
        "latency_ms": {
            "avg": round(sum(lat) / len(lat), 3) if lat else 0.0,
            "p50": round(pct(0.50), 3),
            "p99": round(pct(0.99), 3),
            "max": round(lat[-1], 3) if lat else 0.0,
            "samples": len(lat),
        },
    }

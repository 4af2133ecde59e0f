"""NameServer throughput: route queries and broker registrations against a real `mqnamesrv`.

Starts `mqnamesrv` on a free loopback port, registers `--brokers` fake brokers with
`--topics` topics each, then runs `--concurrency` tasks issuing GET_ROUTEINFO_BY_TOPIC
(and REGISTER_BROKER heartbeats) for `--seconds`, and prints requests per second and
latency percentiles.

    .venv/bin/python bench/namesrv_route.py [--seconds 5] [--concurrency 64] [--json]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remoting import RemotingClient, RemotingCommand, SerializeType
from remoting.codes import RequestCode
from remoting.logs import configure_logging
from remoting.protocol.route import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _register(i: int, topics: int) -> RemotingCommand:
    table = {f"Topic{t}": TopicConfig(f"Topic{t}", 8, 8, 6) for t in range(topics)}
    body = RegisterBrokerBody(TopicConfigSerializeWrapper(table, DataVersion(1, 1)), []).to_json()
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": f"broker-{i}",
            "brokerAddr": f"127.0.0.{i + 1}:10911",
            "clusterName": "DefaultCluster",
            "haServerAddr": f"127.0.0.{i + 1}:10912",
            "brokerId": "0",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
        },
        body,
    )


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def _run(addr: str, args: argparse.Namespace) -> dict[str, float]:
    serialize = SerializeType.JSON if args.json else SerializeType.MSGPACK
    async with RemotingClient(serialize_type=serialize) as client:
        for i in range(args.brokers):
            (await client.invoke(addr, _register(i, args.topics))).raise_for_code()
        lat_route: list[float] = []
        lat_reg: list[float] = []
        deadline = trio.current_time() + args.seconds

        async def worker(seed: int) -> None:
            rnd = random.Random(seed)
            n = 0
            while trio.current_time() < deadline:
                n += 1
                if n % 50 == 0:
                    cmd = _register(rnd.randrange(args.brokers), args.topics)
                    t0 = time.perf_counter()
                    (await client.invoke(addr, cmd)).raise_for_code()
                    lat_reg.append(time.perf_counter() - t0)
                    continue
                topic = f"Topic{rnd.randrange(args.topics)}"
                cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
                t0 = time.perf_counter()
                (await client.invoke(addr, cmd)).raise_for_code()
                lat_route.append(time.perf_counter() - t0)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(args.concurrency):
                nursery.start_soon(worker, w)
        elapsed = time.perf_counter() - start
    return {
        "route_qps": len(lat_route) / elapsed,
        "register_qps": len(lat_reg) / elapsed,
        "route_p50_ms": _pct(lat_route, 0.5) * 1000,
        "route_p99_ms": _pct(lat_route, 0.99) * 1000,
        "register_p50_ms": _pct(lat_reg, 0.5) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--brokers", type=int, default=4)
    ap.add_argument("--topics", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="JSON headers instead of msgpack")
    args = ap.parse_args()
    configure_logging("warning")
    port = _free_port()
    exe = Path(sys.executable).parent / "mqnamesrv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    env["TRIMQ_LOG_LEVEL"] = "warning"
    proc = subprocess.Popen(
        [str(exe), "--listen", f"127.0.0.1:{port}"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("mqnamesrv did not start") from None
                time.sleep(0.05)
        res = trio.run(_run, f"127.0.0.1:{port}", args)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    header = "json" if args.json else "msgpack"
    print(
        f"namesrv ({header} headers, {args.concurrency} concurrent, {args.brokers} brokers x "
        f"{args.topics} topics): route {res['route_qps']:.0f} req/s "
        f"(p50 {res['route_p50_ms']:.2f} ms, p99 {res['route_p99_ms']:.2f} ms), "
        f"register {res['register_qps']:.0f} req/s (p50 {res['register_p50_ms']:.2f} ms)"
    )


if __name__ == "__main__":
    main()

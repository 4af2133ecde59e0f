"""`mqbench`: throughput and latency benchmark (RocketMQ's benchmark tools, for trimq).

    mqbench producer -n 127.0.0.1:9876 -t BenchTopic -w 8 -s 1024 --duration 30
    mqbench consumer -n 127.0.0.1:9876 -t BenchTopic -g bench --count 100000 --json

Prints a live progress line on stderr and, at the end, messages/s, MB/s and
latency avg/p50/p99/max (send round trip for the producer, store-to-consume
for the consumer); `--json` prints the summary as one JSON object on stdout. A send answered
with a status other than SEND_OK (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT)
is an error, counted by status in `not_ok`, and not in the messages or the latency.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import trio
from rich.console import Console
from rich.live import Live
from rich.text import Text

from client import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
    SendStatus,
)
from client.cli._options import (
    client_config,
    credentials,
    credentials_options,
    serialize_type_option,
    tls,
    tls_options,
)
from client.trace import TRACE_TOPIC
from remoting.logs import configure_logging

_err = Console(stderr=True)
SEND_OK = SendStatus.SEND_OK


@dataclass
class Stats:
    """Counters and latency samples (ms) of one run."""

    started: float = field(default_factory=time.monotonic)
    last: float = 0.0
    messages: int = 0
    bytes: int = 0
    errors: int = 0
    # Messages per send status other than SEND_OK (each such send is also one error): stored
    # by the broker but not as asked (no slave, slave or flush timeout), so no throughput.
    not_ok: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def send_not_ok(self, results: list[SendResult]) -> None:
        """A send (one message, or a batch sent in parts) with a part not answered SEND_OK:
        one error; the messages of each such part counted by status. None of the send counts
        as throughput."""
        self.errors += 1
        for r in results:
            if r.status is not SEND_OK:
                key = r.status.value
                self.not_ok[key] = self.not_ok.get(key, 0) + r.msg_id.count(",") + 1

    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    def active(self) -> float:
        """Seconds from the start to the last message (the whole run if none)."""
        end = self.last if self.messages else time.monotonic()
        return max(end - self.started, 1e-9)

    def summary(self, kind: str, extra: dict[str, Any]) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            if not lat:
                return 0.0
            return lat[min(len(lat) - 1, int(p * len(lat)))]

        secs = self.active()
        return {
            "kind": kind,
            **extra,
            "seconds": round(secs, 3),
            "messages": self.messages,
            "errors": self.errors,
            "not_ok": dict(self.not_ok),
            "msgs_per_s": round(self.messages / secs, 1),
            "mb_per_s": round(self.bytes / secs / 1e6, 3),
            "latency_ms": {
                "avg": round(sum(lat) / len(lat), 3) if lat else 0.0,
                "p50": round(pct(0.50), 3),
                "p99": round(pct(0.99), 3),
                "max": round(lat[-1], 3) if lat else 0.0,
                "samples": len(lat),
            },
        }

    def line(self, kind: str) -> Text:
        secs = self.elapsed()
        recent = self.latencies[-2000:]
        p99 = sorted(recent)[int(0.99 * (len(recent) - 1))] if recent else 0.0
        return Text(
            f"{kind}: {self.messages} msgs in {secs:.1f}s | {self.messages / secs:,.0f} msg/s | "
            f"{self.bytes / secs / 1e6:.2f} MB/s | p99 {p99:.2f} ms | errors {self.errors}"
        )


def freeze_startup_heap() -> None:
    """Collect once, then keep every object alive now (imports, client set-up) out of the
    collector's reach: the full collections of a run then scan only what the run allocates, and
    do not stall every send in flight. Also used by `bench.peers.trimq_e2e`'s client
    (docs/design-notes.md, "Start-up heap freeze")."""
    gc.collect()
    gc.freeze()


def _config(namesrv: str | None, **kw: Any) -> ClientConfig:
    if not namesrv:
        click.echo("mqbench: error: pass -n HOST:PORT or set NAMESRV_ADDR", err=True)
        sys.exit(1)
    if _options.get("trace"):
        kw.update(enable_trace=True, trace_topic=_options.get("trace_topic", TRACE_TOPIC))
    return client_config(
        namesrv_addr=namesrv,
        serialize_type=_options["serialize_type"],
        **_options["credentials"],
        **_options["tls"],
        **kw,
    )


# Options of the command group, for every command's client.
_options: dict[str, Any] = {"serialize_type": "auto", "credentials": {}, "tls": {}}


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if param.name:
        _options[param.name] = value
    return value


def trace_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--trace` / `--trace-topic`: the benchmark's clients write message trace records
    (`ClientConfig.enable_trace`, docs/trace.md), to measure what tracing costs."""
    f = click.option(
        "--trace-topic",
        "trace_topic",
        default=TRACE_TOPIC,
        show_default=True,
        expose_value=False,
        callback=_remember,
        help="The trace topic (with --trace).",
    )(f)
    return click.option(
        "--trace",
        "trace",
        is_flag=True,
        expose_value=False,
        callback=_remember,
        help="Write message trace records (RocketMQ's enableMsgTrace).",
    )(f)


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    lat = summary["latency_ms"]
    not_ok = "".join(f", {k} {v}" for k, v in sorted(summary["not_ok"].items()))
    click.echo(
        f"{summary['kind']}: {summary['messages']} msgs in {summary['seconds']} s, "
        f"{summary['msgs_per_s']:,} msg/s, {summary['mb_per_s']} MB/s, errors {summary['errors']}"
        f"{not_ok}\n"
        f"latency ms: avg {lat['avg']} p50 {lat['p50']} p99 {lat['p99']} max {lat['max']}"
    )


async def _progress(stats: Stats, kind: str, done: trio.Event, console: Console = _err) -> None:
    """A live progress line on a terminal; nothing otherwise (redirected, `--json` in a script):
    rich's refresh thread would still wake 4 times a second and take the GIL from the run."""
    if not console.is_terminal:
        await done.wait()
        return
    with Live(stats.line(kind), console=console, refresh_per_second=4, transient=True) as live:
        while not done.is_set():
            with trio.move_on_after(0.5):
                await done.wait()
            live.update(stats.line(kind))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default="error", show_default=True)
@serialize_type_option
@credentials_options
@tls_options
def cli(
    log_level: str,
    serialize_type: str,
    access_key: str | None,
    secret_key: str | None,
    **tls_values: Any,
) -> None:
    """trimq benchmark tool."""
    configure_logging(log_level)
    _options["serialize_type"] = serialize_type
    _options["credentials"] = credentials(access_key, secret_key)
    _options["tls"] = tls(tls_values)


@cli.command()
@click.option("-n", "--namesrvAddr", "namesrv", envvar="NAMESRV_ADDR", help="NameServer address.")
@click.option("-t", "--topic", default="BenchmarkTest", show_default=True)
@click.option("-w", "--workers", type=int, default=8, show_default=True, help="Concurrent senders.")
@click.option("-s", "--size", type=int, default=128, show_default=True, help="Body bytes.")
@click.option("-b", "--batch", type=int, default=1, show_default=True, help="Messages per send.")
@click.option("-d", "--duration", type=float, help="Seconds to run (default 10 unless --count).")
@click.option("-c", "--count", type=int, help="Messages to send in total.")
@click.option("-g", "--group", default="benchmark_producer", show_default=True)
@click.option("--tags", default=None, help="Tag for every message.")
@click.option(
    "--body-pool",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Distinct random bodies, sent in turn.",
)
@trace_options
@click.option("--json", "as_json", is_flag=True, help="Summary as JSON on stdout.")
def producer(
    namesrv: str | None,
    topic: str,
    workers: int,
    size: int,
    batch: int,
    duration: float | None,
    count: int | None,
    group: str,
    tags: str | None,
    body_pool: int,
    as_json: bool,
) -> None:
    """Send as fast as the workers can; report throughput and send latency."""
    if duration is None and count is None:
        duration = 10.0
    cfg = _config(namesrv, instance_name=f"mqbench-{os.getpid()}")
    bodies = [os.urandom(size) for _ in range(body_pool)] if body_pool > 1 else None
    body = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
    next_body = itertools.cycle(bodies).__next__ if bodies else itertools.repeat(body).__next__
    stats = Stats()

    async def main() -> None:
        done = trio.Event()
        remaining = [count if count is not None else -1]
        async with Producer(group, cfg) as p:
            await p.send(Message(topic, body, tags=tags))  # warm route and connection
            freeze_startup_heap()
            stats.started = time.monotonic()

            async def worker() -> None:
                while not done.is_set():
                    n = batch
                    if remaining[0] >= 0:
                        n = min(batch, remaining[0])
                        if n <= 0:
                            return
                        remaining[0] -= n
                    t0 = time.perf_counter()
                    # `bad`: the results of a send with a part not answered SEND_OK, else None.
                    try:
                        if n == 1:
                            one = await p.send(Message(topic, next_body(), tags=tags))
                            bad = None if one.status is SEND_OK else [one]
                        else:
                            parts = await p.send_batch(
                                [Message(topic, next_body(), tags=tags) for _ in range(n)]
                            )
                            bad = None if all(r.status is SEND_OK for r in parts) else parts
                    except Exception:
                        stats.errors += 1
                        continue
                    if bad is not None:
                        stats.send_not_ok(bad)
                        continue
                    stats.latencies.append((time.perf_counter() - t0) * 1000)
                    stats.messages += n
                    stats.bytes += n * size
                    stats.last = time.monotonic()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(_progress, stats, "producer", done)
                with trio.move_on_after(duration if duration is not None else float("inf")):
                    async with trio.open_nursery() as workers_nursery:
                        for _ in range(workers):
                            workers_nursery.start_soon(worker)
                done.set()

    trio.run(main)
    _print_summary(
        stats.summary(
            "producer", {"topic": topic, "workers": workers, "size": size, "batch": batch}
        ),
        as_json,
    )


@cli.command()
@click.option("-n", "--namesrvAddr", "namesrv", envvar="NAMESRV_ADDR", help="NameServer address.")
@click.option("-t", "--topic", default="BenchmarkTest", show_default=True)
@click.option("-g", "--group", default="benchmark_consumer", show_default=True)
@click.option("-d", "--duration", type=float, help="Seconds to run (default 10 unless --count).")
@click.option("-c", "--count", type=int, help="Stop after this many messages.")
@click.option("--threads", type=int, default=20, show_default=True, help="Consume concurrency.")
@click.option("--batch", type=int, default=32, show_default=True, help="Pull batch size.")
@click.option(
    "--from", "start", type=click.Choice(["first", "last"]), default="last", show_default=True
)
@trace_options
@click.option("--json", "as_json", is_flag=True, help="Summary as JSON on stdout.")
def consumer(
    namesrv: str | None,
    topic: str,
    group: str,
    duration: float | None,
    count: int | None,
    threads: int,
    batch: int,
    start: str,
    as_json: bool,
) -> None:
    """Consume; report throughput and store-to-consume latency."""
    if duration is None and count is None:
        duration = 10.0
    cfg = _config(
        namesrv,
        instance_name=f"mqbench-{os.getpid()}",
        consume_concurrency=threads,
        pull_batch_size=batch,
        consume_message_batch_max_size=batch,
    )
    stats = Stats()
    where = (
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        if start == "first"
        else ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    )

    async def main() -> None:
        done = trio.Event()
        first_seen = [0.0]

        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            now_ms = time.time() * 1000
            if not first_seen[0]:
                first_seen[0] = time.monotonic()
                stats.started = first_seen[0]
            # Comprehensions, not a per-message loop of attribute updates: this bookkeeping
            # is mqbench's, not the workload's (the peers' consume-throughput clients only
            # count messages).
            stats.latencies += [
                now_ms - m.store_timestamp if m.store_timestamp < now_ms else 0.0 for m in msgs
            ]
            stats.bytes += sum([len(m.body) for m in msgs])
            stats.messages += len(msgs)
            stats.last = time.monotonic()
            if count is not None and stats.messages >= count:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer(group, cfg, listener=listener, consume_from_where=where)
        c.subscribe(topic, "*")
        async with c, trio.open_nursery() as nursery:
            freeze_startup_heap()
            nursery.start_soon(_progress, stats, "consumer", done)
            with trio.move_on_after(duration if duration is not None else float("inf")):
                await done.wait()
            done.set()

    trio.run(main)
    _print_summary(stats.summary("consumer", {"topic": topic, "group": group}), as_json)


def main() -> None:
    cli(prog_name="mqbench")


if __name__ == "__main__":  # pragma: no cover
    main()

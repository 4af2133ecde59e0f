"""Round trips per second of RemotingClient -> RemotingServer on loopback.

The server runs in a separate process (this script with `--serve`); the client runs here.
Each cell runs `inflight` concurrent callers for a fixed time, each sending a request with a
SEND_MESSAGE_V2-like header and a body of the given size, which the server echoes back with a
send-response-like header. Prints a table of round trips/s with the msgpack/JSON ratio.

    python bench/remoting_rtt.py            # 3 s per cell
    python bench/remoting_rtt.py --quick    # 0.25 s per cell, a few seconds in all
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table

from remoting import (
    Connection,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    RequestCode,
    SerializeType,
)
from remoting.logs import configure_logging
from remoting.protocol import SendMessageRequestHeader, SendMessageResponseHeader

CODE = RequestCode.SEND_MESSAGE_V2
REPO = Path(__file__).resolve().parents[1]

REQUEST_FIELDS = SendMessageRequestHeader(
    producer_group="bench_producer_group",
    topic="BenchmarkTest",
    default_topic="TBW102",
    default_topic_queue_nums=4,
    queue_id=1,
    sys_flag=0,
    born_timestamp=1700000000000,
    flag=0,
    properties="UNIQ_KEY\x017F0000010B5018B4AAC2190A2B3C0000\x02WAIT\x01true\x02TAGS\x01TagA",
    reconsume_times=0,
    broker_name="broker-a",
).to_fields_v2()
RESPONSE_FIELDS = SendMessageResponseHeader(
    msg_id="7F00000100002A9F0000000000000000", queue_id=1, queue_offset=123456
).to_fields()
RESPONSE_FIELDS.update({"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})


# --- server process ---------------------------------------------------------------------------


async def _echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(ext_fields=dict(RESPONSE_FIELDS), body=cmd.body)


async def _serve() -> None:
    server = RemotingServer(port=0)
    server.processors.register(CODE, _echo)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        print(port, flush=True)


# --- client side ------------------------------------------------------------------------------


async def _cell(
    addr: str, serialize_type: int, inflight: int, body: bytes, seconds: float
) -> float:
    async with RemotingClient(serialize_type=serialize_type) as client:
        # warm up the connection
        for _ in range(50):
            await client.invoke(addr, RemotingCommand.request(CODE, REQUEST_FIELDS, body))
        done = 0
        stop_at = trio.current_time() + seconds

        async def caller() -> None:
            nonlocal done
            while trio.current_time() < stop_at:
                response = await client.invoke(
                    addr, RemotingCommand.request(CODE, REQUEST_FIELDS, body), timeout_ms=30000
                )
                response.raise_for_code()
                done += 1

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(inflight):
                nursery.start_soon(caller)
        elapsed = time.perf_counter() - start
    return done / elapsed


async def _run_all(addr: str, seconds: float) -> list[tuple[int, int, float, float]]:
    rows = []
    for inflight in (1, 64):
        for size in (100, 4096):
            body = os.urandom(size)
            rates = {}
            for st in (SerializeType.MSGPACK, SerializeType.JSON):
                rates[st] = await _cell(addr, st, inflight, body, seconds)
            rows.append((inflight, size, rates[SerializeType.MSGPACK], rates[SerializeType.JSON]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="0.25 s per cell")
    parser.add_argument("--seconds", type=float, default=None, help="time per cell")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("warning")
    if args.serve:
        trio.run(_serve)
        return
    seconds = args.seconds or (0.25 if args.quick else 3.0)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve"],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        rows = trio.run(_run_all, f"127.0.0.1:{port}", seconds)
    finally:
        proc.kill()
        proc.wait()
    table = Table(title=f"remoting round trips/s on loopback ({seconds:g} s per cell)")
    for column in ("in flight", "body", "msgpack rt/s", "JSON rt/s", "msgpack/JSON"):
        table.add_column(column, justify="right")
    for inflight, size, mp, js in rows:
        table.add_row(
            str(inflight), f"{size} B", f"{mp:,.0f}", f"{js:,.0f}", f"{mp / js:.2f}x" if js else "-"
        )
    Console().print(table)


if __name__ == "__main__":
    main()

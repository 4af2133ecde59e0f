"""Broker throughput on loopback: sends (single, concurrent, batch; async and sync flush) and pulls.

Starts a real `mqbroker` process (no NameServer needed) with its store in a temp directory and
drives it with a bare RemotingClient (msgpack headers). Prints messages/s per scenario.

    python bench/broker_send_pull.py            # ~3 s per scenario
    python bench/broker_send_pull.py --quick    # ~0.5 s per scenario
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table

from common.message import BatchItem, encode_batch_body, encode_properties
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send_cmd(topic: str, body: bytes, queue_id: int, *, batch: bool = False) -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=8,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties({"TAGS": "TagA", "WAIT": "true"}),
        batch=batch,
    )
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    return RemotingCommand.request(code, hdr.to_fields_v2(), body)


def start_broker(store: Path, flush: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    env["TRIMQ_MAPPED_FILE_SIZE_COMMITLOG"] = str(256 * 1024 * 1024)
    proc = subprocess.Popen(
        [
            str(BIN / "mqbroker"),
            "--listen",
            f"127.0.0.1:{port}",
            "--store-dir",
            str(store),
            "--flush",
            flush,
            "--log-level",
            "warning",
        ],
        env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("broker did not start")


async def sends(addr: str, topic: str, seconds: float, inflight: int, body: bytes) -> float:
    count = 0
    deadline = trio.current_time() + seconds
    async with RemotingClient() as client:

        async def worker(w: int) -> None:
            nonlocal count
            while trio.current_time() < deadline:
                resp = await client.invoke(addr, send_cmd(topic, body, w % 8))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                count += 1

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for w in range(inflight):
                nursery.start_soon(worker, w)
        return count / (trio.current_time() - start)


async def batch_sends(addr: str, topic: str, seconds: float, size: int, body: bytes) -> float:
    count = 0
    batch = encode_batch_body([BatchItem(0, body, "") for _ in range(size)])
    deadline = trio.current_time() + seconds
    async with RemotingClient() as client:

        async def worker(w: int) -> None:
            nonlocal count
            while trio.current_time() < deadline:
                resp = await client.invoke(addr, send_cmd(topic, batch, w % 8, batch=True))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                count += size

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for w in range(4):
                nursery.start_soon(worker, w)
        return count / (trio.current_time() - start)


async def pulls(addr: str, topic: str, max_msgs: int) -> tuple[float, int]:
    total = 0
    start = trio.current_time()
    async with RemotingClient() as client:
        for qid in range(8):
            offset = 0
            while True:
                hdr = PullMessageRequestHeader(
                    consumer_group="BG",
                    topic=topic,
                    queue_id=qid,
                    queue_offset=offset,
                    max_msg_nums=max_msgs,
                    sys_flag=0x4,
                    commit_offset=0,
                    suspend_timeout_millis=0,
                    subscription="*",
                    sub_version=0,
                )
                resp = await client.invoke(
                    addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr.to_fields())
                )
                if resp.code != ResponseCode.SUCCESS:
                    break
                new = int((resp.ext_fields or {})["nextBeginOffset"])
                total += new - offset
                offset = new
    return total / (trio.current_time() - start), total


async def main(seconds: float) -> None:
    body = b"x" * 1024
    table = Table(title="trimq broker, loopback, 1 KiB bodies, msgpack headers")
    table.add_column("scenario")
    table.add_column("msgs/s", justify="right")
    for flush in ("async", "sync"):
        with tempfile.TemporaryDirectory() as tmp:
            proc, addr = start_broker(Path(tmp) / "store", flush)
            try:
                topic = f"Bench{flush}"
                table.add_row(
                    f"{flush}: send, 1 in flight",
                    f"{await sends(addr, topic, seconds, 1, body):,.0f}",
                )
                table.add_row(
                    f"{flush}: send, 32 in flight",
                    f"{await sends(addr, topic, seconds, 32, body):,.0f}",
                )
                table.add_row(
                    f"{flush}: batch send (100/batch, 4 in flight)",
                    f"{await batch_sends(addr, topic, seconds, 100, body):,.0f}",
                )
                for n in (32, 1000):
                    rate, total = await pulls(addr, topic, n)
                    table.add_row(f"{flush}: pull {n}/request ({total:,} msgs)", f"{rate:,.0f}")
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    Console().print(table)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    trio.run(main, 0.5 if args.quick else 3.0)

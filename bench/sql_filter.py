"""Pull throughput with an SQL92 filter that matches half of the messages vs. no filter.

An in-process broker (property filters on) on loopback; a bare RemotingClient stores N messages
in one queue (property `parity` = even / odd), then reads the queue from start to end with pulls
of 32, first with no filter, then with "parity = 'even' AND n >= 0". Prints, each way, the
records the broker scanned per second and the messages delivered per second, and the ratios.
Client and broker share one process (and one core), so read the ratio rather than the figures.

    python bench/sql_filter.py              # 20,000 messages, 3 rounds each way
    python bench/sql_filter.py --quick      # 4,000 messages, 1 round
"""

from __future__ import annotations

import argparse
import logging
import socket
import tempfile
import time
from pathlib import Path

import structlog
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.message import encode_properties
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SendMessageRequestHeader,
)

TOPIC = "SqlBench"
EXPR = "parity = 'even' AND n >= 0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send_cmd(i: int) -> RemotingCommand:
    props = {"TAGS": "T", "parity": "odd" if i % 2 else "even", "n": str(i)}
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=1,
        queue_id=0,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties(props),
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, hdr.to_fields_v2(), b"x" * 128)


def pull_cmd(offset: int, sql: str | None) -> RemotingCommand:
    hdr = PullMessageRequestHeader(
        consumer_group="BenchCG",
        topic=TOPIC,
        queue_id=0,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=0x4,  # subscription in the header, no suspend, no commit
        commit_offset=0,
        suspend_timeout_millis=0,
        subscription=sql or "*",
        sub_version=1,
        expression_type="SQL92" if sql else "TAG",
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr.to_fields())


async def drain(client: RemotingClient, addr: str, end: int, sql: str | None) -> tuple[int, float]:
    """Read the queue from 0 to `end`; (messages delivered, seconds)."""
    delivered = 0
    offset = 0
    start = time.perf_counter()
    while offset < end:
        resp = await client.invoke(addr, pull_cmd(offset, sql))
        if resp.code == ResponseCode.SUCCESS:
            delivered += resp.body_bytes().count(b"parity")
        elif resp.code != ResponseCode.PULL_RETRY_IMMEDIATELY:
            raise RuntimeError(f"pull answered {resp.code} {resp.remark}")
        offset = PullMessageResponseHeader.from_fields(resp.ext_fields).next_begin_offset
    return delivered, time.perf_counter() - start


async def main(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BrokerConfig(
            listen=f"127.0.0.1:{free_port()}",
            store_dir=str(Path(tmp) / "store"),
            enable_property_filter=True,
            metrics_listen="",
        )
        async with BrokerController(cfg) as ctrl, RemotingClient() as client:
            addr = f"127.0.0.1:{ctrl.port}"
            for i in range(n):
                resp = await client.invoke(addr, send_cmd(i))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            best: dict[str, tuple[int, float]] = {}
            for _ in range(rounds):
                for name, sql in (("no filter", None), ("SQL92, half match", EXPR)):
                    got, secs = await drain(client, addr, n, sql)
                    if name not in best or secs < best[name][1]:
                        best[name] = (got, secs)
    plain_got, plain_s = best["no filter"]
    sql_got, sql_s = best["SQL92, half match"]
    print(f"messages stored: {n}; pulls of 32 from offset 0 to the end; best of {rounds}")
    for name, (got, secs) in best.items():
        print(
            f"{name:>18}: scanned {n / secs:>9,.0f} records/s, delivered {got / secs:>9,.0f} msgs/s"
        )
    print(f"ratio SQL92 / none: scanned {plain_s / sql_s:.2f}x, delivered "
          f"{(sql_got / sql_s) / (plain_got / plain_s):.2f}x")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    trio.run(main, 4000 if args.quick else 20_000, 1 if args.quick else 3)

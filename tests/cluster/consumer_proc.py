"""A consumer host process for the cluster tests (run with the venv's python).

    python tests/cluster/consumer_proc.py --namesrv "127.0.0.1:P1;127.0.0.1:P2" \
        --topic T [--topic T2 ...] --group G --out FILE [--rebalance-ms 2000]

Appends one line per consumed message to FILE (each line written with one O_APPEND write, so
a SIGKILL leaves whole lines only): `body<TAB>broker<TAB>queue_id<TAB>queue_offset<TAB>time`.
Writes `ready` on stdout once the consumer has started; SIGTERM/SIGINT stop it cleanly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import trio

from client import ClientConfig, ConsumeFromWhere, ConsumeStatus, MessageExt, PushConsumer
from remoting.logs import configure_logging


async def run(args: argparse.Namespace) -> None:
    config = ClientConfig(
        namesrv_addr=args.namesrv,
        instance_name=args.name,
        client_ip="127.0.0.1",
        poll_name_server_interval_ms=1000,
        heartbeat_broker_interval_ms=1000,
        rebalance_interval_ms=args.rebalance_ms,
        persist_consumer_offset_interval_ms=1000,
        pull_time_delay_when_exception_ms=500,
        broker_suspend_max_time_ms=3000,
        consumer_timeout_when_suspend_ms=5000,
        offset_store_dir=args.offset_dir,
    )
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        now = time.time()
        lines = "".join(
            f"{m.body.decode()}\t{m.broker_name}\t{m.queue_id}\t{m.queue_offset}\t{now:.3f}\n"
            for m in msgs
        )
        os.write(fd, lines.encode())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        args.group,
        config,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    for topic in args.topic:
        consumer.subscribe(topic, "*")
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with consumer:
                print("ready", flush=True)
                async for _ in signals:
                    break
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True, action="append")
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default=f"cluster-consumer-{os.getpid()}")
    parser.add_argument("--offset-dir", default=os.path.join(os.getcwd(), ".offsets"))
    parser.add_argument("--rebalance-ms", type=int, default=2000)
    args = parser.parse_args()
    configure_logging("warning")
    trio.run(run, args)
    sys.exit(0)


if __name__ == "__main__":
    main()

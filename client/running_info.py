"""A consumer's ConsumerRunningInfo (GET_CONSUMER_RUNNING_INFO, 307): what `mqadmin
consumerStatus` shows of a running client, asked through the broker it is connected to.

What the client knows is reported: its settings and subscriptions, per assigned queue the
committed offset and cache figures, and per subscribed topic its pull and consume figures
(`statusTable`, client/consumer/stats.py)."""

from __future__ import annotations

import math
import time
from typing import Any

from client.config import ClientConfig
from client.message import MessageQueue
from remoting.protocol import bodies

CLIENT_VERSION = "V4_9_8"


def running_info(
    consumer: object, config: ClientConfig, *, start_ms: int, jstack: bool = False
) -> bytes:
    """The ConsumerRunningInfo JSON body of `consumer` (a registered consumer that started at
    `start_ms`: Java's mqadmin compares the clients' start times)."""
    data: bodies.ConsumerData = consumer.consumer_data()  # type: ignore[attr-defined]
    props: dict[str, str] = {
        "PROP_NAMESERVER_ADDR": config.namesrv_addr or "",
        "PROP_CONSUME_TYPE": data.consume_type,
        "PROP_CONSUMEORDERLY": str(getattr(consumer, "orderly_listener", None) is not None).lower(),
        "PROP_CLIENT_VERSION": CLIENT_VERSION,
        "PROP_CONSUMER_START_TIMESTAMP": str(start_ms),
        "messageModel": data.message_model,
        "consumeFromWhere": data.consume_from_where,
        "consumerGroup": data.group_name,
        "instanceName": config.instance_name,
        "language": "PYTHON",
    }
    mq_table: dict[MessageQueue, dict[str, Any]] = {}
    queues = getattr(consumer, "queues", None)
    store = getattr(consumer, "_offset_store", None)
    committed = store.table() if store is not None else {}
    now_wall, now_mono = time.time(), time.monotonic()

    def wall_ms(mono: float) -> int:
        return int((now_wall - (now_mono - mono)) * 1000)

    if isinstance(queues, dict):
        for mq, st in sorted(queues.items()):
            pq = st.pq
            cached = len(pq)
            low = pq.commit_offset() if cached else 0
            mq_table[mq] = {
                "commitOffset": committed.get(mq, -1),
                "cachedMsgCount": cached,
                "cachedMsgSizeInMiB": pq.msg_size // (1024 * 1024),
                "cachedMsgMinOffset": low,
                "cachedMsgMaxOffset": low + pq.max_span() if cached else 0,
                "droped": pq.dropped,
                "lastPullTimestamp": wall_ms(pq.last_pull_timestamp),
                "lastConsumeTimestamp": wall_ms(pq.last_consume_timestamp),
            }
    body: dict[str, Any] = {
        "properties": props,
        "subscriptionSet": [s.to_dict() for s in data.subscription_data_set],
        "mqTable": mq_table,
        "statusTable": _status_table(consumer, data),
    }
    if jstack:
        body["jstack"] = "not available: a Python client has no Java thread dump"
    return bodies.dumps(body)


def _status_table(consumer: object, data: bodies.ConsumerData) -> dict[str, dict[str, Any]]:
    """RocketMQ's ConsumeStatus of every subscribed topic (the retry topic included)."""
    stats = getattr(consumer, "stats", None)
    if stats is None:
        return {}
    return {s.topic: stats.status(s.topic) for s in data.subscription_data_set}


def figure(value: object) -> float:
    """A number of a client's running info (any client answers): 0 for a missing, malformed
    or non-finite one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0.0
    try:
        number = float(value)
    except ValueError:
        return 0.0
    return number if math.isfinite(number) else 0.0

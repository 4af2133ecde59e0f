"""`mqadmin queryMsgTraceById`: a message's life from the trace topic (docs/trace.md).

    mqadmin queryMsgTraceById -n 127.0.0.1:9876 -i 7F0000010C2018B4AAC2A1B2C3D40000

RocketMQ's command: QUERY_MESSAGE on the trace topic with the message id as key, the records
about that id decoded, then the Pub lines (who sent it, from where, when, how long, status)
and, per consumer group, the Sub lines of the SubAfter records, in RocketMQ's columns. trimq
adds where the message is stored (from the Pub record and a look-up of the message) and the
retry count of each consumption (from its SubBefore record); `--json` gives every record.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from client import Admin, MessageExt
from client.cli.mqadmin import _emit_json, _fail, _with_admin, cli, json_option, namesrv_option
from client.errors import MQClientError
from client.message import check_topic
from client.trace import TRACE_TOPIC, TraceType, TraceView, trace_views

# A message id is one index key: no spaces (keys are split on them); UNIQ_KEYs are 32 (IPv4)
# or 56 (IPv6) hex characters, offset ids 32 or 40.
MAX_MSG_ID_LENGTH = 255
_ROW = "%-10s %-20s %-20s %-20s %-10s %-10s"


def _time(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _stored(m: MessageExt) -> dict[str, Any]:
    return {
        "topic": m.topic,
        "broker_name": m.broker_name,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "store_host": m.store_host,
        "offset_msg_id": m.offset_msg_id,
        "store_timestamp": m.store_timestamp,
        "born_host": m.born_host,
    }


def _check_msg_id(msg_id: str) -> str:
    msg_id = msg_id.strip()
    if not msg_id:
        raise click.BadParameter("the message id is empty", param_hint="-i")
    if len(msg_id) > MAX_MSG_ID_LENGTH or any(c.isspace() for c in msg_id):
        raise click.BadParameter(
            f"not a message id: at most {MAX_MSG_ID_LENGTH} characters, no spaces",
            param_hint="-i",
        )
    return msg_id


@cli.command("queryMsgTraceById")
@namesrv_option
@click.option("-i", "--msgId", "msg_id", required=True, help="The message id (UNIQ_KEY).")
@click.option(
    "-t",
    "--traceTopic",
    "trace_topic",
    default=TRACE_TOPIC,
    show_default=True,
    help="The trace topic the clients write to.",
)
@click.option(
    "-c",
    "--maxNum",
    "max_num",
    type=click.IntRange(1, 65536),
    default=64,
    show_default=True,
    help="Most trace messages read (per broker).",
)
@json_option
def query_msg_trace_by_id(
    namesrv: str | None, msg_id: str, trace_topic: str, max_num: int, as_json: bool
) -> None:
    """A message's trace: sent by whom and when, stored where, consumed by which groups."""
    msg_id = _check_msg_id(msg_id)
    try:
        check_topic(trace_topic)
    except MQClientError as exc:
        raise click.BadParameter(str(exc), param_hint="-t") from None

    async def body(a: Admin) -> tuple[list[TraceView], int, MessageExt | None]:
        msgs = await a.query_msg_by_key(trace_topic, msg_id, max_num=max_num)
        views, bad = trace_views(msg_id, msgs)
        stored: MessageExt | None = None
        topic = next((v.topic for v in views if v.trace_type == "Pub" and v.topic), None)
        if topic is not None:
            try:
                found = await a.query_msg_by_id(msg_id, topic)
            except Exception:  # gone (expired) or unreachable: the trace alone is shown
                found = []
            stored = next((m for m in found if m.msg_id == msg_id), None)
        return views, bad, stored

    views, bad, stored = _with_admin(namesrv, body)
    if bad:
        click.echo(f"mqadmin: warning: {bad} unreadable trace record(s) skipped", err=True)
    if not views:
        _fail(f"no trace of message {msg_id} in topic {trace_topic}")
    pubs = [v for v in views if v.trace_type == TraceType.Pub.value]
    consumers: dict[str, list[TraceView]] = {}
    for v in views:
        if v.trace_type == TraceType.SubAfter.value:
            consumers.setdefault(v.group_name, []).append(v)
    if as_json:
        _emit_json(
            {
                "msg_id": msg_id,
                "trace_topic": trace_topic,
                "pub": [v.to_dict() for v in pubs],
                "stored": _stored(stored) if stored is not None else None,
                "consumers": {g: [v.to_dict() for v in vs] for g, vs in consumers.items()},
                "records": [v.to_dict() for v in views],
                "unreadable_records": bad,
            }
        )
        return
    for v in pubs:
        click.echo(
            _ROW % ("#Type", "#ProducerGroup", "#ClientHost", "#SendTime", "#CostTimes", "#Status")
        )
        click.echo(
            _ROW
            % (
                "Pub",
                v.group_name,
                v.client_host,
                _time(v.time_stamp),
                f"{v.cost_time}ms",
                v.status,
            )
        )
        where = f"Topic: {v.topic}  Tags: [{v.tags or ''}]  Keys: [{v.keys or ''}]"
        where += f"  StoreHost: {v.store_host}  OffsetMsgId: {v.offset_msg_id}"
        if stored is not None:
            where += (
                f"  Broker: {stored.broker_name}  QueueId: {stored.queue_id}"
                f"  QueueOffset: {stored.queue_offset}"
            )
        click.echo(where)
        click.echo("")
    for vs in consumers.values():
        click.echo(
            _ROW % ("#Type", "#ConsumerGroup", "#ClientHost", "#ConsumerTime", "#CostTimes",
                    "#Status") + " #RetryTimes"
        )  # fmt: skip
        for v in vs:
            retries = "-" if v.retry_times is None else str(v.retry_times)
            click.echo(
                _ROW % ("Sub", v.group_name, v.client_host, _time(v.time_stamp),
                        f"{v.cost_time}ms", v.status) + f" {retries}"
            )  # fmt: skip
        click.echo("")

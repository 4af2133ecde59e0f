"""`mqadmin`: RocketMQ's admin command line, for trimq.

    mqadmin updateTopic -n 127.0.0.1:9876 -c DefaultCluster -t TopicTest -r 8 -w 8
    mqadmin topic-list -n 127.0.0.1:9876 --json

Command names and flags are RocketMQ's; every command also answers to its
kebab-case name. `-n` defaults to the NAMESRV_ADDR environment variable.
Listing commands print rich tables, or JSON with `--json`. Errors print one
line on stderr and exit with status 1 (2 for usage errors).
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import click
import trio
from rich.console import Console
from rich.table import Table

from client import (
    Admin,
    ClientConfig,
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
)
from client.admin import replication_lag
from client.cli._options import (
    client_config,
    credentials,
    credentials_options,
    serialize_type_option,
    tls,
    tls_options,
)
from client.consumer.rebalance import AllocateMessageQueueAveragely
from client.controller_admin import ControllerAdmin
from client.errors import MQClientError
from client.message import check_topic
from client.route import master_addr, publish_queues
from client.running_info import figure
from common.filter import parse_tag_expression
from remoting.errors import RemoteError, RemotingError
from remoting.logs import configure_logging
from remoting.protocol.bodies import HARuntimeInfo, SubscriptionGroupConfig

T = TypeVar("T")

# Pipes get full lines (no wrapping at 80 columns) so scripts can grep them.
_out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400)


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


class _AliasGroup(click.Group):
    """Resolves `update-topic` (and any case of `updateTopic`) to `updateTopic`."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        wanted = cmd_name.replace("-", "").replace("_", "").lower()
        for name in self.list_commands(ctx):
            if name.lower() == wanted:
                return super().get_command(ctx, name)
        return None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        _, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd else None), cmd, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((f"{name} ({_kebab(name)})", cmd.get_short_help_str(70)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _fail(msg: str) -> None:
    click.echo(f"mqadmin: error: {msg}", err=True)
    sys.exit(1)


def _config(namesrv: str | None) -> ClientConfig:
    if not namesrv:
        _fail("no NameServer address: pass -n HOST:PORT or set NAMESRV_ADDR")
    return client_config(
        namesrv_addr=namesrv or "",
        instance_name=f"mqadmin-{time.time_ns()}",
        serialize_type=_options["serialize_type"],
        **_options["credentials"],
        **_options["tls"],
    )


# Options of the command group, for every command's client.
_options: dict[str, Any] = {"serialize_type": "auto", "credentials": {}, "tls": {}}


def _run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run one async command, turning client errors into one stderr line and exit 1."""
    try:
        return trio.run(fn)
    except BaseExceptionGroup as group:
        errors = [e for e in _flatten(group) if isinstance(e, _USER_ERRORS)]
        if not errors:
            raise
        _fail("; ".join(_describe(e) for e in errors))
    except _USER_ERRORS as exc:
        _fail(_describe(exc))
    raise AssertionError("unreachable")


_USER_ERRORS = (MQClientError, RemotingError, ValueError)


def _flatten(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_flatten(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RemoteError):
        return f"the broker or NameServer answered CODE {exc.code}: {exc.remark or 'no remark'}"
    return str(exc) or type(exc).__name__


def _with_admin(namesrv: str | None, body: Callable[[Admin], Awaitable[T]]) -> T:
    cfg = _config(namesrv)

    async def main() -> T:
        async with Admin(cfg) as admin:
            return await body(admin)

    return _run(main)


def _table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    t = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for c in columns:
        t.add_column(c, no_wrap=True)
    for r in rows:
        t.add_row(*[str(v) for v in r])
    _out.print(t)


def _emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _fmt_ts(ms: int) -> str:
    if ms <= 0:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ms)  # out of the calendar's range: the number as sent


def _body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode("utf-8"), "body_base64": False}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "body_base64": True}


def message_to_dict(m: MessageExt) -> dict[str, Any]:
    """The JSON form of a message, as consumeMessage and queryMsg* print it."""
    return {
        "topic": m.topic,
        "broker_name": m.broker_name,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "msg_id": m.msg_id,
        "offset_msg_id": m.offset_msg_id,
        "keys": m.keys,
        "tags": m.tags,
        "properties": dict(m.properties),
        "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp,
        "born_host": m.born_host,
        "store_host": m.store_host,
        "reconsume_times": m.reconsume_times,
        **_body_fields(m.body),
    }


# -- common options ----------------------------------------------------------------------
def namesrv_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-n",
        "--namesrvAddr",
        "namesrv",
        envvar="NAMESRV_ADDR",
        help="NameServer address(es) HOST:PORT;HOST:PORT (default $NAMESRV_ADDR).",
    )(f)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")(f)


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise click.BadParameter(f"expected true or false, got {text!r}")


@click.group(cls=_AliasGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default="warning", show_default=True, help="Client log level.")
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
    """trimq admin tool (RocketMQ mqadmin commands)."""
    configure_logging(log_level)
    _options["serialize_type"] = serialize_type
    _options["credentials"] = credentials(access_key, secret_key)
    _options["tls"] = tls(tls_values)


# -- topics ---------------------------------------------------------------------------------
@cli.command("updateTopic")
@namesrv_option
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-c", "--clusterName", "cluster", help="Create on every master of this cluster.")
@click.option("-b", "--brokerAddr", "broker", help="Create on this broker only.")
@click.option("-r", "--readQueueNums", "read", type=int, default=8, show_default=True)
@click.option("-w", "--writeQueueNums", "write", type=int, default=8, show_default=True)
@click.option("-p", "--perm", type=int, default=6, show_default=True, help="2 W, 4 R, 6 RW.")
@click.option("-o", "--order", default="false", help="Ordered topic (true/false).")
def update_topic(
    namesrv: str | None,
    topic: str,
    cluster: str | None,
    broker: str | None,
    read: int,
    write: int,
    perm: int,
    order: str,
) -> None:
    """Create or update a topic."""
    if not cluster and not broker:
        raise click.UsageError("give -c CLUSTER or -b BROKER_ADDR")
    ordered = _bool(order)
    addrs = _with_admin(
        namesrv,
        lambda a: a.create_topic(
            topic,
            cluster=cluster,
            broker_addr=broker,
            read_queue_nums=read,
            write_queue_nums=write,
            perm=perm,
            order=ordered,
        ),
    )
    for addr in addrs:
        click.echo(f"create topic to {addr} success.")
    click.echo(
        f"TopicConfig [topicName={topic}, readQueueNums={read}, writeQueueNums={write}, "
        f"perm={perm}, order={str(ordered).lower()}]"
    )


@cli.command("deleteTopic")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--clusterName", "cluster", help="Delete on this cluster's brokers.")
def delete_topic(namesrv: str | None, topic: str, cluster: str | None) -> None:
    """Delete a topic from brokers and NameServers."""
    _with_admin(namesrv, lambda a: a.delete_topic(topic, cluster=cluster))
    click.echo(f"delete topic [{topic}] from cluster [{cluster or 'all'}] success.")


@cli.command("topicList")
@namesrv_option
@click.option("-c", "--clusterModel", "cluster_model", is_flag=True, help="Accepted, ignored.")
@json_option
def topic_list(namesrv: str | None, cluster_model: bool, as_json: bool) -> None:
    """List every topic the NameServer knows."""
    topics = _with_admin(namesrv, lambda a: a.topic_list())
    if as_json:
        _emit_json({"topicList": topics})
        return
    for t in topics:
        click.echo(t)


@cli.command("topicRoute")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
def topic_route(namesrv: str | None, topic: str, as_json: bool) -> None:
    """Show a topic's route (brokers and queues)."""
    route = _with_admin(namesrv, lambda a: a.topic_route(topic))
    if as_json:
        _emit_json(route.to_dict())
        return
    _table(
        f"route of {topic}",
        ["#Broker Name", "#Read Queues", "#Write Queues", "#Perm"],
        [
            [q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm]
            for q in sorted(route.queue_datas, key=lambda q: q.broker_name)
        ],
    )
    _table(
        None,
        ["#Cluster", "#Broker Name", "#BID", "#Addr"],
        [
            [b.cluster, b.broker_name, bid, addr]
            for b in sorted(route.broker_datas, key=lambda b: b.broker_name)
            for bid, addr in sorted(b.broker_addrs.items())
        ],
    )


@cli.command("topicStatus")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
def topic_status(namesrv: str | None, topic: str, as_json: bool) -> None:
    """Min/max offset and last update time of every queue."""
    rows = _with_admin(namesrv, lambda a: a.topic_status(topic))
    if as_json:
        _emit_json(
            [
                {
                    "broker_name": r.mq.broker_name,
                    "queue_id": r.mq.queue_id,
                    "min_offset": r.min_offset,
                    "max_offset": r.max_offset,
                    "last_update_timestamp": r.last_update_timestamp,
                }
                for r in rows
            ]
        )
        return
    _table(
        None,
        ["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"],
        [
            [r.mq.broker_name, r.mq.queue_id, r.min_offset, r.max_offset,
             _fmt_ts(r.last_update_timestamp)]
            for r in rows
        ],
    )  # fmt: skip


# -- cluster and brokers -----------------------------------------------------------------------
@cli.command("clusterList")
@namesrv_option
@json_option
def cluster_list(namesrv: str | None, as_json: bool) -> None:
    """Brokers of every cluster with their version and load."""
    rows = _with_admin(namesrv, lambda a: a.cluster_list())
    if as_json:
        _emit_json(
            [
                {
                    "cluster": r.cluster,
                    "broker_name": r.broker_name,
                    "broker_id": r.broker_id,
                    "addr": r.addr,
                    "role": r.role,
                    "ha_offset": r.ha_offset,
                    "lag_bytes": replication_lag(rows, r),
                    "runtime": r.runtime,
                    "ha": r.ha.to_dict() if r.ha is not None else None,
                }
                for r in rows
            ]
        )
        return

    def first(v: str | None) -> str:
        return (v or "-").split(" ")[0]

    def opt(v: int | None) -> str:
        return "-" if v is None else str(v)

    _table(
        None,
        ["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Role", "#Version", "#InTPS",
         "#OutTPS", "#HAOffset", "#Lag(bytes)", "#Topics", "#Uptime"],
        [
            [r.cluster, r.broker_name, r.broker_id, r.addr, r.role if r.runtime else "-",
             r.runtime.get("brokerVersionDesc", "-"), first(r.runtime.get("putTps")),
             first(r.runtime.get("getTransferedTps")), opt(r.ha_offset),
             opt(replication_lag(rows, r)), r.runtime.get("topicCount", "-"),
             r.runtime.get("runtime", "-")]
            for r in rows
        ],
    )  # fmt: skip


@cli.command("haStatus")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Broker address HOST:PORT.")
@click.option("-c", "--clusterName", "cluster", help="Every broker of this cluster.")
@json_option
def ha_status(namesrv: str | None, broker: str | None, cluster: str | None, as_json: bool) -> None:
    """Replication status: a master's slaves and their offsets, a slave's master."""
    if not broker and not cluster:
        raise click.UsageError("give -b BROKER_ADDR or -c CLUSTER")

    async def body(a: Admin) -> dict[str, HARuntimeInfo]:
        if broker:
            return {broker: await a.ha_status(broker)}
        out = {}
        for r in await a.cluster_list():
            if r.cluster == cluster and r.ha is not None:
                out[r.addr] = r.ha
        if not out:
            raise MQClientError(f"no broker of cluster {cluster} answered with an HA status")
        return out

    infos = _with_admin(namesrv, body)
    if as_json:
        _emit_json({addr: info.to_dict() for addr, info in infos.items()})
        return
    for addr, info in infos.items():
        if info.master:
            _table(
                f"{addr}: master, commitlog max {info.master_commit_log_max_offset}, "
                f"{info.in_sync_slave_nums} in sync",
                ["#Slave", "#AckOffset", "#Diff(bytes)", "#InSync", "#TransferFrom"],
                [
                    [c.addr, c.slave_ack_offset, c.diff, c.in_sync, c.transfer_from_where]
                    for c in info.ha_connection_info
                ],
            )
        else:
            cl = info.ha_client_runtime_info
            _table(
                f"{addr}: slave",
                ["#Master", "#MaxOffset", "#Connected", "#LastRead", "#LastReport"],
                [[cl.master_addr or "-", cl.max_offset, cl.activated, cl.last_read_timestamp,
                  cl.last_write_timestamp]],
            )  # fmt: skip


@cli.command("getBrokerEpoch")
@namesrv_option
@click.option("-b", "--brokerName", "broker_name", help="Every replica of this broker name.")
@click.option("-c", "--clusterName", "cluster", help="Every broker of this cluster.")
@json_option
def get_broker_epoch(
    namesrv: str | None, broker_name: str | None, cluster: str | None, as_json: bool
) -> None:
    """Controller mode: each broker's master epochs and the commitlog range each wrote."""
    if not broker_name and not cluster:
        raise click.UsageError("give -b BROKER_NAME or -c CLUSTER")

    async def body(a: Admin) -> dict[str, dict[str, Any]]:
        out = {}
        for r in await a.cluster_list():
            if (broker_name and r.broker_name == broker_name) or (cluster and r.cluster == cluster):
                out[r.addr] = await a.broker_epoch(r.addr)
        if not out:
            raise MQClientError("no such broker is registered")
        return out

    infos = _with_admin(namesrv, body)
    if as_json:
        _emit_json(infos)
        return
    for addr, info in infos.items():
        _table(
            f"{addr}: {info.get('clusterName')}/{info.get('brokerName')} "
            f"id {info.get('brokerId')}, max offset {info.get('maxOffset')}",
            ["#Epoch", "#StartOffset", "#EndOffset"],
            [[e.get("epoch"), e.get("startOffset"), e.get("endOffset")]
             for e in info.get("epochList") or []],
        )  # fmt: skip


@cli.command("brokerStatus")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Broker address HOST:PORT.")
@click.option("-c", "--clusterName", "cluster", help="Every master of this cluster.")
@json_option
def broker_status(
    namesrv: str | None, broker: str | None, cluster: str | None, as_json: bool
) -> None:
    """A broker's runtime statistics."""
    if not broker and not cluster:
        raise click.UsageError("give -b BROKER_ADDR or -c CLUSTER")

    async def body(a: Admin) -> dict[str, dict[str, str]]:
        addrs = [broker] if broker else list((await a.master_addrs(cluster)).values())
        return {addr: await a.broker_status(addr) for addr in addrs if addr}

    result = _with_admin(namesrv, body)
    if as_json:
        _emit_json(result)
        return
    for addr, table in result.items():
        _table(addr, ["#Key", "#Value"], [[k, v] for k, v in sorted(table.items())])


# -- consumer groups ------------------------------------------------------------------------
@cli.command("consumerProgress")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@click.option("-t", "--topicName", "topic", help="Only this topic.")
@json_option
def consumer_progress(namesrv: str | None, group: str, topic: str | None, as_json: bool) -> None:
    """Broker offset, consumer offset and lag per queue."""
    rows = _with_admin(namesrv, lambda a: a.consumer_progress(group, topic))
    total = sum(r.diff for r in rows)
    if as_json:
        _emit_json(
            {
                "group": group,
                "diff_total": total,
                "queues": [
                    {
                        "topic": r.mq.topic,
                        "broker_name": r.mq.broker_name,
                        "queue_id": r.mq.queue_id,
                        "broker_offset": r.broker_offset,
                        "consumer_offset": r.consumer_offset,
                        "diff": r.diff,
                        "last_timestamp": r.last_timestamp,
                    }
                    for r in rows
                ],
            }
        )
        return
    _table(
        None,
        ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff",
         "#LastTime"],
        [
            [r.mq.topic, r.mq.broker_name, r.mq.queue_id, r.broker_offset, r.consumer_offset,
             r.diff, _fmt_ts(r.last_timestamp)]
            for r in rows
        ],
    )  # fmt: skip
    click.echo(f"\nDiff Total: {total}")


@cli.command("brokerConsumeStats")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", required=True, help="Broker address HOST:PORT.")
@click.option("-t", "--timeoutMillis", "timeout_ms", type=click.IntRange(1, 3_600_000),
              default=50_000, show_default=True, help="Request timeout.")  # fmt: skip
@click.option("-l", "--level", type=int, default=0, show_default=True,
              help="Print the queues whose backlog (#Diff) is at least this.")  # fmt: skip
@click.option("-o", "--order", type=click.BOOL, default=False, show_default=True,
              help="Orderly topics only.")  # fmt: skip
@json_option
def broker_consume_stats(
    namesrv: str | None, broker: str, timeout_ms: int, level: int, order: bool, as_json: bool
) -> None:
    """Every group's offsets and backlog per queue on one broker (GET_BROKER_CONSUME_STATS).

    Unlike RocketMQ's tool, a queue the group never consumed (no last time) is printed too,
    with "-": it is the backlog most worth seeing."""
    stats = _with_admin(
        namesrv, lambda a: a.broker_consume_stats(broker, order_only=order, timeout_ms=timeout_ms)
    )
    rows = []
    for entry in stats.consume_stats_list:
        for group, per_topic in entry.items():
            for topic_stats in per_topic:
                for mq, w in sorted(topic_stats.offset_table.items()):
                    diff = w.broker_offset - w.consumer_offset
                    if diff >= level:
                        rows.append((mq, group, w, diff))
    if as_json:
        _emit_json(
            {
                "broker_addr": stats.broker_addr,
                "total_diff": stats.total_diff,
                "queues": [
                    {"topic": mq.topic, "group": group, "broker_name": mq.broker_name,
                     "queue_id": mq.queue_id, "broker_offset": w.broker_offset,
                     "consumer_offset": w.consumer_offset, "diff": diff,
                     "last_timestamp": w.last_timestamp}
                    for mq, group, w, diff in rows
                ],
            }
        )  # fmt: skip
        return
    click.echo(
        f"{'#Topic':<32}  {'#Group':<32}  {'#Broker Name':<32}  {'#QID':<4}  "
        f"{'#Broker Offset':<20}  {'#Consumer Offset':<20}  {'#Diff':<20}  #LastTime"
    )
    for mq, group, w, diff in rows:
        click.echo(
            f"{mq.topic:<32}  {group:<32}  {mq.broker_name:<32}  {mq.queue_id:<4}  "
            f"{w.broker_offset:<20}  {w.consumer_offset:<20}  {diff:<20}  "
            f"{_fmt_ts(w.last_timestamp)}"
        )
    click.echo(f"\nDiff Total: {stats.total_diff}")


@cli.command("consumerConnection")
@namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True)
@json_option
def consumer_connection(namesrv: str | None, group: str, as_json: bool) -> None:
    """The group's online clients and subscriptions."""
    conn = _with_admin(namesrv, lambda a: a.consumer_connection(group))
    if as_json:
        _emit_json(conn.to_dict())
        return
    _table(
        None,
        ["#", "#ClientId", "#ClientAddr", "#Language", "#Version"],
        [
            [i + 1, c.client_id, c.client_addr, c.language, c.version]
            for i, c in enumerate(sorted(conn.connection_set, key=lambda c: c.client_id))
        ],
    )
    click.echo("\nBelow is subscription:")
    _table(
        None,
        ["#", "#Topic", "#SubExpression"],
        [
            [i + 1, t, s.sub_string]
            for i, (t, s) in enumerate(sorted(conn.subscription_table.items()))
        ],
    )
    click.echo(
        f"\nConsumeType: {conn.consume_type}\nMessageModel: {conn.message_model}\n"
        f"ConsumeFromWhere: {conn.consume_from_where}"
    )


@cli.command("resetOffsetByTime")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option(
    "-s",
    "--timestamp",
    required=True,
    help="Epoch ms, 'now', or yyyy-MM-dd#HH:mm:ss:SSS.",
)
@click.option("-f", "--force", default="true", help="Accepted for compatibility.")
@json_option
def reset_offset_by_time(
    namesrv: str | None, group: str, topic: str, timestamp: str, force: str, as_json: bool
) -> None:
    """Move a group's offsets to the first message at or after a time."""
    ts = _parse_time(timestamp)
    table = _with_admin(namesrv, lambda a: a.reset_offset_by_time(group, topic, ts))
    if as_json:
        _emit_json(
            [
                {"broker_name": mq.broker_name, "queue_id": mq.queue_id, "offset": off}
                for mq, off in table.items()
            ]
        )
        return
    _table(
        None,
        ["#Broker Name", "#Queue Id", "#Offset"],
        [[mq.broker_name, mq.queue_id, off] for mq, off in table.items()],
    )


def _parse_time(text: str) -> int:
    if text == "now":
        return int(time.time() * 1000)
    if text.isdigit() and len(text) == 14:  # yyyyMMddHHmmss, RocketMQ's consumeTimestamp
        try:
            return int(datetime.strptime(text, "%Y%m%d%H%M%S").timestamp() * 1000)
        except ValueError:
            pass
    if text.lstrip("-").isdigit():
        return int(text)
    for fmt in ("%Y-%m-%d#%H:%M:%S:%f", "%Y-%m-%d#%H:%M:%S", "%Y%m%d%H%M%S"):
        try:
            return int(datetime.strptime(text, fmt).timestamp() * 1000)
        except ValueError:
            continue
    raise click.BadParameter(f"cannot read time {text!r}; use epoch ms or yyyy-MM-dd#HH:mm:ss:SSS")


# -- messages ----------------------------------------------------------------------------------
def _print_messages(msgs: list[MessageExt], as_json: bool) -> None:
    if as_json:
        _emit_json([message_to_dict(m) for m in msgs])
        return
    for m in msgs:
        d = message_to_dict(m)
        rows = [
            ["OffsetID:", d["offset_msg_id"]],
            ["MsgId:", d["msg_id"]],
            ["Topic:", d["topic"]],
            ["Tags:", f"[{d['tags'] or ''}]"],
            ["Keys:", f"[{d['keys'] or ''}]"],
            ["Queue ID:", d["queue_id"]],
            ["Queue Offset:", d["queue_offset"]],
            ["Broker:", d["broker_name"]],
            ["Born Timestamp:", _fmt_ts(d["born_timestamp"])],
            ["Store Timestamp:", _fmt_ts(d["store_timestamp"])],
            ["Born Host:", d["born_host"]],
            ["Store Host:", d["store_host"]],
            ["Reconsume Times:", d["reconsume_times"]],
            ["Properties:", json.dumps(d["properties"], sort_keys=True)],
            ["Body" + (" (base64):" if d["body_base64"] else ":"), d["body"]],
        ]
        _table(None, ["", ""], rows)
        click.echo("")


@cli.command("queryMsgById")
@namesrv_option
@click.option(
    "-i", "--msgId", "msg_ids", required=True, help="Offset id(s) or unique id(s), comma-separated."
)
@click.option("-t", "--topic", help="Topic, to look a unique id (UNIQ_KEY) up.")
@json_option
def query_msg_by_id(namesrv: str | None, msg_ids: str, topic: str | None, as_json: bool) -> None:
    """Show messages by id."""

    async def body(a: Admin) -> list[MessageExt]:
        out: list[MessageExt] = []
        for mid in [m.strip() for m in msg_ids.split(",") if m.strip()]:
            out.extend(await a.query_msg_by_id(mid, topic))
        return out

    msgs = _with_admin(namesrv, body)
    if not msgs:
        _fail(f"no message found for {msg_ids}")
    _print_messages(msgs, as_json)


@cli.command("queryMsgByKey")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True)
@click.option("-f", "--fallbackHours", "hours", type=int, default=0, help="Only the last N hours.")
@click.option("--maxNum", "max_num", type=int, default=64, show_default=True)
@json_option
def query_msg_by_key(
    namesrv: str | None, topic: str, key: str, hours: int, max_num: int, as_json: bool
) -> None:
    """Messages indexed under a key."""
    begin = int((time.time() - hours * 3600) * 1000) if hours > 0 else 0
    msgs = _with_admin(
        namesrv, lambda a: a.query_msg_by_key(topic, key, max_num=max_num, begin_ms=begin)
    )
    if as_json:
        _emit_json([message_to_dict(m) for m in msgs])
        return
    _table(
        None,
        ["#Message ID", "#Offset ID", "#Broker", "#QID", "#Offset"],
        [[m.msg_id, m.offset_msg_id, m.broker_name, m.queue_id, m.queue_offset] for m in msgs],
    )


@cli.command("queryDlqMsg")
@namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True, help="Consumer group.")
@click.option("--maxNum", "max_num", type=int, default=1000, show_default=True)
@json_option
def query_dlq_msg(namesrv: str | None, group: str, max_num: int, as_json: bool) -> None:
    """List the dead-letter queue %DLQ%GROUP.

    A DLQ is write-only (perm 2) when the broker creates it; this command first raises
    its perm to 6 (read-write) on every broker that has it, as RocketMQ's dashboard
    does, then reads it. Resend a message with `resendDlqMsg -g GROUP -i MSGID`.
    """
    msgs = _with_admin(namesrv, lambda a: a.dlq_messages(group, max_num=max_num))
    if as_json:
        _emit_json([message_to_dict(m) for m in msgs])
        return
    _table(
        None,
        ["#Message ID", "#Offset ID", "#Original Topic", "#Reconsume Times", "#Store Time"],
        [
            [m.msg_id, m.offset_msg_id, m.properties.get("RETRY_TOPIC", ""), m.reconsume_times,
             _fmt_ts(m.store_timestamp)]
            for m in msgs
        ],
    )  # fmt: skip


@cli.command("resendDlqMsg")
@namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True, help="Consumer group.")
@click.option(
    "-i", "--msgId", "msg_id", required=True, help="Unique id, DLQ offset id or origin id."
)
@json_option
def resend_dlq_msg(namesrv: str | None, group: str, msg_id: str, as_json: bool) -> None:
    """Send a copy of a message in %DLQ%GROUP back to its original topic.

    The copy keeps body, keys, tags and user properties and gets a new message id;
    the DLQ itself is not changed (its perm is raised to 6 to read it).
    """
    m, r = _with_admin(namesrv, lambda a: a.resend_dlq_message(group, msg_id))
    row = {
        "dlq_msg_id": m.msg_id,
        "topic": r.message_queue.topic,
        "status": r.status.value,
        "msg_id": r.msg_id,
        "offset_msg_id": r.offset_msg_id,
        "broker_name": r.message_queue.broker_name,
        "queue_id": r.message_queue.queue_id,
        "queue_offset": r.queue_offset,
    }
    if as_json:
        _emit_json(row)
        return
    _table(None, ["#" + k for k in row], [list(row.values())])


@cli.command("sendMessage")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", required=True, help="Message body (UTF-8 text).")
@click.option("-k", "--keys", help="Keys, space-separated.")
@click.option("-c", "--tags", help="Tag.")
@click.option("-b", "--broker", help="Broker name (with -i).")
@click.option("-i", "--qid", type=int, help="Queue id (with -b).")
@click.option("-g", "--producerGroup", "group", default="mqadmin_producer", show_default=True)
@json_option
def send_message(
    namesrv: str | None,
    topic: str,
    body: str,
    keys: str | None,
    tags: str | None,
    broker: str | None,
    qid: int | None,
    group: str,
    as_json: bool,
) -> None:
    """Send one message and print the result."""
    cfg = _config(namesrv)
    if (broker is None) != (qid is None):
        raise click.UsageError("-b and -i go together")

    async def main() -> Any:
        async with Producer(group, cfg) as p:
            queue = (
                MessageQueue(topic, broker, qid) if broker is not None and qid is not None else None
            )
            return await p.send(Message(topic, body, tags=tags, keys=keys), queue=queue)

    r = _run(main)
    if as_json:
        _emit_json(
            {
                "status": r.status.value,
                "msg_id": r.msg_id,
                "offset_msg_id": r.offset_msg_id,
                "broker_name": r.message_queue.broker_name,
                "queue_id": r.message_queue.queue_id,
                "queue_offset": r.queue_offset,
            }
        )
        return
    _table(
        None,
        ["#Broker Name", "#QID", "#Send Result", "#MsgId", "#OffsetMsgId", "#QueueOffset"],
        [[r.message_queue.broker_name, r.message_queue.queue_id, r.status.value, r.msg_id,
          r.offset_msg_id, r.queue_offset]],
    )  # fmt: skip


@cli.command("consumeMessage")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-g", "--consumerGroup", "group", help="Group (offsets are committed for it).")
@click.option("--count", type=int, help="Stop after N messages.")
@click.option(
    "--timeout", type=float, default=10.0, show_default=True, help="Stop after S seconds."
)
@click.option(
    "--from",
    "start",
    type=click.Choice(["first", "last"]),
    help="Start at the oldest or after the newest message (default: the group's offsets, "
    "else first).",
)
def consume_message(
    namesrv: str | None,
    topic: str,
    group: str | None,
    count: int | None,
    timeout: float,
    start: str | None,
) -> None:
    """Print messages as JSON lines (one object per message)."""
    cfg = _config(namesrv)
    commit = group is not None
    grp = group or f"mqadmin_consume_{time.time_ns()}"
    if start is None:
        start = None if commit else "first"

    async def main() -> int:
        printed = 0
        c = PullConsumer(
            grp,
            cfg,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            auto_commit=commit,
        )
        async with c:
            mqs = await c.fetch_message_queues(topic)
            c.assign(mqs)
            await c.do_rebalance()
            for mq in mqs:
                if start == "first":
                    await c.seek_to_begin(mq)
                elif start == "last":
                    await c.seek_to_end(mq)
            with trio.move_on_after(timeout):
                while count is None or printed < count:
                    for m in await c.poll(timeout_ms=500):
                        if count is not None and printed >= count:
                            break
                        click.echo(json.dumps(message_to_dict(m), sort_keys=True))
                        printed += 1
            if commit:
                await c.persist_offsets()
        return printed

    n = _run(main)
    click.echo(f"consumed {n} message(s)", err=True)


# -- subscription groups ------------------------------------------------------------------------
def _broker_addrs(a: Admin, broker: str | None, cluster: str | None) -> Awaitable[list[str]]:
    """`-b ADDR` (checked against the NameServer's brokers) or the masters of `-c CLUSTER`."""

    async def find() -> list[str]:
        info = await a.cluster_info()
        if broker:
            known = {
                addr for bd in info.broker_addr_table.values() for addr in bd.broker_addrs.values()
            }
            if broker not in known:
                raise MQClientError(
                    f"no broker at {broker} is registered with the NameServer; known: "
                    + (", ".join(sorted(known)) or "none")
                )
            return [broker]
        addrs = list((await a.master_addrs(cluster)).values())
        if not addrs:
            raise MQClientError(f"no master broker in cluster {cluster}")
        return addrs

    return find()


def _need_target(broker: str | None, cluster: str | None) -> None:
    if not broker and not cluster:
        raise click.UsageError("give -b BROKER_ADDR or -c CLUSTER")


@cli.command("updateSubGroup")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Create on this broker only.")
@click.option("-c", "--clusterName", "cluster", help="Create on every master of this cluster.")
@click.option("-g", "--groupName", "group", required=True, help="Consumer group name.")
@click.option("-s", "--consumeEnable", "consume_enable", help="true/false (default true).")
@click.option("-m", "--consumeFromMinEnable", "from_min", help="true/false (default true).")
@click.option("-d", "--consumeBroadcastEnable", "broadcast", help="true/false (default true).")
@click.option("-q", "--retryQueueNums", "retry_queues", type=int, help="Retry queues (1).")
@click.option("-r", "--retryMaxTimes", "retry_max", type=int, help="Max retries (16).")
@click.option("-i", "--brokerId", "broker_id", type=int, help="Consume from this broker id (0).")
@click.option("-w", "--whichBrokerWhenConsumeSlowly", "slow_id", type=int, help="Broker id (1).")
@click.option("-a", "--notifyConsumerIdsChanged", "notify", help="true/false (default true).")
@click.option("-o", "--consumeMessageOrderly", "orderly", help="true/false (default false).")
@json_option
def update_sub_group(
    namesrv: str | None,
    broker: str | None,
    cluster: str | None,
    group: str,
    consume_enable: str | None,
    from_min: str | None,
    broadcast: str | None,
    retry_queues: int | None,
    retry_max: int | None,
    broker_id: int | None,
    slow_id: int | None,
    notify: str | None,
    orderly: str | None,
    as_json: bool,
) -> None:
    """Create or update a subscription (consumer) group."""
    _need_target(broker, cluster)
    cfg = SubscriptionGroupConfig(group_name=group)
    for attr, text in (
        ("consume_enable", consume_enable),
        ("consume_from_min_enable", from_min),
        ("consume_broadcast_enable", broadcast),
        ("notify_consumer_ids_changed_enable", notify),
        ("consume_message_orderly", orderly),
    ):
        if text is not None:
            setattr(cfg, attr, _bool(text))
    for attr, num in (
        ("retry_queue_nums", retry_queues),
        ("retry_max_times", retry_max),
        ("broker_id", broker_id),
        ("which_broker_when_consume_slowly", slow_id),
    ):
        if num is not None:
            if num < 0:
                raise click.BadParameter(f"{attr} must not be negative, got {num}")
            setattr(cfg, attr, num)

    async def body(a: Admin) -> list[str]:
        addrs = await _broker_addrs(a, broker, cluster)
        for addr in addrs:
            await a.update_subscription_group(addr, cfg)
        return addrs

    addrs = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"brokers": addrs, "config": cfg.to_dict()})
        return
    for addr in addrs:
        click.echo(f"create subscription group to {addr} success.")
    click.echo(_java_like("SubscriptionGroupConfig", cfg.to_dict()))


def _java_like(name: str, values: dict[str, Any]) -> str:
    inner = ", ".join(f"{k}={v}" for k, v in values.items() if not isinstance(v, dict | list))
    return f"{name} [{inner}]"


@cli.command("deleteSubGroup")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Delete on this broker only.")
@click.option("-c", "--clusterName", "cluster", help="Delete on every master of this cluster.")
@click.option("-g", "--groupName", "group", required=True, help="Consumer group name.")
@click.option(
    "-r",
    "--removeOffset",
    "remove_offset",
    default="false",
    help="true: also remove the group's consumer offsets (default false).",
)
@json_option
def delete_sub_group(
    namesrv: str | None,
    broker: str | None,
    cluster: str | None,
    group: str,
    remove_offset: str,
    as_json: bool,
) -> None:
    """Delete a subscription group (with -c also its %RETRY% and %DLQ% topics)."""
    _need_target(broker, cluster)
    remove = _bool(remove_offset)

    async def body(a: Admin) -> list[str]:
        addrs = await _broker_addrs(a, broker, cluster)
        for addr in addrs:
            await a.delete_subscription_group(addr, group, remove_offset=remove)
        if cluster:
            for prefix in ("%RETRY%", "%DLQ%"):
                await a.delete_topic(prefix + group, cluster=cluster)
        return addrs

    addrs = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"group": group, "brokers": addrs})
        return
    for addr in addrs:
        click.echo(f"delete subscription group [{group}] from broker [{addr}] success.")
    if cluster:
        click.echo(f"delete topic [%RETRY%{group}] and [%DLQ%{group}] from cluster [{cluster}]")


# -- configuration ------------------------------------------------------------------------------
def _print_config(addr: str, table: dict[str, str]) -> None:
    click.echo(f"============{addr}============")
    for k, v in sorted(table.items()):
        click.echo(f"{k:<50}=  {v}")


@cli.command("getBrokerConfig")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Broker address HOST:PORT.")
@click.option("-c", "--clusterName", "cluster", help="Every master of this cluster.")
@json_option
def get_broker_config(
    namesrv: str | None, broker: str | None, cluster: str | None, as_json: bool
) -> None:
    """A broker's settings."""
    _need_target(broker, cluster)

    async def body(a: Admin) -> dict[str, dict[str, str]]:
        return {
            addr: await a.get_broker_config(addr)
            for addr in await _broker_addrs(a, broker, cluster)
        }

    result = _with_admin(namesrv, body)
    if as_json:
        _emit_json(result)
        return
    for addr, table in result.items():
        _print_config(addr, table)


@cli.command("updateBrokerConfig")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Broker address HOST:PORT.")
@click.option("-c", "--clusterName", "cluster", help="Every master of this cluster.")
@click.option("-k", "--key", required=True, help="Setting name (e.g. maxMessageSize).")
@click.option("-v", "--value", required=True, help="New value.")
@json_option
def update_broker_config(
    namesrv: str | None,
    broker: str | None,
    cluster: str | None,
    key: str,
    value: str,
    as_json: bool,
) -> None:
    """Change a broker setting at run time (only those that take effect at once).

    The broker writes the change to the config file it was started with (--config); without
    one the change lasts until it stops. Other settings are refused: they need a restart.
    """
    _need_target(broker, cluster)

    async def body(a: Admin) -> dict[str, str | None]:
        return {
            addr: await a.update_broker_config(addr, key, value)
            for addr in await _broker_addrs(a, broker, cluster)
        }

    result = _with_admin(namesrv, body)
    if as_json:
        _emit_json({addr: {"key": key, "value": value, "remark": r} for addr, r in result.items()})
        return
    for addr, remark in result.items():
        click.echo(f"update broker config success, {addr}")
        if remark:
            click.echo(f"mqadmin: warning: {addr}: {remark}", err=True)


@cli.command("getNamesrvConfig")
@namesrv_option
@json_option
def get_namesrv_config(namesrv: str | None, as_json: bool) -> None:
    """Every NameServer's settings."""

    async def body(a: Admin) -> dict[str, dict[str, str]]:
        return {ns: await a.get_namesrv_config(ns) for ns in a.namesrv_addrs()}

    result = _with_admin(namesrv, body)
    if as_json:
        _emit_json(result)
        return
    for ns, table in result.items():
        _print_config(ns, table)


@cli.command("updateNamesrvConfig")
@namesrv_option
@click.option("-k", "--key", required=True, help="Setting name (e.g. orderMessageEnable).")
@click.option("-v", "--value", required=True, help="New value.")
@json_option
def update_namesrv_config(namesrv: str | None, key: str, value: str, as_json: bool) -> None:
    """Change a setting of every NameServer at run time (until it stops)."""

    async def body(a: Admin) -> list[str]:
        addrs = a.namesrv_addrs()
        for ns in addrs:
            await a.update_namesrv_config(ns, key, value)
        return addrs

    addrs = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"namesrv": addrs, "key": key, "value": value})
        return
    click.echo(f"update name server config success!{addrs}\n{key} : {value}")


# -- write permission ---------------------------------------------------------------------------
def _write_perm(namesrv: str | None, broker_name: str, wipe: bool, as_json: bool) -> None:
    async def body(a: Admin) -> dict[str, int | str]:
        info = await a.cluster_info()
        if broker_name not in info.broker_addr_table:
            raise MQClientError(
                f"no broker named {broker_name} is registered; known: "
                + (", ".join(sorted(info.broker_addr_table)) or "none")
            )
        out: dict[str, int | str] = {}
        for ns in a.namesrv_addrs():
            try:
                if wipe:
                    out[ns] = await a.wipe_write_perm(ns, broker_name)
                else:
                    out[ns] = await a.add_write_perm(ns, broker_name)
            except (RemotingError, MQClientError) as exc:
                out[ns] = f"Failed: {_describe(exc)}"
        return out

    result = _with_admin(namesrv, body)
    verb = "wipe" if wipe else "add"
    if as_json:
        _emit_json({"broker_name": broker_name, "namesrv": result})
    else:
        for ns, count in result.items():
            state = f"OK, {count}" if isinstance(count, int) else count
            click.echo(f"{verb} write perm of broker[{broker_name}] in name server[{ns}] {state}")
    if any(not isinstance(c, int) for c in result.values()):
        sys.exit(1)


@cli.command("wipeWritePerm")
@namesrv_option
@click.option("-b", "--brokerName", "broker_name", required=True, help="Broker name.")
@json_option
def wipe_write_perm(namesrv: str | None, broker_name: str, as_json: bool) -> None:
    """Stop producers writing to a broker: clear its topics' write perm in the NameServers."""
    _write_perm(namesrv, broker_name, True, as_json)


@cli.command("addWritePerm")
@namesrv_option
@click.option("-b", "--brokerName", "broker_name", required=True, help="Broker name.")
@json_option
def add_write_perm(namesrv: str | None, broker_name: str, as_json: bool) -> None:
    """Give a broker's topics read-write perm again in the NameServers."""
    _write_perm(namesrv, broker_name, False, as_json)


# -- files --------------------------------------------------------------------------------------
def _all_masters(a: Admin, broker: str | None, cluster: str | None) -> Awaitable[list[str]]:
    async def find() -> list[str]:
        if broker or cluster:
            return await _broker_addrs(a, broker, cluster)
        return list((await a.master_addrs()).values())

    return find()


@cli.command("cleanExpiredCQ")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Broker address HOST:PORT.")
@click.option("-c", "--cluster", "cluster", help="Every master of this cluster (none: all).")
@json_option
def clean_expired_cq(
    namesrv: str | None, broker: str | None, cluster: str | None, as_json: bool
) -> None:
    """Delete consume-queue files that point only at deleted commitlog files."""

    async def body(a: Admin) -> list[str]:
        addrs = await _all_masters(a, broker, cluster)
        for addr in addrs:
            await a.clean_expired_consume_queue(addr)
        return addrs

    addrs = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"brokers": addrs, "result": True})
        return
    click.echo("success")


@cli.command("deleteExpiredCommitLog")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker", help="Broker address HOST:PORT.")
@click.option("-c", "--cluster", "cluster", help="Every master of this cluster (none: all).")
@json_option
def delete_expired_commit_log(
    namesrv: str | None, broker: str | None, cluster: str | None, as_json: bool
) -> None:
    """Delete commitlog files past their reserved time now (whatever the delete hour)."""

    async def body(a: Admin) -> dict[str, int]:
        return {
            addr: await a.delete_expired_commitlog(addr)
            for addr in await _all_masters(a, broker, cluster)
        }

    result = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"deleted_files": result, "result": True})
        return
    click.echo("success")


# -- order config -------------------------------------------------------------------------------
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # the NameServer's KV namespace of ordered topics
_ORDER_CONF = re.compile(r"^[A-Za-z0-9_.%|-]+:[0-9]+(;[A-Za-z0-9_.%|-]+:[0-9]+)*;?$")


@cli.command("updateOrderConf")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option(
    "-m", "--method", required=True, type=click.Choice(["put", "get", "delete"]), help="Action."
)
@click.option("-v", "--orderConf", "conf", help="brokerName:queueNums;... (put).")
@json_option
def update_order_conf(
    namesrv: str | None, topic: str, method: str, conf: str | None, as_json: bool
) -> None:
    """Put, get or delete an ordered topic's queue layout (NameServer KV ORDER_TOPIC_CONFIG)."""
    check_topic(topic)
    if method == "put":
        if not conf or not _ORDER_CONF.match(conf):
            raise click.BadParameter(
                f"expected brokerName:queueNums;brokerName:queueNums, got {conf!r}",
                param_hint="-v",
            )
        if any(int(part.split(":")[1]) <= 0 for part in conf.rstrip(";").split(";")):
            raise click.BadParameter("queue numbers must be positive", param_hint="-v")

    async def body(a: Admin) -> str | None:
        if method == "put":
            assert conf is not None
            await a.put_kv(ORDER_TOPIC_CONFIG, topic, conf)
            return conf
        if method == "get":
            value = await a.get_kv(ORDER_TOPIC_CONFIG, topic)
            if value is None:
                raise MQClientError(f"no order config for topic {topic}")
            return value
        await a.delete_kv(ORDER_TOPIC_CONFIG, topic)
        return None

    value = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"topic": topic, "method": method, "orderConf": value})
        return
    if method == "put":
        click.echo(f"update orderConf success. topic=[{topic}], orderConf=[{value}]")
    elif method == "get":
        click.echo(f"get orderConf success. topic=[{topic}], orderConf=[{value}]")
    else:
        click.echo(f"delete orderConf success. topic=[{topic}]")


# -- topics and clusters ------------------------------------------------------------------------
@cli.command("topicClusterList")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
def topic_cluster_list(namesrv: str | None, topic: str, as_json: bool) -> None:
    """The clusters a topic lives in."""

    async def body(a: Admin) -> list[str]:
        route = await a.topic_route(topic)
        info = await a.cluster_info()
        names = {b.broker_name for b in route.broker_datas}
        return sorted(c for c, brokers in info.cluster_addr_table.items() if names & set(brokers))

    clusters = _with_admin(namesrv, body)
    if as_json:
        _emit_json({"topic": topic, "clusters": clusters})
        return
    for c in clusters:
        click.echo(c)


@cli.command("allocateMQ")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-i", "--ipList", "ips", required=True, help="Client ids, comma-separated.")
def allocate_mq(namesrv: str | None, topic: str, ips: str) -> None:
    """How AllocateMessageQueueAveragely spreads the topic's queues over these clients (JSON)."""
    cids = [ip.strip() for ip in ips.split(",") if ip.strip()]
    if not cids:
        raise click.BadParameter("no client id given", param_hint="-i")
    if len(set(cids)) != len(cids):
        raise click.BadParameter("a client id is given twice", param_hint="-i")
    mqs = _with_admin(namesrv, lambda a: a.message_queues(topic))
    strategy = AllocateMessageQueueAveragely()
    result = {
        cid: [
            {"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic}
            for mq in strategy.allocate("aa", cid, mqs, cids)
        ]
        for cid in cids
    }
    click.echo(json.dumps({"result": result}))


# -- sending round trips ------------------------------------------------------------------------
def _check_amount(amount: int, size: int) -> None:
    if not 0 < amount <= 100_000:
        raise click.BadParameter(f"amount must be 1..100000, got {amount}", param_hint="-a")
    if not 0 < size <= 4 * 1024 * 1024:
        raise click.BadParameter(f"size must be 1..4194304 bytes, got {size}", param_hint="-s")


@cli.command("checkMsgSendRT")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-a", "--amount", type=int, default=100, show_default=True, help="Messages.")
@click.option("-s", "--size", type=int, default=128, show_default=True, help="Body bytes.")
@json_option
def check_msg_send_rt(
    namesrv: str | None, topic: str, amount: int, size: int, as_json: bool
) -> None:
    """Send messages round the topic's queues and print each send's round trip time."""
    _check_amount(amount, size)
    check_topic(topic)
    cfg = _config(namesrv)
    body = b"a" * size

    async def main() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        async with Admin(cfg) as a:
            route = await a.topic_route(topic)
            queues = sorted(publish_queues(topic, route))
            if not queues:
                raise MQClientError(f"topic {topic} has no writable queue")
            async with Producer("PID_SMSC", cfg, instance=a.instance) as p:
                for i in range(amount):
                    mq = queues[i % len(queues)]
                    start = time.perf_counter()
                    try:
                        r = await p.send(Message(topic, body), queue=mq)
                        status = r.status.value
                    except (MQClientError, RemotingError) as exc:
                        status = f"FAILED: {_describe(exc)}"
                    rt = (time.perf_counter() - start) * 1000
                    rows.append(
                        {"broker_name": mq.broker_name, "queue_id": mq.queue_id,
                         "status": status, "rt_ms": round(rt, 3)}
                    )  # fmt: skip
        return rows

    rows = _run(main)
    avg = sum(r["rt_ms"] for r in rows) / len(rows)
    if as_json:
        _emit_json({"sends": rows, "avg_rt_ms": round(avg, 3)})
    else:
        _table(
            None,
            ["#Broker Name", "#QID", "#Send Result", "#RT"],
            [[r["broker_name"], r["queue_id"], r["status"], f"{r['rt_ms']:.2f}"] for r in rows],
        )
        click.echo(f"Avg RT: {avg:.2f}")
    if any(r["status"] != "SEND_OK" for r in rows):
        sys.exit(1)


@cli.command("clusterRT")
@namesrv_option
@click.option("-a", "--amount", type=int, default=100, show_default=True, help="Per broker.")
@click.option("-s", "--size", type=int, default=128, show_default=True, help="Body bytes.")
@click.option("-c", "--cluster", help="Only this cluster.")
@click.option("-p", "--printLog", "print_log", default="false", help="Accepted, ignored.")
@click.option("-m", "--machineRoom", "room", default="noname", help="Machine room (JSON rows).")
@click.option("-i", "--interval", type=int, default=10, show_default=True, help="Seconds.")
@click.option("--rounds", type=int, default=0, help="Stop after N rounds (0: run until ^C).")
@json_option
def cluster_rt(
    namesrv: str | None,
    amount: int,
    size: int,
    cluster: str | None,
    print_log: str,
    room: str,
    interval: int,
    rounds: int,
    as_json: bool,
) -> None:
    """Send to each broker's own topic (its broker name) and print the mean round trip time,
    every interval seconds."""
    _check_amount(amount, size)
    if interval < 0 or rounds < 0:
        raise click.BadParameter("interval and rounds must not be negative")
    cfg = _config(namesrv)
    payload = b"a" * size

    async def main() -> None:
        async with Admin(cfg) as a:
            info = await a.cluster_info()
            if cluster is not None and cluster not in info.cluster_addr_table:
                raise MQClientError(
                    f"cluster {cluster!r} not found; known: {sorted(info.cluster_addr_table)}"
                )
            targets = [
                (c, name)
                for c, names in sorted(info.cluster_addr_table.items())
                if cluster is None or c == cluster
                for name in sorted(names)
            ]
            done = 0
            async with Producer("PID_ClusterRTCommand", cfg, instance=a.instance) as p:
                while True:
                    rows = []
                    for c, name in targets:
                        ok = failed = 0
                        total = 0.0
                        for _ in range(amount):
                            start = time.perf_counter()
                            try:
                                await p.send(Message(name, payload))
                            except (MQClientError, RemotingError):
                                failed += 1
                                continue
                            total += time.perf_counter() - start
                            ok += 1
                        rt = total * 1000 / ok if ok else 0.0
                        rows.append({"cluster": c, "broker_name": name, "rt_ms": round(rt, 3),
                                     "success": ok, "failed": failed, "room": room})  # fmt: skip
                    if as_json:
                        click.echo(json.dumps(rows, sort_keys=True))
                    else:
                        _table(
                            None,
                            ["#Cluster Name", "#Broker Name", "#RT", "#successCount",
                             "#failCount"],
                            [[r["cluster"], r["broker_name"], f"{r['rt_ms']:.2f}", r["success"],
                              r["failed"]] for r in rows],
                        )  # fmt: skip
                    done += 1
                    if rounds and done >= rounds:
                        return
                    await trio.sleep(interval)

    _run(main)


# -- messages by position ------------------------------------------------------------------------
@cli.command("queryMsgByOffset")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=int, required=True)
@click.option("-o", "--offset", type=int, required=True)
@json_option
def query_msg_by_offset(
    namesrv: str | None, topic: str, broker_name: str, queue_id: int, offset: int, as_json: bool
) -> None:
    """The message at an offset of one queue."""
    if queue_id < 0:
        raise click.BadParameter(f"queue id must not be negative, got {queue_id}", param_hint="-i")
    if offset < 0:
        raise click.BadParameter(f"offset must not be negative, got {offset}", param_hint="-o")
    mq = MessageQueue(topic, broker_name, queue_id)

    async def body(a: Admin) -> list[MessageExt]:
        await _check_queue(a, mq)
        lo, hi = await a.queue_offsets(mq)
        if not lo <= offset < hi:
            raise MQClientError(
                f"no message at offset {offset} of {mq}: its messages are at offsets {lo}..{hi - 1}"
                if hi > lo
                else f"no message at offset {offset}: {mq} is empty"
            )
        msgs = await a.pull_range(mq, offset, offset + 1, max_num=1)
        if not msgs:
            raise MQClientError(f"no message at offset {offset} of {mq}")
        for m in msgs:
            m.broker_name = broker_name
        return msgs

    _print_messages(_with_admin(namesrv, body), as_json)


async def _check_queue(a: Admin, mq: MessageQueue) -> None:
    queues = await a.message_queues(mq.topic)
    if mq not in queues:
        names = sorted({q.broker_name for q in queues})
        top = max((q.queue_id for q in queues), default=-1)
        raise MQClientError(
            f"topic {mq.topic} has no queue {mq.queue_id} on broker {mq.broker_name} (brokers: "
            f"{', '.join(names) or 'none'}; queue ids 0..{top})"
        )


@cli.command("queryMsgByUniqueKey")
@namesrv_option
@click.option("-i", "--msgId", "msg_id", required=True, help="The message's unique id (UNIQ_KEY).")
@click.option("-t", "--topic", required=True)
@click.option("-g", "--groupName", "group", help="With -d: the consumer group.")
@click.option(
    "-d", "--clientId", "client_id", help="With -g: this client consumes the message directly."
)
@click.option("-a", "--showAll", "show_all", is_flag=True, help="Every copy, not the earliest.")
@json_option
def query_msg_by_unique_key(
    namesrv: str | None,
    msg_id: str,
    topic: str,
    group: str | None,
    client_id: str | None,
    show_all: bool,
    as_json: bool,
) -> None:
    """A message by its unique id (the earliest stored copy, or all with -a).

    With -g and -d, the client -d of group -g consumes the earliest copy once with its listener
    (CONSUME_MESSAGE_DIRECTLY, no offset moves) and the result is printed instead."""
    if bool(group) != bool(client_id):
        _fail("-g and -d go together: the group and the client that consumes the message")

    async def find(a: Admin) -> list[MessageExt]:
        found = await a.query_msg_by_key(topic, msg_id, max_num=32, unique_key=True)
        return sorted((m for m in found if m.msg_id == msg_id), key=lambda m: m.store_timestamp)

    if group and client_id:

        async def direct(a: Admin) -> dict[str, Any]:
            msgs = await find(a)
            if not msgs:
                raise MQClientError(f"no message with unique id {msg_id} in topic {topic}")
            m = msgs[0]
            return await a.consume_message_directly(
                group, client_id, m.topic, m.broker_name, m.offset_msg_id
            )

        result = _with_admin(namesrv, direct)
        if as_json:
            _emit_json(result)
        else:
            # RocketMQ's ConsumeMessageDirectlyResult.toString.
            click.echo(
                f"ConsumeMessageDirectlyResult [order={_java_bool(result.get('order'))}, "
                f"autoCommit={_java_bool(result.get('autoCommit'))}, "
                f"consumeResult={result.get('consumeResult')}, "
                f"remark={_java_text(result.get('remark'))}, "
                f"spentTimeMills={int(figure(result.get('spentTimeMills')))}]"
            )
        return

    msgs = _with_admin(namesrv, find)
    if not msgs:
        _fail(f"no message with unique id {msg_id} in topic {topic}")
    _print_messages(msgs if show_all else msgs[:1], as_json)


def _java_bool(value: object) -> str:
    return "true" if value is True else "false"


def _java_text(value: object) -> str:
    return "null" if value is None else str(value)


def _decode_body(body: bytes, charset: str) -> str:
    return body.decode(charset, errors="replace")


def _check_charset(charset: str) -> None:
    import codecs

    try:
        codecs.lookup(charset)
    except LookupError:
        raise click.BadParameter(f"unknown charset {charset!r}", param_hint="-c") from None


async def _print_queue(
    a: Admin,
    mq: MessageQueue,
    begin: int | None,
    end: int | None,
    sub: str,
) -> tuple[int, int, list[MessageExt]]:
    lo, hi = await a.queue_offsets(mq)
    start = max(lo, await a.search_offset(mq, begin)) if begin is not None else lo
    stop = min(hi, await a.search_offset(mq, end)) if end is not None else hi
    expr = parse_tag_expression(sub)
    msgs = await a.pull_range(mq, start, stop, max_num=max(0, stop - start), subscription=sub)
    if not expr.matches_all:
        msgs = [m for m in msgs if (m.tags or "") in expr.tags]
    for m in msgs:
        m.broker_name = mq.broker_name
    return lo, hi, msgs


def _time_range(begin: str | None, end: str | None) -> tuple[int | None, int | None]:
    b = _parse_time(begin) if begin else None
    e = _parse_time(end) if end else None
    if b is not None and e is not None and e < b:
        raise click.BadParameter("the end (-e) is before the begin (-b)")
    return b, e


def _message_line(m: MessageExt, charset: str, print_body: bool) -> str:
    body = _decode_body(m.body, charset) if print_body else "NOT PRINT BODY"
    return (
        f"MSGID: {m.msg_id} MessageExt [brokerName={m.broker_name}, queueId={m.queue_id}, "
        f"storeSize={len(m.body)}, queueOffset={m.queue_offset}, bornTimestamp="
        f"{m.born_timestamp}, storeTimestamp={m.store_timestamp}, msgId={m.offset_msg_id}, "
        f"reconsumeTimes={m.reconsume_times}, topic={m.topic}, tags={m.tags}, keys={m.keys}, "
        f"properties={dict(m.properties)}] BODY: {body}"
    )


@cli.command("printMsg")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--charsetName", "charset", default="UTF-8", show_default=True)
@click.option("-s", "--subExpression", "sub", default="*", show_default=True)
@click.option("-b", "--beginTimestamp", "begin", help="Epoch ms or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-e", "--endTimestamp", "end", help="Epoch ms or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-d", "--printBody", "print_body", default="true", show_default=True)
@json_option
def print_msg(
    namesrv: str | None,
    topic: str,
    charset: str,
    sub: str,
    begin: str | None,
    end: str | None,
    print_body: str,
    as_json: bool,
) -> None:
    """Print every message of a topic (in a time range), queue by queue."""
    _check_charset(charset)
    show_body = _bool(print_body)
    b, e = _time_range(begin, end)

    async def body(a: Admin) -> list[tuple[MessageQueue, int, int, list[MessageExt]]]:
        out = []
        for mq in await a.message_queues(topic):
            lo, hi, msgs = await _print_queue(a, mq, b, e, sub)
            out.append((mq, lo, hi, msgs))
        return out

    result = _with_admin(namesrv, body)
    if as_json:
        _emit_json(
            [
                {"broker_name": mq.broker_name, "queue_id": mq.queue_id, "min_offset": lo,
                 "max_offset": hi, "messages": [message_to_dict(m) for m in msgs]}
                for mq, lo, hi, msgs in result
            ]
        )  # fmt: skip
        return
    for mq, lo, hi, msgs in result:
        click.echo(f"minOffset={lo}, maxOffset={hi}, {_mq_text(mq)}")
        for m in msgs:
            click.echo(_message_line(m, charset, show_body))
        click.echo("--------------------------------------------------------")


def _mq_text(mq: MessageQueue) -> str:
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


@cli.command("printMsgByQueue")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-a", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=int, required=True)
@click.option("-c", "--charsetName", "charset", default="UTF-8", show_default=True)
@click.option("-s", "--subExpression", "sub", default="*", show_default=True)
@click.option("-b", "--beginTimestamp", "begin", help="Epoch ms or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-e", "--endTimestamp", "end", help="Epoch ms or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-p", "--print", "print_msgs", default="false", show_default=True)
@click.option("-d", "--printBody", "print_body", default="false", show_default=True)
@click.option("-f", "--calculate", "count_tags", default="false", show_default=True)
@json_option
def print_msg_by_queue(
    namesrv: str | None,
    topic: str,
    broker_name: str,
    queue_id: int,
    charset: str,
    sub: str,
    begin: str | None,
    end: str | None,
    print_msgs: str,
    print_body: str,
    count_tags: str,
    as_json: bool,
) -> None:
    """Print one queue's messages (-p), or count them by tag (-f)."""
    _check_charset(charset)
    show, show_body, by_tag = _bool(print_msgs), _bool(print_body), _bool(count_tags)
    b, e = _time_range(begin, end)
    if queue_id < 0:
        raise click.BadParameter(f"queue id must not be negative, got {queue_id}", param_hint="-i")
    mq = MessageQueue(topic, broker_name, queue_id)

    async def body(a: Admin) -> tuple[int, int, list[MessageExt]]:
        await _check_queue(a, mq)
        return await _print_queue(a, mq, b, e, sub)

    lo, hi, msgs = _with_admin(namesrv, body)
    tags: dict[str, int] = {}
    for m in msgs:
        tags[m.tags or ""] = tags.get(m.tags or "", 0) + 1
    if as_json:
        _emit_json(
            {"broker_name": broker_name, "queue_id": queue_id, "min_offset": lo,
             "max_offset": hi, "count": len(msgs),
             "tags": dict(sorted(tags.items(), key=lambda kv: -kv[1])) if by_tag else None,
             "messages": [message_to_dict(m) for m in msgs] if show else None}
        )  # fmt: skip
        return
    click.echo(f"minOffset={lo}, maxOffset={hi}, {_mq_text(mq)}")
    if show:
        for m in msgs:
            click.echo(_message_line(m, charset, show_body))
    if by_tag:
        for tag, n in sorted(tags.items(), key=lambda kv: -kv[1]):
            click.echo(f"Tag: {tag:<30} Count: {n}")
    click.echo(f"messages: {len(msgs)}")


# -- clients ------------------------------------------------------------------------------------
@cli.command("producerConnection")
@namesrv_option
@click.option("-g", "--producerGroup", "group", required=True)
@click.option("-t", "--topic", required=True)
@json_option
def producer_connection(namesrv: str | None, group: str, topic: str, as_json: bool) -> None:
    """The online producers of a group (asked of a broker of the topic)."""

    async def body(a: Admin) -> Any:
        route = await a.topic_route(topic)
        last: Exception | None = None
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = master_addr(bd)
            if addr is None:
                continue
            try:
                return await a.producer_connection(addr, group)
            except RemoteError as exc:
                last = exc
        raise MQClientError(
            f"the producer group {group} is not online on the brokers of {topic}"
            + (f" ({last.remark})" if isinstance(last, RemoteError) else "")
        )

    conn = _with_admin(namesrv, body)
    rows = sorted(conn.connection_set, key=lambda c: c.client_id)
    if as_json:
        _emit_json(conn.to_dict())
        return
    for i, c in enumerate(rows, 1):
        click.echo(f"{i:04d}  {c.client_id:<32} {c.client_addr:<32} {c.language:<16} {c.version}")


@cli.command("consumerStatus")
@namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True)
@click.option("-i", "--clientId", "client_id", help="One client (default: every client).")
@click.option("-b", "--brokerAddr", "broker", help="Ask through this broker.")
@click.option("-s", "--jstack", "jstack", is_flag=True, help="Ask for a thread dump too.")
@json_option
def consumer_status(
    namesrv: str | None,
    group: str,
    client_id: str | None,
    broker: str | None,
    jstack: bool,
    as_json: bool,
) -> None:
    """Consumers' runtime info (subscriptions, queues and offsets), asked through a broker."""

    async def body(a: Admin) -> tuple[Any, dict[str, dict[str, Any]]]:
        via, conn = await a.consumer_connection_at(group, [broker] if broker else None)
        ids = [c.client_id for c in conn.connection_set]
        if client_id is not None and client_id not in ids:
            raise MQClientError(f"client {client_id} is not online in group {group}; online: {ids}")
        wanted = [client_id] if client_id else sorted(ids)
        infos = {
            cid: await a.consumer_running_info(via, group, cid, jstack=jstack) for cid in wanted
        }
        return conn, infos

    conn, infos = _with_admin(namesrv, body)
    same = len({_subscriptions(i) for i in infos.values()}) <= 1
    owners: dict[str, int] = {}
    for info in infos.values():
        for key in _dict(info.get("mqTable")):
            # One queue whatever the client's spelling of its key (C++ pretty-prints it).
            mq = _mq_from_text(str(key))
            name = json.dumps([mq.get("topic"), mq.get("brokerName"), mq.get("queueId")])
            owners[name] = owners.get(name, 0) + 1
    rebalance_ok = all(n == 1 for n in owners.values())
    if as_json:
        _emit_json({"group": group, "clients": infos, "same_subscription": same,
                    "rebalance_ok": rebalance_ok if client_id is None else None})  # fmt: skip
        return
    if client_id is None:
        versions = {c.client_id: c.version for c in conn.connection_set}
        _table(
            None,
            ["#Index", "#ClientId", "#Version", "#Queues"],
            [[i, cid, versions.get(cid, "-"), len(_dict(info.get("mqTable")))]
             for i, (cid, info) in enumerate(infos.items(), 1)],
        )  # fmt: skip
        click.echo(
            "\nSame subscription in the same group of consumer"
            if same
            else "\nWARN: Different subscription in the same group of consumer!!!"
        )
        click.echo(
            "\nRebalance OK" if rebalance_ok else "\nWARN: Rebalance Failed: a queue is held twice"
        )
        return
    info = infos[client_id]
    click.echo("#Consumer Properties#")
    for k, v in sorted(_dict(info.get("properties")).items()):
        click.echo(f"{k:<40}: {v}")
    click.echo("\n#Consumer Subscription#")
    subs = [s for s in _list(info.get("subscriptionSet")) if isinstance(s, dict)]
    for i, s in enumerate(subs, 1):
        click.echo(f"{i:03d} Topic: {s.get('topic')!s:<40} SubExpression: {s.get('subString')}")
    # A client's mqTable keys are MessageQueue JSON texts (the C++ client pretty-prints them).
    queues = [
        (_mq_from_text(str(key)), pq)
        for key, pq in _dict(info.get("mqTable")).items()
        if isinstance(pq, dict)
    ]
    click.echo("\n#Consumer Offset#")
    click.echo(f"{'#Topic':<32} {'#Broker Name':<32} {'#QID':<4} {'#Consumer Offset':<20}")
    for mq, pq in queues:
        click.echo(
            f"{mq.get('topic', '')!s:<32} {mq.get('brokerName', '')!s:<32} "
            f"{mq.get('queueId', '')!s:<4} {pq.get('commitOffset')}"
        )
    click.echo("\n#Consumer MQ Detail#")
    click.echo(f"{'#Topic':<32}  {'#Broker Name':<32}  {'#QID':<4}  #ProcessQueueInfo")
    for mq, pq in queues:
        click.echo(
            f"{mq.get('topic', '')!s:<32}  {mq.get('brokerName', '')!s:<32}  "
            f"{mq.get('queueId', '')!s:<4}  {json.dumps(pq, sort_keys=True)}"
        )
    click.echo("\n#Consumer RT&TPS#")
    click.echo(
        f"{'#Topic':<64}  {'#Pull RT':>14} {'#Pull TPS':>14} {'#Consume RT':>14} "
        f"{'#ConsumeOK TPS':>14} {'#ConsumeFailed TPS':>18} {'#ConsumeFailedMsgsInHour':>25}"
    )
    for topic, st in sorted(_dict(info.get("statusTable")).items()):
        st = st if isinstance(st, dict) else {}
        keys = ("pullRT", "pullTPS", "consumeRT", "consumeOKTPS", "consumeFailedTPS")
        figures = [figure(st.get(k)) for k in keys]
        click.echo(
            f"{topic:<32}  {figures[0]:14.2f} {figures[1]:14.2f} {figures[2]:14.2f} "
            f"{figures[3]:14.2f} {figures[4]:18.2f} {int(figure(st.get('consumeFailedMsgs'))):25d}"
        )
    if info.get("jstack"):
        click.echo(f"\n#Consumer jstack#\n{info['jstack']}")


def _subscriptions(info: dict[str, Any]) -> str:
    """What a client subscribes, by topic, expression and its type (TAG when not given): not
    subVersion, each client's own timestamp, which makes Java's check report any two clients
    as different."""
    subs = sorted(
        (str(s.get("topic")), str(s.get("subString")), str(s.get("expressionType") or "TAG"))
        for s in _list(info.get("subscriptionSet"))
        if isinstance(s, dict)
    )
    return json.dumps(subs)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _mq_from_text(text: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError:
        return {"topic": text}
    return raw if isinstance(raw, dict) else {"topic": text}


@cli.command("statsAll")
@namesrv_option
@click.option("-a", "--activeTopic", "active", is_flag=True, help="Print active topics only.")
@click.option("-t", "--topic", help="Print this topic only.")
@json_option
def stats_all(namesrv: str | None, active: bool, topic: str | None, as_json: bool) -> None:
    """Topic and consumer TPS stats (RocketMQ's statsAll).

    Per topic and consumer group over the topic's masters: messages not consumed yet
    (#Accumulation), messages put and pulled per second over the last minute (#InTPS,
    #OutTPS, VIEW_BROKER_STATS_DATA TOPIC_PUT_NUMS and GROUP_GET_NUMS) and over the last day
    (#InMsg24Hour, #OutMsg24Hour: the day's sum, else the hour's, else the minute's). Retry
    and DLQ topics are skipped; -a leaves out rows with nothing put or pulled in the day; a
    topic without consumers shows NO_CONSUMER. A broker that cannot answer counts 0.
    """

    async def stats(a: Admin, addrs: list[str], name: str, key: str) -> tuple[float, int]:
        tps, day = 0.0, 0
        for addr in addrs:
            try:
                data = await a.view_broker_stats_data(addr, name, key)
            except (RemoteError, MQClientError, ValueError):
                continue  # RocketMQ: a key never counted (or a broker down) counts 0
            tps += data.minute.tps
            day += data.sum_24h()
        return tps, day

    async def body(a: Admin) -> list[dict[str, Any]]:
        topics = [topic] if topic else await a.topic_list()
        rows: list[dict[str, Any]] = []
        for t in topics:
            if t.startswith(("%RETRY%", "%DLQ%")):
                continue
            try:
                route = await a.topic_route(t)
            except MQClientError:
                if topic:
                    raise
                continue
            addrs = [x for x in (master_addr(b) for b in route.broker_datas) if x]
            groups: set[str] = set()
            for addr in addrs:
                try:
                    groups.update(await a.topic_consumed_by(addr, t))
                except (RemoteError, MQClientError):
                    continue
            in_tps, in_day = await stats(a, addrs, "TOPIC_PUT_NUMS", t)
            if not groups:
                if not active or in_day > 0:
                    rows.append({"topic": t, "group": None, "accumulation": 0, "inTps": in_tps,
                                 "outTps": None, "inMsg24Hour": in_day,
                                 "outMsg24Hour": None})  # fmt: skip
                continue
            for g in sorted(groups):
                out_tps, out_day = await stats(a, addrs, "GROUP_GET_NUMS", f"{t}@{g}")
                acc = 0
                for addr in addrs:
                    try:
                        cs = await a.instance.api.get_consume_stats(addr, g, t)
                    except (RemoteError, MQClientError):
                        continue
                    acc += sum(
                        w.broker_offset - w.consumer_offset for w in cs.offset_table.values()
                    )
                if active and in_day <= 0 and out_day <= 0:
                    continue
                rows.append({"topic": t, "group": g, "accumulation": max(acc, 0),
                             "inTps": in_tps, "outTps": out_tps, "inMsg24Hour": in_day,
                             "outMsg24Hour": out_day})  # fmt: skip
        return rows

    rows = _with_admin(namesrv, body)
    if as_json:
        _emit_json(rows)
        return
    # RocketMQ's layout: names cut to 64 characters, TPS with two decimals.
    click.echo(
        f"{'#Topic':<32}  {'#Consumer Group':<32} {'#Accumulation':>12} {'#InTPS':>11} "
        f"{'#OutTPS':>11} {'#InMsg24Hour':>14} {'#OutMsg24Hour':>14}"
    )
    for r in rows:
        name = r["topic"][:64]
        if r["group"] is None:
            click.echo(
                f"{name:<64}  {'':<32} {0:>12} {r['inTps']:>11.2f} {'':>11} "
                f"{r['inMsg24Hour']:>14} {'NO_CONSUMER':>14}"
            )
        else:
            click.echo(
                f"{name:<64}  {r['group'][:64]:<64} {r['accumulation']:>12} "
                f"{r['inTps']:>11.2f} {r['outTps']:>11.2f} {r['inMsg24Hour']:>14} "
                f"{r['outMsg24Hour']:>14}"
            )


def main() -> None:
    cli(prog_name="mqadmin")


if __name__ == "__main__":  # pragma: no cover
    main()


# -- controller mode ------------------------------------------------------------------------
def _with_controllers(addrs: str, body: Callable[[ControllerAdmin], Awaitable[T]]) -> T:
    # The group's --access-key / --secret-key and --tls options (or TRIMQ_*), as for the
    # NameServer and broker commands.
    cfg = client_config(
        instance_name=f"mqadmin-{time.time_ns()}",
        **_options["credentials"],
        **_options["tls"],
    )

    async def main() -> T:
        async with ControllerAdmin.from_config(addrs, cfg) as admin:
            return await body(admin)

    return _run(main)


@cli.command("getControllerMetaData")
@click.option("-a", "--controllerAddress", "addr", required=True, help="Controller HOST:PORT.")
@json_option
def get_controller_metadata(addr: str, as_json: bool) -> None:
    """Who leads the controllers, as one controller sees it."""
    meta = _with_controllers(addr, lambda a: a.metadata(addr.split(";")[0].strip()))
    if as_json:
        _emit_json(meta.to_dict())
        return
    for key, value in meta.to_dict().items():
        click.echo(f"{key:<24}: {value}")


@cli.command("getSyncStateSet")
@namesrv_option
@click.option("-a", "--controllerAddress", "addr", required=True, help="Controller(s), ';'.")
@click.option("-b", "--brokerName", "broker_names", multiple=True, help="Broker name(s).")
@click.option("-c", "--clusterName", "cluster", help="Every broker name of this cluster.")
@json_option
def get_sync_state_set(
    namesrv: str | None,
    addr: str,
    broker_names: tuple[str, ...],
    cluster: str | None,
    as_json: bool,
) -> None:
    """The master, epochs and in-sync replicas of broker groups (from the leader)."""
    names = list(broker_names)
    if cluster:
        info = _with_admin(namesrv, lambda a: a.cluster_info())
        if cluster not in info.cluster_addr_table:
            _fail(f"cluster {cluster} not found")
        names.extend(sorted(info.cluster_addr_table[cluster]))
    if not names:
        raise click.UsageError("give -b BROKER_NAME or -c CLUSTER")
    table = _with_controllers(addr, lambda a: a.sync_state_data(names))
    missing = [n for n in names if n not in table]
    if as_json:
        _emit_json(table)
    else:
        for name, group in table.items():
            _table(
                f"{name}: master {group.get('masterBrokerId')} at {group.get('masterAddress')}, "
                f"master epoch {group.get('masterEpoch')}, set epoch "
                f"{group.get('syncStateSetEpoch')}",
                ["#BrokerId", "#Address", "#InSync", "#Alive"],
                [
                    [m["brokerId"], m["brokerAddress"], in_sync, m["alive"]]
                    for in_sync, key in ((True, "inSyncReplicas"), (False, "notInSyncReplicas"))
                    for m in group.get(key) or []
                ],
            )
    if missing:
        _fail(f"the controllers know no group {', '.join(missing)}")


@cli.command("electMaster")
@click.option("-a", "--controllerAddress", "addr", required=True, help="Controller(s), ';'.")
@click.option("-c", "--clusterName", "cluster", required=True, help="Cluster name.")
@click.option("-bn", "--brokerName", "broker_name", required=True, help="Broker name.")
@click.option("-b", "--brokerId", "broker_id", required=True, type=int, help="Id to elect.")
@json_option
def elect_master(addr: str, cluster: str, broker_name: str, broker_id: int, as_json: bool) -> None:
    """Make an in-sync replica the master of its group (a manual election)."""
    if broker_id < 1:
        raise click.BadParameter("a controller broker id is 1 or more", param_hint="-b")
    result = _with_controllers(addr, lambda a: a.elect_master(cluster, broker_name, broker_id))
    if as_json:
        _emit_json(result)
        return
    click.echo(
        f"elected {broker_name} master: id {result['masterBrokerId']} at "
        f"{result['masterAddress']}, master epoch {result['masterEpoch']}"
    )


from client.cli import mqadmin_trace as _mqadmin_trace  # noqa: E402,F401

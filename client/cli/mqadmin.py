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
from client.controller_admin import ControllerAdmin
from client.errors import MQClientError
from remoting.errors import RemoteError, RemotingError
from remoting.logs import configure_logging
from remoting.protocol.bodies import HARuntimeInfo

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
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


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

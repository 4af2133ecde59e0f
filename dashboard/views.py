"""The pages: each handler reads its input, asks the cluster, renders a template.

Errors are not handled here: `app.create_app` turns `BadInput` and cluster errors into a
message on the handler's page (see its module docstring).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from client.errors import NoRouteError
from client.message import DLQ_GROUP_TOPIC_PREFIX
from client.trace import TRACE_TOPIC
from dashboard import service

if TYPE_CHECKING:
    from dashboard.app import Dashboard, Handler


def _render(request: Request, name: str, ctx: dict[str, Any], status: int = 200) -> Response:
    out: Response = request.app.state.render(request, name, ctx, status)
    return out


def _see(path: str, **params: str) -> Response:
    """Redirect after a POST (the page it lands on shows `notice`)."""
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return RedirectResponse(f"{path}?{query}" if query else path, status_code=303)


async def _read_form(request: Request) -> Any:
    from dashboard.app import read_form

    return await read_form(request)


# -- cluster ---------------------------------------------------------------------------------
async def cluster(request: Request, dash: Dashboard) -> Response:
    rows = await service.brokers(dash.admin)
    return _render(request, "cluster.html", {"brokers": rows})


# -- topics ----------------------------------------------------------------------------------
async def topics(request: Request, dash: Dashboard) -> Response:
    q = request.query_params.get("q", "")[:200]
    system = request.query_params.get("system") == "1"
    found = await service.topics(dash.admin, q, system=system)
    names = await service.clusters(dash.admin)
    return _render(
        request,
        "topics.html",
        {
            "q": q,
            "system": system,
            "topics": found,
            "clusters": names,
            "notice": request.query_params.get("notice"),
        },
    )


async def topic_create(request: Request, dash: Dashboard) -> Response:
    form = await _read_form(request)
    topic = service.topic_name(form.get("topic"))
    reads = service.int_field(form.get("read"), "read queues", lo=1, hi=service.MAX_QUEUES)
    writes = service.int_field(form.get("write"), "write queues", lo=1, hi=service.MAX_QUEUES)
    perm = service.int_field(form.get("perm"), "perm", lo=0, hi=7, default=6)
    if perm not in (2, 4, 6):
        raise service.BadInput("perm is 2 (write only), 4 (read only) or 6 (read-write)")
    cluster_name = form.get("cluster").strip()
    broker = form.get("broker").strip()
    if not cluster_name and not broker:
        raise service.BadInput("give a cluster or a broker address")
    addrs = await dash.admin.create_topic(
        topic,
        cluster=cluster_name or None,
        broker_addr=broker or None,
        read_queue_nums=reads,
        write_queue_nums=writes,
        perm=perm,
        order=form.get("order") == "1",
    )
    done = f"topic {topic} created/updated on {', '.join(addrs)}"
    if not await service.wait_for_route(dash.admin, topic):
        return _see("/topics", notice=f"{done}; the NameServer does not list it yet")
    return _see("/topic", t=topic, notice=done)


async def topic(request: Request, dash: Dashboard) -> Response:
    name = service.lookup_topic_name(request.query_params.get("t"))
    route = await dash.admin.topic_route(name)
    status = await dash.admin.topic_status(name)
    queue = route.queue_datas[0] if route.queue_datas else None
    return _render(
        request,
        "topic.html",
        {
            "topic": name,
            "route": route,
            "status": status,
            "total": sum(s.max_offset - s.min_offset for s in status),
            "queue": queue,
            "clusters": await service.clusters(dash.admin),
            "notice": request.query_params.get("notice"),
        },
    )


async def topic_send(request: Request, dash: Dashboard) -> Response:
    form = await _read_form(request)
    name = service.topic_name(form.get("topic"))
    result = await service.send_test_message(
        dash.admin, name, form.get("body"), tags=form.get("tags").strip(), keys=form.get("keys")
    )
    return _render(request, "sent.html", {"topic": name, "result": result})


async def topic_delete(request: Request, dash: Dashboard) -> Response:
    form = await _read_form(request)
    name = service.lookup_topic_name(form.get("topic"))
    if form.get("confirm") != name:
        raise service.BadInput(f"type the topic's name ({name}) to confirm the delete")
    addrs = await dash.admin.delete_topic(name)
    return _see("/topics", notice=f"topic {name} deleted from {', '.join(addrs) or 'no broker'}")


# -- consumer groups -------------------------------------------------------------------------
async def groups(request: Request, dash: Dashboard) -> Response:
    q = request.query_params.get("q", "")[:200].lower()
    system = request.query_params.get("system") == "1"
    names = [
        g
        for g in await service.group_names(dash.admin)
        if (not q or q in g.lower()) and (system or not service.is_system_group(g))
    ]
    shown = names[: service.MAX_GROUPS_SHOWN]
    addrs = list((await dash.admin.master_addrs()).values())
    stats = [await service.group_stats(dash.admin, g, addrs) for g in shown]
    return _render(
        request,
        "groups.html",
        {
            "q": q,
            "system": system,
            "stats": stats,
            "total": len(names),
            "notice": request.query_params.get("notice"),
        },
    )


async def group(request: Request, dash: Dashboard) -> Response:
    name = service.group_name(request.query_params.get("g"))
    stats = await service.group_stats(dash.admin, name)
    online = await service.group_connection(dash.admin, name)
    conn = None
    statuses: list[service.ClientTopicStatus] = []
    status_notes: list[str] = []
    if online is not None:
        via, conn = online
        ids = [c.client_id for c in conn.connection_set]
        statuses, status_notes = await service.client_statuses(dash.admin, name, via, ids)
    topics = sorted({q.mq.topic for q in stats.queues})
    return _render(
        request,
        "group.html",
        {
            "group": name,
            "stats": stats,
            "conn": conn,
            "statuses": statuses,
            "status_notes": status_notes,
            "topics": topics,
            "notice": request.query_params.get("notice"),
        },
    )


async def group_reset(request: Request, dash: Dashboard) -> Response:
    form = await _read_form(request)
    name = service.group_name(form.get("group"))
    topic_name = service.lookup_topic_name(form.get("topic"))
    when = service.timestamp_ms(form.get("time"))
    table = await dash.admin.reset_offset_by_time(name, topic_name, when)
    moved = ", ".join(f"{mq.broker_name}/{mq.queue_id}->{off}" for mq, off in table.items())
    return _see("/group", g=name, notice=f"offsets of {topic_name} reset: {moved or 'none'}")


async def group_delete(request: Request, dash: Dashboard) -> Response:
    form = await _read_form(request)
    name = service.group_name(form.get("group"))
    if form.get("confirm") != name:
        raise service.BadInput(f"type the group's name ({name}) to confirm the delete")
    addrs = await service.delete_group(dash.admin, name)
    return _see("/groups", notice=f"group {name} deleted on {', '.join(addrs) or 'no broker'}")


# -- messages --------------------------------------------------------------------------------
async def messages(request: Request, dash: Dashboard) -> Response:
    p = request.query_params
    mode = p.get("mode", "")
    ctx: dict[str, Any] = {"mode": mode, "p": p, "found": None}
    if mode == "key":
        name = service.lookup_topic_name(p.get("topic"))
        key = p.get("key", "").strip()
        if not key or len(key) > 512:
            raise service.BadInput("give a key (at most 512 characters)")
        ctx["found"] = await dash.admin.query_msg_by_key(name, key, max_num=service.MAX_MESSAGES)
    elif mode == "id":
        msg_id = p.get("id", "").strip()
        if not msg_id or len(msg_id) > 128 or not all(c in _HEX for c in msg_id):
            raise service.BadInput("a message id is 1 to 128 hex digits")
        topic_raw = p.get("topic", "").strip()
        in_topic = service.lookup_topic_name(topic_raw) if topic_raw else None
        found = await dash.admin.query_msg_by_id(msg_id.upper(), in_topic)
        ctx["found"] = found[: service.MAX_MESSAGES]
    elif mode == "offset":
        name = service.lookup_topic_name(p.get("topic"))
        broker = p.get("broker", "").strip()
        if not broker:
            raise service.BadInput("give the broker name")
        qid = service.int_field(p.get("queue"), "queue id", lo=0, hi=service.MAX_QUEUES - 1)
        off = service.int_field(p.get("offset"), "offset", lo=0, hi=2**63 - 1)
        count = service.int_field(p.get("count"), "count", lo=1, hi=service.MAX_MESSAGES, default=1)
        ctx["found"] = await service.messages_at(dash.admin, name, broker, qid, off, count)
    elif mode:
        raise service.BadInput(f"unknown lookup {mode[:20]!r}")
    if ctx["found"] is not None:
        ctx["previews"] = [service.body_preview(m.body) for m in ctx["found"]]
    ctx["notice"] = p.get("notice")
    return _render(request, "messages.html", ctx)


async def messages_consume(request: Request, dash: Dashboard) -> Response:
    """One client of a group consumes the message once with its listener
    (CONSUME_MESSAGE_DIRECTLY, RocketMQ dashboard's "resend message" to a client)."""
    form = await _read_form(request)
    name = service.group_name(form.get("group"))
    topic_name = service.lookup_topic_name(form.get("topic"))
    client_id = service.client_id(form.get("client"))
    broker = form.get("broker", "").strip()
    if not broker or len(broker) > 255:
        raise service.BadInput("give the broker name")
    offset_id = form.get("offset_id", "").strip()
    if len(offset_id) not in (32, 56) or not all(c in _HEX for c in offset_id):
        raise service.BadInput("an offset message id is 32 or 56 hex digits")
    msg_id = form.get("id", "").strip()
    if not msg_id or len(msg_id) > 128 or not all(c in _HEX for c in msg_id):
        raise service.BadInput("a message id is 1 to 128 hex digits")
    result = await dash.admin.consume_message_directly(
        name, client_id, topic_name, broker, offset_id.upper()
    )
    remark = result.get("remark")
    notice = (
        f"{client_id} of {name} consumed {msg_id}: {result.get('consumeResult')}"
        f" in {result.get('spentTimeMills')} ms" + (f" ({remark})" if remark else "")
    )
    return _see("/messages", mode="id", id=msg_id, topic=topic_name, notice=notice)


_HEX = frozenset("0123456789abcdefABCDEF")


async def trace(request: Request, dash: Dashboard) -> Response:
    p = request.query_params
    msg_id = p.get("id", "").strip()
    if "id" not in p:
        return _render(request, "trace.html", {"msg_id": "", "trace_topic": TRACE_TOPIC})
    if not msg_id or len(msg_id) > 128 or not all(c in _HEX for c in msg_id):
        raise service.BadInput("a message id is 1 to 128 hex digits")
    trace_topic = service.lookup_topic_name(p.get("topic") or TRACE_TOPIC)
    views, bad = await service.message_trace(dash.admin, msg_id.upper(), trace_topic)
    return _render(
        request,
        "trace.html",
        {"msg_id": msg_id.upper(), "trace_topic": trace_topic, "views": views, "bad": bad},
    )


async def dlq(request: Request, dash: Dashboard) -> Response:
    name = service.group_name(request.query_params.get("g"))
    try:
        msgs = await dash.admin.dlq_messages(name, max_num=service.MAX_MESSAGES)
    except NoRouteError:
        raise service.BadInput(f"group {name} has no dead-letter queue") from None
    return _render(
        request,
        "dlq.html",
        {
            "group": name,
            "dlq_topic": DLQ_GROUP_TOPIC_PREFIX + name,
            "found": msgs,
            "previews": [service.body_preview(m.body) for m in msgs],
            "notice": request.query_params.get("notice"),
        },
    )


async def dlq_resend(request: Request, dash: Dashboard) -> Response:
    form = await _read_form(request)
    name = service.group_name(form.get("group"))
    msg_id = form.get("id").strip()
    if not msg_id or len(msg_id) > 128:
        raise service.BadInput("give the message id")
    _msg, result = await dash.admin.resend_dlq_message(name, msg_id)
    return _see(
        "/dlq",
        g=name,
        notice=f"message {msg_id} resent to {result.message_queue.topic}: {result.status.name}, "
        f"new id {result.msg_id}",
    )


# -- charts ----------------------------------------------------------------------------------
async def charts(request: Request, dash: Dashboard) -> Response:
    return _render(
        request,
        "charts.html",
        {"chartjs": dash.chartjs is not None, "interval": dash.sample_interval_s},
    )


async def api_history(request: Request, dash: Dashboard) -> Response:
    body = dash.history.to_dict()
    body["now"] = int(time.time() * 1000)
    return JSONResponse(body)


ROUTES: list[tuple[str, str, Handler, list[str]]] = [
    ("/cluster", "cluster.html", cluster, ["GET"]),
    ("/topics", "topics.html", topics, ["GET"]),
    ("/topics/create", "topics.html", topic_create, ["POST"]),
    ("/topic", "topic.html", topic, ["GET"]),
    ("/topic/send", "topic.html", topic_send, ["POST"]),
    ("/topic/delete", "topic.html", topic_delete, ["POST"]),
    ("/groups", "groups.html", groups, ["GET"]),
    ("/group", "group.html", group, ["GET"]),
    ("/group/reset", "group.html", group_reset, ["POST"]),
    ("/group/delete", "group.html", group_delete, ["POST"]),
    ("/messages", "messages.html", messages, ["GET"]),
    ("/messages/consume", "messages.html", messages_consume, ["POST"]),
    ("/trace", "trace.html", trace, ["GET"]),
    ("/dlq", "dlq.html", dlq, ["GET"]),
    ("/dlq/resend", "dlq.html", dlq_resend, ["POST"]),
    ("/charts", "charts.html", charts, ["GET"]),
    ("/api/history", "charts.html", api_history, ["GET"]),
]

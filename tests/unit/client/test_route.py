"""Route -> publish/subscribe queue lists."""

from __future__ import annotations

from dataclasses import dataclass, field

from client.message import MessageQueue
from client.route import TopicPublishInfo, broker_addr_table, publish_queues, subscribe_queues


@dataclass
class QD:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass
class BD:
    broker_name: str
    broker_addrs: dict[int, str]
    cluster: str = "C"


@dataclass
class Route:
    queue_datas: list[QD]
    broker_datas: list[BD]
    order_topic_conf: str | None = None
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)


def _route() -> Route:
    return Route(
        queue_datas=[
            QD("b-zeta", 2, 2, 6),
            QD("b-alpha", 4, 3, 6),
            QD("b-readonly", 2, 2, 4),
            QD("b-noslave", 2, 2, 6),
            QD("b-writeonly", 2, 1, 2),
        ],
        broker_datas=[
            BD("b-zeta", {0: "z:1"}),
            BD("b-alpha", {0: "a:1", 1: "a:2"}),
            BD("b-readonly", {0: "r:1"}),
            BD("b-noslave", {1: "n:2"}),  # no master
            BD("b-writeonly", {0: "w:1"}),
        ],
    )


def test_publish_queues() -> None:
    got = publish_queues("T", _route())
    assert got == [
        MessageQueue("T", "b-alpha", 0),
        MessageQueue("T", "b-alpha", 1),
        MessageQueue("T", "b-alpha", 2),
        MessageQueue("T", "b-writeonly", 0),
        MessageQueue("T", "b-zeta", 0),
        MessageQueue("T", "b-zeta", 1),
    ]


def test_subscribe_queues() -> None:
    got = subscribe_queues("T", _route())
    assert [(q.broker_name, q.queue_id) for q in got] == [
        ("b-alpha", 0), ("b-alpha", 1), ("b-alpha", 2), ("b-alpha", 3),
        ("b-noslave", 0), ("b-noslave", 1),
        ("b-readonly", 0), ("b-readonly", 1),
        ("b-zeta", 0), ("b-zeta", 1),
    ]  # fmt: skip


def test_order_topic_conf() -> None:
    r = _route()
    r.order_topic_conf = "b-zeta:2;b-alpha:1"
    info = TopicPublishInfo.from_route("T", r)
    assert info.order_topic
    assert info.queues == [
        MessageQueue("T", "b-zeta", 0),
        MessageQueue("T", "b-zeta", 1),
        MessageQueue("T", "b-alpha", 0),
    ]


def test_order_topic_conf_skips_malformed_items() -> None:
    r = _route()
    r.order_topic_conf = "bA:2;bB:1;junk;:3;x:y;bC:-1"
    assert publish_queues("T", r) == [
        MessageQueue("T", "bA", 0),
        MessageQueue("T", "bA", 1),
        MessageQueue("T", "bB", 0),
    ]


def test_string_broker_ids_are_accepted() -> None:
    r = Route([QD("b", 1, 1, 6)], [BD("b", {"0": "x:1"})])  # type: ignore[dict-item]
    assert publish_queues("T", r) == [MessageQueue("T", "b", 0)]
    assert broker_addr_table(r) == {"b": {0: "x:1"}}


def test_empty_route() -> None:
    info = TopicPublishInfo.from_route("T", Route([], []))
    assert not info.ok()

"""RouteTable: registration, master-only queue updates, removal paths, queries."""

from __future__ import annotations

from namesrv.route_table import RegisterResult, RouteTable
from remoting.protocol.route import BrokerData, DataVersion, QueueData, TopicConfig


def _reg(
    rt: RouteTable,
    *,
    name: str = "b",
    addr: str = "192.0.2.1:10911",
    bid: int = 0,
    cluster: str = "c",
    topics: dict[str, int] | None = None,
    dv: DataVersion | None = None,
    now: int = 0,
    channel: int | None = 1,
    ha: str = "",
) -> RegisterResult:
    configs = (
        None
        if topics is None
        else [
            TopicConfig(t, read_queue_nums=n, write_queue_nums=n, perm=6) for t, n in topics.items()
        ]
    )
    return rt.register_broker(
        cluster=cluster,
        broker_addr=addr,
        broker_name=name,
        broker_id=bid,
        ha_server_addr=ha,
        data_version=dv if dv is not None else DataVersion(1, 0),
        topic_configs=configs,
        channel_id=channel,
        now_ms=now,
    )


def test_register_then_pick_route() -> None:
    rt = RouteTable()
    res = _reg(rt, topics={"T": 4})
    route = rt.pick_route("T")
    assert route is not None
    assert route.queue_datas == [QueueData("b", 4, 4, 6, 0)]
    assert route.broker_datas == [BrokerData("c", "b", {0: "192.0.2.1:10911"})]
    assert rt.pick_route("nope") is None
    assert rt.all_topics() == ["T"]
    assert res.first_time
    assert res.topics_changed
    ci = rt.cluster_info()
    assert ci.cluster_addr_table == {"c": ["b"]}
    assert set(ci.broker_addr_table) == {"b"}


def test_queue_data_updated_only_when_data_version_changes() -> None:
    rt = RouteTable()
    _reg(rt, topics={"T": 4}, dv=DataVersion(1, 1))
    # Same data version: a heartbeat, the table is not reloaded even if the body differs.
    res = _reg(rt, topics={"T": 8, "U": 2}, dv=DataVersion(1, 1), now=1000)
    assert not res.first_time
    assert not res.topics_changed
    route = rt.pick_route("T")
    assert route is not None
    assert route.queue_datas[0].write_queue_nums == 4
    assert rt.pick_route("U") is None
    # New data version: reloaded.
    res = _reg(rt, topics={"T": 8, "U": 2}, dv=DataVersion(1, 2), now=2000)
    assert res.topics_changed
    route = rt.pick_route("T")
    assert route is not None
    assert route.queue_datas[0].write_queue_nums == 8
    assert rt.pick_route("U") is not None
    # Heartbeat refreshes liveness.
    assert rt.broker_live_table["192.0.2.1:10911"].last_update_ms == 2000


def test_slave_never_updates_queue_data_and_learns_master() -> None:
    rt = RouteTable()
    _reg(rt, topics={"T": 4}, ha="192.0.2.1:10912")
    res = _reg(
        rt, addr="192.0.2.2:10911", bid=1, topics={"T": 16, "S": 1}, dv=DataVersion(9, 9), channel=2
    )
    route = rt.pick_route("T")
    assert route is not None
    assert route.queue_datas[0].write_queue_nums == 4
    assert route.broker_datas[0].broker_addrs == {0: "192.0.2.1:10911", 1: "192.0.2.2:10911"}
    assert rt.pick_route("S") is None
    assert res.master_addr == "192.0.2.1:10911"
    assert res.ha_server_addr == "192.0.2.1:10912"
    # A slave registering before its master gets no master address.
    rt2 = RouteTable()
    res2 = _reg(rt2, addr="192.0.2.2:10911", bid=1, topics={"T": 4})
    assert res2.master_addr is None
    assert rt2.pick_route("T") is None


def test_slave_promoted_to_master_keeps_one_id_per_address() -> None:
    rt = RouteTable()
    _reg(rt, addr="a:1", bid=1)
    _reg(rt, addr="a:1", bid=0, topics={"T": 2}, channel=3)
    assert rt.broker_addr_table["b"].broker_addrs == {0: "a:1"}
    assert rt.pick_route("T") is not None


def test_unregister_removes_broker_and_its_topics() -> None:
    rt = RouteTable()
    _reg(rt, name="b1", addr="a:1", topics={"T": 4, "Only1": 1})
    _reg(rt, name="b2", addr="a:2", topics={"T": 4}, channel=2)
    removed = rt.unregister_broker(cluster="c", broker_addr="a:1", broker_name="b1", broker_id=0)
    assert removed is not None
    assert removed.broker_gone
    route = rt.pick_route("T")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["b2"]
    assert rt.pick_route("Only1") is None
    assert "Only1" not in rt.all_topics()
    assert rt.cluster_addr_table == {"c": {"b2"}}
    # Unknown address: nothing to do.
    assert (
        rt.unregister_broker(cluster="c", broker_addr="x:9", broker_name="b9", broker_id=0) is None
    )
    rt.unregister_broker(cluster="c", broker_addr="a:2", broker_name="b2", broker_id=0)
    assert rt.cluster_addr_table == {}
    assert rt.all_topics() == []


def test_unregister_slave_keeps_group() -> None:
    rt = RouteTable()
    _reg(rt, addr="m:1", topics={"T": 4})
    _reg(rt, addr="s:1", bid=1, channel=2)
    removed = rt.unregister_broker(cluster="c", broker_addr="s:1", broker_name="b", broker_id=1)
    assert removed is not None
    assert not removed.broker_gone
    route = rt.pick_route("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "m:1"}


def test_scan_not_active_expires_silent_brokers() -> None:
    rt = RouteTable()
    _reg(rt, name="b1", addr="a:1", topics={"T": 4}, now=0)
    _reg(rt, name="b2", addr="a:2", topics={"T": 4}, now=0, channel=2)
    _reg(rt, name="b2", addr="a:2", topics={"T": 4}, now=100_000, channel=2)  # heartbeat
    assert rt.scan_not_active(now_ms=120_000, expire_ms=120_000) == []  # not yet (strictly >)
    assert rt.scan_not_active(now_ms=120_001, expire_ms=120_000) == ["a:1"]
    route = rt.pick_route("T")
    assert route is not None
    assert [b.broker_name for b in route.broker_datas] == ["b2"]
    assert rt.scan_not_active(now_ms=300_000, expire_ms=120_000) == ["a:2"]
    assert rt.pick_route("T") is None
    assert rt.broker_live_table == {}
    assert rt.broker_addr_table == {}
    assert rt.cluster_addr_table == {}


def test_channel_close_removes_only_brokers_registered_over_it() -> None:
    rt = RouteTable()
    _reg(rt, name="b1", addr="a:1", topics={"T": 4}, channel=7)
    _reg(rt, name="b2", addr="a:2", topics={"T": 4}, channel=8)
    assert rt.on_channel_closed(7) == ["a:1"]
    route = rt.pick_route("T")
    assert route is not None
    assert [b.broker_name for b in route.broker_datas] == ["b2"]
    # b2 re-registers over a new connection: closing the old one removes nothing.
    _reg(rt, name="b2", addr="a:2", topics={"T": 4}, channel=9)
    assert rt.on_channel_closed(8) == []
    assert rt.pick_route("T") is not None
    assert rt.on_channel_closed(9) == ["a:2"]
    assert rt.pick_route("T") is None


def test_restart_of_broker_after_expiry_reloads_topics() -> None:
    rt = RouteTable()
    _reg(rt, topics={"T": 4}, dv=DataVersion(5, 5))
    rt.scan_not_active(now_ms=10**9, expire_ms=1)
    # Same data version as before, but the table forgot it: first registration again.
    res = _reg(rt, topics={"T": 4}, dv=DataVersion(5, 5), now=10**9)
    assert res.first_time
    assert res.topics_changed
    assert rt.pick_route("T") is not None


def test_query_data_version() -> None:
    rt = RouteTable()
    assert rt.query_data_version_changed("a:1", DataVersion(1, 1))
    assert rt.query_data_version("a:1", DataVersion(1, 1), 5) == (True, None)
    _reg(rt, addr="a:1", dv=DataVersion(1, 1), now=0)
    assert not rt.query_data_version_changed("a:1", DataVersion(1, 1))
    assert rt.query_data_version_changed("a:1", DataVersion(1, 2))
    changed, held = rt.query_data_version("a:1", DataVersion(1, 1), 500)
    assert (changed, held) == (False, DataVersion(1, 1))
    assert rt.broker_live_table["a:1"].last_update_ms == 500  # counts as a heartbeat
    changed, held = rt.query_data_version("a:1", DataVersion(1, 2), 900)
    assert changed
    assert held == DataVersion(1, 1)
    assert rt.broker_live_table["a:1"].last_update_ms == 500


def test_delete_topic_everywhere_or_per_cluster() -> None:
    rt = RouteTable()
    _reg(rt, name="b1", addr="a:1", cluster="c1", topics={"T": 4, "U": 1})
    _reg(rt, name="b2", addr="a:2", cluster="c2", topics={"T": 4}, channel=2)
    assert sorted(rt.topics_by_cluster("c1")) == ["T", "U"]
    assert rt.topics_by_cluster("c2") == ["T"]
    assert rt.topics_by_cluster("nope") == []
    assert rt.delete_topic("T", cluster="c1")
    route = rt.pick_route("T")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["b2"]
    assert rt.delete_topic("U")
    assert rt.pick_route("U") is None
    assert not rt.delete_topic("U")
    assert rt.delete_topic("T", cluster="c2")
    assert rt.all_topics() == []


def test_filter_servers_in_route() -> None:
    rt = RouteTable()
    rt.register_broker(
        cluster="c",
        broker_addr="a:1",
        broker_name="b",
        broker_id=0,
        ha_server_addr="",
        data_version=DataVersion(1, 1),
        topic_configs=[TopicConfig("T", 1, 1)],
        filter_server_list=["a:3000"],
        now_ms=0,
    )
    route = rt.pick_route("T")
    assert route is not None
    assert route.filter_server_table == {"a:1": ["a:3000"]}
    assert rt.broker_of_addr("a:1") == ("c", "b", 0)
    assert rt.broker_of_addr("zz:1") is None


def test_pick_route_returns_copies() -> None:
    rt = RouteTable()
    _reg(rt, topics={"T": 4})
    route = rt.pick_route("T")
    assert route is not None
    route.broker_datas[0].broker_addrs[5] = "evil:1"
    route.queue_datas[0].perm = 0
    again = rt.pick_route("T")
    assert again is not None
    assert again.broker_datas[0].broker_addrs == {0: "192.0.2.1:10911"}
    assert again.queue_datas[0].perm == 6


def test_claim_names_the_live_brokers_a_registration_would_displace() -> None:
    rt = RouteTable()
    _reg(rt, name="a", addr="192.0.2.1:1", cluster="c1")
    _reg(rt, name="b", addr="192.0.2.2:1", cluster="c2")
    heartbeat = rt.claim(
        cluster="c1", broker_name="a", broker_id=0, broker_addr="192.0.2.1:1", unregister=False
    )
    assert (heartbeat.clusters, heartbeat.displaced) == ({"c1"}, [])
    replace = rt.claim(
        cluster="c1", broker_name="a", broker_id=0, broker_addr="192.0.2.9:1", unregister=False
    )
    assert replace.displaced == ["a id 0 at 192.0.2.1:1"]
    move = rt.claim(
        cluster="c2", broker_name="a", broker_id=0, broker_addr="192.0.2.1:1", unregister=False
    )
    assert (move.clusters, move.displaced) == ({"c1", "c2"}, ["a of cluster c1"])
    steal = rt.claim(
        cluster="c1", broker_name="x", broker_id=0, broker_addr="192.0.2.2:1", unregister=False
    )
    assert (steal.clusters, steal.displaced) == ({"c1", "c2"}, ["b id 0 at 192.0.2.2:1"])
    a_slave = rt.claim(
        cluster="c1", broker_name="a", broker_id=1, broker_addr="192.0.2.3:1", unregister=False
    )
    assert a_slave.displaced == []
    remove = rt.claim(
        cluster="c2", broker_name="a", broker_id=0, broker_addr="192.0.2.1:1", unregister=True
    )
    assert (remove.clusters, remove.displaced) == ({"c1", "c2"}, ["a id 0 at 192.0.2.1:1"])
    rt.remove_addr("192.0.2.1:1")
    gone = rt.claim(
        cluster="c1", broker_name="a", broker_id=0, broker_addr="192.0.2.9:1", unregister=False
    )
    assert gone.displaced == []


def test_claim_counts_a_registration_over_another_connection_as_displacing() -> None:
    rt = RouteTable()
    _reg(rt, name="a", addr="192.0.2.1:1", cluster="c1", channel=7)
    own = rt.claim(
        cluster="c1",
        broker_name="a",
        broker_id=0,
        broker_addr="192.0.2.1:1",
        unregister=False,
        channel_id=7,
    )
    assert own.displaced == []
    other = rt.claim(
        cluster="c1",
        broker_name="a",
        broker_id=0,
        broker_addr="192.0.2.1:1",
        unregister=False,
        channel_id=8,
    )
    assert other.displaced == ["broker at 192.0.2.1:1 (registered over another connection)"]

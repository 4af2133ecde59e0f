"""The NameServer's route table: pure data, no I/O, no clock.

Four maps, as in RocketMQ's RouteInfoManager:

- cluster name -> broker names
- broker name -> `BrokerData` (cluster, name, broker id -> address)
- topic -> {broker name -> `QueueData`}
- broker address -> `BrokerLiveInfo` (last update, data version, HA address, channel id)

Every method that depends on time takes `now_ms`; the caller picks the clock
(the server uses trio's monotonic clock). Methods are synchronous and never
block, so the server calls them straight from its handlers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from remoting.protocol.route import (
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    TopicConfig,
    TopicRouteData,
)


@dataclass(slots=True)
class BrokerLiveInfo:
    """What the NameServer knows of one live broker address."""

    last_update_ms: int
    data_version: DataVersion
    ha_server_addr: str = ""
    channel_id: int | None = None


@dataclass(slots=True)
class RegisterResult:
    """What REGISTER_BROKER answers: the group's master address and its HA address.

    Both are None for a master, or for a slave whose master is not registered.
    `first_time` says whether this address was new to the table, and
    `topics_changed` whether queue datas were (re)loaded from this registration.
    """

    master_addr: str | None = None
    ha_server_addr: str | None = None
    first_time: bool = False
    topics_changed: bool = False


@dataclass(slots=True)
class RemovedBroker:
    """One address removed from the table, with the broker group it belonged to."""

    addr: str
    broker_name: str | None
    cluster: str | None
    broker_gone: bool  # the group lost its last address and was removed


@dataclass(slots=True)
class Claim:
    """What a registration or unregistration would change in routes other than its own
    broker's: the clusters it touches and, in words, each live address it would displace."""

    clusters: set[str]
    displaced: list[str]


@dataclass
class RouteTable:
    """The NameServer's routing state (see the module docstring)."""

    cluster_addr_table: dict[str, set[str]] = field(default_factory=dict)
    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    topic_queue_table: dict[str, dict[str, QueueData]] = field(default_factory=dict)
    broker_live_table: dict[str, BrokerLiveInfo] = field(default_factory=dict)
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)

    # -- registration ---------------------------------------------------------------
    def register_broker(
        self,
        *,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        data_version: DataVersion | None,
        topic_configs: Iterable[TopicConfig] | None,
        filter_server_list: list[str] | None = None,
        channel_id: int | None = None,
        enable_acting_master: bool | None = None,
        zone_name: str | None = None,
        now_ms: int,
    ) -> RegisterResult:
        """Record a broker's registration (its heartbeat, every 30 s by default).

        Queue datas are (re)loaded only from the master (`broker_id` 0), and
        only on its first registration or when its data version changed.

        Args:
            cluster: the broker's cluster name.
            broker_addr: "ip:port" clients use to reach the broker.
            broker_name: the broker group name.
            broker_id: 0 for the master, > 0 for slaves.
            ha_server_addr: the broker's HA address (for its slaves).
            data_version: the version of `topic_configs`.
            topic_configs: the broker's topics (None when the body had none).
            filter_server_list: filter server addresses (kept per broker address).
            channel_id: id of the connection the registration came over.
            enable_acting_master: the 5.x header field; None (a 4.x broker) counts as false.
                Shown in the route's BrokerData, as Apache 5.x does; trimq's NameServer does
                not act on it (no acting master).
            zone_name: the 5.x `__ZONE_NAME` extField, shown as the BrokerData's `zoneName`.
            now_ms: current time in ms on the caller's clock.

        Returns:
            The master and HA addresses for the response, and what changed.
        """
        result = RegisterResult()
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)

        bd = self.broker_addr_table.get(broker_name)
        first = bd is None
        if bd is None:
            bd = BrokerData(cluster, broker_name, {})
            self.broker_addr_table[broker_name] = bd
        else:
            bd.cluster = cluster
        # As Apache 5.x: each registration sets both (an old broker clears them).
        bd.enable_acting_master = bool(enable_acting_master)
        bd.zone_name = zone_name
        # One address holds one role: a slave promoted to master (or the reverse)
        # drops its old id first.
        for bid, addr in list(bd.broker_addrs.items()):
            if addr == broker_addr and bid != broker_id:
                del bd.broker_addrs[bid]
        old_addr = bd.broker_addrs.get(broker_id)
        bd.broker_addrs[broker_id] = broker_addr
        first = first or old_addr is None or old_addr != broker_addr
        if broker_addr not in self.broker_live_table:
            first = True
        result.first_time = first

        dv = data_version if data_version is not None else DataVersion()
        if topic_configs is not None and broker_id == MASTER_ID:
            prev = self.broker_live_table.get(broker_addr)
            if first or prev is None or prev.data_version != dv:
                for tc in topic_configs:
                    self._update_queue_data(broker_name, tc)
                result.topics_changed = True

        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            last_update_ms=now_ms,
            data_version=dv.copy(),
            ha_server_addr=ha_server_addr,
            channel_id=channel_id,
        )
        if filter_server_list:
            self.filter_server_table[broker_addr] = list(filter_server_list)
        else:
            self.filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master = bd.broker_addrs.get(MASTER_ID)
            if master is not None:
                live = self.broker_live_table.get(master)
                if live is not None:
                    result.master_addr = master
                    result.ha_server_addr = live.ha_server_addr
        return result

    def claim(
        self,
        *,
        cluster: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        unregister: bool,
        channel_id: int | None = None,
    ) -> Claim:
        """What `register_broker` (or `unregister_broker` when `unregister`) of these values,
        over connection `channel_id`, would do to live brokers: the clusters involved
        (`cluster`, the group's own and those of other groups holding `broker_addr`) and every
        live address it would replace, move to another cluster, remove, or bind to this
        connection instead of the one it registered over (whose close then removes it). A
        broker's own heartbeat displaces nothing."""
        clusters = {cluster}
        displaced: list[str] = []
        live = self.broker_live_table
        info = live.get(broker_addr)
        if (
            not unregister
            and info is not None
            and channel_id is not None
            and info.channel_id is not None
            and info.channel_id != channel_id
        ):
            displaced.append(f"broker at {broker_addr} (registered over another connection)")
        bd = self.broker_addr_table.get(broker_name)
        if bd is not None:
            clusters.add(bd.cluster)
            if unregister:
                if bd.broker_addrs.get(broker_id) == broker_addr and broker_addr in live:
                    displaced.append(f"{broker_name} id {broker_id} at {broker_addr}")
            else:
                old = bd.broker_addrs.get(broker_id)
                if old is not None and old != broker_addr and old in live:
                    displaced.append(f"{broker_name} id {broker_id} at {old}")
                if bd.cluster != cluster and any(a in live for a in bd.broker_addrs.values()):
                    displaced.append(f"{broker_name} of cluster {bd.cluster}")
        for name, other in self.broker_addr_table.items():
            if name == broker_name:
                continue
            for bid, addr in other.broker_addrs.items():
                if addr == broker_addr:
                    clusters.add(other.cluster)
                    if addr in live:
                        displaced.append(f"{name} id {bid} at {addr}")
        return Claim(clusters, displaced)

    def _update_queue_data(self, broker_name: str, tc: TopicConfig) -> None:
        qd = QueueData(
            broker_name=broker_name,
            read_queue_nums=tc.read_queue_nums,
            write_queue_nums=tc.write_queue_nums,
            perm=tc.perm,
            topic_sys_flag=tc.topic_sys_flag,
        )
        self.topic_queue_table.setdefault(tc.topic_name, {})[broker_name] = qd

    def unregister_broker(
        self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> RemovedBroker | None:
        """Remove one broker address (the broker's own UNREGISTER_BROKER on shutdown).

        Returns:
            What was removed, or None when the address was not registered there.
        """
        live = self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        bd = self.broker_addr_table.get(broker_name)
        removed_addr = False
        if bd is not None and bd.broker_addrs.get(broker_id) == broker_addr:
            del bd.broker_addrs[broker_id]
            removed_addr = True
        if live is None and not removed_addr:
            return None
        gone = False
        if bd is not None and not bd.broker_addrs:
            self._remove_broker_name(broker_name, bd.cluster or cluster)
            gone = True
        return RemovedBroker(broker_addr, broker_name, cluster, gone)

    def _remove_broker_name(self, broker_name: str, cluster: str) -> None:
        self.broker_addr_table.pop(broker_name, None)
        names = self.cluster_addr_table.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.cluster_addr_table[cluster]
        for topic in list(self.topic_queue_table):
            queues = self.topic_queue_table[topic]
            if queues.pop(broker_name, None) is not None and not queues:
                del self.topic_queue_table[topic]

    def remove_addr(self, broker_addr: str) -> list[RemovedBroker]:
        """Forget an address entirely (expiry or a closed connection).

        The address is removed from every broker group holding it; a group left
        without addresses is removed with its queue datas, and topics left
        without any broker are removed.
        """
        live = self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        removed: list[RemovedBroker] = []
        for name, bd in list(self.broker_addr_table.items()):
            ids = [bid for bid, addr in bd.broker_addrs.items() if addr == broker_addr]
            if not ids:
                continue
            for bid in ids:
                del bd.broker_addrs[bid]
            gone = not bd.broker_addrs
            if gone:
                self._remove_broker_name(name, bd.cluster)
            removed.append(RemovedBroker(broker_addr, name, bd.cluster, gone))
        if not removed and live is not None:
            removed.append(RemovedBroker(broker_addr, None, None, False))
        return removed

    def scan_not_active(self, now_ms: int, expire_ms: int) -> list[str]:
        """Remove brokers silent for more than `expire_ms`.

        Returns:
            The removed addresses.
        """
        expired = [
            addr
            for addr, live in self.broker_live_table.items()
            if live.last_update_ms + expire_ms < now_ms
        ]
        for addr in expired:
            self.remove_addr(addr)
        return expired

    def on_channel_closed(self, channel_id: int) -> list[str]:
        """Remove every broker address whose latest registration came over this connection.

        A broker that re-registered over a newer connection is kept: only the
        connection recorded at its last registration counts.

        Returns:
            The removed addresses.
        """
        addrs = [a for a, live in self.broker_live_table.items() if live.channel_id == channel_id]
        for addr in addrs:
            self.remove_addr(addr)
        return addrs

    def channel_of(self, broker_addr: str) -> int | None:
        """The connection id of a broker's latest registration."""
        live = self.broker_live_table.get(broker_addr)
        return live.channel_id if live is not None else None

    # -- queries --------------------------------------------------------------------
    def query_data_version(
        self, broker_addr: str, data_version: DataVersion, now_ms: int
    ) -> tuple[bool, DataVersion | None]:
        """QUERY_DATA_VERSION: did the broker's topic table change since its last registration?

        An unchanged answer also counts as a heartbeat (refreshes the last update time).

        Returns:
            (changed, the data version the NameServer holds or None).
        """
        live = self.broker_live_table.get(broker_addr)
        if live is None:
            return True, None
        changed = live.data_version != data_version
        if not changed:
            live.last_update_ms = now_ms
        return changed, live.data_version.copy()

    def query_data_version_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        """Whether `data_version` differs from the one last registered (True if unknown)."""
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def pick_route(self, topic: str) -> TopicRouteData | None:
        """The route of a topic, or None when no live broker serves it."""
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        route = TopicRouteData()
        for broker_name, qd in queues.items():
            route.queue_datas.append(
                QueueData(
                    qd.broker_name,
                    qd.read_queue_nums,
                    qd.write_queue_nums,
                    qd.perm,
                    qd.topic_sys_flag,
                )
            )
            bd = self.broker_addr_table.get(broker_name)
            if bd is None:
                continue
            route.broker_datas.append(bd.copy())
            for addr in bd.broker_addrs.values():
                servers = self.filter_server_table.get(addr)
                if servers:
                    route.filter_server_table[addr] = list(servers)
        if not route.broker_datas:
            return None
        return route

    def cluster_info(self) -> ClusterInfo:
        """All broker groups and clusters (GET_BROKER_CLUSTER_INFO)."""
        return ClusterInfo(
            broker_addr_table={k: v.copy() for k, v in self.broker_addr_table.items()},
            cluster_addr_table={k: sorted(v) for k, v in self.cluster_addr_table.items()},
        )

    def all_topics(self) -> list[str]:
        """Every topic with at least one broker's queue data."""
        return list(self.topic_queue_table)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """Topics served by at least one broker group of `cluster`."""
        names = self.cluster_addr_table.get(cluster, set())
        return [t for t, queues in self.topic_queue_table.items() if names & queues.keys()]

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget a topic, or only its queues on the broker groups of `cluster`.

        Returns:
            Whether anything was removed.
        """
        queues = self.topic_queue_table.get(topic)
        if queues is None:
            return False
        if cluster is None:
            del self.topic_queue_table[topic]
            return True
        names = self.cluster_addr_table.get(cluster, set())
        removed = False
        for name in names:
            if queues.pop(name, None) is not None:
                removed = True
        if not queues:
            del self.topic_queue_table[topic]
        return removed

    def wipe_write_perm(self, broker_name: str) -> int:
        """Take the write permission off every queue data of a broker group.

        Returns:
            How many topics were changed.
        """
        count = 0
        for queues in self.topic_queue_table.values():
            qd = queues.get(broker_name)
            if qd is not None:
                qd.perm &= ~PERM_WRITE
                count += 1
        return count

    def add_write_perm(self, broker_name: str) -> int:
        """Give every queue data of a broker group read and write permission back.

        Returns:
            How many topics were changed.
        """
        count = 0
        for queues in self.topic_queue_table.values():
            qd = queues.get(broker_name)
            if qd is not None:
                qd.perm = PERM_READ | PERM_WRITE
                count += 1
        return count

    def broker_of_addr(self, broker_addr: str) -> tuple[str, str, int] | None:
        """(cluster, broker name, broker id) of an address, if registered."""
        for name, bd in self.broker_addr_table.items():
            for bid, addr in bd.broker_addrs.items():
                if addr == broker_addr:
                    return bd.cluster, name, bid
        return None

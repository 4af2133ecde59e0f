"""The controller-mode compose project of the cluster tests (deploy/docker-compose.controller.yml):
its ports and short timings, and what the scenarios ask of it: which replica of broker-a the
controllers and the NameServer name master, the controllers' leader, the SyncStateSet, the
brokers' commitlog offsets, and an unacknowledged tail written into a stopped replica's store.

Services: etcd1-3, controller1-3, namesrv, broker-a-0 and broker-a-1 (the controller-mode
replicas of broker-a), broker-b (a plain master, another broker name for producers).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

from client import Admin
from client.controller_admin import ControllerAdmin
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from tests.cluster.support import REPO, ComposeProject, ns_broker_addrs

COMPOSE_FILE = REPO / "deploy" / "docker-compose.controller.yml"
ETCDS = ("etcd1", "etcd2", "etcd3")
CONTROLLERS = ("controller1", "controller2", "controller3")
NAMESRV = "namesrv"
REPLICAS = ("broker-a-0", "broker-a-1")
GROUP = "broker-a"
PLAIN = "broker-b"
SERVICES = (*ETCDS, *CONTROLLERS, NAMESRV, *REPLICAS, PLAIN)
CLUSTER_NAME = "DefaultCluster"
# The networks of the compose file: `mesh` joins every container; each replica's published
# port is on its own edge network, so cutting a replica off `mesh` leaves clients reaching it.
MESH = "mesh"

# The compose file's port variables, in the order `ControllerCluster` takes its ports.
PORT_VARS = (
    "NAMESRV_PORT",
    "CONTROLLER1_PORT",
    "CONTROLLER2_PORT",
    "CONTROLLER3_PORT",
    "BROKER_A0_PORT",
    "BROKER_A0_HA_PORT",
    "BROKER_A1_PORT",
    "BROKER_A1_HA_PORT",
    "BROKER_B_PORT",
)
PORT_COUNT = len(PORT_VARS)
_PORT_OF = {
    NAMESRV: "NAMESRV_PORT",
    "controller1": "CONTROLLER1_PORT",
    "controller2": "CONTROLLER2_PORT",
    "controller3": "CONTROLLER3_PORT",
    "broker-a-0": "BROKER_A0_PORT",
    "broker-a-1": "BROKER_A1_PORT",
    PLAIN: "BROKER_B_PORT",
}

# Short timings (the compose file's defaults are RocketMQ's). A dead master is found within the
# heartbeat timeout plus one scan; a dead leader is replaced within the lease ttl plus a poll.
LEASE_TTL_S = 3
ETCD_TIMEOUT_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000
SCAN_INTERVAL_MS = 1000
BROKER_HEARTBEAT_MS = 500
SYNC_METADATA_MS = 1000
CHECK_SYNC_STATE_SET_MS = 1000
NOT_CATCHUP_MS = 3000
REGISTER_PERIOD_MS = 2000
BROKER_EXPIRED_MS = 6000
NAMESRV_SCAN_MS = 1000
SEND_TIMEOUT_MS = 3000
SLAVE_TIMEOUT_MS = 1500
COMMITLOG_FILE_SIZE = 64 * 1024 * 1024


class ControllerCluster(ComposeProject):
    """One compose project of deploy/docker-compose.controller.yml on `ports` (PORT_COUNT
    distinct free ports, in PORT_VARS order)."""

    def __init__(self, project: str, ports: Sequence[int], image: str = "trimq:latest") -> None:
        if len(ports) != PORT_COUNT:
            raise ValueError(f"expected {PORT_COUNT} ports, got {len(ports)}")
        self.ports = dict(zip(PORT_VARS, ports, strict=True))
        env = {
            "TRIMQ_IMAGE": image,
            **{var: str(port) for var, port in self.ports.items()},
            "LEASE_TTL_S": str(LEASE_TTL_S),
            "ETCD_TIMEOUT_MS": str(ETCD_TIMEOUT_MS),
            "CONTROLLER_HEARTBEAT_TIMEOUT_MS": str(HEARTBEAT_TIMEOUT_MS),
            "SCAN_INACTIVE_MASTER_INTERVAL_MS": str(SCAN_INTERVAL_MS),
            "BROKER_HEARTBEAT_INTERVAL_MS": str(BROKER_HEARTBEAT_MS),
            "SYNC_BROKER_METADATA_PERIOD_MS": str(SYNC_METADATA_MS),
            "CHECK_SYNC_STATE_SET_PERIOD_MS": str(CHECK_SYNC_STATE_SET_MS),
            "HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS": str(NOT_CATCHUP_MS),
            "ALL_ACK_IN_SYNC_STATE_SET": "true",
            "MIN_IN_SYNC_REPLICAS": "1",
            "FLUSH_DISK_TYPE": "SYNC_FLUSH",
            "SLAVE_TIMEOUT_MS": str(SLAVE_TIMEOUT_MS),
            "SLAVE_SYNC_INTERVAL_MS": "1000",
            "HA_HEARTBEAT_INTERVAL_MS": "1000",
            "HA_HOUSEKEEPING_INTERVAL_MS": "5000",
            "NAMESRV_SCAN_INTERVAL_MS": str(NAMESRV_SCAN_MS),
            "BROKER_EXPIRED_MS": str(BROKER_EXPIRED_MS),
            "BROKER_REGISTER_PERIOD_MS": str(REGISTER_PERIOD_MS),
            "COMMITLOG_FILE_SIZE": str(COMMITLOG_FILE_SIZE),
            "CONSUME_QUEUE_FILE_SIZE": str(60_000 * 20),
            "HEALTH_INTERVAL": "1s",
        }
        super().__init__(project, COMPOSE_FILE, env, SERVICES)
        # A replica a scenario killed and left down for the next one (controller_scenario).
        self.left_down: str | None = None

    # -- addresses ------------------------------------------------------------------------
    def addr(self, service: str) -> str:
        """The advertised (and published) address of a NameServer, controller or broker."""
        return f"127.0.0.1:{self.ports[_PORT_OF[service]]}"

    @property
    def namesrv_addr(self) -> str:
        return self.addr(NAMESRV)

    @property
    def controller_addrs(self) -> str:
        return ";".join(self.addr(c) for c in CONTROLLERS)

    def service_at(self, addr: str | None) -> str | None:
        """The service advertising `addr` (None for None or an unknown address)."""
        for service in _PORT_OF:
            if addr is not None and self.addr(service) == addr:
                return service
        return None

    def other_replica(self, service: str) -> str:
        (other,) = (r for r in REPLICAS if r != service)
        return other

    # -- docker ---------------------------------------------------------------------------
    def add_unacknowledged_tail(self, service: str, count: int) -> tuple[int, int]:
        """Append `count` records to the stopped replica's store (a one-off container on its
        volume, with its settings): what a master cut off mid-send leaves behind, never
        replicated nor acknowledged. Returns the commitlog range they take."""
        container = self.container(service)
        inspect = subprocess.run(
            ["docker", "inspect", "-f", "{{json .Config.Env}}", container],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        env = [e for e in json.loads(inspect.stdout) if e.startswith("TRIMQ_")]
        image = self.env["TRIMQ_IMAGE"]
        out = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "--volumes-from",
                container,
                *(arg for e in env for arg in ("-e", e)),
                "--entrypoint",
                "/opt/trimq/bin/python",
                image,
                "-c",
                _TAIL_SCRIPT,
                str(count),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"tail writer failed: {out.stdout}{out.stderr}")
        # The store logs on stdout too: the answer is the line marked `tail`.
        found = [line.split() for line in out.stdout.splitlines() if line.startswith("tail ")]
        if not found:
            raise RuntimeError(f"tail writer said nothing: {out.stdout}{out.stderr}")
        return int(found[-1][1]), int(found[-1][2])


# Run in a one-off container on a stopped broker's volume: append records outside the broker.
_TAIL_SCRIPT = """
import sys
import trio
from broker.config import load_config
from common.message import MessageInner
from store import MessageStore, PutMessageStatus

async def main(count):
    async with MessageStore(load_config().store_config()) as store:
        start = store.max_phy_offset
        for i in range(count):
            msg = MessageInner("CtlUnacknowledgedTail", b"never acknowledged %d" % i)
            result = await store.put_message(msg)
            assert result.status is PutMessageStatus.PUT_OK, result
        print("tail", start, store.max_phy_offset, flush=True)

trio.run(main, int(sys.argv[1]))
"""


# -- what the controllers say ----------------------------------------------------------------
async def group_view(admin: ControllerAdmin) -> dict[str, Any] | None:
    """broker-a's entry of the leader's GET_SYNC_STATE_DATA (master, epochs, members), None
    when no leader answers."""
    try:
        table = await admin.sync_state_data([GROUP])
    except Exception:
        return None
    entry = table.get(GROUP)
    return entry if isinstance(entry, dict) else None


def in_sync_addrs(view: dict[str, Any]) -> set[str]:
    return {str(m.get("brokerAddress")) for m in view.get("inSyncReplicas") or []}


async def controller_master(cc: ControllerCluster, admin: ControllerAdmin) -> str | None:
    """The replica the controllers name broker-a's master (None: none, or no leader)."""
    view = await group_view(admin)
    return None if view is None else cc.service_at(view.get("masterAddress"))


async def leader_of(cc: ControllerCluster, admin: ControllerAdmin, ask: str) -> str | None:
    """The controller `ask` names as the leader (None: no answer, or no leader)."""
    try:
        meta = await admin.metadata(cc.addr(ask))
    except Exception:
        return None
    return cc.service_at(meta.leader_address)


# -- what the NameServer and the brokers say ---------------------------------------------------
async def ns_group(rc: RemotingClient, cc: ControllerCluster) -> dict[int, str] | None:
    """broker-a's {broker id: address} at the NameServer (None: no answer)."""
    table = await ns_broker_addrs(rc, cc.namesrv_addr)
    return None if table is None else table.get(GROUP, {})


async def ns_master(rc: RemotingClient, cc: ControllerCluster) -> str | None:
    """The replica the NameServer lists as broker-a's id 0."""
    group = await ns_group(rc, cc)
    return None if group is None else cc.service_at(group.get(0))


async def group_ready(cc: ControllerCluster, ctl: ControllerAdmin, rc: RemotingClient) -> bool:
    """A master elected, both replicas in its SyncStateSet, and the NameServer listing the
    master as id 0 and the other replica under an id >= 1."""
    view = await group_view(ctl)
    if view is None:
        return False
    master = cc.service_at(view.get("masterAddress"))
    if master is None or in_sync_addrs(view) != {cc.addr(r) for r in REPLICAS}:
        return False
    group = await ns_group(rc, cc)
    if group is None or group.get(0) != cc.addr(master):
        return False
    other = cc.addr(cc.other_replica(master))
    return any(bid >= 1 and addr == other for bid, addr in group.items())


async def offsets(admin: Admin, cc: ControllerCluster, service: str) -> tuple[int, int] | None:
    """The broker's commitlog (min, max) offsets (None: no answer)."""
    try:
        info = await admin.broker_status(cc.addr(service))
        return int(info["commitLogMinOffset"]), int(info["commitLogMaxOffset"])
    except Exception:
        return None


async def knows_topic(rc: RemotingClient, cc: ControllerCluster, service: str, topic: str) -> bool:
    """The broker has the topic's config (it answers GET_TOPIC_STATS_INFO for it)."""
    try:
        resp = await rc.invoke(
            cc.addr(service),
            RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}),
            timeout_ms=2000,
        )
    except Exception:
        return False
    return resp.code == ResponseCode.SUCCESS

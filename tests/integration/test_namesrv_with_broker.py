"""Real `mqbroker` processes registering with a real `mqnamesrv`."""

from __future__ import annotations

from collections.abc import Callable

from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol.route import ClusterInfo, TopicRouteData
from tests.helpers import wait_until
from tests.integration.procs import BrokerProc, NamesrvProc

StartBroker = Callable[..., BrokerProc]
StartNamesrv = Callable[..., NamesrvProc]


async def _cluster(client: RemotingClient, addr: str) -> ClusterInfo:
    resp = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    return ClusterInfo.from_json(resp.raise_for_code().body_bytes())


async def _route(client: RemotingClient, addr: str, topic: str) -> TopicRouteData | None:
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    resp = await client.invoke(addr, cmd)
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    return TopicRouteData.from_json(resp.raise_for_code().body_bytes())


async def test_broker_registers_and_leaves(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    broker = start_broker(namesrv.addr, name="broker-a", cluster="ClusterX")
    async with RemotingClient() as client:

        async def registered() -> bool:
            return "broker-a" in (await _cluster(client, namesrv.addr)).broker_addr_table

        await wait_until(registered, total=20, interval=0.1, what="broker registration")
        ci = await _cluster(client, namesrv.addr)
        assert ci.cluster_addr_table == {"ClusterX": ["broker-a"]}
        assert ci.broker_addr_table["broker-a"].broker_addrs == {0: broker.addr}
        # The auto-create template topic is routed to this broker.
        route = await _route(client, namesrv.addr, "TBW102")
        assert route is not None
        assert route.broker_datas[0].broker_addrs == {0: broker.addr}

        # A clean stop unregisters (or closes its connection): gone within seconds.
        broker.stop()

        async def gone() -> bool:
            return "broker-a" not in (await _cluster(client, namesrv.addr)).broker_addr_table

        await wait_until(gone, total=10, interval=0.1, what="broker removal after stop")
        assert await _route(client, namesrv.addr, "TBW102") is None


async def test_killed_broker_removed_on_connection_close(
    namesrv: NamesrvProc, start_broker: StartBroker
) -> None:
    broker = start_broker(namesrv.addr, name="broker-k")
    async with RemotingClient() as client:

        async def registered() -> bool:
            return "broker-k" in (await _cluster(client, namesrv.addr)).broker_addr_table

        await wait_until(registered, total=20, interval=0.1, what="broker registration")
        broker.kill()  # no UNREGISTER: only the closed connection tells the NameServer

        async def gone() -> bool:
            return "broker-k" not in (await _cluster(client, namesrv.addr)).broker_addr_table

        await wait_until(gone, total=10, interval=0.1, what="broker removal after kill")


async def test_restarted_namesrv_refilled_by_broker_heartbeat(
    start_namesrv: StartNamesrv, start_broker: StartBroker
) -> None:
    ns = start_namesrv()
    start_broker(ns.addr, name="broker-r", env={"TRIMQ_REGISTER_NAME_SERVER_PERIOD_MS": "500"})
    async with RemotingClient() as client:

        async def registered() -> bool:
            return "broker-r" in (await _cluster(client, ns.addr)).broker_addr_table

        await wait_until(registered, total=20, interval=0.1, what="broker registration")
        ns.restart()
        await client.close_connection(ns.addr)  # the old connection died with the old process
        await wait_until(registered, total=20, interval=0.1, what="re-registration after restart")
        assert await _route(client, ns.addr, "TBW102") is not None

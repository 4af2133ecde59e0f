"""NameServer in this process (loopback sockets): lifecycle, expiry closing the connection."""

from __future__ import annotations

import zlib

import pytest
import trio

from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol.route import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
)
from tests.helpers import wait_until


def _register(addr: str = "127.0.0.1:10911") -> RemotingCommand:
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper({"T": TopicConfig("T", 4, 4, 6)}, DataVersion(1, 1)), []
    ).to_json()
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": "broker-a",
            "brokerAddr": addr,
            "clusterName": "DefaultCluster",
            "haServerAddr": "127.0.0.1:10912",
            "brokerId": "0",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
        },
        body,
    )


def _cfg(**kw: object) -> NamesrvConfig:
    return NamesrvConfig(listen="127.0.0.1:0", **kw)  # type: ignore[arg-type]


async def test_async_with_reports_port_and_stops() -> None:
    async with NameServer(_cfg()) as ns:
        assert ns.port > 0
        assert ns.address == f"127.0.0.1:{ns.port}"
        async with RemotingClient() as client:
            resp = await client.invoke(ns.address, _register())
            assert resp.code == ResponseCode.SUCCESS
            assert ns.route_table.pick_route("T") is not None
    # Stopped: the port no longer accepts.
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", ns.port)


async def test_nursery_start_form() -> None:
    ns = NameServer(_cfg())
    async with trio.open_nursery() as nursery:
        port = await nursery.start(ns.run)
        assert port == ns.port > 0
        nursery.cancel_scope.cancel()


async def test_scan_once_expires_and_closes_connection() -> None:
    async with NameServer(_cfg()) as ns, RemotingClient() as broker:
        lost: list[str] = []
        broker.on_disconnect(lost.append)
        (await broker.invoke(ns.address, _register())).raise_for_code()
        assert ns.scan_once() == []  # fresh
        live = ns.route_table.broker_live_table["127.0.0.1:10911"]
        removed = ns.scan_once(now_ms=live.last_update_ms + 120_001)
        assert removed == ["127.0.0.1:10911"]
        assert ns.route_table.pick_route("T") is None
        await wait_until(lambda: lost == [ns.address], total=5, what="connection closed by namesrv")


async def test_broker_reregistered_on_new_connection_survives_old_close() -> None:
    async with NameServer(_cfg()) as ns, RemotingClient() as old:
        (await old.invoke(ns.address, _register())).raise_for_code()
        async with RemotingClient() as new:
            (await new.invoke(ns.address, _register())).raise_for_code()
            await old.close_connection(ns.address)
            await trio.sleep(0.2)  # let the server see the close
            assert ns.route_table.pick_route("T") is not None
        # Now the latest connection closed: removed.
        await wait_until(lambda: ns.route_table.pick_route("T") is None, total=5, what="removal")

"""Registration with the NameServers: at start, every period, at once after a topic change.

Each round sends REGISTER_BROKER (JSON header, so Apache NameServers understand it too) with the
topic table and its data version to every NameServer concurrently. A NameServer that is down is
logged and tried again next round. On shutdown UNREGISTER_BROKER goes to each.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import structlog
import trio

from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.headers import (
    RegisterBrokerRequestHeader,
    UnRegisterBrokerRequestHeader,
)
from remoting.protocol.route import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
)

log = structlog.get_logger()


class RegistrationService:
    """Keeps every NameServer informed of this broker.

    Args:
        client: the client used to reach the NameServers.
        namesrv_addrs: their addresses.
        identity: (cluster name, broker name, broker id).
        broker_addr: returns the advertised `host:port` (known once listening).
        topics: returns the current topic table and its data version.
        period_ms: time between rounds.
        timeout_ms: per-request timeout.
        ha_addr: returns this broker's HA address (`host:port` slaves replicate from).
        on_master: called with the NameServer's answer for a slave: its master's HA address
            and broker address (None when the NameServer knows no live master).
    """

    def __init__(
        self,
        client: RemotingClient,
        namesrv_addrs: list[str],
        *,
        identity: tuple[str, str, int],
        broker_addr: Callable[[], str],
        topics: Callable[[], tuple[dict[str, TopicConfig], DataVersion]],
        period_ms: int = 30_000,
        timeout_ms: int = 6000,
        ha_addr: Callable[[], str] | None = None,
        on_master: Callable[[str | None, str | None], None] | None = None,
    ) -> None:
        self.client = client
        self.namesrv_addrs = namesrv_addrs
        self.cluster_name, self.broker_name, self.broker_id = identity
        self.broker_addr = broker_addr
        self.topics = topics
        self.period_ms = period_ms
        self.timeout_ms = timeout_ms
        self._wake = trio.Event()
        self.rounds = 0
        self.last_ok: dict[str, bool] = {}
        self.ha_addr = ha_addr
        self.on_master = on_master
        # True: rounds send nothing (a controller-mode broker before it has a role).
        self.paused = False

    def trigger(self) -> None:
        """Register again as soon as possible (after a topic change)."""
        self._wake.set()

    async def run(self) -> None:
        """Register every period, or at once when triggered, until cancelled."""
        while True:
            with trio.move_on_after(self.period_ms / 1000):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.register_all()

    def _body(self) -> bytes:
        table, version = self.topics()
        wrapper = TopicConfigSerializeWrapper(dict(table), version.copy())
        return RegisterBrokerBody(wrapper, []).encode()

    async def register_all(self) -> int:
        """One round to every NameServer. Returns how many accepted."""
        if not self.namesrv_addrs or self.paused:
            return 0
        body = self._body()
        addr = self.broker_addr()
        fields = RegisterBrokerRequestHeader(
            broker_name=self.broker_name,
            broker_addr=addr,
            cluster_name=self.cluster_name,
            ha_server_addr=self.ha_addr() if self.ha_addr is not None else "",
            broker_id=self.broker_id,
            compressed=False,
            body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
        ).to_fields()
        ok = 0

        async def one(ns: str) -> None:
            nonlocal ok
            cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
            try:
                resp = await self.client.invoke(ns, cmd, self.timeout_ms)
            except RemotingError as exc:
                if self.last_ok.get(ns, True):
                    log.warning("register_broker_failed", namesrv=ns, error=str(exc))
                self.last_ok[ns] = False
                return
            if resp.code != ResponseCode.SUCCESS:
                log.warning(
                    "register_broker_refused", namesrv=ns, code=resp.code, remark=resp.remark
                )
                self.last_ok[ns] = False
                return
            if not self.last_ok.get(ns, False):
                log.info("registered_with_namesrv", namesrv=ns, broker_addr=addr)
            self.last_ok[ns] = True
            ok += 1
            if self.on_master is not None:
                ext = resp.ext_fields or {}
                self.on_master(ext.get("haServerAddr") or None, ext.get("masterAddr") or None)

        async with trio.open_nursery() as nursery:
            for ns in self.namesrv_addrs:
                nursery.start_soon(one, ns)
        self.rounds += 1
        return ok

    async def unregister_all(self) -> None:
        """UNREGISTER_BROKER to every NameServer (errors logged, not raised)."""
        fields = UnRegisterBrokerRequestHeader(
            broker_name=self.broker_name,
            broker_addr=self.broker_addr(),
            cluster_name=self.cluster_name,
            broker_id=self.broker_id,
        ).to_fields()

        async def one(ns: str) -> None:
            cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, fields)
            try:
                await self.client.invoke(ns, cmd, self.timeout_ms)
                log.info("unregistered_from_namesrv", namesrv=ns)
            except RemotingError as exc:
                log.warning("unregister_broker_failed", namesrv=ns, error=str(exc))

        async with trio.open_nursery() as nursery:
            for ns in self.namesrv_addrs:
                nursery.start_soon(one, ns)

"""`NameServer`: the route table served over a `RemotingServer`, plus the broker-expiry task.

Use either form; leaving it cancels everything it started:

    async with NameServer(cfg) as ns:      # ns.port is the bound port
        ...

    port = await nursery.start(NameServer(cfg).run)
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import structlog
import trio

from common.acl import AclChecker, AclFileWatcher, AclRules, load_acl_file, server_check
from namesrv.config import NamesrvConfig
from namesrv.kv_config import KVConfig
from namesrv.metrics import NamesrvMetrics
from namesrv.processors import NamesrvProcessors, monotonic_ms
from namesrv.route_table import RouteTable
from remoting import Connection, RemotingServer
from remoting.tls import server_settings

log = structlog.get_logger()


class NameServer:
    """A NameServer: owns its `RemotingServer`, `RouteTable`, `KVConfig` and expiry task.

    Args:
        config: the settings (listen address, expiry timings, order message switch).
    """

    def __init__(self, config: NamesrvConfig) -> None:
        self.config = config
        self.route_table = RouteTable()
        self.kv = KVConfig()
        host, port = config.listen_host_port
        self.host = host
        self._server = RemotingServer(
            host,
            port,
            msgpack_headers=config.msgpack_headers,
            idle_timeout_ms=config.channel_idle_timeout_ms,
            read_timeout_ms=config.channel_read_timeout_ms,
            tls=server_settings(config),
        )
        self.processors = NamesrvProcessors(
            self.route_table,
            self.kv,
            order_message_enable=config.order_message_enable,
            config=config,
        )
        for code, handler in self.processors.handlers().items():
            self._server.processors.register(code, handler, inline=True)
        self._server.on_disconnect(self._on_disconnect)
        # Access control: the accounts are read at start (`run`), before anything is served.
        self.acl: AclChecker | None = None
        if config.acl_enable:
            self.acl = AclChecker(AclRules({}, ()), open_route_reads=config.acl_open_route_reads)
            self._server.processors.check_before(server_check(self.acl))
            self.processors.acl = self.acl
        self.metrics = NamesrvMetrics(self)
        self.port: int = 0
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None

    @property
    def address(self) -> str:
        """`host:port` once started."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> list[Connection]:
        """The open client and broker connections."""
        return self._server.connections

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the bound port through `task_status`.

        Raises:
            OSError: the listen address cannot be bound.
            MetricsListenError: `metrics_listen` was set and cannot be bound.
        """
        cfg = self.config
        async with trio.open_nursery() as nursery:
            if self.acl is not None:
                assert cfg.acl_file is not None
                # A file read: worker thread. A bad file stops the start (AclFileError).
                self.acl.replace(await trio.to_thread.run_sync(load_acl_file, cfg.acl_file))
                watcher = AclFileWatcher(
                    cfg.acl_file, self.acl, interval_s=cfg.acl_reload_interval_ms / 1000
                )
                nursery.start_soon(watcher.run)
            # Before listening: an explicit metrics address that cannot be bound stops the
            # start (MetricsListenError); the default one taken only logs a warning.
            if await self.metrics.start(nursery):
                self._server.processors.set_rpc_observer(self.metrics.rpc.observe)
            port: int = await nursery.start(self._server.run)
            self.port = port
            nursery.start_soon(self._scan_loop)
            log.info(
                "namesrv_started",
                listen=self.address,
                scan_interval_ms=self.config.scan_not_active_broker_interval_ms,
                expire_ms=self.config.broker_channel_expired_time_ms,
            )
            task_status.started(port)

    async def __aenter__(self) -> NameServer:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        try:
            await self._nursery.start(self.run)
        except BaseException as exc:
            self._nursery.cancel_scope.cancel()
            await self._nursery_cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            result: bool | None = await self._nursery_cm.__aexit__(exc_type, exc, tb)
        finally:
            log.info("namesrv_stopped", listen=self.address)
        return result

    # -- broker liveness ----------------------------------------------------------------
    def _on_disconnect(self, conn: Connection) -> None:
        removed = self.route_table.on_channel_closed(conn.id)
        for addr in removed:
            log.info("namesrv_broker_channel_closed", broker_addr=addr, peer=conn.remote_address)

    def scan_once(self, now_ms: int | None = None) -> list[str]:
        """Remove brokers silent for longer than the configured expiry; close their connections.

        Returns:
            The removed broker addresses.
        """
        now = monotonic_ms() if now_ms is None else now_ms
        channels = {
            addr: live.channel_id for addr, live in self.route_table.broker_live_table.items()
        }
        expire = self.config.broker_channel_expired_time_ms
        removed = self.route_table.scan_not_active(now, expire)
        if removed:
            dead = {channels.get(a) for a in removed}
            for conn in list(self._server.connections):
                if conn.id in dead:
                    conn.close()
        for addr in removed:
            log.info("namesrv_broker_expired", broker_addr=addr, expire_ms=expire)
        return removed

    async def _scan_loop(self) -> None:
        interval = self.config.scan_not_active_broker_interval_ms / 1000
        while True:
            await trio.sleep(interval)
            self.scan_once()

"""`BrokerController`: owns the store, the remoting server and client, managers and services.

    async with BrokerController(config) as broker:   # listening and registered
        ...
    # or: await nursery.start(BrokerController(config).run)

`stop()` (the CLI calls it on SIGTERM/SIGINT) shuts down in order: stop accepting and cancel
the services, unregister from the NameServers, persist offsets, topics and subscription groups,
close the store (flush, checkpoint, remove the abort marker).
"""

from __future__ import annotations

import collections
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any, Self

import structlog
import trio

from broker._persist import write_atomically
from broker.catch_up import MasterCatchUp
from broker.commit import CommitBatcher
from broker.config import BrokerConfig, parse_host_port
from broker.consumer_manager import ConsumerManager
from broker.ha import HAMaster, HASlave
from broker.ha_autoswitch import AutoSwitchHAMaster, AutoSwitchHASlave
from broker.long_polling import LongPollingService
from broker.metrics import BrokerMetrics, Traffic
from broker.offset_manager import OffsetManager
from broker.processors.admin import AdminProcessor
from broker.processors.admin_more import AdminMoreProcessor
from broker.processors.client_manage import ClientManageProcessor
from broker.processors.consumer_manage import ConsumerManageProcessor
from broker.processors.end_transaction import EndTransactionProcessor
from broker.processors.pull import PullProcessor
from broker.processors.query import QueryProcessor
from broker.processors.reply import ReplyProcessor
from broker.processors.send import SendProcessor
from broker.processors.send_back import SendBackProcessor
from broker.producer_manager import ProducerManager
from broker.queue_locks import QueueLockManager
from broker.registration import RegistrationService
from broker.replicas_manager import ReplicasManager
from broker.schedule import ScheduleService
from broker.slave_sync import SlaveSynchronize
from broker.stats import StatsManager
from broker.subscription_manager import SubscriptionManager
from broker.topic_manager import TopicManager, is_readable, is_writeable
from broker.transaction import TransactionService
from common.acl import (
    AclChecker,
    AclFileWatcher,
    AclRules,
    RequestSigner,
    load_acl_file,
    server_check,
)
from common.message import NATIVE as _STORE_NATIVE
from common.schedule import SCHEDULE_TOPIC, parse_delay_levels
from remoting import (
    NATIVE_CODEC,
    Connection,
    Processor,
    RemotingClient,
    RemotingCommand,
    RemotingServer,
    ResponseCode,
    SerializeType,
)
from remoting.codes import RequestCode as R
from remoting.protocol.route import TopicConfig
from remoting.tls import client_settings, server_settings
from store import MessageStore, StoreClosedError
from store.epoch_file import EpochFile

log = structlog.get_logger()


class BrokerStats:
    """Message counters and TPS over the last ten seconds."""

    def __init__(self) -> None:
        self.put_count = 0
        self.get_count = 0
        self._samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=11)

    def sample(self, now: float) -> None:
        self._samples.append((now, self.put_count, self.get_count))

    def tps(self) -> tuple[float, float]:
        if len(self._samples) < 2:
            return 0.0, 0.0
        t0, p0, g0 = self._samples[0]
        t1, p1, g1 = self._samples[-1]
        dt = t1 - t0
        if dt <= 0:
            return 0.0, 0.0
        return (p1 - p0) / dt, (g1 - g0) / dt


def _resolve_ip(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


async def _refuse_on_slave(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(
        ResponseCode.SYSTEM_ERROR,
        "Can't modify topic or subscription group from slave broker, please execute it from "
        "master broker.",
    )


async def _no_transaction_on_slave(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(ResponseCode.SLAVE_NOT_AVAILABLE)


EPOCH_FILE = "epochFileCheckpoint"
NO_ROLE_YET = "the controller has not given this broker a role yet"
SLAVE_READ_ONLY = "messages are put to the slave"


class BrokerController:
    """One broker process's worth of state and services.

    Args:
        config: the broker configuration.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        store_dir = config.store_path
        self.topics = TopicManager(
            store_dir,
            cluster_name=config.broker_cluster_name,
            broker_name=config.broker_name,
            auto_create_topic_enable=config.auto_create_topic_enable,
            default_topic_queue_nums=config.default_topic_queue_nums,
            cluster_topic_enable=config.cluster_topic_enable,
            broker_topic_enable=config.broker_topic_enable,
            max_queue_nums=config.max_topic_queue_nums,
            trace_topic_enable=config.trace_topic_enable,
        )
        self.offsets = OffsetManager(store_dir)
        self.subscriptions = SubscriptionManager(
            store_dir,
            auto_create=config.auto_create_subscription_group,
            max_queue_nums=config.max_topic_queue_nums,
        )
        self.consumers = ConsumerManager()
        self.producers = ProducerManager()
        self.long_polling = LongPollingService(config.max_parked_pulls)
        self.queue_locks = QueueLockManager()
        self.stats = BrokerStats()
        # Per-topic/group counts over the last minute/hour/day (VIEW_BROKER_STATS_DATA).
        self.table_stats = StatsManager(config.broker_cluster_name, self.stats, time.monotonic)
        # Prometheus metrics (broker.metrics): `traffic` is what the send and pull processors
        # count into, None until the endpoint is bound (metrics off: no counting at all).
        self.metrics = BrokerMetrics(self)
        self.traffic: Traffic | None = None
        host, port = config.listen_host_port
        self.server = RemotingServer(
            host,
            port,
            msgpack_headers=config.msgpack_headers,
            idle_timeout_ms=config.channel_idle_timeout_ms,
            read_timeout_ms=config.channel_read_timeout_ms,
            tls=server_settings(config),
        )
        # What the broker sends (registrations, a group's metadata copies) is signed with its
        # own account when it has one (peers and NameServers may run with ACL).
        signer = (
            RequestSigner(config.acl_access_key, config.acl_secret_key)
            if config.acl_access_key is not None and config.acl_secret_key is not None
            else None
        )
        # The broker's outgoing TLS: to NameServers, peers, controllers and its master's HA port.
        self.client_tls = client_settings(config)
        self.client = RemotingClient(
            serialize_type=SerializeType.JSON, before_send=signer, tls=self.client_tls
        )
        self.registration = RegistrationService(
            self.client,
            config.namesrv_addrs,
            identity=(config.broker_cluster_name, config.broker_name, config.broker_id),
            broker_addr=lambda: self.addr,
            topics=lambda: (self.registered_topics(), self.topics.data_version),
            period_ms=config.register_name_server_period_ms,
            timeout_ms=config.register_timeout_ms,
            ha_addr=lambda: self.ha_addr,
            on_master=self._on_master,
        )
        # Controller mode: not registered until the controllers give a role.
        self.registration.paused = config.enable_controller_mode
        self.schedule = ScheduleService(
            store_dir,
            parse_delay_levels(config.message_delay_level),
            lambda: self.store_host,
        )
        self.transactions = TransactionService(
            self.offsets,
            self.producers,
            lambda: self.store_host,
            check_interval_ms=config.transaction_check_interval_ms,
            timeout_ms=config.transaction_timeout_ms,
            check_max=config.transaction_check_max,
        )
        self.send = SendProcessor(self)
        self.send_back = SendBackProcessor(self)
        self.end_transaction = EndTransactionProcessor(self)
        self.pull = PullProcessor(self)
        self.consumer_manage = ConsumerManageProcessor(self)
        self.client_manage = ClientManageProcessor(self)
        self.admin = AdminProcessor(self)
        self.admin_more = AdminMoreProcessor(self)
        self.query = QueryProcessor(self)
        # storeReplyMessageEnable (default on, as RocketMQ) when the config has the setting.
        self.reply = ReplyProcessor(self, store_reply=config.store_reply_message_enable)
        self._store: MessageStore | None = None
        # Replication (`broker.ha`): a master serves its slaves, a slave follows its master.
        self.ha_master: HAMaster | AutoSwitchHAMaster | None = None
        self.ha_slave: HASlave | AutoSwitchHASlave | None = None
        self.ha_addr = ""
        # The role served now: fixed by the configuration, or given by the controllers in
        # controller mode (`broker.replicas_manager`; none until they answer).
        self.role: str = config.broker_role
        self.broker_id = config.broker_id
        self.role_pending = config.enable_controller_mode
        self.epochs = EpochFile(config.store_path / EPOCH_FILE)
        self.replicas = ReplicasManager(self) if config.enable_controller_mode else None
        # The master's address as the controllers name it (controller mode, as a slave).
        self.controller_master_addr: str | None = None
        self._role_scope: trio.CancelScope | None = None
        self._role_done: trio.Event | None = None
        self.master_addr: str | None = None
        self.slave_sync = SlaveSynchronize(self, config.slave_sync_interval_ms / 1000)
        self.catch_up = MasterCatchUp(self)
        self._commits: CommitBatcher | None = None
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._topics_changed = trio.Event()
        # Topic names whose consume queues were there or prepared (see `_prepare_new_topics`).
        self._known_topics: set[str] = set()
        self._write_lock = trio.Lock()
        self._exit_stack = AsyncExitStack()
        self.port = 0
        self.addr = config.advertise or config.listen
        self.store_host: tuple[str, int] = ("127.0.0.1", port)
        self.boot_timestamp_ms = int(time.time() * 1000)
        self._register_processors()
        # Access control: the accounts are read at start (`run`), before anything is served.
        self.acl: AclChecker | None = None
        if config.acl_enable:
            self.acl = AclChecker(AclRules({}, ()))
            self.server.processors.check_before(server_check(self.acl))

    async def _bound(self, port: int) -> None:
        """The listening port is known: the advertised address and the store host (written
        into every record and message id) are set before any request is served."""
        self.port = port
        self.addr = self.config.advertise_addr(port)
        host, aport = parse_host_port(self.addr)
        # getaddrinfo may block on DNS: a worker thread.
        self.store_host = (await trio.to_thread.run_sync(_resolve_ip, host), aport)

    # -- wiring ----------------------------------------------------------------------------
    def _register_processors(self) -> None:
        s = self.server
        table = s.processors
        reg = table.register
        # Inline processors: run by the connection's reader itself, no task per request (a
        # task plus the writer's wake-up cost more CPU than a whole send); they never suspend,
        # and answer later through a responder when they must wait (SYNC_FLUSH, a held pull).
        # (docs/design-notes.md, "Inline send handling")
        # send
        reg(R.SEND_MESSAGE, self.send.send_message, inline=True)
        reg(R.SEND_MESSAGE_V2, self.send.send_message, inline=True)
        reg(R.SEND_BATCH_MESSAGE, self.send.send_batch, inline=True)
        # retry / DLQ and transactions
        reg(R.CONSUMER_SEND_MSG_BACK, self.send_back.consumer_send_msg_back)
        reg(R.END_TRANSACTION, self.end_transaction.end_transaction)
        # pull
        reg(R.PULL_MESSAGE, self.pull.pull_message, inline=True)
        # offsets and consumer lists
        cm = self.consumer_manage
        reg(R.QUERY_CONSUMER_OFFSET, cm.query_consumer_offset, inline=True)
        reg(R.UPDATE_CONSUMER_OFFSET, cm.update_consumer_offset, inline=True)
        reg(R.GET_CONSUMER_LIST_BY_GROUP, self.consumer_manage.get_consumer_list_by_group)
        reg(R.LOCK_BATCH_MQ, self.consumer_manage.lock_batch_mq)
        reg(R.UNLOCK_BATCH_MQ, self.consumer_manage.unlock_batch_mq)
        # clients
        reg(R.HEART_BEAT, self.client_manage.heart_beat, inline=True)
        reg(R.UNREGISTER_CLIENT, self.client_manage.unregister_client)
        reg(R.CHECK_CLIENT_CONFIG, self.client_manage.check_client_config)
        reg(R.GET_CONSUMER_CONNECTION_LIST, self.client_manage.get_consumer_connection_list)
        reg(R.GET_PRODUCER_CONNECTION_LIST, self.client_manage.get_producer_connection_list)
        # request-reply (awaits the push to the requester: a task, not inline)
        reg(R.SEND_REPLY_MESSAGE, self.reply.send_reply_message)
        reg(R.SEND_REPLY_MESSAGE_V2, self.reply.send_reply_message)
        # lookups
        reg(R.QUERY_MESSAGE, self.query.query_message)
        reg(R.VIEW_MESSAGE_BY_ID, self.query.view_message_by_id)
        # admin
        reg(R.UPDATE_AND_CREATE_TOPIC, self.admin.update_and_create_topic)
        reg(R.DELETE_TOPIC_IN_BROKER, self.admin.delete_topic_in_broker)
        reg(R.GET_ALL_TOPIC_CONFIG, self.admin.get_all_topic_config)
        reg(R.GET_MAX_OFFSET, self.admin.get_max_offset)
        reg(R.GET_MIN_OFFSET, self.admin.get_min_offset)
        reg(R.SEARCH_OFFSET_BY_TIMESTAMP, self.admin.search_offset_by_timestamp)
        reg(R.GET_EARLIEST_MSG_STORETIME, self.admin.get_earliest_msg_storetime)
        reg(R.GET_BROKER_RUNTIME_INFO, self.admin.get_broker_runtime_info)
        reg(R.GET_BROKER_HA_STATUS, self.admin.get_broker_ha_status)
        reg(R.READ_COMMITLOG, self.admin.read_commitlog)
        reg(R.GET_TOPIC_STATS_INFO, self.admin.get_topic_stats_info)
        reg(R.GET_CONSUME_STATS, self.admin.get_consume_stats)
        reg(R.GET_BROKER_CONSUME_STATS, self.admin.get_broker_consume_stats)
        reg(R.INVOKE_BROKER_TO_RESET_OFFSET, self.admin.invoke_broker_to_reset_offset)
        reg(R.GET_ALL_CONSUMER_OFFSET, self.admin.get_all_consumer_offset)
        reg(R.GET_ALL_DELAY_OFFSET, self.admin.get_all_delay_offset)
        reg(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.admin.get_all_subscription_group_config)
        reg(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.admin.update_and_create_subscription_group)
        reg(R.GET_BROKER_CONFIG, self.admin.get_broker_config)
        more = self.admin_more
        reg(R.DELETE_SUBSCRIPTIONGROUP, more.delete_subscription_group)
        reg(R.UPDATE_BROKER_CONFIG, more.update_broker_config)
        reg(R.CLEAN_EXPIRED_CONSUMEQUEUE, more.clean_expired_consumequeue)
        reg(R.DELETE_EXPIRED_COMMITLOG, more.delete_expired_commitlog)
        reg(R.QUERY_TOPIC_CONSUME_BY_WHO, more.query_topic_consume_by_who)
        reg(R.GET_CONSUMER_RUNNING_INFO, more.get_consumer_running_info)
        reg(R.CONSUME_MESSAGE_DIRECTLY, more.consume_message_directly)
        reg(R.VIEW_BROKER_STATS_DATA, more.view_broker_stats_data)
        # A slave copies its master: it changes no topic or group and ends no transaction
        # (RocketMQ's answers). In controller mode the role changes at run time.
        changes = (
            R.UPDATE_AND_CREATE_TOPIC,
            R.DELETE_TOPIC_IN_BROKER,
            R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            R.DELETE_SUBSCRIPTIONGROUP,
        )
        if self.config.enable_controller_mode:
            for code in changes:
                entry = table.get(code)
                if entry is not None:
                    reg(code, self._unless_slave(entry[0], _refuse_on_slave))
            entry = table.get(R.END_TRANSACTION)
            assert entry is not None
            reg(R.END_TRANSACTION, self._unless_slave(entry[0], _no_transaction_on_slave))
            assert self.replicas is not None
            reg(R.NOTIFY_BROKER_ROLE_CHANGED, self._role_changed)
            reg(R.GET_BROKER_EPOCH_CACHE, self.admin.get_broker_epoch_cache)
        elif self.config.is_slave:
            for code in changes:
                reg(code, _refuse_on_slave, inline=True)
            reg(R.END_TRANSACTION, _no_transaction_on_slave, inline=True)
        # connection lifecycle
        s.on_disconnect(self._on_disconnect)

    def _unless_slave(self, processor: Processor, refusal: Processor) -> Processor:
        """`processor` while this broker is master, `refusal` while not (controller mode)."""

        async def route(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
            if self.role == "SLAVE" or self.role_pending:
                return await refusal(conn, cmd)
            return await processor(conn, cmd)

        return route

    async def _role_changed(self, conn: Connection, cmd: RemotingCommand) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED (oneway, from a controller)."""
        if self.replicas is not None:
            await self.replicas.on_role_changed(cmd)

    @property
    def ha_master_autoswitch(self) -> AutoSwitchHAMaster | None:
        """The controller-mode HA master while this broker is master."""
        ha = self.ha_master
        return ha if isinstance(ha, AutoSwitchHAMaster) else None

    def _group_confirm(self) -> int | None:
        """The controller-mode HA service's confirm offset (master or slave), or None."""
        ha: AutoSwitchHAMaster | AutoSwitchHASlave | HAMaster | HASlave | None = self.ha_master
        if ha is None:
            ha = self.ha_slave
        if isinstance(ha, AutoSwitchHAMaster | AutoSwitchHASlave):
            return ha.confirm_offset
        return None

    def read_limit(self) -> int | None:
        """The commitlog offset reads stop at, or None (no limit): in controller mode what the
        group confirmed (RocketMQ 5.x dispatches no further), nothing before a role. A record
        past it may still be cut when another replica becomes master; a consumer that read
        and committed it would skip the record written at its queue offset later."""
        if self.replicas is None:
            return None
        confirmed = self._group_confirm()
        return confirmed if confirmed is not None else 0

    def confirm_offset(self) -> int:
        """What the group holds for sure: the HA master's or slave's confirm offset in
        controller mode, else the commitlog max offset."""
        confirmed = self._group_confirm()
        if confirmed is not None:
            return confirmed
        store = self._store
        return store.max_phy_offset if store is not None else 0

    @property
    def store(self) -> MessageStore:
        if self._store is None:
            raise RuntimeError("the broker's store is not open")
        return self._store

    @property
    def commits(self) -> CommitBatcher:
        """The one path of the broker's appends (`broker.commit`)."""
        if self._commits is None:
            raise RuntimeError("the broker's store is not open")
        return self._commits

    # -- services used by processors ---------------------------------------------------------
    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the broker's nursery (dropped when stopping)."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    def registered_topics(self) -> dict[str, TopicConfig]:
        """The topic table as registered with the NameServers: while the broker lacks read or
        write permission (`broker_permission`), each topic's perm is masked by it, so routes
        steer clients off the broker (RocketMQ's rule; the stored table keeps its perms)."""
        table = self.topics.table()
        allowed = self.config.broker_permission
        if is_readable(allowed) and is_writeable(allowed):
            return table
        return {name: replace(cfg, perm=cfg.perm & allowed) for name, cfg in table.items()}

    def on_broker_permission_changed(self) -> None:
        """`broker_permission` changed at run time: a new data version (NameServers take a
        registered table only when its version differs) and a registration now."""
        self.topics.new_version()
        self.registration.trigger()

    def on_topics_changed(self) -> None:
        """A topic was created, changed or deleted: persist and re-register at once."""
        self._topics_changed.set()
        self.registration.trigger()
        self._prepare_new_topics()

    def _prepare_new_topics(self) -> None:
        """Create the consume-queue files of topics new since the last change, off the send
        path (`MessageStore.prepare_queues`): a producer's first burst to a fresh topic
        otherwise waits, queue by queue, for each new file's first page (ext4 block allocation
        in the page fault) (docs/design-notes.md, "Consume queues prepared ahead")."""
        current = {cfg.topic_name: cfg for cfg in self.topics}
        new = current.keys() - self._known_topics
        self._known_topics = set(current)
        if self._nursery is None:
            return
        for name in sorted(new):
            cfg = current[name]
            # Bounded twice: topic configs are checked against max_topic_queue_nums, and a
            # file written by hand is cut to it here.
            nums = min(max(cfg.read_queue_nums, cfg.write_queue_nums), self.topics.max_queue_nums)
            self._nursery.start_soon(self._prepare_queues, name, nums)

    async def _prepare_queues(self, topic: str, queue_nums: int) -> None:
        store = self._store
        if store is None:
            return
        try:
            await store.prepare_queues(topic, range(queue_nums))
        except (OSError, StoreClosedError) as exc:
            log.warning("consume_queue_prepare_failed", topic=topic, error=str(exc))

    async def _write(self, mgr: TopicManager | OffsetManager | SubscriptionManager) -> None:
        # Encode here (the tables change under us otherwise); write under one lock so two
        # writers never share the .tmp file.
        async with self._write_lock:
            data = mgr.snapshot()
            try:
                # fsync blocks: worker thread.
                await trio.to_thread.run_sync(write_atomically, mgr.path, data)
            except BaseException:
                mgr.dirty = True
                raise

    async def persist_topics(self) -> None:
        await self._write(self.topics)

    async def persist_subscriptions(self) -> None:
        await self._write(self.subscriptions)

    async def persist_all(self) -> None:
        """Write every dirty config file (offsets, topics, subscription groups)."""
        for mgr in (self.offsets, self.topics, self.subscriptions):
            if mgr.dirty:
                await self._write(mgr)

    def needed_commitlog_offset(self) -> tuple[int, str] | None:
        """The smallest commitlog offset a consumer still needs, and who: over every
        committed consumer offset (groups, and the transaction service's own) and every delay
        level's delivery offset, the first stored message not consumed yet. None when every
        stored message is consumed. The store's cleanup keeps the commitlog files from there
        on under disk pressure unless `clean_file_forcibly_enable`.

        Event loop; memory reads only (one consume-queue unit per queue with an offset)."""
        store = self._store
        if store is None:
            return None
        best: tuple[int, str] | None = None
        for topic, group, queues in self.offsets.entries():
            for queue_id, offset in queues.items():
                phy = store.get_commit_log_offset_in_queue(topic, queue_id, offset)
                if phy is not None and (best is None or phy < best[0]):
                    end = store.get_max_offset_in_queue(topic, queue_id)
                    best = (
                        phy,
                        f"group {group}, topic {topic}, queue {queue_id} at offset {offset} "
                        f"of {end}",
                    )
        for level in range(1, self.schedule.levels + 1):
            offset = self.schedule.offsets.get(level, 0)
            phy = store.get_commit_log_offset_in_queue(SCHEDULE_TOPIC, level - 1, offset)
            if phy is not None and (best is None or phy < best[0]):
                best = (phy, f"delay level {level} not delivered yet from offset {offset}")
        return best

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        self.long_polling.notify(topic, queue_id, max_offset)

    async def _start_ha_master(self, nursery: trio.Nursery, host: str, port: int) -> int:
        """Listen for slaves: on `ha_listen_port`, else on the listen port + 1, or, when that
        one is taken, on any free port (slaves learn the address from the NameServer)."""
        assert self.ha_master is not None
        cfg = self.config
        try:
            return int(await nursery.start(self.ha_master.run, host, cfg.ha_port(port)))
        except OSError as exc:
            if cfg.ha_listen_port:
                raise
            log.warning("ha_port_taken", port=port + 1, error=str(exc))
            return int(await nursery.start(self.ha_master.run, host, 0))

    def _on_master(self, ha_addr: str | None, master_addr: str | None) -> None:
        """The NameServer's answer to a registration: a slave follows the master it names
        (unless `ha_master_address` fixes it). In controller mode only an answer naming the
        master the controllers named counts (a NameServer may still list the old one)."""
        slave = self.ha_slave
        if slave is None:
            return
        if self.replicas is not None and (
            master_addr is None or master_addr != self.controller_master_addr
        ):
            return
        if not self.config.ha_master_address and ha_addr != slave.master_addr:
            log.info("ha_master_changed", ha_addr=ha_addr, master_addr=master_addr)
            slave.set_master(ha_addr)
        if master_addr != self.master_addr:
            self.master_addr = master_addr
            self.slave_sync.trigger()

    def _on_disconnect(self, conn: Connection) -> None:
        changed = self.consumers.remove_channel(conn)
        self.producers.remove_channel(conn)
        for group in changed:
            self.client_manage.notify_group(group)

    # -- controller mode: role switches ------------------------------------------------------
    async def _end_role(self) -> None:
        """Stop the current role's tasks (HA, metadata copies, master services) and wait for
        them to end."""
        scope, done = self._role_scope, self._role_done
        if scope is not None and done is not None:
            scope.cancel()
            await done.wait()
        self._role_scope = self._role_done = None
        self.ha_master = None
        self.ha_slave = None
        self.ha_addr = ""

    async def _role_session(
        self,
        setup: Callable[[trio.Nursery], Awaitable[None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        done = self._role_done = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._role_scope = scope
                async with trio.open_nursery() as nursery:
                    await setup(nursery)
                    task_status.started()
        finally:
            done.set()

    async def _start_role(self, setup: Callable[[trio.Nursery], Awaitable[None]]) -> None:
        if self._nursery is None:
            raise RuntimeError("the broker is not running")
        await self._nursery.start(self._role_session, setup)

    async def change_to_master(self, epoch: int, my_id: int, members: frozenset[int]) -> None:
        """Become the group's master for `epoch` (controller mode; see broker.replicas_manager)."""
        cfg = self.config
        commits = self.commits
        commits.read_only = "this broker is becoming master"
        # Pending until the switch is complete: a switch that fails is tried again.
        self.role_pending = True
        await self._end_role()
        store = self.store
        # Writes are refused until the switch ends, and a replica's appends are whole runs:
        # the max offset is where this epoch starts.
        start = store.max_phy_offset
        epochs = self.epochs
        epochs.truncate_from(start + 1)  # entries past the log's end never wrote anything
        last = epochs.last
        if last is None or last.epoch < epoch:
            # A replica's first epoch also counts what the store held before controller
            # mode, so that slaves can copy it.
            epochs.append(epoch, store.min_phy_offset if last is None else start)
            await trio.to_thread.run_sync(epochs.save)  # fsync: worker thread
        elif last.epoch > epoch:
            log.error("controller_epoch_behind_local", epoch=epoch, local=last.epoch)
        replicas = self.replicas
        ha = AutoSwitchHAMaster(
            store,
            lambda: list(epochs.entries),
            transfer_batch_size=cfg.ha_transfer_batch_size,
            heartbeat_interval_s=cfg.ha_send_heartbeat_interval_ms / 1000,
            housekeeping_interval_s=cfg.ha_housekeeping_interval_ms / 1000,
            max_gap_not_in_sync=cfg.ha_max_gap_not_in_sync,
            all_ack=cfg.all_ack_in_sync_state_set,
            need_acks=cfg.in_sync_replicas - 1,
            on_disconnect=replicas.slave_disconnected if replicas is not None else None,
            tls=server_settings(cfg),
        )
        ha.set_sync_state_set(my_id, members)
        self.ha_master = ha
        host = cfg.listen_host_port[0]

        async def setup(nursery: trio.Nursery) -> None:
            ha_port = await self._start_ha_master(nursery, host, self.port)
            self.ha_addr = f"{parse_host_port(self.addr)[0]}:{ha_port}"
            await nursery.start(self.schedule.run, store, commits.put)
            nursery.start_soon(self.transactions.run)

        await self._start_role(setup)
        commits.set_replication(ha, self._in_sync_refusal)
        self.role = "SYNC_MASTER"
        self.broker_id = 0
        self.role_pending = False
        self.controller_master_addr = self.addr
        self.master_addr = None
        self.send.is_slave = False
        commits.read_only = None
        self.registration.broker_id = 0
        self.registration.paused = False
        self.registration.trigger()
        log.info("broker_role_changed", role=self.role, epoch=epoch, ha_addr=self.ha_addr)

    def _in_sync_refusal(self) -> str | None:
        """Why a send is refused before it is stored: the SyncStateSet is smaller than
        `min_in_sync_replicas` (acknowledging would promise copies that do not exist)."""
        ha = self.ha_master_autoswitch
        if ha is None:
            return None
        size, needed = ha.in_sync_set_size(), self.config.min_in_sync_replicas
        if size < needed:
            return f"SyncStateSet has {size} members, minInSyncReplicas is {needed}"
        return None

    async def change_to_slave(self, my_id: int, master_addr: str) -> None:
        """Follow the master at `master_addr` (controller mode)."""
        cfg = self.config
        commits = self.commits
        commits.read_only = SLAVE_READ_ONLY
        self.send.is_slave = True
        self.role = "SLAVE"
        self.role_pending = True
        await self._end_role()
        commits.set_replication(None, None)
        self.broker_id = my_id
        self.role_pending = False
        self.controller_master_addr = master_addr
        self.master_addr = None
        ha = AutoSwitchHASlave(
            self.store,
            self.epochs,
            my_id,
            cfg.ha_master_address,
            heartbeat_interval_s=cfg.ha_send_heartbeat_interval_ms / 1000,
            housekeeping_interval_s=cfg.ha_housekeeping_interval_ms / 1000,
            tls=self.client_tls,
        )
        self.ha_slave = ha

        async def setup(nursery: trio.Nursery) -> None:
            nursery.start_soon(ha.run)
            nursery.start_soon(self.slave_sync.run)
            nursery.start_soon(self._follow_master_registration, master_addr)

        await self._start_role(setup)
        self.registration.broker_id = my_id
        self.registration.paused = False
        self.registration.trigger()
        log.info("broker_role_changed", role=self.role, broker_id=my_id, master=master_addr)

    async def _follow_master_registration(self, master_addr: str) -> None:
        """Register again every second until the NameServers name `master_addr` as master
        (their answer carries its HA address; a new master registers in its own time)."""
        while self.master_addr != master_addr:
            await trio.sleep(1.0)
            if self.master_addr != master_addr:
                self.registration.trigger()

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask `run` to shut down cleanly."""
        self._stop.set()

    def _notify_ha(self, _topic: str, _queue_id: int, _max_offset: int) -> None:
        ha = self.ha_master
        if ha is not None:
            ha.notify_append()

    async def _load(self) -> None:
        # Small JSON files, but still disk reads: keep them off the event loop.
        if self.acl is not None:
            assert self.config.acl_file is not None
            # A bad file stops the start (AclFileError names what is wrong).
            self.acl.replace(await trio.to_thread.run_sync(load_acl_file, self.config.acl_file))
        if self.config.enable_controller_mode:
            await trio.to_thread.run_sync(self.epochs.load)
        await trio.to_thread.run_sync(self.topics.load)
        await trio.to_thread.run_sync(self.offsets.load)
        await trio.to_thread.run_sync(self.subscriptions.load)
        await trio.to_thread.run_sync(self.schedule.load)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the broker until `stop()`; `task_status.started(port)` once listening and after
        the first registration round."""
        cfg = self.config
        await self._load()
        async with MessageStore(
            cfg.store_config(), needed_offset=self.needed_commitlog_offset
        ) as store:
            self._store = store
            # The inline processors of one received chunk append as one run (`broker.commit`).
            if cfg.enable_controller_mode:
                # The role comes from the controllers (`broker.replicas_manager`).
                store.add_arrival_listener(self._notify_ha)
            elif cfg.is_slave:
                self.ha_slave = HASlave(
                    store,
                    cfg.ha_master_address,
                    heartbeat_interval_s=cfg.ha_send_heartbeat_interval_ms / 1000,
                    housekeeping_interval_s=cfg.ha_housekeeping_interval_ms / 1000,
                    tls=self.client_tls,
                )
            else:
                ha_master = self.ha_master = HAMaster(
                    store,
                    transfer_batch_size=cfg.ha_transfer_batch_size,
                    heartbeat_interval_s=cfg.ha_send_heartbeat_interval_ms / 1000,
                    housekeeping_interval_s=cfg.ha_housekeeping_interval_ms / 1000,
                    max_gap_not_in_sync=cfg.ha_max_gap_not_in_sync,
                    tls=server_settings(cfg),
                )
                # Told once records are written (a run's after its write): wake the senders.
                store.add_arrival_listener(lambda _t, _q, _m: ha_master.notify_append())
            commits = self._commits = CommitBatcher(
                store,
                replication=self.ha_master if cfg.broker_role == "SYNC_MASTER" else None,
                slave_timeout_s=cfg.slave_timeout_ms / 1000,
                read_only=NO_ROLE_YET
                if cfg.enable_controller_mode
                else SLAVE_READ_ONLY
                if cfg.is_slave
                else None,
            )
            self.server.processors.set_run_hooks(commits.begin, commits.end)
            self._known_topics = {cfg.topic_name for cfg in self.topics}
            store.add_arrival_listener(self._on_arrival)
            store.add_arrival_listener(self.schedule.on_arrival)
            self.transactions.attach(store, commits.put)
            async with self.client:
                try:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        # Before listening: an explicit metrics address that cannot be
                        # bound stops the start (MetricsListenError).
                        if await self.metrics.start(nursery):
                            self.traffic = self.metrics.traffic
                            self.server.processors.set_rpc_observer(self.metrics.rpc.observe)
                        # Before listening: take back what a slave holds beyond this master
                        # (broker.catch_up); on failure it listens fenced and retries below.
                        caught_up = True
                        if self.ha_master is not None and cfg.namesrv_addrs:
                            caught_up = await self.catch_up.try_once()
                        port = await nursery.start(partial(self.server.run, on_bound=self._bound))
                        host = cfg.listen_host_port[0]
                        if self.ha_master is not None:
                            ha_port = await self._start_ha_master(nursery, host, port)
                            self.ha_addr = f"{parse_host_port(self.addr)[0]}:{ha_port}"
                        if self.ha_slave is not None:
                            nursery.start_soon(self.ha_slave.run)
                            nursery.start_soon(self.slave_sync.run)
                        if not caught_up:
                            # Not registered until done; False when stopped meanwhile.
                            await self.catch_up.run(self._stop)
                        if not self._stop.is_set():
                            if self.topics.dirty:
                                await self.persist_topics()
                            registered = await self.registration.register_all()
                            nursery.start_soon(self.registration.run)
                            nursery.start_soon(self._persist_loop)
                            nursery.start_soon(self._topic_persist_loop)
                            nursery.start_soon(self._scan_loop)
                            nursery.start_soon(self._stats_loop)
                            nursery.start_soon(self.long_polling.run)
                            if self.acl is not None:
                                assert cfg.acl_file is not None
                                watcher = AclFileWatcher(
                                    cfg.acl_file,
                                    self.acl,
                                    interval_s=cfg.acl_reload_interval_ms / 1000,
                                )
                                nursery.start_soon(watcher.run)
                            if self.replicas is not None:
                                nursery.start_soon(self.replicas.run)
                            elif not cfg.is_slave:
                                # A slave copies what its master's services write.
                                await nursery.start(self.schedule.run, store, commits.put)
                                nursery.start_soon(self.transactions.run)
                            log.info(
                                "broker_started",
                                broker_name=cfg.broker_name,
                                cluster=cfg.broker_cluster_name,
                                broker_id=cfg.broker_id,
                                addr=self.addr,
                                port=port,
                                store_dir=str(cfg.store_path),
                                flush=cfg.flush_disk_type,
                                namesrv=cfg.namesrv_addrs,
                                registered=registered,
                                # The C accelerators in use (False: pure Python, TRIMQ_NO_NATIVE
                                # set or the extensions not built).
                                native=_STORE_NATIVE and NATIVE_CODEC,
                            )
                        task_status.started(port)
                        await self._stop.wait()
                        log.info("broker_stopping")
                        nursery.cancel_scope.cancel()
                finally:
                    self._nursery = None
                    with trio.CancelScope(shield=True):
                        self.long_polling.wake_all()
                        with trio.move_on_after(3):
                            await self.registration.unregister_all()
                        await self.persist_all()
                        await self.schedule.persist()
            self._store = None
            self._commits = None
        log.info("broker_stopped", broker_name=cfg.broker_name)

    async def __aenter__(self) -> Self:
        nursery = await self._exit_stack.enter_async_context(trio.open_nursery())
        try:
            await nursery.start(self.run)
        except BaseException:
            await self._exit_stack.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.stop()
        return await self._exit_stack.__aexit__(exc_type, exc, tb)

    # -- periodic tasks ----------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        period = self.config.consumer_offset_persist_interval_ms / 1000
        while True:
            await trio.sleep(period)
            try:
                await self.persist_all()
            except OSError as exc:
                log.error("config_persist_failed", error=str(exc))  # noqa: TRY400

    async def _topic_persist_loop(self) -> None:
        """Write topics.json right after a change (an auto-created topic must survive a crash
        together with its messages); changes arriving meanwhile share the next write."""
        while True:
            await self._topics_changed.wait()
            self._topics_changed = trio.Event()
            if self.topics.dirty:
                try:
                    await self.persist_topics()
                except OSError as exc:
                    log.error("topics_persist_failed", error=str(exc))  # noqa: TRY400
            if self.subscriptions.dirty:
                try:
                    await self.persist_subscriptions()
                except OSError as exc:
                    log.error("subscriptions_persist_failed", error=str(exc))  # noqa: TRY400

    async def _scan_loop(self) -> None:
        period = self.config.client_scan_interval_ms / 1000
        idle = self.config.channel_idle_timeout_ms
        while True:
            await trio.sleep(period)
            for group, channel in self.consumers.scan_idle(idle):
                if isinstance(channel, Connection):
                    channel.close()
                self.client_manage.notify_group(group)
            for channel in self.producers.scan_idle(idle):
                if isinstance(channel, Connection):
                    channel.close()

    async def _stats_loop(self) -> None:
        while True:
            self.stats.sample(trio.current_time())
            self.table_stats.tick(time.monotonic())
            await trio.sleep(1)

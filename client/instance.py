"""`ClientInstance`: what the producers and consumers of one client id share.

One remoting client, the topic route cache (refreshed every 30 s), heartbeats
to every broker (30 s), consumer offset persistence (5 s), rebalance (20 s and
whenever a broker says the group changed), and handlers for requests brokers
send to clients. `async with ClientInstance(cfg) as inst:` owns all of it.
"""

from __future__ import annotations

import contextvars
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self

import structlog
import trio

from client._api import MQClientAPI, decode_messages
from client._util import close_stack
from client.config import ClientConfig
from client.errors import ClientClosedError, MQClientError, NoRouteError
from client.message import MessageQueue
from client.request_reply import PendingRequests
from client.route import TopicPublishInfo, broker_addr_table, subscribe_queues
from client.running_info import running_info
from common.message import PROPERTY_PRODUCER_GROUP
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode, SerializeType
from remoting.logs import configure_logging_if_unset
from remoting.protocol import bodies, headers
from remoting.protocol.route import MASTER_ID, TopicRouteData

if TYPE_CHECKING:
    from client.producer import Producer

log = structlog.get_logger()

CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"


class ConsumerInner(Protocol):
    """What the instance asks of a registered consumer."""

    group: str

    def consumer_data(self) -> bodies.ConsumerData: ...
    def subscribed_topics(self) -> set[str]: ...
    async def do_rebalance(self) -> None: ...
    async def persist_offsets(self) -> None: ...
    async def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None: ...


def unique_instance_name() -> str:
    """pid#nanos: distinct for each client created without an explicit instance name."""
    return f"{os.getpid()}#{time.monotonic_ns()}"


def client_config(
    config: ClientConfig, instance: ClientInstance | None
) -> tuple[ClientConfig, bool]:
    """A producer's or consumer's configuration, and whether it shares its instance: without
    an explicit `instance`, a named one (`instance_name` set) is shared with the other clients
    of that name (`shared_instance`), an unnamed one gets a unique name and its own."""
    shared = instance is None and "instance_name" in config.model_fields_set
    if instance is None and not shared:
        config = config.model_copy(update={"instance_name": unique_instance_name()})
    return config, shared


def open_instance(
    config: ClientConfig, *, shared: bool
) -> AbstractAsyncContextManager[ClientInstance]:
    """The instance a producer or consumer without an explicit one runs on: `shared_instance`
    when the user named the instance (`shared`), else a private `ClientInstance`."""
    return shared_instance(config) if shared else ClientInstance(config)


@dataclass(eq=False)
class _Shared:
    instance: ClientInstance
    users: int = 0
    ready: trio.Event = field(default_factory=trio.Event)
    stop: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    error: Exception | None = None


# The shared instances of this trio run, by client id.
_SHARED: trio.lowlevel.RunVar[dict[str, _Shared]] = trio.lowlevel.RunVar("trimq_shared_instances")


@asynccontextmanager
async def shared_instance(config: ClientConfig) -> AsyncIterator[ClientInstance]:
    """The running `ClientInstance` of `config.client_id()` in this trio run: started by its
    first user, closed when its last user leaves, as RocketMQ's `MQClientManager` shares one
    `MQClientInstance` per client id (ip@instanceName) in a process. Producers and consumers
    given the same `instance_name` thus share one connection per broker, one heartbeat and one
    route cache. The instance takes the first user's configuration.

    The instance runs in a trio system task, so any user may leave first (a nursery must be
    closed by the task that opened it). If the instance fails (a bug in a background task),
    the failure is logged and its users get `ClientClosedError`; the next user starts a new
    one.

    Raises:
        ClientClosedError: the instance could not start.
    """
    try:
        table = _SHARED.get()
    except LookupError:
        table = {}
        _SHARED.set(table)
    key = config.client_id()
    entry = table.get(key)
    if entry is None or entry.stop.is_set() or entry.done.is_set():
        entry = table[key] = _Shared(ClientInstance(config))
        trio.lowlevel.spawn_system_task(
            _host_shared,
            entry,
            name=f"trimq client instance {key}",
            context=contextvars.copy_context(),
        )
    entry.users += 1
    try:
        await entry.ready.wait()
        if not entry.instance.running:
            raise ClientClosedError(
                f"client instance {key} could not start: {entry.error!r}"
            ) from entry.error
        yield entry.instance
    finally:
        entry.users -= 1
        if entry.users == 0:
            if table.get(key) is entry:
                del table[key]
            entry.stop.set()
            with trio.CancelScope(shield=True):
                await entry.done.wait()


async def _host_shared(entry: _Shared) -> None:
    """Run a shared instance until its last user leaves. A system task must not raise: a
    failure is logged and ends the instance (its users see it stopped)."""
    try:
        async with entry.instance:
            entry.ready.set()
            await entry.stop.wait()
    except Exception as exc:
        entry.error = exc
        log.exception("client_instance_failed", client_id=entry.instance.client_id)
    finally:
        entry.ready.set()
        entry.done.set()


class ClientInstance:
    """Shared state and background work of one client id.

    Args:
        config: client options.

    Resource handling: `async with` opens the remoting client and starts the
    periodic tasks; leaving the block unregisters from brokers (best effort)
    and cancels everything it started.
    """

    def __init__(self, config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig()
        self.client_id = self.config.client_id()
        self.remoting: RemotingClient | None = None
        self._api: MQClientAPI | None = None
        self.route_table: dict[str, TopicRouteData] = {}
        self.broker_addrs: dict[str, dict[int, str]] = {}
        self.publish_info: dict[str, TopicPublishInfo] = {}
        self.producers: dict[str, object] = {}
        self.consumers: dict[str, ConsumerInner] = {}
        # When each consumer registered (ms): ConsumerRunningInfo's start timestamp.
        self.consumer_start_ms: dict[str, int] = {}
        self._rebalance_wakeup = trio.Event()
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._route_lock = trio.Lock()
        self._running = False
        self._inner_producer: Producer | None = None
        self._inner_producer_lock = trio.Lock()
        # Own generator: the global `random` state belongs to the application.
        self._rng = random.Random()
        # Requests of this client's producers waiting for replies (client.request_reply).
        self.requests = PendingRequests()

    # -- lifecycle ------------------------------------------------------------
    @property
    def api(self) -> MQClientAPI:
        if self._api is None:
            raise ClientClosedError("client instance is not started (use `async with`)")
        return self._api

    @property
    def running(self) -> bool:
        return self._running

    @property
    def nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise ClientClosedError("client instance is not started")
        return self._nursery

    async def __aenter__(self) -> Self:
        # An application that never configured structlog gets warnings and errors only.
        configure_logging_if_unset("warning")
        name = self.config.serialize_type
        serialize = {
            "msgpack": SerializeType.MSGPACK,
            "rocketmq": SerializeType.ROCKETMQ,
        }.get(name, SerializeType.JSON)
        try:
            self.remoting = await self._stack.enter_async_context(
                RemotingClient(
                    serialize_type=serialize,
                    upgrade_to_msgpack=name == "auto",
                    # Signs every request, NameServer ones included, as RocketMQ's
                    # AclClientRPCHook does.
                    before_send=self.config.request_signer(),
                    # TLS on every connection (NameServers and brokers) with use_tls; the
                    # files are read when the client is entered.
                    tls=self.config.tls_settings(),
                )
            )
            self.remoting.processors.register(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify_consumer_ids_changed
            )
            self.remoting.processors.register(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_consumer_offset
            )
            self.remoting.processors.register(
                RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, self._on_get_consumer_status
            )
            self.remoting.processors.register(
                RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction_state
            )
            self.remoting.processors.register(
                RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_get_consumer_running_info
            )
            self.remoting.processors.register(
                RequestCode.CONSUME_MESSAGE_DIRECTLY, self._on_consume_message_directly
            )
            self.remoting.processors.register(
                RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, self.requests.on_push_reply
            )
            self._api = MQClientAPI(
                self.remoting,
                self.config.namesrv_list(),
                self.config.mq_client_api_timeout_ms,
            )
            self._nursery = await self._stack.enter_async_context(trio.open_nursery())
            self._running = True
            self._nursery.start_soon(self._route_loop)
            self._nursery.start_soon(self._heartbeat_loop)
            self._nursery.start_soon(self._persist_loop)
            self._nursery.start_soon(self._rebalance_loop)
            self._nursery.start_soon(self.requests.run_scanner)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._running = False
        self.requests.close("client instance closed: no reply will come")
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        with trio.move_on_after(3) as scope:
            scope.shield = True
            await self._unregister_all()
        self._nursery = None
        result = await close_stack(self._stack, exc_type, exc, tb)
        self._api = None
        return result

    async def _unregister_all(self) -> None:
        if self._api is None:
            return
        for addr in self.all_broker_addrs():
            for group in list(self.producers):
                await self._unregister_one(addr, producer_group=group)
            for group in list(self.consumers):
                await self._unregister_one(addr, consumer_group=group)

    async def _unregister_one(
        self, addr: str, producer_group: str | None = None, consumer_group: str | None = None
    ) -> None:
        try:
            with trio.move_on_after(1):
                await self.api.unregister_client(
                    addr, self.client_id, producer_group, consumer_group
                )
        except Exception as exc:
            log.debug("unregister_failed", addr=addr, error=str(exc))

    # -- registration -----------------------------------------------------------
    def register_producer(self, group: str, producer: object) -> None:
        if group in self.producers:
            raise MQClientError(f"producer group {group} is already registered in this client")
        self.producers[group] = producer

    async def unregister_producer(self, group: str) -> None:
        if self.producers.pop(group, None) is not None and self._api is not None:
            for addr in self.all_broker_addrs():
                await self._unregister_one(addr, producer_group=group)

    def register_consumer(self, consumer: ConsumerInner) -> None:
        if consumer.group in self.consumers:
            raise MQClientError(
                f"consumer group {consumer.group} is already registered in this client "
                "(use another instance_name for a second consumer of the same group)"
            )
        self.consumers[consumer.group] = consumer
        self.consumer_start_ms[consumer.group] = int(time.time() * 1000)

    async def unregister_consumer(self, group: str) -> None:
        self.consumer_start_ms.pop(group, None)
        if self.consumers.pop(group, None) is not None and self._api is not None:
            for addr in self.all_broker_addrs():
                await self._unregister_one(addr, consumer_group=group)

    async def inner_producer(self) -> Producer:
        """The instance's own producer (group CLIENT_INNER_PRODUCER), started on first use.

        Consumers re-send failed messages through it when CONSUMER_SEND_MSG_BACK fails.
        """
        from client.producer import Producer

        async with self._inner_producer_lock:
            if self._inner_producer is None:
                if not self._running:
                    raise ClientClosedError("client instance is not started")
                producer = Producer(CLIENT_INNER_PRODUCER_GROUP, self.config, instance=self)

                async def host(task_status: trio.TaskStatus[Producer]) -> None:
                    # The producer opens a nursery, which must be left by the task that
                    # entered it: it lives in a task of the instance's nursery, not in the
                    # caller's (a consume worker), and stops when the instance does.
                    try:
                        async with producer:
                            task_status.started(producer)
                            await trio.sleep_forever()
                    finally:
                        self._inner_producer = None

                self._inner_producer = await self.nursery.start(host)
            return self._inner_producer

    # -- routes -------------------------------------------------------------------
    def all_broker_addrs(self) -> list[str]:
        return sorted({a for addrs in self.broker_addrs.values() for a in addrs.values()})

    def master_addr(self, broker_name: str) -> str | None:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def any_addr(self, broker_name: str) -> str | None:
        """The master's address, else any slave's (for reads)."""
        addrs = self.broker_addrs.get(broker_name, {})
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        return addrs[min(addrs)] if addrs else None

    def find_subscribe_addr(
        self, broker_name: str, broker_id: int = MASTER_ID, *, only_this: bool = False
    ) -> tuple[str, bool] | None:
        """Where to read `broker_name` from, as RocketMQ's findBrokerAddressInSubscribe:
        the address of `broker_id`; for a slave id missing, the next id; else, unless
        `only_this`, the lowest id known (the master, or a slave while the master is gone
        from the route). Returns (address, is a slave), or None."""
        addrs = self.broker_addrs.get(broker_name)
        if not addrs:
            return None
        if broker_id in addrs:
            return addrs[broker_id], broker_id != MASTER_ID
        if broker_id != MASTER_ID and broker_id + 1 in addrs:
            return addrs[broker_id + 1], True
        if only_this:
            return None
        first = min(addrs)
        return addrs[first], first != MASTER_ID

    async def find_read_addr(
        self, broker_name: str, topic: str | None = None, broker_id: int = MASTER_ID
    ) -> tuple[str, bool]:
        """`find_subscribe_addr` without `only_this`, refreshing the topic's route once if
        the broker is unknown.

        Raises:
            MQClientError: no address of the broker is known.
        """
        found = self.find_subscribe_addr(broker_name, broker_id)
        if found is None and topic is not None:
            await self.update_topic_route(topic)
            found = self.find_subscribe_addr(broker_name, broker_id)
        if found is None:
            raise MQClientError(f"The broker[{broker_name}] not exist")
        return found

    async def find_offset_addr(self, broker_name: str, topic: str | None = None) -> str:
        """Where consumer offsets of `broker_name` are read and committed: its master; with
        the master gone from the route (after one refresh), a slave, which stores them
        until the master is back (RocketMQ's RemoteBrokerOffsetStore does the same).

        Raises:
            MQClientError: no address of the broker is known.
        """
        found = self.find_subscribe_addr(broker_name, only_this=True)
        if found is None:
            found = await self.find_read_addr(broker_name, topic)
        return found[0]

    async def find_master_addr(self, broker_name: str, topic: str | None = None) -> str:
        """The master's address, refreshing the topic's route once if unknown.

        Raises:
            MQClientError: the broker is unknown or has no master.
        """
        addr = self.master_addr(broker_name)
        if addr is None and topic is not None:
            await self.update_topic_route(topic)
            addr = self.master_addr(broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{broker_name}] not exist (no master address known)")
        return addr

    def _apply_route(self, topic: str, route: TopicRouteData) -> None:
        self.route_table[topic] = route
        known = set(self.all_broker_addrs())
        for name, addrs in broker_addr_table(route).items():
            self.broker_addrs[name] = addrs
        if set(self.all_broker_addrs()) - known and self._nursery is not None:
            # A broker we never heartbeated: tell it about our groups now, or its
            # consumer list (used by rebalance) would miss us for up to 30 s.
            self._nursery.start_soon(self.send_heartbeat_to_all_brokers)
        self.publish_info[topic] = TopicPublishInfo.from_route(topic, route)

    async def update_topic_route(self, topic: str, *, use_default: bool = False) -> bool:
        """Fetch the topic's route from the NameServer and cache it.

        Args:
            topic: the topic.
            use_default: with no route, publish through the auto-create
                template's route (TBW102), queues capped as RocketMQ does.

        Returns:
            True if a route (real or default) is now cached.
        """
        async with self._route_lock:
            route = await self.api.get_topic_route(topic)
            if route is not None:
                self._apply_route(topic, route)
                return True
            if not use_default:
                return False
            default = await self.api.get_topic_route(self.config.create_topic_key)
            if default is None:
                return False
            self.route_table[self.config.create_topic_key] = default
            for qd in default.queue_datas:
                n = min(self.config.default_topic_queue_nums, qd.read_queue_nums)
                qd.read_queue_nums = n
                qd.write_queue_nums = n
            for name, addrs in broker_addr_table(default).items():
                self.broker_addrs[name] = addrs
            self.publish_info[topic] = TopicPublishInfo.from_route(topic, default)
            log.info("using_default_topic_route", topic=topic)
            return True

    async def get_publish_info(self, topic: str) -> TopicPublishInfo:
        """The topic's publish queues (cache, else NameServer, else TBW102 if allowed).

        Raises:
            NoRouteError: no route and auto-create is off or unavailable.
        """
        info = self.publish_info.get(topic)
        if info is not None and info.ok():
            return info
        found = await self.update_topic_route(topic)
        info = self.publish_info.get(topic)
        if (not found or info is None or not info.ok()) and self.config.auto_create_topic:
            await self.update_topic_route(topic, use_default=True)
            info = self.publish_info.get(topic)
        if info is None or not info.ok():
            raise NoRouteError(topic)
        return info

    async def get_subscribe_queues(
        self, topic: str, *, refresh: bool = False
    ) -> list[MessageQueue]:
        """The topic's readable queues.

        Raises:
            NoRouteError: the NameServer does not know the topic.
        """
        route = self.route_table.get(topic)
        if route is None or refresh:
            if not await self.update_topic_route(topic):
                raise NoRouteError(topic)
            route = self.route_table[topic]
        return subscribe_queues(topic, route)

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str]:
        """The group's client ids as seen by one broker serving the topic."""
        route = self.route_table.get(topic)
        if route is None:
            return []
        names = [b.broker_name for b in route.broker_datas]
        self._rng.shuffle(names)
        for name in names:
            addr = self.any_addr(name)
            if addr is None:
                continue
            try:
                return await self.api.get_consumer_id_list(addr, group)
            except Exception as exc:
                log.warning("get_consumer_list_failed", addr=addr, error=str(exc))
        return []

    def _topics_in_use(self) -> set[str]:
        topics = {t for t in self.publish_info if self.publish_info[t].ok()}
        for c in self.consumers.values():
            topics |= c.subscribed_topics()
        return topics

    async def refresh_routes(self) -> None:
        """Refresh every route in use, then forget brokers no route mentions any more."""
        ok = True
        in_use = self._topics_in_use()
        for topic in sorted(in_use):
            try:
                await self.update_topic_route(topic)
            except Exception as exc:
                ok = False
                log.warning("route_refresh_failed", topic=topic, error=str(exc))
        routes = [
            r
            for t, r in self.route_table.items()
            if t in in_use or t == self.config.create_topic_key
        ]
        if ok and routes:
            live: dict[str, dict[int, str]] = {}
            for route in routes:
                live.update(broker_addr_table(route))
            self.broker_addrs = live

    # -- heartbeats ---------------------------------------------------------------
    def heartbeat_data(self) -> bodies.HeartbeatData:
        producers = [bodies.ProducerData(group_name=g) for g in sorted(self.producers)]
        if CLIENT_INNER_PRODUCER_GROUP not in self.producers:
            producers.append(bodies.ProducerData(group_name=CLIENT_INNER_PRODUCER_GROUP))
        return bodies.HeartbeatData(
            client_id=self.client_id,
            producer_data_set=producers,
            consumer_data_set=[c.consumer_data() for c in self.consumers.values()],
        )

    async def send_heartbeat_to_all_brokers(self) -> None:
        """One heartbeat to every known broker address (masters and slaves)."""
        if not self.producers and not self.consumers:
            return
        data = self.heartbeat_data()
        for addr in self.all_broker_addrs():
            try:
                await self.api.send_heartbeat(addr, data)
            except Exception as exc:
                log.warning("heartbeat_failed", addr=addr, error=str(exc))

    # -- rebalance -----------------------------------------------------------------
    def rebalance_immediately(self) -> None:
        """Wake the rebalance task now (new consumer, membership change)."""
        self._rebalance_wakeup.set()

    async def do_rebalance(self) -> None:
        for c in list(self.consumers.values()):
            try:
                await c.do_rebalance()
            except Exception as exc:
                log.warning("rebalance_failed", group=c.group, error=str(exc))

    async def persist_all_offsets(self) -> None:
        for c in list(self.consumers.values()):
            try:
                await c.persist_offsets()
            except Exception as exc:
                log.warning("persist_offsets_failed", group=c.group, error=str(exc))

    # -- periodic tasks ------------------------------------------------------------
    async def _periodic(self, first_s: float, every_s: float, fn: Callable[[], object]) -> None:
        await trio.sleep(first_s)
        while True:
            try:
                result = fn()
                if hasattr(result, "__await__"):
                    await result
            except Exception as exc:
                log.warning(
                    "periodic_task_failed", task=getattr(fn, "__name__", "?"), error=str(exc)
                )
            await trio.sleep(every_s)

    async def _route_loop(self) -> None:
        await self._periodic(
            0.01, self.config.poll_name_server_interval_ms / 1000, self.refresh_routes
        )

    async def _heartbeat_loop(self) -> None:
        await self._periodic(
            1.0, self.config.heartbeat_broker_interval_ms / 1000, self.send_heartbeat_to_all_brokers
        )

    async def _persist_loop(self) -> None:
        every = self.config.persist_consumer_offset_interval_ms / 1000
        await self._periodic(min(10.0, every), every, self.persist_all_offsets)

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.rebalance_interval_ms / 1000):
                await self._rebalance_wakeup.wait()
            self._rebalance_wakeup = trio.Event()
            await self.do_rebalance()

    # -- broker-initiated requests ---------------------------------------------------
    async def _on_notify_consumer_ids_changed(
        self, conn: object, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        group = cmd.field("consumerGroup")
        log.info("consumer_ids_changed", group=group)
        self.rebalance_immediately()
        return None

    async def _on_reset_consumer_offset(
        self, conn: object, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        try:
            h = headers.ResetOffsetRequestHeader.from_fields(cmd.ext_fields)
            body = bodies.ResetOffsetBody.from_json(cmd.body_bytes())
        except Exception as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad reset request: {exc}")
        consumer = self.consumers.get(h.group)
        if consumer is not None:
            table = {
                MessageQueue(k.topic, k.broker_name, k.queue_id): v
                for k, v in body.offset_table.items()
            }
            await consumer.reset_offsets(h.topic, table)
        return None if cmd.is_oneway else cmd.make_response()

    async def _on_check_transaction_state(
        self, conn: object, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """CHECK_TRANSACTION_STATE (39, oneway): ask the half message's producer group."""
        try:
            h = headers.CheckTransactionStateRequestHeader.from_fields(cmd.ext_fields)
            msgs = decode_messages(cmd.body_bytes())
        except Exception as exc:
            log.warning("bad_check_transaction_request", error=str(exc))
            return None
        if not msgs:
            return None
        msg = msgs[0]
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP, "")
        producer = self.producers.get(group)
        checker = getattr(producer, "check_transaction_state", None)
        if checker is None:
            log.warning("check_transaction_no_producer", group=group)
            return None
        if self._nursery is not None:
            self._nursery.start_soon(checker, conn, msg, h)
        return None

    async def _on_get_consumer_status(
        self, conn: object, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        return cmd.make_response(ResponseCode.SUCCESS)

    async def _on_consume_message_directly(
        self, conn: object, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """CONSUME_MESSAGE_DIRECTLY (309, sent on by a broker for `mqadmin queryMsgByUniqueKey
        -g -d`): the group's push consumer consumes the message in the body once."""
        group = cmd.field("consumerGroup") or ""
        direct = getattr(self.consumers.get(group), "consume_message_directly", None)
        if direct is None:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer Group <{group}> not exist in this consumer",
            )
        try:
            msgs = decode_messages(cmd.body_bytes())
        except Exception as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad message body: {exc}")
        if len(msgs) != 1:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR, f"the body holds {len(msgs)} messages, not 1"
            )
        result = await direct(msgs[0], cmd.field("brokerName") or "")
        return cmd.make_response(body=bodies.dumps(result))

    async def _on_get_consumer_running_info(
        self, conn: object, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """GET_CONSUMER_RUNNING_INFO (307, sent on by a broker for `mqadmin consumerStatus`)."""
        group = cmd.field("consumerGroup") or ""
        consumer = self.consumers.get(group)
        if consumer is None:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer Group <{group}> not exist in this consumer",
            )
        jstack = (cmd.field("jstackEnable") or "").lower() == "true"
        start = self.consumer_start_ms.get(group, 0)
        return cmd.make_response(
            body=running_info(consumer, self.config, start_ms=start, jstack=jstack)
        )

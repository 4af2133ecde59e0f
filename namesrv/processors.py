"""NameServer request processors: one handler per request code, over a RouteTable and a KVConfig.

Handlers are `remoting.Processor`s (`async def (conn, cmd) -> RemotingCommand`) that never
wait: the work is plain dictionary updates, so they are registered inline (the connection's
reader runs them, no task per request). A malformed
header or body is answered with SYSTEM_ERROR and a remark naming the problem;
the connection stays open. Every body written is standard JSON, whatever the
request's serialize type (the response header follows the request's type).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog
import trio

from common.acl import Account, AclChecker, AclError
from common.config import parse_properties
from namesrv.config import NamesrvConfig, camel, runtime_changes
from namesrv.kv_config import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfig
from namesrv.route_table import RouteTable
from remoting import Connection, Processor, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import HeaderError
from remoting.protocol.route import (
    DataVersion,
    RegisterBrokerBody,
    RouteDecodeError,
    TopicConfigSerializeWrapper,
    TopicList,
)

log = structlog.get_logger()

# The extField a 5.x broker started with `rocketmq.zone` sends on REGISTER_BROKER.
ZONE_NAME_FIELD = "__ZONE_NAME"

# Connection attribute holding the broker addresses registered over a connection.
ATTR_BROKER_ADDRS = "namesrv.broker_addrs"


class ConnectionLike(Protocol):
    """What the processors use of a `remoting.Connection`."""

    @property
    def id(self) -> int: ...

    @property
    def attributes(self) -> dict[str, object]: ...


Handler = Processor


def monotonic_ms() -> int:
    """The clock the NameServer keeps broker liveness on (trio's, in ms)."""
    return int(trio.current_time() * 1000)


# -- header helpers -----------------------------------------------------------------


def _fields(cmd: RemotingCommand) -> Mapping[str, str]:
    return cmd.ext_fields or {}


def _req_str(f: Mapping[str, str], name: str) -> str:
    v = f.get(name)
    if v is None:
        raise HeaderError(name, "missing")
    return v


def _opt_str(f: Mapping[str, str], name: str) -> str | None:
    return f.get(name)


def _int_field(f: Mapping[str, str], name: str, default: int | None = None) -> int:
    v = f.get(name)
    if v is None or v == "":
        if default is None:
            raise HeaderError(name, "missing")
        return default
    try:
        return int(v)
    except ValueError:
        raise HeaderError(name, f"not an integer: {v!r}") from None


def _bool_field(f: Mapping[str, str], name: str) -> bool:
    v = f.get(name)
    return v is not None and v.strip().lower() == "true"


def body_crc32(body: bytes) -> int:
    """RocketMQ's body checksum: CRC32 masked to a non-negative int32."""
    return zlib.crc32(body) & 0x7FFFFFFF


class NamesrvProcessors:
    """The NameServer's handlers, bound to its state.

    Args:
        route_table: the routing state.
        kv: the KV configuration table.
        order_message_enable: add `orderTopicConf` to routes from the KV table.
        now_ms: the clock (ms) used for broker liveness.
        on_register: called with (connection, broker addr) after each registration,
            so the server can map connections to brokers.
    """

    def __init__(
        self,
        route_table: RouteTable,
        kv: KVConfig,
        *,
        order_message_enable: bool = False,
        now_ms: Callable[[], int] = monotonic_ms,
        config: NamesrvConfig | None = None,
    ) -> None:
        self.route_table = route_table
        # The server's settings, for GET/UPDATE_NAMESRV_CONFIG (None: those answer an error).
        self.config = config
        self.kv = kv
        self.order_message_enable = order_message_enable
        self._now_ms = now_ms
        # Set by the server when ACL is on: registrations that displace a live broker then
        # need that cluster's broker account (`_claim_refusal`).
        self.acl: AclChecker | None = None

    def handlers(self) -> dict[int, Handler]:
        """Request code -> handler, all registrations in one place."""
        table: dict[int, Callable[[Any, RemotingCommand], RemotingCommand]] = {
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kvlist_by_namespace,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_routeinfo_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm_of_broker,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm_of_broker,
            RequestCode.GET_NAMESRV_CONFIG: self.get_namesrv_config,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_namesrv_config,
        }
        return {code: self._wrap(fn) for code, fn in table.items()}

    @staticmethod
    def _wrap(fn: Callable[[Any, RemotingCommand], RemotingCommand]) -> Handler:
        async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
            try:
                return fn(conn, cmd)
            except HeaderError as exc:
                log.warning("namesrv_bad_header", code=cmd.code, field=exc.field, reason=exc.reason)
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad request header: {exc}")
            except RouteDecodeError as exc:
                log.warning("namesrv_bad_body", code=cmd.code, error=str(exc))
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad request body: {exc}")

        handler.__name__ = getattr(fn, "__name__", "handler")
        return handler

    # -- KV config --------------------------------------------------------------------
    def put_kv_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        ns, key, value = _req_str(f, "namespace"), _req_str(f, "key"), _req_str(f, "value")
        self.kv.put(ns, key, value)
        log.info("namesrv_kv_put", namespace=ns, key=key)
        return cmd.make_response()

    def get_kv_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        ns, key = _req_str(f, "namespace"), _req_str(f, "key")
        value = self.kv.get(ns, key)
        if value is None:
            return cmd.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {key}"
            )
        return cmd.make_response(ext_fields={"value": value})

    def delete_kv_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        ns, key = _req_str(f, "namespace"), _req_str(f, "key")
        if self.kv.delete(ns, key):
            log.info("namesrv_kv_delete", namespace=ns, key=key)
        return cmd.make_response()

    def get_kvlist_by_namespace(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        ns = _req_str(_fields(cmd), "namespace")
        body = self.kv.kv_table_json(ns)
        if body is None:
            return cmd.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns}"
            )
        return cmd.make_response(body=body)

    # -- brokers ----------------------------------------------------------------------
    def register_broker(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        broker_name = _req_str(f, "brokerName")
        broker_addr = _req_str(f, "brokerAddr")
        cluster = _req_str(f, "clusterName")
        ha_addr = _opt_str(f, "haServerAddr") or ""
        broker_id = _int_field(f, "brokerId")
        compressed = _bool_field(f, "compressed")
        crc = _int_field(f, "bodyCrc32", 0)
        body = cmd.body_bytes()
        if crc != 0 and body_crc32(body) != crc:
            log.warning("namesrv_register_crc_mismatch", broker_addr=broker_addr, expected=crc)
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        if body:
            reg = RegisterBrokerBody.decode(body, compressed=compressed)
        else:
            reg = RegisterBrokerBody(TopicConfigSerializeWrapper({}, DataVersion(0, 0)), [])
        wrapper = reg.topic_config_serialize_wrapper
        refusal = self._claim_refusal(
            conn, cmd, f, cluster, broker_name, broker_id, broker_addr, unregister=False
        )
        if refusal is not None:
            return refusal
        result = self.route_table.register_broker(
            cluster=cluster,
            broker_addr=broker_addr,
            broker_name=broker_name,
            broker_id=broker_id,
            ha_server_addr=ha_addr,
            data_version=wrapper.data_version,
            topic_configs=wrapper.topic_config_table.values(),
            filter_server_list=reg.filter_server_list,
            channel_id=getattr(conn, "id", None),
            enable_acting_master=_bool_field(f, "enableActingMaster")
            if "enableActingMaster" in f
            else None,
            zone_name=_opt_str(f, ZONE_NAME_FIELD),
            now_ms=self._now_ms(),
        )
        attrs = getattr(conn, "attributes", None)
        if isinstance(attrs, dict):
            addrs = attrs.setdefault(ATTR_BROKER_ADDRS, set())
            if isinstance(addrs, set):
                addrs.add(broker_addr)
        if result.first_time or result.topics_changed:
            log.info(
                "namesrv_broker_registered",
                cluster=cluster,
                broker_name=broker_name,
                broker_id=broker_id,
                broker_addr=broker_addr,
                first_time=result.first_time,
                topics=len(wrapper.topic_config_table) if result.topics_changed else None,
                data_version=wrapper.data_version.counter,
            )
        else:
            log.debug("namesrv_broker_heartbeat", broker_addr=broker_addr)
        ext: dict[str, str] = {}
        if result.ha_server_addr is not None:
            ext["haServerAddr"] = result.ha_server_addr
        if result.master_addr is not None:
            ext["masterAddr"] = result.master_addr
        return cmd.make_response(
            ext_fields=ext or None,
            body=self.kv.kv_table_json(NAMESPACE_ORDER_TOPIC_CONFIG),
        )

    def unregister_broker(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        broker_name = _req_str(f, "brokerName")
        broker_addr = _req_str(f, "brokerAddr")
        cluster = _req_str(f, "clusterName")
        broker_id = _int_field(f, "brokerId")
        refusal = self._claim_refusal(
            conn, cmd, f, cluster, broker_name, broker_id, broker_addr, unregister=True
        )
        if refusal is not None:
            return refusal
        removed = self.route_table.unregister_broker(
            cluster=cluster, broker_addr=broker_addr, broker_name=broker_name, broker_id=broker_id
        )
        log.info(
            "namesrv_broker_unregistered",
            cluster=cluster,
            broker_name=broker_name,
            broker_id=broker_id,
            broker_addr=broker_addr,
            known=removed is not None,
            broker_gone=removed.broker_gone if removed is not None else False,
        )
        return cmd.make_response()

    def _claim_refusal(
        self,
        conn: Any,
        cmd: RemotingCommand,
        f: Mapping[str, str],
        cluster: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        *,
        unregister: bool,
    ) -> RemotingCommand | None:
        """With ACL on: a broker account limited to some clusters acts only in those; and a
        request that would replace, move or remove a live broker must be signed by a broker
        account of every cluster involved (an admin account or a white-listed address is not
        enough). A broker removing its own address over the connection that registered it
        needs no more than the request's ACL check. None: go on; else the refusal."""
        if self.acl is None:
            return None
        what = "UNREGISTER_BROKER" if unregister else "REGISTER_BROKER"
        claim = self.route_table.claim(
            cluster=cluster,
            broker_name=broker_name,
            broker_id=broker_id,
            broker_addr=broker_addr,
            unregister=unregister,
            channel_id=getattr(conn, "id", None),
        )
        if unregister and self.route_table.channel_of(broker_addr) == getattr(conn, "id", None):
            claim.displaced.clear()
        account: Account | None = None
        why = ""
        try:
            account = self.acl.signing_account(f, cmd.body)
        except AclError as exc:
            why = exc.remark
        clusters = ", ".join(sorted(claim.clusters))
        if account is not None and account.broker:
            outside = sorted(c for c in claim.clusters if not account.is_broker_of(c))
            if outside:
                remark = (
                    f"ACL: {what} of {broker_name} touches cluster {', '.join(outside)}; the"
                    f" broker account accessKey={account.access_key} is not of that cluster"
                )
                return self._refuse(conn, cmd, remark)
            return None
        if not claim.displaced:
            return None
        if account is not None:
            why = f"accessKey={account.access_key} is not a broker account"
        remark = (
            f"ACL: {what} of {broker_name} at {broker_addr} would displace the live"
            f" {'; '.join(claim.displaced)}: only a broker account of cluster {clusters} may"
            f" do that ({why})"
        )
        return self._refuse(conn, cmd, remark)

    @staticmethod
    def _refuse(conn: Any, cmd: RemotingCommand, remark: str) -> RemotingCommand:
        log.warning(
            "namesrv_registration_refused",
            peer=getattr(conn, "remote_address", None),
            remark=remark,
        )
        return cmd.make_response(ResponseCode.NO_PERMISSION, remark)

    def query_data_version(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        broker_addr = _req_str(f, "brokerAddr")
        dv = DataVersion.from_json(cmd.body_bytes()) if cmd.body else DataVersion()
        changed, held = self.route_table.query_data_version(broker_addr, dv, self._now_ms())
        return cmd.make_response(
            ext_fields={"changed": "true" if changed else "false"},
            body=held.to_json() if held is not None else None,
        )

    # -- routes -----------------------------------------------------------------------
    def get_routeinfo_by_topic(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        topic = _req_str(_fields(cmd), "topic")
        route = self.route_table.pick_route(topic)
        if route is None:
            return cmd.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        if self.order_message_enable:
            route.order_topic_conf = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        return cmd.make_response(body=route.to_json())

    def get_broker_cluster_info(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=self.route_table.cluster_info().to_json())

    def get_all_topic_list(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=TopicList(self.route_table.all_topics()).to_json())

    def get_topics_by_cluster(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _req_str(_fields(cmd), "cluster")
        topics = self.route_table.topics_by_cluster(cluster)
        return cmd.make_response(body=TopicList(topics).to_json())

    def delete_topic_in_namesrv(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        f = _fields(cmd)
        topic = _req_str(f, "topic")
        cluster = _opt_str(f, "clusterName") or None
        removed = self.route_table.delete_topic(topic, cluster)
        log.info("namesrv_topic_deleted", topic=topic, cluster=cluster, existed=removed)
        return cmd.make_response()

    def wipe_write_perm_of_broker(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        broker_name = _req_str(_fields(cmd), "brokerName")
        count = self.route_table.wipe_write_perm(broker_name)
        log.info("namesrv_write_perm_wiped", broker_name=broker_name, topics=count)
        return cmd.make_response(ext_fields={"wipeTopicCount": str(count)})

    def add_write_perm_of_broker(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        broker_name = _req_str(_fields(cmd), "brokerName")
        count = self.route_table.add_write_perm(broker_name)
        log.info("namesrv_write_perm_added", broker_name=broker_name, topics=count)
        return cmd.make_response(ext_fields={"addTopicCount": str(count)})

    # -- configuration ----------------------------------------------------------------
    def get_namesrv_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """GET_NAMESRV_CONFIG (319): the settings as `key=value` lines (camelCase names)."""
        if self.config is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "no configuration to show")
        values = self.config.model_dump()
        lines = [f"{camel(k)}={'' if v is None else v}" for k, v in sorted(values.items())]
        return cmd.make_response(body=("\n".join(lines) + "\n").encode())

    def update_namesrv_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """UPDATE_NAMESRV_CONFIG (318): body `key=value` lines; all are checked before any is
        applied. Only the settings read on every use change (`namesrv.config.RUNTIME_KEYS`);
        the change lasts until the NameServer stops (it has no file of its own to write)."""
        if self.config is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "no configuration to change")
        body = cmd.body_bytes()
        if len(body) > MAX_CONFIG_BODY:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "the config body is too large")
        try:
            pairs = parse_properties(body.decode("utf-8"))
            changes = runtime_changes(self.config, pairs)
        except KeyError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc.args[0]))
        except PermissionError as exc:
            return cmd.make_response(ResponseCode.NO_PERMISSION, str(exc))
        except (UnicodeDecodeError, ValueError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad config: {exc}")
        if not changes:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "no key=value in the request body")
        for name, value in changes.items():
            setattr(self.config, name, value)
            if name == "order_message_enable":
                self.order_message_enable = value
        log.info("namesrv_config_updated", changes=changes)
        return cmd.make_response()


MAX_CONFIG_BODY = 64 * 1024

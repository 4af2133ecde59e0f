"""ACL per request family on a live NameServer and broker (127.0.0.1): for each family the
account that holds the permission is served and the others are refused NO_PERMISSION, with a
remark naming the account and never a secret; signatures over unicode values, a binary body and
no body verify, and a body or field changed after signing does not; the hijacks of an open
cluster (a subscription group disabled, a route taken over by registering and disconnecting)
change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.acl import RequestSigner
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.bodies import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    SubscriptionGroupConfig,
)
from remoting.protocol.headers import (
    CreateTopicRequestHeader,
    GetMaxOffsetRequestHeader,
    QueryConsumerOffsetRequestHeader,
    RegisterBrokerRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from remoting.protocol.route import RegisterBrokerBody, TopicConfigSerializeWrapper
from tests.helpers import free_port, json_request
from tests.integration.test_broker_process import pull_request, send_request

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("staging_guard")]

ACL = """
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret
    topicPerms: [FamT=PUB]
  - accessKey: consumer-ak
    secretKey: consumer-secret
    topicPerms: [FamT=SUB]
    groupPerms: [FamG=SUB]
  - accessKey: nobody-ak
    secretKey: nobody-secret
  - accessKey: broker-ak
    secretKey: broker-secret
    broker: true
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""

SECRETS = {
    "producer-ak": "producer-secret",
    "consumer-ak": "consumer-secret",
    "nobody-ak": "nobody-secret",
    "broker-ak": "broker-secret",
    "admin-ak": "admin-secret",
}
UNSIGNED = ""
WRONG_SECRET = "wrong-secret"


def _offset_query() -> RemotingCommand:
    hdr = QueryConsumerOffsetRequestHeader(consumer_group="FamG", topic="FamT", queue_id=0)
    return RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, hdr.to_fields())


def _offset_update(group: str = "FamG") -> RemotingCommand:
    hdr = UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic="FamT", queue_id=0, commit_offset=0
    )
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, hdr.to_fields())


def _max_offset() -> RemotingCommand:
    hdr = GetMaxOffsetRequestHeader(topic="FamT", queue_id=0)
    return RemotingCommand.request(RequestCode.GET_MAX_OFFSET, hdr.to_fields())


def _heartbeat() -> RemotingCommand:
    body = HeartbeatData(
        client_id="127.0.0.1@fam",
        consumer_data_set=[
            ConsumerData(group_name="FamG", subscription_data_set=[SubscriptionData("FamT")])
        ],
    ).to_json()
    return json_request(RequestCode.HEART_BEAT, None, body)


def _disable_group() -> RemotingCommand:
    body = SubscriptionGroupConfig(group_name="FamG", consume_enable=False).to_json()
    return json_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body)


def _create_topic(name: str) -> RemotingCommand:
    hdr = CreateTopicRequestHeader(
        topic=name,
        default_topic="TBW102",
        read_queue_nums=4,
        write_queue_nums=4,
        perm=6,
        topic_filter_type="SINGLE_TAG",
    )
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, hdr.to_fields())


# family, request, the accounts served, the accounts refused
FAMILIES: list[tuple[str, Callable[[], RemotingCommand], list[str], list[str]]] = [
    (
        "send",
        lambda: send_request("FamT", b"hello"),
        ["producer-ak", "admin-ak"],
        ["consumer-ak", "nobody-ak", "broker-ak", UNSIGNED, WRONG_SECRET],
    ),
    (
        "pull",
        lambda: pull_request("FamT", 0, group="FamG", suspend_ms=0),
        ["consumer-ak"],
        ["producer-ak", "nobody-ak", UNSIGNED, WRONG_SECRET],
    ),
    ("query offset", _offset_query, ["consumer-ak"], ["producer-ak", "nobody-ak", UNSIGNED]),
    ("update offset", _offset_update, ["consumer-ak"], ["producer-ak", "nobody-ak", UNSIGNED]),
    (
        "another group's offset",
        lambda: _offset_update("VictimG"),
        ["admin-ak"],
        ["consumer-ak", "producer-ak", UNSIGNED],
    ),
    (
        "queue offsets",
        _max_offset,
        ["consumer-ak", "producer-ak"],
        ["nobody-ak", "broker-ak", UNSIGNED],
    ),
    ("consumer heartbeat", _heartbeat, ["consumer-ak"], ["producer-ak", "nobody-ak", UNSIGNED]),
    (
        "topic administration",
        lambda: _create_topic("FamNew"),
        ["admin-ak"],
        ["producer-ak", "consumer-ak", "broker-ak", UNSIGNED],
    ),
    (
        "broker configuration",
        lambda: RemotingCommand.request(RequestCode.GET_BROKER_CONFIG),
        ["admin-ak"],
        ["producer-ak", "consumer-ak", "broker-ak", UNSIGNED],
    ),
]


def _as(account: str, cmd: RemotingCommand) -> RemotingCommand:
    if account == UNSIGNED:
        return cmd
    if account == WRONG_SECRET:
        RequestSigner("producer-ak", WRONG_SECRET)(cmd)
        return cmd
    RequestSigner(account, SECRETS[account])(cmd)
    return cmd


@asynccontextmanager
async def _servers(tmp_path: Path) -> AsyncIterator[tuple[NameServer, BrokerController]]:
    """A NameServer and a broker with ACL on (the accounts of `ACL`); the broker signs with
    its broker account."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    ns_cfg = NamesrvConfig(listen="127.0.0.1:0", acl_enable=True, acl_file=str(acl_file))
    async with NameServer(ns_cfg) as ns:
        broker_cfg = BrokerConfig(
            listen=f"127.0.0.1:{free_port()}",
            store_dir=str(tmp_path / "store"),
            namesrv_addr=ns.address,
            mapped_file_size_commitlog=64 * 1024,
            acl_enable=True,
            acl_file=str(acl_file),
            acl_access_key="broker-ak",
            acl_secret_key="broker-secret",
        )
        async with BrokerController(broker_cfg) as broker:
            yield ns, broker


async def test_each_request_family_serves_its_accounts_only(tmp_path: Path) -> None:
    async with _servers(tmp_path) as (_ns, broker), RemotingClient() as raw:
        addr = f"127.0.0.1:{broker.port}"

        async def call(cmd: RemotingCommand) -> RemotingCommand:
            return await raw.invoke(addr, cmd, 5000)

        assert (await call(_as("admin-ak", _create_topic("FamT")))).code == 0
        wrong: list[str] = []
        for family, make, served, refused in FAMILIES:
            for account in served:
                resp = await call(_as(account, make()))
                if resp.code == ResponseCode.NO_PERMISSION:
                    wrong.append(f"{family}: {account} refused: {resp.remark}")
            for account in refused:
                resp = await call(_as(account, make()))
                remark = resp.remark or ""
                if resp.code != ResponseCode.NO_PERMISSION:
                    wrong.append(f"{family}: {account or 'unsigned'} got {resp.code}")
                elif any(secret in remark for secret in (*SECRETS.values(), WRONG_SECRET)):
                    wrong.append(f"{family}: a secret in the remark {remark!r}")
                elif account not in (UNSIGNED, WRONG_SECRET) and account not in remark:
                    wrong.append(f"{family}: the remark does not name {account}: {remark}")
        assert wrong == []

        # The hijack: a consumer account disabling its own group's consumption.
        assert (await call(_as("consumer-ak", _disable_group()))).code == 16
        group = broker.subscriptions.get("FamG")
        assert group is None or group.consume_enable

        # Signatures over unicode values, a binary body, no body; tampering after signing.
        props = {"KEYS": "ключ-键-🔑", "note": "ä ö ü"}
        binary = bytes(range(256)) * 4
        unicode_send = send_request("FamT", binary, props=props)
        assert (await call(_as("producer-ak", unicode_send))).code == 0
        assert (await call(_as("consumer-ak", _offset_query()))).code == 0
        tampered = _as("producer-ak", send_request("FamT", b"signed body"))
        tampered.body = b"another body"
        assert (await call(tampered)).code == 16
        changed = _as("producer-ak", send_request("FamT", b"x"))
        assert changed.ext_fields is not None
        changed.ext_fields["queueId"] = "1"
        assert (await call(changed)).code == 16


async def test_registering_and_disconnecting_does_not_remove_a_broker(tmp_path: Path) -> None:
    async with _servers(tmp_path) as (ns, broker):
        real = f"127.0.0.1:{broker.port}"
        body = RegisterBrokerBody(TopicConfigSerializeWrapper({}), []).encode()
        for signer in (UNSIGNED, "producer-ak", "admin-ak"):
            fields = RegisterBrokerRequestHeader(
                broker_name=broker.config.broker_name,
                broker_addr=real,
                cluster_name="DefaultCluster",
                ha_server_addr="",
                broker_id=0,
            ).to_fields()
            cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, dict(fields), body)
            async with RemotingClient() as attacker:
                resp = await attacker.invoke(ns.address, _as(signer, cmd))
            assert resp.code == ResponseCode.NO_PERMISSION, signer
        # The attacker's connections are closed: the real broker is still routed.
        await trio.sleep(0.2)
        bd = ns.route_table.broker_addr_table[broker.config.broker_name]
        assert bd.broker_addrs == {0: real}
        assert real in ns.route_table.broker_live_table

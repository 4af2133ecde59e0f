"""ACL on a NameServer and a broker, in process on 127.0.0.1: signed clients get what their
accounts allow; the hijacks an open cluster allowed (a topic deleted, another group's offset
reset, a route pointed at a fake broker) are refused NO_PERMISSION from a plain socket client
and from an account without the right; the broker registers with its own broker account; the
accounts file reloads, and a bad file keeps the last good one."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from client import Admin, ClientConfig, Message, Producer, SendStatus
from client.errors import MQClientError
from common.acl import AclFileError, RequestSigner
from common.exceptions import exception_leaves
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import (
    DeleteTopicRequestHeader,
    RegisterBrokerRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from remoting.protocol.route import RegisterBrokerBody, TopicConfigSerializeWrapper
from tests.helpers import free_port, wait_until
from tests.integration.test_broker_process import send_request

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("staging_guard")]

ACL = """
accounts:
  - accessKey: producer-ak
    secretKey: producer-sk
    defaultTopicPerm: DENY
    topicPerms:
      - AclT=PUB
  - accessKey: consumer-ak
    secretKey: consumer-sk
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: broker-ak
    secretKey: broker-sk
    broker: true
  - accessKey: admin-ak
    secretKey: admin-sk
    admin: true
"""

NO_PERMISSION = 16


def _signed(cmd: RemotingCommand, ak: str, sk: str) -> RemotingCommand:
    RequestSigner(ak, sk)(cmd)
    return cmd


async def test_acl_on_namesrv_and_broker(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    ns_cfg = NamesrvConfig(
        listen="127.0.0.1:0", acl_enable=True, acl_file=str(acl_file), acl_reload_interval_ms=100
    )
    async with NameServer(ns_cfg) as ns, RemotingClient() as raw:
        broker_cfg = BrokerConfig(
            listen=f"127.0.0.1:{free_port()}",
            store_dir=str(tmp_path / "store"),
            namesrv_addr=ns.address,
            mapped_file_size_commitlog=64 * 1024,
            acl_enable=True,
            acl_file=str(acl_file),
            acl_reload_interval_ms=100,
            acl_access_key="broker-ak",
            acl_secret_key="broker-sk",
            register_name_server_period_ms=500,
        )
        async with BrokerController(broker_cfg) as broker:
            baddr = f"127.0.0.1:{broker.port}"
            # The broker registered with its own (signed) account.
            assert broker.registration.last_ok == {ns.address: True}

            admin_cfg = ClientConfig(
                namesrv_addr=ns.address, access_key="admin-ak", secret_key="admin-sk"
            )
            async with Admin(admin_cfg) as admin:
                await admin.create_topic("AclT", cluster="DefaultCluster")
                await admin.create_topic("OtherT", cluster="DefaultCluster")

            # An allowed send; a denied topic; a wrong secret; no signature at all.
            pcfg = ClientConfig(
                namesrv_addr=ns.address, access_key="producer-ak", secret_key="producer-sk"
            )
            async with Producer("PG", pcfg) as producer:
                with trio.fail_after(20):
                    while True:  # the route appears once the broker re-registered
                        try:
                            result = await producer.send(Message("AclT", b"allowed"))
                            break
                        except MQClientError:
                            await trio.sleep(0.2)
                assert result.status is SendStatus.SEND_OK
            denied = await raw.invoke(
                baddr, _signed(send_request("OtherT", b"x"), "producer-ak", "producer-sk")
            )
            assert denied.code == NO_PERMISSION
            assert "producer-ak" in (denied.remark or "")
            assert "OtherT" in (denied.remark or "")
            assert "producer-sk" not in (denied.remark or "")
            wrong = await raw.invoke(
                baddr, _signed(send_request("AclT", b"x"), "producer-ak", "not-the-secret")
            )
            assert wrong.code == NO_PERMISSION
            unsigned = await raw.invoke(baddr, send_request("AclT", b"x"))
            assert unsigned.code == NO_PERMISSION

            # The hijacks of an open cluster, from a plain socket and from a consumer account.
            delete = RemotingCommand.request(
                RequestCode.DELETE_TOPIC_IN_BROKER,
                DeleteTopicRequestHeader(topic="AclT").to_fields(),
            )
            assert (await raw.invoke(baddr, delete)).code == NO_PERMISSION
            reset = UpdateConsumerOffsetRequestHeader(
                consumer_group="victim", topic="AclT", queue_id=0, commit_offset=0
            )
            cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, reset.to_fields())
            assert (await raw.invoke(baddr, cmd)).code == NO_PERMISSION
            assert broker.topics.get("AclT") is not None
            body = RegisterBrokerBody(TopicConfigSerializeWrapper({}), []).encode()
            fake = RegisterBrokerRequestHeader(
                broker_name=broker_cfg.broker_name,
                broker_addr="127.0.0.1:1",
                cluster_name="DefaultCluster",
                ha_server_addr="",
                broker_id=0,
            ).to_fields()
            for signer in (None, ("consumer-ak", "consumer-sk"), ("producer-ak", "producer-sk")):
                req = RemotingCommand.request(RequestCode.REGISTER_BROKER, dict(fake), body)
                if signer is not None:
                    _signed(req, *signer)
                assert (await raw.invoke(ns.address, req)).code == NO_PERMISSION
            route = ns.route_table.pick_route("AclT")
            assert route is not None
            assert [b.broker_addrs for b in route.broker_datas] == [{0: baddr}]
            # Route reads stay open.
            query = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "AclT"})
            assert (await raw.invoke(ns.address, query)).code == ResponseCode.SUCCESS

            # The file changes: a bad one keeps the last good accounts, a good one applies.
            acl_file.write_text(ACL + "  - accessKey: x\n")
            await trio.sleep(0.5)
            assert broker.acl is not None
            assert "producer-ak" in broker.acl.rules.accounts
            acl_file.write_text(ACL.replace("AclT=PUB", "AclT=PUB\n      - OtherT=PUB"))

            async def other_allowed() -> bool:
                req = _signed(send_request("OtherT", b"y"), "producer-ak", "producer-sk")
                return bool((await raw.invoke(baddr, req)).code == ResponseCode.SUCCESS)

            await wait_until(other_allowed, total=10, what="the reloaded permission")


async def test_a_bad_acl_file_stops_the_start(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text("accounts:\n  - accessKey: short\n")
    cfg = NamesrvConfig(listen="127.0.0.1:0", acl_enable=True, acl_file=str(acl_file))
    with pytest.raises(BaseException) as info:
        async with NameServer(cfg):
            pass
    [leaf] = exception_leaves(info.value)
    assert isinstance(leaf, AclFileError)
    assert "accessKey" in str(leaf)

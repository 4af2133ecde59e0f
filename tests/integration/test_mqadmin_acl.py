"""With ACL on, the admin requests behind mqadmin's configuration, group and file commands need
an admin account: another valid account gets NO_PERMISSION and nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from client import Admin, ClientConfig
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting.errors import RemoteError
from remoting.protocol.bodies import SubscriptionGroupConfig
from tests.helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("staging_guard")]

ACL = """
accounts:
  - accessKey: user-ak
    secretKey: user-sk
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: broker-ak
    secretKey: broker-sk
    broker: true
  - accessKey: admin-ak
    secretKey: admin-sk
    admin: true
"""

NO_PERMISSION = 16


async def test_admin_commands_need_an_admin_account(tmp_path: Path) -> None:
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
            acl_secret_key="broker-sk",
        )
        async with BrokerController(broker_cfg) as broker:
            baddr = f"127.0.0.1:{broker.port}"
            user = ClientConfig(namesrv_addr=ns.address, access_key="user-ak", secret_key="user-sk")
            root = ClientConfig(
                namesrv_addr=ns.address, access_key="admin-ak", secret_key="admin-sk"
            )
            group = SubscriptionGroupConfig(group_name="AclG")
            async with Admin(user) as a:
                refused = {
                    "updateBrokerConfig": a.update_broker_config(baddr, "maxMessageSize", "1000"),
                    "getBrokerConfig": a.get_broker_config(baddr),
                    "updateSubGroup": a.update_subscription_group(baddr, group),
                    "deleteSubGroup": a.delete_subscription_group(baddr, "AclG"),
                    "cleanExpiredCQ": a.clean_expired_consume_queue(baddr),
                    "deleteExpiredCommitLog": a.delete_expired_commitlog(baddr),
                    "getNamesrvConfig": a.get_namesrv_config(ns.address),
                    "updateNamesrvConfig": a.update_namesrv_config(
                        ns.address, "orderMessageEnable", "true"
                    ),
                    "wipeWritePerm": a.wipe_write_perm(ns.address, "broker-a"),
                    "updateOrderConf": a.put_kv("ORDER_TOPIC_CONFIG", "T", "broker-a:1"),
                }
                for what, call in refused.items():
                    with pytest.raises(RemoteError) as info:
                        await call
                    assert info.value.code == NO_PERMISSION, what
                    assert "user-ak" in (info.value.remark or ""), what
            assert broker.config.max_message_size == 4 * 1024 * 1024
            assert broker.subscriptions.get("AclG") is None
            async with Admin(root) as a:
                await a.update_broker_config(baddr, "maxMessageSize", "1000")
                assert (await a.get_broker_config(baddr))["maxMessageSize"] == "1000"
                await a.update_subscription_group(baddr, group)
                assert broker.subscriptions.get("AclG") is not None
                await a.delete_subscription_group(baddr, "AclG")
                await a.clean_expired_consume_queue(baddr)
                assert await a.delete_expired_commitlog(baddr) == 0
                await a.update_namesrv_config(ns.address, "orderMessageEnable", "true")
                assert (await a.get_namesrv_config(ns.address))["orderMessageEnable"] == "True"
            assert broker.config.max_message_size == 1000
            assert broker.subscriptions.get("AclG") is None

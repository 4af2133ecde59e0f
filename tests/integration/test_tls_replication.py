"""Replication over TLS, in process on 127.0.0.1: with `tls_mode=enforcing` the master's HA
port serves TLS slaves only (with mutual TLS when it asks for client certificates); a SYNC_MASTER
acknowledges what its TLS slave holds; a plain connection to the HA port gets no byte of the
commitlog; a slave without the CA's trust does not connect."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.ha import encode_report
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, ResponseCode
from tests.helpers import free_port, wait_until
from tests.integration.test_broker_process import send_request
from tests.integration.test_tls_remoting import Pki, make_pki

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("staging_guard")]


def _broker(tmp_path: Path, name: str, ns: str, pki: Pki, **kw: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "listen": f"127.0.0.1:{free_port()}",
            "ha_listen_port": free_port(),
            "store_dir": str(tmp_path / name),
            "namesrv_addr": ns,
            "mapped_file_size_commitlog": 64 * 1024,
            "register_name_server_period_ms": 300,
            "slave_timeout_ms": 2000,
            "tls_mode": "enforcing",
            "tls_server_cert_path": pki.server_cert,
            "tls_server_key_path": pki.server_key,
            "tls_server_need_client_auth": "require",
            "tls_server_trust_cert_path": pki.client_ca,
            "tls_client_trust_cert_path": pki.ca,
            "tls_client_cert_path": pki.client_cert,
            "tls_client_key_path": pki.client_key,
            **kw,
        }
    )


async def _plain_ha_bytes(port: int) -> bytes:
    """What a plain TCP peer posing as an empty slave receives from the HA port."""
    got = b""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        try:
            await stream.send_all(encode_report(0))
            with trio.move_on_after(1.5):
                while chunk := await stream.receive_some(65536):
                    got += chunk
        except trio.BrokenResourceError:
            pass  # reset by the server
    return got


async def test_a_sync_master_replicates_over_mutual_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    ns_cfg = NamesrvConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "tls_mode": "enforcing",
            "tls_server_cert_path": pki.server_cert,
            "tls_server_key_path": pki.server_key,
        }
    )
    async with NameServer(ns_cfg) as ns:
        master_cfg = _broker(tmp_path, "master", ns.address, pki, broker_role="SYNC_MASTER")
        slave_cfg = _broker(
            tmp_path,
            "slave",
            ns.address,
            pki,
            broker_role="SLAVE",
            broker_id=1,
            ha_master_address=f"127.0.0.1:{master_cfg.ha_listen_port}",
        )
        async with BrokerController(master_cfg) as master, BrokerController(slave_cfg) as slave:
            ha = master.ha_master
            assert ha is not None
            assert slave.ha_slave is not None
            assert slave.ha_slave.tls is not None
            await wait_until(lambda: ha.slave_count == 1, what="the TLS slave")
            tls_client = master.client_tls
            assert tls_client is not None
            async with RemotingClient(tls=tls_client) as client:
                addr = f"127.0.0.1:{master.port}"
                for i in range(50):
                    answer = await client.invoke(addr, send_request("TlsRep", b"m%d-" % i * 40))
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
            # SEND_OK from a SYNC_MASTER: the slave reported every byte.
            assert ha.acked_offset >= master.store.max_phy_offset
            assert slave.store.max_phy_offset == master.store.max_phy_offset
            # A plain peer gets nothing, and is not counted as a slave.
            assert await _plain_ha_bytes(master_cfg.ha_listen_port) == b""
            assert ha.slave_count == 1


async def test_a_slave_that_does_not_trust_the_master_does_not_follow(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        master_cfg = _broker(
            tmp_path,
            "master",
            ns.address,
            pki,
            broker_role="ASYNC_MASTER",
            tls_mode="permissive",
            tls_server_need_client_auth="none",
            tls_enable=False,
        )
        slave_cfg = _broker(
            tmp_path,
            "slave",
            ns.address,
            pki,
            broker_role="SLAVE",
            broker_id=1,
            tls_mode="disabled",
            tls_enable=True,
            tls_client_trust_cert_path=pki.other_ca,
            ha_master_address=f"127.0.0.1:{master_cfg.ha_listen_port}",
        )
        async with BrokerController(master_cfg) as master:
            async with RemotingClient() as client:
                sent = await client.invoke(f"127.0.0.1:{master.port}", send_request("T", b"x"))
                assert sent.code == ResponseCode.SUCCESS
            # Permissive: a plain slave is served ...
            assert len(await _plain_ha_bytes(master_cfg.ha_listen_port)) > 12
            # ... and a TLS slave whose CA does not vouch for the master is not.
            async with BrokerController(slave_cfg) as slave:
                await trio.sleep(1.5)
                assert slave.ha_slave is not None
                assert not slave.ha_slave.connected
                assert slave.store.max_phy_offset == 0

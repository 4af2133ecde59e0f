"""A NameServer and a broker with `tls_mode=enforcing`, in process on 127.0.0.1: the broker
registers over TLS (its own client trusts the test CA), a TLS client creates a topic, sends and
pulls; a plain client is refused by both; a bad TLS setting is a configuration error."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from pydantic import ValidationError

from broker.config import BrokerConfig
from broker.controller import BrokerController
from client import Admin, ClientConfig, Message, Producer, SendStatus
from client.errors import MQClientError
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode
from tests.helpers import free_port
from tests.integration.test_tls_remoting import Pki, make_pki

pytestmark = pytest.mark.slow


def _tls(pki: Pki) -> dict[str, object]:
    return {
        "tls_mode": "enforcing",
        "tls_server_cert_path": pki.server_cert,
        "tls_server_key_path": pki.server_key,
    }


@pytest.mark.usefixtures("staging_guard")
async def test_an_enforcing_cluster(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    ns_cfg = NamesrvConfig.model_validate({"listen": "127.0.0.1:0", **_tls(pki)})
    async with NameServer(ns_cfg) as ns:
        broker_cfg = BrokerConfig.model_validate(
            {
                "listen": f"127.0.0.1:{free_port()}",
                "store_dir": str(tmp_path / "store"),
                "namesrv_addr": ns.address,
                "mapped_file_size_commitlog": 64 * 1024,
                "tls_client_trust_cert_path": pki.ca,
                **_tls(pki),
            }
        )
        async with BrokerController(broker_cfg) as broker:
            assert broker.registration.last_ok == {ns.address: True}
            cfg = ClientConfig(namesrv_addr=ns.address, use_tls=True, tls_trust_cert_path=pki.ca)
            async with Admin(cfg) as admin:
                await admin.create_topic("TlsT", cluster="DefaultCluster")
            async with Producer("PG", cfg) as producer:
                with trio.fail_after(20):
                    while True:  # the route appears once the broker re-registered
                        try:
                            result = await producer.send(Message("TlsT", b"over tls"))
                            break
                        except MQClientError:
                            await trio.sleep(0.2)
            assert result.status is SendStatus.SEND_OK
            got = await broker.store.get_message(
                "G", "TlsT", result.message_queue.queue_id, 0, 1, 1 << 20
            )
            assert got.buffers
            # Plain clients get nothing from either.
            async with RemotingClient() as plain:
                for addr in (ns.address, f"127.0.0.1:{broker.port}"):
                    with pytest.raises(RemotingError):
                        await plain.invoke(
                            addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 2000
                        )


def test_a_tls_mode_without_a_certificate_is_a_configuration_error() -> None:
    with pytest.raises(ValidationError, match="tls"):
        NamesrvConfig(tls_mode="enforcing")
    with pytest.raises(ValidationError, match="tls"):
        BrokerConfig(tls_mode="permissive")

"""The failover scenarios against the secured cluster: deploy/docker-compose.yml with
deploy/docker-compose.secure.yml (project trimq-sec-test-<pid>, `secure_cluster`): ACL on the
NameServers and brokers, TLS enforcing on every remoting and HA port with client certificates
required, brokers registering and replicating signed (a broker account bound to the cluster)
over TLS.

The scenarios' clients sign with the application account (PUB|SUB on each scenario's topic and
group, nothing else) and connect with TLS and the client certificate; the tests' own requests
(topic creation, broker status, HA status) use the admin account. Each scenario asserts what it
asserts against the plain cluster, lost = 0 included.

`test_secured_cluster_refuses` first proves the project is secured: plain TCP to a NameServer,
a broker and a master's HA port is closed unanswered, TLS without a client certificate is
refused, and an unsigned request, a wrong secret, the application account's administration
requests and its send to a topic it was not given are answered NO_PERMISSION; the broker
account cannot register in another cluster, and the admin account cannot take broker-a's place
in the routes.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest
import trio

from client import Admin, ClientConfig, Message, Producer, SendFailedError, SendStatus
from common.acl import RequestSigner
from remoting import RemotingClient, RemotingCommand
from remoting.codes import RequestCode, ResponseCode
from remoting.errors import RemotingError
from tests.cluster.scenario import Scenario
from tests.cluster.support import (
    CLUSTER_NAME,
    Row,
    SecureCluster,
    client_config,
    ns_broker_addrs,
    read_env_file,
)
from tests.cluster.test_failover import SCENARIOS as FAILOVER
from tests.cluster.test_replication_failover import SCENARIOS as REPLICATION

pytestmark = pytest.mark.slow  # each scenario runs tens of seconds against the cluster

# What runs secured: every scenario of both files.
SECURED: dict[str, Scenario] = {**REPLICATION, **FAILOVER}
# The names the application account gets a topic and a group for (conftest.secure_cluster).
SECURED_NAMES = (*SECURED, "access")


def _plain_exchange(port: int) -> bytes:
    """Connect over plain TCP, send a RemotingCommand frame (GET_BROKER_CLUSTER_INFO, JSON),
    and read; the bytes the server answered (b"" when it closed the connection)."""
    header = b'{"code":106,"flag":0,"language":"JAVA","opaque":1,"version":0,"extFields":{}}'
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(frame)
            return sock.recv(4096)
        except ConnectionError:  # reset, or the write after the close
            return b""


async def _answer(client: RemotingClient, addr: str, cmd: RemotingCommand) -> int | str:
    """The response code, or the name of the error that ended the request."""
    try:
        resp = await client.invoke(addr, cmd, timeout_ms=5000)
    except RemotingError as exc:
        return type(exc).__name__
    return resp.code


async def test_secured_cluster_refuses(secure_cluster: SecureCluster) -> None:
    c = secure_cluster
    ns, broker = c.ns_addr("namesrv1"), c.broker_addr("broker-a")
    # 1. Plain TCP: the enforcing ports close the connection without an answer.
    for what, port in (
        ("namesrv1", c.ns_ports["namesrv1"]),
        ("broker-a", c.broker_ports["broker-a"]),
        ("broker-a HA", c.ha_ports["broker-a"]),
    ):
        got = await trio.to_thread.run_sync(lambda p=port: _plain_exchange(p))  # type: ignore[misc]
        assert got == b"", f"{what} answered a plain connection: {got[:60]!r}"
    admin = ClientConfig(namesrv_addr=c.namesrv_addr, **c.client_settings("admin"))  # type: ignore[arg-type]
    app = ClientConfig(namesrv_addr=c.namesrv_addr, **c.client_settings("app"))  # type: ignore[arg-type]
    tls = admin.tls_settings()
    assert tls is not None

    def runtime() -> RemotingCommand:
        # A new command each time: a signer signs the command it is given, in place.
        return RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)

    def put_kv() -> RemotingCommand:
        # A NameServer write for broker or admin accounts. (A code a NameServer does not serve
        # is answered REQUEST_CODE_NOT_SUPPORTED before any check, as RocketMQ's is.)
        fields = {"namespace": "trimq_cluster_test", "key": "secured", "value": "1"}
        return RemotingCommand.request(RequestCode.PUT_KV_CONFIG, fields)

    # 2. TLS with the CA but no client certificate: refused (at the handshake or, with TLS
    # 1.3, at the first request).
    no_cert = ClientConfig(
        namesrv_addr=c.namesrv_addr,
        use_tls=True,
        tls_trust_cert_path=admin.tls_trust_cert_path,
        access_key=admin.access_key,
        secret_key=admin.secret_key,
    )
    async with RemotingClient(
        tls=no_cert.tls_settings(), before_send=no_cert.request_signer()
    ) as rc:
        got_code = await _answer(rc, broker, runtime())
        assert not isinstance(got_code, int), f"served without a client certificate: {got_code}"
    # 3. TLS with the certificate, unsigned, or signed with a wrong secret: NO_PERMISSION.
    async with RemotingClient(tls=tls) as rc:
        assert await _answer(rc, broker, runtime()) == ResponseCode.NO_PERMISSION
    assert admin.access_key is not None
    wrong = RequestSigner(admin.access_key, "not-the-secret-key")
    async with RemotingClient(tls=tls, before_send=wrong) as rc:
        assert await _answer(rc, broker, runtime()) == ResponseCode.NO_PERMISSION
        assert await _answer(rc, ns, put_kv()) == ResponseCode.NO_PERMISSION
    # 4. The application account: no administration, no topic it was not given.
    topic = SecureCluster.topic_of("access", c.run_id)
    create = RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": "4",
            "writeQueueNums": "4",
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
        },
    )
    async with RemotingClient(tls=tls, before_send=app.request_signer()) as rc:
        assert await _answer(rc, broker, create) == ResponseCode.NO_PERMISSION
        assert await _answer(rc, ns, put_kv()) == ResponseCode.NO_PERMISSION
        # Any valid account may read the runtime info: the signature itself is good.
        assert await _answer(rc, broker, runtime()) == ResponseCode.SUCCESS
    async with c.remoting_client() as rc:  # the admin account
        assert await _answer(rc, ns, put_kv()) == ResponseCode.SUCCESS
    async with Admin(client_config(c, "admin")) as adm:
        created = await adm.create_topic(topic, cluster=CLUSTER_NAME, write_queue_nums=4)
        other = f"{topic}_not_granted"
        await adm.create_topic(other, cluster=CLUSTER_NAME, write_queue_nums=4)
        assert len(created) == 3, created
    async with Producer("pg_access", client_config(c, "app")) as producer:
        result = await producer.send(Message(topic, b"signed"))
        assert result.status is SendStatus.SEND_OK, result
        with pytest.raises(SendFailedError, match="CODE: 16"):
            await producer.send(Message(other, b"not granted"))
    unsigned = client_config(c, "app", access_key=None, secret_key=None)
    async with Producer("pg_access_unsigned", unsigned) as producer:
        with pytest.raises(SendFailedError, match="CODE: 16"):
            await producer.send(Message(topic, b"unsigned"))
    # 5. Routes: the broker account registers in its own cluster only, and no other account
    # may take a live broker's place (the NameServer's claim rules).
    broker_env = read_env_file(c.secure_dir / "broker.env")
    broker_signer = RequestSigner(
        broker_env["TRIMQ_ACL_ACCESS_KEY"], broker_env["TRIMQ_ACL_SECRET_KEY"]
    )

    def register(cluster: str, name: str, addr: str) -> RemotingCommand:
        fields = {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": cluster,
            "haServerAddr": "",
            "brokerId": "0",
            "compressed": "false",
        }
        return RemotingCommand.request(RequestCode.REGISTER_BROKER, fields)

    async with RemotingClient(tls=tls, before_send=broker_signer) as rc:
        elsewhere = register("OtherCluster", "rogue", "127.0.0.1:1")
        assert await _answer(rc, ns, elsewhere) == ResponseCode.NO_PERMISSION
    async with c.remoting_client() as rc:  # the admin account
        displace = register(CLUSTER_NAME, "broker-a", "127.0.0.1:1")
        assert await _answer(rc, ns, displace) == ResponseCode.NO_PERMISSION
        routes = await ns_broker_addrs(rc, ns)
        assert routes is not None
        assert routes["broker-a"][0] == c.broker_addr("broker-a"), routes
        assert "rogue" not in routes, routes


@pytest.mark.parametrize("name", list(SECURED))
async def test_secured_scenario(
    secure_cluster: SecureCluster, tmp_path: Path, rows: list[Row], name: str
) -> None:
    await SECURED[name](secure_cluster, tmp_path, rows)

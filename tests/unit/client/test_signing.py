"""The client signs its requests when it has ACL credentials: every header codec carries
`AccessKey` and `Signature` to the server as signed, and common.acl verifies them there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from pydantic import ValidationError

from client.cli import mqadmin, mqbench
from client.config import ClientConfig
from client.instance import ClientInstance
from client.message import MessageQueue
from client.spark._conn import Conn
from client.spark.options import parse_sink_options, parse_source_options
from common.acl import (
    ACCESS_KEY,
    SIGNATURE,
    AclChecker,
    AclError,
    RequestSigner,
    parse_acl,
    sign,
)
from remoting import Connection, RemoteError, RemotingCommand, RemotingServer
from remoting.codes import RequestCode, ResponseCode, SerializeType
from remoting.protocol import bodies
from remoting.protocol.headers import send_request_fields_v2

pytestmark = pytest.mark.unit

AK = "app-account"
SK = "app-secret-1"
RULES = parse_acl(
    f"""
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
)


class _Server:
    """A server wired as docs/security.md says: every request goes through the checker
    before its processor; what arrived is recorded."""

    def __init__(self) -> None:
        self.checker = AclChecker(RULES)
        self.received: list[RemotingCommand] = []
        self.refused: list[str] = []
        self.server = RemotingServer("127.0.0.1", 0)
        for code in (
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.HEART_BEAT,
            RequestCode.UPDATE_CONSUMER_OFFSET,
        ):
            self.server.processors.register(code, self._serve)
        self.oneway = trio.Event()

    async def _serve(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        self.received.append(cmd)
        try:
            self.checker.check_command(cmd, conn.remote_address)
        except AclError as exc:
            self.refused.append(exc.remark)
            if cmd.is_oneway:
                self.oneway.set()
                return None
            return cmd.make_response(exc.code, exc.remark)
        if cmd.is_oneway:
            self.oneway.set()
            return None
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST, "no route")
        if cmd.code == RequestCode.SEND_MESSAGE_V2:
            fields = {"msgId": "00", "queueId": "0", "queueOffset": "7"}
            return cmd.make_response(ext_fields=fields)
        return cmd.make_response()


@asynccontextmanager
async def _cluster(**config: Any) -> AsyncIterator[tuple[_Server, ClientInstance, str]]:
    server = _Server()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.server.run)
        addr = f"127.0.0.1:{port}"
        async with ClientInstance(ClientConfig(namesrv_addr=addr, **config)) as inst:
            yield server, inst, addr
        nursery.cancel_scope.cancel()


async def _requests(inst: ClientInstance, addr: str, server: _Server) -> None:
    """A route query, a send (the producer's V2 fields), a heartbeat and a oneway offset."""
    api = inst.api
    assert await api.get_topic_route("TopicA") is None
    fields = send_request_fields_v2(
        "pg", "TopicA", "TBW102", "4", 0, 0, 1_700_000_000_000, 0, "KEYS\x01\u952e\x02", "b", False
    )
    result = await api.send_message_fields(
        addr, MessageQueue("TopicA", "b", 0), fields, b"\x00\xffbody", msg_id="m", timeout_ms=3000
    )
    assert result.queue_offset == 7
    sub = bodies.SubscriptionData(topic="TopicA")
    consumer = bodies.ConsumerData(group_name="cg", subscription_data_set=[sub])
    await api.send_heartbeat(addr, bodies.HeartbeatData("cid", consumer_data_set=[consumer]))
    await api.update_consumer_offset(addr, "cg", MessageQueue("TopicA", "b", 0), 5, oneway=True)
    with trio.fail_after(10):
        await server.oneway.wait()


@pytest.mark.parametrize("codec", ["json", "rocketmq", "msgpack", "auto"])
async def test_signed_requests_verify_at_the_server_with_every_codec(codec: str) -> None:
    async with _cluster(serialize_type=codec, access_key=AK, secret_key=SK) as (server, inst, a):
        await _requests(inst, a, server)
    assert server.refused == []
    codes = [c.code for c in server.received]
    assert codes == [105, 310, 34, 15]
    wire = {
        "json": SerializeType.JSON,
        "rocketmq": SerializeType.ROCKETMQ,
        "msgpack": SerializeType.MSGPACK,
        "auto": SerializeType.MSGPACK,  # after the first answer's advert
    }[codec]
    assert server.received[-1].serialize_type == wire
    assert server.received[0].serialize_type == (SerializeType.JSON if codec == "auto" else wire)
    for cmd in server.received:
        fields = cmd.ext_fields
        assert fields is not None
        assert fields[ACCESS_KEY] == AK
        assert fields[SIGNATURE] == sign(fields, cmd.body, SK)
    # The heartbeat was checked against its body's group and topic, and the body is signed.
    heartbeat = server.received[2]
    assert heartbeat.body is not None
    assert b'"groupName":"cg"' in bytes(heartbeat.body).replace(b" ", b"")


async def test_a_wrong_secret_is_refused() -> None:
    async with _cluster(serialize_type="json", access_key=AK, secret_key="not-the-secret") as (
        _server,
        inst,
        _,
    ):
        with pytest.raises(RemoteError) as info:
            await inst.api.get_topic_route("TopicA")
    assert info.value.code == ResponseCode.NO_PERMISSION
    assert info.value.remark is not None
    assert f"signature check failed for accessKey={AK}" in info.value.remark
    assert "not-the-secret" not in info.value.remark


@pytest.mark.parametrize("codec", ["json", "msgpack"])
async def test_without_credentials_nothing_is_signed(
    codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TRIMQ_SECRET_KEY", raising=False)
    async with _cluster(serialize_type=codec) as (server, inst, _):
        assert inst.remoting is not None
        assert inst.remoting.before_send is None
        with pytest.raises(RemoteError, match="carries no AccessKey"):
            await inst.api.get_topic_route("TopicA")
    (cmd,) = server.received
    assert cmd.ext_fields is not None
    assert ACCESS_KEY not in cmd.ext_fields
    assert SIGNATURE not in cmd.ext_fields


async def test_remoting_client_applies_the_hook_to_oneway_and_invoke() -> None:
    signer = RequestSigner(AK, SK)
    seen: list[int] = []

    def hook(cmd: RemotingCommand) -> None:
        seen.append(cmd.code)
        signer(cmd)

    server = _Server()
    from remoting import RemotingClient

    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.server.run)
        addr = f"127.0.0.1:{port}"
        async with RemotingClient(serialize_type=SerializeType.ROCKETMQ, before_send=hook) as c:
            fields = {"consumerGroup": "cg", "topic": "T", "queueId": "0", "commitOffset": "1"}
            await c.invoke_oneway(addr, RemotingCommand.request(15, fields, oneway=True))
            with trio.fail_after(10):
                await server.oneway.wait()
            resp = await c.invoke(addr, RemotingCommand.request(105, {"topic": "T"}))
            assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        nursery.cancel_scope.cancel()
    assert seen == [15, 105]
    assert server.refused == []


# -------------------------------------------------------------------------------------------
# Where credentials come from
# -------------------------------------------------------------------------------------------
def test_config_credentials_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TRIMQ_SECRET_KEY", raising=False)
    assert ClientConfig().request_signer() is None
    cfg = ClientConfig(access_key=AK, secret_key=SK)
    assert SK not in repr(cfg)
    assert SK not in str(cfg)
    signer = cfg.request_signer()
    assert signer is not None
    assert signer.sign_fields({}, None)[SIGNATURE] == sign({ACCESS_KEY: AK}, None, SK)
    monkeypatch.setenv("TRIMQ_ACCESS_KEY", AK)
    monkeypatch.setenv("TRIMQ_SECRET_KEY", SK)
    from_env = ClientConfig().request_signer()
    assert from_env is not None
    assert from_env.access_key == AK
    monkeypatch.delenv("TRIMQ_SECRET_KEY")
    with pytest.raises(ValidationError, match="access_key and secret_key go together"):
        ClientConfig()
    with pytest.raises(ValidationError, match="go together"):
        ClientConfig(access_key=None, secret_key=SK)


@pytest.mark.parametrize("module", [mqadmin, mqbench])
def test_cli_options(module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TRIMQ_SECRET_KEY", raising=False)
    monkeypatch.setattr(module, "_options", dict(module._options))
    monkeypatch.setattr(module, "configure_logging", lambda level: None)
    runner = CliRunner()
    command = "topicList" if module is mqadmin else "producer"
    res = runner.invoke(module.cli, ["--access-key", AK, "--secret-key", SK, command, "--help"])
    assert res.exit_code == 0, res.output
    signer = module._config("127.0.0.1:9876").request_signer()
    assert signer is not None
    assert signer.access_key == AK
    # From the environment.
    env = {"TRIMQ_ACCESS_KEY": "env-account", "TRIMQ_SECRET_KEY": SK}
    res = runner.invoke(module.cli, [command, "--help"], env=env)
    assert res.exit_code == 0, res.output
    assert module._config("127.0.0.1:9876").access_key == "env-account"
    # One without the other is a usage error.
    res = runner.invoke(module.cli, ["--access-key", AK, command, "--help"])
    assert res.exit_code == 2
    assert "--access-key and --secret-key go together" in res.output


def test_spark_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TRIMQ_SECRET_KEY", raising=False)
    base = {"rocketmq.namesrvAddr": "127.0.0.1:9876", "subscribe": "T"}
    src = parse_source_options(
        {**base, "rocketmq.accessKey": AK, "rocketmq.secretKey": SK}, streaming=False
    )
    assert (src.access_key, src.secret_key) == (AK, SK)
    assert SK not in repr(src)
    assert parse_source_options(base, streaming=True).access_key is None
    sink = parse_sink_options({"rocketmq.namesrvaddr": "x:1", "rocketmq.accesskey": AK,
                               "rocketmq.secretkey": SK})  # fmt: skip
    assert (sink.access_key, sink.secret_key) == (AK, SK)
    with pytest.raises(ValueError, match=r"option 'rocketmq\.secretKey' is required"):
        parse_source_options({**base, "rocketmq.accessKey": AK}, streaming=False)
    with pytest.raises(ValueError, match=r"option 'rocketmq\.accessKey' is required"):
        parse_sink_options({"rocketmq.namesrvAddr": "x:1", "rocketmq.secretKey": SK})
    # The connection's client signs with them.
    inst = Conn("127.0.0.1:9876", access_key=src.access_key, secret_key=src.secret_key)
    signer = inst._open_instance().config.request_signer()
    assert signer is not None
    assert signer.access_key == AK
    assert Conn("127.0.0.1:9876")._open_instance().config.request_signer() is None

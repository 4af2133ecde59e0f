"""Runtime configuration changes: which settings change (UPDATE_BROKER_CONFIG and
UPDATE_NAMESRV_CONFIG), the config file rewrite, and the ACL class of the admin codes."""

from __future__ import annotations

import tomllib

import pytest

from broker.config import BrokerConfig, runtime_changes, update_toml_text
from common.acl import Access, code_rule
from common.config import parse_properties
from namesrv.config import NamesrvConfig
from namesrv.config import runtime_changes as namesrv_changes
from namesrv.kv_config import KVConfig
from namesrv.processors import NamesrvProcessors
from namesrv.route_table import RouteTable
from remoting import RemotingCommand
from remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.unit


def test_runtime_changes_take_known_runtime_settings_only() -> None:
    cfg = BrokerConfig()
    got = runtime_changes(
        cfg,
        {
            "maxMessageSize": " 2048 ",
            "auto_create_topic_enable": "false",
            "fileReservedTime": "0",
            "diskMaxUsedSpaceRatio": "80",
        },
    )
    assert got == {
        "max_message_size": 2048,
        "auto_create_topic_enable": False,
        "file_reserved_hours": 0,
        "disk_max_used_ratio": 0.8,
    }
    assert cfg.max_message_size == 4 * 1024 * 1024  # checked, not applied
    with pytest.raises(KeyError, match="unknown broker setting 'noSuch'"):
        runtime_changes(cfg, {"noSuch": "1"})
    for key in ("listen", "brokerName", "storeDir", "brokerConfigPath", "flushDiskType"):
        with pytest.raises(PermissionError, match="cannot be changed at run time"):
            runtime_changes(cfg, {key: "x"})
    with pytest.raises(ValueError, match="maxMessageSize='big'"):
        runtime_changes(cfg, {"maxMessageSize": "big"})
    with pytest.raises(ValueError, match="diskMaxUsedSpaceRatio"):
        runtime_changes(cfg, {"diskMaxUsedSpaceRatio": "most"})
    for key, value in (
        ("maxMessageSize", "0"),
        ("maxMessageSize", str(2 * 1024**3)),
        ("maxPullMsgs", "0"),
        ("brokerPermission", "99"),
        ("diskMaxUsedRatio", "5"),
        ("diskMaxUsedSpaceRatio", "0"),
        ("fileReservedHours", "-1"),
        ("maxSuspendMs", "-1"),
        ("maxPropertiesSize", "40000"),
    ):
        with pytest.raises(ValueError, match="must be"):
            runtime_changes(cfg, {key: value})
    small = BrokerConfig(mapped_file_size_commitlog=65536)
    with pytest.raises(ValueError, match="below the commitlog file size"):
        runtime_changes(small, {"maxMessageSize": "65536"})
    # One bad pair refuses the lot (the caller applies nothing).
    with pytest.raises(KeyError):
        runtime_changes(cfg, {"maxMessageSize": "10", "nope": "1"})


def test_update_toml_text_keeps_the_rest_of_the_file() -> None:
    text = (
        '# my broker\nbroker_name = "b"  # name\nmax_message_size = 10\n\n'
        "[broker]\nmax_pull_msgs = 5\n"
    )
    out = update_toml_text(
        text,
        {"max_message_size": 20, "max_pull_msgs": 7, "auto_create_topic_enable": False,
         "delete_when": 'a"b\\c'},
    )  # fmt: skip
    assert out.startswith('# my broker\nbroker_name = "b"  # name\n')
    data = tomllib.loads(out)
    assert data["max_message_size"] == 20
    assert data["auto_create_topic_enable"] is False
    assert data["delete_when"] == 'a"b\\c'
    assert data["broker"] == {"max_pull_msgs": 7}
    assert update_toml_text("", {"disk_max_used_ratio": 0.8}) == "disk_max_used_ratio = 0.8\n"
    tricky = 'delete_when = """\nmax_message_size = 5\n"""\n'
    with pytest.raises(ValueError, match=r"did not set|other settings"):
        update_toml_text(tricky, {"max_message_size": 6})
    dotted = "broker.max_message_size = 5\n"
    with pytest.raises(ValueError, match="did not set max_message_size"):
        update_toml_text(dotted, {"max_message_size": 6})
    with pytest.raises(ValueError, match="not valid TOML"):
        update_toml_text("a = = 1\n", {"max_message_size": 1})


def test_parse_properties() -> None:
    assert parse_properties("# c\n! c\n\na=1\nb : x=y\n c= \n") == {"a": "1", "b": "x=y", "c": ""}
    for bad in ("novalue", "=1", ":x"):
        with pytest.raises(ValueError, match="not a key=value line"):
            parse_properties(bad)


def test_namesrv_runtime_changes() -> None:
    cfg = NamesrvConfig()
    assert namesrv_changes(cfg, {"orderMessageEnable": "true"}) == {"order_message_enable": True}
    with pytest.raises(PermissionError):
        namesrv_changes(cfg, {"listen": "127.0.0.1:1"})
    with pytest.raises(KeyError):
        namesrv_changes(cfg, {"nope": "1"})
    with pytest.raises(ValueError, match="brokerChannelExpiredTimeMs"):
        namesrv_changes(cfg, {"brokerChannelExpiredTimeMs": "-5"})


async def test_namesrv_update_applies_to_routes() -> None:
    cfg = NamesrvConfig()
    p = NamesrvProcessors(RouteTable(), KVConfig(), config=cfg)
    handlers = p.handlers()

    async def call(code: int, body: bytes | None = None) -> RemotingCommand:
        resp = await handlers[code](None, RemotingCommand.request(code, None, body))  # type: ignore[arg-type]
        assert resp is not None
        return resp

    resp = await call(RequestCode.UPDATE_NAMESRV_CONFIG, b"orderMessageEnable=true\n")
    assert resp.code == ResponseCode.SUCCESS
    assert p.order_message_enable is True
    assert cfg.order_message_enable is True
    body = (await call(RequestCode.GET_NAMESRV_CONFIG)).body_bytes().decode()
    assert "orderMessageEnable=True" in body.splitlines()
    resp = await call(RequestCode.UPDATE_NAMESRV_CONFIG, b"listen=1.2.3.4:5\n")
    assert resp.code == ResponseCode.NO_PERMISSION
    for bad in (b"", b"junk", b"\xff\xfe", b"x" * 70_000):
        resp = await call(RequestCode.UPDATE_NAMESRV_CONFIG, bad)
        assert resp.code == ResponseCode.SYSTEM_ERROR, bad[:10]
    assert cfg.listen == "127.0.0.1:9876"


def test_admin_codes_need_admin_accounts() -> None:
    for code in (
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.GET_BROKER_CONFIG,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
        RequestCode.DELETE_EXPIRED_COMMITLOG,
        RequestCode.GET_NAMESRV_CONFIG,
        RequestCode.UPDATE_NAMESRV_CONFIG,
    ):
        assert code_rule(code).access is Access.ADMIN, code.name
    # Route changes: a broker or an admin account.
    for code in (
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
    ):
        assert code_rule(code).access is Access.BROKER, code.name
    # Reads RocketMQ checks no permission for.
    for code in (
        RequestCode.GET_CONSUMER_RUNNING_INFO,
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
        RequestCode.GET_PRODUCER_CONNECTION_LIST,
    ):
        assert code_rule(code).access is Access.ACCOUNT, code.name

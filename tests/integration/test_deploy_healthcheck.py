"""deploy/healthcheck.py (the image's health check) against a NameServer in this process."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import ModuleType

import pytest
import trio

from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting.protocol.route import DataVersion, TopicConfig

HEALTHCHECK = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trimq_healthcheck", HEALTHCHECK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hc() -> ModuleType:
    return _load()


def _run(hc: ModuleType, role: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> int:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return int(hc.main(["trimq-healthcheck", role]))


async def test_broker_healthy_only_when_listed_at_its_address(
    hc: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        env = {
            "TRIMQ_NAMESRV_ADDR": f"127.0.0.1:1;{ns.address}",  # first one refuses
            "TRIMQ_BROKER_NAME": "broker-b",
            "TRIMQ_BROKER_ID": "0",
            "TRIMQ_ADVERTISE": "127.0.0.1:10921",
        }

        def check() -> int:
            return _run(hc, "broker", env, monkeypatch)

        assert await trio.to_thread.run_sync(check) == 1  # not registered yet
        ns.route_table.register_broker(
            cluster="DefaultCluster",
            broker_addr="127.0.0.1:10999",  # another address: still not us
            broker_name="broker-b",
            broker_id=0,
            ha_server_addr="",
            data_version=DataVersion(1, 1),
            topic_configs=[TopicConfig("T", 4, 4, 6)],
            now_ms=0,
        )
        assert await trio.to_thread.run_sync(check) == 1
        ns.route_table.register_broker(
            cluster="DefaultCluster",
            broker_addr="127.0.0.1:10921",
            broker_name="broker-b",
            broker_id=0,
            ha_server_addr="",
            data_version=DataVersion(1, 2),
            topic_configs=[TopicConfig("T", 4, 4, 6)],
            now_ms=0,
        )
        assert await trio.to_thread.run_sync(check) == 0
        port = ns.address.rpartition(":")[2]
        namesrv_env = {"TRIMQ_LISTEN": f"0.0.0.0:{port}"}
        assert (
            await trio.to_thread.run_sync(lambda: _run(hc, "namesrv", namesrv_env, monkeypatch))
            == 0
        )


def test_namesrv_unhealthy_when_nothing_listens(
    hc: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        assert _run(hc, "namesrv", {"TRIMQ_LISTEN": f"0.0.0.0:{port}"}, monkeypatch) == 1

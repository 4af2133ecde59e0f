"""deploy/healthcheck.py (the image's health check) against a NameServer, a controller and an
etcd member on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import ModuleType

import pytest
import trio

from controller.config import ControllerConfig
from controller.server import ControllerServer
from namesrv.config import NamesrvConfig
from namesrv.server import NameServer
from remoting.protocol.route import DataVersion, TopicConfig
from tests.helpers import free_port, wait_until
from tests.integration.etcd_support import etcd_available, etcd_procs

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


async def test_controller_mode_broker_healthy_under_any_id_at_its_address(
    hc: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller-mode replica has the id the controllers gave it (0 as master): it is
    healthy once listed under its name at its address, whatever the id."""
    async with NameServer(NamesrvConfig(listen="127.0.0.1:0")) as ns:
        env = {
            "TRIMQ_NAMESRV_ADDR": ns.address,
            "TRIMQ_BROKER_NAME": "broker-a",
            "TRIMQ_ENABLE_CONTROLLER_MODE": "true",
            "TRIMQ_ADVERTISE": "127.0.0.1:11021",
        }

        def check() -> int:
            return _run(hc, "broker", env, monkeypatch)

        assert await trio.to_thread.run_sync(check) == 1  # no role yet: not registered
        ns.route_table.register_broker(
            cluster="DefaultCluster",
            broker_addr="127.0.0.1:11021",
            broker_name="broker-a",
            broker_id=2,
            ha_server_addr="",
            data_version=DataVersion(1, 1),
            topic_configs=[TopicConfig("T", 4, 4, 6)],
            now_ms=0,
        )
        assert await trio.to_thread.run_sync(check) == 0


async def test_controller_healthy_only_with_a_leader(
    hc: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`controller`: answering CONTROLLER_GET_METADATA_INFO is not enough, it must name a
    leader (none while etcd is unreachable); `etcd`: the member's /health."""
    if not etcd_available():
        pytest.skip("etcd is not installed (make etcd-install)")
    with etcd_procs(tmp_path) as start:
        # Started before `_run` sets ETCD_* variables, which etcd would read too.
        etcd = start()
        dead = free_port()  # nothing listens: etcd unreachable
        cfg = ControllerConfig(
            listen="127.0.0.1:0", etcd_endpoints=f"http://127.0.0.1:{dead}", etcd_timeout_ms=300
        )
        async with ControllerServer(cfg) as ctl:
            env = {"TRIMQ_LISTEN": f"0.0.0.0:{ctl.port}"}
            assert (
                await trio.to_thread.run_sync(lambda: _run(hc, "controller", env, monkeypatch)) == 1
            )
        dead_env = {"ETCD_LISTEN_CLIENT_URLS": f"http://0.0.0.0:{dead}"}
        assert await trio.to_thread.run_sync(lambda: _run(hc, "etcd", dead_env, monkeypatch)) == 1
        etcd_env = {"ETCD_LISTEN_CLIENT_URLS": etcd.url}
        assert await trio.to_thread.run_sync(lambda: _run(hc, "etcd", etcd_env, monkeypatch)) == 0
        cfg = ControllerConfig(listen="127.0.0.1:0", etcd_endpoints=etcd.url, lease_ttl_s=2)
        async with ControllerServer(cfg) as ctl:
            await wait_until(lambda: ctl.is_leader, total=15, what="leadership")
            env = {"TRIMQ_LISTEN": f"0.0.0.0:{ctl.port}"}
            assert (
                await trio.to_thread.run_sync(lambda: _run(hc, "controller", env, monkeypatch)) == 0
            )

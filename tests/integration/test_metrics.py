"""Prometheus metrics of a real broker and NameServer: exact counts after known traffic, the lag
gauge against `mqadmin consumerProgress`, the port rules, and hostile HTTP clients."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.metrics import MetricsListenError
from common.message import BatchItem, decode_records, encode_batch_body, encode_properties
from common.metrics_http import MetricsHttpServer
from namesrv.config import NamesrvConfig
from namesrv.metrics import MetricsListenError as NamesrvMetricsListenError
from namesrv.server import NameServer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tests.helpers import free_port, wait_until
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_broker_process import PULL_COMMIT, pull_request, send_request

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("staging_guard")]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def http_get(port: int, path: str = "/metrics", *, method: str = "GET") -> tuple[int, bytes]:
    """(status, body) of one request to 127.0.0.1:port."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await read_all(stream)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def read_all(stream: trio.SocketStream) -> bytes:
    chunks = []
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def scrape(port: int) -> Samples:
    status, body = await http_get(port)
    assert status == 200
    return parse(body.decode())


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels`."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def broker_config(tmp_path: Path, metrics_port: int | None, **kw: object) -> BrokerConfig:
    """An in-process broker's settings; metrics on `metrics_port` (None: off)."""
    return BrokerConfig(
        listen=f"127.0.0.1:{free_port()}",
        store_dir=str(tmp_path / "store"),
        mapped_file_size_commitlog=1024 * 1024,
        mapped_file_size_consume_queue=20_000,
        metrics_listen="" if metrics_port is None else f"127.0.0.1:{metrics_port}",
        **kw,  # type: ignore[arg-type]
    )


async def test_counts_after_known_traffic(tmp_path: Path) -> None:
    async with BrokerController(broker_config(tmp_path, 0)) as ctrl:
        assert ctrl.metrics.server is not None
        mport = ctrl.metrics.server.port
        addr = f"127.0.0.1:{ctrl.port}"
        bodies = [b"x" * (10 + i) for i in range(37)]
        async with RemotingClient() as client:
            for body in bodies:
                resp = await client.invoke(addr, send_request("MetricsX", body))
                assert resp.code == ResponseCode.SUCCESS
            # One batch of 5 (one put: one message-size observation).
            batch = encode_batch_body(
                [BatchItem(0, b"b" * 2000, encode_properties({"K": str(i)})) for i in range(5)]
            )
            resp = await client.invoke(
                addr,
                send_request("MetricsB", batch, code=RequestCode.SEND_BATCH_MESSAGE),
            )
            assert resp.code == ResponseCode.SUCCESS
            # Group G pulls everything of X in two pulls, committing 32 with the second.
            pulled = []
            offset = 0
            commit = 0
            for _ in range(2):
                resp = await client.invoke(
                    addr,
                    pull_request(
                        "MetricsX",
                        offset,
                        group="G",
                        max_msgs=32,
                        sys_flag=PULL_COMMIT | 0x4,
                        commit_offset=commit,
                        suspend_ms=0,
                    ),
                )
                assert resp.code == ResponseCode.SUCCESS
                msgs = decode_records(resp.body_bytes())
                pulled.extend(msgs)
                # The next pull commits where this one ended (the first: 0, the second: 32).
                offset = commit = msgs[-1].queue_offset + 1
        assert [m.body for m in pulled] == bodies
        stored = sum(m.store_size for m in pulled)

        s = await scrape(mport)
        base = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a"}
        x = {**base, "topic": "MetricsX"}
        assert value(s, "rocketmq_messages_in_total", **x) == 37
        # RocketMQ counts whole records (wroteBytes), which is what a pull serves.
        assert value(s, "rocketmq_throughput_in_total", **x) == stored
        assert value(s, "rocketmq_message_size_count", **x) == 37
        assert value(s, "rocketmq_message_size_bucket", **x, le="1024") == 37
        assert value(s, "rocketmq_messages_out_total", **x, consumer_group="G") == 37
        assert value(s, "rocketmq_throughput_out_total", **x, consumer_group="G") == stored
        b = {**base, "topic": "MetricsB"}
        assert value(s, "rocketmq_messages_in_total", **b) == 5
        assert value(s, "rocketmq_message_size_count", **b) == 1
        assert value(s, "rocketmq_message_size_bucket", **b, le="1024") == 0
        assert value(s, "rocketmq_message_size_bucket", **b, le="4096") == 1
        assert value(s, "rocketmq_message_size_bucket", **b, le="+Inf") == 1
        rpc = {**base, "protocol_type": "remoting"}
        sends = {**rpc, "request_code": "send_message_v2", "response_code": "success"}
        assert value(s, "rocketmq_rpc_latency_count", **sends) == 37
        assert value(s, "rocketmq_rpc_latency_bucket", **sends, le="+Inf") == 37
        pulls = {**rpc, "request_code": "pull_message", "response_code": "success"}
        assert value(s, "rocketmq_rpc_latency_count", **pulls) == 2
        batch_sends = {**rpc, "request_code": "send_batch_message", "response_code": "success"}
        assert value(s, "rocketmq_rpc_latency_count", **batch_sends) == 1
        # Committed 32 of 37; all 37 pulled (5 in flight), none ready.
        g = {**x, "consumer_group": "G", "is_retry": "false"}
        assert value(s, "rocketmq_consumer_lag_messages", **g) == 5
        assert value(s, "rocketmq_consumer_inflight_messages", **g) == 5
        assert value(s, "rocketmq_consumer_ready_messages", **g) == 0
        assert value(s, "rocketmq_consumer_lag_latency", **g) >= 0
        assert value(s, "rocketmq_topic_number", **base) == len(list(ctrl.topics))
        assert value(s, "rocketmq_consumer_group_number", **base) == len(
            ctrl.subscriptions.groups()
        )
        storage = {**base, "storage_type": "local", "storage_medium": "disk"}
        assert value(s, "rocketmq_storage_size", **storage) == ctrl.store.max_phy_offset
        assert value(s, "rocketmq_storage_dispatch_behind_bytes", **storage) == 0
        assert (
            0
            <= value(s, "rocketmq_storage_flush_behind_bytes", **storage)
            <= ctrl.store.max_phy_offset
        )
        assert value(s, "rocketmq_broker_permission", **base) == 6

        # A deleted topic's series go at the next scrape.
        ctrl.topics.delete("MetricsB")
        s = await scrape(mport)
        assert not [k for k in s if ("topic", "MetricsB") in k[1]]


async def test_metrics_off_and_default_port_taken(tmp_path: Path) -> None:
    # "" turns them off: nothing bound, nothing counted.
    async with BrokerController(
        BrokerConfig(
            listen=f"127.0.0.1:{free_port()}",
            store_dir=str(tmp_path / "s1"),
            mapped_file_size_commitlog=1024 * 1024,
            mapped_file_size_consume_queue=20_000,
            metrics_listen="",
        )
    ) as ctrl:
        assert ctrl.metrics.server is None
        assert ctrl.traffic is None
        assert ctrl.server.processors.rpc_observer is None
    # The default address taken (by us here, or by another broker of the host): a warning,
    # and the broker runs without metrics.
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            holder.bind(("127.0.0.1", 5557))
            holder.listen()
        except OSError:
            pass  # taken already: the same case
        cfg = BrokerConfig(
            listen=f"127.0.0.1:{free_port()}",
            store_dir=str(tmp_path / "s2"),
            mapped_file_size_commitlog=1024 * 1024,
            mapped_file_size_consume_queue=20_000,
        )
        assert "metrics_listen" not in cfg.model_fields_set
        async with BrokerController(cfg) as ctrl:
            assert ctrl.metrics.server is None
            assert ctrl.traffic is None
            async with RemotingClient() as client:
                resp = await client.invoke(
                    f"127.0.0.1:{ctrl.port}", send_request("MetricsOff", b"x")
                )
                assert resp.code == ResponseCode.SUCCESS
    finally:
        holder.close()


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


async def test_explicit_port_taken_stops_the_start(tmp_path: Path, taken_port: int) -> None:
    with pytest.raises(BaseException) as info:  # trio may wrap it in a group
        async with BrokerController(broker_config(tmp_path, taken_port)):
            pass
    assert (
        info.group_contains(MetricsListenError)
        if isinstance(info.value, BaseExceptionGroup)
        else isinstance(info.value, MetricsListenError)
    )
    ns_cfg = NamesrvConfig(
        listen=f"127.0.0.1:{free_port()}", metrics_listen=f"127.0.0.1:{taken_port}"
    )
    with pytest.raises(BaseException) as info2:
        async with NameServer(ns_cfg):
            pass
    assert (
        info2.group_contains(NamesrvMetricsListenError)
        if isinstance(info2.value, BaseExceptionGroup)
        else isinstance(info2.value, NamesrvMetricsListenError)
    )


@pytest.mark.slow
async def test_cli_exits_2_on_a_taken_metrics_port(tmp_path: Path, taken_port: int) -> None:
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    ns = await trio.run_process(
        [
            str(bin_dir / "mqnamesrv"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--metrics-listen",
            f"127.0.0.1:{taken_port}",
        ],
        capture_stderr=True,
        check=False,
        env=env,
    )
    assert ns.returncode == 2, ns.stderr
    assert b"metrics_listen" in ns.stderr
    env["TRIMQ_METRICS_LISTEN"] = f"127.0.0.1:{taken_port}"
    broker = await trio.run_process(
        [
            str(bin_dir / "mqbroker"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--store-dir",
            str(tmp_path / "store"),
        ],
        capture_stderr=True,
        check=False,
        env=env,
    )
    assert broker.returncode == 2, broker.stderr
    assert b"metrics_listen" in broker.stderr


@pytest.mark.slow
async def test_lag_matches_mqadmin_consumer_progress(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc], tmp_path: Path
) -> None:
    """Real processes: the lag gauge of a group equals consumerProgress' diff total."""
    mport = free_port()
    broker: BrokerProc = start_broker(namesrv.addr, args=("--metrics-listen", f"127.0.0.1:{mport}"))
    async with RemotingClient() as client:
        for i in range(23):
            resp = await client.invoke(
                broker.addr, send_request("LagT", b"m%d" % i, queue_id=i % 4)
            )
            assert resp.code == ResponseCode.SUCCESS
        # Group LG reads queue 0 (6 messages) and commits 4 of them through the offset API.
        resp = await client.invoke(
            broker.addr, pull_request("LagT", 0, group="LG", queue_id=0, suspend_ms=0)
        )
        assert resp.code == ResponseCode.SUCCESS
        assert len(decode_records(resp.body_bytes())) == 6
        update = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "LG", "topic": "LagT", "queueId": "0", "commitOffset": "4"},
        )
        assert (await client.invoke(broker.addr, update)).code == ResponseCode.SUCCESS

    async def registered() -> bool:
        s = await scrape(mport)
        return any(("topic", "LagT") in ls for _, ls in s)

    await wait_until(registered, total=10, what="metrics of LagT")
    s = await scrape(mport)
    lag = value(s, "rocketmq_consumer_lag_messages", topic="LagT", consumer_group="LG")
    assert value(s, "rocketmq_consumer_inflight_messages", topic="LagT", consumer_group="LG") == 2
    progress: dict[str, int] = {}

    async def consumer_progress() -> bool:
        # Until the broker's registration carries LagT (the route mqadmin looks up).
        admin = await trio.run_process(
            [
                str(Path(sys.executable).parent / "mqadmin"),
                "consumerProgress",
                "-n",
                namesrv.addr,
                "-g",
                "LG",
                "-t",
                "LagT",
                "--json",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if admin.returncode != 0:
            return False
        progress.update(json.loads(admin.stdout))
        return True

    await wait_until(consumer_progress, total=30, interval=0.5, what="consumerProgress")
    assert lag == progress["diff_total"] == 23 - 4


async def test_namesrv_metrics(tmp_path: Path) -> None:
    cfg = NamesrvConfig(listen=f"127.0.0.1:{free_port()}", metrics_listen="127.0.0.1:0")
    async with NameServer(cfg) as ns:
        assert ns.metrics.server is not None
        mport = ns.metrics.server.port
        async with BrokerController(broker_config(tmp_path, None, namesrv_addr=ns.address)):
            s = await scrape(mport)
        assert value(s, "rocketmq_namesrv_broker_number", node_type="namesrv") == 1
        registrations = value(
            s,
            "rocketmq_rpc_latency_count",
            node_type="namesrv",
            request_code="register_broker",
            response_code="success",
        )
        assert registrations >= 1


async def test_hostile_http_clients_do_not_hang_the_server() -> None:
    server = MetricsHttpServer(
        "127.0.0.1",
        0,
        lambda: b"ok 1\n",
        max_head_bytes=4096,
        request_timeout_s=1.0,
        max_connections=4,
    )

    async def raw(data: bytes, *, close_write: bool = True) -> bytes:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            try:
                await stream.send_all(data)
                if close_write:
                    await stream.send_eof()
            except trio.BrokenResourceError:
                pass
            try:
                return await read_all(stream)
            except trio.BrokenResourceError:
                return b""

    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        assert await http_get(server.port) == (200, b"ok 1\n")
        assert (await http_get(server.port, "/other"))[0] == 404
        assert (await http_get(server.port, method="POST"))[0] == 405
        assert (await raw(b"\x00\xffgarbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await raw(b"")).startswith(b"HTTP/1.1 400")  # no request line at all
        big = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (1024 * 1024) + b"\r\n\r\n"
        assert (await raw(big)).startswith(b"HTTP/1.1 431")

        # Slowloris: a head that never ends is cut off at the time limit, and meanwhile
        # others are served; beyond the connection limit new ones are refused at once.
        slow_answers: list[bytes] = []

        async def slowloris() -> None:
            slow_answers.append(await raw(b"GET /metrics HTTP/1.1\r\nX: 1\r\n", close_write=False))

        # The answered connections above may still hold their slots (a refused head is
        # drained for a while before the close): all free first, so four slow clients fit.
        await wait_until(lambda: server._active == 0, total=10, what="the earlier connections")
        async with trio.open_nursery() as clients:
            for _ in range(4):
                clients.start_soon(slowloris)
            await wait_until(lambda: server._active == 4, total=2.5, what="4 slow clients")
            assert (await http_get(server.port))[0] == 503
        assert len(slow_answers) == 4
        assert all(a.startswith(b"HTTP/1.1 408") for a in slow_answers)
        assert await http_get(server.port) == (200, b"ok 1\n")
        nursery.cancel_scope.cancel()

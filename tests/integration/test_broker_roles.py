"""Broker roles: what a SLAVE refuses (sends, topic and group changes, transaction ends) with
RocketMQ's answers, and what it still serves (pulls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tests.helpers import free_port
from tests.integration.test_broker_process import pull_request, send_request

pytestmark = pytest.mark.usefixtures("staging_guard")


def slave_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        listen=f"127.0.0.1:{free_port()}",
        store_dir=str(tmp_path / "store"),
        mapped_file_size_commitlog=1024 * 1024,
        mapped_file_size_consume_queue=20_000,
        broker_role="SLAVE",
        broker_id=1,
    )


async def test_a_slave_refuses_writes_with_rocketmqs_answers_and_serves_reads(
    tmp_path: Path,
) -> None:
    async with BrokerController(slave_config(tmp_path)) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client:
            sent = await client.invoke(addr, send_request("TBW102", b"x"))
            assert sent.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert sent.remark is not None
            assert "messages are put to the slave" in sent.remark
            assert sent.remark.startswith("service not available now. It may be caused by")
            topic = RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {"topic": "NewT", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"},
            )
            changed = await client.invoke(addr, topic)
            assert changed.code == ResponseCode.SYSTEM_ERROR
            assert changed.remark == (
                "Can't modify topic or subscription group from slave broker, please execute "
                "it from master broker."
            )
            assert ctrl.topics.get("NewT") is None
            end = await client.invoke(addr, RemotingCommand.request(RequestCode.END_TRANSACTION))
            assert end.code == ResponseCode.SLAVE_NOT_AVAILABLE
            # Reads are served: a pull of an existing topic answers (nothing stored yet).
            pulled = await client.invoke(addr, pull_request("TBW102", 0))
            assert pulled.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED)
        assert ctrl.store.max_phy_offset == 0  # nothing appended


async def test_a_slave_appends_nothing_through_the_broker(tmp_path: Path) -> None:
    async with BrokerController(slave_config(tmp_path)) as ctrl:
        from common.message import MessageInner

        result = await ctrl.commits.put([MessageInner("T", b"x")])
        assert result.status.name == "SERVICE_NOT_AVAILABLE"
        assert ctrl.store.max_phy_offset == 0

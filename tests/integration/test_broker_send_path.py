"""The broker's send path with an in-process controller: a topic created by UPDATE_AND_CREATE_TOPIC
gets its consume-queue files before its first message; SYNC_FLUSH answers and the in-flight
limit."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from broker.config import BrokerConfig
from broker.controller import BrokerController
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from store.paths import consume_queue_dir
from tests.helpers import free_port, wait_until
from tests.integration.test_broker_process import send_request


def config(
    tmp_path: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"], **kw: object
) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "listen": f"127.0.0.1:{free_port()}",
            "store_dir": str(tmp_path / "store"),
            "mapped_file_size_commitlog": 1024 * 1024,
            "mapped_file_size_consume_queue": 20_000,
            "flush_disk_type": flush,
            **kw,
        }
    )


def create_topic(topic: str, queues: int) -> RemotingCommand:
    fields = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
    }
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)


async def test_created_topic_has_its_queue_files_before_the_first_send(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        root = Path(ctrl.store.config.store_path_root_dir)
        async with RemotingClient() as client:
            resp = await client.invoke(addr, create_topic("Fresh", 3))
            assert resp.code == ResponseCode.SUCCESS, resp.remark

            def prepared() -> bool:
                return all(
                    any(consume_queue_dir(root, "Fresh", q).glob("0" * 20)) for q in range(3)
                )

            await wait_until(prepared, what="consume-queue files of the new topic")
            assert ctrl.store.get_max_offset_in_queue("Fresh", 1) == 0
            sent = await client.invoke(addr, send_request("Fresh", b"hello", queue_id=1))
            assert sent.code == ResponseCode.SUCCESS
            assert sent.ext_fields is not None
            assert sent.ext_fields["queueOffset"] == "0"
            assert ctrl.store.get_max_offset_in_queue("Fresh", 1) == 1

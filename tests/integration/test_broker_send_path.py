"""The broker's send path with an in-process controller: a topic created by UPDATE_AND_CREATE_TOPIC
gets its consume-queue files before its first message; SYNC_FLUSH answers and the in-flight
limit."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.message import (
    BatchItem,
    decode_properties,
    decode_records,
    encode_batch_body,
    encode_properties,
)
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from store.paths import consume_queue_dir
from tests.helpers import free_port, wait_until
from tests.integration.test_broker_process import send_request

# Every in-process store here keeps the staging rule (the test fails otherwise).
pytestmark = pytest.mark.usefixtures("staging_guard")


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


async def test_sync_flush_send_is_answered_only_once_durable(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "SYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        flush = ctrl.store.flush_service
        mfq = ctrl.store.commitlog.mfq
        async with RemotingClient() as client:
            answers: list[tuple[int, int]] = []

            async def send(i: int) -> None:
                resp = await client.invoke(addr, send_request("Durable", b"m%d" % i))
                answers.append((resp.code, mfq.flushed_where))

            # While the lock is held no group commit can run.
            async with trio.open_nursery() as nursery, flush.commitlog_lock:
                for i in range(8):
                    nursery.start_soon(send, i)
                await wait_until(
                    lambda: ctrl.store.get_max_offset_in_queue("Durable", 0) == 8,
                    what="the 8 messages appended",
                )
                await trio.sleep(0.05)
                assert answers == []  # written, not durable: no answer yet
            assert [code for code, _ in answers] == [ResponseCode.SUCCESS] * 8
            # Each answer left after the fsync that covered all 8 records.
            assert all(flushed == mfq.max_offset for _, flushed in answers)


async def test_sync_flush_timeout_is_still_reported(tmp_path: Path) -> None:
    cfg = config(tmp_path, "SYNC_FLUSH", sync_flush_timeout_ms=100)
    async with BrokerController(cfg) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        async with RemotingClient() as client, ctrl.store.flush_service.commitlog_lock:
            resp = await client.invoke(addr, send_request("Slow", b"late"))
        assert resp.code == ResponseCode.FLUSH_DISK_TIMEOUT
        assert resp.ext_fields is not None
        assert resp.ext_fields["queueOffset"] == "0"  # stored all the same
        assert resp.ext_fields["msgId"]
        assert "MSG_REGION" in resp.ext_fields


PROPERTY_TEXTS = [
    "UNIQ_KEY\x01AB12\x02WAIT\x01true\x02TAGS\x01TagA",
    "WAIT\x01true",
    "KEYS\x01a\x01WAIT\x01true\x02TAGS\x01t",
    "A\x011\x02A\x012\x02WAIT\x01true",
    "A\x011\x02",
    "CLUSTER\x01mine\x02B\x012",
]


def stored_reference(raw: str, added: dict[str, str]) -> bytes:
    props = decode_properties(raw)
    props.update(added)
    return encode_properties({k: v for k, v in props.items() if k != "WAIT"}).encode()


async def test_stored_properties_match_the_dict_encoding(tmp_path: Path) -> None:
    async with BrokerController(config(tmp_path, "ASYNC_FLUSH")) as ctrl:
        addr = f"127.0.0.1:{ctrl.port}"
        cluster = {"CLUSTER": ctrl.config.broker_cluster_name}
        async with RemotingClient() as client:
            for raw in PROPERTY_TEXTS:
                req = send_request("PropT", b"x", code=RequestCode.SEND_MESSAGE)
                assert req.ext_fields is not None
                req.ext_fields["properties"] = raw
                resp = await client.invoke(addr, req)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            items = [BatchItem(0, b"b%d" % i, raw) for i, raw in enumerate(PROPERTY_TEXTS)]
            batch = send_request(
                "PropB",
                encode_batch_body(items),
                code=RequestCode.SEND_BATCH_MESSAGE,
                props={"WAIT": "true", "H": "1"},
            )
            resp = await client.invoke(addr, batch)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        store = ctrl.store
        single = store.get_message_nowait("g", "PropT", 0, 0, 32, 1 << 20)
        got = [m._properties_raw for m in decode_records(b"".join(single.buffers))]
        assert got == [stored_reference(raw, cluster) for raw in PROPERTY_TEXTS]
        batched = store.get_message_nowait("g", "PropB", 0, 0, 32, 1 << 20)
        got = [m._properties_raw for m in decode_records(b"".join(batched.buffers))]
        added = {"WAIT": "true", "H": "1", **cluster}
        assert got == [stored_reference(raw, added) for raw in PROPERTY_TEXTS]

"""Damaged and missing store files on a real broker.

Defect 7: a byte flipped in the middle of the first of two commitlog files costs that one
message: the broker keeps the second file, serves every other message, copies the damaged bytes
to ``<store>/damaged/`` and reports them in its log and in ``brokerStatus``.

Defect 8: with ``index/`` deleted, the broker rebuilds the index from the commitlog in the
background and QUERY_MESSAGE by key finds every key again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from client import Admin
from client.errors import NoRouteError
from common.message import decode_records
from remoting import RemotingClient, ResponseCode
from store.paths import commitlog_dir, index_dir
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_broker_process import pull_request, send_request

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILE = 128 * 1024
ENV = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(FILE),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(1000 * 20),
}
TOPIC = "DamageT"
REPO = Path(__file__).resolve().parents[2]


async def _send(addr: str, n: int) -> list[str]:
    keys = []
    async with RemotingClient() as client:
        for i in range(n):
            key = f"k{i}"
            body = f"msg-{i}|".encode() + b"x" * 400
            resp = await client.invoke(
                addr, send_request(TOPIC, body, queue_id=i % 4, props={"KEYS": key})
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            keys.append(key)
    return keys


async def _consume_all(addr: str) -> list[int]:
    got: list[int] = []
    async with RemotingClient() as client:
        for qid in range(4):
            offset = 0
            for _ in range(1000):
                resp = await client.invoke(
                    addr, pull_request(TOPIC, offset, queue_id=qid, max_msgs=64)
                )
                nxt = int((resp.ext_fields or {}).get("nextBeginOffset", offset))
                if resp.code == ResponseCode.SUCCESS:
                    got.extend(
                        int((m.body or b"").split(b"|")[0][4:])
                        for m in decode_records(resp.body_bytes())
                    )
                elif nxt <= offset:
                    break
                offset = nxt
    return sorted(got)


def _record_at_middle(path: Path) -> tuple[int, int]:
    """(start, size) of the record holding the middle byte of a commitlog file."""
    data = path.read_bytes()
    pos = 0
    while True:
        size = int.from_bytes(data[pos : pos + 4], "big")
        if pos + size > len(data) // 2:
            return pos, size
        pos += size


def test_a_flipped_byte_costs_one_message_not_the_rest(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr, env=ENV)
    n = 300  # ~600 B each: two 128 KiB files
    trio.run(_send, broker.addr, n)
    assert broker.stop() == 0
    files = sorted(commitlog_dir(broker.store_dir).iterdir())
    assert len(files) == 2
    start, size = _record_at_middle(files[0])
    with files[0].open("r+b") as f:
        f.seek(start + 100)  # in the body (the header is 92 bytes)
        b = f.read(1)
        f.seek(start + 100)
        f.write(bytes([b[0] ^ 0x01]))

    check = subprocess.run(
        [sys.executable, "-m", "store.check", str(broker.store_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert check.returncode == 1, check.stdout + check.stderr
    assert f"damaged region: offset {start}, {size} bytes, 1 record(s)" in check.stdout

    broker.start()
    got = trio.run(_consume_all, broker.addr)
    lost = n - len(got)
    print(f"{lost} of {n} acknowledged messages lost after one flipped byte")
    assert lost == 1
    assert sorted(commitlog_dir(broker.store_dir).iterdir()) == files
    copy = broker.store_dir / "damaged" / f"{start}-{size}.bin"
    assert copy.exists()
    log = broker.log_text()
    assert "store_damage_report" in log
    assert f"{start}:{size}:1" in log

    async def status() -> dict[str, str]:
        async with Admin(fast_config(namesrv.addr)) as admin:
            return await admin.broker_status(broker.addr)

    table = trio.run(status)
    assert table["recoveryDamagedRegions"] == f"{start}:{size}:1"
    assert table["recoveryDamagedRecords"] == "1"
    assert table["recoveryDamagedBytes"] == str(size)


def test_a_deleted_index_is_rebuilt(
    namesrv: NamesrvProc, start_broker: Callable[..., BrokerProc]
) -> None:
    broker = start_broker(namesrv.addr, env=ENV)
    trio.run(create_topic, namesrv.addr, TOPIC)
    keys = trio.run(_send, broker.addr, 20)

    async def found() -> int:
        async with Admin(fast_config(namesrv.addr)) as admin:
            n = 0
            for key in keys:
                n += len(await admin.query_msg_by_key(TOPIC, key)) == 1
            return n

    assert trio.run(found) == 20
    assert broker.stop() == 0
    shutil.rmtree(index_dir(broker.store_dir))
    broker.start()

    async def found_eventually() -> int:
        n = 0
        with trio.move_on_after(20):
            while True:
                try:
                    n = await found()
                except NoRouteError:  # the restarted broker has not registered yet
                    n = 0
                if n == len(keys):
                    break
                await trio.sleep(0.2)
        return n

    n = trio.run(found_eventually)
    print(f"index/ deleted: {n} of {len(keys)} keys found after the rebuild")
    assert n == len(keys)
    log = broker.log_text()
    assert "index_rebuild_started" in log
    assert "index_rebuild_finished" in log

"""A broker whose store fills a small tmpfs.

Defect 5: the broker died with SIGBUS writing a consume-queue unit into a mapped page of a sparse
file once the disk was full. Now every mapped file has its space reserved before it is mapped,
sends are refused with SERVICE_NOT_AVAILABLE ("maybe disk full") when space runs out, and the
broker keeps serving pulls and takes sends again once space is freed.

Defect 6: with another program's 40 MiB file on the 64 MiB disk, cleanup deleted commitlog files
holding acknowledged messages no group had consumed. Now, by default, such files are kept
(deleted only by age) and sends are refused instead, with the reason in the log and in
GET_BROKER_RUNTIME_INFO.

Each test mounts its own tmpfs (we run as root in CI) and unmounts it in a `finally`; it is
skipped where mounting is not possible.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from common.message import BatchItem, decode_records, encode_batch_body
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode, SerializeType
from remoting.errors import RemotingError
from tests.integration.procs import BrokerProc
from tests.integration.test_broker_process import PULL_SUBSCRIPTION, pull_request, send_request

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "DiskT"
GROUP = "DiskG"
QUEUES = 4
BODY = 1024
BATCH = 16

ENV = {
    "TRIMQ_MAPPED_FILE_SIZE_COMMITLOG": str(1 << 20),
    "TRIMQ_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * 4096),
    "TRIMQ_MAX_HASH_SLOT_NUM": "4096",
    "TRIMQ_MAX_INDEX_NUM": "16384",
    "TRIMQ_CLEAN_RESOURCE_INTERVAL_MS": "1000",
}


@contextlib.contextmanager
def tmpfs(where: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of `size_mib` MiB mounted at `where` for the block; skip the test if mounting
    is impossible (not root, no mount(8), a sandbox without CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _body(seq: int) -> bytes:
    return b"%08d|" % seq + b"x" * (BODY - 9)


def _batch(seqs: list[int]) -> bytes:
    items = [BatchItem(0, _body(s), "") for s in seqs]
    return encode_batch_body(items)


def _create_topic() -> RemotingCommand:
    fields = {
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "readQueueNums": str(QUEUES),
        "writeQueueNums": str(QUEUES),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
    }
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)


def _commit(queue_id: int, offset: int) -> RemotingCommand:
    fields = {
        "consumerGroup": GROUP,
        "topic": TOPIC,
        "queueId": str(queue_id),
        "commitOffset": str(offset),
    }
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields)


class Filler:
    """Concurrent batch senders until every one was refused (or the broker is gone)."""

    def __init__(self, client: RemotingClient, addr: str) -> None:
        self.client = client
        self.addr = addr
        self.acked: set[int] = set()
        self.refusals: list[tuple[int, str]] = []
        self.seq = 0
        self.lost_connection = False

    async def _sender(self, queue_id: int, limit: int) -> None:
        """Batches until the first refusal, then single sends, as producers that retry do,
        until 40 refusals in a row (a full disk that stays full)."""
        refused_in_a_row = 0
        while len(self.acked) < limit and refused_in_a_row < 40:
            n = 1 if self.refusals else BATCH
            seqs = list(range(self.seq, self.seq + n))
            self.seq += n
            if n == 1:
                req = send_request(TOPIC, _body(seqs[0]), queue_id=queue_id)
            else:
                req = send_request(
                    TOPIC, _batch(seqs), queue_id=queue_id, code=RequestCode.SEND_BATCH_MESSAGE
                )
            try:
                resp = await self.client.invoke(self.addr, req, timeout_ms=10_000)
            except RemotingError:
                self.lost_connection = True
                return
            if resp.code == ResponseCode.SUCCESS:
                self.acked.update(seqs)
                refused_in_a_row = 0
            else:
                self.refusals.append((resp.code, resp.remark or ""))
                refused_in_a_row += 1
                await trio.sleep(0.02)

    async def run(self, limit: int) -> None:
        async with trio.open_nursery() as nursery:
            for q in range(QUEUES):
                nursery.start_soon(self._sender, q, limit)


async def _read_all(client: RemotingClient, addr: str) -> set[int]:
    """Every message still readable (pulls of another group, nothing committed)."""
    found: set[int] = set()
    for q in range(QUEUES):
        offset = 0
        while True:
            resp = await client.invoke(
                addr,
                pull_request(TOPIC, offset, group="Reader", queue_id=q, max_msgs=512,
                             sys_flag=PULL_SUBSCRIPTION, suspend_ms=0),
            )  # fmt: skip
            ext = resp.ext_fields or {}
            if resp.code != ResponseCode.SUCCESS:
                nxt = int(ext.get("nextBeginOffset", offset))
                if resp.code == ResponseCode.PULL_OFFSET_MOVED and nxt > offset:
                    offset = nxt  # messages deleted below: skip to what is left
                    continue
                break
            for m in decode_records(resp.body_bytes()):
                found.add(int((m.body or b"")[:8]))
            offset = int(ext["nextBeginOffset"])
    return found


async def _runtime_info(client: RemotingClient, addr: str) -> dict[str, str]:
    resp = await client.invoke(
        addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, None)
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return dict(json.loads(resp.body_bytes())["table"])


async def _fill_and_check(broker: BrokerProc, disk: Path, filler_mib: int) -> None:
    filler = disk / "other-program.dat"
    if filler_mib:
        with filler.open("wb") as fh:  # another program's data, really written
            fh.write(b"\x5a" * (filler_mib << 20))
    await trio.to_thread.run_sync(broker.start)
    async with RemotingClient(serialize_type=SerializeType.JSON) as client:
        resp = await client.invoke(broker.addr, _create_topic())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # A subscribed group that has consumed nothing yet.
        for q in range(QUEUES):
            resp = await client.invoke(broker.addr, _commit(q, 0))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        fill = Filler(client, broker.addr)
        with trio.move_on_after(40):
            await fill.run(limit=60_000)
        # Let cleanup rounds (every second) run against the full disk.
        await trio.sleep(3)
        alive = broker.running
        found = await _read_all(client, broker.addr) if alive else set()
        lost = len(fill.acked - found)
        print(
            f"\nDISK-FULL filler={filler_mib}MiB acked={len(fill.acked)} lost={lost} "
            f"alive={alive} returncode={broker.returncode} refusals={fill.refusals[:1]}"
        )
        assert alive, f"broker died (exit {broker.returncode}); log:\n{broker.log_tail(30)}"
        assert not fill.lost_connection
        assert len(fill.acked) > 5000
        assert lost == 0, f"{lost} of {len(fill.acked)} acknowledged messages lost"
        # Refused with RocketMQ's code and a clear remark, not a dropped connection.
        assert fill.refusals
        code, remark = fill.refusals[0]
        assert code == ResponseCode.SERVICE_NOT_AVAILABLE, (code, remark)
        assert "maybe disk full" in remark, remark
        info = await _runtime_info(client, broker.addr)
        assert info["diskFull"] == "true", info
        assert info["putRefusedReason"], info
        if filler_mib:
            # Cleanup wanted space, and said why it kept the files.
            assert "not consumed" in info["commitLogCleanBlocked"], info
            assert "commitlog_kept_for_consumers" in broker.log_text()
        # Space comes back (the other program's file goes, or the group consumes): sends
        # are taken again by themselves.
        if filler_mib:
            await trio.to_thread.run_sync(filler.unlink)
        else:
            for q in range(QUEUES):
                mx = await client.invoke(
                    broker.addr,
                    RemotingCommand.request(
                        RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)}
                    ),
                )
                offset = int((mx.ext_fields or {})["offset"])
                resp = await client.invoke(broker.addr, _commit(q, offset))
                assert resp.code == ResponseCode.SUCCESS
        with trio.fail_after(15):
            while True:
                req = send_request(TOPIC, b"%08d|again" % 99_999_999, queue_id=0)
                resp = await client.invoke(broker.addr, req)
                if resp.code == ResponseCode.SUCCESS:
                    break
                assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp.remark
                await trio.sleep(0.2)
        info = await _runtime_info(client, broker.addr)
        assert info["diskFull"] == "false", info
    assert broker.stop() == 0, broker.log_tail(30)


async def test_full_disk_refuses_sends_and_keeps_the_broker_up(tmp_path: Path) -> None:
    """Defect 5: SYNC_FLUSH on a 32 MiB tmpfs, filled by batch sends."""
    with tmpfs(tmp_path / "disk", 32) as disk:
        broker = BrokerProc(
            tmp_path / "broker", "", store_dir=disk / "store", flush="sync", env=ENV
        )
        try:
            await _fill_and_check(broker, disk, 0)
        finally:
            broker.kill()


async def test_disk_pressure_keeps_unconsumed_messages(tmp_path: Path) -> None:
    """Defect 6: another program's 40 MiB on a 64 MiB tmpfs; a group that consumed nothing."""
    with tmpfs(tmp_path / "disk", 64) as disk:
        broker = BrokerProc(tmp_path / "broker", "", store_dir=disk / "store", env=ENV)
        try:
            await _fill_and_check(broker, disk, 40)
        finally:
            broker.kill()


def test_tmpfs_helper_unmounts(tmp_path: Path) -> None:
    where = tmp_path / "m"
    with tmpfs(where, 1):
        (where / "f").write_bytes(b"x")
    assert not os.path.ismount(where)

"""A real child process appends under SYNC_FLUSH, printing every acknowledged message; it is
SIGKILLed mid-write. Reopened here, every acknowledged message must be readable with the same
offsets and bytes, and everything present must be something the child wrote."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import trio

from common.message import decode_records
from store import GetMessageStatus, MessageStore, StoreConfig

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys
    import trio
    from store import MessageStore, PutMessageStatus, StoreConfig
    from common.message import MessageInner

    def body(seq):
        return (b"%d|" % seq) * (1 + seq % 50)

    async def main(root):
        cfg = StoreConfig(
            store_path_root_dir=root,
            mapped_file_size_commitlog=64 * 1024,
            mapped_file_size_consume_queue=50 * 20,
            flush_disk_type="SYNC_FLUSH",
            max_hash_slot_num=256,
            max_index_num=4096,
        )
        seq = [0]
        async with MessageStore(cfg) as store:
            async def writer(w):
                while True:
                    seq[0] += 1
                    s = seq[0]
                    m = MessageInner("K", body(s), queue_id=s % 4, properties={"KEYS": str(s)})
                    r = await store.put_message(m)
                    if r.status is PutMessageStatus.PUT_OK:
                        a = r.append
                        sys.stdout.write(f"ACK {s % 4} {a.queue_offset} {a.wrote_offset} {s}\\n")
                        sys.stdout.flush()
            async with trio.open_nursery() as n:
                for w in range(8):
                    n.start_soon(writer, w)

    trio.run(main, sys.argv[1])
    """
)


def _body(seq: int) -> bytes:
    return (b"%d|" % seq) * (1 + seq % 50)


def test_sigkill_mid_write_keeps_acknowledged(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    )
    assert proc.stdout is not None
    buf = b""
    deadline = time.monotonic() + 60
    try:
        while buf.count(b"ACK ") < 1500 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        buf += rest
    lines = buf.split(b"\n")[:-1]  # a torn last line is not an acknowledgement
    acks = [tuple(int(x) for x in line.split()[1:]) for line in lines if line.startswith(b"ACK ")]
    assert len(acks) >= 200, f"child acknowledged only {len(acks)} messages"
    assert (root / "abort").exists()

    async def check() -> None:
        cfg = StoreConfig(
            store_path_root_dir=root,
            mapped_file_size_commitlog=64 * 1024,
            mapped_file_size_consume_queue=50 * 20,
            max_hash_slot_num=256,
            max_index_num=4096,
        )
        async with MessageStore(cfg) as store:
            assert store.last_exit_ok is False
            for q, qoff, phy, seq in acks:
                m = store.look_message_by_offset(phy)
                assert m is not None, (q, qoff, phy, seq)
                assert (m.queue_id, m.queue_offset, m.body) == (q, qoff, _body(seq))
                assert m.keys == str(seq)
            # everything stored is something the child wrote, with contiguous queue offsets
            for q in range(4):
                off = 0
                while True:
                    res = await store.get_message("g", "K", q, off, 32, 1 << 24)
                    if res.status is not GetMessageStatus.FOUND:
                        break
                    for i, m in enumerate(decode_records(b"".join(res.buffers))):
                        assert m.queue_id == q
                        assert m.queue_offset == res.queue_offsets[i]
                        assert m.body == _body(int(m.keys or "-1"))
                    off = res.next_begin_offset
                acked_max = max((a[1] for a in acks if a[0] == q), default=-1)
                assert off == store.get_max_offset_in_queue("K", q)
                assert off > acked_max
            # a few keys resolve through the rebuilt/kept index
            q, qoff, phy, seq = acks[-1]
            found = store.query_message("K", str(seq), 4, 0, 2**62)
            assert len(found.buffers) == 1

    trio.run(check)

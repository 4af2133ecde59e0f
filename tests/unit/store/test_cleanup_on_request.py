"""Cleanup an admin asks for (DELETE_EXPIRED_COMMITLOG, CLEAN_EXPIRED_CONSUMEQUEUE): expired
files go whatever the hour, young ones stay; consume-queue files follow the commitlog."""

from __future__ import annotations

import time
from pathlib import Path

from store import MessageStore
from store.paths import consume_queue_dir
from tests.unit.store.test_cleanup import cfg, files, fill


async def test_delete_expired_now_ignores_the_hour_not_the_age(tmp_path: Path) -> None:
    now = [time.time()]
    other_hour = (time.localtime(now[0] + 73 * 3600).tm_hour + 1) % 24
    async with MessageStore(
        cfg(tmp_path, other_hour), clock=lambda: now[0], disk_usage=lambda p: 0.1
    ) as store:
        await fill(store)
        n_files = len(files(tmp_path))
        assert n_files > 3
        svc = store.cleanup_service
        # Within the reserved time: nothing goes.
        assert await svc.delete_expired_now() == 0
        assert len(files(tmp_path)) == n_files
        # Past it: every file but the current one, although it is not the delete hour.
        now[0] += 73 * 3600
        assert await svc.clean_once() == 0
        assert await svc.delete_expired_now() == n_files - 1
        assert len(files(tmp_path)) == 1
        qmin = store.get_min_offset_in_queue("T", 0)
        assert qmin > 0
        cq_files = sorted(consume_queue_dir(tmp_path, "T", 0).iterdir())
        assert len(cq_files) < 40 // 5
        # Nothing more to do: both requests are no-ops now.
        await svc.clean_expired_consume_queues()
        assert await svc.delete_expired_now() == 0
        assert store.get_min_offset_in_queue("T", 0) == qmin
        assert sorted(consume_queue_dir(tmp_path, "T", 0).iterdir()) == cq_files

"""Consumer offsets: `topic@group` -> {queue id: next offset to consume}.

Kept in memory; `config/consumerOffset.json` is rewritten (atomically) by the controller every
`consumer_offset_persist_interval_ms` and at shutdown when something changed. Files written by
Apache RocketMQ (unquoted integer keys) load too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import structlog

from broker._persist import CONFIG_DIR, CONSUMER_OFFSET_FILE, read_json_file, write_atomically
from remoting.protocol.bodies import dumps

log = structlog.get_logger()

TOPIC_GROUP_SEPARATOR = "@"


class OffsetManager:
    """In-memory offset table with crash-safe persistence."""

    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / CONFIG_DIR / CONSUMER_OFFSET_FILE
        self._table: dict[str, dict[int, int]] = {}
        self.dirty = False

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    # -- persistence ------------------------------------------------------------------------
    def load(self) -> None:
        raw = read_json_file(self.path)
        if not isinstance(raw, dict):
            return
        for key, queues in (raw.get("offsetTable") or {}).items():
            try:
                self._table[str(key)] = {int(q): int(o) for q, o in queues.items()}
            except (AttributeError, TypeError, ValueError) as exc:
                log.warning("consumer_offset_skipped", key=key, error=str(exc))

    def encode(self) -> bytes:
        return dumps({"offsetTable": self._table})

    def snapshot(self) -> bytes:
        """The file contents now; clears `dirty` (encode on the event loop, write elsewhere)."""
        self.dirty = False
        return self.encode()

    def persist(self) -> None:
        """Write the table now (blocking: from async code, write `snapshot()` in a thread)."""
        write_atomically(self.path, self.snapshot())

    def take_master(self, table: dict[str, dict[int, int]]) -> None:
        """A slave takes its master's offsets: the master's queues of a key replace the
        slave's (RocketMQ's `putAll`); keys only the slave has stay."""
        for key, queues in table.items():
            self._table[key] = dict(queues)
        self.dirty = True

    def merge_max(self, table: dict[str, dict[int, int]]) -> int:
        """Take each queue's offset from `table` where it is larger than this broker's (a
        master taking back what consumers committed on its slave while it was away).
        Returns how many queues moved."""
        moved = 0
        for key, queues in table.items():
            mine = self._table.setdefault(key, {})
            for qid, offset in queues.items():
                if offset > mine.get(qid, -1):
                    mine[qid] = offset
                    moved += 1
            if not mine:
                del self._table[key]
        if moved:
            self.dirty = True
        return moved

    # -- operations -------------------------------------------------------------------------
    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self._table.setdefault(self.key(topic, group), {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when there is none."""
        queues = self._table.get(self.key(topic, group))
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def query_table(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(self.key(topic, group), {}))

    def topics_of_group(self, group: str) -> set[str]:
        out = set()
        for key in self._table:
            topic, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if g == group:
                out.add(topic)
        return out

    def topics_by_group(self) -> dict[str, set[str]]:
        """Every group with offsets -> the topics it has offsets of (one pass)."""
        out: dict[str, set[str]] = {}
        for key in self._table:
            topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            out.setdefault(group, set()).add(topic)
        return out

    def groups_of_topic(self, topic: str) -> set[str]:
        out = set()
        for key in self._table:
            t, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if t == topic:
                out.add(g)
        return out

    def remove_topics(self, topics: Iterable[str]) -> None:
        doomed = set(topics)
        for key in list(self._table):
            if key.rpartition(TOPIC_GROUP_SEPARATOR)[0] in doomed:
                del self._table[key]
                self.dirty = True

    def remove_group(self, group: str) -> list[str]:
        """Drop every topic's offsets of `group` (RocketMQ's `removeOffset`); the topics whose
        offsets went, sorted. The file is rewritten by the next persist (`dirty`)."""
        gone = []
        for key in list(self._table):
            topic, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if g == group:
                del self._table[key]
                gone.append(topic)
        if gone:
            self.dirty = True
        return sorted(gone)

    def keys(self) -> list[str]:
        return list(self._table)

    def entries(self) -> Iterator[tuple[str, str, dict[int, int]]]:
        """(topic, group, {queue id: offset}) of every committed table (live: do not await
        while iterating)."""
        for key, queues in self._table.items():
            topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            yield topic, group, queues

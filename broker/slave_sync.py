"""A slave's copy of its master's metadata (RocketMQ's `SlaveSynchronize`): topic configs,
consumer offsets, delay-level offsets and subscription groups, every `slave_sync_interval_ms`
and as soon as the NameServer names a (new) master. The commitlog comes over the HA stream
(`broker.ha`); this is what the master keeps outside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
import trio

from remoting import RemotingClient, RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.bodies import SubscriptionGroupWrapper, loads_tolerant
from remoting.protocol.route import TopicConfigSerializeWrapper

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["BrokerMetadata", "SlaveSynchronize", "fetch_metadata"]

log = structlog.get_logger()


class SlaveSynchronize:
    """Copies the master's metadata to this slave (see the module docstring)."""

    def __init__(self, ctrl: BrokerController, period_s: float, timeout_ms: int = 3000) -> None:
        self.ctrl = ctrl
        self.period_s = period_s
        self.timeout_ms = timeout_ms
        self.rounds = 0
        self._kick = trio.Event()

    def trigger(self) -> None:
        """Copy again at once (the master changed)."""
        self._kick.set()

    async def run(self) -> None:
        """Copy every period, or at once when triggered, until cancelled."""
        while True:
            with trio.move_on_after(self.period_s):
                await self._kick.wait()
            self._kick = trio.Event()
            addr = self.ctrl.master_addr
            if addr:
                await self.sync_all(addr)

    async def sync_all(self, addr: str) -> bool:
        """One copy from the master at `addr`; False when a part failed (logged)."""
        ctrl = self.ctrl
        meta = await fetch_metadata(ctrl.client, addr, self.timeout_ms)
        if meta.topics is not None and ctrl.topics.take_master(
            meta.topics.topic_config_table, meta.topics.data_version
        ):
            ctrl.on_topics_changed()
        if meta.offsets is not None:
            ctrl.offsets.take_master(meta.offsets)
        if meta.delay_offsets is not None:
            ctrl.schedule.offsets.update(meta.delay_offsets)
            ctrl.schedule.dirty = True
        if meta.groups is not None:
            ctrl.subscriptions.take_master(meta.groups)
        self.rounds += 1
        return meta.complete


@dataclass(slots=True)
class BrokerMetadata:
    """What a broker keeps outside its commitlog, as another broker answered it (None: that
    part could not be read; logged)."""

    topics: TopicConfigSerializeWrapper | None = None
    offsets: dict[str, dict[int, int]] | None = None
    delay_offsets: dict[int, int] | None = None
    groups: SubscriptionGroupWrapper | None = None

    @property
    def complete(self) -> bool:
        return None not in (self.topics, self.offsets, self.delay_offsets, self.groups)


async def fetch_metadata(client: RemotingClient, addr: str, timeout_ms: int) -> BrokerMetadata:
    """Topic configs (21), consumer offsets (43), delay offsets (45) and subscription groups
    (201) of the broker at `addr`."""
    meta = BrokerMetadata()
    body = await _get(client, addr, RequestCode.GET_ALL_TOPIC_CONFIG, timeout_ms)
    if body is not None:
        try:
            meta.topics = TopicConfigSerializeWrapper.from_json(body)
        except ValueError as exc:
            log.warning("metadata_bad_body", peer=addr, what="topics", error=str(exc))
    body = await _get(client, addr, RequestCode.GET_ALL_CONSUMER_OFFSET, timeout_ms)
    if body is not None:
        meta.offsets = _offset_table(body)
    body = await _get(client, addr, RequestCode.GET_ALL_DELAY_OFFSET, timeout_ms)
    if body is not None:
        meta.delay_offsets = _offset_table_flat(body)
    body = await _get(client, addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, timeout_ms)
    if body is not None:
        try:
            meta.groups = SubscriptionGroupWrapper.from_json(body)
        except ValueError as exc:
            log.warning("metadata_bad_body", peer=addr, what="subscription groups", error=str(exc))
    return meta


async def _get(client: RemotingClient, addr: str, code: int, timeout_ms: int) -> bytes | None:
    try:
        resp = await client.invoke(addr, RemotingCommand.request(code), timeout_ms)
    except RemotingError as exc:
        log.warning("metadata_fetch_failed", peer=addr, code=code, error=str(exc))
        return None
    if resp.code != ResponseCode.SUCCESS:
        log.warning("metadata_fetch_refused", peer=addr, code=code, remark=resp.remark)
        return None
    return resp.body_bytes()


def _offset_table(body: bytes) -> dict[str, dict[int, int]] | None:
    """`{"offsetTable": {"topic@group": {"0": n, ...}}}` (fastjson may leave keys bare)."""
    try:
        raw = loads_tolerant(body)
        table = raw["offsetTable"] if isinstance(raw, dict) else None
        if not isinstance(table, dict):
            return None
        return {str(k): {int(q): int(o) for q, o in v.items()} for k, v in table.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("metadata_bad_body", what="consumer offsets", error=str(exc))
        return None


def _offset_table_flat(body: bytes) -> dict[int, int] | None:
    """`{"offsetTable": {"1": n, ...}}` (delay levels)."""
    try:
        raw = loads_tolerant(body)
        table = raw["offsetTable"] if isinstance(raw, dict) else None
        if not isinstance(table, dict):
            return None
        return {int(k): int(v) for k, v in table.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("metadata_bad_body", what="delay offsets", error=str(exc))
        return None

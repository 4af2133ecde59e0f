"""A slave's copy of its master's metadata (RocketMQ's `SlaveSynchronize`): topic configs,
consumer offsets, delay-level offsets and subscription groups, every `slave_sync_interval_ms`
and as soon as the NameServer names a (new) master. The commitlog comes over the HA stream
(`broker.ha`); this is what the master keeps outside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
import trio

from remoting import RemotingCommand, RemotingError, RequestCode, ResponseCode
from remoting.protocol.bodies import SubscriptionGroupWrapper, loads_tolerant
from remoting.protocol.route import TopicConfigSerializeWrapper

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["SlaveSynchronize"]

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
        ok = True
        body = await self._get(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        if body is None:
            ok = False
        else:
            try:
                wrapper = TopicConfigSerializeWrapper.from_json(body)
            except ValueError as exc:
                log.warning("slave_sync_bad_body", what="topics", error=str(exc))
                ok = False
            else:
                if ctrl.topics.take_master(wrapper.topic_config_table, wrapper.data_version):
                    ctrl.on_topics_changed()
        body = await self._get(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        table = _offset_table(body) if body is not None else None
        if table is None:
            ok = False
        else:
            ctrl.offsets.take_master(table)
        body = await self._get(addr, RequestCode.GET_ALL_DELAY_OFFSET)
        levels = _offset_table_flat(body) if body is not None else None
        if levels is None:
            ok = False
        else:
            ctrl.schedule.offsets.update(levels)
            ctrl.schedule.dirty = True
        body = await self._get(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if body is None:
            ok = False
        else:
            try:
                ctrl.subscriptions.take_master(SubscriptionGroupWrapper.from_json(body))
            except ValueError as exc:
                log.warning("slave_sync_bad_body", what="subscription groups", error=str(exc))
                ok = False
        self.rounds += 1
        return ok

    async def _get(self, addr: str, code: int) -> bytes | None:
        try:
            resp = await self.ctrl.client.invoke(
                addr, RemotingCommand.request(code), self.timeout_ms
            )
        except RemotingError as exc:
            log.warning("slave_sync_failed", master=addr, code=code, error=str(exc))
            return None
        if resp.code != ResponseCode.SUCCESS:
            log.warning("slave_sync_refused", master=addr, code=code, remark=resp.remark)
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
        log.warning("slave_sync_bad_body", what="consumer offsets", error=str(exc))
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
        log.warning("slave_sync_bad_body", what="delay offsets", error=str(exc))
        return None

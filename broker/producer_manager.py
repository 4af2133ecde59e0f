"""Online producers: group -> client id -> channel (for transaction check-back and admin)."""

from __future__ import annotations

import structlog

from broker.consumer_manager import Channel, ClientChannelInfo, monotonic_ms

log = structlog.get_logger()


class ProducerManager:
    """Producer groups seen through heartbeats."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, ClientChannelInfo]] = {}

    def register(self, group: str, client: ClientChannelInfo, now_ms: int | None = None) -> None:
        client.last_update_ms = monotonic_ms() if now_ms is None else now_ms
        members = self._groups.setdefault(group, {})
        if client.client_id not in members:
            log.debug("producer_registered", group=group, client_id=client.client_id)
        members[client.client_id] = client

    def unregister(self, group: str, client_id: str) -> bool:
        members = self._groups.get(group)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._groups[group]
        return True

    def remove_channel(self, channel: Channel) -> None:
        for group, members in list(self._groups.items()):
            for cid, info in list(members.items()):
                if info.channel is channel:
                    del members[cid]
            if not members:
                del self._groups[group]

    def scan_idle(self, idle_ms: int, now_ms: int | None = None) -> list[Channel]:
        now = monotonic_ms() if now_ms is None else now_ms
        dropped = []
        for group, members in list(self._groups.items()):
            for cid, info in list(members.items()):
                if now - info.last_update_ms > idle_ms:
                    del members[cid]
                    dropped.append(info.channel)
                    log.info("producer_channel_expired", group=group, client_id=cid)
            if not members:
                del self._groups[group]
        return dropped

    def members(self, group: str) -> list[ClientChannelInfo]:
        return list(self._groups.get(group, {}).values())

    def groups(self) -> list[str]:
        return list(self._groups)

    def find_channel(self, client_id: str) -> Channel | None:
        """The connection of client `client_id` (any of its producer groups), the most
        recently heard one; None when no producer of that client is known (RocketMQ's
        ProducerManager.findChannel, used to push replies)."""
        best: ClientChannelInfo | None = None
        for members in self._groups.values():
            info = members.get(client_id)
            if info is not None and (best is None or info.last_update_ms > best.last_update_ms):
                best = info
        return None if best is None else best.channel

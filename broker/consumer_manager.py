"""Online consumers: group -> client id -> channel, plus the group's subscriptions.

Pure bookkeeping (no I/O): methods return what changed, and the caller (the client-management
processor or the controller's scan task) sends NOTIFY_CONSUMER_IDS_CHANGED and closes channels.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from remoting.protocol.bodies import SubscriptionData

log = structlog.get_logger()


class Channel(Protocol):
    """What the managers need of a connection (`remoting.Connection` has it)."""

    @property
    def id(self) -> int: ...

    @property
    def remote_address(self) -> str: ...


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class ClientChannelInfo:
    """One client instance on one connection."""

    channel: Channel
    client_id: str
    language: str = "JAVA"
    version: int = 0
    last_update_ms: int = 0


@dataclass(slots=True)
class ConsumerGroupInfo:
    """The members and subscriptions of one consumer group."""

    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[str, ClientChannelInfo] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    last_update_ms: int = 0

    def client_ids(self) -> list[str]:
        return sorted(self.channels)

    def member_channels(self) -> list[Channel]:
        return [c.channel for c in self.channels.values()]


class ConsumerManager:
    """Consumer groups seen through heartbeats."""

    def __init__(self) -> None:
        self._groups: dict[str, ConsumerGroupInfo] = {}

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self._groups.get(group)

    def groups(self) -> list[str]:
        return list(self._groups)

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self._groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def register(
        self,
        group: str,
        client: ClientChannelInfo,
        *,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: Iterable[SubscriptionData],
        now_ms: int | None = None,
    ) -> bool:
        """Record a heartbeat. True when the group's set of clients changed (a new member)."""
        now = monotonic_ms() if now_ms is None else now_ms
        info = self._groups.get(group)
        if info is None:
            info = self._groups[group] = ConsumerGroupInfo(group)
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        info.last_update_ms = now
        client.last_update_ms = now
        old = info.channels.get(client.client_id)
        changed = old is None
        if old is not None and old.channel is not client.channel:
            # Same client id on a new connection: replace silently (RocketMQ does the same).
            changed = False
        info.channels[client.client_id] = client
        # Subscriptions: keep the newest version of each topic; drop topics not sent any more.
        new_subs: dict[str, SubscriptionData] = {}
        for sub in subscriptions:
            prev = info.subscriptions.get(sub.topic)
            new_subs[sub.topic] = (
                sub if prev is None or sub.sub_version >= prev.sub_version else prev
            )
        if new_subs.keys() != info.subscriptions.keys():
            log.info("consumer_subscriptions_changed", group=group, topics=sorted(new_subs))
        info.subscriptions = new_subs
        if changed:
            log.info("consumer_registered", group=group, client_id=client.client_id)
        return changed

    def unregister(self, group: str, client_id: str) -> bool:
        """Remove a client from a group. True when it was a member."""
        info = self._groups.get(group)
        if info is None or info.channels.pop(client_id, None) is None:
            return False
        log.info("consumer_unregistered", group=group, client_id=client_id)
        if not info.channels:
            del self._groups[group]
        return True

    def remove_channel(self, channel: Channel) -> list[str]:
        """Drop every client on a closed connection. Returns the groups that lost a member."""
        changed = []
        for group, info in list(self._groups.items()):
            for cid, cinfo in list(info.channels.items()):
                if cinfo.channel is channel:
                    del info.channels[cid]
                    changed.append(group)
                    log.info("consumer_channel_closed", group=group, client_id=cid)
            if not info.channels:
                del self._groups[group]
        return changed

    def scan_idle(self, idle_ms: int, now_ms: int | None = None) -> list[tuple[str, Channel]]:
        """Drop clients without a heartbeat for `idle_ms`. Returns (group, channel) pairs."""
        now = monotonic_ms() if now_ms is None else now_ms
        dropped = []
        for group, info in list(self._groups.items()):
            for cid, cinfo in list(info.channels.items()):
                if now - cinfo.last_update_ms > idle_ms:
                    del info.channels[cid]
                    dropped.append((group, cinfo.channel))
                    log.info("consumer_channel_expired", group=group, client_id=cid)
            if not info.channels:
                del self._groups[group]
        return dropped

    def groups_of_topic(self, topic: str) -> list[str]:
        return [g for g, info in self._groups.items() if topic in info.subscriptions]

    def find_channel(self, client_id: str) -> Channel | None:
        """The connection of client `client_id` (any of its consumer groups), the most
        recently heard one; None when no consumer of that client is known."""
        best: ClientChannelInfo | None = None
        for info in self._groups.values():
            member = info.channels.get(client_id)
            if member is not None and (best is None or member.last_update_ms > best.last_update_ms):
                best = member
        return None if best is None else best.channel

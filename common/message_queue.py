"""RocketMQ's `MessageQueue`: one queue of a topic on one broker.

One type for every package: the client keys its tables by it (`client.message` re-exports it),
and `remoting.protocol.bodies` writes and reads it in JSON bodies as fastjson does
(`{"brokerName":..,"queueId":..,"topic":..}`); the JSON field names live there, not here.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MessageQueue"]


class MessageQueue(NamedTuple):
    """One queue of a topic on one broker; sorts by (topic, broker, queue id).

    A NamedTuple: hashing, equality and ordering are the tuple's own (C) operations, which the
    client's hot paths (tables keyed by queue) rely on. It equals a plain tuple of the same three
    values, and it is written as a JSON object, never as an array, by `bodies.dumps`.
    """

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"

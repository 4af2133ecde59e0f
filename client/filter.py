"""Subscription expressions ("*" or "tagA || tagB") and the client-side tag re-check.

The broker filters by tag hash code only (collisions pass), so the consumer
checks the tag string again before handing a message to the listener.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SUB_ALL = "*"
EXPRESSION_TYPE_TAG = "TAG"


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()` (over UTF-16 code units, int32 overflow)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@dataclass(slots=True)
class Subscription:
    """One topic's subscription as RocketMQ's SubscriptionData carries it."""

    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    expression_type: str = EXPRESSION_TYPE_TAG

    @property
    def matches_all(self) -> bool:
        return not self.tags_set

    def match_tags(self, tags: str | None) -> bool:
        """The client-side re-check by tag string."""
        if not self.tags_set:
            return True
        return tags is not None and tags in self.tags_set

    def to_json_dict(self) -> dict[str, object]:
        """fastjson field names, as the heartbeat body spells them."""
        return {
            "classFilterMode": False,
            "codeSet": list(self.code_set),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": list(self.tags_set),
            "topic": self.topic,
        }


def parse_subscription(topic: str, expression: str | None) -> Subscription:
    """Build a subscription from a tag expression.

    Args:
        topic: the topic.
        expression: "*", "" or None for every tag; else tags joined by "||".

    Raises:
        ValueError: the expression names no tag (e.g. "||").
    """
    if expression is None or expression.strip() in ("", SUB_ALL):
        return Subscription(topic, SUB_ALL)
    tags: list[str] = []
    for part in expression.split("||"):
        t = part.strip()
        if t and t not in tags:
            tags.append(t)
    if not tags:
        raise ValueError(f"subscription expression {expression!r} names no tag")
    return Subscription(
        topic, expression, tags_set=tags, code_set=[java_string_hash(t) for t in tags]
    )

"""Subscription expressions ("*" or "tagA || tagB") and the client-side tag re-check.

The broker filters by tag hash code only (collisions pass), so the consumer
checks the tag string again before handing a message to the listener.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from common.filter import EXPRESSION_TYPE_TAG, SUB_ALL, parse_tag_expression

# Native when built: the producer's hash selector hashes a key on every send.
from common.message import java_string_hash

__all__ = ["Subscription", "parse_subscription"]


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
    """Build a subscription from a tag expression (`common.filter.parse_tag_expression`).

    Args:
        topic: the topic.
        expression: "*", "" or None for every tag; else tags joined by "||".

    Raises:
        SubscriptionParseError: the expression names no tag (e.g. "||"); a ValueError.
    """
    parsed = parse_tag_expression(expression, hash_tag=java_string_hash)
    if parsed.matches_all:
        return Subscription(topic, SUB_ALL)
    return Subscription(
        topic, parsed.sub_string, tags_set=list(parsed.tags), code_set=list(parsed.codes)
    )

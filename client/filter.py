"""Subscription expressions ("*" or "tagA || tagB", or SQL92 through `MessageSelector`) and the
client-side tag re-check.

The broker filters by tag hash code only (collisions pass), so the consumer
checks the tag string again before handing a message to the listener. SQL92 expressions are
evaluated by the broker alone (its `enable_property_filter`), as RocketMQ's clients leave them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from common.filter import (
    EXPRESSION_TYPE_TAG,
    SUB_ALL,
    SubscriptionParseError,
    parse_tag_expression,
)

# Native when built: the producer's hash selector hashes a key on every send.
from common.message import java_string_hash

__all__ = ["EXPRESSION_TYPE_SQL92", "MessageSelector", "Subscription", "parse_subscription"]

EXPRESSION_TYPE_SQL92 = "SQL92"


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """A subscription expression with its type, as RocketMQ's MessageSelector."""

    expression_type: str
    expression: str

    @classmethod
    def by_tag(cls, expression: str | None = SUB_ALL) -> MessageSelector:
        """Tags: "*" (or empty) for every tag, else "tagA || tagB"."""
        return cls(EXPRESSION_TYPE_TAG, expression or SUB_ALL)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """An SQL92 expression on message properties (TAGS and KEYS included), e.g.
        "a > 5 AND region IN ('eu', 'us')"; the broker compiles and evaluates it."""
        return cls(EXPRESSION_TYPE_SQL92, expression)


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


def parse_subscription(topic: str, expression: str | MessageSelector | None) -> Subscription:
    """Build a subscription from a tag expression (`common.filter.parse_tag_expression`) or a
    `MessageSelector`.

    Args:
        topic: the topic.
        expression: "*", "" or None for every tag; else tags joined by "||"; or a selector.

    Raises:
        SubscriptionParseError: the expression names no tag (e.g. "||"), or the selector's type
            is neither TAG nor SQL92, or its SQL92 expression is blank; a ValueError.
    """
    if isinstance(expression, MessageSelector):
        if expression.expression_type == EXPRESSION_TYPE_SQL92:
            if not expression.expression.strip():
                raise SubscriptionParseError("empty SQL92 expression")
            return Subscription(
                topic, expression.expression.strip(), expression_type=EXPRESSION_TYPE_SQL92
            )
        if expression.expression_type != EXPRESSION_TYPE_TAG:
            raise SubscriptionParseError(
                f"expression type {expression.expression_type!r} is not supported"
            )
        expression = expression.expression
    parsed = parse_tag_expression(expression, hash_tag=java_string_hash)
    if parsed.matches_all:
        return Subscription(topic, SUB_ALL)
    return Subscription(
        topic, parsed.sub_string, tags_set=list(parsed.tags), code_set=list(parsed.codes)
    )

"""Tag filtering: sub-expressions as RocketMQ's FilterAPI parses them, matched by tag hash."""

from __future__ import annotations

from collections.abc import Callable

from remoting.protocol.bodies import SubscriptionData
from store.message import java_string_hash

__all__ = [
    "SUB_ALL",
    "SubscriptionParseError",
    "build_subscription",
    "java_string_hash",
    "tag_filter",
    "to_int32",
]

SUB_ALL = "*"


def to_int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v & 0x80000000 else v


class SubscriptionParseError(ValueError):
    """The sub-expression cannot be used (SUBSCRIPTION_PARSE_FAILED)."""


def build_subscription(
    topic: str, sub_string: str | None, *, expression_type: str | None = None, sub_version: int = 0
) -> SubscriptionData:
    """SubscriptionData for `sub_string` (`*`, empty, or `tagA || tagB`).

    Raises:
        SubscriptionParseError: an expression type other than TAG, or no tag in the expression.
    """
    if expression_type not in (None, "", "TAG"):
        raise SubscriptionParseError(f"expression type {expression_type!r} is not supported")
    text = (sub_string or "").strip()
    if not text or text == SUB_ALL:
        return SubscriptionData(topic, SUB_ALL, sub_version=sub_version)
    tags: list[str] = []
    for part in text.split("||"):
        tag = part.strip()
        if tag and tag not in tags:
            tags.append(tag)
    if not tags:
        raise SubscriptionParseError(f"no tag in sub-expression {sub_string!r}")
    return SubscriptionData(
        topic,
        text,
        tags_set=tags,
        code_set=[java_string_hash(t) for t in tags],
        sub_version=sub_version,
    )


def tag_filter(sub: SubscriptionData | None) -> Callable[[int], bool] | None:
    """A predicate on consume-queue tag codes, or None when everything matches.

    Codes are compared as Java ints (the consume queue stores them sign-extended). When the
    client sent tags without codes, the codes are computed here.
    """
    if sub is None or sub.sub_string.strip() in ("", SUB_ALL):
        return None
    codes = {to_int32(c) for c in sub.code_set}
    if not codes:
        codes = {java_string_hash(t) for t in sub.tags_set}
    if not codes:
        return None
    frozen = frozenset(codes)

    def match(tags_code: int) -> bool:
        return to_int32(tags_code) in frozen

    return match

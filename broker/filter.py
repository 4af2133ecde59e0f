"""Tag filtering: sub-expressions as RocketMQ's FilterAPI parses them, matched by tag hash."""

from __future__ import annotations

from collections.abc import Callable

from common.filter import (
    EXPRESSION_TYPE_TAG,
    SUB_ALL,
    SubscriptionParseError,
    parse_tag_expression,
)
from common.hashing import to_int32
from common.message import java_string_hash
from remoting.protocol.bodies import SubscriptionData

__all__ = ["build_subscription", "tag_filter"]


def build_subscription(
    topic: str, sub_string: str | None, *, expression_type: str | None = None, sub_version: int = 0
) -> SubscriptionData:
    """SubscriptionData for `sub_string` (`*`, empty, or `tagA || tagB`).

    The parsing is `common.filter.parse_tag_expression`. The sub-string kept is the expression
    trimmed (Java keeps it as sent; here only `tag_filter` reads it, and trims it anyway).

    Raises:
        SubscriptionParseError: an expression type other than TAG, or no tag in the expression.
    """
    if expression_type not in (None, "", EXPRESSION_TYPE_TAG):
        raise SubscriptionParseError(f"expression type {expression_type!r} is not supported")
    parsed = parse_tag_expression(sub_string, hash_tag=java_string_hash)
    if not parsed.tags:
        return SubscriptionData(topic, SUB_ALL, sub_version=sub_version)
    return SubscriptionData(
        topic,
        parsed.sub_string.strip(),
        tags_set=list(parsed.tags),
        code_set=list(parsed.codes),
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

"""Tag expressions ("*" or "TagA || TagB") as RocketMQ's FilterAPI.buildSubscriptionData reads them.

One parser for the broker (the expression a pull carries) and the client (the expression a
consumer subscribes with); each builds its own subscription object from the `TagExpression`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from common.hashing import java_string_hash

__all__ = [
    "EXPRESSION_TYPE_TAG",
    "SUB_ALL",
    "SubscriptionParseError",
    "TagExpression",
    "parse_tag_expression",
]

SUB_ALL = "*"
"""The expression that selects every tag."""
EXPRESSION_TYPE_TAG = "TAG"
"""The expression type of tag expressions (the other, SQL92, is not a tag expression)."""
_TAG_SEPARATOR = "||"


class SubscriptionParseError(ValueError):
    """The expression cannot be used (the broker answers SUBSCRIPTION_PARSE_FAILED)."""


class TagExpression(NamedTuple):
    """A parsed tag expression.

    Attributes:
        sub_string: `SUB_ALL` when every tag matches, else the expression as given (Java keeps
            the subString untrimmed).
        tags: the distinct trimmed tags in first-seen order; empty when every tag matches.
        codes: the Java hash of each tag, index for index with `tags`.
    """

    sub_string: str
    tags: tuple[str, ...] = ()
    codes: tuple[int, ...] = ()

    @property
    def matches_all(self) -> bool:
        """Whether every tag matches (the expression is `SUB_ALL`)."""
        return not self.tags


_ALL = TagExpression(SUB_ALL)


def parse_tag_expression(
    expression: str | None, *, hash_tag: Callable[[str], int] = java_string_hash
) -> TagExpression:
    """Parse a tag expression: tags separated by "||", each trimmed, empty ones skipped.

    None, an empty or blank expression, and "*" (blanks around it allowed) select every tag.
    A repeated tag counts once.

    Args:
        expression: the expression, e.g. "TagA || TagB".
        hash_tag: computes a tag's code; it must equal Java's ``String.hashCode()``. Callers that
            may import the store pass its native `common.message.java_string_hash`.

    Returns:
        The expression's `TagExpression`.

    Raises:
        SubscriptionParseError: the expression is neither "*" nor blank and names no tag
            (e.g. "||").
    """
    if expression is None or expression == SUB_ALL:
        return _ALL
    return _parse(expression, hash_tag)


# Consumers send the same few expressions with every pull; the results are immutable, so one
# parse serves them all. Errors are not cached.
@functools.lru_cache(maxsize=1024)
def _parse(expression: str, hash_tag: Callable[[str], int]) -> TagExpression:
    text = expression.strip()
    if not text or text == SUB_ALL:
        return _ALL
    tags: list[str] = []
    for part in text.split(_TAG_SEPARATOR):
        tag = part.strip()
        if tag and tag not in tags:
            tags.append(tag)
    if not tags:
        raise SubscriptionParseError(f"sub-expression {expression!r} names no tag")
    return TagExpression(expression, tuple(tags), tuple(map(hash_tag, tags)))

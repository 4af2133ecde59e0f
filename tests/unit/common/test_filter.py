"""common.filter: tag expressions as FilterAPI.buildSubscriptionData reads them."""

from __future__ import annotations

import pytest

from common.filter import (
    SUB_ALL,
    SubscriptionParseError,
    TagExpression,
    parse_tag_expression,
)
from common.hashing import java_string_hash

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("expression", [None, "", " ", "\t\n", "*", " * ", "\t*\n"])
def test_every_tag(expression: str | None) -> None:
    parsed = parse_tag_expression(expression)
    assert parsed == TagExpression(SUB_ALL, (), ())
    assert parsed.matches_all


def test_single_tag() -> None:
    parsed = parse_tag_expression("TagA")
    assert parsed == TagExpression("TagA", ("TagA",), (2598919,))
    assert not parsed.matches_all


def test_tags_trimmed_deduplicated_in_order() -> None:
    parsed = parse_tag_expression(" TagB ||TagA|| TagB ||  || TagC ")
    assert parsed.tags == ("TagB", "TagA", "TagC")
    assert parsed.codes == tuple(java_string_hash(t) for t in parsed.tags)


def test_sub_string_is_the_expression_as_given() -> None:
    # Java keeps subString untrimmed; only "*" and empty become SUB_ALL.
    assert parse_tag_expression(" TagA || TagB ").sub_string == " TagA || TagB "
    assert parse_tag_expression("TagA||").sub_string == "TagA||"


def test_only_double_bar_separates() -> None:
    assert parse_tag_expression("a|b || c").tags == ("a|b", "c")
    # Leftmost "||" first, like Java's split("\\|\\|").
    assert parse_tag_expression("a|||b").tags == ("a", "|b")
    assert parse_tag_expression("a,b").tags == ("a,b",)


def test_star_among_tags_is_a_tag() -> None:
    parsed = parse_tag_expression("TagA || *")
    assert parsed.tags == ("TagA", "*")
    assert parsed.codes[1] == 42
    assert not parsed.matches_all


def test_colliding_tags_keep_both_codes() -> None:
    # "Aa" and "BB" share a hash code; the broker lets both through, the client re-checks.
    assert parse_tag_expression("Aa || BB").codes == (2112, 2112)


@pytest.mark.parametrize("expression", ["||", " || ", "|| ||", "||||"])
def test_no_tag_is_an_error(expression: str) -> None:
    with pytest.raises(SubscriptionParseError, match="names no tag"):
        parse_tag_expression(expression)


def test_error_is_a_value_error() -> None:
    assert issubclass(SubscriptionParseError, ValueError)


def test_hash_tag_computes_the_codes() -> None:
    seen: list[str] = []

    def fake(tag: str) -> int:
        seen.append(tag)
        return len(tag)

    parsed = parse_tag_expression("a || bb || a", hash_tag=fake)
    assert parsed.codes == (1, 2)
    assert seen == ["a", "bb"]
    assert parse_tag_expression("*", hash_tag=fake).codes == ()


def test_repeated_parses_agree_and_errors_repeat() -> None:
    first = parse_tag_expression("TagA || TagB")
    assert parse_tag_expression("TagA || TagB") == first
    assert parse_tag_expression("TagA || TagB", hash_tag=lambda t: 0).codes == (0, 0)
    for _ in range(2):
        with pytest.raises(SubscriptionParseError):
            parse_tag_expression("||")

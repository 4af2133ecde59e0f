"""common.sql92: RocketMQ's selector grammar, three-valued logic, conversions, errors, bounds."""

from __future__ import annotations

import pytest

from common.sql92 import (
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    MAX_IN_LIST,
    Sql92Error,
    compile_sql92,
)


def ev(expr: str, **props: str) -> bool | None:
    value = compile_sql92(expr).evaluate(props)
    assert value is None or isinstance(value, bool)
    return value


@pytest.mark.parametrize(
    ("expr", "props", "expected"),
    [
        ("a = 5", {"a": "5"}, True),
        ("a = 5", {"a": "6"}, False),
        ("a <> 5", {"a": "6"}, True),
        ("a > 5", {"a": "6"}, True),
        ("a >= 5", {"a": "5"}, True),
        ("a < 5", {"a": "5"}, False),
        ("a <= 5.0", {"a": "5"}, True),
        ("a > -1.5", {"a": "-1"}, True),
        ("a = 'x'", {"a": "x"}, True),
        ("a = b", {"a": "x", "b": "x"}, True),
        ("a BETWEEN 1 AND 3", {"a": "3"}, True),
        ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
        ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
        ("a IN ('x', 'y')", {"a": "y"}, True),
        ("a NOT IN ('x', 'y')", {"a": "z"}, True),
        ("a IS NULL", {}, True),
        ("a IS NOT NULL", {"a": "1"}, True),
        ("a CONTAINS 'ell'", {"a": "hello"}, True),
        ("a NOT CONTAINS 'ell'", {"a": "hello"}, False),
        ("a STARTSWITH 'he'", {"a": "hello"}, True),
        ("a NOT STARTSWITH 'x'", {"a": "hello"}, True),
        ("a ENDSWITH 'lo'", {"a": "hello"}, True),
        ("a NOT ENDSWITH 'lo'", {"a": "hello"}, False),
        ("TAGS = 'TagA' AND KEYS = 'k1'", {"TAGS": "TagA", "KEYS": "k1"}, True),
        ("TRUE", {}, True),
        ("FALSE OR NOT FALSE", {}, True),
        ("a = 0x10", {"a": "16"}, True),
        ("a = 010", {"a": "8"}, True),
        ("a = 7L", {"a": "7"}, True),
        ("a = 1e2", {"a": "100"}, True),
        ("a = .5", {"a": "0.5"}, True),
        ("a = +5", {"a": "5"}, True),
        ("a = --5\n", {"a": "5"}, None),  # "--" starts a comment: "a =" then ends: see errors
    ][:-1],
)
def test_constructs(expr: str, props: dict[str, str], expected: bool | None) -> None:
    assert ev(expr, **props) is expected


def test_keywords_are_case_insensitive_and_identifiers_are_not() -> None:
    assert ev("a between 1 and 3 aNd b iS nOt NuLl", a="2", b="x") is True
    assert ev("A = 1", a="1") is None  # property A is absent: unknown


def test_precedence_and_parentheses() -> None:
    # AND binds tighter than OR.
    assert ev("TRUE OR FALSE AND FALSE") is True
    assert ev("(TRUE OR FALSE) AND FALSE") is False
    # NOT applies to the primary after it.
    assert ev("NOT (a = 1) AND b = 2", a="2", b="2") is True


def test_string_literals_escape_and_comments() -> None:
    assert ev("s = 'it''s'", s="it's") is True
    assert ev("s = ''", s="") is True
    assert ev("/* a comment */ a = 1 -- trailing\n", a="1") is True
    assert ev("a = 1 /* x */ AND /*\n*/ b = 2", a="1", b="2") is True


def test_three_valued_logic() -> None:
    # A missing property makes a comparison unknown; unknown never matches.
    assert ev("a > 5") is None
    assert ev("NOT (a > 5)") is None
    assert ev("a > 5 AND FALSE") is False
    assert ev("a > 5 AND TRUE") is None
    assert ev("a > 5 OR TRUE") is True
    assert ev("a > 5 OR FALSE") is None
    assert ev("a IN ('x')") is None
    assert ev("a NOT IN ('x')") is None
    assert ev("a <> 5") is None
    # CONTAINS and friends are FALSE (not unknown) on a missing property, negated or not.
    assert ev("a CONTAINS 'x'") is False
    assert ev("a NOT CONTAINS 'x'") is False
    assert ev("a CONTAINS ''", a="x") is False
    assert not compile_sql92("a > 5").matches({})


def test_conversions() -> None:
    # A string property is converted to the type of the literal it is compared with.
    assert ev("a > 5", a="10") is True
    assert ev("a = 5", a="5") is True
    assert ev("a > 5.0", a="5.5") is True
    assert ev("a = 5.0", a="5") is True
    assert ev("a = TRUE", a="true") is True  # Boolean.valueOf, case-insensitive
    assert ev("a = TRUE", a="yes") is False
    # A failed conversion: the message does not match, whatever the rest says.
    assert ev("a > 5", a="5.5") is None  # a long literal wants a long
    assert ev("a > 5", a="abc") is None
    assert ev("a = 5 OR TRUE", a="abc") is None
    assert not compile_sql92("a = 5 OR TRUE").matches({"a": "abc"})
    # Two strings: equal as strings only; ordered only when both read as doubles.
    assert ev("a = b", a="5.0", b="5") is False
    assert ev("a = '5'", a="5.0") is False
    assert ev("a > b", a="10", b="9") is True
    assert ev("a > b", a="b", b="a") is None
    # Equality with a NULL side: unknown on the left, FALSE on the right, TRUE for both.
    assert ev("a = b", b="1") is None
    assert ev("a = b", a="1") is False
    assert ev("a <> b", a="1") is True
    assert ev("a = b") is True
    # Unary minus negates numbers only; a property gives NULL.
    assert ev("-a = -3", a="3") is None
    assert ev("a = -3", a="-3") is True


@pytest.mark.parametrize(
    ("expr", "column", "fragment"),
    [
        ("a > ", 5, "expected"),
        ("a", 1, "boolean"),
        ("a = 1 AND b", 11, "boolean"),
        ("a IN (1)", 7, "string literal"),
        ("1 IN ('x')", 3, "property"),
        ("a = NULL", 3, "cannot be compared"),
        ("'x' = 1", 5, "cannot be compared"),
        ("a > 'x'", 3, "cannot be compared"),
        ("a > TRUE", 3, "cannot be compared"),
        ("NOT a", 5, "boolean"),
        ("a = 'open", 5, "unterminated"),
        ("a = 1 /* open", 7, "unterminated"),
        ("a # 1", 3, "unexpected character"),
        ("(a = 1", 7, "')'"),
        ("a = 1)", 6, "end of the expression"),
        ("a BETWEEN 1 OR 2", 13, "AND"),
        ("a = 1x", 5, "malformed number"),
        ("a = 99999999999999999999", 5, "long range"),
        ("a CONTAINS 1", 12, "string literal"),
        ("", 1, "empty"),
        ("   ", 1, "empty"),
    ],
)
def test_errors_carry_the_column(expr: str, column: int, fragment: str) -> None:
    with pytest.raises(Sql92Error) as info:
        compile_sql92(expr)
    assert info.value.column == column
    assert str(info.value).startswith(f"column {column}: ")
    assert fragment in str(info.value)


def test_error_on_a_later_line_gives_line_and_column() -> None:
    with pytest.raises(Sql92Error, match=r"^line 2, column 5: "):
        compile_sql92("a = 1\nAND ")


def test_long_range_edges() -> None:
    assert ev("a = -9223372036854775808", a="-9223372036854775808") is True
    assert ev("a = 9223372036854775807", a="9223372036854775807") is True
    with pytest.raises(Sql92Error, match="long range"):
        compile_sql92("a = 9223372036854775808")


def test_bounds() -> None:
    with pytest.raises(Sql92Error, match="longer than"):
        compile_sql92("a = 1 OR " * (MAX_EXPRESSION_LENGTH // 9) + "a = 1")
    # Deep nesting is a clean error, never a RecursionError.
    for deep in ("(" * 4000, "(" * 10_000, "NOT " * 1000 + "TRUE", "- " * 2000 + "1 = a"):
        with pytest.raises(Sql92Error):
            compile_sql92(deep)
    nested = "(" * (MAX_DEPTH // 2) + "a = 1" + ")" * (MAX_DEPTH // 2)
    assert compile_sql92(nested).matches({"a": "1"})
    items = ", ".join(f"'{i % 10}'" for i in range(MAX_IN_LIST))
    assert compile_sql92(f"a IN ({items})").matches({"a": "7"})
    with pytest.raises(Sql92Error, match="IN list"):
        compile_sql92(f"a IN ({items}, 'x')")


def test_ten_thousand_parentheses_within_the_length_bound_is_not_a_length_error() -> None:
    with pytest.raises(Sql92Error, match="nested deeper"):
        compile_sql92("(" * MAX_EXPRESSION_LENGTH)

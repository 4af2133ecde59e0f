"""common.hashing: Java's String.hashCode and the int32 wrap, against values from the JVM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.hashing import java_string_hash, to_int32

pytestmark = pytest.mark.unit


def _utf16_reference(s: str) -> int:
    """The definition, one UTF-16 code unit at a time."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("*", 42),
        ("TagA", 2598919),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
        ("TopicTest#KEY1", -1656969516),
        ("\u00e9", 0xE9),
        ("\u00e9t\u00e9", 0xE9 * 961 + 0x74 * 31 + 0xE9),
    ],
)
def test_known_java_values(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected


def test_outside_bmp_is_a_surrogate_pair() -> None:
    # U+1F600 is the UTF-16 pair D83D DE00: two code units, as Java's String holds it.
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00
    assert java_string_hash("a\U0001f600") == to_int32(97 * 31 * 31 + 31 * 0xD83D + 0xDE00)
    # The same units written as the (lone) surrogates hash the same.
    assert java_string_hash("\ud83d\ude00") == java_string_hash("\U0001f600")


def test_lone_surrogate_is_one_code_unit() -> None:
    assert java_string_hash("\ud800") == 0xD800
    assert java_string_hash("\ud800x") == 0xD800 * 31 + ord("x")


def test_result_is_int32() -> None:
    for s in ("x" * 7, "z" * 50, "\uffff" * 9, "polygenelubricants" * 3):
        h = java_string_hash(s)
        assert -(2**31) <= h < 2**31
        assert h == _utf16_reference(s)


@pytest.mark.parametrize("n", [1023, 1024, 1025, 2048, 5000])
def test_long_strings_across_chunks(n: int) -> None:
    ascii_s = "".join(chr(33 + i % 90) for i in range(n))
    mixed = "".join(chr(0x41 + i % 0x3000) for i in range(n)) + "\U0001f600"
    assert java_string_hash(ascii_s) == _utf16_reference(ascii_s)
    assert java_string_hash(mixed) == _utf16_reference(mixed)


@given(st.text(max_size=200))
def test_matches_utf16_definition(s: str) -> None:
    assert java_string_hash(s) == _utf16_reference(s)


def test_store_uses_this_or_an_equal_native_one() -> None:
    from common import message

    if not message.NATIVE:
        assert message.java_string_hash is java_string_hash
    for s in ("", "TagA", "\u00e9t\u00e9", "\U0001f600", "\ud800x", "k" * 3000):
        assert message.java_string_hash(s) == java_string_hash(s)


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (0, 0),
        (1, 1),
        (-1, -1),
        (0x7FFFFFFF, 0x7FFFFFFF),
        (0x80000000, -(2**31)),
        (0xFFFFFFFF, -1),
        (-(2**31), -(2**31)),
        (1 << 32, 0),
        (0x1_0000_0005, 5),
        (-(2**63), 0),
    ],
)
def test_to_int32(v: int, expected: int) -> None:
    assert to_int32(v) == expected

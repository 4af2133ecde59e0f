"""Hashes that must equal Java's: ``String.hashCode()`` and the int32 wrap it relies on.

RocketMQ stores and compares these values (consume-queue tag codes, index slots, queue
selection by key), so a Python peer must compute exactly what the JVM computes.

This is the pure-Python reference. `common.message.java_string_hash` is the same function, native
when `common.speedups` is built; code that may import the store and hashes per message uses that.
"""

from __future__ import annotations

import operator
import sys

__all__ = ["java_string_hash", "to_int32"]

_HASH_CHUNK = 1024
# 31**k mod 2**32: h(s) = sum(c_i * 31**(n-1-i)), so the reversed units times these powers
# give the hash with the loop in C (map/sum) instead of Python bytecode.
_POW31 = tuple(pow(31, k, 1 << 32) for k in range(_HASH_CHUNK + 1))
# Native byte order, so the encoded bytes can be viewed as unsigned 16-bit code units in place.
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def to_int32(v: int) -> int:
    """`v` wrapped to a Java int (two's complement, 32 bits).

    Args:
        v: any integer, e.g. an int64 that holds a sign-extended or an unsigned 32-bit value.

    Returns:
        The value in ``[-2**31, 2**31)`` congruent to `v` modulo ``2**32``.
    """
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v & 0x80000000 else v


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()``: ``h = 31*h + c`` over UTF-16 code units, as an int32.

    Characters outside the BMP count as two code units (a surrogate pair), as in Java; a lone
    surrogate counts as the one code unit it is, as a Java string may hold one.

    Args:
        s: the string.

    Returns:
        The signed 32-bit hash.
    """
    units: bytes | memoryview
    if s.isascii():
        units = s.encode("ascii")
    else:
        units = memoryview(s.encode(_UTF16_NATIVE, "surrogatepass")).cast("H")
    n = len(units)
    h: int
    if n <= _HASH_CHUNK:
        h = sum(map(operator.mul, units[::-1], _POW31)) & 0xFFFFFFFF
    else:
        h = 0
        for start in range(0, n, _HASH_CHUNK):
            chunk = units[start : start + _HASH_CHUNK]
            part = sum(map(operator.mul, chunk[::-1], _POW31))
            h = (h * _POW31[len(chunk)] + part) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h

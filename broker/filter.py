"""Tag filtering (sub-expressions as RocketMQ's FilterAPI parses them, matched by tag hash) and
SQL92 property filtering (`common.sql92`, evaluated on each record's properties)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from common.filter import (
    EXPRESSION_TYPE_TAG,
    SUB_ALL,
    SubscriptionParseError,
    parse_tag_expression,
)
from common.hashing import to_int32
from common.message import (
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    STOREHOSTADDRESS_V6_FLAG,
    MessageDecodeError,
    decode_properties,
    java_string_hash,
)
from common.sql92 import Sql92Error, Sql92Filter, compile_sql92
from remoting.protocol.bodies import SubscriptionData
from store.results import GetMessageResult, GetMessageStatus

__all__ = [
    "EXPRESSION_TYPE_SQL92",
    "SQL92_NOT_SUPPORTED",
    "PropertyFilterDisabledError",
    "build_subscription",
    "drop_unmatched",
    "record_properties",
    "sql_filter",
    "tag_filter",
]

EXPRESSION_TYPE_SQL92 = "SQL92"
SQL92_NOT_SUPPORTED = "The broker does not support consumer to filter message by SQL92"
"""RocketMQ's remark (SYSTEM_ERROR) for an SQL92 subscription while property filters are off."""


class PropertyFilterDisabledError(Exception):
    """An SQL92 subscription reached a broker with `enable_property_filter` off."""


def build_subscription(
    topic: str, sub_string: str | None, *, expression_type: str | None = None, sub_version: int = 0
) -> SubscriptionData:
    """SubscriptionData for `sub_string` (`*`, empty, or `tagA || tagB`).

    The parsing is `common.filter.parse_tag_expression`. The sub-string kept is the expression
    trimmed (Java keeps it as sent; here only `tag_filter` reads it, and trims it anyway).

    Raises:
        SubscriptionParseError: an expression type other than TAG, or no tag in the expression.
    """
    if expression_type == EXPRESSION_TYPE_SQL92:
        # Compiled (and checked) by `sql_filter`, which knows whether filters are on.
        return SubscriptionData(
            topic,
            (sub_string or "").strip(),
            expression_type=EXPRESSION_TYPE_SQL92,
            sub_version=sub_version,
        )
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
    if sub.expression_type == EXPRESSION_TYPE_SQL92:
        return None  # every record passes the consume queue; `sql_filter` reads its properties
    codes = {to_int32(c) for c in sub.code_set}
    if not codes:
        codes = {java_string_hash(t) for t in sub.tags_set}
    if not codes:
        return None
    frozen = frozenset(codes)

    def match(tags_code: int) -> bool:
        return to_int32(tags_code) in frozen

    return match


# Consumers send the same expression with every pull: one compile per (topic, group, version,
# expression), bounded; a new subVersion compiles afresh. Errors are not cached.
@functools.lru_cache(maxsize=1024)
def _compiled(topic: str, group: str, sub_version: int, expression: str) -> Sql92Filter:
    return compile_sql92(expression)


def sql_filter(sub: SubscriptionData | None, group: str, *, enabled: bool) -> Sql92Filter | None:
    """The compiled SQL92 filter of `sub`, or None for a tag subscription.

    Raises:
        PropertyFilterDisabledError: an SQL92 subscription while `enabled` is off.
        SubscriptionParseError: the expression does not compile (the message gives its column).
    """
    if sub is None or sub.expression_type != EXPRESSION_TYPE_SQL92:
        return None
    if not enabled:
        raise PropertyFilterDisabledError(SQL92_NOT_SUPPORTED)
    try:
        return _compiled(sub.topic, group, sub.sub_version, sub.sub_string)
    except Sql92Error as exc:
        raise SubscriptionParseError(f"SQL92 expression {sub.sub_string[:200]!r}, {exc}") from None


def record_properties(buf: bytes) -> dict[str, str]:
    """The properties of one stored record, read in place (positions in `common.message`'s
    layout) rather than through a whole decode: only the lengths before them are read.

    Raises:
        MessageDecodeError: not a V1 or V2 record, lengths past its end, properties not UTF-8.
    """
    magic = int.from_bytes(buf[4:8], "big")
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise MessageDecodeError(f"not a record (magic {magic:#x})")
    sys_flag = int.from_bytes(buf[36:40], "big")
    pos = 48 + (20 if sys_flag & BORNHOST_V6_FLAG else 8) + 8
    pos += (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8) + 4 + 8
    pos += 4 + int.from_bytes(buf[pos : pos + 4], "big")  # BODY
    if magic == MESSAGE_MAGIC_CODE_V2:
        pos += 2 + int.from_bytes(buf[pos : pos + 2], "big")  # TOPIC, 2-byte length
    else:
        pos += 1 + buf[pos]  # TOPIC, 1-byte length
    size = int.from_bytes(buf[pos : pos + 2], "big")
    end = pos + 2 + size
    if end > len(buf):
        raise MessageDecodeError("properties past the record's end")
    try:
        return decode_properties(bytes(buf[pos + 2 : end]).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MessageDecodeError(f"properties are not UTF-8: {exc}") from None


def drop_unmatched(result: GetMessageResult, flt: Sql92Filter) -> None:
    """Remove from `result` the records whose properties do not match `flt`.

    `next_begin_offset` stays past every record read, so the consumer moves over the dropped
    ones without seeing them; when none is left the status is NO_MATCHED_MESSAGE, as a pull
    whose records all failed the tag check. A record that does not decode is kept: the
    consumer's own decoding reports it.
    """
    buffers: list[bytes] = []
    offsets: list[int] = []
    for buf, off in zip(result.buffers, result.queue_offsets, strict=True):
        try:
            props = record_properties(buf)
        except (MessageDecodeError, IndexError):
            props = None
        if props is None or flt.matches(props):
            buffers.append(buf)
            offsets.append(off)
    if len(buffers) == len(result.buffers):
        return
    result.buffers[:] = buffers
    result.queue_offsets[:] = offsets
    result.message_count = len(buffers)
    result.buffer_total_size = sum(len(b) for b in buffers)
    if not buffers:
        result.status = GetMessageStatus.NO_MATCHED_MESSAGE

"""broker.filter's SQL92 side: the compile cache, the filter-off error, properties read in place
and records dropped from a pull's result."""

from __future__ import annotations

import pytest

from broker.filter import (
    SQL92_NOT_SUPPORTED,
    PropertyFilterDisabledError,
    build_subscription,
    drop_unmatched,
    record_properties,
    sql_filter,
)
from common.filter import SubscriptionParseError
from common.message import MessageDecodeError, MessageInner, decode_record, encode_record
from store.results import GetMessageResult, GetMessageStatus


def record(props: dict[str, str], *, body: bytes = b"body", v6: bool = False) -> bytes:
    host = ("::1", 9) if v6 else ("127.0.0.1", 9)
    msg = MessageInner("T", body, properties=props, born_host=host, store_host=host)
    return bytes(encode_record(msg, 0, 0, 1))


@pytest.mark.parametrize("v6", [False, True])
def test_record_properties_read_in_place_equal_a_full_decode(v6: bool) -> None:
    for props in ({}, {"a": "1", "TAGS": "x", "KEYS": "k1 k2"}, {"é": "ü" * 300}):
        buf = record(props, body=b"z" * 1000, v6=v6)
        assert record_properties(buf) == decode_record(buf).properties == props
    with pytest.raises(MessageDecodeError):
        record_properties(b"\x00" * 100)


def test_sql_filter_is_cached_and_checked() -> None:
    sub = build_subscription("T", "a > 1", expression_type="SQL92", sub_version=3)
    first = sql_filter(sub, "G", enabled=True)
    assert first is not None
    assert sql_filter(sub, "G", enabled=True) is first
    assert sql_filter(build_subscription("T", "TagA"), "G", enabled=False) is None
    with pytest.raises(PropertyFilterDisabledError, match=SQL92_NOT_SUPPORTED):
        sql_filter(sub, "G", enabled=False)
    bad = build_subscription("T", "a >", expression_type="SQL92")
    with pytest.raises(SubscriptionParseError, match="column 4: expected"):
        sql_filter(bad, "G", enabled=True)


def result_of(bufs: list[bytes]) -> GetMessageResult:
    return GetMessageResult(
        GetMessageStatus.FOUND,
        next_begin_offset=10 + len(bufs),
        buffers=list(bufs),
        message_count=len(bufs),
        buffer_total_size=sum(map(len, bufs)),
        queue_offsets=[10 + i for i in range(len(bufs))],
    )


def test_drop_unmatched_keeps_matches_and_the_next_offset() -> None:
    flt = sql_filter(build_subscription("T", "a > 1", expression_type="SQL92"), "G", enabled=True)
    assert flt is not None
    bufs = [record({"a": str(i)}) for i in range(4)]
    res = result_of(bufs)
    drop_unmatched(res, flt)
    assert res.buffers == bufs[2:]
    assert res.queue_offsets == [12, 13]
    assert (res.message_count, res.buffer_total_size) == (2, len(bufs[2]) + len(bufs[3]))
    assert (res.status, res.next_begin_offset) == (GetMessageStatus.FOUND, 14)
    res = result_of([*bufs[:2], record({})])
    drop_unmatched(res, flt)
    assert res.buffers == []
    assert (res.status, res.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 13)

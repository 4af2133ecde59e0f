"""Offset resolution, data-loss decisions and the lag-proportional split (sans-IO, no Spark)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.spark.offsets import (
    DataLossError,
    QueueRange,
    canonical,
    cap_by_lag,
    resolve_offsets,
    split_ranges,
    stream_start,
    total_rows,
)

BOUNDS = {
    "T": {"broker-b:0": (5, 50), "broker-a:10": (0, 7), "broker-a:2": (3, 9)},
    "A": {"broker-a:0": (0, 0)},
}


def test_canonical_order_is_topic_then_broker_then_numeric_queue() -> None:
    c = canonical({"T": {"broker-b:0": 1, "broker-a:10": 2, "broker-a:2": 3}, "A": {"x:1": 0}})
    assert json.dumps(c) == (
        '{"A": {"x:1": 0}, "T": {"broker-a:2": 3, "broker-a:10": 2, "broker-b:0": 1}}'
    )


def test_resolve_earliest_latest_and_json() -> None:
    assert resolve_offsets("earliest", BOUNDS, default=-2, name="s") == {
        "A": {"broker-a:0": 0},
        "T": {"broker-a:2": 3, "broker-a:10": 0, "broker-b:0": 5},
    }
    assert resolve_offsets("latest", BOUNDS, default=-1, name="s")["T"] == {
        "broker-a:2": 9,
        "broker-a:10": 7,
        "broker-b:0": 50,
    }
    got = resolve_offsets(
        {"T": {"broker-b:0": 20, "broker-a:2": -1}}, BOUNDS, default=-2, name="startingOffsets"
    )
    assert got["T"] == {"broker-a:2": 9, "broker-a:10": 0, "broker-b:0": 20}
    assert got["A"] == {"broker-a:0": 0}
    assert list(got) == ["A", "T"]


def test_resolve_rejects_unknown_topics_and_queues() -> None:
    with pytest.raises(ValueError, match="names topic 'X'"):
        resolve_offsets({"X": {"b:0": 1}}, BOUNDS, default=-2, name="startingOffsets")
    with pytest.raises(ValueError, match=r"broker-c:0"):
        resolve_offsets({"T": {"broker-c:0": 1}}, BOUNDS, default=-2, name="endingOffsets")


def test_stream_start_new_queue_starts_at_min() -> None:
    step = stream_start({"T": {"broker-b:0": 10}}, BOUNDS, fail_on_data_loss=True)
    assert step.start == {
        "A": {"broker-a:0": 0},
        "T": {"broker-a:2": 3, "broker-a:10": 0, "broker-b:0": 10},
    }
    assert step.lost == []


def test_stream_start_data_loss_both_ways() -> None:
    start = {"T": {"broker-b:0": 2, "broker-a:2": 3, "broker-a:10": 0, "broker-z:0": 4}}
    with pytest.raises(DataLossError, match="failOnDataLoss") as info:
        stream_start(start, BOUNDS, fail_on_data_loss=True)
    assert "broker-b:0: offsets 2..4 were deleted" in str(info.value)
    assert "broker-z:0 no longer exists" in str(info.value)
    step = stream_start(start, BOUNDS, fail_on_data_loss=False)
    assert step.start["T"] == {"broker-a:2": 3, "broker-a:10": 0, "broker-b:0": 5}
    assert len(step.lost) == 2


def test_cap_by_lag_proportional_and_exact() -> None:
    start = {"T": {"a:0": 0, "a:1": 0, "b:0": 100}}
    end = {"T": {"a:0": 600, "a:1": 300, "b:0": 200}}  # lags 600/300/100
    capped = cap_by_lag(start, end, 100)
    assert capped == {"T": {"a:0": 60, "a:1": 30, "b:0": 110}}
    assert total_rows(start, capped) == 100
    assert cap_by_lag(start, end, 10_000) == canonical(end)


def test_cap_by_lag_hands_out_the_remainder_deterministically() -> None:
    start = {"T": {"a:0": 0, "a:1": 0, "a:2": 0}}
    end = {"T": {"a:0": 10, "a:1": 10, "a:2": 10}}
    capped = cap_by_lag(start, end, 4)
    assert total_rows(start, capped) == 4
    assert capped == {"T": {"a:0": 2, "a:1": 1, "a:2": 1}}
    assert cap_by_lag(start, end, 4) == capped


def test_cap_by_lag_new_queue_without_start_has_no_lag() -> None:
    assert cap_by_lag({"T": {}}, {"T": {"a:0": 5}}, 1) == {"T": {"a:0": 5}}


offset_maps = st.dictionaries(
    st.sampled_from(["a:0", "a:1", "b:0", "b:7", "c:2"]),
    st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
    min_size=1,
)


@given(offset_maps, st.integers(1, 3000))
def test_cap_by_lag_properties(queues: dict[str, tuple[int, int]], limit: int) -> None:
    start = {"T": {q: s for q, (s, _l) in queues.items()}}
    end = {"T": {q: s + lag for q, (s, lag) in queues.items()}}
    capped = cap_by_lag(start, end, limit)
    total = total_rows(start, end)
    assert total_rows(start, capped) == min(limit, total)
    for q, (s, lag) in queues.items():
        assert s <= capped["T"][q] <= s + lag
    assert list(capped["T"]) == sorted(queues, key=lambda k: (k.split(":")[0], int(k[2:])))


def test_split_ranges_one_per_queue_with_data() -> None:
    start = {"T": {"a:0": 0, "a:1": 5, "b:0": 9}}
    end = {"T": {"b:0": 9, "a:1": 8, "a:0": 4}}
    assert split_ranges(start, end) == [
        QueueRange("T", "a", 0, 0, 4),
        QueueRange("T", "a", 1, 5, 8),
    ]


def test_split_ranges_min_partitions_halves_the_largest() -> None:
    ranges = split_ranges({"T": {"a:0": 0, "a:1": 0}}, {"T": {"a:0": 100, "a:1": 10}}, 4)
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [
        (0, 0, 25),
        (0, 25, 50),
        (0, 50, 100),
        (1, 0, 10),
    ]
    tiny = split_ranges({"T": {"a:0": 0}}, {"T": {"a:0": 2}}, 10)
    assert [(r.start, r.end) for r in tiny] == [(0, 1), (1, 2)]


@given(offset_maps, st.integers(1, 20))
def test_split_ranges_cover_exactly(queues: dict[str, tuple[int, int]], min_parts: int) -> None:
    start = {"T": {q: s for q, (s, _l) in queues.items()}}
    end = {"T": {q: s + lag for q, (s, lag) in queues.items()}}
    ranges = split_ranges(start, end, min_parts)
    covered: dict[str, list[int]] = {}
    for r in ranges:
        assert r.end > r.start
        covered.setdefault(f"{r.broker}:{r.queue_id}", []).extend(range(r.start, r.end))
    for q, (s, lag) in queues.items():
        assert covered.get(q, []) == list(range(s, s + lag))
    nonempty = sum(1 for _s, lag in queues.values() if lag)
    assert len(ranges) >= min(min_parts, total_rows(start, end)) or len(ranges) >= nonempty

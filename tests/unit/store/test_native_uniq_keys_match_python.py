"""common.speedups.UniqKeys against UniqKeyGenerator's Python code (its reference).

Skipped when the extension is not built. The native state reads the wall clock itself, so the
reference is given the millisecond the native keys carry.
"""

from __future__ import annotations

import time

import pytest

from common import message as m
from common.message import UniqKeyGenerator, decode_uniq_key, month_start_ms

sp = pytest.importorskip("common.speedups")

pytestmark = pytest.mark.unit

PREFIX = UniqKeyGenerator("192.0.2.5", pid=0x1234, seed=0x89ABCDEF).prefix


def _month() -> tuple[int, int]:
    return month_start_ms(int(time.time() * 1000))


def _reference(counter: int, at_ms: int) -> UniqKeyGenerator:
    """The Python generator with PREFIX, `counter`, and a clock frozen at `at_ms`."""
    gen = UniqKeyGenerator(
        "192.0.2.5", pid=0x1234, seed=0x89ABCDEF, clock=lambda: (at_ms + 0.5) / 1000
    )
    gen._counter = counter
    assert gen._native_keys is None
    return gen


@pytest.mark.parametrize("n", [1, 32, 65_536, 70_000])
def test_next_many_matches_the_reference(n: int) -> None:
    start, end = _month()
    native = sp.UniqKeys(PREFIX, start, end, 0xFFF0)  # the 16-bit counter wraps inside
    keys = native.next_many(n)
    assert keys is not None
    assert len(keys) == n
    at = start + decode_uniq_key(keys[0])[2]
    assert keys == _reference(0xFFF0, at).next_many(n)
    # Past 65,536 keys the time field moves one ms ahead, as the reference's does.
    assert len({decode_uniq_key(k)[2] for k in keys}) == (2 if n > 65_536 else 1)


def test_next_matches_the_reference_within_one_millisecond() -> None:
    start, end = _month()
    native = sp.UniqKeys(PREFIX, start, end, 0xFFFE)
    for _ in range(20):  # bounded: retried only when the clock ticked between the keys
        first = native.next()
        assert first is not None
        at = start + decode_uniq_key(first)[2]
        rest = [native.next() for _ in range(4)]
        if all(decode_uniq_key(k)[2] == at - start for k in rest if k is not None):
            ref = _reference(decode_uniq_key(first)[3], at)
            assert [first, *rest] == [ref.next() for _ in range(5)]
            return
    pytest.fail("the clock ticked between every five keys")


def test_keys_after_a_batch_continue_its_counter_and_time() -> None:
    start, end = _month()
    native = sp.UniqKeys(PREFIX, start, end, 5)
    batch = native.next_many(70_000)
    assert batch is not None
    last_t, last_c = decode_uniq_key(batch[-1])[2:]
    nxt = native.next()
    assert nxt is not None
    t, c = decode_uniq_key(nxt)[2:]
    assert c == (last_c + 1) & 0xFFFF
    assert t >= last_t  # never an earlier millisecond than the batch's last key


def test_a_clock_outside_the_month_asks_for_the_new_month() -> None:
    start, end = _month()
    stale = sp.UniqKeys(PREFIX, 0, 1, 0)  # a month long past
    assert stale.next() is None
    assert stale.next_many(3) is None
    stale.set_month(start, end)
    key = stale.next()
    assert key is not None
    assert key.startswith(PREFIX)
    assert abs((int(time.time() * 1000) - start) - decode_uniq_key(key)[2]) < 60_000


def test_the_generator_moves_to_the_new_month() -> None:
    gen = UniqKeyGenerator("127.0.0.1", pid=3, seed=4)
    if not m.NATIVE:
        pytest.skip("the native accelerators are off (TRIMQ_NO_NATIVE)")
    assert gen._native_keys is not None
    gen._native_keys.set_month(0, 1)  # as if the month had ended since the last key
    for key in (gen.next(), *gen.next_many(2)):
        start, _ = _month()
        assert abs((int(time.time() * 1000) - start) - decode_uniq_key(key)[2]) < 60_000


def test_edge_arguments() -> None:
    start, end = _month()
    native = sp.UniqKeys(PREFIX, start, end, 0)
    assert native.next_many(0) == []
    assert native.next_many(-3) == []
    with pytest.raises(ValueError, match="ASCII"):
        sp.UniqKeys("É", start, end, 0)
    with pytest.raises(TypeError):
        native.set_month(start)

"""common.message.UniqKeyGenerator: RocketMQ's UNIQ_KEY layout and uniqueness."""

from __future__ import annotations

import threading
import time

import pytest

from common.message import MessageDecodeError, UniqKeyGenerator, decode_uniq_key, month_start_ms


def test_layout_ipv4() -> None:
    gen = UniqKeyGenerator("192.0.2.5", pid=0x12345, seed=0xCAFEBABE)
    key = gen.next()
    assert len(key) == 32
    assert key == key.upper()
    # ip (4) + pid int16 (low 16 bits) + int32 random = the fixed prefix
    assert key.startswith("C0000205" + "2345" + "CAFEBABE")
    assert gen.prefix == "C00002052345CAFEBABE"
    ip, pid, t, _counter = decode_uniq_key(key)
    assert (ip, pid) == ("192.0.2.5", 0x2345)
    now = int(time.time() * 1000)
    start, _ = month_start_ms(now)
    # the time field is ms since the start of the current month (low 32 bits)
    assert abs(((now - start) & 0xFFFFFFFF) - t) < 60_000


def test_layout_ipv6() -> None:
    key = UniqKeyGenerator("2001:db8::1", pid=7, seed=1).next()
    assert len(key) == 56
    assert decode_uniq_key(key)[:2] == ("2001:db8::1", 7)


def test_counter_increments() -> None:
    gen = UniqKeyGenerator("127.0.0.1", pid=1, seed=1)
    counters = [decode_uniq_key(gen.next())[3] for _ in range(5)]
    assert [(c - counters[0]) & 0xFFFF for c in counters] == [0, 1, 2, 3, 4]


def test_unique_across_many_calls_and_threads() -> None:
    gen = UniqKeyGenerator("127.0.0.1")
    keys: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        local = [gen.next() for _ in range(20000)]
        with lock:
            keys.extend(local)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 80000
    assert len(set(keys)) == len(keys)


def test_counter_wrap_within_one_millisecond_moves_time() -> None:
    frozen = 1_700_000_000_000
    gen = UniqKeyGenerator("127.0.0.1", pid=1, seed=1, clock=lambda: frozen / 1000)
    keys = [gen.next() for _ in range(70000)]  # more than 65536 in one frozen millisecond
    assert len(set(keys)) == len(keys)
    times = sorted({decode_uniq_key(k)[2] for k in keys})
    start, _ = month_start_ms(frozen)
    assert times == [frozen - start, frozen - start + 1]


def test_month_start() -> None:
    ms = int(time.mktime((2024, 3, 15, 12, 0, 0, 0, 0, -1)) * 1000)
    start, nxt = month_start_ms(ms)
    assert start == int(time.mktime((2024, 3, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    assert nxt == int(time.mktime((2024, 4, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    dec = int(time.mktime((2023, 12, 31, 23, 0, 0, 0, 0, -1)) * 1000)
    assert month_start_ms(dec)[1] == int(time.mktime((2024, 1, 1, 0, 0, 0, 0, 0, -1)) * 1000)


def test_decode_uniq_key_errors() -> None:
    for bad in ("", "ABC", "G" * 32):
        with pytest.raises(MessageDecodeError):
            decode_uniq_key(bad)


def test_clock_going_backwards_stays_unique() -> None:
    now = [1_700_000_000.000]
    gen = UniqKeyGenerator("127.0.0.1", pid=1, seed=1, clock=lambda: now[0])
    keys: list[str] = []
    for step in (0.0, -0.005, 0.001, -0.002, 0.010):
        now[0] += step
        keys.extend(gen.next() for _ in range(40000))
    assert len(set(keys)) == len(keys)

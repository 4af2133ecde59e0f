"""The index's split UNIQ_KEY hash equals the plain Java hash of the whole key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from common.message import UniqKeyGenerator
from store.index_file import key_hash, uniq_key_hash


def test_uniq_keys_of_a_producer() -> None:
    gen = UniqKeyGenerator(ip="192.0.2.3", pid=4321, seed=7)
    for topic in ("BenchTopic", "t", "%RETRY%group", "主题"):
        for _ in range(200):
            key = gen.next()
            assert uniq_key_hash(topic + "#", key) == key_hash(f"{topic}#{key}")


def test_java_reference_values() -> None:
    # String.hashCode() of these strings, from Java; abs() as the index stores it.
    assert uniq_key_hash("", "hello world, here") == key_hash("hello world, here")
    assert key_hash("hello") == 99162322
    assert uniq_key_hash("hel", "lo") == 99162322
    assert uniq_key_hash("TopicTest#", "7F00000100002A9F0000000000000000") == key_hash(
        "TopicTest#7F00000100002A9F0000000000000000"
    )


@given(st.text(max_size=40), st.text(max_size=80))
def test_any_prefix_and_key(prefix: str, key: str) -> None:
    assert uniq_key_hash(prefix, key) == key_hash(prefix + key)


@given(st.text(alphabet="0123456789ABCDEF", min_size=13, max_size=64))
def test_hex_keys(key: str) -> None:
    assert uniq_key_hash("T#", key) == key_hash("T#" + key)

"""controller.keys: the etcd key layout, and names that try to escape it."""

from __future__ import annotations

import pytest

from controller.etcd import prefix_end
from controller.keys import DEFAULT_ROOT, KeyLayout


def test_layout() -> None:
    keys = KeyLayout()
    assert keys.root == DEFAULT_ROOT
    assert keys.leader == b"/trimq/controller/leader"
    assert keys.groups_prefix == b"/trimq/controller/groups/"
    assert keys.group("broker-a") == b"/trimq/controller/groups/broker-a"
    assert keys.broker_name_of(keys.group("broker-a")) == "broker-a"
    # The leader key is not under the groups prefix.
    assert not keys.leader.startswith(keys.groups_prefix)


@pytest.mark.parametrize(
    "name", ["a/b", "../leader", "%2F", "a%b", "名前", " ", "x" * 300, "a\x00b", "~._-"]
)
def test_hostile_names_stay_one_key_under_the_prefix(name: str) -> None:
    keys = KeyLayout("/t/c")
    key = keys.group(name)
    assert key.startswith(keys.groups_prefix)
    assert b"/" not in key[len(keys.groups_prefix) :]
    assert key < prefix_end(keys.groups_prefix)
    assert keys.broker_name_of(key) == name


def test_distinct_names_distinct_keys() -> None:
    keys = KeyLayout()
    names = ["a/b", "a%2Fb", "a b", "a+b", "A/B"]
    assert len({keys.group(n) for n in names}) == len(names)


def test_bad_input() -> None:
    for root in ("", "trimq", "/trimq/", "/a//b"):
        with pytest.raises(ValueError):
            KeyLayout(root)
    keys = KeyLayout()
    with pytest.raises(ValueError):
        keys.group("")
    for key in (keys.leader, keys.groups_prefix, keys.groups_prefix + b"a/b", b"/other/groups/a"):
        with pytest.raises(ValueError):
            keys.broker_name_of(key)

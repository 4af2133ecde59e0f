"""Names that become paths: the store refuses any that is not one plain file name, and the
broker's checks follow RocketMQ's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.topic_manager import (
    GROUP_MAX_LENGTH,
    TopicManager,
    validate_group,
    validate_offset_key,
)
from remoting.protocol.route import TopicConfig
from store.errors import StorePathError
from store.paths import consume_queue_dir

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "topic", ["", ".", "..", "a/b", "%RETRY%/../../x", "/etc", "a\0b", "é" * 128]
)
def test_store_refuses_names_that_are_not_one_file_name(topic: str, tmp_path: Path) -> None:
    with pytest.raises(StorePathError):
        consume_queue_dir(tmp_path, topic, 0)


def test_store_refuses_negative_queue_ids(tmp_path: Path) -> None:
    with pytest.raises(StorePathError):
        consume_queue_dir(tmp_path, "T", -1)
    assert consume_queue_dir(tmp_path, "%RETRY%g", 3) == tmp_path / "consumequeue/%RETRY%g/3"


@pytest.mark.parametrize(
    ("group", "ok"),
    [
        ("CID_a-b|c%d_1", True),
        ("g" * GROUP_MAX_LENGTH, True),
        ("g" * (GROUP_MAX_LENGTH + 1), False),
        ("", False),
        ("a/b", False),
        ("..", False),
        ("a@b", False),
        ("a b", False),
        ("é", False),
    ],
)
def test_group_names(group: str, ok: bool) -> None:
    assert (validate_group(group) is None) is ok


def test_retry_topic_of_the_longest_group_fits_a_file_name(tmp_path: Path) -> None:
    group = "g" * GROUP_MAX_LENGTH
    consume_queue_dir(tmp_path, "%RETRY%" + group, 0)
    assert validate_offset_key(group, "%RETRY%" + group) is None


def test_topic_manager_bounds_names_and_queue_counts(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path, max_queue_nums=8)
    with pytest.raises(ValueError, match="between 0 and 8"):
        topics.update(TopicConfig("T", 9, 9))
    with pytest.raises(ValueError, match="outside"):
        topics.update(TopicConfig("../x", 1, 1))
    assert topics.create_in_send_back("%RETRY%g", 10**9).read_queue_nums == 8

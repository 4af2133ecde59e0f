"""common.schedule: the schedule topic, the default delay levels and the one level parser."""

from __future__ import annotations

import pytest

from common.schedule import DEFAULT_MESSAGE_DELAY_LEVEL, SCHEDULE_TOPIC, parse_delay_levels

pytestmark = pytest.mark.unit

# Apache RocketMQ's default delayLevelTable, in ms.
APACHE_DEFAULT_MS = [
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
]


def test_constants_are_rocketmqs() -> None:
    assert SCHEDULE_TOPIC == "SCHEDULE_TOPIC_XXXX"
    assert DEFAULT_MESSAGE_DELAY_LEVEL == (
        "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    )
    assert parse_delay_levels(DEFAULT_MESSAGE_DELAY_LEVEL) == APACHE_DEFAULT_MS


def test_units_and_separators() -> None:
    assert parse_delay_levels("1s 1m 1h 1d") == [1_000, 60_000, 3_600_000, 86_400_000]
    assert parse_delay_levels("1d 250s") == [86_400_000, 250_000]
    assert parse_delay_levels("0s 007m") == [0, 420_000]
    assert parse_delay_levels("  1s\t2s\n3s  ") == [1_000, 2_000, 3_000]
    assert parse_delay_levels("") == []
    assert parse_delay_levels("   ") == []


@pytest.mark.parametrize(
    "item", ["1x", "s", "5", "1S", "1ms", "-5s", "+5s", "1_0s", "1.5s", "\u00b2s"]
)
def test_bad_items_are_refused_by_name(item: str) -> None:
    with pytest.raises(ValueError, match="bad delay level") as info:
        parse_delay_levels(f"1s {item}")
    assert repr(item) in str(info.value)


def test_producers_may_not_send_to_the_schedule_topic() -> None:
    import broker.topic_manager

    assert SCHEDULE_TOPIC in broker.topic_manager.NOT_ALLOWED_SEND_TOPICS


def test_configs_default_to_and_check_the_shared_levels() -> None:
    from broker.config import BrokerConfig
    from store.config import StoreConfig

    assert StoreConfig().message_delay_level == DEFAULT_MESSAGE_DELAY_LEVEL
    assert BrokerConfig().message_delay_level == DEFAULT_MESSAGE_DELAY_LEVEL
    assert BrokerConfig().store_config().message_delay_level == DEFAULT_MESSAGE_DELAY_LEVEL
    with pytest.raises(ValueError, match="bad delay level"):
        BrokerConfig(message_delay_level="1s 2x")
    with pytest.raises(ValueError, match="needs at least one level"):
        BrokerConfig(message_delay_level=" ")

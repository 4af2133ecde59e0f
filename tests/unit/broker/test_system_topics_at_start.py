"""The broker's settings reach its topic table at start: the cluster's reply topic always, the
trace topic with `trace_topic_enable`; `store_reply_message_enable` reaches the reply
processor."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.topic_manager import TRACE_TOPIC

pytestmark = pytest.mark.unit


def _ctrl(tmp_path: Path, **kw: object) -> BrokerController:
    return BrokerController(
        BrokerConfig(store_dir=str(tmp_path), broker_cluster_name="C1", **kw)  # type: ignore[arg-type]
    )


def test_reply_topic_always_and_trace_topic_when_enabled(tmp_path: Path) -> None:
    plain = _ctrl(tmp_path / "a")
    assert plain.topics.get("C1_REPLY_TOPIC") is not None
    assert plain.topics.get(TRACE_TOPIC) is None
    assert plain.reply.store_reply is True
    traced = _ctrl(tmp_path / "b", trace_topic_enable=True, store_reply_message_enable=False)
    assert traced.topics.get(TRACE_TOPIC) is not None
    assert traced.reply.store_reply is False

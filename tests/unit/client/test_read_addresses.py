"""Which broker of a name a consumer reads from and commits offsets to (RocketMQ's
findBrokerAddressInSubscribe): the suggested id, the next slave id, else the lowest id known."""

from __future__ import annotations

import pytest

from client import ClientConfig
from client.errors import MQClientError
from client.instance import ClientInstance

pytestmark = pytest.mark.unit


def _instance(addrs: dict[int, str]) -> ClientInstance:
    inst = ClientInstance(ClientConfig(namesrv_addr="127.0.0.1:1"))
    inst.broker_addrs["b"] = dict(addrs)
    return inst


def test_master_by_default_and_the_suggested_slave() -> None:
    inst = _instance({0: "m:1", 1: "s1:1", 2: "s2:1"})
    assert inst.find_subscribe_addr("b") == ("m:1", False)
    assert inst.find_subscribe_addr("b", 1) == ("s1:1", True)
    assert inst.find_subscribe_addr("b", 2) == ("s2:1", True)


def test_a_missing_slave_id_tries_the_next_then_any() -> None:
    inst = _instance({0: "m:1", 2: "s2:1"})
    assert inst.find_subscribe_addr("b", 1) == ("s2:1", True)
    assert inst.find_subscribe_addr("b", 5) == ("m:1", False)
    assert inst.find_subscribe_addr("b", 5, only_this=True) is None


def test_without_a_master_reads_and_offsets_go_to_a_slave() -> None:
    inst = _instance({1: "s1:1", 2: "s2:1"})
    assert inst.find_subscribe_addr("b") == ("s1:1", True)
    assert inst.find_subscribe_addr("b", only_this=True) is None
    assert inst.find_subscribe_addr("unknown") is None


async def test_offset_address_falls_back_to_a_slave() -> None:
    inst = _instance({1: "s1:1"})
    assert await inst.find_offset_addr("b") == "s1:1"
    inst.broker_addrs["b"][0] = "m:1"
    assert await inst.find_offset_addr("b") == "m:1"
    with pytest.raises(MQClientError):
        await inst.find_read_addr("gone")

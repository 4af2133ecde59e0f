"""Clients given the same instance name share one `ClientInstance` per trio run (RocketMQ's
MQClientManager: one MQClientInstance per client id); unnamed clients get their own."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from client import (
    ClientConfig,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageExt,
    MQClientError,
    Producer,
    PushConsumer,
)
from client.errors import ClientClosedError
from client.instance import ClientInstance, shared_instance
from tests.helpers import free_port

pytestmark = pytest.mark.unit


def _cfg(**kw: object) -> ClientConfig:
    # Nothing listens there: route lookups fail at once (logged), nothing else is needed.
    return ClientConfig(namesrv_addr=f"127.0.0.1:{free_port()}", **kw)  # type: ignore[arg-type]


async def test_named_clients_share_and_unnamed_ones_do_not() -> None:
    named = _cfg(instance_name="svc")
    async with Producer("pa", named) as a, Producer("pb", named) as b, Producer("pc") as c:
        assert a.instance is b.instance
        assert c.instance is not a.instance
        assert a.instance.producers.keys() == {"pa", "pb"}
        async with Producer("pd", _cfg(instance_name="other")) as d:
            assert d.instance is not a.instance


async def test_the_first_user_may_leave_first_and_the_last_stops_it() -> None:
    """Clients in different tasks: the one that started the instance leaves while the other
    still uses it; the instance stops with the last one."""
    cfg = _cfg(instance_name="svc")
    seen: dict[str, ClientInstance] = {}
    second_in = trio.Event()
    first_out = trio.Event()

    async def first() -> None:
        async with Producer("p1", cfg) as p:
            seen["first"] = p.instance
            await second_in.wait()
        first_out.set()

    async def second() -> None:
        await trio.testing.wait_all_tasks_blocked()  # after the first started it
        async with Producer("p2", cfg) as p:
            seen["second"] = p.instance
            second_in.set()
            await first_out.wait()
            assert p.instance.running
            assert p.instance.producers.keys() == {"p2"}

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        nursery.start_soon(second)
    inst = seen["first"]
    assert seen["second"] is inst
    assert not inst.running
    async with Producer("p3", cfg) as third:  # a new one for the next user
        assert third.instance is not inst
        assert third.instance.running


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
async def test_a_group_twice_on_one_shared_instance_is_refused(orderly: bool) -> None:
    """Refused without hanging: the tasks the second consumer started before the refusal
    (its listeners' deadline timer; an orderly one's lock renewal) are cancelled."""
    cfg = _cfg(instance_name="svc")

    def consumer() -> PushConsumer:
        if orderly:
            c = PushConsumer("g", cfg, orderly_listener=_ignore_orderly)
        else:
            c = PushConsumer("g", cfg, listener=_ignore)
        c.subscribe("T", "*")
        return c

    async with consumer():
        with pytest.raises(MQClientError, match="already registered"):
            async with consumer():
                pass


async def _ignore(msgs: list[MessageExt]) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


async def _ignore_orderly(
    msgs: list[MessageExt], ctx: ConsumeOrderlyContext
) -> ConsumeOrderlyStatus:
    return ConsumeOrderlyStatus.SUCCESS


async def test_an_instance_that_cannot_start_fails_its_users_and_the_next_starts_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = ClientInstance.__aenter__

    async def broken(self: ClientInstance) -> ClientInstance:
        raise OSError("no sockets today")

    monkeypatch.setattr(ClientInstance, "__aenter__", broken)
    cfg = _cfg(instance_name="svc")
    with pytest.raises(ClientClosedError, match=r"could not start.*no sockets today"):
        async with shared_instance(cfg):
            pass
    monkeypatch.setattr(ClientInstance, "__aenter__", real)
    async with shared_instance(cfg) as inst:
        assert inst.running


async def test_a_failed_instance_is_logged_and_replaced_for_the_next_user() -> None:
    """A background task of a shared instance fails: the system task hosting it must not raise
    (trio would abort the run); its users see it stopped, and the next user gets a new one."""
    cfg = _cfg(instance_name="svc")

    async def boom() -> None:
        raise RuntimeError("background task bug")

    async with shared_instance(cfg) as inst:
        inst.nursery.start_soon(boom)
        with trio.fail_after(5):
            while inst.running:
                await trio.sleep(0.01)
        async with shared_instance(cfg) as again:
            assert again is not inst
            assert again.running

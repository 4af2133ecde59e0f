"""Producer retries and latency fault tolerance, over a scripted broker transport."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

from client._api import MQClientAPI
from client.config import ClientConfig
from client.errors import SendFailedError
from client.fault import FaultStrategy
from client.message import Message, MessageQueue
from client.producer import Producer
from client.request_reply import PendingRequests
from client.route import TopicPublishInfo
from remoting import RemotingCommand
from remoting.codes import ResponseCode
from remoting.errors import RemoteError, RemotingConnectError, RemotingTimeoutError

ADDRS = {"broker-a": "192.0.2.1:10911", "broker-b": "192.0.2.2:10911"}


class Broker:
    """Answers sends per address: ok, refuse (connection error), a code, hang (until the
    request's timeout) or freeze (never answers, not even at the request's timeout)."""

    def __init__(self) -> None:
        self.mode = dict.fromkeys(ADDRS.values(), "ok")
        self.calls: list[str] = []

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> RemotingCommand:
        self.calls.append(addr)
        mode = self.mode[addr]
        if mode == "refuse":
            raise RemotingConnectError(f"connect to {addr} failed")
        if mode == "hang":
            await trio.sleep(timeout_ms / 1000)
            raise RemotingTimeoutError("timeout")
        if mode == "freeze":
            await trio.sleep_forever()
        if mode.isdigit():
            return cmd.make_response(int(mode), "broker says no")
        assert cmd.ext_fields is not None
        return cmd.make_response(
            ext_fields={"msgId": "X", "queueId": cmd.ext_fields["e"], "queueOffset": "0"}
        )

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.calls.append(addr)


class FakeInstance:
    """The parts of ClientInstance a producer uses, with a fixed two-broker route."""

    def __init__(self, broker: Broker) -> None:
        self.config = ClientConfig(namesrv_addr="ns:1", client_ip="127.0.0.1")
        self.api = MQClientAPI(broker, ["ns:1"])
        queues = [MessageQueue("T", b, i) for b in ADDRS for i in range(2)]
        self.publish_info = {"T": TopicPublishInfo("T", queues)}
        self.running = True
        self.requests = PendingRequests()  # request-reply's table (none pending here)

    async def get_publish_info(self, topic: str) -> TopicPublishInfo:
        return self.publish_info[topic]

    async def find_master_addr(self, broker_name: str, topic: str | None = None) -> str:
        return ADDRS[broker_name]

    async def update_topic_route(self, topic: str, *, use_default: bool = False) -> bool:
        return True

    def register_producer(self, group: str, producer: object) -> None:
        self.registered = group

    async def unregister_producer(self, group: str) -> None:
        self.registered = ""


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class UncachedInstance(FakeInstance):
    """A route that is looked up on every send (never cached in `publish_info`), so the
    producer bounds the whole call with its own cancel scope."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.routes = self.publish_info
        self.publish_info = {}

    async def get_publish_info(self, topic: str) -> TopicPublishInfo:
        await trio.lowlevel.checkpoint()
        return self.routes[topic]


def _producer(broker: Broker, clock: Clock, inst: FakeInstance | None = None) -> Producer:
    inst = inst or FakeInstance(broker)
    p = Producer("pg", inst.config, instance=inst)  # type: ignore[arg-type]
    p.fault = FaultStrategy(True, clock)
    return p


async def test_failed_broker_is_retried_elsewhere_then_avoided_until_it_recovers() -> None:
    broker, clock = Broker(), Clock()
    broker.mode[ADDRS["broker-b"]] = "refuse"
    p = _producer(broker, clock)
    results = [await p.send(Message("T", b"x")) for _ in range(10)]
    assert {r.message_queue.broker_name for r in results} == {"broker-a"}
    # broker-b was tried at most once: afterwards it is isolated (not available).
    assert broker.calls.count(ADDRS["broker-b"]) == 1
    assert not p.fault.is_available("broker-b")
    broker.mode[ADDRS["broker-b"]] = "ok"
    clock.now += 599_999  # an isolating failure counts as 30 s latency -> 600 s
    assert {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(6)} == {
        "broker-a"
    }
    clock.now += 1
    used = {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(6)}
    assert used == {"broker-a", "broker-b"}


async def test_all_brokers_failing_raises_after_the_configured_attempts() -> None:
    broker, clock = Broker(), Clock()
    for addr in ADDRS.values():
        broker.mode[addr] = "refuse"
    p = _producer(broker, clock)
    with pytest.raises(SendFailedError, match=r"Send \[3\] times") as info:
        await p.send(Message("T", b"x"))
    assert isinstance(info.value.__cause__, RemotingConnectError)
    assert len(broker.calls) == 3  # 1 + retry_times_when_send_failed (2)


async def test_retryable_broker_code_moves_on_and_other_codes_do_not() -> None:
    broker, clock = Broker(), Clock()
    broker.mode[ADDRS["broker-a"]] = str(int(ResponseCode.SYSTEM_BUSY))
    p = _producer(broker, clock)
    for _ in range(4):
        assert (await p.send(Message("T", b"x"))).message_queue.broker_name == "broker-b"
    broker.mode[ADDRS["broker-b"]] = str(int(ResponseCode.MESSAGE_ILLEGAL))
    broker.calls.clear()
    with pytest.raises(RemoteError) as info:
        await p.send(Message("T", b"x"), queue=MessageQueue("T", "broker-b", 0))
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert broker.calls == [ADDRS["broker-b"]]


async def test_total_time_is_bounded_by_the_send_timeout(autojump_clock: trio.abc.Clock) -> None:
    broker, clock = Broker(), Clock()
    for addr in ADDRS.values():
        broker.mode[addr] = "hang"
    p = _producer(broker, clock)
    start = trio.current_time()
    with pytest.raises((RemotingTimeoutError, SendFailedError)):
        await p.send(Message("T", b"x"), timeout_ms=3000)
    assert trio.current_time() - start == pytest.approx(3.0, abs=0.01)
    # The first attempt used up the whole budget: no second broker was tried.
    assert len(broker.calls) == 1


async def test_selector_and_given_queue() -> None:
    broker, clock = Broker(), Clock()
    p = _producer(broker, clock)

    def last_queue(mqs: Sequence[MessageQueue], msg: Message, arg: object) -> MessageQueue:
        assert arg == "hint"
        return mqs[-1]

    r = await p.send(Message("T", b"x"), selector=last_queue, arg="hint")
    assert r.message_queue == MessageQueue("T", "broker-b", 1)
    r = await p.send(Message("T", b"x"), queue=MessageQueue("T", "broker-a", 1))
    assert r.message_queue == MessageQueue("T", "broker-a", 1)


async def test_send_async_future_and_callback() -> None:
    broker, clock = Broker(), Clock()
    broker.mode[ADDRS["broker-a"]] = "refuse"
    broker.mode[ADDRS["broker-b"]] = "refuse"
    p = _producer(broker, clock)
    seen: list[tuple[object, object]] = []
    async with p:
        fut = p.send_async(Message("T", b"x"), lambda r, e: seen.append((r, e)))
        with pytest.raises(SendFailedError):
            await fut
        broker.mode[ADDRS["broker-a"]] = "ok"
        broker.mode[ADDRS["broker-b"]] = "ok"
        p.fault = FaultStrategy(False)
        ok = p.send_async(Message("T", b"y"))
        result = await ok
        assert ok.done
    assert result.msg_id
    assert len(seen) == 1
    assert seen[0][0] is None
    assert isinstance(seen[0][1], SendFailedError)


async def _send_until_cut_off(p: Producer, broker: Broker, frozen: str, *, own_scope: bool) -> int:
    """Send until one send hits the frozen broker and is cut off; how many sends that took."""
    for n in range(1, 6):
        start = trio.current_time()
        if own_scope:
            with trio.move_on_after(2.0) as scope:
                await p.send(Message("T", b"x"))
            cut_off = scope.cancelled_caught
        else:
            errors: list[str] = []
            try:
                await p.send(Message("T", b"x"), timeout_ms=3000)
            except RemotingTimeoutError as exc:
                errors.append(str(exc))
            cut_off = bool(errors)
            assert all("sendDefaultImpl call timeout" in e for e in errors), errors
        if cut_off:
            # At the timeout, not before (the attempt really hung until it was cut off).
            assert trio.current_time() - start == pytest.approx(2.0 if own_scope else 3.0)
            assert broker.calls[-1] == frozen
            return n
    raise AssertionError(f"the frozen broker was never picked: {broker.calls}")


@pytest.mark.parametrize("own_scope", [False, True], ids=["send_timeout", "caller_scope"])
async def test_attempt_cut_off_by_a_timeout_charges_its_broker(
    autojump_clock: trio.abc.Clock, own_scope: bool
) -> None:
    """A send whose attempt hangs until the producer's total send timeout (or the caller's
    cancel scope) cuts it off isolates that broker: the next sends go elsewhere."""
    broker, clock = Broker(), Clock()
    frozen = ADDRS["broker-b"]
    broker.mode[frozen] = "freeze"
    # Uncached route: the producer's own cancel scope is what ends the frozen attempt.
    p = _producer(broker, clock, UncachedInstance(broker))
    await _send_until_cut_off(p, broker, frozen, own_scope=own_scope)
    assert not p.fault.is_available("broker-b")
    item = p.fault.tolerance.snapshot()["broker-b"]
    # Latency = the elapsed time; unavailable for the isolation entry (30 s -> 600 s).
    assert item.current_latency == pytest.approx(2000.0 if own_scope else 3000.0)
    assert item.start_timestamp == clock.now + 600_000
    broker.calls.clear()
    used = {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(8)}
    assert used == {"broker-a"}
    assert frozen not in broker.calls
    # Usable again once its not-available duration is over.
    broker.mode[frozen] = "ok"
    clock.now += 600_000
    used = {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(8)}
    assert used == {"broker-a", "broker-b"}


async def test_configured_fault_tables_shorten_the_isolation(
    autojump_clock: trio.abc.Clock,
) -> None:
    broker, clock = Broker(), Clock()
    broker.mode[ADDRS["broker-b"]] = "refuse"
    inst = FakeInstance(broker)
    cfg = inst.config.model_copy(
        update={
            "latency_max_ms": (50, 1000, 15000),
            "not_available_duration_ms": (0, 2000, 5000),
        }
    )
    p = Producer("pg", cfg, instance=inst)  # type: ignore[arg-type]
    assert p.fault.tolerance.latency_max_ms == (50, 1000, 15000)
    assert p.fault.tolerance.not_available_duration_ms == (0, 2000, 5000)
    p.fault = FaultStrategy(
        True,
        clock,
        latency_max_ms=cfg.latency_max_ms,
        not_available_duration_ms=cfg.not_available_duration_ms,
    )
    for _ in range(4):
        assert (await p.send(Message("T", b"x"))).message_queue.broker_name == "broker-a"
    broker.mode[ADDRS["broker-b"]] = "ok"
    clock.now += 4_999
    assert {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(4)} == {
        "broker-a"
    }
    clock.now += 1
    used = {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(4)}
    assert used == {"broker-a", "broker-b"}


class CountingInstance(FakeInstance):
    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.route_updates = 0

    async def update_topic_route(self, topic: str, *, use_default: bool = False) -> bool:
        self.route_updates += 1
        return True


async def test_first_attempt_failure_goes_on_with_the_next_attempts() -> None:
    """The first attempt (made in `send` itself) failing with a transport error: charged,
    route refreshed, retried on the other broker, like any later attempt."""
    broker, clock = Broker(), Clock()
    inst = CountingInstance(broker)
    p = _producer(broker, clock, inst)
    broker.mode[ADDRS["broker-a"]] = "refuse"
    broker.mode[ADDRS["broker-b"]] = "refuse"
    with pytest.raises(SendFailedError, match=r"Send \[3\] times") as info:
        await p.send(Message("T", b"x"))
    assert isinstance(info.value.__cause__, RemotingConnectError)
    assert len(broker.calls) == 3
    assert inst.route_updates == 3
    # Both brokers isolated now: the next send takes the selection with fault tolerance.
    assert not p.fault.is_available("broker-a")
    assert not p.fault.is_available("broker-b")
    assert not p.fault.all_available()
    broker.calls.clear()
    broker.mode[ADDRS["broker-a"]] = "ok"
    broker.mode[ADDRS["broker-b"]] = "ok"
    await p.send(Message("T", b"x"))
    assert len(broker.calls) == 1


@pytest.mark.parametrize("fault_enabled", [True, False])
async def test_first_attempt_with_a_final_broker_error_is_not_retried(fault_enabled: bool) -> None:
    broker, clock = Broker(), Clock()
    for addr in ADDRS.values():
        broker.mode[addr] = str(int(ResponseCode.MESSAGE_ILLEGAL))
    inst = CountingInstance(broker)
    p = _producer(broker, clock, inst)
    p.fault = FaultStrategy(fault_enabled, clock)
    with pytest.raises(RemoteError) as info:
        await p.send(Message("T", b"x"))
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert info.value.__context__ is None
    assert len(broker.calls) == 1
    assert inst.route_updates == 0
    # Recorded, but not isolating (a refusal is not the broker's fault).
    items = p.fault.tolerance.snapshot()
    assert len(items) == (1 if fault_enabled else 0)
    assert p.fault.all_available()


async def test_success_records_the_latency_without_isolation(
    autojump_clock: trio.abc.Clock,
) -> None:
    class Slow(Broker):
        async def invoke(
            self,
            addr: str,
            cmd: RemotingCommand,
            timeout_ms: int = 3000,
            *,
            long_poll: bool = False,
        ) -> RemotingCommand:
            await trio.sleep(0.04)
            return await super().invoke(addr, cmd, timeout_ms)

    broker, clock = Slow(), Clock()
    p = _producer(broker, clock)
    result = await p.send(Message("T", b"x"))
    item = p.fault.tolerance.snapshot()[result.message_queue.broker_name]
    assert item.current_latency == pytest.approx(40.0)
    assert item.start_timestamp == clock.now
    assert p.fault.all_available()


async def test_first_attempt_cut_off_by_the_callers_scope_charges_its_broker(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cached route (the first attempt runs in `send`): the caller's cancel scope cutting
    the attempt off isolates the broker, and the cancellation goes on."""
    broker, clock = Broker(), Clock()
    frozen = ADDRS["broker-b"]
    broker.mode[frozen] = "freeze"
    p = _producer(broker, clock)
    n = await _send_until_cut_off(p, broker, frozen, own_scope=True)
    assert n <= 3  # round robin over a0, a1, b0, b1
    item = p.fault.tolerance.snapshot()["broker-b"]
    assert item.current_latency == pytest.approx(2000.0)
    assert item.start_timestamp == clock.now + 600_000
    broker.calls.clear()
    used = {(await p.send(Message("T", b"x"))).message_queue.broker_name for _ in range(6)}
    assert used == {"broker-a"}


async def test_round_robin_visits_every_queue_in_turn() -> None:
    broker, clock = Broker(), Clock()
    p = _producer(broker, clock)
    got = [(await p.send(Message("T", b"x"))).message_queue for _ in range(8)]
    queues = p.instance.publish_info["T"].queues
    start = queues.index(got[0])
    assert got == [queues[(start + i) % len(queues)] for i in range(8)]


async def test_a_negative_timeout_times_out_without_an_attempt() -> None:
    broker, clock = Broker(), Clock()
    p = _producer(broker, clock)
    with pytest.raises(RemotingTimeoutError, match="sendDefaultImpl call timeout"):
        await p.send(Message("T", b"x"), timeout_ms=-5)
    assert broker.calls == []


async def test_a_started_producer_times_attempts_on_its_runs_clock(
    autojump_clock: trio.abc.Clock,
) -> None:
    class Slow(Broker):
        delay = 0.25

        async def invoke(
            self,
            addr: str,
            cmd: RemotingCommand,
            timeout_ms: int = 3000,
            *,
            long_poll: bool = False,
        ) -> RemotingCommand:
            await trio.sleep(self.delay)
            return await super().invoke(addr, cmd, timeout_ms)

    broker, clock = Slow(), Clock()
    p = _producer(broker, clock)
    async with p:
        result = await p.send(Message("T", b"x"))
        item = p.fault.tolerance.snapshot()[result.message_queue.broker_name]
        assert item.current_latency == pytest.approx(250.0)  # the MockClock's time
        # and the send timeout too: a hanging broker is cut off at the (virtual) 1 s.
        broker.delay = 0
        for addr in ADDRS.values():
            broker.mode[addr] = "hang"
        start = trio.current_time()
        with pytest.raises((RemotingTimeoutError, SendFailedError)):
            await p.send(Message("T", b"x"), timeout_ms=1000)
        assert trio.current_time() - start == pytest.approx(1.0, abs=0.01)
    assert p._now is trio.current_time


async def test_a_broker_turned_slave_makes_the_route_refresh() -> None:
    """SERVICE_NOT_AVAILABLE (the address is a slave now, or a broker without a role): the
    route is read again before the next attempt, which goes elsewhere."""
    broker, clock = Broker(), Clock()
    inst = CountingInstance(broker)
    p = _producer(broker, clock, inst)
    broker.mode[ADDRS["broker-a"]] = str(int(ResponseCode.SERVICE_NOT_AVAILABLE))
    broker.mode[ADDRS["broker-b"]] = str(int(ResponseCode.SERVICE_NOT_AVAILABLE))
    with pytest.raises(SendFailedError):
        await p.send(Message("T", b"x"))
    assert inst.route_updates == len(broker.calls) > 1
    # Another refusal (not a route matter) does not read the route again.
    inst.route_updates = 0
    broker.mode[ADDRS["broker-a"]] = str(int(ResponseCode.SYSTEM_BUSY))
    broker.mode[ADDRS["broker-b"]] = str(int(ResponseCode.SYSTEM_BUSY))
    with pytest.raises(SendFailedError):
        await p.send(Message("T", b"x"))
    assert inst.route_updates == 0

"""`consume_timeout_ms`: a listener call that runs longer is cancelled and its batch retried
(concurrent: RECONSUME_LATER, which sends it back; orderly: SUSPEND_CURRENT_QUEUE_A_MOMENT).
The same bound holds for a direct consume (CONSUME_MESSAGE_DIRECTLY), whose results are
checked here too. Run on trio's MockClock, so the 15-minute default costs no wall time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from client.config import ClientConfig
from client.consumer.push import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    PushConsumer,
)
from client.message import MessageExt, MessageQueue

MQ = MessageQueue("T", "broker-a", 0)
TIMEOUT_MIN = 15  # ClientConfig's default consume_timeout_ms, in minutes


def _run(c: PushConsumer, main: Callable[[], Awaitable[None]]) -> None:
    """`main` on trio's MockClock with the consumer's deadline timer running (as
    `PushConsumer` starts it)."""

    async def with_timer() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c._call_deadlines.run)
            await main()
            assert c._call_deadlines.open_calls == 0  # every call forgot its deadline
            nursery.cancel_scope.cancel()

    trio.run(with_timer, clock=trio.testing.MockClock(autojump_threshold=0))


def _concurrent(minutes: float, finished: list[bool]) -> PushConsumer:
    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        await trio.sleep(minutes * 60)
        finished.append(True)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("cg_timeout", ClientConfig(), listener=listener)
    c._wants_context = False
    return c


def test_a_listener_over_the_timeout_is_cancelled_and_retried() -> None:
    finished: list[bool] = []
    c = _concurrent(TIMEOUT_MIN + 1, finished)

    async def main() -> None:
        start = trio.current_time()
        status = await c._call_listener(MQ, [], ConsumeConcurrentlyContext(MQ))
        assert status is ConsumeStatus.RECONSUME_LATER
        assert trio.current_time() - start == TIMEOUT_MIN * 60  # cut at the timeout, not later

    _run(c, main)
    assert finished == []  # the listener never ran to its end


def test_a_listener_within_the_timeout_keeps_its_status() -> None:
    finished: list[bool] = []
    c = _concurrent(TIMEOUT_MIN - 1, finished)

    async def main() -> None:
        status = await c._call_listener(MQ, [], ConsumeConcurrentlyContext(MQ))
        assert status is ConsumeStatus.CONSUME_SUCCESS

    _run(c, main)
    assert finished == [True]


def test_the_timeout_follows_the_config() -> None:
    finished: list[bool] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        await trio.sleep(2)
        finished.append(True)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("cg_timeout", ClientConfig(consume_timeout_ms=1500), listener=listener)
    c._wants_context = False

    async def main() -> None:
        status = await c._call_listener(MQ, [], ConsumeConcurrentlyContext(MQ))
        assert status is ConsumeStatus.RECONSUME_LATER

    _run(c, main)
    assert finished == []


def test_an_orderly_listener_over_the_timeout_suspends_the_queue() -> None:
    finished: list[bool] = []

    async def orderly(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        await trio.sleep((TIMEOUT_MIN + 1) * 60)
        finished.append(True)
        return ConsumeOrderlyStatus.SUCCESS

    c = PushConsumer("cg_timeout", ClientConfig(), orderly_listener=orderly)

    async def main() -> None:
        status = await c._call_orderly(MQ, [], ConsumeOrderlyContext(MQ))
        assert status is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    _run(c, main)
    assert finished == []


# -- CONSUME_MESSAGE_DIRECTLY: one listener call, its result as RocketMQ names it ------------


def _message(topic: str = "T", **properties: str) -> MessageExt:
    return MessageExt(topic, b"x", properties=dict(properties), queue_id=3)


def test_consume_directly_reports_the_listeners_answer() -> None:
    answers: list[ConsumeStatus | None] = [None, ConsumeStatus.RECONSUME_LATER]
    seen: list[tuple[str, str, int]] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeStatus:
        seen.append((msgs[0].topic, ctx.message_queue.broker_name, ctx.message_queue.queue_id))
        answer = answers.pop(0)
        if answer is None:
            return None  # type: ignore[return-value]  # a listener that returns nothing
        return answer

    c = PushConsumer("cg_direct", ClientConfig(), listener=listener)
    c._wants_context = True  # as `start` finds it

    async def main() -> None:
        got = await c.consume_message_directly(_message(), "broker-b")
        assert got == {"order": False, "autoCommit": True, "consumeResult": "CR_SUCCESS",
                       "remark": None, "spentTimeMills": 0}  # fmt: skip
        # A retried message is shown under its real topic, as in consumption.
        retried = _message("%RETRY%cg_direct", RETRY_TOPIC="T")
        got = await c.consume_message_directly(retried, "broker-b")
        assert got["consumeResult"] == "CR_LATER"

    _run(c, main)
    assert seen == [("T", "broker-b", 3), ("T", "broker-b", 3)]


def test_consume_directly_reports_a_raise_and_a_timeout() -> None:
    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].body == b"boom":
            raise ValueError("no such thing")
        await trio.sleep((TIMEOUT_MIN + 1) * 60)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("cg_direct", ClientConfig(), listener=listener)
    c._wants_context = False

    async def main() -> None:
        boom = _message()
        boom.body = b"boom"
        got = await c.consume_message_directly(boom, "broker-a")
        assert got["consumeResult"] == "CR_THROW_EXCEPTION"
        assert got["remark"] == "ValueError('no such thing')"
        got = await c.consume_message_directly(_message(), "broker-a")
        assert got["consumeResult"] == "CR_THROW_EXCEPTION"
        assert "consume timeout" in got["remark"]
        assert got["spentTimeMills"] == TIMEOUT_MIN * 60 * 1000

    _run(c, main)


def test_consume_directly_with_an_orderly_listener() -> None:
    answers = [ConsumeOrderlyStatus.SUCCESS, ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT]

    async def orderly(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        return answers.pop(0)

    c = PushConsumer("cg_direct", ClientConfig(), orderly_listener=orderly)

    async def main() -> None:
        got = await c.consume_message_directly(_message(), "broker-a")
        assert (got["order"], got["consumeResult"]) == (True, "CR_SUCCESS")
        got = await c.consume_message_directly(_message(), "broker-a")
        assert (got["order"], got["consumeResult"]) == (True, "CR_LATER")

    _run(c, main)

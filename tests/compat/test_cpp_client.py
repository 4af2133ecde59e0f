"""The Apache RocketMQ C++ client (PyPI `rocketmq==0.4.4`) against real trimq processes.

A client nobody here wrote: librocketmq 1.0.1 (bundled in the wheel for Linux x86-64) and its
ctypes binding, driven in a subprocess by `cpp_client.py` (crash and hang isolation, and its
own HOME for the library's log, which is added to the report of a failing test). Everything
the binding offers is exercised:

- `Producer.send_sync`, `send_async`, `send_oneway`, `send_orderly` / `send_oneway_orderly`
  (the binding's sharding argument: an int, queue = arg % queue count) with keys, tags, user
  properties and a delay level; a body over 4 KiB (the C++ client compresses it);
- `PushConsumer` with a tag expression (`TagA || TagB`: a TagC message is never delivered),
  consuming what the C++ producer and trimq's producer sent, byte-exact; a message answered
  RECONSUME_LATER once comes back with reconsume_times 1; `PushConsumer(orderly=True)`;
  two consumers of a clustering group split the queues (the broker's
  NOTIFY_CONSUMER_IDS_CHANGED reaches them), two of a broadcasting group each get everything;
- `PullConsumer.pull(topic)`;
- trimq's own consumer reading what the C++ producer sent;
- `Producer.send_batch`: see `test_send_batch_is_stored_as_one_message_as_apache_does`;
- `mqadmin consumerStatus` and `queryMsgByUniqueKey -g -d` against a C++ push consumer (the
  broker forwards 307 and 309 over its connection).

What the binding (0.4.4) does not offer, or offers with a limitation:

- no transactional producer: neither the Python binding (`rocketmq.client` has no
  `TransactionMQProducer`) nor the C API of the bundled librocketmq (no
  `CreateTransactionProducer` symbol); `test_binding_has_no_transaction_producer` checks it,
  so an upgrade of the wheel shows where transaction tests belong;
- `Message.set_body` and `RecvMessage.body` pass C strings: a body ends at its first NUL
  byte. Bodies with NUL bytes are sent with the C API's `SetByteMessageBody` (which the
  binding loads) and read from the library's buffer with the expected length;
- `PushConsumer.subscribe`'s callback cannot return a status (its return value is ignored,
  and an exception makes the ctypes callback return an undefined value): the driver
  registers a callback that returns CONSUME_SUCCESS or RECONSUME_LATER through the binding's
  `Subscribe` and `_register_callback`.
"""

from __future__ import annotations

import json

import pytest
import trio

from client import (
    Admin,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    SendStatus,
)
from common.message import decode_batch_body
from tests.compat.conftest import Cluster, CppClient
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config

# Invalid UTF-8 everywhere (0x80-0xFF), but no NUL: what Message.set_body can carry.
BINARY = bytes(range(1, 256))
# NUL bytes: sent with SetByteMessageBody.
WITH_NUL = b"\x00\x01head\x00\xff\xfe\x00tail\x00"
# Over 4 KiB: compressed by the C++ producer (compressMsgBodyOverHowmuch = 4096) and by trimq's.
LARGE = BINARY * 40 + b"\x00" + BINARY * 24  # 16,321 bytes, one NUL in the middle
LARGE_NO_NUL = BINARY * 40  # 10,200 bytes

COMPRESSED_FLAG = 0x1
CPP_TIMEOUT = 40.0


def _send(mode: str, topic: str, body: bytes, **kw: object) -> dict[str, object]:
    return {"mode": mode, "topic": topic, "body_hex": body.hex(), **kw}


async def _poll_all(cluster: Cluster, group: str, topic: str, n: int) -> list[MessageExt]:
    """Everything trimq's own consumer reads from `topic`, until `n` messages (20 s bound)."""
    cfg = fast_config(cluster.addr)
    got: list[MessageExt] = []
    async with PullConsumer(
        group, cfg, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ) as c:
        c.subscribe(topic)
        with trio.move_on_after(20):
            while len(got) < n:
                got.extend(await c.poll(timeout_ms=300))
        await trio.sleep(0.3)
        got.extend(await c.poll(timeout_ms=100))
    return got


@pytest.mark.slow
async def test_cpp_producer_to_trimq_consumer(cluster: Cluster, cpp: CppClient) -> None:
    topic = "CompatCppProduce"
    await create_topic(cluster.addr, topic, queues=4)
    props = {"color": "red", "n": "42", "text": "ünïcødé"}
    sends = [
        _send("sync", topic, BINARY, tags="TagA", keys="k-sync", properties=props),
        _send("sync", topic, LARGE_NO_NUL, tags="TagB", keys="k-large", properties=props),
        _send("sync", topic, WITH_NUL, tags="TagA", keys="k-nul"),
        _send("async", topic, b"async body", tags="TagA", keys="k-async", properties=props),
        _send("oneway", topic, b"oneway body", tags="TagB", keys="k-oneway"),
        _send("orderly", topic, b"orderly 3", tags="TagO", keys="k-ord3", arg=3),
        _send("orderly", topic, b"orderly 6", tags="TagO", keys="k-ord6", arg=6),
        _send("oneway_orderly", topic, b"oneway orderly 1", tags="TagO", keys="k-oword1", arg=1),
        _send("sync", topic, b"delayed", tags="TagD", keys="k-delay", delay_level=1),
    ]
    out = await cpp.run(
        "produce",
        {"namesrv": cluster.addr, "group": "CompatCppPG1", "sends": sends},
        time_limit=CPP_TIMEOUT,
    )
    results = {str(s["keys"]): r for s, r in zip(sends, out["results"], strict=True)}
    for key, r in results.items():
        if r["msg_id"] is not None:
            assert r["status"] == 0, (key, r)  # SEND_OK
            assert len(r["msg_id"]) == 32, (key, r)

    got = await _poll_all(cluster, "CompatTrimqCG1", topic, len(sends))
    by_key = {str(m.keys): m for m in got}
    assert sorted(by_key) == sorted(results), [m.keys for m in got]
    assert len(got) == len(sends)  # no duplicates
    for send in sends:
        key = str(send["keys"])
        m = by_key[key]
        assert m.body == bytes.fromhex(str(send["body_hex"])), key
        assert m.tags == send["tags"], key
        assert m.user_properties() == send.get("properties", {}), key
        msg_id = results[key]["msg_id"]
        if msg_id is not None:
            assert m.msg_id == msg_id, key  # the C++ client's UNIQ_KEY
    # The C++ producer compressed the large body (sysFlag bit 0), trimq's consumer inflated it.
    large = by_key["k-large"]
    assert large.sys_flag & COMPRESSED_FLAG
    assert large.store_size < len(LARGE_NO_NUL)
    assert not by_key["k-sync"].sys_flag & COMPRESSED_FLAG
    # The binding's hashing selector: queue = arg % 4.
    assert by_key["k-ord3"].queue_id == 3
    assert by_key["k-ord6"].queue_id == 2
    assert by_key["k-oword1"].queue_id == 1
    # Delay level 1 is 1 s: stored in the topic a second after it was born, not before.
    delayed = by_key["k-delay"]
    waited = delayed.store_timestamp - delayed.born_timestamp
    assert 950 <= waited < 4000, waited
    assert delayed.reconsume_times == 0


@pytest.mark.slow
async def test_cpp_push_consumer_tag_expression_and_retry(cluster: Cluster, cpp: CppClient) -> None:
    topic = "CompatCppPush"
    group = "CompatCppCG2"
    await create_topic(cluster.addr, topic, queues=4)
    # The group's retry topic exists before the consumer starts, as once a group has run: the
    # C++ client looks its route up at start and rebalances only every 10 s after that, so
    # a retry topic created by this run's first RECONSUME_LATER is pulled 10 s later (on
    # Apache's broker too, which also creates it at the group's first heartbeat).
    await create_topic(cluster.addr, f"%RETRY%{group}", queues=1)
    cfg = fast_config(cluster.addr)
    trimq_sent: dict[str, Message] = {
        "t-binary": Message(topic, BINARY, tags="TagA", keys="t-binary", properties={"p": "1"}),
        "t-large": Message(topic, LARGE, tags="TagB", keys="t-large", properties={"p": "2"}),
        "t-nul": Message(topic, WITH_NUL, tags="TagA", keys="t-nul"),
        "t-retry": Message(
            topic, b"retry me", tags="TagA", keys="t-retry", properties={"retry": "once"}
        ),
        "t-tagc": Message(topic, b"not for TagA || TagB", tags="TagC", keys="t-tagc"),
    }
    ids: dict[str, str] = {}
    async with Producer("CompatTrimqPG2", cfg) as p:
        for key, msg in trimq_sent.items():
            r = await p.send(msg)
            assert r.status is SendStatus.SEND_OK
            ids[key] = r.msg_id
    cpp_sends = [
        _send("sync", topic, BINARY[::-1], tags="TagB", keys="c-binary", properties={"p": "3"}),
        _send("sync", topic, b"cpp TagC", tags="TagC", keys="c-tagc"),
    ]
    out = await cpp.run(
        "produce",
        {"namesrv": cluster.addr, "group": "CompatCppPG2", "sends": cpp_sends},
        time_limit=CPP_TIMEOUT,
    )
    ids["c-binary"] = out["results"][0]["msg_id"]
    expected = {
        "t-binary": (BINARY, "TagA", "1"),
        "t-large": (LARGE, "TagB", "2"),
        "t-nul": (WITH_NUL, "TagA", ""),
        "t-retry": (b"retry me", "TagA", ""),
        "c-binary": (BINARY[::-1], "TagB", "3"),
    }
    out = await cpp.run(
        "push",
        {
            "namesrv": cluster.addr,
            "group": group,
            "topic": topic,
            "expression": "TagA || TagB",
            "expect": len(expected) + 1,  # and the retry
            "timeout_s": 20,
            "settle_s": 1.0,
            "read_properties": ["p", "retry", "UNIQ_KEY"],
            "reconsume_later_once_if": "retry",
            "body_lengths": {k: len(v[0]) for k, v in expected.items()},
        },
        time_limit=CPP_TIMEOUT,
    )
    assert not out["timed_out"], out["deliveries"]
    deliveries = out["deliveries"]
    assert all("error" not in d for d in deliveries), deliveries
    keys = sorted(d["keys"] for d in deliveries)
    assert keys == sorted([*expected, "t-retry"]), keys  # no TagC, no other duplicate
    for d in deliveries:
        body, tags, prop = expected[d["keys"]]
        assert d["topic"] == topic
        assert d["tags"] == tags
        assert d["properties"]["p"] == prop
        assert d["msg_id"] == ids[d["keys"]]
        assert d["properties"]["UNIQ_KEY"] == ids[d["keys"]]
        # The binding's body is a C string (up to the first NUL); the library holds it all.
        assert bytes.fromhex(d["body_hex"]) == body.split(b"\0")[0], d["keys"]
        assert bytes.fromhex(d["full_body_hex"]) == body, d["keys"]
    retries = [d for d in deliveries if d["keys"] == "t-retry"]
    assert [(d["reconsume_times"], d["answered"]) for d in retries] == [
        (0, "RECONSUME_LATER"),
        (1, "CONSUME_SUCCESS"),
    ]
    assert retries[1]["properties"]["retry"] == "once"
    # The first retry's delay is level 3, shortened to 1 s for this suite.
    assert retries[1]["received_ms"] - retries[0]["received_ms"] >= 900
    # The C++ consumer committed its offsets (UPDATE_CONSUMER_OFFSET) when it shut down.
    async with Admin(cfg) as admin:
        progress = await admin.consumer_progress(group, topic)
    assert sum(q.broker_offset for q in progress) == len(trimq_sent) + len(cpp_sends)
    for q in progress:
        consumed = [
            d["queue_offset"]
            for d in deliveries
            if d["queue_id"] == q.mq.queue_id and d["reconsume_times"] == 0
        ]
        # Past every message it consumed; a filtered-out TagC at a queue's end is committed
        # by the C++ client only after a later pull (NO_NEW_MSG), as with Apache's broker.
        assert max(consumed, default=-1) < q.consumer_offset <= q.broker_offset, (q, consumed)


async def test_cpp_pull_consumer(cluster: Cluster, cpp: CppClient) -> None:
    topic = "CompatCppPull"
    await create_topic(cluster.addr, topic, queues=2)
    cfg = fast_config(cluster.addr)
    bodies = {f"pull-{i}": bytes([i]) + BINARY[i:] for i in range(1, 11)}
    async with Producer("CompatTrimqPG3", cfg) as p:
        for key, body in bodies.items():
            await p.send(Message(topic, body, tags="TagP", keys=key, properties={"i": key}))
        await p.send(
            Message(topic, LARGE, tags="TagP", keys="pull-large", properties={"i": "large"})
        )
    out = await cpp.run(
        "pull",
        {
            "namesrv": cluster.addr,
            "group": "CompatCppCG3",
            "topic": topic,
            "expect": len(bodies) + 1,
            "timeout_s": 15,
            "read_properties": ["i"],
            "body_lengths": {"pull-large": len(LARGE)},
        },
        time_limit=CPP_TIMEOUT,
    )
    assert not out["timed_out"], out
    got = out["deliveries"]
    assert sorted(d["keys"] for d in got) == sorted([*bodies, "pull-large"])
    for d in got:
        assert d["topic"] == topic
        assert d["tags"] == "TagP"
        if d["keys"] == "pull-large":
            assert bytes.fromhex(d["full_body_hex"]) == LARGE  # trimq compressed, C++ inflated
            assert d["properties"]["i"] == "large"
        else:
            assert bytes.fromhex(d["body_hex"]) == bodies[d["keys"]]
            assert d["properties"]["i"] == d["keys"]
    for q in {d["queue_id"] for d in got}:
        offsets = [d["queue_offset"] for d in got if d["queue_id"] == q]
        assert offsets == list(range(len(offsets))), (q, offsets)


async def test_cpp_orderly_push_consumer(cluster: Cluster, cpp: CppClient) -> None:
    topic = "CompatCppOrderly"
    await create_topic(cluster.addr, topic, queues=4)
    sends = [
        _send("orderly", topic, f"{arg}:{seq}".encode(), tags="TagO", keys=f"o{arg}-{seq}", arg=arg)
        for seq in range(8)
        for arg in (0, 1, 2)
    ]
    await cpp.run(
        "produce",
        {"namesrv": cluster.addr, "group": "CompatCppPG4", "sends": sends},
        time_limit=CPP_TIMEOUT,
    )
    out = await cpp.run(
        "push",
        {
            "namesrv": cluster.addr,
            "group": "CompatCppCG4",
            "topic": topic,
            "expression": "*",
            "orderly": True,
            "expect": len(sends),
            "timeout_s": 20,
            "settle_s": 0.3,
        },
        time_limit=CPP_TIMEOUT,
    )
    assert not out["timed_out"], out["deliveries"]
    deliveries = out["deliveries"]
    assert len(deliveries) == len(sends)
    for arg in (0, 1, 2):
        mine = [d for d in deliveries if d["keys"].startswith(f"o{arg}-")]
        assert {d["queue_id"] for d in mine} == {arg}
        assert [bytes.fromhex(d["body_hex"]) for d in mine] == [
            f"{arg}:{seq}".encode() for seq in range(8)
        ]


async def test_send_batch_is_stored_as_one_message_as_apache_does(
    cluster: Cluster, cpp: CppClient
) -> None:
    """librocketmq 1.0.1 sends a batch as SEND_MESSAGE (10) with `"batch":"1"` in extFields.

    Apache's broker reads the header's Boolean with `Boolean.parseBoolean("1")`, which is
    false, and stores the whole batch encoding as one message (rocketmq-client-cpp issue #363;
    the client writes "true"/"false" since PR #334, in 2.x). trimq does the same; the stored
    body is the batch's encoding, which holds both messages.
    """
    topic = "CompatCppBatch"
    await create_topic(cluster.addr, topic, queues=1)
    items = [
        {"topic": topic, "tags": "TagB", "keys": f"b{i}", "body_hex": f"batch {i}".encode().hex()}
        for i in range(2)
    ]
    out = await cpp.run(
        "produce",
        {
            "namesrv": cluster.addr,
            "group": "CompatCppPG5",
            "sends": [{"mode": "batch", "items": items}],
        },
        time_limit=CPP_TIMEOUT,
    )
    assert out["results"][0]["status"] == 0
    got = await _poll_all(cluster, "CompatTrimqCG5", topic, 1)
    assert len(got) == 1
    inner = decode_batch_body(got[0].body)
    assert [i.body for i in inner] == [b"batch 0", b"batch 1"]
    assert ["KEYS\x01b0" in i.properties for i in inner] == [True, False]


async def test_binding_has_no_transaction_producer(cluster: Cluster, cpp: CppClient) -> None:
    out = await cpp.run("probe", {}, time_limit=CPP_TIMEOUT)
    assert "TransactionMQProducer" not in out["binding_classes"], out
    assert out["transaction_producer"] is False, out
    assert out["c_api_transaction"] is False, out


@pytest.mark.slow
async def test_cpp_push_consumers_clustering_and_broadcasting(
    cluster: Cluster, cpp: CppClient
) -> None:
    """Two C++ consumers of one clustering group split the queues; two of a broadcasting group
    both get everything.

    When the second clustering member joins, the broker tells the first
    (NOTIFY_CONSUMER_IDS_CHANGED, sent to the C++ client in its JSON header type) and it gives
    up half of its queues at once: without the notice it would keep them until its 10 s
    rebalance timer and messages would arrive twice.
    """
    topic = "CompatCppShared"
    clustering, broadcasting = "CompatCppCG6", "CompatCppCG7"
    await create_topic(cluster.addr, topic, queues=4)
    await create_topic(cluster.addr, f"%RETRY%{clustering}", queues=1)
    cfg = fast_config(cluster.addr)
    keys = [f"s{i}" for i in range(40)]
    results: dict[tuple[str, int], list[str]] = {}

    async def consumer(group: str, n: int, delay: float, seconds: float) -> None:
        await trio.sleep(delay)
        spec = {
            "namesrv": cluster.addr,
            "group": group,
            "topic": topic,
            "expression": "*",
            "broadcasting": group == broadcasting,
            "expect": 10**9,  # receive for timeout_s
            "timeout_s": seconds,
        }
        out = await cpp.run("push", spec, time_limit=CPP_TIMEOUT)
        results[(group, n)] = sorted(d["keys"] for d in out["deliveries"])

    async with trio.open_nursery() as nursery:
        for group in (clustering, broadcasting):
            nursery.start_soon(consumer, group, 0, 0.0, 5.0)
            nursery.start_soon(consumer, group, 1, 1.0, 4.0)
        await trio.sleep(3.0)  # all joined and rebalanced
        async with Producer("CompatTrimqPG6", cfg) as p:
            for key in keys:
                await p.send(Message(topic, key.encode(), tags="TagS", keys=key))
    shared = [results[(clustering, 0)], results[(clustering, 1)]]
    assert all(shared), shared  # each clustering member got a share
    assert sorted(shared[0] + shared[1]) == sorted(keys)  # each message once
    assert results[(broadcasting, 0)] == sorted(keys)
    assert results[(broadcasting, 1)] == sorted(keys)


@pytest.mark.slow
async def test_mqadmin_consumer_status_and_direct_consume_of_a_cpp_consumer(
    cluster: Cluster, cpp: CppClient
) -> None:
    """`mqadmin consumerStatus` reads a C++ push consumer's running info (307, its own JSON,
    forwarded by the broker); `queryMsgByUniqueKey -g -d` to it (309, which librocketmq
    1.0.1 leaves unanswered) ends in the broker's CONSUME_MSG_TIMEOUT (207), and the broker
    keeps serving meanwhile."""
    from tests.integration.test_mqadmin_messages import _mqadmin_async

    topic, group = "CompatCppStatus", "CompatCppCG8"
    await create_topic(cluster.addr, topic, queues=2)
    ns = cluster.addr
    spec = {"namesrv": ns, "group": group, "topic": topic, "expression": "*",
            "expect": 10**9, "timeout_s": 25.0}  # fmt: skip
    out: dict[str, object] = {}

    async def consume() -> None:
        out.update(await cpp.run("push", spec, time_limit=CPP_TIMEOUT))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        async with Producer("CompatTrimqPG8", fast_config(ns)) as p:
            await trio.sleep(3.0)  # joined and rebalanced
            sent = await p.send(Message(topic, b"status", tags="TagS", keys="k-status"))

            async def one_client() -> bool:
                rc, text, _ = await _mqadmin_async("consumerStatus", "-n", ns, "-g", group,
                                                   "--json")  # fmt: skip
                return rc == 0 and len(json.loads(text)["clients"]) == 1

            await wait_until(one_client, total=10, interval=0.5, what="the C++ client online")
            rc, text, err = await _mqadmin_async("consumerStatus", "-n", ns, "-g", group, "--json")
            ((client_id, info),) = json.loads(text)["clients"].items()
            assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
            assert topic in {s["topic"] for s in info["subscriptionSet"]}
            rc, text, err = await _mqadmin_async(
                "consumerStatus", "-n", ns, "-g", group, "-i", client_id
            )
            assert rc == 0, err
            assert "#Consumer Subscription#" in text
            # Its queue keys (pretty-printed MessageQueue JSON) are read, not echoed.
            detail = text.split("#Consumer MQ Detail#", 1)[1]
            assert [line.split()[:3] for line in detail.splitlines() if line.startswith(topic)] == [
                [topic, "broker-a", "0"],
                [topic, "broker-a", "1"],
            ]
            rc, text, err = await _mqadmin_async("consumerStatus", "-n", ns, "-g", group)
            assert rc == 0, err
            assert "Same subscription in the same group of consumer" in text
            assert "Rebalance OK" in text

            direct = ("queryMsgByUniqueKey", "-n", ns, "-t", topic, "-i", sent.msg_id)
            rc, _, err = await _mqadmin_async(*direct, "-g", group, "-d", client_id)
            assert rc == 1
            assert f"CODE 207: consumer <{client_id}> of group {group} did not answer" in err
            assert (
                await p.send(Message(topic, b"after", keys="k-after"))
            ).status is SendStatus.SEND_OK
    deliveries = out["deliveries"]
    assert isinstance(deliveries, list)
    assert sorted(d["keys"] for d in deliveries) == ["k-after", "k-status"]

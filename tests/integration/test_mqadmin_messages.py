"""mqadmin's message, send round-trip, client and statistics commands against a live NameServer
and broker (real processes), with their bad-input answers."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
import trio

from client import ConsumeFromWhere, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from tests.helpers import wait_until, wait_until_sync
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BrokerProc, NamesrvProc
from tests.integration.test_mqadmin import MQADMIN, mqadmin
from tests.integration.test_mqadmin_more import _fails, _make_topic, _wait_registered

StartBroker = Callable[..., BrokerProc]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_messages_by_position(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    _wait_registered(ns)
    _make_topic(ns, "MsgT", 2)
    sent = []
    for i, tag in enumerate(("TagA", "TagB", "TagA", "TagC")):
        res = mqadmin("sendMessage", "-n", ns, "-t", "MsgT", "-p", f"m{i}", "-c", tag,
                      "-k", f"K{i}", "-b", "broker-a", "-i", "0", "--json")  # fmt: skip
        sent.append(json.loads(res.stdout))
    assert [s["queue_offset"] for s in sent] == [0, 1, 2, 3]

    # queryMsgByOffset
    got = json.loads(mqadmin("queryMsgByOffset", "-n", ns, "-t", "MsgT", "-b", "broker-a",
                             "-i", "0", "-o", "1", "--json").stdout)  # fmt: skip
    assert [(m["body"], m["tags"], m["queue_offset"]) for m in got] == [("m1", "TagB", 1)]
    out = mqadmin("query-msg-by-offset", "-n", ns, "-t", "MsgT", "-b", "broker-a", "-i", "0",
                  "-o", "3").stdout  # fmt: skip
    assert "m3" in out
    assert "Queue Offset:" in out
    err = _fails("queryMsgByOffset", "-n", ns, "-t", "MsgT", "-b", "broker-a", "-i", "0",
                 "-o", "99")  # fmt: skip
    assert "no message at offset 99" in err
    assert "offsets 0..3" in err
    assert "empty" in _fails("queryMsgByOffset", "-n", ns, "-t", "MsgT", "-b", "broker-a",
                             "-i", "1", "-o", "0")  # fmt: skip
    assert "must not be negative" in _fails("queryMsgByOffset", "-n", ns, "-t", "MsgT", "-b",
                                            "broker-a", "-i", "0", "-o", "-1")  # fmt: skip
    assert "has no queue 7 on broker broker-a" in _fails(
        "queryMsgByOffset", "-n", ns, "-t", "MsgT", "-b", "broker-a", "-i", "7", "-o", "0"
    )
    assert "has no queue 0 on broker broker-zz" in _fails(
        "queryMsgByOffset", "-n", ns, "-t", "MsgT", "-b", "broker-zz", "-i", "0", "-o", "0"
    )
    assert "No route info" in _fails(
        "queryMsgByOffset", "-n", ns, "-t", "NoT", "-b", "broker-a", "-i", "0", "-o", "0"
    )

    # queryMsgByUniqueKey (the index is written shortly after the store).
    uniq = sent[2]["msg_id"]

    def indexed() -> bool:
        res = mqadmin("queryMsgByUniqueKey", "-n", ns, "-i", uniq, "-t", "MsgT", "--json",
                      check=False)  # fmt: skip
        return res.returncode == 0

    wait_until_sync(indexed, total=20, what="unique key index")
    got = json.loads(mqadmin("queryMsgByUniqueKey", "-n", ns, "-i", uniq, "-t", "MsgT", "-a",
                             "--json").stdout)  # fmt: skip
    assert [(m["msg_id"], m["body"]) for m in got] == [(uniq, "m2")]
    assert "m2" in mqadmin("query-msg-by-unique-key", "-n", ns, "-i", uniq, "-t", "MsgT").stdout
    assert "no message with unique id 00FF" in _fails(
        "queryMsgByUniqueKey", "-n", ns, "-i", "00FF", "-t", "MsgT"
    )
    assert "The Consumer <c> Not Online" in _fails(
        "queryMsgByUniqueKey", "-n", ns, "-i", uniq, "-t", "MsgT", "-g", "G", "-d", "c"
    )

    # printMsg: every queue, then a tag filter, no bodies, a time range in the future.
    out = mqadmin("printMsg", "-n", ns, "-t", "MsgT").stdout
    assert (
        "minOffset=0, maxOffset=4, MessageQueue [topic=MsgT, brokerName=broker-a, queueId=0]" in out
    )
    assert (
        "minOffset=0, maxOffset=0, MessageQueue [topic=MsgT, brokerName=broker-a, queueId=1]" in out
    )
    lines = [line for line in out.splitlines() if line.startswith("MSGID:")]
    assert [line.rsplit("BODY: ", 1)[1] for line in lines] == ["m0", "m1", "m2", "m3"]
    out = mqadmin("print-msg", "-n", ns, "-t", "MsgT", "-s", "TagA || TagC", "-d", "false").stdout
    lines = [line for line in out.splitlines() if line.startswith("MSGID:")]
    assert len(lines) == 3
    assert all(line.endswith("BODY: NOT PRINT BODY") for line in lines)
    queues = json.loads(mqadmin("printMsg", "-n", ns, "-t", "MsgT", "-b", "4102444800000",
                                "--json").stdout)  # fmt: skip
    assert [len(q["messages"]) for q in queues] == [0, 0]
    assert "unknown charset" in _fails("printMsg", "-n", ns, "-t", "MsgT", "-c", "NoSuchCharset")
    assert "cannot read time" in _fails("printMsg", "-n", ns, "-t", "MsgT", "-b", "yesterday")
    assert "before the begin" in _fails(
        "printMsg", "-n", ns, "-t", "MsgT", "-b", "2000", "-e", "1000"
    )

    # printMsgByQueue: count by tag, print with bodies.
    out = mqadmin("printMsgByQueue", "-n", ns, "-t", "MsgT", "-a", "broker-a", "-i", "0",
                  "-f", "true").stdout  # fmt: skip
    assert f"Tag: {'TagA':<30} Count: 2" in out
    assert f"Tag: {'TagC':<30} Count: 1" in out
    assert "MSGID:" not in out
    doc = json.loads(mqadmin("print-msg-by-queue", "-n", ns, "-t", "MsgT", "-a", "broker-a",
                             "-i", "0", "-p", "true", "-d", "true", "-s", "TagB",
                             "--json").stdout)  # fmt: skip
    assert doc["count"] == 1
    assert doc["messages"][0]["body"] == "m1"
    assert "has no queue 9" in _fails("printMsgByQueue", "-n", ns, "-t", "MsgT", "-a",
                                      "broker-a", "-i", "9")  # fmt: skip


def test_send_round_trips(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    _wait_registered(ns)
    _make_topic(ns, "RtT", 2)
    out = mqadmin("checkMsgSendRT", "-n", ns, "-t", "RtT", "-a", "5", "-s", "64").stdout
    assert sum(" SEND_OK " in f" {line} " for line in out.splitlines()) == 5
    assert "Avg RT: " in out
    doc = json.loads(
        mqadmin("check-msg-send-rt", "-n", ns, "-t", "RtT", "-a", "4", "--json").stdout
    )
    assert [(r["queue_id"], r["status"]) for r in doc["sends"]] == [
        (0, "SEND_OK"), (1, "SEND_OK"), (0, "SEND_OK"), (1, "SEND_OK")
    ]  # fmt: skip
    status = json.loads(mqadmin("topicStatus", "-n", ns, "-t", "RtT", "--json").stdout)
    assert sum(r["max_offset"] for r in status) == 9
    assert "amount must be" in _fails("checkMsgSendRT", "-n", ns, "-t", "RtT", "-a", "0")
    assert "size must be" in _fails("checkMsgSendRT", "-n", ns, "-t", "RtT", "-s", "0")
    assert "No route info" in _fails("checkMsgSendRT", "-n", ns, "-t", "NoT", "-a", "1")

    # clusterRT: one round to the broker's own topic (its name).
    rows = json.loads(mqadmin("clusterRT", "-n", ns, "-a", "3", "--rounds", "1", "--json").stdout)
    assert [(r["cluster"], r["broker_name"], r["success"], r["failed"]) for r in rows] == [
        ("DefaultCluster", "broker-a", 3, 0)
    ]
    out = mqadmin("cluster-rt", "-n", ns, "-a", "1", "--rounds", "2", "-i", "0",
                  "-c", "DefaultCluster").stdout  # fmt: skip
    assert out.count("#Cluster Name") == 2
    assert "not found" in _fails("clusterRT", "-n", ns, "-c", "NoCluster", "--rounds", "1")


async def _mqadmin_async(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    with trio.fail_after(60):
        proc = await trio.run_process(
            [MQADMIN, *args], capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_clients_and_stats(namesrv: NamesrvProc, start_broker: StartBroker) -> None:
    broker = start_broker(namesrv.addr, name="broker-a")
    ns = namesrv.addr
    await create_topic(ns, "CliT", queues=4)
    await create_topic(ns, "IdleT", queues=1)
    cfg = fast_config(ns)
    seen: list[str] = []
    # How the listener answers (changed only for the direct consumes below).
    mode = ["ok"]

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.msg_id for m in msgs)
        if mode[0] == "raise":
            raise RuntimeError("listener says no")
        if mode[0] == "later":
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        "CliG",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe("CliT", "TagA || TagB")
    async with Producer("CliP", cfg) as producer, consumer:
        for i in range(10):
            await producer.send(Message("CliT", f"c{i}", tags="TagA"))
        await wait_until(lambda: len(set(seen)) >= 10, total=30, what="all consumed")

        # producerConnection: the producer's heartbeat registered it.
        async def producer_online() -> bool:
            rc, _, _ = await _mqadmin_async(
                "producerConnection", "-n", ns, "-g", "CliP", "-t", "CliT"
            )
            return rc == 0

        await wait_until(producer_online, total=20, interval=0.5, what="producer registered")
        rc, out, _ = await _mqadmin_async(
            "producerConnection", "-n", ns, "-g", "CliP", "-t", "CliT"
        )
        assert out.startswith("0001  ")
        assert "PYTHON" in out
        rc, out, _ = await _mqadmin_async(
            "producer-connection", "-n", ns, "-g", "CliP", "-t", "CliT", "--json"
        )
        conns = json.loads(out)["connectionSet"]
        assert len(conns) == 1
        rc, _, err = await _mqadmin_async("producerConnection", "-n", ns, "-g", "NoP", "-t", "CliT")
        assert rc == 1
        assert "the producer group NoP is not online" in err

        # consumerStatus: every client, then one client's running info (307 through the broker).
        # One more message just before: the statusTable's minute certainly holds a consume.
        last = await producer.send(Message("CliT", "c10", tags="TagA"))
        await wait_until(lambda: len(set(seen)) >= 11, total=30, what="c10 consumed")
        rc, out, err = await _mqadmin_async("consumerStatus", "-n", ns, "-g", "CliG")
        assert rc == 0, err
        assert "Same subscription in the same group of consumer" in out
        assert "Rebalance OK" in out
        rc, out, err = await _mqadmin_async("consumer-status", "-n", ns, "-g", "CliG", "--json")
        assert rc == 0, err
        doc = json.loads(out)
        ((client_id, info),) = doc["clients"].items()
        assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert int(info["properties"]["PROP_CONSUMER_START_TIMESTAMP"]) > 0
        subs = {s["topic"]: s["subString"] for s in info["subscriptionSet"]}
        assert subs["CliT"] == "TagA || TagB"
        cli_queues = [json.loads(k) for k in info["mqTable"] if json.loads(k)["topic"] == "CliT"]
        assert sorted(q["queueId"] for q in cli_queues) == [0, 1, 2, 3]
        # Messages were pulled and consumed within the last minute, none failed.
        status = info["statusTable"]
        assert set(status) == {"CliT", "%RETRY%CliG"}
        cli = status["CliT"]
        assert cli["pullTPS"] > 0
        assert cli["consumeOKTPS"] > 0
        assert cli["pullRT"] >= 0
        assert cli["consumeRT"] >= 0
        assert cli["consumeFailedTPS"] == 0
        assert cli["consumeFailedMsgs"] == 0
        assert status["%RETRY%CliG"]["consumeOKTPS"] == 0
        rc, out, err = await _mqadmin_async(
            "consumerStatus", "-n", ns, "-g", "CliG", "-i", client_id
        )
        assert rc == 0, err
        for section in ("#Consumer Properties#", "#Consumer Subscription#", "#Consumer Offset#",
                        "#Consumer MQ Detail#", "#Consumer RT&TPS#"):  # fmt: skip
            assert section in out
        rt_tps = out.split("#Consumer RT&TPS#\n", 1)[1].splitlines()
        assert rt_tps[0].split()[:3] == ["#Topic", "#Pull", "RT"]
        row = next(line.split() for line in rt_tps if line.startswith("CliT "))
        assert len(row) == 7
        assert float(row[4]) > 0  # consumeOK TPS
        assert row[6] == "0"  # failed in the hour
        assert "TagA || TagB" in out

        # queryMsgByUniqueKey -g -d: the client's listener consumes the message once more
        # (CONSUME_MESSAGE_DIRECTLY through the broker), whatever its offset.
        direct = ("queryMsgByUniqueKey", "-n", ns, "-t", "CliT", "-i", last.msg_id, "-g", "CliG")
        rc, out, err = await _mqadmin_async(*direct, "-d", client_id)
        assert rc == 0, err
        assert out.startswith(
            "ConsumeMessageDirectlyResult [order=false, autoCommit=true, consumeResult=CR_SUCCESS,"
            " remark=null, spentTimeMills="
        )
        assert seen.count(last.msg_id) == 2
        mode[0] = "later"
        rc, out, err = await _mqadmin_async(*direct, "-d", client_id, "--json")
        assert rc == 0, err
        assert json.loads(out)["consumeResult"] == "CR_LATER"
        mode[0] = "raise"
        rc, out, err = await _mqadmin_async(*direct, "-d", client_id, "--json")
        assert rc == 0, err
        doc = json.loads(out)
        assert doc["consumeResult"] == "CR_THROW_EXCEPTION"
        assert "listener says no" in doc["remark"]
        mode[0] = "ok"
        assert seen.count(last.msg_id) == 4
        rc, _, err = await _mqadmin_async(*direct, "-d", "nobody")
        assert rc == 1
        assert "The Consumer <nobody> Not Online" in err
        rc, _, err = await _mqadmin_async(*direct)
        assert rc != 0
        assert "-g and -d go together" in err
        rc, _, err = await _mqadmin_async(
            "queryMsgByUniqueKey", "-n", ns, "-t", "CliT", "-i", "NOSUCHID", "-g", "CliG",
            "-d", client_id,
        )  # fmt: skip
        assert rc == 1
        assert "no message with unique id NOSUCHID" in err

        rc, _, err = await _mqadmin_async("consumerStatus", "-n", ns, "-g", "CliG", "-i", "nobody")
        assert rc == 1
        assert "client nobody is not online in group CliG" in err
        rc, _, err = await _mqadmin_async("consumerStatus", "-n", ns, "-g", "NoG")
        assert rc == 1
        assert "the consumer group NoG is not online" in err

        # statsAll: once the consumer's offsets reached the broker nothing is left to consume.
        async def caught_up() -> bool:
            rc, out, _ = await _mqadmin_async("statsAll", "-n", ns, "-t", "CliT", "--json")
            rows = json.loads(out) if rc == 0 else []
            return [(r["group"], r["accumulation"], r["inMsg24Hour"]) for r in rows] == [
                ("CliG", 0, 11)
            ]

        await wait_until(caught_up, total=30, interval=0.5, what="statsAll caught up")
        rc, out, _ = await _mqadmin_async("statsAll", "-n", ns)
        assert rc == 0
        assert "#Accumulation" in out
        rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line.strip()}
        assert rows["CliT"][0] == "CliG"
        assert rows["CliT"][-2] == "11"  # #InMsg24Hour
        assert rows["IdleT"][-1] == "NO_CONSUMER"
        assert not any(t.startswith("%RETRY%") for t in rows)
        rc, out, _ = await _mqadmin_async("stats-all", "-n", ns, "-a", "--json")
        assert "IdleT" not in {r["topic"] for r in json.loads(out)}
        rc, _, err = await _mqadmin_async("statsAll", "-n", ns, "-t", "NoSuchTopic")
        assert rc == 1
        assert "No route info" in err

        # brokerConsumeStats: caught up, every queue of CliG has diff 0.
        rc, out, err = await _mqadmin_async("brokerConsumeStats", "-n", ns, "-b", broker.addr,
                                            "--json")  # fmt: skip
        assert rc == 0, err
        doc = json.loads(out)
        assert doc["total_diff"] == 0
        cli = [q for q in doc["queues"] if (q["group"], q["topic"]) == ("CliG", "CliT")]
        assert sorted(q["queue_id"] for q in cli) == [0, 1, 2, 3]
        assert sum(q["consumer_offset"] for q in cli) == 11
        assert all(q["diff"] == 0 for q in cli)
        assert any(q["last_timestamp"] > 0 for q in cli)

    # With the consumer gone, three more messages are a backlog of three.
    async with Producer("CliP", cfg) as producer:
        for i in range(3):
            await producer.send(Message("CliT", f"late{i}", tags="TagA"))
    rc, out, err = await _mqadmin_async("brokerConsumeStats", "-n", ns, "-b", broker.addr,
                                        "-l", "1")  # fmt: skip
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["#Topic", "#Group", "#Broker"]
    lagging = [line.split() for line in lines[1:] if line.startswith("CliT ")]
    assert sum(int(row[6]) for row in lagging) == 3  # only queues with a backlog of 1 or more
    assert all(row[1] == "CliG" and int(row[6]) >= 1 for row in lagging)
    assert lines[-1] == "Diff Total: 3"
    rc, out, _ = await _mqadmin_async("brokerConsumeStats", "-n", ns, "-b", broker.addr,
                                      "-o", "true", "--json")  # fmt: skip
    assert rc == 0
    assert json.loads(out)["queues"] == []  # no orderly topic here
    rc, _, err = await _mqadmin_async("brokerConsumeStats", "-n", ns, "-b", "127.0.0.1:1")
    assert rc == 1
    rc, _, err = await _mqadmin_async("brokerConsumeStats", "-n", ns, "-b", broker.addr,
                                      "-l", "x")  # fmt: skip
    assert rc == 2
    assert "'x' is not a valid integer" in err

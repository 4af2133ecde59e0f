"""common.message_queue: one MessageQueue for the client and the JSON bodies."""

from __future__ import annotations

import pytest

import client
import client.message
from common.message_queue import MessageQueue
from remoting.protocol import bodies

pytestmark = pytest.mark.unit


def test_one_type_everywhere() -> None:
    assert client.message.MessageQueue is MessageQueue
    assert client.MessageQueue is MessageQueue
    assert bodies.MessageQueue is MessageQueue
    assert "MessageQueue" in bodies.__all__


def test_a_tuple_key() -> None:
    mq = MessageQueue("T", "broker-a", 3)
    assert isinstance(mq, tuple)
    assert hash(mq) == hash(("T", "broker-a", 3))
    assert mq == MessageQueue(topic="T", broker_name="broker-a", queue_id=3)
    assert {mq: 1}[MessageQueue("T", "broker-a", 3)] == 1
    assert sorted(
        [MessageQueue("T", "b", 1), MessageQueue("S", "c", 0), MessageQueue("T", "a", 9)]
    ) == [
        MessageQueue("S", "c", 0),
        MessageQueue("T", "a", 9),
        MessageQueue("T", "b", 1),
    ]
    assert str(mq) == "T@broker-a:3"
    assert repr(mq) == "MessageQueue(topic='T', broker_name='broker-a', queue_id=3)"


def test_written_as_an_object_never_as_an_array() -> None:
    mq = MessageQueue("T", "b", 0)
    obj = b'{"brokerName":"b","queueId":0,"topic":"T"}'
    assert bodies.dumps(mq) == obj
    assert bodies.dumps([mq]) == b"[" + obj + b"]"
    assert bodies.dumps({mq: 1}) == b"{" + obj + b":1}"
    assert bodies.dumps({"k": (1, 2)}) == b'{"k":[1,2]}'  # other tuples stay arrays


def test_bodies_decode_to_the_common_type() -> None:
    lock = bodies.LockBatchResponseBody.from_json(
        b'{"lockOKMQSet":[{"brokerName":"b","queueId":"2","topic":"T"}]}'
    )
    assert [type(m) for m in lock.lock_ok_mq_set] == [MessageQueue]
    assert lock.lock_ok_mq_set == [MessageQueue("T", "b", 2)]
    reset = bodies.ResetOffsetBody.from_json(
        b'{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:5}}'
    )
    assert [type(k) for k in reset.offset_table] == [MessageQueue]
    assert reset.offset_table == {MessageQueue("T", "b", 1): 5}


def test_a_client_queue_goes_on_the_wire_unchanged() -> None:
    mqs = [client.message.MessageQueue("T", "b", i) for i in (1, 0)]
    req = bodies.LockBatchRequestBody("G", "cid", mqs)
    assert req.to_json() == (
        b'{"clientId":"cid","consumerGroup":"G","mqSet":['
        b'{"brokerName":"b","queueId":0,"topic":"T"},'
        b'{"brokerName":"b","queueId":1,"topic":"T"}],"onlyThisBroker":false}'
    )
    assert bodies.LockBatchRequestBody.from_json(req.to_json()).mq_set == sorted(mqs)


@pytest.mark.parametrize(
    "body",
    [
        b'{"lockOKMQSet":[{"brokerName":"b","topic":"T"}]}',
        b'{"lockOKMQSet":[["T","b",0]]}',
        b'{"lockOKMQSet":[{"brokerName":"b","queueId":"x","topic":"T"}]}',
        b'{"offsetTable":{"0":5}}',
        b'{"offsetTable":{"[1]":5}}',
    ],
)
def test_bad_queues_are_a_value_error(body: bytes) -> None:
    cls = bodies.ResetOffsetBody if b"offsetTable" in body else bodies.LockBatchResponseBody
    with pytest.raises(ValueError):
        cls.from_json(body)

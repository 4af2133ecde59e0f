"""The producer's send fast path gives the same wire bytes and the same behaviour as the
generic header path: extFields built directly, fault bookkeeping short cuts, UNIQ_KEY
formatting, the send response parsed without the typed header."""

from __future__ import annotations

import dataclasses
import random

import pytest

from client._api import MQClientAPI, send_request, send_result
from client.config import ClientConfig
from client.fault import FaultStrategy
from client.message import Message, MessageQueue, SendResult, SendStatus, new_send_result
from client.producer import Producer
from client.route import TopicPublishInfo
from common.message import UniqKeyGenerator, decode_uniq_key
from remoting import RemotingCommand, encode_frame
from remoting.codes import RequestCode, ResponseCode, SerializeType
from remoting.errors import HeaderError, RemoteError
from remoting.protocol.headers import SendMessageRequestHeader, send_request_fields_v2

SERIALIZE_TYPES = (SerializeType.JSON, SerializeType.ROCKETMQ, SerializeType.MSGPACK)


def _header(batch: bool, properties: str = "TAGS\x01A\x02") -> SendMessageRequestHeader:
    return SendMessageRequestHeader(
        producer_group="pg",
        topic="T",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=3,
        sys_flag=8,
        born_timestamp=1_700_000_000_123,
        flag=7,
        properties=properties,
        reconsume_times=0,
        unit_mode=False,
        max_reconsume_times=None,
        batch=batch,
        broker_name="broker-a",
    )


@pytest.mark.parametrize("batch", [False, True])
def test_direct_fields_equal_the_header_encoding_key_order_included(batch: bool) -> None:
    fields = send_request_fields_v2(
        "pg", "T", "TBW102", "4", 3, 8, 1_700_000_000_123, 7, "TAGS\x01A\x02", "broker-a", batch
    )
    assert list(fields.items()) == list(_header(batch).to_fields_v2().items())


@pytest.mark.parametrize("serialize_type", SERIALIZE_TYPES)
@pytest.mark.parametrize("batch", [False, True])
def test_direct_fields_give_the_same_frame_bytes(serialize_type: int, batch: bool) -> None:
    props = "TAGS\x01A\x02UNIQ_KEY\x017F0000010000\x02KEYS\x01ключ\x02"
    direct = send_request_fields_v2(
        "pg", "T", "TBW102", "4", 3, 8, 1_700_000_000_123, 7, props, "broker-a", batch
    )
    generic = _header(batch, props).to_fields_v2()
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    frames = []
    for fields in (direct, generic):
        cmd = RemotingCommand.request(code, fields, b"body", serialize_type=serialize_type)
        cmd.opaque = 42
        frames.append(encode_frame(cmd))
    assert frames[0] == frames[1]
    # And the broker reads the same header back.
    decoded = SendMessageRequestHeader.from_fields_v2(direct)
    assert decoded == _header(batch, props)


def _producer() -> Producer:
    cfg = ClientConfig(namesrv_addr="ns:1", client_ip="127.0.0.1")
    return Producer("pg", cfg)


@pytest.mark.parametrize("batch", [False, True])
def test_producer_fields_match_its_header_for_plain_topics(batch: bool) -> None:
    p = _producer()
    mq = MessageQueue("T", "broker-a", 2)
    fields = p._fields("T", mq, 0, 5, "TAGS\x01A\x02", batch)
    expected = p._header("T", mq, 0, 5, "TAGS\x01A\x02", batch).to_fields_v2()
    fields.pop("g"), expected.pop("g")  # born timestamps taken a moment apart
    assert list(fields.items()) == list(expected.items())


def test_producer_fields_of_a_retry_topic_carry_the_reconsume_fields() -> None:
    p = _producer()
    mq = MessageQueue("%RETRY%cg", "broker-a", 0)
    props = "RECONSUME_TIME\x013\x02MAX_RECONSUME_TIMES\x0116\x02"
    fields = p._fields("%RETRY%cg", mq, 0, 0, props)
    assert fields["j"] == "3"
    assert fields["l"] == "16"


class _Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_success_fast_path_records_the_same_item_as_the_table_walk() -> None:
    clock = _Clock()
    fast = FaultStrategy(True, clock)
    for latency in (0.0, 12.5, 49.9, 99.0, 120.0, 549.0, 600.0, 5000.0):
        fast.update_fault_item("b", latency, isolation=False)
        item = fast.tolerance.snapshot()["b"]
        expected = fast.tolerance.not_available_duration(latency)
        assert item.current_latency == latency
        assert item.start_timestamp == clock.now + expected


def test_fast_path_threshold_follows_custom_tables() -> None:
    clock = _Clock()
    fs = FaultStrategy(
        True, clock, latency_max_ms=(10, 20, 30), not_available_duration_ms=(0, 500, 900)
    )
    fs.update_fault_item("b", 19.0, isolation=False)
    assert fs.is_available("b")
    fs.update_fault_item("b", 20.0, isolation=False)  # 20 ms is at the 500 ms step already
    assert not fs.is_available("b")
    assert fs.tolerance.snapshot()["b"].start_timestamp == clock.now + 500


def test_all_available_turns_false_while_a_broker_is_isolated() -> None:
    clock = _Clock()
    fs = FaultStrategy(True, clock)
    assert fs.tolerance.all_available()
    fs.update_fault_item("a", 3.0, isolation=False)
    assert fs.tolerance.all_available()
    fs.update_fault_item("b", 3.0, isolation=True)  # 30 s latency -> 600 s unavailable
    assert not fs.tolerance.all_available()
    clock.now += 600_000
    assert fs.tolerance.all_available()


def test_selection_still_skips_an_isolated_broker() -> None:
    clock = _Clock()
    fs = FaultStrategy(True, clock)
    queues = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]
    info = TopicPublishInfo("T", queues, rng=random.Random(1))
    assert {info.select_with_fault(fs).broker_name for _ in range(8)} == {"a", "b"}
    fs.update_fault_item("b", 5.0, isolation=True)
    assert {info.select_with_fault(fs).broker_name for _ in range(8)} == {"a"}
    clock.now += 600_000
    assert {info.select_with_fault(fs).broker_name for _ in range(8)} == {"a", "b"}


def test_selection_without_isolation_is_plain_round_robin() -> None:
    fs = FaultStrategy(True, _Clock())
    queues = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]
    one = TopicPublishInfo("T", queues, rng=random.Random(7))
    two = TopicPublishInfo("T", queues, rng=random.Random(7))
    assert [one.select_with_fault(fs) for _ in range(9)] == [two.select_one() for _ in range(9)]


def test_uniq_key_packs_time_and_counter_like_the_reference_layout() -> None:
    gen = UniqKeyGenerator("192.0.2.5", pid=0x1234, seed=0x89ABCDEF, clock=lambda: 1.0)
    key = gen.next()
    assert key.startswith("C00002051234" + "89ABCDEF")
    assert len(key) == 32
    ip, pid, t, counter = decode_uniq_key(key)
    assert (ip, pid) == ("192.0.2.5", 0x1234)
    nxt = decode_uniq_key(gen.next())
    assert nxt[2] == t
    assert nxt[3] == (counter + 1) & 0xFFFF
    assert key == f"{gen.prefix}{t:08X}{counter:04X}"


class _Transport:
    def __init__(self, response: RemotingCommand) -> None:
        self.response = response
        self.sent: list[RemotingCommand] = []

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> RemotingCommand:
        self.sent.append(cmd)
        return self.response

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.sent.append(cmd)


async def test_send_response_parsed_without_the_typed_header() -> None:
    resp = RemotingCommand(
        0, ext_fields={"msgId": "OFF", "queueId": "3", "queueOffset": "9", "transactionId": "tx"}
    )
    api = MQClientAPI(_Transport(resp), ["ns:1"])
    mq = MessageQueue("T", "broker-a", 3)
    r = await api.send_message_fields("b:1", mq, {"b": "T"}, b"x", msg_id="U", timeout_ms=10)
    assert (r.status, r.msg_id, r.offset_msg_id) == (SendStatus.SEND_OK, "U", "OFF")
    assert r.message_queue is mq
    assert (r.queue_offset, r.transaction_id) == (9, "tx")
    # The broker put it elsewhere (queue id differs): the result says where.
    resp.ext_fields = {"msgId": "OFF", "queueId": "1", "queueOffset": "9"}
    r = await api.send_message_fields("b:1", mq, {"b": "T"}, b"x", msg_id="U", timeout_ms=10)
    assert r.message_queue == MessageQueue("T", "broker-a", 1)
    assert r.transaction_id is None


@pytest.mark.parametrize(
    ("fields", "missing"),
    [
        (None, "msgId"),
        ({"queueId": "1", "queueOffset": "2"}, "msgId"),
        ({"msgId": "M", "queueOffset": "2"}, "queueId"),
        ({"msgId": "M", "queueId": "x", "queueOffset": "2"}, "queueId"),
    ],
)
async def test_bad_send_response_header_raises_header_error(
    fields: dict[str, str] | None, missing: str
) -> None:
    api = MQClientAPI(_Transport(RemotingCommand(0, ext_fields=fields)), ["ns:1"])
    with pytest.raises(HeaderError, match=missing):
        await api.send_message_fields(
            "b:1", MessageQueue("T", "b", 0), {}, b"x", msg_id="U", timeout_ms=10
        )


async def test_producer_send_puts_the_header_fields_on_the_wire() -> None:
    resp = RemotingCommand(0, ext_fields={"msgId": "OFF", "queueId": "0", "queueOffset": "1"})
    transport = _Transport(resp)

    class Instance:
        config = ClientConfig(namesrv_addr="ns:1", client_ip="127.0.0.1")
        api = MQClientAPI(transport, ["ns:1"])
        publish_info = {"T": TopicPublishInfo("T", [MessageQueue("T", "broker-a", 0)])}
        running = True

        async def get_publish_info(self, topic: str) -> TopicPublishInfo:
            return self.publish_info[topic]

        async def find_master_addr(self, broker_name: str, topic: str | None = None) -> str:
            return "192.0.2.1:10911"

    p = Producer("pg", Instance.config, instance=Instance())  # type: ignore[arg-type]
    result = await p.send(Message("T", b"hello", tags="A"))
    (cmd,) = transport.sent
    assert cmd.code == RequestCode.SEND_MESSAGE_V2
    assert cmd.body == b"hello"
    assert cmd.ext_fields is not None
    header = SendMessageRequestHeader.from_fields_v2(cmd.ext_fields)
    assert (header.producer_group, header.topic, header.queue_id) == ("pg", "T", 0)
    assert header.broker_name == "broker-a"
    assert header.properties is not None
    assert result.msg_id in header.properties
    await p.send_oneway(Message("T", b"one way"))
    assert transport.sent[1].is_oneway
    assert transport.sent[1].ext_fields is not None
    assert transport.sent[1].ext_fields["b"] == "T"


@pytest.mark.parametrize("batch", [False, True])
def test_cached_field_templates_give_the_reference_fields(batch: bool) -> None:
    """`_fields` copies a per-queue template: equal (key order too) to the direct build for
    every per-send value, queue and batch flag, and never leaks one send's values into the
    next."""
    p = _producer()
    props = ["TAGS\x01A\x02UNIQ_KEY\x01X", "", "KEYS\x01ключ"]
    seen = []
    for i in range(60):
        mq = MessageQueue("T", f"broker-{i % 2}", i % 3)
        sys_flag = (0, 0x1 | 0x300, 0x4)[i % 3]
        flag = (0, 7, -1, 2**31 - 1)[i % 4]
        fields = p._fields("T", mq, sys_flag, flag, props[i % 3], batch)
        born = fields["g"]
        expected = send_request_fields_v2(
            "pg", "T", "TBW102", "4", mq.queue_id, sys_flag, int(born), flag,
            props[i % 3], mq.broker_name, batch,
        )  # fmt: skip
        assert list(fields.items()) == list(expected.items())
        seen.append(fields)
    assert len({id(f) for f in seen}) == len(seen)  # a fresh dict per send
    assert len(p._templates[batch]) == 6
    assert not p._templates[not batch]


def test_fields_for_a_selectors_queue_of_another_topic_keep_the_message_topic() -> None:
    p = _producer()
    mq = MessageQueue("Other", "broker-a", 1)
    fields = p._fields("T", mq, 0, 0, "", False)
    assert (fields["b"], fields["e"], fields["n"]) == ("T", "1", "broker-a")
    assert mq not in p._templates[False]
    fields = p._fields("Other", mq, 0, 0, "", False)
    assert fields["b"] == "Other"


def test_field_template_cache_is_bounded() -> None:
    p = _producer()
    for i in range(5000):
        p._fields("T", MessageQueue("T", f"b{i}", 0), 0, 0, "", False)
    assert 0 < len(p._templates[False]) <= 4096


@pytest.mark.parametrize("tx", [None, "tx"])
def test_new_send_result_equals_the_dataclass_constructor(tx: str | None) -> None:
    mq = MessageQueue("T", "b", 2)
    fast = new_send_result(SendStatus.FLUSH_DISK_TIMEOUT, "U", "O", mq, 7, tx)
    slow = SendResult(SendStatus.FLUSH_DISK_TIMEOUT, "U", "O", mq, 7, tx)
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert repr(fast) == repr(slow)
    assert type(fast) is SendResult
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.queue_offset = 8  # type: ignore[misc]


def test_send_request_and_send_result_are_send_message_fields_parts() -> None:
    fields = {"b": "T"}
    cmd = send_request(fields, b"body")
    assert (cmd.code, cmd.body, cmd.is_oneway) == (RequestCode.SEND_MESSAGE_V2, b"body", False)
    assert cmd.ext_fields is fields
    assert send_request(fields, b"b", batch=True).code == RequestCode.SEND_BATCH_MESSAGE
    mq = MessageQueue("T", "b", 0)
    resp = RemotingCommand(
        int(ResponseCode.SLAVE_NOT_AVAILABLE),
        ext_fields={"msgId": "O", "queueId": "0", "queueOffset": "3"},
    )
    assert send_result(resp, mq, "U") == SendResult(
        SendStatus.SLAVE_NOT_AVAILABLE, "U", "O", mq, 3, None
    )
    with pytest.raises(RemoteError) as info:
        send_result(RemotingCommand(int(ResponseCode.SYSTEM_BUSY), remark="busy"), mq, "U")
    assert (info.value.code, info.value.remark) == (ResponseCode.SYSTEM_BUSY, "busy")


class _CountingClock(_Clock):
    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_all_available_reads_no_clock_while_nothing_is_isolated() -> None:
    clock = _CountingClock()
    fs = FaultStrategy(True, clock)
    for _ in range(3):
        fs.update_fault_item("a", 3.0, isolation=False)  # a success: available from now on
    reads = clock.reads
    assert fs.tolerance.all_available()
    assert fs.all_available()
    assert clock.reads == reads
    fs.update_fault_item("b", 700.0, isolation=False)  # slow: 30 s not available
    assert not fs.tolerance.all_available()
    fs.update_fault_item("b", 3.0, isolation=False)  # conservative until the 30 s pass
    assert not fs.tolerance.all_available()
    assert fs.is_available("b")
    clock.now += 30_000
    assert fs.tolerance.all_available()
    reads = clock.reads
    assert fs.tolerance.all_available()
    assert clock.reads == reads  # passed: no clock read again
    # A later isolation counts again, from its own time.
    fs.update_fault_item("a", 5.0, isolation=True)
    assert not fs.tolerance.all_available()
    clock.now += 599_999
    assert not fs.tolerance.all_available()
    clock.now += 1
    assert fs.tolerance.all_available()


def test_disabled_strategy_is_always_round_robin() -> None:
    fs = FaultStrategy(False, _Clock())
    fs.update_fault_item("a", 5.0, isolation=True)
    assert fs.all_available()
    assert fs.tolerance.snapshot() == {}

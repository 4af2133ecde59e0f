"""CPU cost of trimq's hot paths, per message, in microseconds of process CPU time.

    .venv/bin/python -m bench.peers.micro [--quick] [--only NAME,...]

CPU time (not wall time) and the best of several repeats, so figures stay comparable while
the machine is busy; use it to measure a change to the codecs, the store or the index before
running the peers harness. Cases:
  frame_roundtrip     encode a SEND_MESSAGE_V2 request (msgpack header, 1 KiB body) + decode it
  send_header         SendMessageRequestHeader.from_command on the decoded request
  response_encode     encode a send response frame (msgpack)
  java_string_hash    `topic#<32-hex UNIQ_KEY>` hash
  build_index         IndexService.build_index of a record with a UNIQ_KEY
  encode_record       encode_record_template of a 1 KiB message with TAGS/UNIQ_KEY/WAIT
  encode_records32    common.message.encode_records of 32 such messages, properties string
                      already set as the broker sets it (cost per message)
  build_index32       IndexService.build_index_batch of 32 records with a UNIQ_KEY (per message)
  decode_batch32      common.message.decode_batch_body of a 32-message SEND_BATCH body (per msg)
  batch_messages32    broker.processors.send.build_batch_messages: the send_batch loop that turns
                      the 32 decoded items into MessageInner objects (per message)
  patch_records32     common.message.patch_records of 32 encoded records (per record)
  body_crc1k          common.message.body_crc of a 1 KiB body
  acl_sign            RequestSigner.sign_fields of a SEND_MESSAGE_V2's fields and 1 KiB body
  acl_check           AclChecker.check of that signed request (ACL on, a permitted topic)
  (The store's native versions are used unless TRIMQ_NO_NATIVE=1: run both for an A/B.)
  put_single          MessageStore.put_messages of one message (ASYNC_FLUSH, index on)
  put_batch32         the same, 32 messages per call (cost per message)
  get_message32       MessageStore.get_message, 32 per call (cost per message)
  decode_records32    common.message.decode_records of a 32-message pull body (client side)
  client_decode32     client._api.decode_messages of the same body (consumer MessageExt objects,
                      body and store timestamp read, as a listener would)
  process_queue32     ProcessQueue put + span/commit + remove of 32-message batches, 512 in flight
  invoke64            RemotingClient.invoke of a 1 KiB echo, 64 in flight, client and server
                      in this process (CPU per request and response, both sides)
  invoke64_inline     the same with the echo registered inline (answered by the reader)
  invoke1             invoke64 with 1 in flight (sequential caller, like W5)
  invoke1_inline      invoke1 with the echo registered inline
  producer_send_local Producer.send of a 1 KiB message over a fake transport that encodes the
                      request frame and decodes a canned response frame (client CPU per send,
                      no sockets, no event-loop waits)
  producer_send_local_acl  producer_send_local with credentials: each request signed
  producer_batch32_local  Producer.send_batch of 32 such messages the same way (CPU per message)
  batch32_prepare     the batch's client work before the send: 32 Messages built, checked, their
                      UNIQ_KEYs set and the SEND_BATCH body encoded (Producer._batch_bodies)
  send_processor      SendProcessor.send_message of a 1 KiB SEND_MESSAGE_V2 on an in-process broker
  send_run16          send_processor as the broker's reader runs it: 16 sends of a read (frames
                      decoded from bytes, queues 0-7) in one staged run, each answer encoded
  send_batch_processor  SendProcessor.send_batch of a 32-message SEND_BATCH_MESSAGE the same
                      way (1 KiB each, TAGS/UNIQ_KEY as trimq's producer sends, WAIT=true in
                      the header; CPU per message)
  send_run16_acl      send_run16 with ACL on: signed requests, each checked before its send
  send_run16_metrics  send_run16 with Prometheus metrics on: each put counted (`Traffic`), the
                      run's answers told to the RPC latency observer as the connection does
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from common.message import (
    MessageInner,
    UniqKeyGenerator,
    decode_records,
    encode_properties,
    encode_record_template,
    java_string_hash,
)
from remoting import FrameDecoder, RemotingCommand, RequestCode, encode_frame, run_inline
from remoting.protocol.headers import SendMessageRequestHeader
from store import MessageStore, StoreConfig
from store.index_file import IndexService

if TYPE_CHECKING:
    from broker.config import BrokerConfig

BODY = bytes(range(256)) * 4
TOPIC = "BenchTopic"
UNIQ = UniqKeyGenerator(ip="127.0.0.1", pid=4242, seed=1)


def _props() -> dict[str, str]:
    return {"TAGS": "TagA", "UNIQ_KEY": UNIQ.next(), "WAIT": "true"}


def _msg(queue_id: int = 0) -> MessageInner:
    return MessageInner(
        TOPIC,
        BODY,
        queue_id=queue_id,
        properties=_props(),
        born_timestamp=int(time.time() * 1000),
        born_host=("127.0.0.1", 50000),
        store_host=("127.0.0.1", 10911),
    )


def _send_request() -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=8,
        queue_id=3,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties(_props()),
    )
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, hdr.to_fields_v2(), BODY)
    cmd.opaque = 77
    return cmd


def measure(fn: Callable[[int], Any], n: int, per: int = 1, repeats: int = 5) -> float:
    """Best CPU µs per item over `repeats` runs of `fn(n)` (`per` items per call unit)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn(n)
        best = min(best, time.process_time() - t0)
    return best / (n * per) * 1e6


def case_frame_roundtrip(n: int) -> None:
    cmd = _send_request()
    dec = FrameDecoder()
    for _ in range(n):
        dec.feed(encode_frame(cmd))


def case_send_header(n: int) -> None:
    frame = encode_frame(_send_request())
    cmd = FrameDecoder().feed(frame)[0]
    for _ in range(n):
        SendMessageRequestHeader.from_command(cmd)


def case_response_encode(n: int) -> None:
    req = _send_request()
    fields = {
        "msgId": "7F00000100002A9F0000000000000000",
        "queueId": "3",
        "queueOffset": "12345",
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    for _ in range(n):
        resp = req.make_response(0, None)
        resp.ext_fields = dict(fields)
        encode_frame(resp)


def case_java_string_hash(n: int) -> None:
    keys = [f"{TOPIC}#{UNIQ.next()}" for _ in range(1000)]
    for i in range(n):
        java_string_hash(keys[i % 1000])


def case_encode_record(n: int) -> None:
    msgs = [_msg() for _ in range(1000)]
    for i in range(n):
        m = msgs[i % 1000]
        m.properties_string = None
        encode_record_template(m)


def case_encode_records32(n: int) -> None:
    from common.message import encode_records

    groups = [[_msg() for _ in range(32)] for _ in range(32)]
    for group in groups:
        for m in group:
            m.encoded_properties()
    for i in range(n // 32):
        encode_records(groups[i % 32])


def case_build_index32(root: Path, n: int) -> float:
    svc = IndexService(root / "index32", slot_num=5_000_000, index_num=20_000_000)
    now = int(time.time() * 1000)
    batches = []
    for b in range(n // 32):
        phys = [(b * 32 + k) * 1170 for k in range(32)]
        batches.append((phys, [UNIQ.next() for _ in range(32)], [None] * 32))
    t0 = time.process_time()
    for phys, uniq, keys in batches:
        svc.build_index_batch(TOPIC, phys, uniq, keys, now)
    spent = time.process_time() - t0
    svc.close()
    return spent / (len(batches) * 32) * 1e6


def case_decode_batch32(n: int) -> None:
    from common.message import BatchItem, decode_batch_body, encode_batch_body

    body = encode_batch_body(BatchItem(0, BODY, encode_properties(_props())) for _ in range(32))
    for _ in range(n // 32):
        decode_batch_body(body)


def case_batch_messages32(n: int) -> None:
    from broker.processors.send import build_batch_messages, reuse_properties
    from common.message import BatchItem, decode_batch_body, encode_batch_body

    body = encode_batch_body(
        BatchItem(0, BODY, encode_properties({"TAGS": "TagA", "UNIQ_KEY": UNIQ.next()}))
        for _ in range(32)
    )
    items = decode_batch_body(body)
    batch_props = {"CLUSTER": "DefaultCluster", "WAIT": "true"}
    override = {"CLUSTER"}
    suffix = "CLUSTER\x01DefaultCluster"
    born = ("127.0.0.1", 50000)
    store = ("127.0.0.1", 10911)
    for _ in range(n // 32):
        build_batch_messages(
            items,
            MessageInner,
            TOPIC,
            3,
            0,
            1,
            born,
            store,
            batch_props,
            override,
            suffix,
            32767,
            reuse_properties,
        )


def case_patch_records32(n: int) -> None:
    from common.message import encode_records, patch_records

    records = encode_records([_msg() for _ in range(32)])
    for i in range(n // 32):
        patch_records(records, 0, 32, 0, i * 32, i * 40_000, 1, [])


def _acl_cases() -> tuple[Callable[[int], None], Callable[[int], None]]:
    """RequestSigner.sign_fields and AclChecker.check of one SEND_MESSAGE_V2 (1 KiB body, topic
    Bench) with bench.peers.secure's accounts."""
    from common.acl import AclChecker, RequestSigner, parse_acl

    from . import secure

    checker = AclChecker(parse_acl(secure.acl_yaml("b" * 24, "a" * 24, "c" * 24)))
    signer = RequestSigner(secure.BENCH_KEY, "c" * 24)
    req = _send_request()
    fields = dict(req.ext_fields or {}, b=secure.TOPICS[0])
    signed = signer.sign_fields(fields, BODY)

    def sign(n: int) -> None:
        for _ in range(n):
            signer.sign_fields(fields, BODY)

    def check(n: int) -> None:
        for _ in range(n):
            checker.check(RequestCode.SEND_MESSAGE_V2, signed, BODY, "127.0.0.1:50000")

    return sign, check


def case_body_crc1k(n: int) -> None:
    from common.message import body_crc

    for _ in range(n):
        body_crc(BODY)


class _StoreCase:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(self, n: int, batch: int) -> float:
        cfg = StoreConfig(
            store_path_root_dir=self.root / f"put{batch}",
            mapped_file_size_commitlog=256 * 1024 * 1024,
        )
        msgs = [[_msg(i % 8) for _ in range(batch)] for i in range(64)]
        for group in msgs:
            for m in group:
                m.queue_id = group[0].queue_id
        async with MessageStore(cfg) as store:
            best = float("inf")
            for _ in range(3):
                t0 = time.process_time()
                for i in range(n // batch):
                    group = msgs[i % 64]
                    for m in group:  # a fresh UNIQ_KEY each time, as real sends have
                        m.properties["UNIQ_KEY"] = UNIQ.next()
                        m.properties_string = None
                    await store.put_messages(group)
                best = min(best, time.process_time() - t0)
            return best / n * 1e6

    async def get(self, n: int) -> float:
        cfg = StoreConfig(
            store_path_root_dir=self.root / "get",
            mapped_file_size_commitlog=256 * 1024 * 1024,
        )
        async with MessageStore(cfg) as store:
            group = [_msg(0) for _ in range(32)]
            for _ in range(n // 32):
                await store.put_messages(group)
            best = float("inf")
            for _ in range(3):
                t0 = time.process_time()
                for off in range(0, n, 32):
                    await store.get_message("G", TOPIC, 0, off, 32, 1 << 20)
                best = min(best, time.process_time() - t0)
            return best / n * 1e6


def case_build_index(root: Path, n: int) -> float:
    svc = IndexService(root / "index", slot_num=5_000_000, index_num=20_000_000)
    reqs = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StoreConfig(store_path_root_dir=Path(tmp), message_index_enable=False)

        async def make() -> None:
            async with MessageStore(cfg) as store:
                for _ in range(n):
                    res = await store.put_messages([_msg()])
                    assert res.append is not None
                    reqs.append(res.append.phy_offsets[0])

        trio.run(make)
    from common.message import DispatchRequest, DispatchStatus

    base = [
        DispatchRequest(
            DispatchStatus.OK,
            1170,
            TOPIC,
            0,
            i,
            phy,
            0,
            int(time.time() * 1000),
            0,
            "",
            UNIQ.next(),
            0,
            {},
            0,
            0,
        )
        for i, phy in enumerate(reqs)
    ]
    t0 = time.process_time()
    for r in base:
        svc.build_index(r)
    spent = time.process_time() - t0
    svc.close()
    return spent / n * 1e6


def case_decode_records(n: int) -> None:
    from common.message import encode_record

    body = b"".join(bytes(encode_record(_msg(), i, i * 1200, 1)) for i in range(32))
    for _ in range(n // 32):
        for m in decode_records(body):
            m.body  # noqa: B018 (touch what a consumer touches)


def _pull_body32() -> bytes:
    from common.message import encode_record

    return b"".join(bytes(encode_record(_msg(), i, i * 1200, 1)) for i in range(32))


def case_client_decode(n: int) -> None:
    from client._api import decode_messages

    body = _pull_body32()
    for _ in range(n // 32):
        for m in decode_messages(body, "broker-a"):
            m.body  # noqa: B018 (touch what a consumer touches)
            m.store_timestamp  # noqa: B018


def case_process_queue(n: int) -> float:
    from client.consumer.process_queue import ProcessQueue
    from client.message import MessageExt

    batches = [
        [MessageExt(TOPIC, b"x", properties={}, queue_offset=b * 32 + k) for k in range(32)]
        for b in range(n // 32)
    ]
    pq = ProcessQueue()
    inflight: list[list[MessageExt]] = []
    t0 = time.process_time()
    for batch in batches:
        if len(inflight) >= 16:  # 16 batches in flight, the oldest done first
            pq.remove(inflight.pop(0))
        pq.put_messages(batch)
        pq.max_span()
        pq.commit_offset()
        inflight.append(batch)
    return (time.process_time() - t0) / (len(batches) * 32) * 1e6


async def _invoke64(n: int, in_flight: int = 64, inline: bool = False) -> float:
    from remoting import Connection, RemotingClient, RemotingServer

    async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    async def echo_inline(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(body=cmd.body)

    srv = RemotingServer()
    if inline:
        srv.processors.register(1, echo_inline, inline=True)
    else:
        srv.processors.register(1, echo)
    best = float("inf")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(srv.run)
        addr = f"127.0.0.1:{port}"
        async with RemotingClient() as client:
            await client.invoke(addr, RemotingCommand.request(1, body=BODY))
            for _ in range(3):
                left = [n]

                async def worker(left: list[int]) -> None:
                    while left[0] > 0:
                        left[0] -= 1
                        await client.invoke(addr, RemotingCommand.request(1, {"k": "v"}, BODY))

                t0 = time.process_time()
                async with trio.open_nursery() as workers:
                    for _ in range(in_flight):
                        workers.start_soon(worker, left)
                best = min(best, time.process_time() - t0)
        nursery.cancel_scope.cancel()
    return best / n * 1e6


class _LocalTransport:
    """Stands in for RemotingClient: encodes the request frame as a connection would and
    decodes a canned SEND_MESSAGE_V2 response frame, so only the client's own work counts."""

    def __init__(self, before_send: Callable[[RemotingCommand], None] | None = None) -> None:
        from remoting._frame import encode_frame_parts

        self._encode = encode_frame_parts
        # As RemotingClient.invoke: the request signer, when the client has credentials.
        self.before_send = before_send
        resp = _send_request().make_response(
            0,
            None,
            {"msgId": "7F00000100002A9F0000000000000000", "queueId": "3", "queueOffset": "1"},
        )
        self._frame = encode_frame(resp)
        self._decoder = FrameDecoder()

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000, *, long_poll: bool = False
    ) -> RemotingCommand:
        if self.before_send is not None:
            self.before_send(cmd)
        cmd.opaque = 77
        self._encode(cmd)
        return self._decoder.feed(self._frame)[0]

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self._encode(cmd)


class _LocalInstance:
    """The parts of ClientInstance a Producer uses, with a cached one-broker route."""

    def __init__(self, signed: bool = False) -> None:
        from client._api import MQClientAPI
        from client.config import ClientConfig
        from client.message import MessageQueue
        from client.request_reply import PendingRequests
        from client.route import TopicPublishInfo

        # What a closing Producer tells (its request-reply waits end with it).
        self.requests = PendingRequests()
        self.config = ClientConfig(
            namesrv_addr="ns:1",
            client_ip="127.0.0.1",
            access_key="bench-ak" if signed else None,
            secret_key="bench-secret" if signed else None,
        )
        self.api = MQClientAPI(_LocalTransport(self.config.request_signer()), ["ns:1"])
        queues = [MessageQueue(TOPIC, "broker-a", i) for i in range(8)]
        self.publish_info = {TOPIC: TopicPublishInfo(TOPIC, queues)}
        self.running = True

    async def get_publish_info(self, topic: str) -> Any:
        return self.publish_info[topic]

    async def find_master_addr(self, broker_name: str, topic: str | None = None) -> str:
        return "127.0.0.1:10911"

    def register_producer(self, group: str, producer: object) -> None:
        pass

    async def unregister_producer(self, group: str) -> None:
        pass


async def _producer_send_local(n: int, signed: bool = False) -> float:
    from client.message import Message
    from client.producer import Producer

    inst = _LocalInstance(signed)
    best = float("inf")
    async with Producer("PG", inst.config, instance=inst) as producer:  # type: ignore[arg-type]
        for _ in range(3):
            t0 = time.process_time()
            for _ in range(n):
                await producer.send(Message(TOPIC, BODY, tags="TagA"))
            best = min(best, time.process_time() - t0)
    return best / n * 1e6


async def _producer_batch32_local(n: int) -> float:
    from client.message import Message
    from client.producer import Producer

    inst = _LocalInstance()
    best = float("inf")
    async with Producer("PG", inst.config, instance=inst) as producer:  # type: ignore[arg-type]
        for _ in range(3):
            t0 = time.process_time()
            for _ in range(n // 32):
                await producer.send_batch([Message(TOPIC, BODY, tags="TagA") for _ in range(32)])
            best = min(best, time.process_time() - t0)
    return best / (n // 32 * 32) * 1e6


def case_batch32_prepare(n: int) -> None:
    from client.config import ClientConfig
    from client.message import Message
    from client.producer import Producer

    producer = Producer("PG", ClientConfig(namesrv_addr="127.0.0.1:9876"))
    prepare = producer._batch_bodies
    for _ in range(n // 32):
        prepare([Message(TOPIC, BODY, tags="TagA") for _ in range(32)])


class _FakeConn:
    """What `SendProcessor.send_message` reads of a connection."""

    remote_address = "127.0.0.1:50000"

    def __init__(self) -> None:
        self.attributes: dict[str, object] = {}


def _broker_config(root: Path, name: str) -> BrokerConfig:
    """An in-process broker's config: a free loopback port, its store under `root / name`."""
    import socket

    from broker.config import BrokerConfig

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return BrokerConfig(listen=f"127.0.0.1:{port}", store_dir=str(root / name))


async def _send_processor(root: Path, n: int) -> float:
    """`SendProcessor.send_message` (header decode, checks, properties, store append, answer)
    on an in-process broker, ASYNC_FLUSH; a fresh UNIQ_KEY per send as real producers have.
    The sends of one round are one commit run (its end, the staged write, included)."""
    from broker.controller import BrokerController

    cfg = _broker_config(root, "send_processor")
    conn: Any = _FakeConn()
    async with BrokerController(cfg) as ctrl:
        send = ctrl.send.send_message
        commits = ctrl.commits
        commits.begin()
        run_inline(send, conn, _send_request())  # creates the topic
        commits.end()
        best = float("inf")
        for _ in range(3):
            cmds = [_send_request() for _ in range(n)]
            t0 = time.process_time()
            commits.begin()
            for cmd in cmds:
                run_inline(send, conn, cmd)
            commits.end()
            best = min(best, time.process_time() - t0)
        return best / n * 1e6


async def _send_run16(root: Path, n: int, acl: bool = False, metrics: bool = False) -> float:
    """A reader's run of 16 sends as the broker handles one read (ASYNC_FLUSH): the frames
    decoded from bytes, the controller's run begun, each `send_message` called and its answer
    encoded, the run ended (staged records written, index entries built). `acl`: the broker
    with ACL on (bench.peers.secure's accounts), the requests signed by the bench account and
    served through the processor table (its ACL check first), as trimq-acl's broker does."""
    from broker.controller import BrokerController
    from common.acl import RequestSigner
    from remoting._frame import encode_frame_parts
    from remoting._processor import rpc_clock

    from . import secure

    name = "send_run16_acl" if acl else "send_run16_metrics" if metrics else "send_run16"
    cfg = _broker_config(root, name)
    signer: RequestSigner | None = None
    if acl:
        acl_file = root / f"{name}.yml"
        acl_file.write_text(secure.acl_yaml("b" * 24, "a" * 24, "c" * 24))
        cfg = cfg.model_copy(update={"acl_enable": True, "acl_file": str(acl_file)})
        signer = RequestSigner(secure.BENCH_KEY, "c" * 24)
    conn: Any = _FakeConn()
    async with BrokerController(cfg) as ctrl:
        send = ctrl.send.send_message
        # Metrics on: what `run` sets once the endpoint is bound (no endpoint here).
        observe = ctrl.metrics.rpc.observe if metrics else None
        if metrics:
            ctrl.traffic = ctrl.metrics.traffic
        if acl:
            entry = ctrl.server.processors.get(RequestCode.SEND_MESSAGE_V2)
            assert entry is not None
            send = entry[0]

        def request(queue_id: int) -> RemotingCommand:
            cmd = _send_request()
            assert cmd.ext_fields is not None
            cmd.ext_fields["e"] = str(queue_id)
            if signer is not None:
                cmd.ext_fields["b"] = secure.TOPICS[0]
                signer(cmd)
            return cmd

        commits = ctrl.commits
        commits.begin()
        first = run_inline(send, conn, request(0))  # creates the topic
        assert isinstance(first, RemotingCommand)
        assert first.code == 0, first.remark
        commits.end()
        runs = n // 16
        best = float("inf")
        for _ in range(3):
            chunks = [
                b"".join([encode_frame(request(i % 8)) for i in range(16)]) for _ in range(runs)
            ]
            dec = FrameDecoder()
            t0 = time.process_time()
            answered: list[int] = []
            for chunk in chunks:
                read_at = rpc_clock() if observe is not None else 0.0
                commits.begin()
                out = []
                for cmd in dec.feed(chunk):
                    resp = run_inline(send, conn, cmd)
                    assert isinstance(resp, RemotingCommand)  # ASYNC_FLUSH: answered at once
                    if observe is not None:
                        answered.append(cmd.code)
                        answered.append(resp.code)
                    resp.opaque = cmd.opaque
                    out.append(encode_frame_parts(resp))
                commits.end()
                if observe is not None:
                    observe(answered, rpc_clock() - read_at)
                    answered.clear()
                # The loop switches tasks between reads: the flush service's timer reserves
                # the commitlog's blocks ahead (without it every append is written at once).
                await trio.lowlevel.checkpoint()
            best = min(best, time.process_time() - t0)
        return best / (runs * 16) * 1e6


def _send_batch_request() -> RemotingCommand:
    from common.message import BatchItem, encode_batch_body

    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=8,
        queue_id=3,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties({"WAIT": "true"}),
        batch=True,
    )
    # The properties trimq's producer sends in a batch (no per-message WAIT: it is only set
    # when false; Java producers also send WAIT=true in every message).
    body = encode_batch_body(
        BatchItem(0, BODY, encode_properties({"TAGS": "TagA", "UNIQ_KEY": UNIQ.next()}))
        for _ in range(32)
    )
    cmd = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, hdr.to_fields_v2(), body)
    cmd.opaque = 78
    return cmd


async def _send_batch_processor(root: Path, n: int) -> float:
    """`SendProcessor.send_batch` of 32-message batches (header decode, batch body decode,
    per-message checks and properties, store append, answer), CPU per message."""
    from broker.controller import BrokerController

    cfg = _broker_config(root, "send_batch_processor")
    conn: Any = _FakeConn()
    batches = n // 32
    async with BrokerController(cfg) as ctrl:
        send = ctrl.send.send_batch
        commits = ctrl.commits
        commits.begin()
        run_inline(send, conn, _send_batch_request())  # creates the topic
        commits.end()
        best = float("inf")
        for _ in range(3):
            cmds = [_send_batch_request() for _ in range(batches)]
            t0 = time.process_time()
            commits.begin()
            for cmd in cmds:
                run_inline(send, conn, cmd)
            commits.end()
            best = min(best, time.process_time() - t0)
        return best / (batches * 32) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None)
    opts = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    n = 5_000 if opts.quick else 30_000
    only = set(opts.only.split(",")) if opts.only else None
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="trimq-micro-") as tmp:
        root = Path(tmp)
        cases: dict[str, Callable[[], float]] = {
            "frame_roundtrip": lambda: measure(case_frame_roundtrip, n),
            "send_header": lambda: measure(case_send_header, n),
            "response_encode": lambda: measure(case_response_encode, n),
            "java_string_hash": lambda: measure(case_java_string_hash, n),
            "build_index": lambda: case_build_index(root, n),
            "encode_record": lambda: measure(case_encode_record, n),
            "encode_records32": lambda: measure(case_encode_records32, n),
            "build_index32": lambda: case_build_index32(root, n),
            "decode_batch32": lambda: measure(case_decode_batch32, n),
            "batch_messages32": lambda: measure(case_batch_messages32, n),
            "patch_records32": lambda: measure(case_patch_records32, n),
            "body_crc1k": lambda: measure(case_body_crc1k, n),
            "acl_sign": lambda: measure(_acl_cases()[0], n),
            "acl_check": lambda: measure(_acl_cases()[1], n),
            "put_single": lambda: trio.run(_StoreCase(root).put, n, 1),
            "put_batch32": lambda: trio.run(_StoreCase(root).put, n, 32),
            "get_message32": lambda: trio.run(_StoreCase(root).get, n),
            "decode_records32": lambda: measure(case_decode_records, n),
            "client_decode32": lambda: measure(case_client_decode, n),
            "process_queue32": lambda: min(case_process_queue(n) for _ in range(5)),
            "invoke64": lambda: trio.run(_invoke64, n),
            "invoke64_inline": lambda: trio.run(_invoke64, n, 64, True),
            "invoke1": lambda: trio.run(_invoke64, n // 3, 1),
            "invoke1_inline": lambda: trio.run(_invoke64, n // 3, 1, True),
            "producer_send_local": lambda: trio.run(_producer_send_local, n),
            "producer_send_local_acl": lambda: trio.run(_producer_send_local, n, True),
            "producer_batch32_local": lambda: trio.run(_producer_batch32_local, n),
            "batch32_prepare": lambda: measure(case_batch32_prepare, n // 32 * 32),
            "send_processor": lambda: trio.run(_send_processor, root, n),
            "send_batch_processor": lambda: trio.run(_send_batch_processor, root, n),
            "send_run16": lambda: trio.run(_send_run16, root, n),
            "send_run16_acl": lambda: trio.run(_send_run16, root, n, True),
            "send_run16_metrics": lambda: trio.run(_send_run16, root, n, False, True),
        }
        for name, fn in cases.items():
            if only and name not in only:
                continue
            results[name] = fn()
            print(f"{name:18} {results[name]:8.2f} us/msg", flush=True)


if __name__ == "__main__":
    main()

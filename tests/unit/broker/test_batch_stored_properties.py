"""`SendProcessor.send_batch` on an in-process broker: every message's stored properties are
byte-identical to the dict encoding (own entries, the batch header's and CLUSTER added, WAIT
dropped), whichever path built them, and bad batches get the same answers as before."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.message import (
    _BATCH_HEAD,
    BatchItem,
    decode_batch_body,
    decode_properties,
    decode_records,
    encode_batch_body,
    encode_properties,
)
from remoting import RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import SendMessageRequestHeader
from tests.helpers import call_inline, free_port

# Each a message's own properties text, as a producer may send it.
TEXTS = [
    "",
    "TAGS\x01TagA\x02UNIQ_KEY\x01AB12",  # trimq's producer
    "UNIQ_KEY\x01AB12\x02WAIT\x01true\x02TAGS\x01TagA",  # Java's: WAIT in every message
    "WAIT\x01true",
    "WAIT\x01false\x02TAGS\x01t",
    "KEYS\x01a\x01WAIT\x01true\x02TAGS\x01t",  # a value holding \x01 and "WAIT\x01true"
    "KEYS\x01xWAIT\x01true\x02WAIT\x01true",
    "A\x011\x02A\x012\x02WAIT\x01true",  # duplicate name
    "A\x011\x02",  # trailing separator
    "A\x011\x02\x02B\x012",  # empty segment
    "\x01x\x02B\x012",  # empty name
    "\x02",
    "CLUSTER\x01mine\x02B\x012",  # the broker's key: the broker's value wins
    "H\x01own\x02WAIT\x01true",  # a header key
    "UNIQ_KEY\x01é\x02TAGS\x01ü",
]


class _Conn:
    remote_address = "127.0.0.1:50000"

    def __init__(self) -> None:
        self.attributes: dict[str, object] = {}


def _request(topic: str, body: bytes, header_props: dict[str, str]) -> RemotingCommand:
    hdr = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties(header_props) if header_props else None,
        batch=True,
    )
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, hdr.to_fields_v2(), body)


def _send(ctrl: BrokerController, body: bytes, header: dict[str, str]) -> RemotingCommand:
    """`send_batch`'s answer (ASYNC_FLUSH: always at once)."""
    resp = call_inline(
        ctrl.send.send_batch,
        _Conn(),  # type: ignore[arg-type]
        _request("T", body, header),
        run=ctrl.commits,
    )
    assert isinstance(resp, RemotingCommand)
    return resp


def _reference(raw: str, added: dict[str, str]) -> bytes:
    """What the dict path stores: decode, add the batch's entries, drop WAIT, encode."""
    props = decode_properties(raw)
    props.update(added)
    return encode_properties({k: v for k, v in props.items() if k != "WAIT"}).encode()


def _config(tmp_path: Path, **kw: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "listen": f"127.0.0.1:{free_port()}",
            "store_dir": str(tmp_path / "store"),
            "mapped_file_size_commitlog": 1024 * 1024,
            "mapped_file_size_consume_queue": 20_000,
            **kw,
        }
    )


def _run(tmp_path: Path, body_of: Any, **kw: object) -> Any:
    async def main() -> Any:
        async with BrokerController(_config(tmp_path, **kw)) as ctrl:
            return body_of(ctrl)

    return trio.run(main)


@pytest.mark.parametrize(
    "header",
    [{}, {"WAIT": "true"}, {"WAIT": "false"}, {"WAIT": "true", "H": "1"}],
    ids=["none", "wait", "wait-false", "wait+own-key"],
)
def test_stored_properties_equal_the_dict_encoding(tmp_path: Path, header: dict[str, str]) -> None:
    def body_of(ctrl: BrokerController) -> None:
        items = [BatchItem(i, b"b%d" % i, raw) for i, raw in enumerate(TEXTS)]
        resp = _send(ctrl, encode_batch_body(items), header)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        got = ctrl.store.get_message_nowait("g", "T", 0, 0, 64, 1 << 20)
        records = decode_records(b"".join(got.buffers))
        added = {**header, "CLUSTER": ctrl.config.broker_cluster_name}
        assert [m._properties_raw for m in records] == [_reference(t, added) for t in TEXTS]
        assert [m.body for m in records] == [item.body for item in items]
        assert [m.flag for m in records] == [item.flag for item in items]

    _run(tmp_path, body_of)


def test_bad_batches_get_the_same_answers(tmp_path: Path) -> None:
    good = encode_batch_body([BatchItem(0, b"x", "TAGS\x01a")])
    empty_item = encode_batch_body([BatchItem(0, b"x", ""), BatchItem(0, b"", "TAGS\x01a")])
    # Under the 1,000-byte limit alone, over it with CLUSTER: the reused text and (the
    # message holds CLUSTER) the dict encoding are both refused.
    long = "K\x01" + "v" * 990
    big = encode_batch_body([BatchItem(0, b"x", "TAGS\x01a"), BatchItem(0, b"x", long)])
    big_own = encode_batch_body([BatchItem(0, b"x", "CLUSTER\x01c\x02" + long)])

    def body_of(ctrl: BrokerController) -> list[tuple[int, str | None]]:
        out = []
        for body in (b"", good[:-1], empty_item, big, big_own):
            resp = _send(ctrl, body, {"WAIT": "true"})
            out.append((resp.code, resp.remark))
        return out

    limit = 1000
    answers = _run(tmp_path, body_of, max_properties_size=limit)
    assert answers == [
        (ResponseCode.MESSAGE_ILLEGAL, "the batch body is empty"),
        (ResponseCode.MESSAGE_ILLEGAL, "bad batch body: truncated batch item at 0"),
        (ResponseCode.MESSAGE_ILLEGAL, "batch message 1 has an empty body"),
        (ResponseCode.MESSAGE_ILLEGAL, f"batch message 1: properties exceed {limit} bytes"),
        (ResponseCode.MESSAGE_ILLEGAL, f"batch message 0: properties exceed {limit} bytes"),
    ]


def test_decode_batch_body_reads_any_buffer() -> None:
    items = [BatchItem(3, b"body", "TAGS\x01a"), BatchItem(0, b"", "")]
    body = encode_batch_body(items)
    for buf in (body, bytearray(body), memoryview(body)):
        got = decode_batch_body(buf)
        assert got == items
        assert all(type(item.body) is bytes for item in got)
    with pytest.raises(ValueError, match="not UTF-8"):
        decode_batch_body(_BATCH_HEAD.pack(24, 0, 0, 0, 0) + b"\x00\x02\xff\xfe")


def test_producer_texts_skip_the_dict_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trimq's and Java's usual texts (a per-message WAIT included) are reused, not
    re-encoded; a message holding a batch key still goes through the dict encoding."""
    from broker.processors.send import SendProcessor

    finished: list[str] = []
    finish = SendProcessor._finish

    def counting(msg: Any) -> int:
        finished.append(msg.properties_string or "")
        return finish(msg)

    monkeypatch.setattr(SendProcessor, "_finish", staticmethod(counting))

    def body_of(ctrl: BrokerController) -> None:
        items = [BatchItem(0, b"x", raw) for raw in TEXTS[1:7]]
        resp = _send(ctrl, encode_batch_body(items), {"WAIT": "true"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert finished == []
        items = [BatchItem(0, b"x", "CLUSTER\x01mine\x02WAIT\x01true")]
        resp = _send(ctrl, encode_batch_body(items), {"WAIT": "true"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert len(finished) == 1

    _run(tmp_path, body_of)

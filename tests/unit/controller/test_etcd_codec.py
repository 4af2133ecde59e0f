"""controller.etcd's gateway JSON codec: what it sends and how it reads etcd 3.4's answers."""

from __future__ import annotations

import json

import pytest

from controller.etcd import (
    Compare,
    CompareTarget,
    DeleteResponse,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    LeaseExpired,
    Op,
    PutResponse,
    RangeResponse,
    TxnResult,
    decode_error,
    decode_keepalive,
    decode_kv,
    decode_range,
    decode_txn,
    encode_compare,
    encode_op,
    encode_txn,
    json_int,
    normalize_endpoint,
    prefix_end,
    request_size,
)

HEADER = {"cluster_id": "1", "member_id": "2", "revision": "7", "raft_term": "2"}


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"a\xfe\xff\xff") == b"a\xff"
    assert prefix_end(b"\xff\xff") == b"\0"
    assert prefix_end(b"\x00") == b"\x01"


def test_compare_encoding_per_target() -> None:
    assert encode_compare(Compare.value("k", "==", b"v")) == {
        "key": "aw==",
        "target": "VALUE",
        "result": "EQUAL",
        "value": "dg==",
    }
    # int64 operands go as JSON strings, in the field named after the target.
    assert encode_compare(Compare.version("k", "!=", 3)) == {
        "key": "aw==",
        "target": "VERSION",
        "result": "NOT_EQUAL",
        "version": "3",
    }
    assert encode_compare(Compare.create_revision(b"k", "==", 0))["create_revision"] == "0"
    assert encode_compare(Compare.create_revision(b"k", "==", 0))["target"] == "CREATE"
    assert encode_compare(Compare.mod_revision("k", "<", 9)) == {
        "key": "aw==",
        "target": "MOD",
        "result": "LESS",
        "mod_revision": "9",
    }
    assert encode_compare(Compare.lease("k", ">", 2**62))["lease"] == str(2**62)
    assert encode_compare(Compare.lease("k", ">", 1))["result"] == "GREATER"


def test_compare_and_op_validation() -> None:
    with pytest.raises(ValueError, match="op"):
        Compare(b"k", CompareTarget.VERSION, "<=", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Compare(b"k", CompareTarget.VERSION, "==", b"1")
    with pytest.raises(TypeError):
        Compare(b"k", CompareTarget.VALUE, "==", 1)
    with pytest.raises(TypeError):
        Compare(b"k", CompareTarget.VERSION, "==", True)
    for bad in (lambda: Compare.value("", "==", b""), lambda: Op.get(b""), lambda: Op.delete("")):
        with pytest.raises(EtcdError, match="empty") as info:
            bad()
        assert info.value.code == 3


def test_op_encoding() -> None:
    assert encode_op(Op.put("k", "v")) == {"request_put": {"key": "aw==", "value": "dg=="}}
    assert encode_op(Op.put("k", b"", lease=5)) == {
        "request_put": {"key": "aw==", "value": "", "lease": "5"}
    }
    assert encode_op(Op.get("k")) == {"request_range": {"key": "aw=="}}
    assert encode_op(Op.get("k", prefix=True)) == {
        "request_range": {"key": "aw==", "range_end": "bA=="}
    }
    assert encode_op(Op.delete("a/", prefix=True)) == {
        "request_delete_range": {"key": "YS8=", "range_end": "YTA="}
    }
    body = encode_txn([Compare.version("k", "==", 0)], [Op.put("k", "v")], [])
    assert json.loads(json.dumps(body)) == {
        "compare": [{"key": "aw==", "target": "VERSION", "result": "EQUAL", "version": "0"}],
        "success": [{"request_put": {"key": "aw==", "value": "dg=="}}],
        "failure": [],
    }


def test_key_value_decoding_with_absent_fields() -> None:
    full = {
        "key": "Zm9v",
        "create_revision": "2",
        "mod_revision": "5",
        "version": "3",
        "value": "YmFy",
        "lease": "4111120291497235978",
    }
    assert decode_kv(full) == KeyValue(b"foo", b"bar", 2, 5, 3, 4111120291497235978)
    # An empty value and lease 0 are left out by the gateway.
    assert decode_kv(
        {"key": "Zm9v", "create_revision": "2", "mod_revision": "2", "version": "1"}
    ) == (KeyValue(b"foo", b"", 2, 2, 1, 0))
    with pytest.raises(EtcdError, match="base64"):
        decode_kv({"key": "not base64!"})
    with pytest.raises(EtcdError, match="version"):
        decode_kv({"key": "Zm9v", "version": "x"})
    with pytest.raises(EtcdError):
        decode_kv(["key"])


def test_json_int() -> None:
    assert json_int({"a": "12"}, "a") == 12
    assert json_int({"a": 12}, "a") == 12
    assert json_int({}, "a") == 0
    assert json_int({"a": "-1"}, "a") == -1
    bad: object
    for bad in (True, 1.5, "1e3", [], {}):
        with pytest.raises(EtcdError):
            json_int({"a": bad}, "a")


def test_range_decoding() -> None:
    assert decode_range({"header": HEADER}) == RangeResponse((), 0, False)
    res = decode_range(
        {
            "header": HEADER,
            "kvs": [{"key": "YQ==", "create_revision": "2", "mod_revision": "3", "version": "2"}],
            "count": "4",
            "more": True,
        }
    )
    assert res == RangeResponse((KeyValue(b"a", b"", 2, 3, 2, 0),), 4, True)


def test_txn_decoding() -> None:
    # As etcd 3.4 answers: snake_case response names, revisions as strings.
    answer = {
        "header": HEADER,
        "succeeded": True,
        "responses": [
            {"response_put": {"header": {"revision": "7"}}},
            {"response_delete_range": {"header": {"revision": "7"}, "deleted": "1"}},
            {
                "response_range": {
                    "header": {"revision": "7"},
                    "kvs": [
                        {
                            "key": "Zm9v",
                            "create_revision": "7",
                            "mod_revision": "7",
                            "version": "1",
                            "value": "eA==",
                        }
                    ],
                    "count": "1",
                }
            },
            {"response_delete_range": {"header": {"revision": "7"}}},
            {"response_range": {"header": {"revision": "7"}}},
        ],
    }
    assert decode_txn(answer) == TxnResult(
        succeeded=True,
        responses=(
            PutResponse(7),
            DeleteResponse(1),
            RangeResponse((KeyValue(b"foo", b"x", 7, 7, 1, 0),), 1, False),
            DeleteResponse(0),
            RangeResponse((), 0, False),
        ),
        revision=7,
    )
    # The failure branch: no "succeeded" field at all; no ops: no "responses".
    assert decode_txn({"header": HEADER}) == TxnResult(False, (), 7)
    with pytest.raises(EtcdError, match="unknown txn response"):
        decode_txn({"header": HEADER, "responses": [{"response_txn": {}}]})


def test_error_decoding() -> None:
    err = decode_error(
        400,
        b'{"error":"etcdserver: key is not provided",'
        b'"message":"etcdserver: key is not provided","code":3}',
    )
    assert type(err) is EtcdError
    assert (err.message, err.code, err.http_status) == ("etcdserver: key is not provided", 3, 400)
    assert "code 3" in str(err)

    lease = decode_error(
        404,
        b'{"error":"etcdserver: requested lease not found","message":"x lease not found","code":5}',
    )
    assert isinstance(lease, LeaseExpired)

    for status, body in (
        (503, b'{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}'),
        (504, b'{"message":"etcdserver: request timed out","code":4}'),
        (503, b"Service Unavailable"),
    ):
        unavailable = decode_error(status, body)
        assert isinstance(unavailable, EtcdUnavailable)
        assert unavailable.maybe_applied

    too_big = decode_error(
        429,
        b'{"error":"grpc: received message larger than max (2097162 vs. 2097152)",'
        b'"message":"grpc: received message larger than max (2097162 vs. 2097152)","code":8}',
    )
    assert type(too_big) is EtcdError
    assert too_big.code == 8
    # Not JSON: the body's start is the message.
    odd = decode_error(404, b"404 page not found\n")
    assert odd.message == "404 page not found"
    assert odd.code is None
    assert decode_error(500, b"").message == "HTTP 500"
    # Streaming endpoints nest the error.
    nested = decode_error(200, b'{"error":{"grpc_code":5,"message":"lease not found"}}')
    assert isinstance(nested, LeaseExpired)
    assert nested.code == 5


def test_keepalive_decoding() -> None:
    line = b'{"result":{"header":{"revision":"3"},"ID":"41","TTL":"2"}}\n'
    assert decode_keepalive(line) == 2
    assert decode_keepalive(b"\n" + line + line) == 2
    # An unknown lease: the answer has no TTL.
    assert decode_keepalive(b'{"result":{"header":{"revision":"3"},"ID":"41"}}') == 0
    with pytest.raises(EtcdError, match="empty"):
        decode_keepalive(b"")
    with pytest.raises(EtcdError, match="malformed"):
        decode_keepalive(b"{not json")
    with pytest.raises(EtcdError, match="malformed"):
        decode_keepalive(b'{"other":1}')
    with pytest.raises(EtcdError, match="boom"):
        decode_keepalive(b'{"error":{"grpc_code":2,"message":"boom"}}')


def test_request_size_counts_keys_and_values() -> None:
    ops = [Op.put("k", b"x" * 100), Op.get("a", prefix=True), Op.delete("dd")]
    assert request_size(
        [Compare.value("kk", "==", b"vvv"), Compare.version("k", "==", 1)], ops
    ) == (2 + 3 + 1 + 8 + 1 + 100 + 1 + 1 + 2)


def test_endpoints() -> None:
    assert normalize_endpoint("127.0.0.1:2379") == "http://127.0.0.1:2379"
    assert normalize_endpoint(" http://127.0.0.1:2379/ ") == "http://127.0.0.1:2379"
    with pytest.raises(ValueError):
        normalize_endpoint("")
    with pytest.raises(ValueError):
        normalize_endpoint("unix://x")
    with pytest.raises(TypeError):
        EtcdClient("http://127.0.0.1:2379")
    with pytest.raises(ValueError):
        EtcdClient([])
    with pytest.raises(ValueError):
        EtcdClient(["127.0.0.1:1"], timeout_s=0)
    assert EtcdClient(["127.0.0.1:1", "127.0.0.1:2"]).endpoint == "http://127.0.0.1:1"


async def test_client_outside_its_context_refuses() -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await EtcdClient(["127.0.0.1:1"]).get("k")
    async with EtcdClient(["127.0.0.1:1"]) as c:
        with pytest.raises(ValueError):
            await c.lease_grant(0)
        with pytest.raises(ValueError):
            await c.get_prefix("p", limit=-1)

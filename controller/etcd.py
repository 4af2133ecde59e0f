"""An async etcd v3 client for trio over etcd's JSON gateway (HTTP POST /v3/...).

Only what the controller needs: single-key and prefix reads, put, delete, transactions with
typed compares, and leases. Requests go to one endpoint at a time; a connection failure moves
on to the next endpoint, and the endpoint that answered last is tried first next time.

Gateway facts the codec handles (etcd 3.4, grpc-gateway with the proto field names):
- keys and values are base64 strings in JSON;
- int64 fields (revisions, versions, lease ids, TTLs, counts) are JSON strings;
- fields at their zero value are absent (no `kvs` when nothing matched, no `succeeded` when a
  transaction took its failure branch, no `TTL` in a keepalive answer for an unknown lease);
- errors are HTTP 4xx/5xx with `{"error", "message", "code"}`, `code` a gRPC status code;
- /v3/lease/keepalive is a stream: each answer is a line `{"result": {...}}`.

Timeouts: every call is bounded by `timeout_s` in total, whatever the number of endpoints.
A write (put, delete, txn) whose request may have reached etcd is not retried on another
endpoint: `EtcdUnavailable.maybe_applied` tells the caller the outcome is unknown.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal

import httpx
import trio

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "Compare",
    "CompareTarget",
    "DeleteResponse",
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "LeaseExpired",
    "Op",
    "OpResponse",
    "PutResponse",
    "RangeResponse",
    "TxnResult",
]

Key = str | bytes
Value = str | bytes
CompareOp = Literal["==", "!=", "<", ">"]

# gRPC status codes etcd puts in `code`.
GRPC_INVALID_ARGUMENT: Final = 3
GRPC_DEADLINE_EXCEEDED: Final = 4
GRPC_NOT_FOUND: Final = 5
GRPC_RESOURCE_EXHAUSTED: Final = 8
GRPC_UNAVAILABLE: Final = 14

# etcd's default --max-request-bytes (1.5 MiB). The client refuses a request whose keys and
# values alone exceed it (etcd would refuse it too, after the upload).
DEFAULT_MAX_REQUEST_BYTES: Final = 1536 * 1024


# -- errors ---------------------------------------------------------------------------------


class EtcdError(Exception):
    """etcd refused a request, or answered something this client cannot read.

    `code` is etcd's gRPC status code when it gave one, `http_status` the HTTP status."""

    def __init__(
        self, message: str, *, code: int | None = None, http_status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.http_status = http_status

    def __str__(self) -> str:
        extra = []
        if self.code is not None:
            extra.append(f"code {self.code}")
        if self.http_status is not None:
            extra.append(f"http {self.http_status}")
        return f"{self.message} ({', '.join(extra)})" if extra else self.message


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the timeout, or etcd said it cannot serve (no leader,
    request timed out). `maybe_applied`: a write may have been applied all the same."""

    def __init__(
        self,
        message: str,
        *,
        maybe_applied: bool = False,
        code: int | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message, code=code, http_status=http_status)
        self.maybe_applied = maybe_applied


class LeaseExpired(EtcdError):
    """The lease does not exist (any more): it expired or was revoked."""


# -- data -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it. `lease` is 0 when the key has none."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class CompareTarget(enum.Enum):
    """What a `Compare` looks at (the gateway's enum names)."""

    VALUE = "VALUE"
    VERSION = "VERSION"
    CREATE_REVISION = "CREATE"
    MOD_REVISION = "MOD"
    LEASE = "LEASE"


_RESULTS: Final[dict[str, str]] = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}
# The JSON field holding the operand, per target.
_OPERAND_FIELD: Final[dict[CompareTarget, str]] = {
    CompareTarget.VALUE: "value",
    CompareTarget.VERSION: "version",
    CompareTarget.CREATE_REVISION: "create_revision",
    CompareTarget.MOD_REVISION: "mod_revision",
    CompareTarget.LEASE: "lease",
}


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: `<target of key> <op> <operand>`.

    A missing key has version, create_revision, mod_revision and lease 0, so
    `Compare.create_revision(k, "==", 0)` means "k does not exist". A value compare on a
    missing key is false whatever the op."""

    key: bytes
    target: CompareTarget
    op: CompareOp
    operand: bytes | int

    def __post_init__(self) -> None:
        _check_key(self.key)
        if self.op not in _RESULTS:
            raise ValueError(f"compare op must be one of {sorted(_RESULTS)}, not {self.op!r}")
        wants_bytes = self.target is CompareTarget.VALUE
        if wants_bytes != isinstance(self.operand, bytes) or isinstance(self.operand, bool):
            kind = "bytes" if wants_bytes else "int"
            raise TypeError(f"{self.target.name} compares take a {kind} operand")

    @classmethod
    def value(cls, key: Key, op: CompareOp, value: Value) -> Compare:
        return cls(_b(key), CompareTarget.VALUE, op, _b(value))

    @classmethod
    def version(cls, key: Key, op: CompareOp, version: int) -> Compare:
        return cls(_b(key), CompareTarget.VERSION, op, version)

    @classmethod
    def create_revision(cls, key: Key, op: CompareOp, revision: int) -> Compare:
        return cls(_b(key), CompareTarget.CREATE_REVISION, op, revision)

    @classmethod
    def mod_revision(cls, key: Key, op: CompareOp, revision: int) -> Compare:
        return cls(_b(key), CompareTarget.MOD_REVISION, op, revision)

    @classmethod
    def lease(cls, key: Key, op: CompareOp, lease_id: int) -> Compare:
        return cls(_b(key), CompareTarget.LEASE, op, lease_id)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a transaction. `range_end` empty: the key alone."""

    kind: Literal["put", "get", "delete"]
    key: bytes
    value: bytes = b""
    lease: int = 0
    range_end: bytes = b""

    def __post_init__(self) -> None:
        _check_key(self.key)

    @classmethod
    def put(cls, key: Key, value: Value, *, lease: int | None = None) -> Op:
        return cls("put", _b(key), _b(value), lease or 0)

    @classmethod
    def get(cls, key: Key, *, prefix: bool = False) -> Op:
        k = _b(key)
        return cls("get", k, range_end=prefix_end(k) if prefix else b"")

    @classmethod
    def delete(cls, key: Key, *, prefix: bool = False) -> Op:
        k = _b(key)
        return cls("delete", k, range_end=prefix_end(k) if prefix else b"")


@dataclass(frozen=True, slots=True)
class RangeResponse:
    """`kvs` in key order; `more`: `limit` cut the answer short, `count` is the total."""

    kvs: tuple[KeyValue, ...]
    count: int
    more: bool


@dataclass(frozen=True, slots=True)
class PutResponse:
    revision: int


@dataclass(frozen=True, slots=True)
class DeleteResponse:
    deleted: int


OpResponse = RangeResponse | PutResponse | DeleteResponse


@dataclass(frozen=True, slots=True)
class TxnResult:
    """`succeeded`: every compare held and the success ops ran (else the failure ops).
    `responses`: one per op of the branch that ran, in order. `revision`: the store's
    revision after the transaction (its own revision when it wrote)."""

    succeeded: bool
    responses: tuple[OpResponse, ...]
    revision: int


# -- gateway JSON codec (pure) --------------------------------------------------------------


def _b(x: Key) -> bytes:
    return x.encode("utf-8") if isinstance(x, str) else bytes(x)


def _check_key(key: bytes) -> None:
    if not key:
        # etcd answers "key is not provided" (code 3) too; refused here without a round trip.
        raise EtcdError("etcd key must not be empty", code=GRPC_INVALID_ARGUMENT)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any) -> bytes:
    if text is None:
        return b""
    if not isinstance(text, str):
        raise EtcdError(f"malformed gateway answer: expected a base64 string, got {text!r}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EtcdError(f"malformed gateway answer: bad base64 {text[:40]!r}") from exc


def json_int(obj: dict[str, Any], field: str) -> int:
    """An int64 field: a JSON string (or number), absent meaning 0."""
    raw = obj.get(field)
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise EtcdError(f"malformed gateway answer: {field}={raw!r}")
    try:
        return int(raw)
    except ValueError as exc:
        raise EtcdError(f"malformed gateway answer: {field}={raw!r}") from exc


def prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with `prefix` (etcd's GetPrefixRangeEnd):
    the prefix with its last byte below 0xff incremented and what follows dropped; b"\\0" (to
    the end of the keyspace) when every byte is 0xff."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def encode_compare(c: Compare) -> dict[str, Any]:
    operand = b64(c.operand) if isinstance(c.operand, bytes) else str(c.operand)
    return {
        "key": b64(c.key),
        "target": c.target.value,
        "result": _RESULTS[c.op],
        _OPERAND_FIELD[c.target]: operand,
    }


def encode_range(key: bytes, range_end: bytes = b"", limit: int = 0) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key)}
    if range_end:
        req["range_end"] = b64(range_end)
    if limit:
        req["limit"] = str(limit)
    return req


def encode_put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        req["lease"] = str(lease)
    return req


def encode_delete(key: bytes, range_end: bytes = b"") -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key)}
    if range_end:
        req["range_end"] = b64(range_end)
    return req


def encode_op(op: Op) -> dict[str, Any]:
    if op.kind == "put":
        return {"request_put": encode_put(op.key, op.value, op.lease)}
    if op.kind == "get":
        return {"request_range": encode_range(op.key, op.range_end)}
    return {"request_delete_range": encode_delete(op.key, op.range_end)}


def encode_txn(
    compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
) -> dict[str, Any]:
    return {
        "compare": [encode_compare(c) for c in compares],
        "success": [encode_op(o) for o in success],
        "failure": [encode_op(o) for o in failure],
    }


def decode_kv(obj: Any) -> KeyValue:
    if not isinstance(obj, dict):
        raise EtcdError(f"malformed gateway answer: key-value {obj!r}")
    return KeyValue(
        key=unb64(obj.get("key")),
        value=unb64(obj.get("value")),
        create_revision=json_int(obj, "create_revision"),
        mod_revision=json_int(obj, "mod_revision"),
        version=json_int(obj, "version"),
        lease=json_int(obj, "lease"),
    )


def decode_range(obj: dict[str, Any]) -> RangeResponse:
    kvs = obj.get("kvs") or []
    if not isinstance(kvs, list):
        raise EtcdError(f"malformed gateway answer: kvs={kvs!r}")
    return RangeResponse(
        kvs=tuple(decode_kv(kv) for kv in kvs),
        count=json_int(obj, "count"),
        more=bool(obj.get("more", False)),
    )


def header_revision(obj: dict[str, Any]) -> int:
    header = obj.get("header")
    return json_int(header, "revision") if isinstance(header, dict) else 0


def decode_txn(obj: dict[str, Any]) -> TxnResult:
    responses: list[OpResponse] = []
    raw = obj.get("responses") or []
    if not isinstance(raw, list):
        raise EtcdError(f"malformed gateway answer: responses={raw!r}")
    for item in raw:
        if not isinstance(item, dict):
            raise EtcdError(f"malformed gateway answer: txn response {item!r}")
        # An empty inner message may be absent or `{}` (zero fields are omitted).
        if "response_range" in item:
            responses.append(decode_range(item["response_range"] or {}))
        elif "response_put" in item:
            responses.append(PutResponse(header_revision(item["response_put"] or {})))
        elif "response_delete_range" in item:
            responses.append(
                DeleteResponse(json_int(item["response_delete_range"] or {}, "deleted"))
            )
        else:
            raise EtcdError(f"malformed gateway answer: unknown txn response {item!r}")
    return TxnResult(
        succeeded=bool(obj.get("succeeded", False)),
        responses=tuple(responses),
        revision=header_revision(obj),
    )


def decode_error(http_status: int, body: bytes) -> EtcdError:
    """The error of a non-200 answer: etcd's `{"error", "message", "code"}` when the body has
    it (streaming endpoints nest it: `{"error": {"message", "grpc_code"}}`)."""
    message = body[:200].decode("utf-8", "replace").strip() or f"HTTP {http_status}"
    code: int | None = None
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            obj = err
        msg = obj.get("message") or obj.get("error")
        if isinstance(msg, str) and msg:
            message = msg
        raw_code = obj.get("code", obj.get("grpc_code"))
        if isinstance(raw_code, int) and not isinstance(raw_code, bool):
            code = raw_code
    return classify_error(message, code, http_status)


def classify_error(message: str, code: int | None, http_status: int | None) -> EtcdError:
    if code in (GRPC_UNAVAILABLE, GRPC_DEADLINE_EXCEEDED) or http_status == 503:
        # "no leader", "request timed out", "leader changed": the write may have been
        # proposed already.
        return EtcdUnavailable(message, maybe_applied=True, code=code, http_status=http_status)
    if "lease not found" in message:
        return LeaseExpired(message, code=code, http_status=http_status)
    return EtcdError(message, code=code, http_status=http_status)


def decode_keepalive(body: bytes) -> int:
    """The TTL in the first message of a keepalive stream answer (0: the lease is gone)."""
    for line in body.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise EtcdError(f"malformed keepalive answer: {line[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise EtcdError(f"malformed keepalive answer: {line[:200]!r}")
        if "error" in obj:
            raise decode_error(200, line)
        result = obj.get("result")
        if not isinstance(result, dict):
            raise EtcdError(f"malformed keepalive answer: {line[:200]!r}")
        return json_int(result, "TTL")
    raise EtcdError("empty keepalive answer")


def request_size(compares: Sequence[Compare], ops: Sequence[Op]) -> int:
    """Bytes of keys and values a request carries: a lower bound of its size at etcd."""
    size = 0
    for c in compares:
        size += len(c.key) + (len(c.operand) if isinstance(c.operand, bytes) else 8)
    for o in ops:
        size += len(o.key) + len(o.value) + len(o.range_end)
    return size


def normalize_endpoint(endpoint: str) -> str:
    e = endpoint.strip().rstrip("/")
    if not e:
        raise ValueError("empty etcd endpoint")
    if "://" not in e:
        e = "http://" + e
    if not e.startswith(("http://", "https://")):
        raise ValueError(f"etcd endpoint must be http(s): {endpoint!r}")
    return e


# -- client ---------------------------------------------------------------------------------


class EtcdClient:
    """etcd v3 over its JSON gateway, for trio. Use as `async with EtcdClient([...]) as c:`.

    Args:
        endpoints: client URLs, e.g. `["http://127.0.0.1:2379"]` (`http://` may be left out).
        timeout_s: bound of every call, all endpoints tried included.
        max_request_bytes: refuse, without sending, a request whose keys and values exceed it
            (set it to etcd's --max-request-bytes; None: no check).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float = 5.0,
        max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        if isinstance(endpoints, str):
            raise TypeError("endpoints is a list of URLs, not one string")
        self._endpoints = [normalize_endpoint(e) for e in endpoints]
        if not self._endpoints:
            raise ValueError("no etcd endpoint")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be positive: {timeout_s!r}")
        self.timeout_s = timeout_s
        self.max_request_bytes = max_request_bytes
        self._preferred = 0
        self._http: httpx.AsyncClient | None = None

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    @property
    def endpoint(self) -> str:
        """The endpoint tried first: the last one that answered."""
        return self._endpoints[self._preferred]

    async def __aenter__(self) -> EtcdClient:
        if self._http is None:
            # trust_env=False: no proxy from the environment between us and etcd.
            self._http = httpx.AsyncClient(
                trust_env=False,
                headers={"content-type": "application/json"},
                limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await http.aclose()

    # -- KV ---------------------------------------------------------------------------------
    async def get(self, key: Key) -> KeyValue | None:
        k = _b(key)
        _check_key(k)
        res = decode_range(await self._call("/v3/kv/range", encode_range(k), retry=True))
        return res.kvs[0] if res.kvs else None

    async def get_prefix(self, prefix: Key, *, limit: int = 0) -> list[KeyValue]:
        """Every key starting with `prefix` (not empty), in key order; at most `limit` if > 0."""
        p = _b(prefix)
        _check_key(p)
        if limit < 0:
            raise ValueError(f"limit must be >= 0: {limit}")
        body = encode_range(p, prefix_end(p), limit)
        return list(decode_range(await self._call("/v3/kv/range", body, retry=True)).kvs)

    async def put(self, key: Key, value: Value, *, lease: int | None = None) -> int:
        """Store `value` at `key` (attached to `lease` if given). Returns the new revision.

        Raises:
            LeaseExpired: the lease does not exist.
        """
        op = Op.put(key, value, lease=lease)
        self._check_size((), (op,))
        return header_revision(
            await self._call("/v3/kv/put", encode_put(op.key, op.value, op.lease), retry=False)
        )

    async def delete(self, key: Key, *, prefix: bool = False) -> int:
        """Delete `key` (every key starting with it if `prefix`). Returns how many went."""
        op = Op.delete(key, prefix=prefix)
        obj = await self._call(
            "/v3/kv/deleterange", encode_delete(op.key, op.range_end), retry=False
        )
        return json_int(obj, "deleted")

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        """If every compare holds, run `success`, else `failure`, atomically.

        etcd refuses (EtcdError, code 3) two writes of one key in a branch and more than
        --max-txn-ops (128) ops."""
        self._check_size(compares, [*success, *failure])
        body = encode_txn(compares, success, failure)
        # A txn of reads only is safe to send again.
        read_only = all(o.kind == "get" for o in (*success, *failure))
        return decode_txn(await self._call("/v3/kv/txn", body, retry=read_only))

    # -- leases -----------------------------------------------------------------------------
    async def lease_grant(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds (etcd raises it to its minimum, 2 s with default
        election timing). Returns its id."""
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 1:
            raise ValueError(f"lease ttl must be a positive int of seconds: {ttl_s!r}")
        # Retrying may leave an unused lease behind; it expires after its ttl.
        obj = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)}, retry=True)
        lease_id = json_int(obj, "ID")
        if lease_id == 0:
            raise EtcdError(f"lease grant answered no id: {obj.get('error') or obj!r}")
        return lease_id

    async def lease_keepalive(self, lease_id: int) -> int:
        """Renew the lease once. Returns its ttl, counted from now.

        Raises:
            LeaseExpired: the lease does not exist any more.
        """
        body = await self._post("/v3/lease/keepalive", {"ID": str(lease_id)}, retry=True)
        ttl = decode_keepalive(body)
        if ttl <= 0:
            raise LeaseExpired(f"lease {lease_id:x} expired or was revoked")
        return ttl

    async def lease_time_to_live(self, lease_id: int) -> int:
        """Seconds the lease has left.

        Raises:
            LeaseExpired: the lease does not exist any more.
        """
        obj = await self._call("/v3/lease/timetolive", {"ID": str(lease_id)}, retry=True)
        ttl = json_int(obj, "TTL")
        if ttl < 0:
            raise LeaseExpired(f"lease {lease_id:x} expired or was revoked")
        return ttl

    async def lease_revoke(self, lease_id: int) -> bool:
        """Revoke the lease, deleting its keys. False when it was gone already."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease_id)}, retry=True)
        except LeaseExpired:
            return False
        return True

    # -- transport --------------------------------------------------------------------------
    def _check_size(self, compares: Sequence[Compare], ops: Sequence[Op]) -> None:
        limit = self.max_request_bytes
        if limit is not None:
            size = request_size(compares, ops)
            if size > limit:
                raise EtcdError(
                    f"etcd request too large: {size} bytes of keys and values, "
                    f"the limit is {limit} (etcd --max-request-bytes)",
                    code=GRPC_INVALID_ARGUMENT,
                )

    async def _call(self, path: str, request: dict[str, Any], *, retry: bool) -> dict[str, Any]:
        body = await self._post(path, request, retry=retry)
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise EtcdError(f"malformed gateway answer to {path}: {body[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise EtcdError(f"malformed gateway answer to {path}: {body[:200]!r}")
        return obj

    async def _post(self, path: str, request: dict[str, Any], *, retry: bool) -> bytes:
        """POST to the endpoints in turn, from the preferred one, within `timeout_s` in all.

        `retry`: the request is safe to send again, so an endpoint that took it but did not
        answer is given up for the next. Otherwise only a failure to connect moves on (the
        request was never sent); the rest raise EtcdUnavailable(maybe_applied=True)."""
        http = self._http
        if http is None:
            raise RuntimeError("EtcdClient used outside `async with`")
        payload = json.dumps(request, separators=(",", ":")).encode()
        n = len(self._endpoints)
        deadline = trio.current_time() + self.timeout_s
        failures: list[str] = []
        sent = False
        for i in range(n):
            index = (self._preferred + i) % n
            url = self._endpoints[index] + path
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            # An endpoint that accepts connections but never answers must not use up the
            # time of the others: each gets an equal share of what is left.
            share = remaining / (n - i)
            attempt_s = share if retry else remaining
            timeout = httpx.Timeout(attempt_s, connect=share, pool=share)
            answer: httpx.Response | None = None
            failure = f"no answer within {attempt_s:.2f}s"
            with trio.move_on_after(attempt_s):
                try:
                    answer = await http.post(url, content=payload, timeout=timeout)
                except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                    # Never sent: any request may go to the next endpoint.
                    failures.append(f"{url}: {exc!r}")
                    continue
                except httpx.TransportError as exc:
                    failure = repr(exc)
            if answer is None:
                failures.append(f"{url}: {failure}")
                sent = True
                if retry:
                    continue
                break
            if answer.status_code == 200:
                self._preferred = index
                return answer.content
            err = decode_error(answer.status_code, answer.content)
            if isinstance(err, EtcdUnavailable) and retry:
                failures.append(f"{url}: {err}")
                continue
            raise err
        raise EtcdUnavailable(
            f"etcd did not answer {path} within {self.timeout_s}s: " + "; ".join(failures),
            maybe_applied=sent and not retry,
        )

"""Drive the Apache RocketMQ C++ client (PyPI `rocketmq` 0.4.4) in a process of its own.

Run as `python cpp_client.py SCENARIO` with a JSON spec on stdin; the result is one JSON
object on stdout's last line. The tests (tests/compat/) run it with `sys.executable` and
`HOME` set to the test's tmp dir, so the library writes its log to
`$HOME/logs/rocketmq-cpp/` there (it reads HOME once, when a client first initialises its
logger) and a crash or a hang of the C++ library cannot take the test run with it.

Scenarios:

- `probe`: the binding imports and loads librocketmq; what it offers (for example whether it
  has a transactional producer).
- `produce`: spec `{"namesrv", "group", "sends": [SEND...]}`; each SEND is
  `{"mode": "sync"|"async"|"oneway"|"orderly"|"oneway_orderly"|"batch", "topic", "tags",
  "keys", "body_hex", "properties": {...}, "delay_level", "arg"}` (a batch has `"items":
  [SEND...]` instead of the message fields). Result: `{"results": [{"status", "msg_id",
  "offset", "sent_ms"}...]}` (`msg_id` null for the one-way modes).
- `push`: spec `{"namesrv", "group", "topic", "expression", "expect", "timeout_s",
  "settle_s", "orderly", "broadcasting", "read_properties": [...], "reconsume_later_once_if": NAME,
  "body_lengths": {KEY: LEN}}`: a PushConsumer receives until `expect` deliveries arrived
  (or `timeout_s` passed), then for `settle_s` more to see nothing else arrives. A message
  with property NAME set is answered RECONSUME_LATER at its first delivery.
  Result: `{"deliveries": [DELIVERY...], "timed_out": bool}`.
- `pull`: spec `{"namesrv", "group", "topic", "expression", "expect", "timeout_s",
  "read_properties": [...]}`: `PullConsumer.pull(topic)` rounds until `expect` messages.

A DELIVERY holds the message as the binding gives it: `topic`, `tags`, `keys`, `body_hex`,
`properties`, `reconsume_times`, `queue_id`, `queue_offset`, `msg_id`, `store_timestamp`,
`born_timestamp`, `received_ms`. The binding reads the body as a C string (`c_char_p`), so
it ends at the first NUL byte; `full_body_hex` is the library's own buffer read with the
length the test expects (`body_lengths`, by key), to check the C++ client decoded (and
inflated) every byte.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from typing import Any


def _now_ms() -> int:
    return int(time.time() * 1000)


def _b(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", errors="surrogateescape")


def probe(_spec: dict[str, Any]) -> dict[str, Any]:
    from rocketmq import client, ffi

    return {
        "platform": sys.platform,
        "library": ffi._DYLIB_PATH,
        "binding_classes": sorted(
            n for n in dir(client) if isinstance(getattr(client, n), type) and n[0].isupper()
        ),
        "transaction_producer": hasattr(client, "TransactionMQProducer"),
        "c_api_transaction": hasattr(ffi.dll, "CreateTransactionProducer"),
    }


def _message(send: dict[str, Any]) -> Any:
    from rocketmq.client import Message
    from rocketmq.ffi import dll

    msg = Message(send["topic"])
    if send.get("tags"):
        msg.set_tags(send["tags"])
    if send.get("keys"):
        msg.set_keys(send["keys"])
    for name, value in (send.get("properties") or {}).items():
        msg.set_property(name, value)
    if send.get("delay_level"):
        msg.set_delay_time_level(int(send["delay_level"]))
    body = bytes.fromhex(send.get("body_hex", ""))
    if b"\0" in body:
        # Message.set_body passes a C string (it would stop at the NUL); the C API the
        # binding loads has SetByteMessageBody(msg, data, len) for any bytes.
        status = dll.SetByteMessageBody(msg._handle, body, len(body))
        if status != 0:
            raise RuntimeError(f"SetByteMessageBody failed: {status}")
    else:
        msg.set_body(body)
    return msg


def produce(spec: dict[str, Any]) -> dict[str, Any]:
    from rocketmq.client import Producer

    producer = Producer(spec["group"], timeout=int(spec.get("send_timeout_ms", 5000)))
    producer.set_namesrv_addr(spec["namesrv"])
    if spec.get("credentials"):
        access_key, secret_key = spec["credentials"]
        producer.set_session_credentials(access_key, secret_key, "")
    producer.start()
    results: list[dict[str, Any]] = []
    try:
        for send in spec["sends"]:
            mode = send["mode"]
            sent_ms = _now_ms()
            out: dict[str, Any] = {"mode": mode, "sent_ms": sent_ms, "msg_id": None}
            if mode == "sync" and spec.get("catch_errors"):
                # A refusal is a result here (the ACL tests), not the end of the run.
                try:
                    r = producer.send_sync(_message(send))
                except Exception as exc:
                    out["error"] = f"{type(exc).__name__}: {exc}"
                    results.append(out)
                    continue
            elif mode == "sync":
                r = producer.send_sync(_message(send))
            elif mode == "orderly":
                r = producer.send_orderly(_message(send), int(send["arg"]))
            elif mode == "batch":
                r = producer.send_batch([_message(item) for item in send["items"]])
            elif mode == "oneway":
                producer.send_oneway(_message(send))
                r = None
            elif mode == "oneway_orderly":
                producer.send_oneway_orderly(_message(send), int(send["arg"]))
                r = None
            elif mode == "async":
                done = threading.Event()
                box: dict[str, Any] = {}

                def on_success(res: Any, box: dict[str, Any] = box, done: Any = done) -> None:
                    box["result"] = res
                    done.set()

                def on_error(exc: Exception, box: dict[str, Any] = box, done: Any = done) -> None:
                    box["error"] = repr(exc)
                    done.set()

                producer.send_async(_message(send), on_success, on_error)
                if not done.wait(10):
                    raise TimeoutError("send_async: no callback within 10 s")
                if "error" in box:
                    raise RuntimeError(f"send_async failed: {box['error']}")
                r = box["result"]
            else:
                raise ValueError(f"unknown send mode {mode!r}")
            if r is not None:
                out.update(status=int(r.status), msg_id=r.msg_id, offset=int(r.offset))
            results.append(out)
    finally:
        producer.shutdown()
    return {"results": results}


# The C API returns the body as `const char*` of its std::string: a second handle on the
# function with a void* result lets us read a known number of bytes from it.
def _body_reader() -> Any:
    from rocketmq.ffi import _DYLIB_PATH

    fn = ctypes.CDLL(_DYLIB_PATH).GetMessageBody
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_void_p
    return fn


def _delivery(msg: Any, spec: dict[str, Any], body_ptr: Any) -> dict[str, Any]:
    keys = _b(msg.keys)
    body = msg.body or b""
    d: dict[str, Any] = {
        "topic": msg.topic,
        "tags": _b(msg.tags),
        "keys": keys,
        "body_hex": body.hex(),
        "properties": {n: _b(msg.get_property(n)) for n in spec.get("read_properties", [])},
        "reconsume_times": int(msg.reconsume_times),
        "queue_id": int(msg.queue_id),
        "queue_offset": int(msg.queue_offset),
        "msg_id": msg.id,
        "store_timestamp": int(msg.store_timestamp),
        "born_timestamp": int(msg.born_timestamp),
        "received_ms": _now_ms(),
    }
    length = (spec.get("body_lengths") or {}).get(keys)
    if length is not None:
        ptr = body_ptr(msg._handle)
        d["full_body_hex"] = ctypes.string_at(ptr, int(length)).hex() if ptr else ""
    return d


def push(spec: dict[str, Any]) -> dict[str, Any]:
    from rocketmq.client import PushConsumer, RecvMessage
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import MessageModel, dll

    body_ptr = _body_reader()
    deliveries: list[dict[str, Any]] = []
    cond = threading.Condition()
    later_if = spec.get("reconsume_later_once_if")
    consume_success, reconsume_later = 0, 1  # the C API's CConsumeStatus

    def on_message(_consumer: Any, cmsg: Any) -> int:
        # Must not raise: ctypes would print the error and return an undefined status.
        try:
            msg = RecvMessage(cmsg)
            d = _delivery(msg, spec, body_ptr)
            later = (
                bool(later_if) and bool(msg.get_property(later_if)) and d["reconsume_times"] == 0
            )
            d["answered"] = "RECONSUME_LATER" if later else "CONSUME_SUCCESS"
        except Exception as exc:
            d = {"error": repr(exc), "answered": "RECONSUME_LATER"}
            later = True
        with cond:
            deliveries.append(d)
            cond.notify_all()
        return reconsume_later if later else consume_success

    model = MessageModel.BROADCASTING if spec.get("broadcasting") else MessageModel.CLUSTERING
    consumer = PushConsumer(spec["group"], orderly=bool(spec.get("orderly")), message_model=model)
    consumer.set_namesrv_addr(spec["namesrv"])
    if spec.get("credentials"):
        access_key, secret_key = spec["credentials"]
        consumer.set_session_credentials(access_key, secret_key, "")
    consumer.set_thread_count(int(spec.get("threads", 2)))
    if spec.get("log_level"):  # the C API's CLogLevel: 4 INFO, 5 DEBUG, 6 TRACE
        ffi_check(dll.SetPushConsumerLogLevel(consumer._handle, int(spec["log_level"])))
    # `PushConsumer.subscribe(topic, callback, expression)` of 0.4.4 ignores what the
    # callback returns (always CONSUME_SUCCESS) and, when it raises, re-raises from a
    # `finally` in the ctypes callback, so the status the library gets is undefined. Its
    # two halves, Subscribe and _register_callback, let the callback return the status.
    ffi_check(dll.Subscribe(consumer._handle, spec["topic"].encode(), spec["expression"].encode()))
    consumer._register_callback(on_message)
    consumer.start()
    timed_out = False
    try:
        deadline = time.monotonic() + float(spec["timeout_s"])
        with cond:
            while len(deliveries) < int(spec["expect"]):
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                cond.wait(left)
        time.sleep(float(spec.get("settle_s", 0)))
    finally:
        consumer.shutdown()
    with cond:
        return {"deliveries": list(deliveries), "timed_out": timed_out}


def pull(spec: dict[str, Any]) -> dict[str, Any]:
    from rocketmq.client import PullConsumer

    body_ptr = _body_reader()
    consumer = PullConsumer(spec["group"])
    consumer.set_namesrv_addr(spec["namesrv"])
    consumer.start()
    got: list[dict[str, Any]] = []
    rounds = 0
    timed_out = False
    try:
        deadline = time.monotonic() + float(spec["timeout_s"])
        while len(got) < int(spec["expect"]):
            if time.monotonic() > deadline:
                timed_out = True
                break
            rounds += 1
            # One round: every queue of the topic from the offsets the binding keeps.
            pulled = consumer.pull(spec["topic"], spec.get("expression", "*"))
            got.extend(_delivery(msg, spec, body_ptr) for msg in pulled)
            time.sleep(0.05)
    finally:
        consumer.shutdown()
    return {"deliveries": got, "rounds": rounds, "timed_out": timed_out}


SCENARIOS = {"probe": probe, "produce": produce, "push": push, "pull": pull}


def main() -> None:
    scenario = SCENARIOS[sys.argv[1]]
    spec = json.loads(sys.stdin.read() or "{}")
    result = scenario(spec)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the library's threads and static destructors have crashed
    # processes at exit; the result is out already.
    os._exit(0)


if __name__ == "__main__":
    main()

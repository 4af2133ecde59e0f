"""The dashboard's input checks, body previews and bounded history (no cluster)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from client.errors import MQClientError
from dashboard import service
from dashboard.history import History, Sample
from remoting.errors import RemotingConnectionLost


@pytest.mark.parametrize(
    ("raw", "msg"),
    [
        ("", "blank"),
        ("   ", "blank"),
        ("a b", "illegal characters"),
        ("<script>", "illegal characters"),
        ("x" * 128, "longer than"),
        ("TBW102", "conflict"),
    ],
)
def test_bad_topic_names_are_refused(raw: str, msg: str) -> None:
    with pytest.raises(service.BadInput, match=msg):
        service.topic_name(raw)


def test_topic_and_group_names_are_stripped() -> None:
    assert service.topic_name("  T_1-a%b|c ") == "T_1-a%b|c"
    assert service.group_name(" cg ") == "cg"
    with pytest.raises(service.BadInput, match="group"):
        service.group_name("g;drop")


@pytest.mark.parametrize(
    ("raw", "msg"),
    [
        (None, "required"),
        ("", "required"),
        ("x", "whole number"),
        ("1.5", "whole number"),
        ("-1", "between 0 and 10"),
        ("11", "between 0 and 10"),
        ("9" * 400, "between 0 and 10"),
    ],
)
def test_int_field_bounds(raw: str | None, msg: str) -> None:
    with pytest.raises(service.BadInput, match=msg):
        service.int_field(raw, "n", lo=0, hi=10)


def test_int_field_values_and_default() -> None:
    assert service.int_field(" 7 ", "n", lo=0, hi=10) == 7
    assert service.int_field("", "n", lo=0, hi=10, default=3) == 3


def test_timestamps() -> None:
    assert service.timestamp_ms("1700000000000") == 1_700_000_000_000
    assert service.timestamp_ms("2024-01-02 03:04:05") == 1_704_164_645_000
    assert service.timestamp_ms("2024-01-02T03:04:05+01:00") == 1_704_161_045_000
    assert service.timestamp_ms("now", now_ms=42) == 42
    for bad, msg in [
        ("", "required"),
        ("yesterday", "epoch milliseconds"),
        ("2024-13-01", "epoch milliseconds"),
        ("1" * 16, "out of range"),
        ("1969-12-31 23:59:59", "before 1970"),
    ]:
        with pytest.raises(service.BadInput, match=msg):
            service.timestamp_ms(bad)


def test_fmt_time() -> None:
    assert service.fmt_time(0) == "-"
    assert service.fmt_time(1_704_164_645_123) == "2024-01-02 03:04:05.123"
    assert service.fmt_time(2**62) == str(2**62)  # out of datetime's range: the number


def test_body_preview_text_hex_and_bounds() -> None:
    assert service.body_preview(b"") == service.BodyPreview("empty", "", 0, False)
    text = service.body_preview("héllo\n<b>".encode())
    assert (text.kind, text.text) == ("text", "héllo\n<b>")
    binary = service.body_preview(b"\x00\x01ab")
    assert binary.kind == "hex"
    assert binary.text == "00000000  00 01 61 62" + " " * 36 + "  ..ab"
    control = service.body_preview(b"a\x1b[31mred")
    assert control.kind == "hex"  # terminal escapes are not shown as text
    big = service.body_preview(b"x" * 10_000, limit=100)
    assert (big.kind, len(big.text), big.size, big.truncated) == ("text", 100, 10_000, True)
    # A cut inside a multi-byte character is still text.
    cut = service.body_preview(("é" * 60).encode(), limit=51)
    assert cut.kind == "text"
    assert cut.text == "é" * 25


def test_hex_dump_lines() -> None:
    dump = service.hex_dump(bytes(range(20)))
    lines = dump.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("00000010  10 11 12 13")


def test_system_names() -> None:
    assert service.is_system_group("CID_RMQ_SYS_TRANS")
    assert service.is_system_group(service.READER_GROUP)
    assert not service.is_system_group("cg_orders")
    assert service.is_system_topic("%RETRY%cg")
    assert service.is_system_topic("%DLQ%cg")
    assert service.is_system_topic("TBW102")
    assert not service.is_system_topic("orders")


def test_offset_table_groups() -> None:
    body = b'{"offsetTable":{"T@g1":{"0":1},"%RETRY%g2@g2":{},"bad":{}}}'
    assert service._offset_table_groups(body) == {"g1", "g2"}
    assert service._offset_table_groups(b"not json") == set()
    assert service._offset_table_groups(b"[]") == set()


def test_history_is_bounded() -> None:
    h = History(3)
    for i in range(10):
        h.add(Sample(i, float(i), 0.0, {"g": i}))
    assert [s.ts_ms for s in h.samples] == [7, 8, 9]
    assert h.to_dict()["samples"][-1] == {"ts": 9, "tpsIn": 9.0, "tpsOut": 0.0, "lag": {"g": 9}}
    with pytest.raises(ValueError):
        History(0)


class _FakeAdmin:
    """Answers running info per client id: a dict, an exception, or a wait past the bound."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def consumer_running_info(self, addr: str, group: str, client_id: str) -> object:
        self.asked.append(client_id)
        answer = self.answers[client_id]
        if answer == "silent":
            await trio.sleep(3600)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_client_statuses_take_what_each_client_gives_and_bound_the_rest() -> None:
    answers: dict[str, object] = {
        "a": {"statusTable": {"T": {"pullRT": 1.5, "pullTPS": "2", "consumeRT": "nan",
                                     "consumeOKTPS": 4, "consumeFailedTPS": None,
                                     "consumeFailedMsgs": 7}, "U": "junk"}},
        "b": {"statusTable": []},
        "c": MQClientError("bad ConsumerRunningInfo"),
        "d": RemotingConnectionLost("gone"),
        "e": "silent",
    }  # fmt: skip
    answers.update({f"z{i}": {} for i in range(20)})
    admin = _FakeAdmin(answers)

    async def main() -> tuple[list[service.ClientTopicStatus], list[str]]:
        return await service.client_statuses(admin, "G", "127.0.0.1:1", list(answers))  # type: ignore[arg-type]

    rows, notes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert rows == [service.ClientTopicStatus("a", "T", 1.5, 2.0, 0.0, 4.0, 0.0, 7)]
    assert len(admin.asked) == service.MAX_CLIENTS_ASKED
    assert notes == sorted(
        [
            "c: bad ConsumerRunningInfo",
            "d: gone",
            f"e: no answer within {service.CLIENT_ANSWER_S:.0f} s",
            f"{len(answers) - service.MAX_CLIENTS_ASKED} more clients not asked",
        ]
    )


def test_client_ids_are_checked() -> None:
    assert service.client_id(" 127.0.0.1@4242#17 ") == "127.0.0.1@4242#17"
    for bad in (None, "", "   ", "a b", "x" * 256, "a\x00b"):
        with pytest.raises(service.BadInput, match="client id"):
            service.client_id(bad)

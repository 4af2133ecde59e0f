"""Processor tables that need no sockets: pull status codes and send status codes."""

from __future__ import annotations

import pytest

from broker.processors.pull import pull_code
from broker.processors.send import _STATUS_CODES
from remoting import ResponseCode
from store.results import GetMessageStatus, PutMessageStatus

S = GetMessageStatus


@pytest.mark.parametrize(
    ("status", "offset", "code"),
    [
        (S.FOUND, 5, 0),
        (S.NO_MATCHED_MESSAGE, 5, 20),
        (S.MESSAGE_WAS_REMOVING, 5, 20),
        (S.OFFSET_FOUND_NULL, 5, 19),
        (S.OFFSET_OVERFLOW_ONE, 5, 19),
        (S.OFFSET_TOO_SMALL, 5, 21),
        (S.OFFSET_OVERFLOW_BADLY, 5, 21),
        (S.NO_MESSAGE_IN_QUEUE, 5, 21),
        (S.NO_MESSAGE_IN_QUEUE, 0, 19),
        (S.NO_MATCHED_LOGIC_QUEUE, 3, 21),
        (S.NO_MATCHED_LOGIC_QUEUE, 0, 19),
    ],
)
def test_pull_status_to_code(status: GetMessageStatus, offset: int, code: int) -> None:
    assert pull_code(status, offset) == code


def test_every_put_status_has_a_code() -> None:
    assert set(_STATUS_CODES) == set(PutMessageStatus)
    assert _STATUS_CODES[PutMessageStatus.PUT_OK][0] == ResponseCode.SUCCESS
    assert _STATUS_CODES[PutMessageStatus.FLUSH_DISK_TIMEOUT][0] == 10
    assert _STATUS_CODES[PutMessageStatus.FLUSH_SLAVE_TIMEOUT][0] == 12
    assert _STATUS_CODES[PutMessageStatus.SLAVE_NOT_AVAILABLE][0] == 11
    assert _STATUS_CODES[PutMessageStatus.MESSAGE_ILLEGAL][0] == 13
    assert _STATUS_CODES[PutMessageStatus.PROPERTIES_SIZE_EXCEEDED][0] == 13
    assert _STATUS_CODES[PutMessageStatus.SERVICE_NOT_AVAILABLE][0] == 14
    assert _STATUS_CODES[PutMessageStatus.CREATE_MAPPED_FILE_FAILED][0] == 1

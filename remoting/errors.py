"""Errors raised by the remoting layer.

Whose fault it is shows in the type (as h11 does): `FrameError` means the peer
sent bytes we cannot decode; `RemotingTimeoutError`, `RemotingConnectError` and
`RemotingConnectionLost` are transport failures seen by a caller; `RemoteError`
carries a response code and remark that the remote side answered with.
"""

from __future__ import annotations


class RemotingError(Exception):
    """Base class of every remoting error."""


class FrameError(RemotingError):
    """The byte stream is not a valid RemotingCommand frame (the codec's only error type)."""


class FrameTooLargeError(FrameError):
    """A frame's declared length is above the configured maximum."""


class RemotingConnectError(RemotingError):
    """A connection to the address could not be opened."""


class RemotingConnectionLost(RemotingError):
    """The connection closed while a request was waiting for its response."""


class RemotingTimeoutError(RemotingError):
    """No response arrived within the time the caller allowed."""


class RemotingTooManyRequestsError(RemotingError):
    """The client's cap on requests in flight was reached."""


class RemoteError(RemotingError):
    """The remote side answered with a non-success response code.

    Attributes:
        code: the ResponseCode number.
        remark: the remark text (may be empty).
    """

    def __init__(self, code: int, remark: str | None) -> None:
        self.code = code
        self.remark = remark or ""
        super().__init__(f"CODE: {code} DESC: {self.remark}")


class HeaderError(RemotingError):
    """A typed header could not be built from extFields (missing or malformed field)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"header field {field!r}: {reason}")

"""Errors raised by the client library.

`remoting.RemotingError` subclasses (timeouts, lost connections, `RemoteError`
with a response code) can also reach the caller; `MQClientError` covers what
the client itself rejects or gives up on.
"""

from __future__ import annotations


class MQClientError(Exception):
    """Base class of the client's own errors."""


class MessageValidationError(MQClientError, ValueError):
    """A message (or batch) broke a rule checked before any network call."""


class NoRouteError(MQClientError):
    """No route for a topic: it does not exist and auto-create is unavailable."""

    def __init__(self, topic: str, detail: str = "") -> None:
        self.topic = topic
        msg = (
            f"No route info of this topic: {topic}. Create it with "
            f"`mqadmin updateTopic -n <namesrv> -c <cluster> -t {topic}` "
            "or enable autoCreateTopicEnable on the broker"
        )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class SendFailedError(MQClientError):
    """Every attempt to send failed; `__cause__` is the last error."""


class ClientClosedError(MQClientError):
    """The client (or its instance) is not running."""

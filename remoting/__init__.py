"""RemotingCommand protocol over trio sockets: frames, codes, server and client.

This package knows nothing of topics or storage.
"""

from remoting._command import DEFAULT_VERSION, RemotingCommand
from remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from remoting.errors import (
    FrameError,
    FrameTooLargeError,
    HeaderError,
    RemoteError,
    RemotingConnectError,
    RemotingConnectionLost,
    RemotingError,
    RemotingTimeoutError,
    RemotingTooManyRequestsError,
)

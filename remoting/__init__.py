"""RemotingCommand protocol over trio sockets: frames, codes, server and client.

This package knows nothing of topics or storage.
"""

from remoting._command import DEFAULT_VERSION, RemotingCommand
from remoting._frame import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_frame
from remoting._header_codec import decode_header, encode_header
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

"""RemotingCommand protocol over trio sockets: frames, codes, server and client.

This package knows nothing of topics or storage.
"""

from remoting._client import RemotingClient
from remoting._command import DEFAULT_VERSION, RemotingCommand
from remoting._connection import Connection
from remoting._frame import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_frame
from remoting._header_codec import decode_header, encode_header, native
from remoting._processor import (
    Processor,
    ProcessorTable,
    Responder,
    RpcObserver,
    RunHooks,
    run_inline,
)
from remoting._server import RemotingServer
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
from remoting.tls import TlsClientSettings, TlsConfigError, TlsServerSettings

NATIVE_CODEC = native is not None
"""True when the frame and header codec run in the C extension `remoting._speedups` (built,
and TRIMQ_NO_NATIVE unset, empty or "0"); False: the pure-Python reference codec."""

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_VERSION",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "NATIVE_CODEC",
    "Connection",
    "FrameDecoder",
    "FrameError",
    "FrameTooLargeError",
    "HeaderError",
    "LanguageCode",
    "Processor",
    "ProcessorTable",
    "RemoteError",
    "RemotingClient",
    "RemotingCommand",
    "RemotingConnectError",
    "RemotingConnectionLost",
    "RemotingError",
    "RemotingServer",
    "RemotingTimeoutError",
    "RemotingTooManyRequestsError",
    "RequestCode",
    "Responder",
    "ResponseCode",
    "RpcObserver",
    "RunHooks",
    "SerializeType",
    "TlsClientSettings",
    "TlsConfigError",
    "TlsServerSettings",
    "decode_header",
    "encode_frame",
    "encode_header",
    "run_inline",
]

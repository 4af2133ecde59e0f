"""The RemotingCommand: one request or response of the RocketMQ protocol."""

from __future__ import annotations

from collections.abc import Mapping

from remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LanguageCode,
    ResponseCode,
    SerializeType,
)
from remoting.errors import RemoteError

# The MQVersion ordinal trimq reports (V4_9_8); nothing in trimq branches on the peer's
# version (it is only recorded, for the consumer and producer connection lists).
DEFAULT_VERSION = 409

Body = bytes | bytearray | memoryview


class RemotingCommand:
    """A request or a response.

    `ext_fields` holds the custom header as a string-to-string map, exactly as
    RocketMQ sends it. Typed header classes in `remoting.protocol` convert to
    and from it. `body` is opaque bytes and is never copied by the codec on
    encode beyond the one join into the frame.
    """

    __slots__ = (
        "body",
        "code",
        "ext_fields",
        "flag",
        "language",
        "opaque",
        "remark",
        "serialize_type",
        "version",
    )

    def __init__(
        self,
        code: int,
        *,
        opaque: int = 0,
        flag: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: Body | None = None,
        language: int = LanguageCode.PYTHON,
        version: int = DEFAULT_VERSION,
        serialize_type: int = SerializeType.JSON,
    ) -> None:
        self.code = code
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = ext_fields
        self.body = body
        self.language = language
        self.version = version
        self.serialize_type = serialize_type

    # -- construction -----------------------------------------------------
    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: Body | None = None,
        *,
        oneway: bool = False,
        serialize_type: int = SerializeType.MSGPACK,
    ) -> RemotingCommand:
        """A new request; the client assigns the opaque when it sends it."""
        if cls is not RemotingCommand:
            return cls(
                code,
                ext_fields=dict(ext_fields) if ext_fields is not None else None,
                body=body,
                flag=FLAG_ONEWAY if oneway else 0,
                serialize_type=serialize_type,
            )
        return new_command(
            code,
            0,
            FLAG_ONEWAY if oneway else 0,
            None,
            dict(ext_fields) if ext_fields is not None else None,
            body,
            _PYTHON,
            DEFAULT_VERSION,
            serialize_type,
        )

    def make_response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: Body | None = None,
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response flag set."""
        return new_command(
            code,
            self.opaque,
            FLAG_RESPONSE,
            remark,
            ext_fields,
            body,
            _PYTHON,
            DEFAULT_VERSION,
            self.serialize_type,
        )

    # -- flags ------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    # -- helpers ----------------------------------------------------------
    def field(self, name: str, default: str | None = None) -> str | None:
        """One extFields value, or `default`."""
        if self.ext_fields is None:
            return default
        return self.ext_fields.get(name, default)

    def raise_for_code(self, *ok: int) -> RemotingCommand:
        """Return self if `code` is SUCCESS (or one of `ok`), else raise RemoteError."""
        if self.code == ResponseCode.SUCCESS or self.code in ok:
            return self
        raise RemoteError(self.code, self.remark)

    def body_bytes(self) -> bytes:
        """The body as bytes (b"" when absent)."""
        if self.body is None:
            return b""
        return bytes(self.body)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemotingCommand):
            return NotImplemented
        return (
            self.code == other.code
            and self.opaque == other.opaque
            and self.flag == other.flag
            and self.remark == other.remark
            and (self.ext_fields or {}) == (other.ext_fields or {})
            and self.body_bytes() == other.body_bytes()
            and self.language == other.language
            and self.version == other.version
            and self.serialize_type == other.serialize_type
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = "response" if self.is_response else "request"
        size = 0 if self.body is None else len(self.body)
        return (
            f"RemotingCommand({kind} code={self.code} opaque={self.opaque} flag={self.flag}"
            f" remark={self.remark!r} ext_fields={self.ext_fields!r} body={size}B"
            f" serialize_type={self.serialize_type})"
        )


_PYTHON = int(LanguageCode.PYTHON)
_new = object.__new__


def new_command(
    code: int,
    opaque: int,
    flag: int,
    remark: str | None,
    ext_fields: dict[str, str] | None,
    body: Body | None,
    language: int,
    version: int,
    serialize_type: int,
) -> RemotingCommand:
    """A RemotingCommand from positional values, for the codecs' per-frame paths.

    Same result as the keyword constructor, cheaper: no keyword binding through
    `type.__call__` (docs/design-notes.md, "Send path shortcuts").
    """
    cmd: RemotingCommand = _new(RemotingCommand)
    cmd.code = code
    cmd.opaque = opaque
    cmd.flag = flag
    cmd.remark = remark
    cmd.ext_fields = ext_fields
    cmd.body = body
    cmd.language = language
    cmd.version = version
    cmd.serialize_type = serialize_type
    return cmd

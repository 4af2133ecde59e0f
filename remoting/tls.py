"""TLS for the remoting port: the settings of a server and of a client, and the `ssl.SSLContext`
each builds (RocketMQ's `TlsSystemConfig` / `TlsHelper`, docs/security.md "TLS").

A server runs in one of RocketMQ's three modes (`tls.server.mode`):

- ``disabled``: plain TCP only; a TLS ClientHello (first byte 0x16) is a frame far above the
  frame size limit, so the connection closes at its first bytes, as RocketMQ closes it.
- ``permissive``: plain and TLS on one port; the first byte tells them apart (0x16 is a TLS
  handshake record; a plain frame starting with it would declare more than 352 MiB).
- ``enforcing``: TLS only; a connection whose first byte is anything else is closed.

Certificates and keys are PEM files (a PKCS#8 or traditional private key, encrypted or not).
Reading them is blocking work: `load_context` runs `build_context` in a worker thread. Every
problem with a file is a `TlsConfigError` naming the setting and the file.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, cast, get_args

import structlog
import trio

from remoting.errors import RemotingError

log = structlog.get_logger()

__all__ = [
    "CLIENT_AUTH_NAMES",
    "TLS_MODE_NAMES",
    "ClientAuth",
    "TlsClientOptions",
    "TlsClientSettings",
    "TlsConfigError",
    "TlsMode",
    "TlsServerOptions",
    "TlsServerSettings",
    "accept_tls",
    "client_settings",
    "connect_tls",
    "describe_handshake_error",
    "server_settings",
    "tls_files_signature",
]

TlsMode = Literal["disabled", "permissive", "enforcing"]
ClientAuth = Literal["none", "optional", "require"]
TLS_MODE_NAMES: Final[tuple[str, ...]] = get_args(TlsMode)
CLIENT_AUTH_NAMES: Final[tuple[str, ...]] = get_args(ClientAuth)

# The first byte of a TLS connection: the record type of a handshake (ClientHello).
TLS_HANDSHAKE_BYTE: Final = 0x16

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY = b"PRIVATE KEY-----"
# PKCS#8 "ENCRYPTED PRIVATE KEY" and the traditional format's "Proc-Type: 4,ENCRYPTED".
_PEM_ENCRYPTED = b"ENCRYPTED"


class TlsConfigError(RemotingError, ValueError):
    """A TLS setting or one of its files is missing, unreadable or not what it must be."""


def _read_file(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TlsConfigError(f"{setting} {path!r}: no such file") from None
    except IsADirectoryError:
        raise TlsConfigError(f"{setting} {path!r}: is a directory, not a PEM file") from None
    except OSError as exc:
        raise TlsConfigError(f"{setting} {path!r}: cannot be read: {exc.strerror}") from None


def _check_certificates(path: str, setting: str) -> None:
    if _PEM_CERT not in _read_file(path, setting):
        raise TlsConfigError(f"{setting} {path!r}: no PEM certificate in it")


def _load_chain(
    ctx: ssl.SSLContext,
    cert_path: str,
    key_path: str | None,
    key_password: str | None,
    prefix: str,
) -> None:
    """`ctx.load_cert_chain` with an error naming the file and the cause (OpenSSL's own
    errors for these files are "PEM lib")."""
    cert_setting, key_setting = f"{prefix} cert_path", f"{prefix} key_path"
    cert = _read_file(cert_path, cert_setting)
    if _PEM_CERT not in cert:
        raise TlsConfigError(f"{cert_setting} {cert_path!r}: no PEM certificate in it")
    key_file, key_setting_used = (
        (key_path, key_setting) if key_path is not None else (cert_path, cert_setting)
    )
    key = cert if key_path is None else _read_file(key_path, key_setting)
    if _PEM_KEY not in key:
        raise TlsConfigError(f"{key_setting_used} {key_file!r}: no PEM private key in it")
    encrypted = _PEM_ENCRYPTED in key

    def password() -> str:
        # Always a callable: without one OpenSSL would prompt for the pass phrase on the
        # terminal, which blocks a server's start.
        if key_password is None:
            raise TlsConfigError(
                f"{key_setting_used} {key_file!r}: the key is encrypted; set key_password"
            )
        return key_password

    try:
        ctx.load_cert_chain(cert_path, key_path, password=password)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TlsConfigError(
                f"{key_setting_used} {key_file!r} is not the key of the certificate {cert_path!r}"
            ) from None
        if encrypted and key_password is not None:
            raise TlsConfigError(
                f"{key_setting_used} {key_file!r}: cannot decrypt the key with "
                f"key_password (wrong pass phrase?)"
            ) from None
        raise TlsConfigError(
            f"{cert_setting} {cert_path!r} / {key_setting_used} {key_file!r}: "
            f"not a usable PEM certificate and private key ({exc.reason or exc})"
        ) from None


def _load_trust(ctx: ssl.SSLContext, path: str, setting: str) -> None:
    _check_certificates(path, setting)
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"{setting} {path!r}: not usable PEM certificates ({exc.reason or exc})"
        ) from None


def describe_handshake_error(exc: BaseException) -> str:
    """Why a handshake failed, from the error trio raised (its cause is the SSL error)."""
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return cause.reason or str(cause)
    if cause is not None:
        return str(cause) or type(cause).__name__
    return str(exc) or "the peer closed the connection"


def tls_files_signature(paths: tuple[str | None, ...]) -> tuple[tuple[int, int, int], ...]:
    """What the files look like on disk (inode, size, mtime in ns; zeros when absent): a
    change means they should be read again. Blocking (stat)."""
    out: list[tuple[int, int, int]] = []
    for path in paths:
        if path is None:
            out.append((0, 0, 0))
            continue
        try:
            st = os.stat(path)
        except OSError:
            out.append((0, 0, 0))
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TlsServerSettings:
    """TLS on a `RemotingServer` (RocketMQ's `tls.server.*` properties).

    Attributes:
        mode: ``disabled`` | ``permissive`` | ``enforcing`` (`tls.server.mode`; see the module
            docstring). An unknown name is an error (RocketMQ reads it as permissive).
        cert_path: the server's certificate chain, PEM (`tls.server.certPath`); required
            unless disabled. May hold the key too.
        key_path: its private key, PEM (`tls.server.keyPath`); None: in `cert_path`.
        key_password: the key's pass phrase (`tls.server.keyPassword`).
        client_auth: ``none`` | ``optional`` | ``require`` (`tls.server.need.client.auth`):
            whether a client certificate is asked for and whether one is needed. A
            certificate sent is always verified against `trust_cert_path`.
        trust_cert_path: the CA certificates client certificates must chain to, PEM
            (`tls.server.trustCertPath`); required unless `client_auth` is ``none``. Unlike
            RocketMQ's `tls.server.authClient=false`, a client certificate is never trusted
            unverified.
        handshake_timeout_ms: time a TLS client has from the connect (enforcing) or from its
            first byte (permissive) to the end of its handshake; then the connection closes.
            In permissive mode the first byte itself is waited for as long as the server's
            idle timeout (as a plain connection is kept), or this long without one.
        reload_interval_ms: how often the certificate, key and trust files are looked at;
            changed files are loaded for new connections (RocketMQ watches them too). A file
            that does not load leaves the current ones in force. 0: never.
    """

    mode: TlsMode = "disabled"
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = field(default=None, repr=False)
    client_auth: ClientAuth = "none"
    trust_cert_path: str | None = None
    handshake_timeout_ms: int = 10_000
    reload_interval_ms: int = 5_000

    def __post_init__(self) -> None:
        mode = str(self.mode).strip().lower()
        if mode not in TLS_MODE_NAMES:
            raise TlsConfigError(
                f"TLS server mode {self.mode!r}: expected one of {', '.join(TLS_MODE_NAMES)}"
            )
        auth = str(self.client_auth).strip().lower()
        if auth not in CLIENT_AUTH_NAMES:
            raise TlsConfigError(
                f"TLS server client_auth {self.client_auth!r}: expected one of "
                f"{', '.join(CLIENT_AUTH_NAMES)}"
            )
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "client_auth", auth)
        if self.handshake_timeout_ms <= 0:
            raise TlsConfigError("TLS server handshake_timeout_ms must be > 0")
        if self.reload_interval_ms < 0:
            raise TlsConfigError("TLS server reload_interval_ms must be >= 0 (0: never)")
        if mode == "disabled":
            return
        if not self.cert_path:
            raise TlsConfigError(
                f"TLS server mode {mode} needs cert_path (the server's certificate)"
            )
        if auth != "none" and not self.trust_cert_path:
            raise TlsConfigError(
                f"TLS server client_auth {auth} needs trust_cert_path "
                "(the CA of client certificates)"
            )

    @property
    def enabled(self) -> bool:
        """Serves TLS (permissive or enforcing)."""
        return self.mode != "disabled"

    @property
    def files(self) -> tuple[str | None, ...]:
        """The files the context is built from (watched for reloads)."""
        return (self.cert_path, self.key_path, self.trust_cert_path)

    def build_context(self) -> ssl.SSLContext:
        """The server's context. Blocking (reads the files): see `load_context`.

        Raises:
            TlsConfigError: disabled, or a file is missing, unreadable or unusable.
        """
        if self.cert_path is None or not self.enabled:
            raise TlsConfigError("TLS server mode is disabled: there is no server context to build")
        # PROTOCOL_TLS_SERVER loads no CA: only `trust_cert_path` vouches for clients.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(ctx, self.cert_path, self.key_path, self.key_password, "TLS server")
        if self.client_auth != "none":
            assert self.trust_cert_path is not None
            _load_trust(ctx, self.trust_cert_path, "TLS server trust_cert_path")
            ctx.verify_mode = (
                ssl.CERT_REQUIRED if self.client_auth == "require" else ssl.CERT_OPTIONAL
            )
        return ctx

    async def load_context(self) -> ssl.SSLContext:
        """`build_context` in a worker thread."""
        return await trio.to_thread.run_sync(self.build_context)


@dataclass(frozen=True, slots=True)
class TlsClientSettings:
    """TLS on a `RemotingClient`'s connections (RocketMQ's `ClientConfig.useTLS` and
    `tls.client.*` properties).

    Attributes:
        enable: open every connection with TLS (`useTLS` / `tls.enable`); False: plain TCP
            and every other setting unused.
        trust_cert_path: the CA certificates the server's must chain to, PEM
            (`tls.client.trustCertPath`); None: the system's trust store.
        verify_server: verify the server's certificate (`tls.client.authServer`). False
            trusts any certificate, as RocketMQ's default `tls.client.authServer=false`
            does: the traffic is encrypted but the server is not authenticated (anyone on
            the path can pose as it). trimq's default is True.
        check_hostname: with `verify_server`, the certificate must also name the host
            connected to (its DNS name, or the IP address for an address given as one:
            broker addresses from routes are IP addresses). False verifies the chain only,
            as RocketMQ's Java client does.
        server_hostname: the name checked (and sent as SNI) instead of the address's host.
        cert_path, key_path, key_password: the client's certificate and key, PEM, for a
            server that asks for one (mutual TLS; `tls.client.certPath` / `keyPath` /
            `keyPassword`). `key_path` None: the key is in `cert_path`.
    """

    enable: bool = True
    trust_cert_path: str | None = None
    verify_server: bool = True
    check_hostname: bool = True
    server_hostname: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.key_path is not None and self.cert_path is None:
            raise TlsConfigError("TLS client key_path needs cert_path (the client's certificate)")
        if self.key_password is not None and self.cert_path is None:
            raise TlsConfigError("TLS client key_password needs cert_path and key_path")

    def build_context(self) -> ssl.SSLContext:
        """The client's context. Blocking (reads the files): see `load_context`.

        Raises:
            TlsConfigError: a file is missing, unreadable or unusable.
        """
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.verify_server:
            if self.trust_cert_path is not None:
                _load_trust(ctx, self.trust_cert_path, "TLS client trust_cert_path")
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
            ctx.check_hostname = self.check_hostname
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_path is not None:
            _load_chain(ctx, self.cert_path, self.key_path, self.key_password, "TLS client")
        return ctx

    async def load_context(self) -> ssl.SSLContext:
        """`build_context` in a worker thread."""
        return await trio.to_thread.run_sync(self.build_context)


class TlsServerOptions(Protocol):
    """A server configuration with the `tls_*` settings (docs/security.md, T5)."""

    @property
    def tls_mode(self) -> str: ...
    @property
    def tls_server_cert_path(self) -> str | None: ...
    @property
    def tls_server_key_path(self) -> str | None: ...
    @property
    def tls_server_key_password(self) -> str | None: ...
    @property
    def tls_server_need_client_auth(self) -> str: ...
    @property
    def tls_server_trust_cert_path(self) -> str | None: ...
    @property
    def tls_handshake_timeout_ms(self) -> int: ...
    @property
    def tls_reload_interval_ms(self) -> int: ...


class TlsClientOptions(Protocol):
    """A server configuration with the settings of its own connections (docs/security.md, T5)."""

    @property
    def tls_mode(self) -> str: ...
    @property
    def tls_enable(self) -> bool | None: ...
    @property
    def tls_client_trust_cert_path(self) -> str | None: ...
    @property
    def tls_client_verify_server(self) -> bool: ...
    @property
    def tls_client_check_hostname(self) -> bool: ...
    @property
    def tls_client_cert_path(self) -> str | None: ...
    @property
    def tls_client_key_path(self) -> str | None: ...
    @property
    def tls_client_key_password(self) -> str | None: ...


def client_settings(cfg: TlsClientOptions) -> TlsClientSettings | None:
    """The TLS settings of a server's own connections; None: plain (`tls_enable`, or when that
    is None an enforcing `tls_mode`, as RocketMQ's `tls.enable` follows the server's mode).

    Raises:
        TlsConfigError: an inconsistent combination (a key without a certificate).
    """
    on = cfg.tls_enable if cfg.tls_enable is not None else cfg.tls_mode == "enforcing"
    if not on:
        return None
    return TlsClientSettings(
        enable=True,
        trust_cert_path=cfg.tls_client_trust_cert_path,
        verify_server=cfg.tls_client_verify_server,
        check_hostname=cfg.tls_client_check_hostname,
        cert_path=cfg.tls_client_cert_path,
        key_path=cfg.tls_client_key_path,
        key_password=cfg.tls_client_key_password,
    )


def server_settings(cfg: TlsServerOptions) -> TlsServerSettings | None:
    """The server's TLS settings from its configuration; None when `tls_mode` is disabled.

    Raises:
        TlsConfigError: a bad mode or combination (e.g. a TLS mode without a certificate).
    """
    if cfg.tls_mode == "disabled":
        return None
    return TlsServerSettings(
        mode=cast("TlsMode", cfg.tls_mode),
        cert_path=cfg.tls_server_cert_path,
        key_path=cfg.tls_server_key_path,
        key_password=cfg.tls_server_key_password,
        client_auth=cast("ClientAuth", cfg.tls_server_need_client_auth),
        trust_cert_path=cfg.tls_server_trust_cert_path,
        handshake_timeout_ms=cfg.tls_handshake_timeout_ms,
        reload_interval_ms=cfg.tls_reload_interval_ms,
    )


async def accept_tls(
    stream: trio.SocketStream,
    tls: TlsServerSettings,
    context: ssl.SSLContext,
    *,
    peer: str,
    first_byte_timeout_s: float,
    port_name: str,
) -> trio.SocketStream | trio.SSLStream[trio.SocketStream] | None:
    """A new connection to a permissive or enforcing port: the stream to serve, or None once
    it is closed. TLS when its first byte is a TLS handshake record, else the plain stream
    (permissive) or a close (enforcing). The byte is peeked (MSG_PEEK), so it stays in the
    socket for the plain path. The first byte must come within `first_byte_timeout_s`; a
    permissive port's handshake then has `tls.handshake_timeout_ms` more, an enforcing one's
    shares that first deadline. Refusals are logged with `port_name` (e.g. "remoting")."""
    handshake_timeout = tls.handshake_timeout_ms / 1000
    deadline = trio.current_time() + first_byte_timeout_s
    first = b""
    with trio.move_on_at(deadline):
        try:
            first = await stream.socket.recv(1, socket.MSG_PEEK)
        except OSError as exc:
            log.debug(f"{port_name}_tls_peek_failed", peer=peer, error=str(exc))
    if not first:
        # Closed, failed, or silent too long.
        await trio.aclose_forcefully(stream)
        return None
    if first[0] != TLS_HANDSHAKE_BYTE:
        if tls.mode == "enforcing":
            log.info(f"{port_name}_plain_refused", peer=peer, reason="tls mode is enforcing")
            await trio.aclose_forcefully(stream)
            return None
        return stream
    # https_compatible: no close_notify is needed at the end; a frame cut short by a close is
    # still detected by its length.
    secured = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    if tls.mode == "permissive":
        deadline = trio.current_time() + handshake_timeout
    error: str | None = None
    with trio.move_on_at(deadline) as scope:
        try:
            await secured.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            error = describe_handshake_error(exc)
    if scope.cancelled_caught:
        error = f"no complete handshake within {tls.handshake_timeout_ms} ms"
    if error is not None:
        log.warning(f"{port_name}_tls_handshake_failed", peer=peer, error=error)
        await trio.aclose_forcefully(secured)
        return None
    return secured


async def connect_tls(
    tcp: trio.SocketStream, tls: TlsClientSettings, context: ssl.SSLContext, host: str
) -> trio.SSLStream[trio.SocketStream]:
    """TLS over a new TCP connection to `host` (the caller bounds the time).

    Raises:
        trio.BrokenResourceError: the handshake failed (its cause is the SSL error).
    """
    # The name is sent as SNI (not for an IP address) and checked against the certificate
    # when the context checks host names.
    secured = trio.SSLStream(
        tcp, context, server_hostname=tls.server_hostname or host, https_compatible=True
    )
    await secured.do_handshake()
    return secured

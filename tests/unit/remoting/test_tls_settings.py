"""`remoting.tls`: the settings' checks, and the contexts built from PEM files (errors naming
the setting and the file)."""

from __future__ import annotations

import ssl
import threading
from pathlib import Path

import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization

from remoting import TlsClientSettings, TlsConfigError, TlsServerSettings
from remoting.tls import describe_handshake_error, tls_files_signature


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    ca, other = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    stranger = other.issue_cert("localhost")
    out = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "cert.pem",
        "key": tmp_path / "key.pem",
        "both": tmp_path / "both.pem",
        "other_key": tmp_path / "other-key.pem",
        "encrypted_key": tmp_path / "encrypted-key.pem",
        "text": tmp_path / "text.pem",
    }
    ca.cert_pem.write_to_path(str(out["ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(out["cert"]))
    leaf.private_key_pem.write_to_path(str(out["key"]))
    leaf.private_key_and_cert_chain_pem.write_to_path(str(out["both"]))
    stranger.private_key_pem.write_to_path(str(out["other_key"]))
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    out["encrypted_key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        )
    )
    out["text"].write_text("hello\n")
    return {k: str(v) for k, v in out.items()}


def _server(files: dict[str, str], **kw: object) -> TlsServerSettings:
    args: dict[str, object] = {"mode": "enforcing", "cert_path": files["cert"]}
    args["key_path"] = files["key"]
    args.update(kw)
    return TlsServerSettings(**args)  # type: ignore[arg-type]


# -- settings --------------------------------------------------------------------------------


def test_modes_and_client_auth_names() -> None:
    assert not TlsServerSettings().enabled
    assert TlsServerSettings(mode=" Permissive ", cert_path="c").mode == "permissive"  # type: ignore[arg-type]
    assert TlsServerSettings(mode="ENFORCING", cert_path="c").enabled  # type: ignore[arg-type]
    with pytest.raises(TlsConfigError, match="mode 'strict'"):
        TlsServerSettings(mode="strict")  # type: ignore[arg-type]
    with pytest.raises(TlsConfigError, match="client_auth 'always'"):
        TlsServerSettings(client_auth="always")  # type: ignore[arg-type]
    # TlsConfigError is a ValueError: config loaders report it as a bad value.
    assert issubclass(TlsConfigError, ValueError)


def test_server_settings_need_their_files() -> None:
    TlsServerSettings(mode="disabled")  # nothing needed
    with pytest.raises(TlsConfigError, match="needs cert_path"):
        TlsServerSettings(mode="permissive")
    with pytest.raises(TlsConfigError, match="needs trust_cert_path"):
        TlsServerSettings(mode="enforcing", cert_path="c", client_auth="require")
    with pytest.raises(TlsConfigError, match="handshake_timeout_ms"):
        TlsServerSettings(mode="enforcing", cert_path="c", handshake_timeout_ms=0)
    with pytest.raises(TlsConfigError, match="reload_interval_ms"):
        TlsServerSettings(mode="enforcing", cert_path="c", reload_interval_ms=-1)
    with pytest.raises(TlsConfigError, match="disabled"):
        TlsServerSettings().build_context()


def test_client_settings_key_needs_certificate() -> None:
    with pytest.raises(TlsConfigError, match="key_path needs cert_path"):
        TlsClientSettings(key_path="k")
    with pytest.raises(TlsConfigError, match="key_password needs"):
        TlsClientSettings(key_password="p")


def test_passwords_stay_out_of_reprs() -> None:
    server = TlsServerSettings(mode="enforcing", cert_path="c", key_password="hunter22")
    client = TlsClientSettings(cert_path="c", key_password="hunter22")
    assert "hunter22" not in repr(server)
    assert "hunter22" not in repr(client)


# -- contexts --------------------------------------------------------------------------------


def test_server_contexts(files: dict[str, str]) -> None:
    ctx = _server(files).build_context()
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    # No CA loaded unless client certificates are checked: only trust_cert_path vouches.
    assert ctx.cert_store_stats()["x509_ca"] == 0
    both = TlsServerSettings(mode="enforcing", cert_path=files["both"]).build_context()
    assert both.verify_mode == ssl.CERT_NONE
    optional = _server(files, client_auth="optional", trust_cert_path=files["ca"])
    assert optional.build_context().verify_mode == ssl.CERT_OPTIONAL
    require = _server(files, client_auth="require", trust_cert_path=files["ca"])
    ctx = require.build_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.cert_store_stats()["x509_ca"] == 1


def test_client_contexts(files: dict[str, str]) -> None:
    ctx = TlsClientSettings(trust_cert_path=files["ca"]).build_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] == 1
    chain_only = TlsClientSettings(trust_cert_path=files["ca"], check_hostname=False)
    ctx = chain_only.build_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert not ctx.check_hostname
    insecure = TlsClientSettings(verify_server=False).build_context()
    assert insecure.verify_mode == ssl.CERT_NONE
    assert not insecure.check_hostname
    mutual = TlsClientSettings(
        trust_cert_path=files["ca"], cert_path=files["cert"], key_path=files["key"]
    )
    assert mutual.build_context().verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cert_path": "missing"}, r"TLS server cert_path '.*missing': no such file"),
        ({"key_path": "missing"}, r"TLS server key_path '.*missing': no such file"),
        ({"cert_path": "dir"}, r"is a directory"),
        ({"cert_path": "text"}, r"cert_path '.*text.pem': no PEM certificate"),
        ({"key_path": "text"}, r"key_path '.*text.pem': no PEM private key"),
        ({"key_path": "other_key"}, r"key_path '.*other-key.pem' is not the key of"),
        ({"key_path": "encrypted_key"}, r"the key is encrypted; set key_password"),
        (
            {"key_path": "encrypted_key", "key_password": "wrong"},
            r"cannot decrypt the key with key_password",
        ),
        (
            {"client_auth": "require", "trust_cert_path": "text"},
            r"trust_cert_path '.*text.pem': no PEM certificate",
        ),
        (
            {"client_auth": "require", "trust_cert_path": "missing"},
            r"trust_cert_path '.*missing': no such file",
        ),
    ],
)
def test_bad_server_files_are_named(
    files: dict[str, str], tmp_path: Path, kw: dict[str, str], message: str
) -> None:
    named = {"missing": str(tmp_path / "missing"), "dir": str(tmp_path), **files}
    settings = _server(files, **{k: named.get(v, v) for k, v in kw.items()})
    with pytest.raises(TlsConfigError, match=message):
        settings.build_context()


def test_encrypted_key_with_its_password(files: dict[str, str]) -> None:
    settings = _server(files, key_path=files["encrypted_key"], key_password="s3cret")
    assert settings.build_context().verify_mode == ssl.CERT_NONE


def test_bad_client_files_are_named(files: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match=r"TLS client trust_cert_path .*no such file"):
        TlsClientSettings(trust_cert_path=str(tmp_path / "nope")).build_context()
    with pytest.raises(TlsConfigError, match=r"TLS client cert_path .*no PEM certificate"):
        TlsClientSettings(cert_path=files["text"], key_path=files["key"]).build_context()
    with pytest.raises(TlsConfigError, match=r"TLS client key_path .*is not the key of"):
        TlsClientSettings(cert_path=files["cert"], key_path=files["other_key"]).build_context()
    # Unused without verify_server: not read.
    TlsClientSettings(trust_cert_path=str(tmp_path / "nope"), verify_server=False).build_context()


async def test_contexts_load_in_a_worker_thread(files: dict[str, str]) -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = ssl.SSLContext.load_cert_chain

    def spy(self: ssl.SSLContext, *args: object, **kw: object) -> None:
        seen.append(threading.get_ident())
        real(self, *args, **kw)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ssl.SSLContext, "load_cert_chain", spy)
        await _server(files).load_context()
        client = TlsClientSettings(cert_path=files["cert"], key_path=files["key"])
        await client.load_context()
    assert len(seen) == 2
    assert loop_thread not in seen


def test_files_signature_changes_with_the_files(files: dict[str, str], tmp_path: Path) -> None:
    paths = (files["cert"], None, str(tmp_path / "absent"))
    before = tls_files_signature(paths)
    assert before[1] == before[2] == (0, 0, 0)
    assert before == tls_files_signature(paths)
    Path(files["cert"]).write_text(Path(files["cert"]).read_text() + "\n")
    assert tls_files_signature(paths) != before


def test_describe_handshake_error() -> None:
    def wrapped(cause: BaseException) -> trio.BrokenResourceError:
        exc = trio.BrokenResourceError()
        exc.__cause__ = cause
        return exc

    verify = ssl.SSLCertVerificationError(1, "x")
    verify.verify_message = "unable to get local issuer certificate"
    assert describe_handshake_error(wrapped(verify)) == (
        "certificate verify failed: unable to get local issuer certificate"
    )
    plain = ssl.SSLError(1, "y")
    plain.reason = "WRONG_VERSION_NUMBER"
    assert describe_handshake_error(wrapped(plain)) == "WRONG_VERSION_NUMBER"
    assert describe_handshake_error(trio.BrokenResourceError()) == "the peer closed the connection"

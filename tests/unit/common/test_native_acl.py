"""common.acl_native (the ACL signature in one native call) gives the bytes of the Python path
and of the plain HMAC-SHA1 computation, and hands back to Python what it cannot encode."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import common.acl
from common.acl import SIGNATURE, AclChecker, RequestSigner, parse_acl, sign
from remoting.codes import RequestCode

pytestmark = pytest.mark.unit

native = pytest.importorskip("common.acl_native")


def _plain(fields: dict[str, str], body: bytes | None, secret: str) -> bytes:
    keys = sorted(
        (k for k in fields if k != SIGNATURE), key=lambda k: k.encode("utf-16-be", "surrogatepass")
    )
    text = "".join(fields[k] for k in keys).encode("utf-8", "replace")
    digest = hmac.new(secret.encode(), text + (body or b""), hashlib.sha1).digest()
    return base64.b64encode(digest)


def test_the_native_path_is_the_one_in_use() -> None:
    assert common.acl._NATIVE_HMAC is native.hmac_sha1_b64


@settings(max_examples=300, deadline=None)
@given(
    # Every code point but surrogates (those: the test below), keys Java sorts by UTF-16.
    fields=st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=12), max_size=10),
    body=st.one_of(st.none(), st.binary(max_size=300)),
    secret=st.text(min_size=1, max_size=40) | st.text(min_size=60, max_size=90),
)
def test_native_signature_matches_the_plain_computation(
    fields: dict[str, str], body: bytes | None, secret: str
) -> None:
    order = common.acl._order(tuple(fields))[0]
    got = native.hmac_sha1_b64(secret.encode(), fields, order, body)
    assert got == _plain(fields, body, secret)
    assert sign(fields, body, secret).encode() == got


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_any_buffer_body_signs_alike(wrap: type) -> None:
    fields = {"b": "Bench", "AccessKey": "ak", "a": "PG"}
    body = b"\x00\xff" * 600
    order = common.acl._order(tuple(fields))[0]
    assert native.hmac_sha1_b64(b"k" * 24, fields, order, wrap(body)) == _plain(
        fields, body, "k" * 24
    )


def test_what_native_cannot_encode_goes_back_to_python() -> None:
    # An unpaired surrogate has no strict UTF-8 form: None, and `sign` writes '?' as Java does.
    fields = {"a": "x\ud800y", "b": "t"}
    order = common.acl._order(tuple(fields))[0]
    assert native.hmac_sha1_b64(b"secret", fields, order, None) is None
    assert sign(fields, None, "secret").encode() == _plain(fields, None, "secret")
    # A value that is not a str, or a key of the order missing from the fields: None too.
    assert native.hmac_sha1_b64(b"s", {"a": 1}, ("a",), None) is None
    assert native.hmac_sha1_b64(b"s", {"a": "1"}, ("a", "b"), None) is None


def test_bad_arguments_raise_type_errors() -> None:
    with pytest.raises(TypeError):
        native.hmac_sha1_b64("str key", {}, (), None)
    with pytest.raises(TypeError):
        native.hmac_sha1_b64(b"k", {}, (), 12)
    with pytest.raises(TypeError):
        native.hmac_sha1_b64(b"k", {}, ())


def test_a_native_signed_request_verifies_and_a_changed_one_does_not() -> None:
    rules = parse_acl(
        "accounts:\n  - accessKey: app-user\n    secretKey: app-secret-123\n"
        "    topicPerms: ['T=PUB']\n"
    )
    checker = AclChecker(rules)
    signed = RequestSigner("app-user", "app-secret-123").sign_fields({"b": "T", "a": "PG"}, b"body")
    checker.check(RequestCode.SEND_MESSAGE_V2, signed, b"body", "127.0.0.1:1")
    # Twice: the second is served from the remembered grant, and still verifies the signature.
    checker.check(RequestCode.SEND_MESSAGE_V2, signed, b"body", "127.0.0.1:1")
    with pytest.raises(common.acl.AclError, match="signature"):
        checker.check(RequestCode.SEND_MESSAGE_V2, signed, b"bodY", "127.0.0.1:1")
    with pytest.raises(common.acl.AclError, match="signature"):
        checker.check(RequestCode.SEND_MESSAGE_V2, {**signed, "a": "PG2"}, b"body", "127.0.0.1:1")

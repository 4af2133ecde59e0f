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


# -- the whole-request fast paths: check_signed, sign_fields ----------------------------------
_RULES = (
    "accounts:\n"
    "  - accessKey: app-user\n    secretKey: app-secret-123\n"
    "    topicPerms: ['T=PUB', 'Denied=DENY']\n    groupPerms: ['G=SUB']\n"
    "  - accessKey: other-user\n    secretKey: other-secret-456\n    defaultTopicPerm: DENY\n"
)


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.acl, "_NATIVE_CHECK", None)
    monkeypatch.setattr(common.acl, "_NATIVE_SIGN", None)
    monkeypatch.setattr(common.acl, "_NATIVE_HMAC", None)


def test_the_fast_paths_are_in_use() -> None:
    assert common.acl._NATIVE_CHECK is native.check_signed
    assert common.acl._NATIVE_SIGN is native.sign_fields


@settings(max_examples=200, deadline=None)
@given(
    fields=st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["a", "b", "Signature", "AccessKey", "z", "é", "\U0001f600"])
            | st.text(min_size=1, max_size=4),
            st.text(max_size=8),
            max_size=8,
        ),
    ),
    body=st.one_of(st.none(), st.binary(max_size=200)),
    token=st.one_of(st.none(), st.text(max_size=6)),
)
def test_native_signing_gives_the_python_dict(
    fields: dict[str, str] | None, body: bytes | None, token: str | None
) -> None:
    signer = RequestSigner("app-user", "app-secret-123", security_token=token)
    native_out = signer.sign_fields(fields, body)
    native_again = signer.sign_fields(fields, body)  # the order is cached by now
    with pytest.MonkeyPatch.context() as mp:
        _python_only(mp)
        python_out = signer.sign_fields(fields, body)
    assert list(native_out.items()) == list(python_out.items())
    assert list(native_again.items()) == list(python_out.items())
    if fields is not None:
        assert fields is not native_again  # never the caller's dict


def test_check_signed_accepts_only_a_remembered_grant_with_a_valid_signature() -> None:
    checker = AclChecker(parse_acl(_RULES))
    signer = RequestSigner("app-user", "app-secret-123")
    signed = signer.sign_fields({"a": "PG", "b": "T"}, b"body")
    args = (checker._secrets, checker._granted, common.acl._FIELD_CODES, common.acl._ORDERS)
    code = int(RequestCode.SEND_MESSAGE_V2)
    assert native.check_signed(signed, b"body", code, *args) is False  # no grant yet
    checker.check(code, signed, b"body", "127.0.0.1:1")
    assert native.check_signed(signed, b"body", code, *args) is True
    assert native.check_signed(signed, memoryview(b"body"), code, *args) is True
    # Changed body, changed field, a signature of another length, a missing one: False.
    assert native.check_signed(signed, b"bodY", code, *args) is False
    assert native.check_signed({**signed, "a": "PG2"}, b"body", code, *args) is False
    assert native.check_signed({**signed, SIGNATURE: "x"}, b"body", code, *args) is False
    unsigned = {k: v for k, v in signed.items() if k != SIGNATURE}
    assert native.check_signed(unsigned, b"body", code, *args) is False
    # Another topic (not granted), another code, an unknown account: False.
    other = signer.sign_fields({"a": "PG", "b": "T2"}, b"body")
    assert native.check_signed(other, b"body", code, *args) is False
    assert native.check_signed(signed, b"body", int(RequestCode.SEND_MESSAGE), *args) is False
    stranger = RequestSigner("nobody-user", "app-secret-123").sign_fields({"b": "T"}, b"body")
    assert native.check_signed(stranger, b"body", code, *args) is False
    with pytest.raises(TypeError):
        native.check_signed(signed, b"body", code, {}, [], {}, {})


def test_a_grant_made_under_old_rules_does_not_pass_new_ones() -> None:
    checker = AclChecker(parse_acl(_RULES))
    signed = RequestSigner("app-user", "app-secret-123").sign_fields({"b": "T"}, b"x")
    code = int(RequestCode.SEND_MESSAGE_V2)
    checker.check(code, signed, b"x", "127.0.0.1:1")
    checker.check(code, signed, b"x", "127.0.0.1:1")  # the fast path
    checker.replace(parse_acl(_RULES.replace("'T=PUB'", "'T=SUB'")))
    with pytest.raises(common.acl.AclError, match="lacks PUB on topic:T "):
        checker.check(code, signed, b"x", "127.0.0.1:1")
    # A new secret: the old signature no longer verifies.
    checker.replace(parse_acl(_RULES.replace("app-secret-123", "app-secret-999")))
    with pytest.raises(common.acl.AclError, match="signature"):
        checker.check(code, signed, b"x", "127.0.0.1:1")


@settings(max_examples=150, deadline=None)
@given(
    topic=st.sampled_from(["T", "Denied", "Other", "%RETRY%G", ""]),
    code=st.sampled_from(
        [int(RequestCode.SEND_MESSAGE_V2), int(RequestCode.SEND_MESSAGE), 11, 17, 215]
    ),
    key=st.sampled_from(["app-user", "other-user", "nobody-user"]),
    secret=st.sampled_from(["app-secret-123", "other-secret-456", "wrong"]),
    body=st.one_of(st.none(), st.binary(max_size=64)),
    tamper=st.booleans(),
    repeat=st.integers(1, 3),
)
def test_native_and_python_checkers_decide_alike(
    topic: str, code: int, key: str, secret: str, body: bytes | None, tamper: bool, repeat: int
) -> None:
    fields = RequestSigner(key, secret).sign_fields(
        {"a": "PG", "b": topic, "topic": topic, "consumerGroup": "G"}, body
    )
    if tamper:
        fields["a"] = "PG-changed"

    def outcomes() -> list[str]:
        checker = AclChecker(parse_acl(_RULES))
        seen = []
        for _ in range(repeat):
            try:
                checker.check(code, fields, body, "127.0.0.1:1")
                seen.append("ok")
            except common.acl.AclError as exc:
                seen.append(exc.remark)
        return seen

    got = outcomes()
    with pytest.MonkeyPatch.context() as mp:
        _python_only(mp)
        assert got == outcomes()


class _Meddling(str):
    """A key whose comparisons empty the signing-order cache (in-process callers only: the
    network decoder makes plain str keys): the native paths must hold what they use."""

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        common.acl._ORDERS.clear()
        return str.__eq__(self, other)


def test_keys_that_empty_the_caches_mid_call_are_survived() -> None:
    checker = AclChecker(parse_acl(_RULES))
    signer = RequestSigner("app-user", "app-secret-123")
    code = int(RequestCode.SEND_MESSAGE_V2)
    for _ in range(5):
        fields = {_Meddling("b"): "T", "a": "PG", _Meddling("zz"): "v"}
        signed = signer.sign_fields(fields, b"body")
        with pytest.MonkeyPatch.context() as mp:
            _python_only(mp)
            assert list(signed.items()) == list(signer.sign_fields(fields, b"body").items())
        checker.check(code, signed, b"body", "127.0.0.1:1")
        args = (checker._secrets, checker._granted, common.acl._FIELD_CODES, common.acl._ORDERS)
        assert native.check_signed(signed, b"body", code, *args) in (True, False)

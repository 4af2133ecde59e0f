"""common.acl's fast paths give the answers of the plain computation: signing orders cached per
key set, HMAC states keyed once per secret, grants remembered per rules, white lists parsed only
when present."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import common.acl
from common.acl import (
    ACCESS_KEY,
    SIGNATURE,
    UNIQUE_KEY_QUERY,
    AclChecker,
    AclError,
    RequestSigner,
    content_to_sign,
    parse_acl,
    sign,
)
from remoting.codes import RequestCode

pytestmark = pytest.mark.unit


def _java_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _plain_content(fields: dict[str, str], body: bytes | None, skip: tuple[str, ...] = ()) -> bytes:
    """content_to_sign as docs/security.md states it, with nothing cached."""
    keys = sorted((k for k in fields if k != SIGNATURE and k not in skip), key=_java_key)
    text = "".join(fields[k] for k in keys).encode("utf-8", "replace")
    return text + (body or b"")


def _plain_sign(fields: dict[str, str], body: bytes | None, secret: str) -> str:
    digest = hmac.new(secret.encode(), _plain_content(fields, body), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


keys = st.text(min_size=1, max_size=6)
values = st.text(max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(keys, values, max_size=8),
    body=st.one_of(st.none(), st.binary(max_size=64)),
    # Past 64 UTF-8 bytes HMAC hashes the key first.
    secret=st.text(min_size=1, max_size=40) | st.text(min_size=60, max_size=90),
)
def test_cached_signing_matches_the_plain_computation(
    fields: dict[str, str], body: bytes | None, secret: str
) -> None:
    # Twice: the first call fills the caches, the second reads them.
    for _ in range(2):
        assert content_to_sign(fields, body) == _plain_content(fields, body)
        assert sign(fields, body, secret) == _plain_sign(fields, body, secret)
    out = RequestSigner("bench-ak", secret).sign_fields(fields, body)
    assert out[SIGNATURE] == _plain_sign({**fields, ACCESS_KEY: "bench-ak"}, body, secret)


def test_one_key_set_in_another_order_or_with_other_values_signs_its_own_content() -> None:
    first = {"b": "topic", "a": "group", ACCESS_KEY: "ak"}
    again = {"b": "other", "a": "pg", ACCESS_KEY: "ak2"}  # same keys, same order: cached order
    reordered = {ACCESS_KEY: "ak", "a": "group", "b": "topic"}
    assert content_to_sign(first, b"!") == b"akgrouptopic!"
    assert content_to_sign(again, b"!") == b"ak2pgother!"
    assert content_to_sign(reordered, b"!") == b"akgrouptopic!"
    assert content_to_sign({"only": "one"}, None) == b"one"
    assert content_to_sign({SIGNATURE: "x"}, b"b") == b"b"


def test_a_full_order_table_is_emptied_and_still_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.acl, "_ORDERS_MAX", 4)
    monkeypatch.setattr(common.acl, "_ORDERS", {})
    for i in range(10):
        fields = {f"k{i}": "x", f"j{i}": "y", SIGNATURE: "s"}
        assert content_to_sign(fields, None) == b"yx"
        assert len(common.acl._ORDERS) <= 4


def test_a_full_key_table_is_emptied_and_signatures_still_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(common.acl, "_KEYED_MAX", 2)
    monkeypatch.setattr(common.acl, "_KEYED", {})
    for i in range(6):
        secret = f"secret-{i}"
        assert sign({"a": "b"}, b"c", secret) == _plain_sign({"a": "b"}, b"c", secret)
        assert len(common.acl._KEYED) <= 2


@pytest.mark.parametrize("secret", ["k" * 64, "k" * 65, "\u00e9" * 40, "x"])
def test_keys_of_every_length_sign_as_the_standard_hmac(secret: str) -> None:
    fields = {"a": "pg", "b": "topic", ACCESS_KEY: "ak"}
    assert sign(fields, b"body", secret) == _plain_sign(fields, b"body", secret)


def test_a_keyed_state_is_never_advanced_by_a_signature() -> None:
    signer = RequestSigner("bench-ak", "secret-key")
    first = signer.sign_fields({"a": "1"}, b"body")
    assert signer.sign_fields({"a": "1"}, b"body") == first
    assert sign({"a": "1", ACCESS_KEY: "bench-ak"}, b"body", "secret-key") == first[SIGNATURE]


ACL = """
accounts:
  - accessKey: app-account
    secretKey: app-secret
    defaultTopicPerm: DENY
    topicPerms:
      - Allowed=PUB
  - accessKey: near-account
    secretKey: near-secret
    whiteRemoteAddress: 192.0.2.*
    defaultTopicPerm: DENY
"""
CLIENT = "198.51.100.7:40000"


def _send(topic: str, secret: str = "app-secret", ak: str = "app-account") -> dict[str, str]:
    return RequestSigner(ak, secret).sign_fields({"a": "pg", "b": topic}, b"body")


def test_a_grant_is_remembered_for_its_rules_only() -> None:
    checker = AclChecker(parse_acl(ACL))
    code = RequestCode.SEND_MESSAGE_V2
    for _ in range(2):  # granted, then from the remembered grant
        checker.check(code, _send("Allowed"), b"body", CLIENT)
    # Another resource, a wrong secret: refused each time, never remembered.
    for _ in range(2):
        with pytest.raises(AclError, match="lacks PUB on topic:Denied"):
            checker.check(code, _send("Denied"), b"body", CLIENT)
        with pytest.raises(AclError, match="signature check failed"):
            checker.check(code, _send("Allowed", "wrong-secret"), b"body", CLIENT)
    # New rules take the permission away: the grant made under the old ones is gone.
    checker.replace(parse_acl(ACL.replace("Allowed=PUB", "Allowed=DENY")))
    with pytest.raises(AclError, match="lacks PUB on topic:Allowed"):
        checker.check(code, _send("Allowed"), b"body", CLIENT)
    # And back.
    checker.replace(parse_acl(ACL))
    checker.check(code, _send("Allowed"), b"body", CLIENT)


def test_a_full_grant_set_is_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.acl, "_GRANTS_MAX", 2)
    checker = AclChecker(parse_acl(ACL.replace("Allowed=PUB", "Allowed=PUB\n      - T1=PUB")))
    for topic in ("Allowed", "T1", "Allowed", "T1"):
        checker.check(RequestCode.SEND_MESSAGE_V2, _send(topic), b"body", CLIENT)
        assert len(checker._granted) <= 2


def test_white_lists_still_apply_when_the_address_is_parsed_late() -> None:
    checker = AclChecker(parse_acl(ACL))
    unsigned = {ACCESS_KEY: "near-account", "a": "pg", "b": "Anything"}
    # The account's white-listed address passes without a signature or a permission.
    checker.check(RequestCode.SEND_MESSAGE_V2, unsigned, b"body", "192.0.2.10:5000")
    with pytest.raises(AclError, match="carries no Signature"):
        checker.check(RequestCode.SEND_MESSAGE_V2, unsigned, b"body", CLIENT)
    # A global white list passes anything from its addresses.
    open_acl = "globalWhiteRemoteAddresses:\n  - 203.0.113.*\n" + ACL
    checker = AclChecker(parse_acl(open_acl))
    checker.check(RequestCode.SEND_MESSAGE_V2, {"b": "Anything"}, None, "203.0.113.9:1")
    with pytest.raises(AclError, match="carries no AccessKey"):
        checker.check(RequestCode.SEND_MESSAGE_V2, {"b": "Anything"}, None, CLIENT)


def test_the_unique_key_flag_verifies_signed_or_not() -> None:
    checker = AclChecker(parse_acl(ACL.replace("Allowed=PUB", "Allowed=SUB")))
    fields = {"topic": "Allowed", "key": "k", UNIQUE_KEY_QUERY: "true", ACCESS_KEY: "app-account"}
    with_flag = RequestSigner("app-account", "app-secret").sign_fields(fields, None)
    without = dict(with_flag)
    del without[UNIQUE_KEY_QUERY]
    signature = RequestSigner("app-account", "app-secret").sign_fields(without, None)[SIGNATURE]
    for _ in range(2):
        checker.check(RequestCode.QUERY_MESSAGE, with_flag, None, CLIENT)
        checker.check(RequestCode.QUERY_MESSAGE, {**with_flag, SIGNATURE: signature}, None, CLIENT)

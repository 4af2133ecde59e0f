"""common.acl: plain_acl.yml parsing, address patterns, signatures, the code table, checks and
reloads (RocketMQ 4.x plain ACL)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
import trio
from structlog.testing import capture_logs

import common.acl
from common.acl import (
    ACCESS_KEY,
    NO_PERMISSION,
    ONS_CHANNEL,
    SIGNATURE,
    UNIQUE_KEY_QUERY,
    Access,
    AclChecker,
    AclError,
    AclFileError,
    AclFileWatcher,
    AclRules,
    Need,
    Perm,
    RequestSigner,
    check_permission,
    code_rule,
    code_rules,
    content_to_sign,
    host_of,
    load_acl_file,
    parse_acl,
    parse_address_pattern,
    parse_perm,
    required_access,
    sign,
)
from remoting.codes import RequestCode

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SECRET = "s3cret-Value-123"

# RocketMQ's own sample (distribution conf/plain_acl.yml), with one secret changed to SECRET.
SAMPLE = f"""
globalWhiteRemoteAddresses:
  - 198.51.100.1-99
  - 203.0.113.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
      - topicD=PUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: {SECRET}
    whiteRemoteAddress: 192.0.2.*
    # if it is admin, it could access all resources
    admin: true

  - accessKey: adminWithPerms
    secretKey: 87654321
    admin: true
    defaultTopicPerm: SUB
    topicPerms:
      - topicA=PUB

  - accessKey: brokerAccount
    secretKey: brokersecret
    broker: true
"""

CLIENT = "198.51.100.207:50000"  # not white-listed anywhere


def _rules() -> AclRules:
    return parse_acl(SAMPLE)


def _signed(
    access_key: str, secret: str, fields: dict[str, str] | None = None, body: bytes | None = None
) -> dict[str, str]:
    return RequestSigner(access_key, secret).sign_fields(fields, body)


def _refusal(checker: AclChecker, code: int, fields: dict[str, str], body: bytes | None) -> str:
    with pytest.raises(AclError) as info:
        checker.check(code, fields, body, CLIENT)
    assert info.value.code == NO_PERMISSION == 16
    assert SECRET not in info.value.remark
    assert "12345678" not in info.value.remark
    return info.value.remark


# -------------------------------------------------------------------------------------------
# The file
# -------------------------------------------------------------------------------------------
def test_rocketmq_sample_file_parses() -> None:
    rules = _rules()
    assert sorted(rules.accounts) == ["RocketMQ", "adminWithPerms", "brokerAccount", "rocketmq2"]
    assert [p.text for p in rules.global_white] == ["198.51.100.1-99", "203.0.113.*"]
    a = rules.accounts["RocketMQ"]
    assert a.secret_key == "12345678"  # a YAML number, read as text as RocketMQ does
    assert not a.admin
    assert not a.broker
    assert a.white_remote_address is None
    assert (a.default_topic_perm, a.default_group_perm) == (Perm.DENY, Perm.SUB)
    assert a.perms["topicB"] == Perm.PUB | Perm.SUB
    assert a.perms["%RETRY%groupA"] == Perm.DENY  # groups are stored as their retry topic
    assert "groupA" not in a.perms
    admin = rules.accounts["rocketmq2"]
    assert admin.admin
    assert not admin.perms
    # Absent default permissions are DENY.
    assert admin.default_topic_perm == admin.default_group_perm == Perm.DENY
    assert rules.accounts["brokerAccount"].broker
    assert rules.digest == hashlib.sha256(SAMPLE.encode()).hexdigest()


def test_secrets_stay_out_of_reprs() -> None:
    rules = _rules()
    assert SECRET not in repr(rules)
    assert SECRET not in repr(rules.accounts["rocketmq2"])
    assert SECRET not in repr(RequestSigner("rocketmq2", SECRET))


def test_no_accounts_is_a_valid_file_but_an_empty_file_is_not() -> None:
    assert parse_acl("accounts: []\n").accounts == {}
    assert parse_acl("globalWhiteRemoteAddresses: ['*']\n").accounts == {}
    with pytest.raises(AclFileError, match="the file is empty"):
        parse_acl("  \n# nothing\n")


def _account(**extra: object) -> str:
    doc = {"accessKey": "app-account", "secretKey": SECRET, **extra}
    return json.dumps({"accounts": [doc]})  # JSON is YAML


BAD_FILES: list[tuple[str, str]] = [
    ("accounts: [", r"not valid YAML at line \d+"),
    ("- a\n- b\n", "the top level must be a mapping, not list"),
    ("accounts: {a: 1}\n", r"accounts: Input should be a valid list"),
    ("acounts: []\n", r"unknown key 'acounts' \(known: globalWhiteRemoteAddresses, accounts"),
    (json.dumps({"accounts": [{"secretKey": SECRET}]}), r"accounts\[0\]: accessKey is required"),
    (
        json.dumps({"accounts": [{"accessKey": "app-account"}]}),
        r"accounts\[0\] \(accessKey 'app-account'\): secretKey is required",
    ),
    (
        json.dumps({"accounts": [{"accessKey": "short", "secretKey": SECRET}]}),
        r"accounts\[0\] \(accessKey 'short'\): accessKey: String should have at least 7",
    ),
    (
        json.dumps({"accounts": [{"accessKey": "app-account", "secretKey": "123456"}]}),
        r"\(accessKey 'app-account'\): secretKey must have at least 7 characters",
    ),
    (_account(defaultTopicPrem="PUB"), r"unknown key 'defaultTopicPrem' \(known: accessKey"),
    (_account(defaultTopicPerm="WRITE"), r"defaultTopicPerm: unknown permission 'WRITE'"),
    (_account(defaultGroupPerm="pub"), r"defaultGroupPerm: unknown permission 'pub'"),
    (_account(topicPerms=["topicA=PUBB"]), r"topicPerms\[0\] 'topicA=PUBB': unknown permission"),
    (_account(topicPerms=["topicA"]), r"topicPerms\[0\] 'topicA' is not 'name=PERM'"),
    (_account(groupPerms=["=SUB"]), r"groupPerms\[0\] '=SUB' is not 'name=PERM'"),
    (_account(groupPerms=["g=SUB=PUB"]), r"groupPerms\[0\] 'g=SUB=PUB' is not 'name=PERM'"),
    (_account(topicPerms=["t=PUB", "t=SUB"]), r"topicPerms\[1\] lists topic 't' a second time"),
    (_account(topicPerms="t=PUB"), r"topicPerms: Input should be a valid list"),
    (_account(admin="maybe"), r"admin: Input should be a valid boolean"),
    (_account(brokerClusters=["c1"]), r"brokerClusters is set but the account is not a broker"),
    (_account(broker=True, brokerClusters=[" "]), r"brokerClusters holds an empty cluster name"),
    (_account(broker=True, brokerClusters="c1"), r"brokerClusters: Input should be a valid list"),
    (
        _account(whiteRemoteAddress="198.51.100.300"),
        r"whiteRemoteAddress: '198.51.100.300' .* not an",
    ),
    (
        json.dumps({"globalWhiteRemoteAddresses": ["198.51.*"]}),
        r"globalWhiteRemoteAddresses\[0\]: '198.51.\*' must have 4 octets",
    ),
    (
        json.dumps(
            {
                "accounts": [
                    {"accessKey": "app-account", "secretKey": SECRET},
                    {"accessKey": "app-account", "secretKey": SECRET},
                ]
            }
        ),
        r"accounts\[1\] \(accessKey 'app-account'\): the accessKey is already used",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_files_are_refused_with_the_account_and_key(text: str, message: str) -> None:
    with pytest.raises(AclFileError) as info:
        parse_acl(text, "conf/plain_acl.yml")
    text_of_error = str(info.value)
    assert text_of_error.startswith("bad ACL file conf/plain_acl.yml: ")
    assert re.search(message, text_of_error), text_of_error
    assert SECRET not in text_of_error


def test_every_problem_is_listed_and_no_secret_is_shown() -> None:
    text = json.dumps(
        {
            "accounts": [
                {"accessKey": "app-account", "secretKey": "tiny", "topicPerms": ["a=X"]},
                {"accessKey": "other-account", "secretKey": SECRET, "whiteRemoteAddress": "x"},
            ]
        }
    )
    with pytest.raises(AclFileError) as info:
        parse_acl(text)
    assert len(info.value.problems) == 3
    assert "tiny" not in str(info.value)


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(AclFileError, match=r"missing.yml: cannot read it"):
        load_acl_file(tmp_path / "missing.yml")
    path = tmp_path / "plain_acl.yml"
    path.write_text(SAMPLE)
    assert load_acl_file(path).source == str(path)


# -------------------------------------------------------------------------------------------
# Address patterns (RocketMQ's RemoteAddressStrategyFactory forms)
# -------------------------------------------------------------------------------------------
PATTERNS: list[tuple[str, str, bool]] = [
    ("", "127.0.0.1", False),
    ("   ", "127.0.0.1", False),
    ("*", "8.8.8.8", True),
    ("*.*.*.*", "8.8.8.8", True),
    ("*:*:*:*:*:*:*:*", "::1", True),
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "127.0.0.2", False),
    ("127.0.0.1,127.0.0.2,127.0.0.3", "127.0.0.2", True),
    ("127.0.0.1,127.0.0.2,127.0.0.3", "127.0.0.4", False),
    ("127.0.0.{1,2,3}", "127.0.0.3", True),
    ("127.0.0.{1,2,3}", "127.0.0.0", False),
    ("192.0.2.{1}", "192.0.2.1", True),
    ("127.0.0.1-200", "127.0.0.1", True),
    ("127.0.0.1-200", "127.0.0.200", True),
    ("127.0.0.1-200", "127.0.0.0", False),
    ("127.0.0.1-200", "127.0.0.201", False),
    ("127.0.0.*", "127.0.0.255", True),
    ("127.0.0.*", "127.0.1.1", False),
    ("127.0.1-20.*", "127.0.20.7", True),
    ("127.0.1-20.*", "127.0.21.7", False),
    ("127.*.*.*", "127.200.3.4", True),
    ("127.*.*.*", "128.0.0.1", False),
    ("198.51.100.*", "198.51.100.9", True),
    # Octets after the first wildcard are checked (RocketMQ ignores them): narrower, not wider.
    ("203.0.*.5", "203.0.113.5", True),
    ("203.0.*.5", "203.0.113.6", False),
    # IPv4 clients on dual-stack sockets.
    ("127.0.0.1", "::ffff:127.0.0.1", True),
    ("127.0.0.*", "[::ffff:127.0.0.9]:4000", True),
    # IPv6, compared after expansion; range bounds are hex, as in RocketMQ.
    ("1050:0000:0000:0000:0005:0600:300c:326b", "1050::5:600:300c:326b", True),
    ("1050::0005:0600:300c:3261,1050::0005:0600:300c:3262", "1050::5:600:300c:3262", True),
    ("1050::0005:0600:300c:3261:{1,2,3}", "1050:0:0:5:600:300c:3261:2", True),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:200", True),
    ("1050::0005:0600:300c:1-200", "1050::5:600:300c:201", False),
    ("1050::0005:0600:300c:*", "1050::5:600:300c:ffff", True),
    ("1050::0005:0600:3001:*", "1050::5:600:300c:1", False),
    ("1050::0005:0600:300c:1-200:*", "1050::5:600:300c:1:abcd", True),
    ("1050::0005:0600:300c:1-200:*", "1050::5:600:300c:201:0", False),
    ("1050:0005:0600:300c:3261:*", "1050:5:600:300c:3261:9:9:9", True),
    ("1050:0005:0600:300c:3261:*", "1050:5:600:300c:3262::", False),
    ("::1", "[::1]:10911", True),
    ("127.0.0.1", "::1", False),
    ("127.0.0.*", "not-an-address", False),
]


@pytest.mark.parametrize(("pattern", "address", "expected"), PATTERNS)
def test_address_patterns(pattern: str, address: str, expected: bool) -> None:
    assert parse_address_pattern(pattern).match(address) is expected


@pytest.mark.parametrize(
    "pattern",
    [
        "256.0.0.1",
        "::1ggg",
        "127.0.0.2-1",
        "127.0.0.-1-200",
        "127.0.0.0-256",
        "127.0.0.1-",
        "*.0.0.1",
        "1-2.0.0.1",
        "198.51.*",
        "127.0.0.1,2,3}",
        "{192.0.2.1}",
        "198.51.{1}",
        "127.0.0.{}",
        "1050::5::*",
        "1050:5:600:300c:1-fffff",
        "1050:5:600:3261:1-2",
        "hostname",
        "198.51.100.1_0",
        "10.0.0.+5",
        "198.51.100.0x1-5",
        "1050::0x1-2",
    ],
)
def test_bad_address_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=re.escape(pattern.strip()[:6])):
        parse_address_pattern(pattern)


@pytest.mark.parametrize(
    ("remote", "host"),
    [
        ("192.0.2.3:10911", "192.0.2.3"),
        ("192.0.2.3", "192.0.2.3"),
        ("[::1]:9876", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("::1", "::1"),
    ],
)
def test_host_of(remote: str, host: str) -> None:
    assert host_of(remote) == host


# -------------------------------------------------------------------------------------------
# Signatures
# -------------------------------------------------------------------------------------------
def _reference(content: bytes, secret: str) -> str:
    """HmacSHA1 then Base64, written out independently of common.acl."""
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


def test_known_vector() -> None:
    # `printf RocketMQ | openssl dgst -sha1 -hmac 12345678 -binary | base64`
    assert sign({"k": "RocketMQ"}, None, "12345678") == "IUc8rrO/0gDch8CjObLQsW2rsiA="
    assert _reference(b"RocketMQ", "12345678") == "IUc8rrO/0gDch8CjObLQsW2rsiA="


def test_content_is_values_sorted_by_key_then_the_body() -> None:
    fields = {"b": "topicB", "a": "pg", ACCESS_KEY: "RocketMQ", "Z": "z", SIGNATURE: "old"}
    # Java's TreeMap: "AccessKey" < "Z" < "a" < "b"; Signature is not signed.
    assert content_to_sign(fields, b"hello") == b"RocketMQzpgtopicBhello"
    assert sign(fields, b"hello", "12345678") == _reference(b"RocketMQzpgtopicBhello", "12345678")


def test_empty_and_missing_parts() -> None:
    assert content_to_sign(None, None) == b""
    assert content_to_sign({}, b"") == b""
    assert content_to_sign({"a": ""}, None) == b""
    assert sign(None, None, "12345678") == _reference(b"", "12345678")
    # No body and an empty body sign alike (Java appends nothing for either).
    assert sign({"a": "x"}, None, "k" * 8) == sign({"a": "x"}, b"", "k" * 8)


def test_unicode_values_are_utf8_and_the_body_raw_bytes() -> None:
    body = bytes(range(256))  # not UTF-8
    fields = {"topic": "\u0442\u0435\u043c\u0430", "keys": "\u952e\u00e9", ACCESS_KEY: "RocketMQ"}
    expected = "RocketMQ\u952e\u00e9\u0442\u0435\u043c\u0430".encode() + body
    assert content_to_sign(fields, memoryview(body)) == expected
    assert sign(fields, bytearray(body), SECRET) == _reference(expected, SECRET)


def test_keys_sort_as_java_strings_utf16_not_code_points() -> None:
    # U+FB01 sorts after the surrogate pair of U+1F600 in UTF-16, before it by code point.
    fields = {"\ufb01": "ligature", "\U0001f600": "emoji"}
    assert content_to_sign(fields, None) == b"emojiligature"
    assert sorted(fields) == ["\ufb01", "\U0001f600"]


def test_signer_adds_access_key_token_and_signature_without_touching_the_input() -> None:
    template = {"b": "T", "a": "pg", SIGNATURE: "stale"}
    signer = RequestSigner("RocketMQ", "12345678", security_token="tok")
    out = signer.sign_fields(template, b"x")
    assert template == {"b": "T", "a": "pg", SIGNATURE: "stale"}
    assert out[ACCESS_KEY] == "RocketMQ"
    assert out[common.acl.SECURITY_TOKEN] == "tok"
    # AccessKey < SecurityToken < a < b
    assert out[SIGNATURE] == _reference(b"RocketMQtokpgTx", "12345678")
    # Signing again (a retried request) gives the same fields.
    assert signer.sign_fields(out, b"x") == out


class _Cmd:
    def __init__(self, ext_fields: dict[str, str] | None, body: bytes | None) -> None:
        self.ext_fields = ext_fields
        self.body = body


def test_signer_as_a_hook_replaces_the_commands_fields() -> None:
    shared = {"topic": "T"}
    cmd = _Cmd(shared, b"body")
    RequestSigner("RocketMQ", "12345678")(cmd)
    assert cmd.ext_fields is not shared
    assert shared == {"topic": "T"}
    assert cmd.ext_fields is not None
    assert cmd.ext_fields[SIGNATURE] == _reference(b"RocketMQTbody", "12345678")
    empty = _Cmd(None, None)
    RequestSigner("RocketMQ", "12345678")(empty)
    assert empty.ext_fields == {
        ACCESS_KEY: "RocketMQ",
        SIGNATURE: _reference(b"RocketMQ", "12345678"),
    }


def test_signer_needs_both_keys() -> None:
    with pytest.raises(ValueError, match="both"):
        RequestSigner("RocketMQ", "")


def _cpp_sign(
    header: dict[str, str], body: bytes, access_key: str, secret: str, channel: str = "ALIYUN"
) -> dict[str, str]:
    """rocketmq-client-cpp's ClientRPCHook: a std::map (byte order) of AccessKey, OnsChannel and
    the header fields; the values, then the body; HMAC-SHA1 with the secret, Base64. No
    SecurityToken; Signature, AccessKey and OnsChannel are added to the extFields."""
    signed = {ACCESS_KEY: access_key, ONS_CHANNEL: channel}
    for key, value in header.items():
        signed.setdefault(key, value)
    content = "".join(signed[k] for k in sorted(signed, key=str.encode)).encode() + body
    mac = hmac.new(secret.encode(), content, hashlib.sha1)
    signature = base64.b64encode(mac.digest()).decode()
    return {**header, SIGNATURE: signature, ACCESS_KEY: access_key, ONS_CHANNEL: channel}


def test_what_the_cpp_client_signs_verifies() -> None:
    checker = AclChecker(_rules())
    header = {"consumerGroup": "groupB", "topic": "topicB", "queueId": "0", "maxMsgNums": "32"}
    checker.check(11, _cpp_sign(header, b"", "RocketMQ", "12345678"), b"", CLIENT)
    # Header-less requests sign AccessKey, OnsChannel and the body only.
    hb = json.dumps({"clientID": "c", "consumerDataSet": [], "producerDataSet": []}).encode()
    checker.check(34, _cpp_sign({}, hb, "RocketMQ", "12345678"), hb, CLIENT)
    # A changed field does not.
    tampered = {**_cpp_sign(header, b"", "RocketMQ", "12345678"), "topic": "topicA"}
    assert "signature check failed" in _refusal(checker, 11, tampered, b"")


def test_cpp_client_without_credentials_passes_only_white_listed_addresses() -> None:
    # It signs every request, with AccessKey "" and an empty HMAC key.
    fields = _cpp_sign({"topic": "topicB"}, b"", "", "")
    checker = AclChecker(_rules())
    assert "carries no AccessKey" in _refusal(checker, 30, fields, b"")
    checker.check(30, fields, b"", "203.0.113.44:1234")  # a global white address


def test_unique_key_query_may_be_signed_or_not() -> None:
    checker = AclChecker(_rules())
    fields = {"topic": "topicC", "key": "k", "maxNum": "32", UNIQUE_KEY_QUERY: "true"}
    checker.check(12, _signed("RocketMQ", "12345678", fields), None, CLIENT)
    # Signed as the 4.9.8 broker rebuilds the content: without the flag.
    without = _signed(
        "RocketMQ", "12345678", {k: v for k, v in fields.items() if k != UNIQUE_KEY_QUERY}
    )
    checker.check(12, {**without, UNIQUE_KEY_QUERY: "true"}, None, CLIENT)
    # Any other field left out of the signature fails.
    assert "signature check failed" in _refusal(checker, 12, {**without, "extra": "1"}, None)


def test_signatures_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    fields = _signed("RocketMQ", "12345678", {"b": "topicB"}, b"m")
    AclChecker(_rules()).check(310, fields, b"m", CLIENT)
    assert calls == [(fields[SIGNATURE].encode(), fields[SIGNATURE].encode())]


# -------------------------------------------------------------------------------------------
# Permissions
# -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("needed", "owned", "ok"),
    [
        (Perm.PUB, Perm.PUB, True),
        (Perm.PUB, Perm.SUB, False),
        (Perm.SUB, Perm.PUB | Perm.SUB, True),
        (Perm.PUB, Perm.PUB | Perm.SUB, True),
        (Perm.PUB, Perm.DENY, False),
        (Perm.SUB, Perm.DENY | Perm.SUB, False),
        (Perm.ANY, Perm.SUB, True),
        (Perm.ANY, Perm.PUB, True),
        (Perm.ANY, Perm.DENY, False),
        (Perm.ANY, Perm(0), False),
    ],
)
def test_check_permission(needed: Perm, owned: Perm, ok: bool) -> None:
    assert check_permission(needed, owned) is ok


def test_permission_words() -> None:
    assert parse_perm(" PUB|SUB ") == parse_perm("SUB|PUB") == Perm.PUB | Perm.SUB
    assert parse_perm("DENY") == Perm.DENY
    with pytest.raises(ValueError, match="unknown permission 'PUB,SUB'"):
        parse_perm("PUB,SUB")


def _send(topic: str, group: str = "pg") -> tuple[int, dict[str, str], bytes]:
    return 310, {"a": group, "b": topic, "c": "TBW102"}, b"body"


def _pull(topic: str, group: str) -> tuple[int, dict[str, str], bytes | None]:
    return 11, {"consumerGroup": group, "topic": topic, "queueId": "0"}, None


def _heartbeat(group: str, *topics: str) -> tuple[int, dict[str, str], bytes]:
    body = {
        "clientID": "198.51.100.207@1",
        "producerDataSet": [{"groupName": "any-producer"}],
        "consumerDataSet": [
            {"groupName": group, "subscriptionDataSet": [{"topic": t} for t in topics]}
        ],
    }
    return 34, {}, json.dumps(body).encode()


def _lock(group: str, *topics: str) -> tuple[int, dict[str, str], bytes]:
    body = {
        "consumerGroup": group,
        "clientId": "c",
        "mqSet": [{"topic": t, "brokerName": "b", "queueId": 0} for t in topics],
    }
    return 41, {}, json.dumps(body).encode()


Request = tuple[int, dict[str, str], bytes | None]

# (account, request, None when allowed else a regex of the remark)
DECISIONS: list[tuple[str, Request, str | None]] = [
    # PUB on the topic for sends.
    ("RocketMQ", _send("topicB"), None),
    ("RocketMQ", _send("topicD"), None),
    ("RocketMQ", _send("topicC"), r"accessKey=RocketMQ lacks PUB on topic:topicC .*holds SUB\)"),
    ("RocketMQ", _send("topicA"), r"lacks PUB on topic:topicA .*holds DENY\)"),
    ("RocketMQ", _send("other"), r"lacks PUB on topic:other .*holds DENY by default\)"),
    ("RocketMQ", (10, {"topic": "topicD", "producerGroup": "pg"}, b""), None),
    ("RocketMQ", (320, {"b": "topicC"}, b""), r"lacks PUB on topic:topicC"),
    # A retry topic is its group: SUB on the group (groupB PUB|SUB, groupA DENY).
    ("RocketMQ", _send("%RETRY%groupB"), None),
    ("RocketMQ", _send("%RETRY%groupA"), r"lacks SUB on group:groupA .*holds DENY\)"),
    ("RocketMQ", _send("%RETRY%newGroup"), None),  # defaultGroupPerm SUB
    # Pulls: SUB on the topic and the group.
    ("RocketMQ", _pull("topicC", "groupC"), None),
    ("RocketMQ", _pull("topicD", "groupC"), r"lacks SUB on topic:topicD .*holds PUB\)"),
    ("RocketMQ", _pull("topicB", "groupA"), r"lacks SUB on group:groupA"),
    ("RocketMQ", _pull("%RETRY%groupC", "groupC"), None),
    # Offsets.
    ("RocketMQ", (15, {"consumerGroup": "groupB", "topic": "topicB"}, None), None),
    ("RocketMQ", (14, {"consumerGroup": "groupB", "topic": "topicA"}, None), r"topic:topicA"),
    ("RocketMQ", (36, {"group": "groupA", "offset": "1"}, None), r"SUB on group:groupA"),
    ("RocketMQ", (38, {"consumerGroup": "groupC"}, None), None),
    ("RocketMQ", (35, {"clientID": "c", "producerGroup": "pg"}, None), None),
    ("RocketMQ", (35, {"clientID": "c", "consumerGroup": "groupA"}, None), r"group:groupA"),
    # Queue offset reads: PUB or SUB on the topic.
    ("RocketMQ", (30, {"topic": "topicD", "queueId": "0"}, None), None),
    ("RocketMQ", (31, {"topic": "topicA", "queueId": "0"}, None), r"lacks PUB or SUB on topic"),
    # Heartbeats: consumers' groups and subscriptions; producers are not checked.
    ("RocketMQ", _heartbeat("groupB", "topicB", "topicC"), None),
    ("RocketMQ", _heartbeat("groupB", "topicB", "topicD"), r"lacks SUB on topic:topicD"),
    ("RocketMQ", _heartbeat("groupA", "topicB"), r"lacks SUB on group:groupA"),
    ("RocketMQ", (34, {}, b"{not json"), r"HEART_BEAT body is not JSON"),
    ("RocketMQ", _lock("groupC", "topicC"), None),
    ("RocketMQ", _lock("groupC", "topicA"), r"topic:topicA"),
    # A send to the trace topic passes whatever the account holds.
    ("RocketMQ", _send("RMQ_SYS_TRACE_TOPIC"), None),
    # Any account.
    ("RocketMQ", (28, {}, None), None),
    ("RocketMQ", (37, {"producerGroup": "pg"}, None), None),
    # Admin codes, broker codes and codes outside the table.
    ("RocketMQ", (17, {"topic": "T"}, None), r"code 17 \(UPDATE_AND_CREATE_TOPIC\) needs an adm"),
    ("RocketMQ", (26, {}, None), r"needs an admin account; accessKey=RocketMQ is not admin"),
    ("RocketMQ", (103, {}, b"{}"), r"code 103 \(REGISTER_BROKER\) needs a broker or admin"),
    ("RocketMQ", (54321, {}, None), r"code 54321 \(code 54321\) needs an admin account"),
    ("RocketMQ", (50, {"accessKey": "x"}, None), r"needs an admin account"),
    ("brokerAccount", (103, {}, b"{}"), None),
    ("brokerAccount", (205, {"brokerName": "b"}, None), None),
    ("brokerAccount", (9001, {}, None), None),
    ("brokerAccount", (17, {"topic": "T"}, None), r"needs an admin account"),
    ("brokerAccount", _send("topicB"), r"lacks PUB on topic:topicB .*DENY by default"),
    ("rocketmq2", (17, {"topic": "T"}, None), None),
    ("rocketmq2", (103, {}, b"{}"), None),
    ("rocketmq2", (54321, {}, None), None),
    # An admin without topicPerms/groupPerms may use everything; with them, they are checked.
    ("rocketmq2", _send("anything"), None),
    ("rocketmq2", _pull("anything", "anyGroup"), None),
    ("adminWithPerms", _send("topicA"), None),
    ("adminWithPerms", _send("topicB"), r"accessKey=adminWithPerms lacks PUB on topic:topicB"),
    ("adminWithPerms", _pull("topicB", "g"), r"lacks SUB on group:g .*DENY by default"),
    ("adminWithPerms", (17, {"topic": "T"}, None), None),
]


@pytest.mark.parametrize(("account", "request_", "refusal"), DECISIONS)
def test_decisions(account: str, request_: Request, refusal: str | None) -> None:
    rules = _rules()
    secret = rules.accounts[account].secret_key
    code, fields, body = request_
    signed = _signed(account, secret, fields, body)
    checker = AclChecker(rules)
    if refusal is None:
        checker.check(code, signed, body, CLIENT)
    else:
        assert re.search(refusal, _refusal(checker, code, signed, body))


def test_refusals_before_permissions() -> None:
    checker = AclChecker(_rules())
    assert "carries no AccessKey" in _refusal(checker, 310, {"b": "topicB"}, b"")
    assert "carries no AccessKey" in _refusal(checker, 310, {ACCESS_KEY: ""}, b"")
    remark = _refusal(checker, 310, _signed("Nobody1", "12345678", {"b": "topicB"}), b"")
    assert "no account has accessKey=Nobody1" in remark
    unsigned = {"b": "topicB", ACCESS_KEY: "RocketMQ"}
    assert "carries no Signature" in _refusal(checker, 310, unsigned, b"")
    wrong = _signed("RocketMQ", "wrong-secret", {"b": "topicB"}, b"")
    remark = _refusal(checker, 310, wrong, b"")
    assert remark.startswith("ACL: signature check failed for accessKey=RocketMQ")
    # The body is signed.
    good = _signed("RocketMQ", "12345678", {"b": "topicB"}, b"one")
    assert "signature check failed" in _refusal(checker, 310, good, b"two")
    with pytest.raises(AclError):
        checker.check(310, None, None, CLIENT)


def test_white_lists() -> None:
    checker = AclChecker(_rules())
    # A global white-listed address passes with no AccessKey at all, for any code.
    checker.check(17, None, None, "198.51.100.5:4000")
    checker.check(310, {"b": "topicA"}, b"", "203.0.113.1")
    # An account's own white list passes that account without a signature or a permission
    # check (RocketMQ's rule): rocketmq2 white-lists 192.0.2.*.
    checker.check(17, {ACCESS_KEY: "rocketmq2"}, None, "192.0.2.20:5555")
    assert "carries no Signature" in _refusal(checker, 17, {ACCESS_KEY: "rocketmq2"}, None)
    # Another account from that address gets no such pass.
    with pytest.raises(AclError, match="carries no Signature"):
        checker.check(17, {ACCESS_KEY: "RocketMQ"}, None, "192.0.2.20:5555")


def test_route_reads_open_or_closed() -> None:
    closed = AclChecker(_rules())
    assert "carries no AccessKey" in _refusal(closed, 105, {"topic": "T"}, None)
    closed.check(105, _signed("RocketMQ", "12345678", {"topic": "T"}), None, CLIENT)
    opened = AclChecker(_rules(), open_route_reads=True)
    opened.check(105, {"topic": "T"}, None, CLIENT)
    opened.check(106, None, None, CLIENT)
    # Only route reads are open.
    assert "carries no AccessKey" in _refusal(opened, 103, {}, b"{}")
    assert "carries no AccessKey" in _refusal(opened, 216, {"topic": "T"}, None)


def test_required_access_reads_the_resources() -> None:
    req = required_access(*_pull("topicC", "groupC"))
    assert req.access is Access.RESOURCES
    assert req.needs == (Need("%RETRY%groupC", Perm.SUB), Need("topicC", Perm.SUB))
    assert [n.describe() for n in req.needs] == ["group:groupC", "topic:topicC"]
    assert required_access(*_heartbeat("g", "t1", "t2")).needs == (
        Need("%RETRY%g", Perm.SUB),
        Need("t1", Perm.SUB),
        Need("t2", Perm.SUB),
    )
    # A missing field adds nothing (the processor refuses the request).
    assert required_access(310, {}, b"").needs == ()
    assert required_access(17, {"topic": "T"}, None).access is Access.ADMIN


def test_every_request_code_is_in_the_table_under_its_name() -> None:
    rules = code_rules()
    missing = [c.name for c in RequestCode if c.value not in rules]
    assert missing == []
    assert {c.value: c.name for c in RequestCode} == {c: r.name for c, r in rules.items()}


def _served_codes() -> set[str]:
    broker = (ROOT / "broker" / "controller.py").read_text()
    start = broker.index("def _register_processors")
    names = set(
        re.findall(r"\bR\.([A-Z0-9_]+)", broker[start : broker.index("\n    def ", start + 1)])
    )
    namesrv = (ROOT / "namesrv" / "processors.py").read_text()
    names |= set(re.findall(r"RequestCode\.([A-Z0-9_]+):", namesrv))
    return names


def test_every_code_the_servers_serve_is_classified_explicitly() -> None:
    served = _served_codes()
    assert {"SEND_MESSAGE_V2", "PULL_MESSAGE", "REGISTER_BROKER"} <= served
    by_name = {r.name: r for r in code_rules().values()}
    assert sorted(served - set(by_name)) == []


def test_codes_outside_the_table_need_an_admin() -> None:
    for code in (0, 50, 51, 52, 53, 54, 999, 3001, 200050, -1):
        assert code not in code_rules()
        assert code_rule(code).access is Access.ADMIN


def test_table_kinds() -> None:
    kinds = {c: code_rule(c).access for c in (10, 11, 17, 25, 26, 103, 105, 215, 318, 9001)}
    assert kinds == {
        10: Access.RESOURCES,
        11: Access.RESOURCES,
        17: Access.ADMIN,
        25: Access.ADMIN,
        26: Access.ADMIN,
        103: Access.BROKER,
        105: Access.ROUTE,
        215: Access.ADMIN,
        318: Access.ADMIN,
        9001: Access.BROKER,
    }
    # RocketMQ 4.9.8's admin codes stay admin codes.
    for code in (17, 25, 215, 200, 207):
        assert code_rule(code).access is Access.ADMIN


# -------------------------------------------------------------------------------------------
# Reloading
# -------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _all_log_levels(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`capture_logs` sees common.acl's events whatever logging set-up an earlier test left."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    monkeypatch.setattr(common.acl, "log", structlog.get_logger())
    try:
        yield
    finally:
        structlog.configure(**saved)


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(3600):
        while not condition():
            await trio.sleep(0.05)


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


async def test_watcher_reloads_and_keeps_the_last_good_file(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(SAMPLE)
    checker = AclChecker(load_acl_file(path))
    watcher = AclFileWatcher(path, checker, interval_s=1.0)
    send = _signed("RocketMQ", "12345678", {"b": "topicC"}, b"")
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            await _until(lambda: watcher.polls >= 2)
            assert checker.generation == 0  # same content: nothing reloaded

            # A good change: topicC becomes PUB.
            path.write_text(SAMPLE.replace("topicC=SUB", "topicC=PUB"))
            await _until(lambda: checker.generation == 1)
            checker.check(310, send, b"", CLIENT)

            # A bad file: refused, the last good rules stay, the error is logged once.
            polls = watcher.polls
            path.write_text(SAMPLE.replace("topicC=SUB", "topicC=PUBLISH").replace("DENY\n", "X\n"))
            await _until(lambda: watcher.last_error is not None)
            await _until(lambda: watcher.polls >= polls + 5)
            assert checker.generation == 1
            checker.check(310, send, b"", CLIENT)
            failed = _events(logs, "acl_reload_failed")
            assert len(failed) == 1
            assert "unknown permission 'X'" in str(failed[0]["error"])
            assert failed[0]["log_level"] == "error"

            # Deleted: still the last good rules.
            path.unlink()
            await _until(lambda: "cannot read" in (watcher.last_error or ""))
            checker.check(310, send, b"", CLIENT)

            # Fixed: reloaded (topicC back to SUB, so the send is refused again).
            path.write_text(SAMPLE)
            await _until(lambda: checker.generation == 2)
            assert watcher.last_error is None
            assert "lacks PUB on topic:topicC" in _refusal(checker, 310, send, b"")
            nursery.cancel_scope.cancel()
    reloaded = _events(logs, "acl_reloaded")
    assert [e["accounts"] for e in reloaded] == [4, 4]
    assert all(SECRET not in str(e) for e in logs)


class _FrozenStatPath:
    """A path whose stat never moves (a file system with coarse timestamps), `age_s` old."""

    def __init__(self, real: Path, age_s: float) -> None:
        self.real = real
        st = real.stat()
        mtime = time.time_ns() - int(age_s * 1e9)
        self._stat = SimpleNamespace(
            st_mtime_ns=mtime, st_ctime_ns=mtime, st_size=st.st_size, st_ino=st.st_ino
        )

    def stat(self) -> SimpleNamespace:
        return self._stat

    def read_bytes(self) -> bytes:
        return self.real.read_bytes()


@pytest.mark.parametrize(("age_s", "seen"), [(0.1, True), (60.0, False)])
async def test_a_rewrite_that_leaves_the_stat_alone(
    tmp_path: Path, age_s: float, seen: bool
) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(SAMPLE)
    checker = AclChecker(load_acl_file(path))
    watcher = AclFileWatcher(path, checker, interval_s=1.0)
    watcher.path = _FrozenStatPath(path, age_s)  # type: ignore[assignment]
    assert await watcher.poll() is False
    # Same size, same stat: seen while the file is recent (written within the last 2 s, so
    # the watcher reads it again), not once it is old (then only a stat change makes a read).
    path.write_text(SAMPLE.replace("topicD=PUB", "topicD=SUB"))
    assert await watcher.poll() is seen
    expected = Perm.SUB if seen else Perm.PUB
    assert checker.rules.accounts["RocketMQ"].perms["topicD"] == expected


def test_watcher_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        AclFileWatcher(tmp_path / "x", AclChecker(_rules()), interval_s=0)

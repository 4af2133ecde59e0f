"""RocketMQ 4.x plain ACL (ACL 1.0): the accounts file, request signatures, permission checks.

Shared by the broker and the NameServer (which check requests) and the client (which signs
them); docs/security.md describes the model and how a server wires it in. In short:

- `load_acl_file(path)` / `parse_acl(text)` read a `plain_acl.yml` in RocketMQ's format into an
  immutable `AclRules` (raising `AclFileError`, which names the account and the key at fault and
  never shows a secret);
- `AclChecker(rules).check(code, ext_fields, body, remote_ip)` returns or raises `AclError`
  (`code` NO_PERMISSION, `remark` naming the account, the resource and the missing permission);
- `AclFileWatcher(path, checker).run()` (a trio task) reloads the file when it changes and keeps
  the last good rules when the new file is bad;
- `RequestSigner(access_key, secret_key)` signs a request as RocketMQ's `AclClientRPCHook` does:
  the extFields sorted by key, their values concatenated, the body appended, HMAC-SHA1 with the
  secret key, Base64 into the `Signature` field.

Nothing here imports remoting: a request is seen as its code, its extFields map and its body.
"""

from __future__ import annotations

import binascii
import enum
import hashlib
import hmac
import ipaddress
import json
import os
import re
import time
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

import structlog
import trio
import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

__all__ = [
    "ACCESS_KEY",
    "DEFAULT_RELOAD_INTERVAL_S",
    "MIN_KEY_LENGTH",
    "NO_PERMISSION",
    "ONS_CHANNEL",
    "RETRY_GROUP_TOPIC_PREFIX",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "TRACE_TOPIC",
    "UNIQUE_KEY_QUERY",
    "Access",
    "Account",
    "AccountModel",
    "AclChecker",
    "AclError",
    "AclFileError",
    "AclFileModel",
    "AclFileWatcher",
    "AclRules",
    "AddressPattern",
    "CheckableCommand",
    "CodeRule",
    "Need",
    "Perm",
    "RequestSigner",
    "Requirement",
    "SignableCommand",
    "check_permission",
    "code_rule",
    "code_rules",
    "content_to_sign",
    "host_of",
    "load_acl_file",
    "parse_acl",
    "parse_address_pattern",
    "parse_perm",
    "required_access",
    "server_check",
    "sign",
]

log = structlog.get_logger()

# extFields names of RocketMQ's SessionCredentials (and the C++ client's channel field).
ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
ONS_CHANNEL = "OnsChannel"
# QUERY_MESSAGE's unique-key flag: 4.9.x clients sign it, the 4.9.8 broker leaves it out of the
# content it checks; both forms are accepted.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
NO_PERMISSION = 16
# RocketMQ refuses keys of 6 characters or fewer (`AclConstants.ACCESS_KEY_MIN_LENGTH`).
MIN_KEY_LENGTH = 7
# RocketMQ's AclFileWatchService polls every 5 s.
DEFAULT_RELOAD_INTERVAL_S = 5.0
# A file changed this recently is read again at the next poll (its stat may not move again).
_RACY_NS = 2_000_000_000

Body = bytes | bytearray | memoryview


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
class AclError(Exception):
    """A request refused by the ACL: answer it with `code` and `remark`.

    The remark names the account, the resource and the permission missing; it never holds a
    secret key.
    """

    def __init__(self, remark: str, code: int = NO_PERMISSION) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class AclFileError(ValueError):
    """An ACL file that cannot be used; `problems` lists each account and key at fault."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"bad ACL file {source}: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# Permissions
# ---------------------------------------------------------------------------------------------
class Perm(enum.IntFlag):
    """RocketMQ's permission bits (`org.apache.rocketmq.acl.common.Permission`)."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERM_WORDS: dict[str, Perm] = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}


def parse_perm(text: str) -> Perm:
    """`DENY`, `PUB`, `SUB`, `PUB|SUB` or `SUB|PUB` (surrounding blanks ignored).

    Raises:
        ValueError: any other word (RocketMQ silently reads it as DENY; here it is an error in
            the file, so a typo is seen).
    """
    perm = _PERM_WORDS.get(text.strip())
    if perm is None:
        raise ValueError(f"unknown permission {text.strip()!r} (DENY, PUB, SUB or PUB|SUB)")
    return perm


def perm_name(perm: Perm) -> str:
    """`PUB`, `SUB`, `PUB|SUB`, `DENY`; a need of ANY reads `PUB or SUB`; nothing: `none`."""
    if perm & Perm.DENY:
        return "DENY"
    if perm & Perm.ANY:
        return "PUB or SUB"
    names = [n for n, bit in (("PUB", Perm.PUB), ("SUB", Perm.SUB)) if perm & bit]
    return "|".join(names) or "none"


def check_permission(needed: Perm, owned: Perm) -> bool:
    """RocketMQ's `Permission.checkPermission`: DENY owned refuses everything; a need of ANY
    is met by PUB or SUB; otherwise one bit in common is enough."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


# ---------------------------------------------------------------------------------------------
# Remote address patterns (RocketMQ's RemoteAddressStrategyFactory)
# ---------------------------------------------------------------------------------------------
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _normalise(addr: IPAddress) -> IPAddress:
    # An IPv4 client on a dual-stack socket shows as ::ffff:a.b.c.d; patterns name it as IPv4.
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def host_of(remote: str) -> str:
    """The host of `ip`, `ip:port` or `[v6]:port` (an IPv6 zone is dropped)."""
    text = remote.strip()
    if text.startswith("["):
        end = text.find("]")
        host = text[1:end] if end > 0 else text[1:]
    elif text.count(":") == 1:
        host = text.partition(":")[0]
    else:
        host = text
    return host.partition("%")[0]


def _parse_ip(remote: str) -> IPAddress | None:
    try:
        return _normalise(ipaddress.ip_address(host_of(remote)))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One white-list pattern, as written (`text`), and what it matches.

    Forms (RocketMQ's): blank (nothing), `*` / `*.*.*.*` / `*:*:*:*:*:*:*:*` (everything), one
    address, `a,b,c` or `192.168.0.{1,2}` (a set of addresses), and a `*` or `n-m` range in an
    octet (`192.168.1.*`, `10.1.1.10-20`; IPv6: hex groups, `2001:db8:0:0:0:0:0:1-ff`).
    """

    text: str
    kind: str  # "none", "all", "set" or "range"
    addresses: frozenset[IPAddress] = frozenset()
    # For "range": IPv4 or IPv6, and (low, high) per octet / group.
    version: int = 4
    ranges: tuple[tuple[int, int], ...] = ()

    def match(self, remote: str | IPAddress | None) -> bool:
        """Whether the address (`ip`, `ip:port`, `[v6]:port` or a parsed one) matches."""
        if self.kind == "none":
            return False
        if self.kind == "all":
            return True
        addr = _parse_ip(remote) if isinstance(remote, str) else remote
        if addr is None:
            return False
        if self.kind == "set":
            return addr in self.addresses
        if addr.version != self.version:
            return False
        if self.version == 4:
            parts: Iterable[int] = addr.packed
        else:
            packed = addr.packed
            parts = (packed[i] << 8 | packed[i + 1] for i in range(0, 16, 2))
        return all(lo <= p <= hi for p, (lo, hi) in zip(parts, self.ranges, strict=True))


_ALL_WORDS = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})


def _exact_address(text: str, pattern: str) -> IPAddress:
    try:
        return _normalise(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise ValueError(
            f"{text.strip()!r} in {pattern!r} is not an IPv4 or IPv6 address"
        ) from None


_DECIMAL = re.compile(r"[0-9]{1,3}")
_HEX = re.compile(r"[0-9a-fA-F]{1,4}")


def _range_part(part: str, maximum: int, base: int, pattern: str) -> tuple[int, int]:
    part = part.strip()
    if part == "*":
        return 0, maximum
    lo_text, dash, hi_text = (p.strip() for p in part.partition("-"))
    number = _DECIMAL if base == 10 else _HEX
    if not number.fullmatch(lo_text) or (dash and not number.fullmatch(hi_text)):
        raise ValueError(f"{part!r} in {pattern!r} is not a number, a range n-m or '*'")
    lo = int(lo_text, base)
    hi = int(hi_text, base) if dash else lo
    if not (0 <= lo <= hi <= maximum):
        raise ValueError(f"range {part!r} in {pattern!r} must satisfy 0 <= n <= m <= {maximum}")
    return lo, hi


def _ipv6_groups(text: str, pattern: str) -> list[str]:
    if text.count("::") > 1:
        raise ValueError(f"{pattern!r} has more than one '::'")
    if "::" in text:
        left, right = text.split("::")
        head = left.split(":") if left else []
        tail = right.split(":") if right else []
        fill = 8 - len(head) - len(tail)
        if fill < 1:
            raise ValueError(f"{pattern!r} has more than 8 groups")
        return [*head, *(["0"] * fill), *tail]
    groups = text.split(":")
    if len(groups) < 8 and groups[-1].strip() == "*":
        # `1050:5:600:300c:3261:*`: a trailing `*` stands for the groups left out (RocketMQ).
        groups += ["*"] * (8 - len(groups))
    if len(groups) != 8:
        raise ValueError(f"{pattern!r} must have 8 groups, use '::', or end with '*'")
    return groups


def _range_pattern(text: str) -> AddressPattern:
    if ":" in text:
        version, parts, maximum, base = 6, _ipv6_groups(text, text), 0xFFFF, 16
    else:
        version, parts, maximum, base = 4, text.split("."), 255, 10
        if len(parts) != 4:
            raise ValueError(f"{text!r} must have 4 octets")
    first = parts[0].strip()
    if first == "*" or "-" in first:
        raise ValueError(
            f"{text!r}: a wildcard or range in the first {'octet' if version == 4 else 'group'}"
            " is not accepted (use '*' alone for every address)"
        )
    ranges = tuple(_range_part(p, maximum, base, text) for p in parts)
    return AddressPattern(text, "range", version=version, ranges=ranges)


def parse_address_pattern(text: str) -> AddressPattern:
    """A white-list pattern (`globalWhiteRemoteAddresses` entry or `whiteRemoteAddress`).

    Octets (IPv4) or groups (IPv6) after a wildcard are checked too: `192.168.*.5` matches the
    addresses ending in `.5` only (RocketMQ ignores what follows the first wildcard octet).

    Raises:
        ValueError: not one of the forms RocketMQ accepts; the message says why.
    """
    raw = text.strip()
    if not raw:
        return AddressPattern(text, "none")
    if raw in _ALL_WORDS:
        return AddressPattern(text, "all")
    if raw.endswith("}"):
        start = raw.rfind("{")
        prefix = raw[:start]
        if start < 0 or not prefix.endswith((".", ":")):
            raise ValueError(f"{raw!r}: a {{a,b}} list must be the last octet or group")
        items = [i.strip() for i in raw[start + 1 : -1].split(",") if i.strip()]
        if not items:
            raise ValueError(f"{raw!r}: the {{}} list is empty")
        return AddressPattern(
            text, "set", frozenset(_exact_address(prefix + i, raw) for i in items)
        )
    if "," in raw:
        items = [i for i in raw.split(",") if i.strip()]
        return AddressPattern(text, "set", frozenset(_exact_address(i, raw) for i in items))
    if "*" in raw or "-" in raw:
        return _range_pattern(raw)
    return AddressPattern(text, "set", frozenset({_exact_address(raw, raw)}))


# ---------------------------------------------------------------------------------------------
# The accounts file
# ---------------------------------------------------------------------------------------------
class AccountModel(BaseModel):
    """One entry of `accounts` as written in plain_acl.yml (RocketMQ's PlainAccessConfig).

    `broker` and `brokerClusters` are trimq's additions: the account a broker signs its
    NameServer and replication requests with (REGISTER_BROKER, ...), and the clusters it may
    register brokers in (absent: every cluster). RocketMQ ignores unknown keys, so a file using
    them still loads there. Absent default permissions are DENY, as in RocketMQ.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, coerce_numbers_to_str=True
    )

    access_key: str = Field(alias="accessKey", min_length=MIN_KEY_LENGTH)
    secret_key: SecretStr = Field(alias="secretKey")
    white_remote_address: str | None = Field(default=None, alias="whiteRemoteAddress")
    admin: bool = False
    broker: bool = False
    broker_clusters: list[str] | None = Field(default=None, alias="brokerClusters")
    default_topic_perm: str | None = Field(default=None, alias="defaultTopicPerm")
    default_group_perm: str | None = Field(default=None, alias="defaultGroupPerm")
    topic_perms: list[str] | None = Field(default=None, alias="topicPerms")
    group_perms: list[str] | None = Field(default=None, alias="groupPerms")


class AclFileModel(BaseModel):
    """plain_acl.yml's top level. `dataVersion` (rewritten by RocketMQ's ACL admin requests)
    is accepted and not used."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, coerce_numbers_to_str=True
    )

    global_white_remote_addresses: list[str] | None = Field(
        default=None, alias="globalWhiteRemoteAddresses"
    )
    accounts: list[AccountModel] | None = None
    data_version: list[Any] | None = Field(default=None, alias="dataVersion")


@dataclass(frozen=True, slots=True)
class Account:
    """One account, ready for checks. `perms` holds topics by name and groups as
    `%RETRY%<group>` (RocketMQ's form, so a retry topic is its group's resource)."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern | None
    admin: bool
    broker: bool
    default_topic_perm: Perm
    default_group_perm: Perm
    perms: Mapping[str, Perm]
    broker_clusters: frozenset[str] | None = None
    """The clusters a broker account may register brokers in; None: every cluster."""

    def is_broker_of(self, cluster: str) -> bool:
        """A broker account whose `brokerClusters` (if any) include `cluster`."""
        return self.broker and (self.broker_clusters is None or cluster in self.broker_clusters)


@dataclass(frozen=True, slots=True)
class AclRules:
    """One loaded ACL file: the accounts by access key, the global white list, and the file's
    SHA-256 (what a reload compares)."""

    accounts: Mapping[str, Account]
    global_white: tuple[AddressPattern, ...]
    source: str = "plain_acl.yml"
    digest: str = ""

    def __repr__(self) -> str:
        return (
            f"AclRules(source={self.source!r}, accounts={sorted(self.accounts)!r},"
            f" global_white={[p.text for p in self.global_white]!r})"
        )


_ACCOUNT_KEYS = ", ".join(f.alias or n for n, f in AccountModel.model_fields.items())
_TOP_KEYS = ", ".join(f.alias or n for n, f in AclFileModel.model_fields.items())


def _account_label(raw: object, index: int) -> str:
    key = raw.get("accessKey") if isinstance(raw, dict) else None
    return f"accounts[{index}]" + (f" (accessKey {str(key)!r})" if key is not None else "")


def _describe_validation(exc: ValidationError, raw: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    accounts = raw.get("accounts")
    for err in exc.errors():
        loc = list(err["loc"])
        where = ""
        if len(loc) >= 2 and loc[0] == "accounts" and isinstance(loc[1], int):
            item = accounts[loc[1]] if isinstance(accounts, list) else None
            where = _account_label(item, loc[1])
            rest = loc[2:]
            keys = _ACCOUNT_KEYS
        else:
            rest = loc
            keys = _TOP_KEYS
        name = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in rest)
        name = name.replace(".[", "[")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {str(rest[-1])!r} (known: {keys})"
        elif err["type"] == "missing":
            msg = f"{name} is required"
        else:
            # The pydantic message, never the input: the input may be a secret key.
            msg = f"{name}: {err['msg']}" if name else err["msg"]
        problems.append(f"{where}: {msg}" if where else msg)
    return problems


def _resource_perms(
    entries: list[str] | None, group: bool, what: str, perms: dict[str, Perm], problems: list[str]
) -> None:
    kind = "groupPerms" if group else "topicPerms"
    for i, entry in enumerate(entries or ()):
        name, eq, word = entry.partition("=")
        name = name.strip()
        if not eq or not name or "=" in word:
            problems.append(f"{what}: {kind}[{i}] {entry!r} is not 'name=PERM'")
            continue
        try:
            perm = parse_perm(word)
        except ValueError as exc:
            problems.append(f"{what}: {kind}[{i}] {entry!r}: {exc}")
            continue
        key = RETRY_GROUP_TOPIC_PREFIX + name if group else name
        if key in perms:
            problems.append(
                f"{what}: {kind}[{i}] lists {'group' if group else 'topic'} {name!r} a second time"
            )
            continue
        perms[key] = perm


def _compile_account(model: AccountModel, what: str, problems: list[str]) -> Account | None:
    before = len(problems)
    secret = model.secret_key.get_secret_value()
    if len(secret) < MIN_KEY_LENGTH:
        problems.append(f"{what}: secretKey must have at least {MIN_KEY_LENGTH} characters")
    defaults: list[Perm] = []
    for key, value in (
        ("defaultTopicPerm", model.default_topic_perm),
        ("defaultGroupPerm", model.default_group_perm),
    ):
        try:
            defaults.append(Perm.DENY if value is None else parse_perm(value))
        except ValueError as exc:
            problems.append(f"{what}: {key}: {exc}")
            defaults.append(Perm.DENY)
    perms: dict[str, Perm] = {}
    _resource_perms(model.topic_perms, False, what, perms, problems)
    _resource_perms(model.group_perms, True, what, perms, problems)
    white: AddressPattern | None = None
    if model.white_remote_address is not None:
        try:
            white = parse_address_pattern(model.white_remote_address)
        except ValueError as exc:
            problems.append(f"{what}: whiteRemoteAddress: {exc}")
    if model.broker_clusters is not None:
        if not model.broker:
            problems.append(f"{what}: brokerClusters is set but the account is not a broker one")
        if any(not c.strip() for c in model.broker_clusters):
            problems.append(f"{what}: brokerClusters holds an empty cluster name")
    if len(problems) != before:
        return None
    return Account(
        access_key=model.access_key,
        secret_key=secret,
        white_remote_address=white,
        admin=model.admin,
        broker=model.broker,
        default_topic_perm=defaults[0],
        default_group_perm=defaults[1],
        perms=perms,
        broker_clusters=None if model.broker_clusters is None else frozenset(model.broker_clusters),
    )


def parse_acl(data: str | bytes, source: str = "plain_acl.yml") -> AclRules:
    """Read a plain_acl.yml (RocketMQ's format) into `AclRules`.

    An empty file is an error, not an empty account list: it is what a half-written file looks
    like, and reloading it would refuse every client. Write `accounts: []` for no accounts.

    Raises:
        AclFileError: not YAML, not the format, or a bad value; every problem is listed with
            its account and key, and no secret key is shown.
    """
    raw_bytes = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    digest = hashlib.sha256(raw_bytes).hexdigest()
    try:
        raw = yaml.safe_load(raw_bytes)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise AclFileError(source, [f"not valid YAML{where}: {problem}"]) from None
    if raw is None:
        raise AclFileError(source, ["the file is empty (write 'accounts: []' for no accounts)"])
    if not isinstance(raw, dict):
        raise AclFileError(source, [f"the top level must be a mapping, not {type(raw).__name__}"])
    try:
        model = AclFileModel.model_validate(raw)
    except ValidationError as exc:
        raise AclFileError(source, _describe_validation(exc, raw)) from None
    problems: list[str] = []
    white: list[AddressPattern] = []
    for i, text in enumerate(model.global_white_remote_addresses or ()):
        try:
            white.append(parse_address_pattern(text))
        except ValueError as exc:
            problems.append(f"globalWhiteRemoteAddresses[{i}]: {exc}")
    accounts: dict[str, Account] = {}
    for i, item in enumerate(model.accounts or ()):
        what = _account_label({"accessKey": item.access_key}, i)
        if item.access_key in accounts:
            problems.append(f"{what}: the accessKey is already used by an earlier account")
            continue
        account = _compile_account(item, what, problems)
        if account is not None:
            accounts[item.access_key] = account
    if problems:
        raise AclFileError(source, problems)
    return AclRules(accounts=accounts, global_white=tuple(white), source=source, digest=digest)


def load_acl_file(path: str | os.PathLike[str]) -> AclRules:
    """`parse_acl` of a file (blocking I/O: run it in a worker thread from async code).

    Raises:
        AclFileError: the file cannot be read, or `parse_acl` refuses it.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AclFileError(str(path), [f"cannot read it: {exc.strerror or exc}"]) from None
    return parse_acl(data, str(path))


# ---------------------------------------------------------------------------------------------
# Signatures (AclClientRPCHook / AclUtils.combineRequestContent / AclSigner)
# ---------------------------------------------------------------------------------------------
def _java_order(key: str) -> bytes:
    # Java's TreeMap<String> compares UTF-16 code units; big-endian UTF-16 bytes compare alike.
    return key.encode("utf-16-be", "surrogatepass")


def _signing_keys(keys: Iterable[str], excluded: Container[str]) -> list[str]:
    """`keys` but `excluded`, in the order Java sorts strings."""
    out = [k for k in keys if k not in excluded]
    if all(k.isascii() for k in out):
        out.sort()
    else:
        out.sort(key=_java_order)
    return out


_Values = Callable[[Mapping[str, str]], Iterable[str]]


def _values_in_order(keys: tuple[str, ...]) -> _Values:
    """What reads the values of a request with exactly `keys` (`Signature` among them or not)
    in signing order."""
    order = _signing_keys(keys, (SIGNATURE,))
    if len(order) >= 2:
        return itemgetter(*order)
    if order:
        only = order[0]
        return lambda values: (values[only],)
    return lambda values: ()


# Signing orders by a request's keys as they arrive: the requests of one kind from one sender
# carry the same keys in the same order, so each kind is sorted once. The keys come from the
# network, so the table is emptied whenever it reaches _ORDERS_MAX entries. Each entry: the
# keys in signing order (`Signature` left out) and what reads their values in that order.
_ORDERS: dict[tuple[str, ...], tuple[tuple[str, ...], _Values]] = {}
_ORDERS_MAX = 1024


def _order(keys: tuple[str, ...]) -> tuple[tuple[str, ...], _Values]:
    entry = _ORDERS.get(keys)
    if entry is None:
        if len(_ORDERS) >= _ORDERS_MAX:
            _ORDERS.clear()
        entry = _ORDERS[keys] = (
            tuple(_signing_keys(keys, (SIGNATURE,))),
            _values_in_order(keys),
        )
    return entry


_NativeHmac = Callable[[bytes, dict[str, str], tuple[str, ...], Body | None], bytes | None]


def _native_hmac() -> _NativeHmac | None:
    """`common.acl_native.hmac_sha1_b64` when built and wanted (TRIMQ_NO_NATIVE unset, "" or
    "0"), else None: the Python path below, which gives the same bytes."""
    flag = os.environ.get("TRIMQ_NO_NATIVE", "")
    if flag and flag != "0":
        return None
    try:
        from common.acl_native import hmac_sha1_b64
    except ImportError:
        return None
    return hmac_sha1_b64


_NATIVE_HMAC = _native_hmac()


def _native_fast_paths() -> tuple[
    Callable[..., bool] | None, Callable[..., dict[str, str] | None] | None
]:
    """common.acl_native's whole-request check and signing, on the signature's switch."""
    if _NATIVE_HMAC is None:
        return None, None
    from common.acl_native import check_signed, sign_fields

    return check_signed, sign_fields


_NATIVE_CHECK, _NATIVE_SIGN = _native_fast_paths()


def _signed_text(fields: Mapping[str, str] | None, skip: Iterable[str] = ()) -> bytes:
    """The part of `content_to_sign` before the body."""
    values = fields or {}
    if skip:
        text = "".join([values[k] for k in _signing_keys(values, {SIGNATURE, *skip})])
    else:
        text = "".join(_order(tuple(values))[1](values))
    # Java's String.getBytes(UTF_8) writes '?' for an unpaired surrogate; "replace" does too.
    return text.encode("utf-8", "replace")


def content_to_sign(
    fields: Mapping[str, str] | None, body: Body | None, *, skip: Iterable[str] = ()
) -> bytes:
    """What is signed: the values of `fields` (not `Signature`, nor the keys in `skip`), in
    the order of their keys as Java sorts strings, concatenated and encoded as UTF-8, then the
    body's bytes as they are."""
    text = _signed_text(fields, skip)
    return text + bytes(body) if body else text


class _HmacSha1:
    """HMAC-SHA1 (RFC 2104) with one key: SHA-1 states that have hashed the key's inner and
    outer pads, copied for each message instead of hashing the pads again (all in C: what
    `hmac.HMAC.copy` does, without its Python wrapper)."""

    __slots__ = ("_inner", "_outer", "key")

    def __init__(self, key: bytes) -> None:
        self.key = key
        if len(key) > _SHA1_BLOCK:
            key = hashlib.sha1(key).digest()
        key = key.ljust(_SHA1_BLOCK, b"\0")
        self._inner = hashlib.sha1(key.translate(_IPAD))
        self._outer = hashlib.sha1(key.translate(_OPAD))

    def signature(self, text: bytes, body: Body | None) -> bytes:
        """Base64 (ASCII bytes) of the HMAC of `text` followed by `body`, hashed where they lie."""
        inner = self._inner.copy()
        inner.update(text)
        if body:
            inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return binascii.b2a_base64(outer.digest(), newline=False)


_SHA1_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))

# Keyed HMAC-SHA1 states by secret key. Emptied whenever it reaches _KEYED_MAX.
_KEYED: dict[str, _HmacSha1] = {}
_KEYED_MAX = 256


def _keyed(secret_key: str) -> _HmacSha1:
    state = _KEYED.get(secret_key)
    if state is None:
        if len(_KEYED) >= _KEYED_MAX:
            _KEYED.clear()
        state = _KEYED[secret_key] = _HmacSha1(secret_key.encode("utf-8"))
    return state


def _signature(
    state: _HmacSha1, fields: Mapping[str, str] | None, body: Body | None, skip: Iterable[str] = ()
) -> bytes:
    """Base64 of HmacSHA1 over `content_to_sign(fields, body, skip=skip)` with `state`'s key,
    as ASCII bytes; the body is hashed where it lies (not copied after the fields' text).

    Natively in one call when it can (`_NATIVE_HMAC`: a dict of str values with strict UTF-8
    forms); otherwise, and for `skip`, in Python."""
    if _NATIVE_HMAC is not None and not skip and type(fields) is dict:
        mac = _NATIVE_HMAC(state.key, fields, _order(tuple(fields))[0], body)
        if mac is not None:
            return mac
    return state.signature(_signed_text(fields, skip), body)


def _hmac_base64(content: bytes, secret_key: str) -> str:
    return _keyed(secret_key).signature(content, None).decode("ascii")


def sign(fields: Mapping[str, str] | None, body: Body | None, secret_key: str) -> str:
    """Base64(HmacSHA1(secret_key, content_to_sign(fields, body))): the `Signature` value of a
    request whose extFields (with `AccessKey`) are `fields`."""
    return _signature(_keyed(secret_key), fields, body).decode("ascii")


class SignableCommand(Protocol):
    """What a signer needs of a request (remoting's RemotingCommand has it)."""

    ext_fields: dict[str, str] | None

    @property
    def body(self) -> Body | None: ...


class CheckableCommand(Protocol):
    """What a checker reads of a request (remoting's RemotingCommand has it)."""

    @property
    def code(self) -> int: ...
    @property
    def ext_fields(self) -> Mapping[str, str] | None: ...
    @property
    def body(self) -> Body | None: ...


class RequestSigner:
    """RocketMQ's `AclClientRPCHook`: call it on each request just before it is sent.

    It sets `AccessKey` (and `SecurityToken` when given) and then `Signature` over every
    extField and the body. It replaces `ext_fields` with a new dict, so a dict shared between
    requests (a cached header template) is never changed, and a request sent again is signed
    again.
    """

    __slots__ = ("_secret", "_state", "access_key", "security_token")

    def __init__(
        self, access_key: str, secret_key: str, *, security_token: str | None = None
    ) -> None:
        if not access_key or not secret_key:
            raise ValueError("a request signer needs both an access key and a secret key")
        self.access_key = access_key
        self._secret = secret_key
        # HMAC-SHA1 keyed once; each request's signature starts from a copy.
        self._state = _HmacSha1(secret_key.encode("utf-8"))
        self.security_token = security_token

    def sign_fields(self, fields: Mapping[str, str] | None, body: Body | None) -> dict[str, str]:
        """`fields` plus `AccessKey` (`SecurityToken`) and the `Signature` over them and body."""
        if _NATIVE_SIGN is not None and (fields is None or type(fields) is dict):
            # One native call; None (an order not cached yet, a value without strict UTF-8):
            # the Python path below, which caches the order.
            signed = _NATIVE_SIGN(
                self._state.key, self.access_key, self.security_token, fields, body, _ORDERS
            )
            if signed is not None:
                return signed
        out = dict(fields) if fields else {}
        out.pop(SIGNATURE, None)
        out[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            out[SECURITY_TOKEN] = self.security_token
        out[SIGNATURE] = _signature(self._state, out, body).decode("ascii")
        return out

    def __call__(self, cmd: SignableCommand) -> None:
        cmd.ext_fields = self.sign_fields(cmd.ext_fields, cmd.body)

    def __repr__(self) -> str:
        return f"RequestSigner(access_key={self.access_key!r})"


# ---------------------------------------------------------------------------------------------
# What each request code needs
# ---------------------------------------------------------------------------------------------
class Access(enum.Enum):
    """The kind of account a request code needs on a server with ACL on."""

    ROUTE = "route"
    """A NameServer route read: open, or any account when the server is set so."""
    ACCOUNT = "account"
    """Any account with a valid signature; no resource is checked."""
    RESOURCES = "resources"
    """A valid account holding a permission on each topic / group the request names."""
    BROKER = "broker"
    """A broker account (`broker: true`) or an admin account."""
    ADMIN = "admin"
    """An admin account (`admin: true`). Every code not in the table needs this."""


@dataclass(frozen=True, slots=True)
class Need:
    """One permission a request needs: on a topic, or on a group written `%RETRY%<group>`."""

    resource: str
    perm: Perm

    @property
    def is_group(self) -> bool:
        return self.resource.startswith(RETRY_GROUP_TOPIC_PREFIX)

    def describe(self) -> str:
        """`topic:<name>` or `group:<name>`."""
        if self.is_group:
            return f"group:{self.resource[len(RETRY_GROUP_TOPIC_PREFIX) :]}"
        return f"topic:{self.resource}"


@dataclass(frozen=True, slots=True)
class Requirement:
    """What one request needs: the kind of account and, for RESOURCES, the permissions."""

    access: Access
    needs: tuple[Need, ...] = ()


Fields = Mapping[str, str]
Extractor = Callable[[Fields, Body | None], list[Need]]


@dataclass(frozen=True, slots=True)
class CodeRule:
    """A request code's entry in the ACL table: its RocketMQ name, the kind of account it
    needs and, for RESOURCES, where its topics and groups are read from (`reads`, for docs)."""

    code: int
    name: str
    access: Access
    extract: Extractor | None = None
    reads: str = ""
    field: str | None = None
    """The one extField whose value alone decides `extract`'s needs (a topic or a group), when
    there is one: the checker remembers grants by that value without extracting again."""


def _topic(name: str | None, perm: Perm) -> list[Need]:
    if not name:
        return []
    # A retry topic is its group's resource: sending to or reading it needs SUB on the group
    # (RocketMQ 5.x; 4.9.8 looked at the producer group instead).
    if name.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return [Need(name, Perm.SUB)]
    return [Need(name, perm)]


def _group(name: str | None) -> list[Need]:
    return [Need(RETRY_GROUP_TOPIC_PREFIX + name, Perm.SUB)] if name else []


class _FieldNeeds:
    """The needs named by one extField: a topic with `perm`, or (`perm` None) a group."""

    __slots__ = ("key", "perm")

    def __init__(self, key: str, perm: Perm | None) -> None:
        self.key = key
        self.perm = perm

    def __call__(self, fields: Fields, body: Body | None) -> list[Need]:
        if self.perm is None:
            return _group(fields.get(self.key))
        return _topic(fields.get(self.key), self.perm)


def _field_topic(key: str, perm: Perm) -> Extractor:
    return _FieldNeeds(key, perm)


def _field_group(key: str) -> Extractor:
    return _FieldNeeds(key, None)


def _group_and_topic(fields: Fields, body: Body | None) -> list[Need]:
    return _group(fields.get("consumerGroup")) + _topic(fields.get("topic"), Perm.SUB)


def _json_body(body: Body | None, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(body or b"{}"))
    except (ValueError, RecursionError):
        raise AclError(
            f"ACL: the {what} body is not JSON; its groups and topics are unknown"
        ) from None
    if not isinstance(doc, dict):
        raise AclError(f"ACL: the {what} body is not a JSON object")
    return doc


def _objects(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _heartbeat(fields: Fields, body: Body | None) -> list[Need]:
    # Consumers only (as RocketMQ): SUB on each group and each topic it subscribes to.
    needs: list[Need] = []
    for consumer in _objects(_json_body(body, "HEART_BEAT").get("consumerDataSet")):
        group = consumer.get("groupName")
        needs += _group(group if isinstance(group, str) else None)
        for sub in _objects(consumer.get("subscriptionDataSet")):
            topic = sub.get("topic")
            needs += _topic(topic if isinstance(topic, str) else None, Perm.SUB)
    return needs


def _lock_batch(fields: Fields, body: Body | None) -> list[Need]:
    doc = _json_body(body, "LOCK_BATCH_MQ / UNLOCK_BATCH_MQ")
    group = doc.get("consumerGroup")
    needs = _group(group if isinstance(group, str) else None)
    for mq in _objects(doc.get("mqSet")):
        topic = mq.get("topic")
        needs += _topic(topic if isinstance(topic, str) else None, Perm.SUB)
    return needs


def _rules() -> dict[int, CodeRule]:
    A = Access
    table: list[CodeRule] = []

    def res(code: int, name: str, extract: Extractor, reads: str) -> None:
        field = extract.key if isinstance(extract, _FieldNeeds) else None
        table.append(CodeRule(code, name, A.RESOURCES, extract, reads, field))

    def plain(access: Access, entries: str) -> None:
        for entry in entries.split():
            name, _, code = entry.partition("=")
            table.append(CodeRule(int(code), name, access))

    # -- producers and consumers: permissions on the topics and groups named -----------------
    res(10, "SEND_MESSAGE", _field_topic("topic", Perm.PUB), "PUB on topic `topic`")
    res(310, "SEND_MESSAGE_V2", _field_topic("b", Perm.PUB), "PUB on topic `b`")
    res(320, "SEND_BATCH_MESSAGE", _field_topic("b", Perm.PUB), "PUB on topic `b`")
    res(324, "SEND_REPLY_MESSAGE", _field_topic("topic", Perm.PUB), "PUB on topic `topic`")
    res(325, "SEND_REPLY_MESSAGE_V2", _field_topic("b", Perm.PUB), "PUB on topic `b`")
    res(36, "CONSUMER_SEND_MSG_BACK", _field_group("group"), "SUB on group `group`")
    res(11, "PULL_MESSAGE", _group_and_topic, "SUB on `topic` and group `consumerGroup`")
    res(12, "QUERY_MESSAGE", _field_topic("topic", Perm.SUB), "SUB on topic `topic`")
    res(14, "QUERY_CONSUMER_OFFSET", _group_and_topic, "SUB on `topic` and `consumerGroup`")
    res(15, "UPDATE_CONSUMER_OFFSET", _group_and_topic, "SUB on `topic` and `consumerGroup`")
    res(34, "HEART_BEAT", _heartbeat, "SUB on each consumer group and subscribed topic (body)")
    res(35, "UNREGISTER_CLIENT", _field_group("consumerGroup"), "SUB on `consumerGroup` if any")
    res(38, "GET_CONSUMER_LIST_BY_GROUP", _field_group("consumerGroup"), "SUB on `consumerGroup`")
    res(41, "LOCK_BATCH_MQ", _lock_batch, "SUB on the body's group and topics")
    res(42, "UNLOCK_BATCH_MQ", _lock_batch, "SUB on the body's group and topics")
    for code, name in (
        (29, "SEARCH_OFFSET_BY_TIMESTAMP"),
        (30, "GET_MAX_OFFSET"),
        (31, "GET_MIN_OFFSET"),
        (32, "GET_EARLIEST_MSG_STORETIME"),
    ):
        res(code, name, _field_topic("topic", Perm.ANY), "PUB or SUB on topic `topic`")
    # -- reads of state a valid account may see (RocketMQ checks none of them) ----------------
    plain(
        A.ACCOUNT,
        "QUERY_BROKER_OFFSET=13 GET_TOPIC_CONFIG_LIST=22 GET_TOPIC_NAME_LIST=23"
        " GET_BROKER_RUNTIME_INFO=28 VIEW_MESSAGE_BY_ID=33 END_TRANSACTION=37"
        " CHECK_CLIENT_CONFIG=46 GET_TOPIC_STATS_INFO=202 GET_CONSUMER_CONNECTION_LIST=203"
        " GET_PRODUCER_CONNECTION_LIST=204 GET_CONSUME_STATS=208 WHO_CONSUME_THE_MESSAGE=214"
        " INVOKE_BROKER_TO_GET_CONSUMER_STATUS=223 QUERY_TOPIC_CONSUME_BY_WHO=300"
        " QUERY_CONSUME_TIME_SPAN=303 GET_SYSTEM_TOPIC_LIST_FROM_BROKER=305"
        " GET_CONSUMER_RUNNING_INFO=307 QUERY_CORRECTION_OFFSET=308 VIEW_BROKER_STATS_DATA=315"
        " GET_BROKER_CONSUME_STATS=317 QUERY_CONSUME_QUEUE=321 GET_ALL_PRODUCER_INFO=328"
        " GET_BROKER_HA_STATUS=907 CONTROLLER_GET_REPLICA_INFO=1004"
        " CONTROLLER_GET_METADATA_INFO=1005 CONTROLLER_GET_SYNC_STATE_DATA=1006"
        " GET_BROKER_EPOCH_CACHE=1007",
    )
    # -- NameServer route reads -------------------------------------------------------------
    plain(
        A.ROUTE,
        "GET_KV_CONFIG=101 GET_ROUTEINFO_BY_TOPIC=105 GET_BROKER_CLUSTER_INFO=106"
        " GET_ALL_TOPIC_LIST_FROM_NAMESERVER=206 GET_KVLIST_BY_NAMESPACE=219"
        " GET_TOPICS_BY_CLUSTER=224 GET_SYSTEM_TOPIC_LIST_FROM_NS=304 GET_UNIT_TOPIC_LIST=311"
        " GET_HAS_UNIT_SUB_TOPIC_LIST=312 GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST=313",
    )
    # -- what brokers (and controllers) send: registration, replication, role changes --------
    plain(
        A.BROKER,
        "GET_ALL_TOPIC_CONFIG=21 GET_ALL_CONSUMER_OFFSET=43 GET_ALL_DELAY_OFFSET=45"
        " PUT_KV_CONFIG=100 DELETE_KV_CONFIG=102 REGISTER_BROKER=103 UNREGISTER_BROKER=104"
        " GET_ALL_SUBSCRIPTIONGROUP_CONFIG=201 WIPE_WRITE_PERM_OF_BROKER=205"
        " DELETE_TOPIC_IN_NAMESRV=216 QUERY_DATA_VERSION=322 ADD_WRITE_PERM_OF_BROKER=327"
        " BROKER_HEARTBEAT=904 CONTROLLER_ALTER_SYNC_STATE_SET=1001 CONTROLLER_ELECT_MASTER=1002"
        " CONTROLLER_REGISTER_BROKER=1003 NOTIFY_BROKER_ROLE_CHANGED=1008"
        " CONTROLLER_GET_NEXT_BROKER_ID=1012 CONTROLLER_APPLY_BROKER_ID=1013 READ_COMMITLOG=9001",
    )
    # -- administration: topics, groups, offsets, configuration, files -------------------------
    # (Configuration reads are admin-only too: a server's configuration may hold its own
    # credentials.) The codes servers send to clients are here as well: no server serves them.
    plain(
        A.ADMIN,
        "UPDATE_AND_CREATE_TOPIC=17 UPDATE_BROKER_CONFIG=25 GET_BROKER_CONFIG=26"
        " TRIGGER_DELETE_FILES=27 CHECK_TRANSACTION_STATE=39 NOTIFY_CONSUMER_IDS_CHANGED=40"
        " UPDATE_AND_CREATE_SUBSCRIPTIONGROUP=200 DELETE_SUBSCRIPTIONGROUP=207"
        " SUSPEND_CONSUMER=209 RESUME_CONSUMER=210 RESET_CONSUMER_OFFSET_IN_CONSUMER=211"
        " RESET_CONSUMER_OFFSET_IN_BROKER=212 DELETE_TOPIC_IN_BROKER=215"
        " RESET_CONSUMER_CLIENT_OFFSET=220 GET_CONSUMER_STATUS_FROM_CLIENT=221"
        " INVOKE_BROKER_TO_RESET_OFFSET=222 CLEAN_EXPIRED_CONSUMEQUEUE=306"
        " CONSUME_MESSAGE_DIRECTLY=309 CLONE_GROUP_OFFSET=314 CLEAN_UNUSED_TOPIC=316"
        " UPDATE_NAMESRV_CONFIG=318 GET_NAMESRV_CONFIG=319 RESUME_CHECK_HALF_MESSAGE=323"
        " PUSH_REPLY_MESSAGE_TO_CLIENT=326 DELETE_EXPIRED_COMMITLOG=329"
        " UPDATE_CONTROLLER_CONFIG=1009 GET_CONTROLLER_CONFIG=1010 CLEAN_BROKER_DATA=1011",
    )
    out: dict[int, CodeRule] = {}
    for rule in table:
        if rule.code in out:
            raise AssertionError(f"request code {rule.code} is in the ACL table twice")
        out[rule.code] = rule
    return out


_CODE_RULES: Mapping[int, CodeRule] = _rules()


def code_rules() -> Mapping[int, CodeRule]:
    """The ACL table: every request code trimq knows, by number."""
    return _CODE_RULES


def code_rule(code: int) -> CodeRule:
    """The code's entry; a code not in the table needs an admin account (deny by default)."""
    rule = _CODE_RULES.get(code)
    return rule if rule is not None else CodeRule(code, f"code {code}", Access.ADMIN)


def required_access(
    code: int, ext_fields: Mapping[str, str] | None, body: Body | None
) -> Requirement:
    """What a request needs. A field that is absent adds no resource (as in RocketMQ): the
    processor refuses such a request anyway.

    Raises:
        AclError: the body a code is checked by (HEART_BEAT, LOCK_BATCH_MQ) is not readable.
    """
    rule = code_rule(code)
    if rule.extract is None:
        return Requirement(rule.access)
    return Requirement(rule.access, tuple(rule.extract(ext_fields or {}, body)))


def _what(code: int, rule: CodeRule) -> str:
    """How a refusal's remark names the request."""
    return f"request code {code} ({rule.name})"


_WHATS: Mapping[int, str] = {code: _what(code, rule) for code, rule in _CODE_RULES.items()}
# Grants an AclChecker remembers at most (the set is emptied when full).
_GRANTS_MAX = 4096
# The codes whose needs one extField decides, and that field (the grants the native path reads).
_FIELD_CODES: dict[int, str] = {
    code: rule.field for code, rule in _CODE_RULES.items() if rule.field is not None
}


def _secrets(rules: AclRules) -> dict[str, bytes]:
    """Access key -> secret key as UTF-8, for the accounts whose secret has a UTF-8 form (the
    others are checked in Python only, where the signature check raises as before)."""
    out: dict[str, bytes] = {}
    for key, account in rules.accounts.items():
        try:
            out[key] = account.secret_key.encode("utf-8")
        except UnicodeEncodeError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------
class AclChecker:
    """Checks requests against the current `AclRules` (replaced at run time by the watcher).

    Args:
        rules: the accounts and white list in force.
        open_route_reads: ROUTE codes need no account (the NameServer's default: clients find
            brokers before they have anything to sign for); False: any valid account.
    """

    def __init__(self, rules: AclRules, *, open_route_reads: bool = False) -> None:
        self._rules = rules
        self.open_route_reads = open_route_reads
        self.generation = 0
        # Grants `_authorise` made under `_granted_rules` (emptied when the rules change).
        # Only grants: a refusal runs `_authorise` every time.
        # (accessKey, code, needs), or (accessKey, code, value of the code's `field`).
        self._granted: set[tuple[str, int, object]] = set()
        self._granted_rules = rules
        # The secret keys (UTF-8) of `_granted_rules`' accounts, for the native fast path.
        self._secrets = _secrets(rules)

    @property
    def rules(self) -> AclRules:
        return self._rules

    def replace(self, rules: AclRules) -> None:
        """Put `rules` in force for every later check (one assignment: no check sees a mix)."""
        self._rules = rules
        self.generation += 1

    def check(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None,
        body: Body | None,
        remote_ip: str,
    ) -> None:
        """Return if the request may be served, else raise AclError.

        In RocketMQ's order: a global white-listed address passes; then the request needs an
        `AccessKey` of a known account; an address the account white-lists passes without a
        signature; otherwise the `Signature` must verify (compared in constant time); a send to
        `RMQ_SYS_TRACE_TOPIC` then passes; last, the code's requirement (`code_rule`).

        Args:
            remote_ip: the peer, `ip`, `ip:port` or `[v6]:port`.

        Raises:
            AclError: refused; `remark` names the account, the resource and the permission.
        """
        rules = self._rules
        if self._granted_rules is not rules:
            self._granted = set()
            self._granted_rules = rules
            self._secrets = _secrets(rules)
        # A request granted before under these rules, whose signature verifies, passes in one
        # native call; it only ever accepts what the steps below accept. Anything else
        # (refusals too, with their remarks) takes the steps below.
        elif (
            _NATIVE_CHECK is not None
            and type(ext_fields) is dict
            and _NATIVE_CHECK(
                ext_fields, body, code, self._secrets, self._granted, _FIELD_CODES, _ORDERS
            )
        ):
            return
        # The address is parsed only when a white list may need it (most requests: never).
        addr: IPAddress | None = None
        parsed = False
        if rules.global_white:
            addr, parsed = _parse_ip(remote_ip), True
            for pattern in rules.global_white:
                if pattern.match(addr):
                    return
        rule = code_rule(code)
        if rule.access is Access.ROUTE and self.open_route_reads:
            return
        what = _WHATS.get(code) or _what(code, rule)
        fields = ext_fields or {}
        access_key = fields.get(ACCESS_KEY)
        if not access_key:
            raise AclError(
                f"ACL: {what} from {host_of(remote_ip)} carries no AccessKey, and the address"
                " is not white-listed"
            )
        account = rules.accounts.get(access_key)
        if account is None:
            raise AclError(f"ACL: no account has accessKey={access_key} ({what})")
        if account.white_remote_address is not None:
            if not parsed:
                addr = _parse_ip(remote_ip)
            if account.white_remote_address.match(addr):
                return
        self._verify_signature(account, fields, body, what)
        # The code fixes the kind of account needed: with the account and the resources, the
        # whole of what `_authorise` decides on, under rules that never change in place. A code
        # whose needs one field decides is remembered by that field's value (no extraction).
        grant: tuple[str, int, object]
        if rule.field is not None:
            grant = (account.access_key, code, fields.get(rule.field))
            if grant in self._granted:
                return
        # `required_access(code, fields, body)`, its Requirement built only when authorised.
        needs = tuple(rule.extract(fields, body)) if rule.extract is not None else ()
        for need in needs:
            if need.resource == TRACE_TOPIC and need.perm == Perm.PUB:
                return
        if rule.field is None:
            grant = (account.access_key, code, needs)
            if grant in self._granted:
                return
        self._authorise(account, Requirement(rule.access, needs), what)
        if len(self._granted) >= _GRANTS_MAX:  # resource names come from the network
            self._granted.clear()
        self._granted.add(grant)

    def check_command(self, cmd: CheckableCommand, remote_address: str) -> None:
        """`check` of a request object with `code`, `ext_fields` and `body` (a RemotingCommand).

        Raises:
            AclError: refused.
        """
        self.check(cmd.code, cmd.ext_fields, cmd.body, remote_address)

    def signing_account(self, ext_fields: Mapping[str, str] | None, body: Body | None) -> Account:
        """The account whose valid signature the request carries, checked here even when the
        sender's address is white-listed (white lists waive the signature for `check`, never
        for what needs proof of an account, such as replacing a live broker's route).

        Raises:
            AclError: no AccessKey, no such account, or a signature that does not verify.
        """
        fields = ext_fields or {}
        access_key = fields.get(ACCESS_KEY)
        if not access_key:
            raise AclError("ACL: the request carries no AccessKey")
        account = self._rules.accounts.get(access_key)
        if account is None:
            raise AclError(f"ACL: no account has accessKey={access_key}")
        self._verify_signature(account, fields, body, "the request")
        return account

    @staticmethod
    def _verify_signature(
        account: Account, fields: Mapping[str, str], body: Body | None, what: str
    ) -> None:
        given = fields.get(SIGNATURE)
        if not given:
            raise AclError(f"ACL: {what} of accessKey={account.access_key} carries no Signature")
        given_bytes = given.encode("utf-8", "replace")
        state = _keyed(account.secret_key)
        if hmac.compare_digest(_signature(state, fields, body), given_bytes):
            return
        if UNIQUE_KEY_QUERY in fields:
            other = _signature(state, fields, body, (UNIQUE_KEY_QUERY,))
            if hmac.compare_digest(other, given_bytes):
                return
        raise AclError(
            f"ACL: signature check failed for accessKey={account.access_key} ({what}): the"
            " secret key or the signed fields differ"
        )

    @staticmethod
    def _authorise(account: Account, req: Requirement, what: str) -> None:
        ak = account.access_key
        if req.access is Access.ADMIN:
            if not account.admin:
                raise AclError(f"ACL: {what} needs an admin account; accessKey={ak} is not admin")
            return
        if req.access is Access.BROKER:
            if not (account.admin or account.broker):
                raise AclError(
                    f"ACL: {what} needs a broker or admin account; accessKey={ak} is neither"
                )
            return
        if req.access is not Access.RESOURCES or (account.admin and not account.perms):
            # An admin account without topicPerms/groupPerms may use every topic and group.
            return
        for need in req.needs:
            owned = account.perms.get(need.resource)
            default = owned is None
            if owned is None:
                owned = account.default_group_perm if need.is_group else account.default_topic_perm
            if not check_permission(need.perm, owned):
                held = perm_name(owned) + (" by default" if default else "")
                raise AclError(
                    f"ACL: accessKey={ak} lacks {perm_name(need.perm)} on {need.describe()}"
                    f" ({what}; it holds {held})"
                )


# ---------------------------------------------------------------------------------------------
# Reloading
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Probe:
    stat: tuple[int, ...] | None
    rules: AclRules | None = None
    error: str | None = None
    digest: str | None = None


class AclFileWatcher:
    """Reloads the ACL file into a checker when it changes (RocketMQ's AclFileWatchService).

    Every `interval_s` it stats the file (in a worker thread); when its mtime, ctime, size or
    inode moved, or it changed in the last 2 s, it reads it and compares its SHA-256 with the
    rules in force (and with the last bad content). New content is
    parsed: good rules replace the checker's (`acl_reloaded`), a bad file or a missing one is
    logged (`acl_reload_failed`, with the reason; once per distinct content) and the last good
    rules stay in force.

    Args:
        path: the plain_acl.yml.
        checker: the checker whose rules it replaces.
        interval_s: seconds between polls.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        checker: AclChecker,
        *,
        interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("the ACL reload interval must be positive")
        self.path = Path(path)
        self.checker = checker
        self.interval_s = interval_s
        self.polls = 0
        self.last_error: str | None = None
        self._stat: tuple[int, ...] | None = None
        self._bad_digest: str | None = None

    def _probe(self, seen: tuple[int, ...] | None, good: str, bad: str | None) -> _Probe | None:
        """In a worker thread: None when nothing changed, else what the file now holds."""
        try:
            st = self.path.stat()
        except OSError as exc:
            return _Probe(None, error=f"cannot read {self.path}: {exc.strerror or exc}")
        stat: tuple[int, ...] | None = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        if stat == seen:
            return None
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
            # Written just now: a second write within the file system's timestamp granularity
            # would leave the same stat, so the file is read again at the next poll too.
            stat = None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            return _Probe(None, error=f"cannot read {self.path}: {exc.strerror or exc}")
        digest = hashlib.sha256(data).hexdigest()
        if digest in (good, bad):
            return _Probe(stat, digest=digest)
        try:
            return _Probe(stat, rules=parse_acl(data, str(self.path)), digest=digest)
        except AclFileError as exc:
            return _Probe(stat, error=str(exc), digest=digest)

    async def poll(self) -> bool:
        """Look at the file once; True when new rules were put in force."""
        probe = await trio.to_thread.run_sync(
            self._probe, self._stat, self.checker.rules.digest, self._bad_digest
        )
        self.polls += 1
        if probe is None:
            return False
        self._stat = probe.stat
        if probe.rules is not None:
            self.checker.replace(probe.rules)
            self._bad_digest = None
            self.last_error = None
            log.info(
                "acl_reloaded",
                path=str(self.path),
                accounts=len(probe.rules.accounts),
                global_white=len(probe.rules.global_white),
            )
            return True
        if probe.error is not None:
            if probe.error != self.last_error:
                log.error(
                    "acl_reload_failed",
                    path=str(self.path),
                    error=probe.error,
                    kept=self.checker.rules.digest[:12],
                )
            self.last_error = probe.error
            self._bad_digest = probe.digest
        elif probe.digest == self.checker.rules.digest:
            # Back to the rules in force (a bad edit reverted): nothing to reload.
            self.last_error = None
            self._bad_digest = None
        return False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Poll every `interval_s` until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.poll()
            except Exception:
                # The rules in force stay; the next poll tries again.
                log.exception("acl_reload_failed", path=str(self.path))


def server_check(checker: AclChecker) -> Callable[[Any, Any], Any]:
    """A server's pre-dispatch check (remoting's `ProcessorTable.check_before`): None lets a
    request through; a refusal is the request's NO_PERMISSION answer with the checker's
    remark (it names account, resource and permission, never a secret)."""

    def check(conn: Any, cmd: Any) -> Any:
        try:
            checker.check(cmd.code, cmd.ext_fields, cmd.body, conn.remote_address)
        except AclError as exc:
            # Info, not warning: a stranger can send any number of refused requests.
            log.info("acl_refused", code=cmd.code, peer=conn.remote_address, remark=exc.remark)
            return cmd.make_response(exc.code, exc.remark)
        return None

    return check

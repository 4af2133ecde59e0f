"""Typed custom headers: RocketMQ's `*RequestHeader` / `*ResponseHeader` classes.

A custom header travels as `RemotingCommand.ext_fields`, a string-to-string map keyed by the
Java field names. Each class here is a slotted dataclass whose attributes are the snake_case
forms of those names; the class definition *is* the field table:

- the wire name is the camelCase of the attribute (`queue_offset` -> `queueOffset`) unless the
  class's `_WIRE_NAMES` overrides it (`client_id` -> `clientID`);
- the annotation gives the conversion: `str`, `bool`, or `Int32` / `Int64` (plain `int` to a type
  checker) for the numbers, after the Java field's type: `Integer`/`int` is `Int32`,
  `Long`/`long` is `Int64`. A number outside its type's range is refused with a HeaderError
  naming the field, as Java's `Integer.parseInt` / `Long.parseLong` refuse it;
- an attribute without a default is required (RocketMQ's `@CFNotNull`): `from_fields` raises
  `HeaderError` naming it when it is missing; one with a default is optional.

From that table `@_header` generates a straight-line `from_fields` and `to_fields` per class
(the way `dataclasses` generates `__init__`), so the hot SendMessage and PullMessage headers
cost one dict lookup and one conversion per field, without a per-field loop.
`to_fields` leaves None fields out, writes booleans as "true"/"false" and numbers in decimal
(it does not check ranges: a header built in Python holds what its caller put there).
Booleans parse like Java's `Boolean.parseBoolean` (only "true", any case, is true).

With the C extension (see remoting._header_codec), `from_fields` and `from_fields_v2` run a
native `FieldsDecoder` built from the same table; it handles the common case (a dict of str
values that all convert) and hands anything else to the generated Python decoder, which stays
the reference (`_py_decode`, `_py_decode_v2`) and raises the HeaderError.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Self, TypeVar

from remoting._command import RemotingCommand
from remoting._header_codec import native as _native
from remoting.codes import RequestCode
from remoting.errors import HeaderError

__all__ = [
    "INT32",
    "INT64",
    "AlterSyncStateSetRequestHeader",
    "AlterSyncStateSetResponseHeader",
    "ApplyBrokerIdRequestHeader",
    "ApplyBrokerIdResponseHeader",
    "BrokerHeartbeatRequestHeader",
    "CheckTransactionStateRequestHeader",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "DeleteTopicFromNamesrvRequestHeader",
    "DeleteTopicRequestHeader",
    "ElectMasterRequestHeader",
    "ElectMasterResponseHeader",
    "EndTransactionRequestHeader",
    "GetConsumeStatsRequestHeader",
    "GetConsumerConnectionListRequestHeader",
    "GetConsumerListByGroupRequestHeader",
    "GetEarliestMsgStoretimeRequestHeader",
    "GetEarliestMsgStoretimeResponseHeader",
    "GetMaxOffsetRequestHeader",
    "GetMaxOffsetResponseHeader",
    "GetMetaDataResponseHeader",
    "GetMinOffsetRequestHeader",
    "GetMinOffsetResponseHeader",
    "GetNextBrokerIdRequestHeader",
    "GetNextBrokerIdResponseHeader",
    "GetReplicaInfoRequestHeader",
    "GetReplicaInfoResponseHeader",
    "GetRouteInfoRequestHeader",
    "GetTopicStatsInfoRequestHeader",
    "GetTopicsByClusterRequestHeader",
    "Int32",
    "Int64",
    "NotifyBrokerRoleChangedRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "QueryConsumerOffsetRequestHeader",
    "QueryConsumerOffsetResponseHeader",
    "QueryDataVersionRequestHeader",
    "QueryDataVersionResponseHeader",
    "QueryMessageRequestHeader",
    "QueryMessageResponseHeader",
    "ReadCommitlogRequestHeader",
    "ReadCommitlogResponseHeader",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "RegisterBrokerToControllerRequestHeader",
    "RegisterBrokerToControllerResponseHeader",
    "ResetOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "SearchOffsetResponseHeader",
    "SendMessageRequestHeader",
    "SendMessageResponseHeader",
    "UnRegisterBrokerRequestHeader",
    "UnregisterClientRequestHeader",
    "UpdateConsumerOffsetRequestHeader",
    "ViewMessageRequestHeader",
    "send_request_fields_v2",
]

_EMPTY: Mapping[str, str] = types.MappingProxyType({})

_Decoder = Callable[[type[Any], Mapping[str, str] | None], Any]
_Encoder = Callable[[Any], dict[str, str]]


@dataclasses.dataclass(frozen=True, slots=True)
class IntWidth:
    """The range of a Java integer type: what a header number must fit."""

    name: str
    java: str
    lo: int
    hi: int

    def __repr__(self) -> str:
        return self.name.upper()


INT32 = IntWidth("int32", "Integer", -(2**31), 2**31 - 1)
INT64 = IntWidth("int64", "Long", -(2**63), 2**63 - 1)
Int32 = Annotated[int, INT32]
"""A header number that is a Java `Integer` / `int` field."""
Int64 = Annotated[int, INT64]
"""A header number that is a Java `Long` / `long` field."""

_Kind = type | IntWidth
"""A field's conversion: `str`, `bool`, `INT32` or `INT64`."""
_Row = tuple[str, str, _Kind, bool, object]


class _Header:
    """Base of every typed header; the generated codecs hang off the class."""

    __slots__ = ()

    _WIRE_NAMES: ClassVar[Mapping[str, str]] = {}
    _SHORT_NAMES: ClassVar[Mapping[str, str]] = {}
    _decode: ClassVar[_Decoder]
    _py_decode: ClassVar[_Decoder]
    _encode: ClassVar[_Encoder]
    _TABLE: ClassVar[tuple[_Row, ...]]
    FIELDS: ClassVar[tuple[tuple[str, str, _Kind, bool], ...]]
    """(attribute, wire name, kind, required) per field, in declaration order; kind is `str`,
    `bool`, `INT32` or `INT64`."""

    @classmethod
    def from_fields(cls, ext_fields: Mapping[str, str] | None) -> Self:
        """Build the header from a command's extFields.

        Raises:
            HeaderError: a required field is missing, a number does not parse or is outside
                its Java type (int32 or int64).
        """
        result: Self = cls._decode(cls, ext_fields)
        return result

    def to_fields(self) -> dict[str, str]:
        """The extFields map for this header (None fields left out)."""
        return type(self)._encode(self)


def _camel(attr: str) -> str:
    head, *rest = attr.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _plain_type(hint: Any) -> tuple[_Kind, bool]:
    """(kind, optional?) from an annotation like `str`, `Int32` or `Int64 | None`.

    A bare `int` is refused: every number says whether it is a Java int32 or int64."""
    optional = False
    if typing.get_origin(hint) is not Annotated:
        args = typing.get_args(hint)
        if args:
            non_none = [a for a in args if a is not type(None)]
            if len(non_none) != 1:
                raise TypeError(f"unsupported header annotation {hint!r}")
            hint, optional = non_none[0], True
    if typing.get_origin(hint) is Annotated:
        base, *extras = typing.get_args(hint)
        widths = [e for e in extras if isinstance(e, IntWidth)]
        if base is not int or len(widths) != 1:
            raise TypeError(f"unsupported header annotation {hint!r}")
        return widths[0], optional
    if hint is int:
        raise TypeError("a header number must be Int32 or Int64 (the Java field's type), not int")
    return hint, optional


def _compile(name: str, fields: list[_Row]) -> tuple[_Decoder, _Encoder]:
    """Generate the straight-line decoder and encoder for one field table."""
    dec = [
        "def _decode(cls, f):",
        "    if f is None:",
        "        f = _EMPTY",
        "    get = f.get",
        "    self = _new(cls)",
    ]
    enc = ["def _encode(self):", "    d = {}"]
    env: dict[str, Any] = {"_EMPTY": _EMPTY, "_HeaderError": HeaderError, "_new": object.__new__}
    for index, (attr, wire, kind, required, default) in enumerate(fields):
        dec.append(f"    v = get({wire!r})")
        if required:
            dec.append("    if v is None:")
            dec.append(f"        raise _HeaderError({wire!r}, 'missing')")
        else:
            env[f"_d{index}"] = default
            dec.append("    if v is None:")
            dec.append(f"        self.{attr} = _d{index}")
            dec.append("    else:")
        pad = "    " if required else "        "
        if isinstance(kind, IntWidth):
            dec.append(f"{pad}try:")
            dec.append(f"{pad}    n = int(v)")
            dec.append(f"{pad}except ValueError:")
            dec.append(
                f"{pad}    raise _HeaderError({wire!r}, 'not a number: ' + repr(v[:40])) from None"
            )
            dec.append(f"{pad}if not {kind.lo} <= n <= {kind.hi}:")
            reason = f" is outside {kind.name} (Java {kind.java}, {kind.lo}..{kind.hi})"
            dec.append(f"{pad}    raise _HeaderError({wire!r}, repr(v[:40]) + {reason!r})")
            dec.append(f"{pad}self.{attr} = n")
        elif kind is bool:
            dec.append(f"{pad}self.{attr} = v == 'true' or v.lower() == 'true'")
        elif kind is str:
            dec.append(f"{pad}self.{attr} = v")
        else:
            raise TypeError(f"{name}.{attr}: unsupported header field type {kind!r}")
        enc.append(f"    v = self.{attr}")
        enc.append("    if v is not None:")
        if isinstance(kind, IntWidth):
            enc.append(f"        d[{wire!r}] = str(v)")
        elif kind is bool:
            enc.append(f"        d[{wire!r}] = 'true' if v else 'false'")
        else:
            enc.append(f"        d[{wire!r}] = v")
    dec.append("    return self")
    enc.append("    return d")
    source = "\n".join(dec) + "\n\n" + "\n".join(enc) + "\n"
    code = compile(source, f"<header {name}>", "exec")
    exec(code, env)
    return env["_decode"], env["_encode"]


_KIND_CODES: Mapping[_Kind, int] = {str: 0, INT32: 1, bool: 2, INT64: 3}


def native_decoder(
    module: types.ModuleType,
    cls: type[Any],
    table: tuple[_Row, ...],
    fallback: _Decoder,
) -> _Decoder:
    """`module.FieldsDecoder` (remoting._speedups) for a field table; `fallback` is the
    generated Python decoder it hands uncommon input to (every error, an out-of-range number
    included, so the HeaderError is always the Python decoder's)."""
    rows = tuple((a, w, _KIND_CODES[k], r, d) for a, w, k, r, d in table)
    decoder: _Decoder = module.FieldsDecoder(cls, rows, fallback)
    return decoder


_H = TypeVar("_H", bound=type[_Header])


@typing.dataclass_transform(kw_only_default=True)
def _header(cls: _H) -> _H:
    """Make `cls` a slotted keyword-only dataclass and generate its extFields codecs."""
    dc: Any = dataclasses.dataclass(slots=True, kw_only=True)(cls)
    hints = typing.get_type_hints(dc, include_extras=True)
    overrides = dc._WIRE_NAMES
    table: list[_Row] = []
    for f in dataclasses.fields(dc):
        kind, optional = _plain_type(hints[f.name])
        has_default = f.default is not dataclasses.MISSING
        required = not has_default and not optional
        default = f.default if has_default else None
        table.append((f.name, overrides.get(f.name) or _camel(f.name), kind, required, default))
    dc._py_decode, dc._encode = _compile(dc.__name__, table)
    dc._decode = dc._py_decode
    dc._TABLE = tuple(table)
    if _native is not None:
        dc._decode = native_decoder(_native, dc, dc._TABLE, dc._py_decode)
    dc.FIELDS = tuple((a, w, k, r) for a, w, k, r, _ in table)
    if dc._SHORT_NAMES:
        short = tuple((a, dc._SHORT_NAMES[a], k, r, d) for a, _, k, r, d in table)
        decode_v2, encode_v2 = _compile(dc.__name__ + "V2", list(short))
        dc._py_decode_v2 = dc._decode_v2 = decode_v2
        dc._TABLE_V2 = short
        if _native is not None:
            dc._decode_v2 = native_decoder(_native, dc, short, decode_v2)
        dc._encode_v2 = encode_v2
    result: _H = dc
    return result


# ---------------------------------------------------------------------------
# send
# ---------------------------------------------------------------------------
_V2_CODES = frozenset(
    {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2}
)


@_header
class SendMessageRequestHeader(_Header):
    """SEND_MESSAGE (10) header; codes 310/320/325 carry it with the short names a..n."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: Int32
    queue_id: Int32
    sys_flag: Int32
    born_timestamp: Int64
    flag: Int32
    properties: str | None = None
    reconsume_times: Int32 | None = None
    unit_mode: bool = False
    max_reconsume_times: Int32 | None = None
    batch: bool = False
    broker_name: str | None = None

    _SHORT_NAMES: ClassVar[Mapping[str, str]] = {
        "producer_group": "a",
        "topic": "b",
        "default_topic": "c",
        "default_topic_queue_nums": "d",
        "queue_id": "e",
        "sys_flag": "f",
        "born_timestamp": "g",
        "flag": "h",
        "properties": "i",
        "reconsume_times": "j",
        "unit_mode": "k",
        "max_reconsume_times": "l",
        "batch": "m",
        "broker_name": "n",
    }
    _decode_v2: ClassVar[_Decoder]
    _py_decode_v2: ClassVar[_Decoder]
    _encode_v2: ClassVar[_Encoder]
    _TABLE_V2: ClassVar[tuple[_Row, ...]]

    @classmethod
    def from_fields_v2(cls, ext_fields: Mapping[str, str] | None) -> Self:
        """Build from the V2 short-name form (codes 310, 320, 325).

        Raises:
            HeaderError: a required field is missing (named by its short name) or malformed.
        """
        result: Self = cls._decode_v2(cls, ext_fields)
        return result

    def to_fields_v2(self) -> dict[str, str]:
        """The V2 short-name extFields map (keys a..n, None fields left out)."""
        return type(self)._encode_v2(self)

    @classmethod
    def from_command(cls, cmd: RemotingCommand) -> Self:
        """Build from a send request, picking the V2 form for codes 310, 320 and 325.

        Raises:
            HeaderError: a required field is missing or malformed.
        """
        result: Self
        if cmd.code in _V2_CODES:
            result = cls._decode_v2(cls, cmd.ext_fields)
        else:
            result = cls._decode(cls, cmd.ext_fields)
        return result


def send_request_fields_v2(
    producer_group: str,
    topic: str,
    default_topic: str,
    default_topic_queue_nums: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    flag: int,
    properties: str,
    broker_name: str,
    batch: bool = False,
) -> dict[str, str]:
    """The V2 extFields of a plain send, built directly (the producer's hot path).

    Equal, key order included, to `SendMessageRequestHeader(...).to_fields_v2()` with
    `reconsume_times=0`, `unit_mode=False` and no `max_reconsume_times` (a send that is
    not a consumer's retry), so the frame bytes are the same; it skips the header object
    and its generic encoder. `default_topic_queue_nums` is passed already as text.
    """
    return {
        "a": producer_group,
        "b": topic,
        "c": default_topic,
        "d": default_topic_queue_nums,
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(born_timestamp),
        "h": str(flag),
        "i": properties,
        "j": "0",
        "k": "false",
        "m": "true" if batch else "false",
        "n": broker_name,
    }


@_header
class SendMessageResponseHeader(_Header):
    msg_id: str
    queue_id: Int32
    queue_offset: Int64
    transaction_id: str | None = None


# ---------------------------------------------------------------------------
# pull
# ---------------------------------------------------------------------------
@_header
class PullMessageRequestHeader(_Header):
    consumer_group: str
    topic: str
    queue_id: Int32
    queue_offset: Int64
    max_msg_nums: Int32
    sys_flag: Int32
    commit_offset: Int64
    suspend_timeout_millis: Int64
    subscription: str | None = None
    sub_version: Int64
    expression_type: str | None = None


@_header
class PullMessageResponseHeader(_Header):
    suggest_which_broker_id: Int64
    next_begin_offset: Int64
    min_offset: Int64
    max_offset: Int64


@_header
class ConsumerSendMsgBackRequestHeader(_Header):
    offset: Int64
    group: str
    delay_level: Int32
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: Int32 | None = None


# ---------------------------------------------------------------------------
# transactions
# ---------------------------------------------------------------------------
@_header
class EndTransactionRequestHeader(_Header):
    producer_group: str
    tran_state_table_offset: Int64
    commit_log_offset: Int64
    commit_or_rollback: Int32
    from_transaction_check: bool | None = False
    msg_id: str
    transaction_id: str | None = None


@_header
class CheckTransactionStateRequestHeader(_Header):
    tran_state_table_offset: Int64
    commit_log_offset: Int64
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None


# ---------------------------------------------------------------------------
# offsets
# ---------------------------------------------------------------------------
@_header
class QueryConsumerOffsetRequestHeader(_Header):
    consumer_group: str
    topic: str
    queue_id: Int32
    set_zero_if_not_found: bool | None = None  # 5.x: false = QUERY_NOT_FOUND, never 0


@_header
class QueryConsumerOffsetResponseHeader(_Header):
    offset: Int64


@_header
class UpdateConsumerOffsetRequestHeader(_Header):
    consumer_group: str
    topic: str
    queue_id: Int32
    commit_offset: Int64


@_header
class GetMaxOffsetRequestHeader(_Header):
    topic: str
    queue_id: Int32


@_header
class GetMaxOffsetResponseHeader(_Header):
    offset: Int64


# -- 5.x controller mode (Java: header/controller/*, BrokerHeartbeatRequestHeader,
# NotifyBrokerRoleChangedRequestHeader). Broker ids here are the controller's (>= 1).


@_header
class BrokerHeartbeatRequestHeader(_Header):
    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: Int64
    epoch: Int32 | None = None
    max_offset: Int64 | None = None
    confirm_offset: Int64 | None = None
    heartbeat_timeout_mills: Int64 | None = None
    election_priority: Int32 | None = None


@_header
class AlterSyncStateSetRequestHeader(_Header):
    broker_name: str
    master_broker_id: Int64
    master_epoch: Int32
    invoke_time: Int64 = 0


@_header
class AlterSyncStateSetResponseHeader(_Header):
    new_sync_state_set_epoch: Int32


@_header
class ElectMasterRequestHeader(_Header):
    cluster_name: str = ""
    broker_name: str = ""
    broker_id: Int64 = -1
    designate_elect: bool = False
    invoke_time: Int64 = 0


@_header
class ElectMasterResponseHeader(_Header):
    master_broker_id: Int64 | None = None
    master_address: str | None = None
    master_epoch: Int32 | None = None
    sync_state_set_epoch: Int32 | None = None


@_header
class RegisterBrokerToControllerRequestHeader(_Header):
    cluster_name: str
    broker_name: str
    broker_id: Int64
    broker_address: str
    invoke_time: Int64 = 0


@_header
class RegisterBrokerToControllerResponseHeader(_Header):
    cluster_name: str | None = None
    broker_name: str | None = None
    master_broker_id: Int64 | None = None
    master_address: str | None = None
    master_epoch: Int32 | None = None
    sync_state_set_epoch: Int32 | None = None


@_header
class GetReplicaInfoRequestHeader(_Header):
    broker_name: str


@_header
class GetReplicaInfoResponseHeader(_Header):
    master_broker_id: Int64 | None = None
    master_address: str | None = None
    master_epoch: Int32 | None = None


@_header
class GetMetaDataResponseHeader(_Header):
    _WIRE_NAMES: ClassVar[Mapping[str, str]] = {"is_leader": "isLeader"}

    group: str | None = None
    controller_leader_id: str | None = None
    controller_leader_address: str | None = None
    is_leader: bool = False
    peers: str | None = None


@_header
class GetNextBrokerIdRequestHeader(_Header):
    cluster_name: str
    broker_name: str


@_header
class GetNextBrokerIdResponseHeader(_Header):
    cluster_name: str | None = None
    broker_name: str | None = None
    next_broker_id: Int64 | None = None


@_header
class ApplyBrokerIdRequestHeader(_Header):
    cluster_name: str
    broker_name: str
    applied_broker_id: Int64
    register_check_code: str


@_header
class ApplyBrokerIdResponseHeader(_Header):
    cluster_name: str | None = None
    broker_name: str | None = None


@_header
class NotifyBrokerRoleChangedRequestHeader(_Header):
    master_address: str | None = None
    master_epoch: Int32 | None = None
    sync_state_set_epoch: Int32 | None = None
    master_broker_id: Int64 | None = None


@_header
class ReadCommitlogRequestHeader(_Header):
    """READ_COMMITLOG (trimq's own): commitlog bytes from `offset`, at most `max_bytes`."""

    offset: Int64
    max_bytes: Int32


@_header
class ReadCommitlogResponseHeader(_Header):
    min_offset: Int64
    max_offset: Int64


@_header
class GetMinOffsetRequestHeader(_Header):
    topic: str
    queue_id: Int32


@_header
class GetMinOffsetResponseHeader(_Header):
    offset: Int64


@_header
class GetEarliestMsgStoretimeRequestHeader(_Header):
    topic: str
    queue_id: Int32


@_header
class GetEarliestMsgStoretimeResponseHeader(_Header):
    timestamp: Int64


@_header
class SearchOffsetRequestHeader(_Header):
    topic: str
    queue_id: Int32
    timestamp: Int64


@_header
class SearchOffsetResponseHeader(_Header):
    offset: Int64


# ---------------------------------------------------------------------------
# query / view
# ---------------------------------------------------------------------------
@_header
class ViewMessageRequestHeader(_Header):
    offset: Int64


@_header
class QueryMessageRequestHeader(_Header):
    topic: str
    key: str
    max_num: Int32
    begin_timestamp: Int64
    end_timestamp: Int64


@_header
class QueryMessageResponseHeader(_Header):
    index_last_update_timestamp: Int64
    index_last_update_phyoffset: Int64


# ---------------------------------------------------------------------------
# client management
# ---------------------------------------------------------------------------
@_header
class GetConsumerListByGroupRequestHeader(_Header):
    consumer_group: str


@_header
class NotifyConsumerIdsChangedRequestHeader(_Header):
    consumer_group: str


@_header
class UnregisterClientRequestHeader(_Header):
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None

    _WIRE_NAMES: ClassVar[Mapping[str, str]] = {"client_id": "clientID"}


# ---------------------------------------------------------------------------
# admin
# ---------------------------------------------------------------------------
@_header
class CreateTopicRequestHeader(_Header):
    topic: str
    default_topic: str
    read_queue_nums: Int32
    write_queue_nums: Int32
    perm: Int32
    topic_filter_type: str
    topic_sys_flag: Int32 | None = None
    order: bool = False


@_header
class DeleteTopicRequestHeader(_Header):
    topic: str


@_header
class DeleteTopicFromNamesrvRequestHeader(_Header):
    topic: str
    cluster_name: str | None = None


@_header
class GetTopicStatsInfoRequestHeader(_Header):
    topic: str


@_header
class GetConsumeStatsRequestHeader(_Header):
    consumer_group: str
    topic: str | None = None


@_header
class GetConsumerConnectionListRequestHeader(_Header):
    consumer_group: str


@_header
class ResetOffsetRequestHeader(_Header):
    topic: str
    group: str
    timestamp: Int64
    is_force: bool


@_header
class GetTopicsByClusterRequestHeader(_Header):
    cluster: str


# ---------------------------------------------------------------------------
# namesrv
# ---------------------------------------------------------------------------
@_header
class GetRouteInfoRequestHeader(_Header):
    topic: str
    accept_standard_json_only: bool | None = None


@_header
class RegisterBrokerRequestHeader(_Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: Int64
    compressed: bool = False
    body_crc32: Int32 = 0


@_header
class RegisterBrokerResponseHeader(_Header):
    ha_server_addr: str | None = None
    master_addr: str | None = None


@_header
class UnRegisterBrokerRequestHeader(_Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: Int64


@_header
class QueryDataVersionRequestHeader(_Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: Int64


@_header
class QueryDataVersionResponseHeader(_Header):
    changed: bool

"""common.speedups.build_batch_messages against broker.processors.send's Python loop.

Every slot of every message built must be equal (and the stored properties byte-equal), the
stop index and kind too. Skipped when the extension is not built.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.processors import send
from common.message import BatchItem, MessageInner, encode_properties

sp = pytest.importorskip("common.speedups")

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_names = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "CLUSTER", "a", "é"])
_values = st.text(alphabet=st.sampled_from("xy1 é\U0001f600"), min_size=0, max_size=6)


@st.composite
def _raw_props(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return encode_properties(draw(st.dictionaries(_names, _values.filter(bool), max_size=4)))
    # anything, malformed entries and duplicates included
    parts = draw(st.lists(st.tuples(_names, _values), max_size=4))
    sep = draw(st.sampled_from(["\x01", "\x01\x01", ""]))
    return "\x02".join(f"{k}{sep}{v}" for k, v in parts)


_items = st.lists(
    st.builds(
        BatchItem,
        st.integers(-(2**31), 2**31 - 1),
        st.one_of(st.just(b""), st.binary(min_size=1, max_size=20)),
        _raw_props(),
    ),
    max_size=6,
)


def _slots(msg: MessageInner) -> dict[str, Any]:
    return {name: getattr(msg, name) for name in MessageInner.__slots__}


def _run(fn: Any, items: list[BatchItem], batch_props: dict[str, str], max_props: int) -> Any:
    override = batch_props.keys() - {"WAIT"}
    suffix = encode_properties({k: v for k, v in batch_props.items() if k != "WAIT"})
    return fn(
        items,
        MessageInner,
        "Topic",
        3,
        2,
        1_700_000_000_000,
        ("127.0.0.1", 5),
        ("198.51.100.1", 10911),
        batch_props,
        override,
        suffix,
        max_props,
        send.reuse_properties,
    )


@SETTINGS
@given(
    _items,
    st.dictionaries(st.sampled_from(["CLUSTER", "WAIT", "TAGS", "b"]), _values, max_size=3),
    st.sampled_from([0, 10, 40, 32767]),
)
def test_build_batch_messages_equivalent(
    items: list[BatchItem], batch_props: dict[str, str], max_props: int
) -> None:
    msgs_py, i_py, k_py = _run(send._py_build_batch_messages, items, batch_props, max_props)
    msgs_c, i_c, k_c = _run(sp.build_batch_messages, items, batch_props, max_props)
    assert (i_py, k_py) == (i_c, k_c)
    assert [_slots(x) for x in msgs_py] == [_slots(x) for x in msgs_c]
    assert all(type(x) is MessageInner for x in msgs_c)


def test_build_batch_messages_kinds() -> None:
    items = [BatchItem(0, b"a", "TAGS\x01t"), BatchItem(1, b"", ""), BatchItem(0, b"c", "")]
    for fn in (send._py_build_batch_messages, sp.build_batch_messages):
        msgs, i, kind = _run(fn, items, {"CLUSTER": "c"}, 100)
        assert (len(msgs), i, kind) == (1, 1, send._EMPTY_BODY)
        assert msgs[0].properties_string == "TAGS\x01t\x02CLUSTER\x01c"
        assert msgs[0].tags_code == 116  # Java "t".hashCode()
        msgs, i, kind = _run(fn, items[:1], {"CLUSTER": "c"}, 5)
        assert (len(msgs), i, kind) == (1, 0, send._PROPERTIES_TOO_LONG)


def test_build_batch_messages_bad_items() -> None:
    with pytest.raises(TypeError):
        _run(sp.build_batch_messages, [(0, b"x")], {}, 10)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _run(sp.build_batch_messages, [(0, b"x", b"bytes")], {}, 10)  # type: ignore[list-item]


class _Sub(MessageInner):
    __slots__ = ("extra",)


class _WithDict(MessageInner):
    """A subclass with a __dict__ and a property: set through setattr."""

    @property
    def flag(self) -> int:
        return self.__dict__.get("_flag", 0)  # type: ignore[no-any-return]

    @flag.setter
    def flag(self, value: int) -> None:
        self.__dict__["_flag"] = value * 2


def test_build_batch_messages_subclasses() -> None:
    items = [BatchItem(5, b"a", "TAGS\x01t"), BatchItem(6, b"b", "")]
    for cls in (_Sub, _WithDict):
        out_py = _run_type(send._py_build_batch_messages, items, cls)
        out_c = _run_type(sp.build_batch_messages, items, cls)
        assert [type(x) for x in out_c] == [cls, cls]
        assert [_slots(x) for x in out_py] == [_slots(x) for x in out_c]
    assert [x.flag for x in _run_type(sp.build_batch_messages, items, _WithDict)] == [10, 12]


def _run_type(fn: Any, items: list[BatchItem], cls: type[MessageInner]) -> list[MessageInner]:
    msgs: list[MessageInner] = fn(
        items,
        cls,
        "T",
        0,
        0,
        1,
        ("127.0.0.1", 1),
        ("127.0.0.1", 2),
        {"CLUSTER": "c"},
        {"CLUSTER"},
        "CLUSTER\x01c",
        100,
        send.reuse_properties,
    )[0]
    return msgs

"""remoting.protocol._fastjson: the one tolerant loader of bodies and route bodies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remoting.protocol import _fastjson, bodies, route
from remoting.protocol._fastjson import _TOKEN, loads_tolerant, quote_keys

pytestmark = pytest.mark.unit


class _MyError(ValueError):
    pass


def test_both_body_modules_use_the_one_loader() -> None:
    assert bodies.loads_tolerant is _fastjson.loads_tolerant
    assert route.quote_numeric_keys is _fastjson.quote_keys
    # route's wrapper only changes the error class.
    text = b'{"t":{{"brokerName":"b","queueId":0,"topic":"T"}:1,-2:3}}'
    assert route.loads_tolerant(text) == bodies.loads_tolerant(text)
    with pytest.raises(route.RouteDecodeError, match="not JSON"):
        route.loads_tolerant(b"{nope}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{0:"a",-1:"b"}', {"0": "a", "-1": "b"}),
        ("{ 12 :1 ,\n\t-3: [4, 5]}", {"12": 1, "-3": [4, 5]}),
        ("{1.5:1,2e3:2,-0.25E-2:3}", {"1.5": 1, "2e3": 2, "-0.25E-2": 3}),
        ('{"a":{7:{8:"x"}},"b":[{9:1}]}', {"a": {"7": {"8": "x"}}, "b": [{"9": 1}]}),
        # Values and array items that look like keys stay what they are.
        ('{"a":"{0:1}",1:"x,2:y","n":[1,2]}', {"a": "{0:1}", "1": "x,2:y", "n": [1, 2]}),
        ('{0:"q\\"1:",2:"\\\\"}', {"0": 'q"1:', "2": "\\"}),
    ],
)
def test_bare_number_keys_become_strings(text: str, expected: object) -> None:
    assert loads_tolerant(text) == expected
    assert loads_tolerant(text.encode()) == expected


def test_object_keys_become_the_json_string_of_their_text() -> None:
    text = (
        '{"offsetTable":{{"brokerName":"b{}","queueId":1,"topic":"T"}:5,'
        '{"brokerName":"b","queueId":0,"topic":"T"} : {0:4}}}'
    )
    assert loads_tolerant(text) == {
        "offsetTable": {
            '{"brokerName":"b{}","queueId":1,"topic":"T"}': 5,
            '{"brokerName":"b","queueId":0,"topic":"T"}': {"0": 4},
        }
    }
    # The key's text is kept verbatim, nested objects and whitespace included.
    assert loads_tolerant('{{"a": {"b":[1]}}:1}') == {'{"a": {"b":[1]}}': 1}


@pytest.mark.parametrize(
    "text",
    [
        "{-:1}",  # not a number
        "{1-2:3}",
        "{01:2}",  # JSON numbers have no leading zeros
        "{1e:2}",
        "{\u0661:2}",  # a digit, but not an ASCII one
        "{abc:1}",  # fastjson quotes names; bare words are not keys
        "{true:1}",
        "[0:1]",  # keys only in objects
        "{[1]:2}",
        '{"a":1',
        '{"a":"unterminated}',
        "",
    ],
)
def test_what_is_not_json_after_quoting_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="body is not JSON"):
        loads_tolerant(text)
    with pytest.raises(_MyError):
        loads_tolerant(text, _MyError)
    with pytest.raises(route.RouteDecodeError):
        route.loads_tolerant(text)


def test_errors_are_the_callers_value_error() -> None:
    with pytest.raises(_MyError, match="not UTF-8"):
        loads_tolerant(b"\xff\xfe", _MyError)
    with pytest.raises(_MyError, match="nests too deeply"):
        loads_tolerant(b"{0:" * 5000, _MyError)
    with pytest.raises(_MyError, match="nests too deeply"):
        loads_tolerant(b"[" * 100_000, _MyError)
    # json's own non-decode ValueError (an integer past the digit limit) is wrapped too.
    with pytest.raises(_MyError, match="not JSON"):
        loads_tolerant(b"[" + b"9" * 5000 + b"]", _MyError)


def test_an_unterminated_string_is_one_token() -> None:
    # So a text of many escaped quotes is scanned once, not once per quote.
    text = '{"a":"' + '\\"' * 1000 + "\\"
    tokens = [m.group() for m in _TOKEN.finditer(text)]
    assert tokens == ["{", '"a"', ":", '"' + '\\"' * 1000, "\\"]
    assert "".join(tokens) == text


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_json_values)
def test_standard_json_is_unchanged(value: object) -> None:
    for text in (
        json.dumps(value),
        json.dumps(value, separators=(",", ":"), ensure_ascii=False),
        json.dumps(value, indent=2),
    ):
        assert quote_keys(text) == text
        assert loads_tolerant(text) == json.loads(text)


def _fastjson_text(value: object) -> str:
    """Render as fastjson does: int keys bare, tuple keys as an object of their items."""
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if isinstance(k, int):
                key = str(k)
            elif isinstance(k, tuple):
                key = json.dumps({"brokerName": k[1], "queueId": k[2], "topic": k[0]})
            else:
                key = json.dumps(k)
            items.append(f"{key}:{_fastjson_text(v)}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_fastjson_text(v) for v in value) + "]"
    return json.dumps(value)


def _expected(value: object) -> object:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, tuple):
                key = json.dumps({"brokerName": k[1], "queueId": k[2], "topic": k[0]})
            else:
                key = str(k)
            out[key] = _expected(v)
        return out
    if isinstance(value, list):
        return [_expected(v) for v in value]
    return value


_keys = (
    st.integers(-(2**40), 2**40)
    | st.text(max_size=6)
    | st.tuples(st.text(max_size=6), st.text(max_size=6), st.integers(-1, 64))
)


@given(
    st.recursive(
        st.integers() | st.text(max_size=6),
        lambda children: (
            st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_fastjson_maps_read_back(value: object) -> None:
    assert loads_tolerant(_fastjson_text(value)) == _expected(value)

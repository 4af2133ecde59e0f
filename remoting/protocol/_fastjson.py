"""Reading JSON as Java's fastjson writes it: the one tolerant loader of `bodies` and `route`.

fastjson writes a `Map` whose keys are not strings with non-standard keys: integer keys bare
(`{0:"192.0.2.1:10911",-1:3}`) and object keys, such as `MessageQueue`, as the object itself
(`{{"brokerName":"b","queueId":0,"topic":"T"}:5}`). `loads_tolerant` parses standard JSON as
`json.loads` does and, only when that fails, rewrites such keys into JSON strings and parses
again: a bare number key becomes the string of its text (`"0"`, `"-1"`), an object key the JSON
string of its text, for the caller to parse (see `bodies`' `MessageQueue` maps).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["loads_tolerant", "quote_keys"]

# One token per match, and every character is in one: a string literal (one never closed
# runs to the end of the text, so a scan never restarts inside it), one structural character,
# a run of JSON whitespace, or a run of anything else (numbers, literals, garbage).
_TOKEN = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"?'  # string literal
    r"|[{}\[\],:]"  # structural character
    r"|[ \t\r\n]+"  # whitespace
    r'|[^"{}\[\],: \t\r\n]+',  # anything else
    re.DOTALL,
)
# A JSON number (ASCII digits only): the bare keys quoted are exactly these.
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SPACE = frozenset(" \t\r\n")


def quote_keys(text: str) -> str:
    """Rewrite fastjson's non-string map keys into JSON strings.

    A JSON number in key position (`{0:1}`) becomes the string of its text (`{"0":1}`); an
    object in key position (`{{"a":1}:2}`) becomes the JSON string of its text, copied
    verbatim (`{"{\\"a\\":1}":2}`). Everything else, string literals included, is copied
    unchanged, so standard JSON comes back identical. Linear in the text; never recurses.
    """
    out: list[str] = []
    # Open containers, innermost last: True for an object, False for an array.
    containers: list[bool] = []
    expect_key = False
    # Inside an object used as a key: its nesting depth, and where its text starts in `out`.
    key_depth = 0
    key_start = 0
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if key_depth:
            out.append(tok)
            if tok == "{":
                key_depth += 1
            elif tok == "}":
                key_depth -= 1
                if not key_depth:
                    key = "".join(out[key_start:])
                    del out[key_start:]
                    out.append(json.dumps(key, ensure_ascii=False))
            continue
        if tok[0] in _SPACE:
            out.append(tok)
            continue
        if expect_key:
            expect_key = False
            if tok == "{":
                key_start = len(out)
                key_depth = 1
                out.append(tok)
                continue
            if _NUMBER.fullmatch(tok):
                out.append(f'"{tok}"')
                continue
        if tok == "{":
            containers.append(True)
            expect_key = True
        elif tok == "[":
            containers.append(False)
        elif tok in ("}", "]"):
            if containers:
                containers.pop()
        elif tok == ",":
            expect_key = bool(containers) and containers[-1]
        out.append(tok)
    return "".join(out)


def loads_tolerant(
    data: bytes | bytearray | memoryview | str, error: type[ValueError] = ValueError
) -> Any:
    """Parse JSON written by fastjson (bare number keys, object keys) or a standard encoder.

    Args:
        data: the JSON text, or its UTF-8 bytes.
        error: the exception raised for a bad body; the caller's own ValueError subclass.

    Raises:
        ValueError: `error`: the bytes are not UTF-8, the text is not JSON even after
            `quote_keys`, or it nests too deeply for the parser.
    """
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"body is not UTF-8: {exc}") from None
    try:
        try:
            return json.loads(text)
        except ValueError:
            pass
        try:
            return json.loads(quote_keys(text))
        except ValueError as exc:
            raise error(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise error("body nests too deeply") from None

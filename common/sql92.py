"""SQL92 property filters as RocketMQ's selector grammar reads and evaluates them.

Pure Python, no I/O. `compile_sql92` turns an expression into a `Sql92Filter`, whose `matches`
takes a message's properties (a str -> str mapping, TAGS and KEYS included) and answers whether
the expression is TRUE for them. Evaluation is three-valued (TRUE, FALSE, NULL = unknown); only
TRUE matches.

Grammar (keywords case-insensitive; no arithmetic, as RocketMQ):
    expr     := and (OR and)*
    and      := equality (AND equality)*
    equality := compare ((= | <>) compare | IS [NOT] NULL)*
    compare  := unary ((> | >= | < | <=) unary | [NOT] BETWEEN unary AND unary
                | [NOT] IN '(' string (, string)* ')' | [NOT] CONTAINS string
                | [NOT] STARTSWITH string | [NOT] ENDSWITH string)*
    unary    := + unary | - unary | NOT unary | primary
    primary  := literal | identifier | '(' expr ')'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

__all__ = [
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "MAX_IN_LIST",
    "Sql92Error",
    "Sql92Filter",
    "compile_sql92",
]

MAX_EXPRESSION_LENGTH = 4096
"""Longest expression accepted, in characters."""
MAX_DEPTH = 64
"""Deepest nesting of parentheses and unary operators (the parser recurses per level)."""
MAX_IN_LIST = 512
"""Most strings in one IN list."""

_LONG_MIN = -(2**63)
_LONG_MAX = 2**63 - 1

Value = bool | int | float | str | None
_Eval = Callable[[Mapping[str, str]], Value]


class Sql92Error(ValueError):
    """The expression cannot be compiled; `column` is where (1-based, on line `line`)."""

    def __init__(self, message: str, text: str, pos: int) -> None:
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        where = f"column {column}" if line == 1 else f"line {line}, column {column}"
        super().__init__(f"{where}: {message}")
        self.line = line
        self.column = column


class _Tok(NamedTuple):
    kind: str  # "id", "kw", "str", "int", "float", "op", "eof"
    value: object
    pos: int


_KEYWORDS = frozenset(
    [
        "AND",
        "OR",
        "NOT",
        "BETWEEN",
        "IN",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "CONTAINS",
        "STARTSWITH",
        "ENDSWITH",
    ]
)
_OPS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-")


def _id_start(c: str) -> bool:
    return c.isalpha() or c in "_$"


def _id_part(c: str) -> bool:
    return c.isalnum() or c in "_$."


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise Sql92Error("unterminated comment", text, i)
            i = j + 2
        elif c == "'":
            j, parts = i + 1, []
            while True:
                k = text.find("'", j)
                if k < 0:
                    raise Sql92Error("unterminated string literal", text, i)
                parts.append(text[j:k])
                if text.startswith("''", k):
                    parts.append("'")
                    j = k + 2
                    continue
                j = k + 1
                break
            toks.append(_Tok("str", "".join(parts), i))
            i = j
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            toks.append(_number(text, i))
            i = _number_end(text, i)
        elif _id_start(c):
            j = i + 1
            while j < n and _id_part(text[j]):
                j += 1
            word = text[i:j]
            up = word.upper()
            if up in _KEYWORDS:
                toks.append(_Tok("kw", up, i))
            else:
                toks.append(_Tok("id", word, i))
            i = j
        else:
            for op in _OPS:
                if text.startswith(op, i):
                    toks.append(_Tok("op", op, i))
                    i += len(op)
                    break
            else:
                raise Sql92Error(f"unexpected character {c!r}", text, i)
    toks.append(_Tok("eof", None, n))
    return toks


def _number_end(text: str, i: int) -> int:
    n = len(text)
    if text.startswith(("0x", "0X"), i):
        j = i + 2
        while j < n and text[j] in "0123456789abcdefABCDEF":
            j += 1
        return j + (1 if j < n and text[j] in "lL" else 0)
    j = i
    while j < n and text[j].isdigit():
        j += 1
    is_float = False
    if j < n and text[j] == ".":
        is_float = True
        j += 1
        while j < n and text[j].isdigit():
            j += 1
    if j < n and text[j] in "eE":
        k = j + 1
        if k < n and text[k] in "+-":
            k += 1
        if k < n and text[k].isdigit():
            is_float = True
            j = k
            while j < n and text[j].isdigit():
                j += 1
    if is_float:
        return j + (1 if j < n and text[j] in "dDfF" else 0)
    return j + (1 if j < n and text[j] in "lL" else 0)


def _number(text: str, i: int) -> _Tok:
    """A long (decimal, 0x hex or 0-led octal; optional L) or a double literal."""
    j = _number_end(text, i)
    raw = text[i:j]
    if j < len(text) and _id_part(text[j]) and text[j] != ".":
        raise Sql92Error(f"malformed number {text[i : j + 1]!r}", text, i)
    is_float = False
    body = raw.rstrip("lLdDfF") if raw[:2].lower() != "0x" else raw.rstrip("lL")
    try:
        if body[:2].lower() == "0x":
            value: int | float = int(body[2:], 16)
        elif any(c in body for c in ".eE") or raw[-1] in "dDfF":
            value = float(body)
            is_float = True
        elif len(body) > 1 and body[0] == "0":
            value = int(body, 8)
        else:
            value = int(body)
    except ValueError:
        raise Sql92Error(f"malformed number {raw!r}", text, i) from None
    if is_float:
        if math.isinf(value):
            raise Sql92Error(f"number {raw!r} is out of the double range", text, i)
        return _Tok("float", value, i)
    # One more than the maximum is allowed so that "-9223372036854775808" can be negated.
    if value > _LONG_MAX + 1:
        raise Sql92Error(f"number {raw!r} is out of the long range", text, i)
    return _Tok("int", value, i)


# --- evaluation helpers -------------------------------------------------------------------------


class _NoMatch(Exception):
    """A value could not be converted: RocketMQ's evaluation throws, and the message does not
    match, whatever the rest of the expression says."""


_LONG_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(
    r"[+-]?(NaN|Infinity|(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?)"
)


def _as_long(v: str) -> int:
    """Java's Long.valueOf: sign and digits only, in the long range."""
    if _LONG_RE.fullmatch(v) is None:
        raise _NoMatch
    n = int(v)
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise _NoMatch
    return n


def _as_double(v: str) -> float:
    """Java's Double.valueOf: blanks around allowed, an f/d suffix, NaN and Infinity."""
    t = v.strip()
    if _DOUBLE_RE.fullmatch(t) is None:
        raise _NoMatch
    return float(t.rstrip("fFdD").replace("Infinity", "inf"))


def _convert(v: str, like: Value) -> Value:
    """A string property converted to the type of the literal it is compared with."""
    if isinstance(like, bool):
        return v.lower() == "true"  # Boolean.valueOf
    if isinstance(like, int):
        return _as_long(v)
    return _as_double(v)


def _compare(lv: Value, rv: Value) -> int:
    """RocketMQ's comparison of two non-null values (string conversion on, its default): a
    string against a number or boolean is converted to that type (failure: no match); numbers
    compare as numbers; otherwise different types are unequal (-1)."""
    if type(lv) is not type(rv):
        if isinstance(lv, str):
            lv = _convert(lv, rv)
        elif isinstance(rv, str):
            rv = _convert(rv, lv)
        elif isinstance(lv, bool) or isinstance(rv, bool):
            return -1
    if type(lv) is not type(rv) and (isinstance(lv, bool) or isinstance(rv, bool)):
        return -1
    if lv == rv:
        return 0
    return -1 if lv < rv else 1  # type: ignore[operator]


def _ordering(op: str) -> Callable[[Value, Value], Value]:
    def cmp(lv: Value, rv: Value) -> Value:
        if lv is None or rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):
            # Strings are not ordered: both are read as doubles, or the message does not match.
            lv, rv = _as_double(lv), _as_double(rv)
        c = _compare(lv, rv)
        if op == ">":
            return c > 0
        if op == ">=":
            return c >= 0
        if op == "<":
            return c < 0
        return c <= 0

    return cmp


def _equal(lv: Value, rv: Value) -> Value:
    # One side NULL: unknown when it is the left one, FALSE when the right; both: TRUE.
    if lv is None:
        return True if rv is None else None
    if rv is None:
        return False
    if type(lv) is str and type(rv) is str:
        return lv == rv  # strings are equal as strings only ('5.0' <> '5')
    return _compare(lv, rv) == 0


def _not(v: Value) -> Value:
    return None if v is None else not v


# --- parser -------------------------------------------------------------------------------------


class _Node(NamedTuple):
    fn: _Eval
    boolean: bool  # whether it yields a boolean (RocketMQ's BooleanExpression)
    const: Value | None  # the value of a literal, else None
    is_const: bool
    is_property: bool
    text: str  # for error messages
    pos: int


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def is_kw(self, word: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind == "kw" and t.value == word

    def is_op(self, op: str) -> bool:
        t = self.peek()
        return t.kind == "op" and t.value == op

    def fail(self, message: str, tok: _Tok | None = None) -> Sql92Error:
        t = tok or self.peek()
        return Sql92Error(message, self.text, t.pos)

    def expected(self, what: str) -> Sql92Error:
        t = self.peek()
        got = "end of expression" if t.kind == "eof" else repr(self.text[t.pos : t.pos + 20])
        return self.fail(f"expected {what}, found {got}")

    def boolean(self, node: _Node) -> _Node:
        if not node.boolean:
            raise Sql92Error(
                f"expression {node.text!r} will not result in a boolean value", self.text, node.pos
            )
        return node

    def parse(self) -> _Node:
        node = self.boolean(self.or_expr())
        if self.peek().kind != "eof":
            raise self.expected("an operator or the end of the expression")
        return node

    def or_expr(self) -> _Node:
        left = self.and_expr()
        while self.is_kw("OR"):
            self.take()
            right = self.boolean(self.and_expr())
            left = _or(self.boolean(left), right)
        return left

    def and_expr(self) -> _Node:
        left = self.equality()
        while self.is_kw("AND"):
            self.take()
            right = self.boolean(self.equality())
            left = _and(self.boolean(left), right)
        return left

    def equality(self) -> _Node:
        left = self.compare()
        while True:
            if self.is_op("=") or self.is_op("<>"):
                op = self.take()
                right = self.compare()
                self.check_equal(left, right, op)
                node = _binary(left, right, _equal, "=")
                left = _negate(node) if op.value == "<>" else node
            elif self.is_kw("IS"):
                self.take()
                negated = False
                if self.is_kw("NOT"):
                    self.take()
                    negated = True
                if not self.is_kw("NULL"):
                    raise self.expected("NULL")
                self.take()
                left = _is_null(left, negated)
            else:
                return left

    def check_equal(self, left: _Node, right: _Node, op: _Tok) -> None:
        for side in (left, right):
            if side.is_const and side.const is None:
                raise self.fail(f"'{side.text}' cannot be compared (use IS NULL)", op)
        if left.is_const and right.is_const:
            lnum = isinstance(left.const, int | float) and not isinstance(left.const, bool)
            rnum = isinstance(right.const, int | float) and not isinstance(right.const, bool)
            same = lnum == rnum and isinstance(left.const, bool) == isinstance(right.const, bool)
            if not same:
                raise self.fail(f"'{left.text}' cannot be compared with '{right.text}'", op)

    def check_ordered(self, node: _Node, op: _Tok) -> None:
        if (
            node.boolean
            or (node.is_const and not isinstance(node.const, int | float))
            or (node.is_const and isinstance(node.const, bool))
        ):
            raise self.fail(f"'{node.text}' cannot be compared with {op.value}", op)

    def search_string(self, what: str) -> str:
        t = self.peek()
        if t.kind != "str":
            raise self.expected(f"a string literal after {what}")
        self.take()
        assert isinstance(t.value, str)
        return t.value

    def compare(self) -> _Node:
        left = self.unary()
        while True:
            t = self.peek()
            if t.kind == "op" and t.value in (">", ">=", "<", "<="):
                self.take()
                right = self.unary()
                self.check_ordered(left, t)
                self.check_ordered(right, t)
                left = _binary(left, right, _ordering(str(t.value)), str(t.value))
                continue
            negated = self.is_kw("NOT") and self.peek(1).kind == "kw"
            k = 1 if negated else 0
            if self.is_kw("BETWEEN", k):
                op = self.peek(k)
                self.i += k + 1
                low = self.unary()
                if not self.is_kw("AND"):
                    raise self.expected("AND in BETWEEN")
                self.take()
                high = self.unary()
                for side in (left, low, high):
                    self.check_ordered(side, op)
                ge = _binary(left, low, _ordering(">="), ">=")
                le = _binary(left, high, _ordering("<="), "<=")
                if negated:
                    left = _or(
                        _binary(left, low, _ordering("<"), "<"),
                        _binary(left, high, _ordering(">"), ">"),
                    )
                else:
                    left = _and(ge, le)
                continue
            if self.is_kw("IN", k):
                op = self.peek(k)
                if not left.is_property:
                    raise self.fail(f"expected a property before IN, got '{left.text}'", op)
                self.i += k + 1
                if not self.is_op("("):
                    raise self.expected("'(' after IN")
                self.take()
                items: set[str] = set()
                count = 0
                while True:
                    items.add(self.search_string("IN ("))
                    count += 1
                    if count > MAX_IN_LIST:
                        raise self.fail(f"more than {MAX_IN_LIST} strings in an IN list")
                    if self.is_op(","):
                        self.take()
                        continue
                    if not self.is_op(")"):
                        raise self.expected("',' or ')' in the IN list")
                    self.take()
                    break
                left = _in(left, frozenset(items), negated)
                continue
            for word, fn in (("CONTAINS", str.__contains__), ("STARTSWITH", str.startswith),
                             ("ENDSWITH", str.endswith)):  # fmt: skip
                if self.is_kw(word, k):
                    self.i += k + 1
                    left = _string_test(left, self.search_string(word), fn, negated)
                    break
            else:
                return left

    def unary(self) -> _Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"expression nested deeper than {MAX_DEPTH} levels")
        try:
            t = self.peek()
            if t.kind == "op" and t.value in ("+", "-"):
                nxt = self.peek(1)
                if t.value == "-" and nxt.kind == "int" and nxt.value == _LONG_MAX + 1:
                    self.i += 2  # Long.MIN_VALUE: only its negation is in range
                    return _const(_LONG_MIN, f"-{nxt.value}", t.pos)
                self.take()
                operand = self.unary()
                if operand.boolean or (operand.is_const and not isinstance(
                    operand.const, int | float
                )) or isinstance(operand.const, bool):  # fmt: skip
                    raise self.fail(f"cannot apply {t.value} to '{operand.text}'", t)
                if t.value == "+":
                    return operand
                return _negative(operand, t.pos)
            if t.kind == "kw" and t.value == "NOT":
                self.take()
                operand = self.boolean(self.unary())
                return _negate(operand, t.pos)
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> _Node:
        t = self.peek()
        text = self.text
        if t.kind == "op" and t.value == "(":
            self.take()
            inner = self.or_expr()  # the enclosing `unary` counted this level
            if not self.is_op(")"):
                raise self.expected("')'")
            self.take()
            return inner
        if t.kind in ("str", "int", "float"):
            self.take()
            value = t.value
            assert isinstance(value, str | int | float)
            if t.kind == "int" and value == _LONG_MAX + 1:
                raise self.fail("number is out of the long range", t)
            return _const(value, text[t.pos : self.peek().pos].strip(), t.pos)
        if t.kind == "kw" and t.value in ("TRUE", "FALSE", "NULL"):
            self.take()
            value = {"TRUE": True, "FALSE": False, "NULL": None}[str(t.value)]
            return _Node(
                lambda _p: value, t.value != "NULL", value, True, False, str(t.value), t.pos
            )
        if t.kind == "id":
            self.take()
            name = str(t.value)
            return _Node(lambda p: p.get(name), False, None, False, True, name, t.pos)
        raise self.expected("a property, a literal or '('")


def _const(value: Value, text: str, pos: int) -> _Node:
    return _Node(lambda _p: value, False, value, True, False, text, pos)


def _negative(operand: _Node, pos: int) -> _Node:
    if operand.is_const:
        value = operand.const
        assert isinstance(value, int | float)
        return _const(-value, "-" + operand.text, pos)
    fn = operand.fn

    def neg(p: Mapping[str, str]) -> Value:
        v = fn(p)
        # Only numbers are negated; a property (a string) gives NULL, as RocketMQ.
        if not isinstance(v, int | float) or isinstance(v, bool):
            return None
        return -v

    return _Node(neg, False, None, False, False, "-" + operand.text, pos)


def _binary(left: _Node, right: _Node, op: Callable[[Value, Value], Value], sym: str) -> _Node:
    lf, rf = left.fn, right.fn
    return _Node(
        lambda p: op(lf(p), rf(p)), True, None, False, False,
        f"{left.text} {sym} {right.text}", left.pos,
    )  # fmt: skip


def _negate(node: _Node, pos: int | None = None) -> _Node:
    fn = node.fn
    return _Node(lambda p: _not(fn(p)), True, None, False, False, f"NOT {node.text}",
                 node.pos if pos is None else pos)  # fmt: skip


def _and(left: _Node, right: _Node) -> _Node:
    lf, rf = left.fn, right.fn

    def fn(p: Mapping[str, str]) -> Value:
        lv = lf(p)
        if lv is False:
            return False
        rv = rf(p)
        if rv is False:
            return False
        if lv is None or rv is None:
            return None
        return True

    return _Node(fn, True, None, False, False, f"{left.text} AND {right.text}", left.pos)


def _or(left: _Node, right: _Node) -> _Node:
    lf, rf = left.fn, right.fn

    def fn(p: Mapping[str, str]) -> Value:
        lv = lf(p)
        if lv is True:
            return True
        rv = rf(p)
        if rv is True:
            return True
        if lv is None or rv is None:
            return None
        return False

    return _Node(fn, True, None, False, False, f"{left.text} OR {right.text}", left.pos)


def _is_null(node: _Node, negated: bool) -> _Node:
    fn = node.fn
    if negated:
        return _Node(lambda p: fn(p) is not None, True, None, False, False,
                     f"{node.text} IS NOT NULL", node.pos)  # fmt: skip
    return _Node(lambda p: fn(p) is None, True, None, False, False, f"{node.text} IS NULL",
                 node.pos)  # fmt: skip


def _in(node: _Node, items: frozenset[str], negated: bool) -> _Node:
    fn = node.fn

    def test(p: Mapping[str, str]) -> Value:
        v = fn(p)
        if not isinstance(v, str):
            return None  # NULL (or not a string): unknown, also for NOT IN
        return (v in items) != negated

    return _Node(test, True, None, False, False, f"{node.text} IN (...)", node.pos)


def _string_test(node: _Node, search: str, fn: Callable[[str, str], bool], negated: bool) -> _Node:
    get = node.fn

    def test(p: Mapping[str, str]) -> Value:
        # An empty search string, a NULL or a non-string never matches, negated or not.
        if not search:
            return False
        v = get(p)
        if not isinstance(v, str):
            return False
        return fn(v, search) != negated

    return _Node(test, True, None, False, False, node.text, node.pos)


class Sql92Filter:
    """A compiled expression."""

    __slots__ = ("_fn", "expression")

    def __init__(self, expression: str, fn: _Eval) -> None:
        self.expression = expression
        self._fn = fn

    def evaluate(self, properties: Mapping[str, str]) -> Value:
        """TRUE, FALSE or None (unknown, or a value that could not be converted)."""
        try:
            return self._fn(properties)
        except _NoMatch:
            return None

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether the expression is TRUE for `properties` (unknown does not match, nor does
        a message with a value that could not be converted)."""
        try:
            return self._fn(properties) is True
        except _NoMatch:
            return False


def compile_sql92(expression: str) -> Sql92Filter:
    """Compile `expression`.

    Raises:
        Sql92Error: the expression is empty, too long, nested too deep, malformed, or does not
            yield a boolean; the message starts with the position ("column 7: ...").
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise Sql92Error(
            f"expression longer than {MAX_EXPRESSION_LENGTH} characters",
            expression,
            MAX_EXPRESSION_LENGTH,
        )
    if not expression.strip():
        raise Sql92Error("empty expression", expression, 0)
    node = _Parser(expression).parse()
    return Sql92Filter(expression, node.fn)

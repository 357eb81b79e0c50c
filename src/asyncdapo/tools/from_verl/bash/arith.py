"""bash's arithmetic (`$(( ))`, `(( ))`, `let`, array indices): 64-bit signed integers that wrap,
C's operators and precedence (unary minus binds tighter than `**`), division and remainder that
truncate toward zero, comparisons and logic giving 1/0, `&&` `||` `?:` that skip what they do not
take, assignments, and names whose values are themselves arithmetic (`a=2+3; $((a*2))` is 10)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_BITS = 64
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
_MAX_DEPTH = 64  # bash allows 1024; a name whose value names itself fails either way
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>[0-9][0-9A-Za-z@_#]*)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]*\])?)
    | (?P<op>\*\*=|<<=|>>=|\*\*|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&^|]=|[-+*/%<>=!~&^|?:(),])
    )""",
    re.VERBOSE,
)
_ASSIGN_OPS = frozenset({"=", "*=", "/=", "%=", "+=", "-=", "<<=", ">>=", "&=", "^=", "|="})
_LEVELS: tuple[tuple[str, ...], ...] = (
    ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="), ("<<", ">>"), ("+", "-"), ("*", "/", "%"),
)  # fmt: skip


class ArithError(Exception):
    """An expression bash refuses (syntax, division by 0, a bad number), in bash's words."""


Lookup = Callable[[str], str]  # a variable's value as text ("" counts 0); raises if it is unknown
Store = Callable[[str, int], None]


def wrap(value: int) -> int:
    half = 1 << (_BITS - 1)
    return ((value + half) % (1 << _BITS)) - half


def parse_number(text: str) -> int:
    """bash's integer constants: decimal, 0x hex, 0 octal, base#digits."""
    if "#" in text:
        base_text, _, digits = text.partition("#")
        base = int(base_text)
        if not 2 <= base <= 64 or not digits:
            raise ArithError(f"{text}: invalid arithmetic base")
    elif text[:2] in ("0x", "0X"):
        base, digits = 16, text[2:]
    elif text.startswith("0") and len(text) > 1:
        base, digits = 8, text[1:]
    else:
        base, digits = 10, text
    value = 0
    for ch in digits:
        d = _DIGITS.index(ch) if ch in _DIGITS else 99
        if base <= 36 and ch.isalpha():
            d = _DIGITS.index(ch.lower())
        if d >= base:
            raise ArithError(f"{text}: value too great for base")
        value = value * base + d
    return wrap(value)


@dataclass(frozen=True)
class _Node:
    kind: str  # num, var, unary, binary, and, or, cond, assign, pre, post, comma
    op: str = ""
    value: int = 0
    name: str = ""
    args: tuple[_Node, ...] = ()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise ArithError(
                    f"{text}: syntax error: invalid arithmetic operator (error token is {text[pos:].strip()!r})"
                )
            pos = m.end()
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind)))
        self.i = 0

    def peek(self, n: int = 0) -> tuple[str, str]:
        j = self.i + n
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def is_op(self, *ops: str) -> bool:
        kind, text = self.peek()
        return kind == "op" and text in ops

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def error(self) -> ArithError:
        rest = " ".join(t for _, t in self.tokens[self.i :])
        if not rest:
            return ArithError(f"{self.text}: syntax error: operand expected")
        return ArithError(f"{self.text}: syntax error in expression (error token is {rest!r})")

    def parse(self) -> _Node:
        if not self.tokens:
            return _Node("num", value=0)
        node = self.comma()
        if self.peek()[0] != "end":
            raise self.error()
        return node

    def comma(self) -> _Node:
        node = self.assign()
        while self.is_op(","):
            self.take()
            node = _Node("comma", args=(node, self.assign()))
        return node

    def assign(self) -> _Node:
        kind, text = self.peek()
        nxt_kind, nxt = self.peek(1)
        if kind == "name" and nxt_kind == "op" and nxt in _ASSIGN_OPS:
            self.i += 2
            return _Node("assign", op=nxt, name=text, args=(self.assign(),))
        return self.conditional()

    def conditional(self) -> _Node:
        node = self.logical_or()
        if self.is_op("?"):
            self.take()
            then = self.comma()
            if not self.is_op(":"):
                raise self.error()
            self.take()
            return _Node("cond", args=(node, then, self.conditional()))
        return node

    def logical_or(self) -> _Node:
        node = self.logical_and()
        while self.is_op("||"):
            self.take()
            node = _Node("or", args=(node, self.logical_and()))
        return node

    def logical_and(self) -> _Node:
        node = self.binary(0)
        while self.is_op("&&"):
            self.take()
            node = _Node("and", args=(node, self.binary(0)))
        return node

    def binary(self, level: int) -> _Node:
        if level == len(_LEVELS):
            return self.power()
        node = self.binary(level + 1)
        while self.is_op(*_LEVELS[level]):
            op = self.take()[1]
            node = _Node("binary", op=op, args=(node, self.binary(level + 1)))
        return node

    def power(self) -> _Node:
        node = self.unary()
        if self.is_op("**"):
            self.take()
            return _Node("binary", op="**", args=(node, self.power()))
        return node

    def unary(self) -> _Node:
        if self.is_op("-", "+", "!", "~"):
            op = self.take()[1]
            return _Node("unary", op=op, args=(self.unary(),))
        if self.is_op("++", "--") and self.peek(1)[0] == "name":
            op = self.take()[1]
            return _Node("pre", op=op, name=self.take()[1])
        return self.postfix()

    def postfix(self) -> _Node:
        kind, text = self.take()
        if kind == "num":
            return _Node("num", value=parse_number(text))
        if kind == "name":
            if self.is_op("++", "--"):
                return _Node("post", op=self.take()[1], name=text)
            return _Node("var", name=text)
        if kind == "op" and text == "(":
            node = self.comma()
            if not self.is_op(")"):
                raise self.error()
            self.take()
            return node
        self.i -= 1
        raise self.error()


def _divide(a: int, b: int, op: str) -> int:
    if b == 0:
        raise ArithError("division by 0 (error token is the divisor)")
    q = abs(a) // abs(b)
    q = q if (a >= 0) == (b >= 0) else -q
    return q if op == "/" else a - b * q


def _binary(op: str, a: int, b: int) -> int:
    match op:
        case "+":
            return a + b
        case "-":
            return a - b
        case "*":
            return a * b
        case "/" | "%":
            return _divide(a, b, op)
        case "**":
            if b < 0:
                raise ArithError("exponent less than 0")
            return pow(a, b, 1 << _BITS)
        case "<<":
            return a << (b % _BITS)
        case ">>":
            return a >> (b % _BITS)
        case "&":
            return a & b
        case "^":
            return a ^ b
        case "|":
            return a | b
        case "==":
            return int(a == b)
        case "!=":
            return int(a != b)
        case "<":
            return int(a < b)
        case "<=":
            return int(a <= b)
        case ">":
            return int(a > b)
        case ">=":
            return int(a >= b)
    raise ArithError(f"unknown operator {op}")


class _Evaluator:
    def __init__(self, lookup: Lookup, store: Store | None, depth: int) -> None:
        self.lookup, self.store, self.depth = lookup, store, depth

    def variable(self, name: str) -> int:
        text = self.lookup(name).strip()
        if not text:
            return 0
        if self.depth >= _MAX_DEPTH:
            raise ArithError(f"{name}: expression recursion level exceeded")
        return evaluate(text, self.lookup, self.store, self.depth + 1)

    def set(self, name: str, value: int) -> int:
        if self.store is None:
            raise ArithError(f"{name}: assignment is not allowed here")
        self.store(name, value)
        return value

    def run(self, node: _Node, skip: bool = False) -> int:
        match node.kind:
            case "num":
                return node.value
            case "var":
                return 0 if skip else self.variable(node.name)
            case "unary":
                v = self.run(node.args[0], skip)
                return wrap({"-": -v, "+": v, "!": int(not v), "~": ~v}[node.op])
            case "binary":
                a, b = self.run(node.args[0], skip), self.run(node.args[1], skip)
                return 0 if skip else wrap(_binary(node.op, a, b))
            case "and":
                a = self.run(node.args[0], skip)
                b = self.run(node.args[1], skip or not a)
                return int(bool(a) and bool(b))
            case "or":
                a = self.run(node.args[0], skip)
                b = self.run(node.args[1], skip or bool(a))
                return int(bool(a) or bool(b))
            case "cond":
                c = self.run(node.args[0], skip)
                a = self.run(node.args[1], skip or not c)
                b = self.run(node.args[2], skip or bool(c))
                return a if c else b
            case "comma":
                self.run(node.args[0], skip)
                return self.run(node.args[1], skip)
            case "assign":
                v = self.run(node.args[0], skip)
                if skip:
                    return 0
                if node.op != "=":
                    v = wrap(_binary(node.op[:-1], self.variable(node.name), v))
                return self.set(node.name, v)
            case "pre" | "post":
                if skip:
                    return 0
                old = self.variable(node.name)
                new = wrap(old + (1 if node.op == "++" else -1))
                self.set(node.name, new)
                return new if node.kind == "pre" else old
        raise ArithError(f"unknown expression {node.kind}")


def evaluate(text: str, lookup: Lookup, store: Store | None = None, depth: int = 0) -> int:
    """The value of a bash arithmetic expression whose `$` expansions are already done."""
    return _Evaluator(lookup, store, depth).run(_Parser(text).parse())

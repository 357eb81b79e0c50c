"""The commands recipes run inside `$( )` to compute a value, as text functions: echo's and
printf's escapes, printf's formats (reused while arguments remain, as bash does), coreutils'
`expr` arithmetic and comparisons, `basename` and `dirname`. Pure: no files, no processes."""

from __future__ import annotations

import re

_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
}
_PRINTF_SPEC = re.compile(r"%([-+ #0]*)(\d*|\*)(?:\.(\d*|\*))?([diouxXeEfFgGcsb%])")


def is_integer(text: str) -> bool:
    return re.fullmatch(r"\s*[-+]?[0-9]+\s*", text) is not None


def unescape(text: str, *, stop_at_c: bool = True) -> tuple[str, bool]:
    """echo -e / printf escapes; True when `\\c` asked to stop the output."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "c" and stop_at_c:
            return "".join(out), True
        elif nxt in "01234567":
            m = re.match(r"0?[0-7]{1,3}", text[i + 1 : i + 5])
            assert m is not None
            out.append(chr(int(m.group(), 8) & 0xFF))
            i += 1 + m.end()
        elif nxt == "x" and (m := re.match(r"[0-9A-Fa-f]{1,2}", text[i + 2 :])):
            out.append(chr(int(m.group(), 16)))
            i += 2 + m.end()
        elif nxt in "\"'?":
            out.append(nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out), False


def basename(path: str, suffix: str | None) -> str:
    if not path:
        return ""
    stripped = path.rstrip("/")
    if not stripped:
        return "/"
    base = stripped.rsplit("/", 1)[-1]
    if suffix and base != suffix and base.endswith(suffix):
        base = base[: -len(suffix)]
    return base


def dirname(path: str) -> str:
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path else "."
    if "/" not in stripped:
        return "."
    return stripped.rsplit("/", 1)[0].rstrip("/") or "/"


def _integer(text: str) -> int:
    if not text:
        return 0
    if text[0] in "'\"":
        return ord(text[1]) if len(text) > 1 else 0
    m = re.fullmatch(r"\s*([-+]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*", text)
    if not m:
        raise ValueError(f"{text}: invalid number")
    digits = m.group(2)
    base = 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") else 10
    value = int(digits, base)
    return -value if m.group(1) == "-" else value


def printf(fmt: str, args: list[str]) -> str:
    """bash's printf: the format is reused while arguments remain; missing ones count as ""/0."""
    out: list[str] = []
    rest = list(args)
    while True:
        used = 0
        pos = 0
        for m in _PRINTF_SPEC.finditer(fmt):
            out.append(unescape(fmt[pos : m.start()], stop_at_c=False)[0])
            pos = m.end()
            flags, width, precision, conv = m.groups()
            if conv == "%":
                out.append("%")
                continue
            if "*" in (width, precision):
                raise ValueError("printf `*` widths are not read")
            arg = rest.pop(0) if rest else ""
            used += 1
            spec = f"%{flags}{width}" + (f".{precision}" if precision is not None else "")
            if conv in "diouxX":
                out.append((spec + ("d" if conv in "iu" else conv)) % _integer(arg))
            elif conv in "eEfFgG":
                out.append((spec + conv) % (float(arg) if arg else 0.0))
            elif conv == "c":
                out.append((spec + "s") % arg[:1])
            elif conv == "b":
                out.append((spec + "s") % unescape(arg)[0])
            else:
                out.append((spec + "s") % arg)
        out.append(unescape(fmt[pos:], stop_at_c=False)[0])
        if not rest or not used:
            return "".join(out)


class ExprError(Exception):
    pass


class Expr:
    """coreutils `expr`: integer arithmetic, comparisons, `|` `&`, parentheses, `length`."""

    def __init__(self, words: list[str]) -> None:
        self.words, self.i = words, 0

    def peek(self) -> str | None:
        return self.words[self.i] if self.i < len(self.words) else None

    def take(self) -> str:
        word = self.peek()
        if word is None:
            raise ExprError("syntax error: missing argument")
        self.i += 1
        return word

    def parse(self) -> str:
        value = self.alternative()
        if self.peek() is not None:
            raise ExprError(f"syntax error: unexpected argument {self.peek()!r}")
        return value

    @staticmethod
    def null(value: str) -> bool:
        return value == "" or (is_integer(value) and int(value) == 0)

    @staticmethod
    def number(value: str) -> int:
        if not re.fullmatch(r"[-+]?[0-9]+", value):
            raise ExprError(f"non-integer argument {value!r}")
        return int(value)

    def alternative(self) -> str:
        left = self.conjunction()
        while self.peek() == "|":
            self.take()
            right = self.conjunction()
            left = left if not self.null(left) else right if not self.null(right) else "0"
        return left

    def conjunction(self) -> str:
        left = self.comparison()
        while self.peek() == "&":
            self.take()
            right = self.comparison()
            left = left if not (self.null(left) or self.null(right)) else "0"
        return left

    def comparison(self) -> str:
        left = self.sum()
        while self.peek() in ("<", "<=", "=", "==", "!=", ">=", ">"):
            op = self.take()
            right = self.sum()
            if re.fullmatch(r"[-+]?[0-9]+", left) and re.fullmatch(r"[-+]?[0-9]+", right):
                order = (int(left) > int(right)) - (int(left) < int(right))
            else:
                order = (left > right) - (left < right)
            result = {"<": order < 0, "<=": order <= 0, "=": order == 0, "==": order == 0,
                      "!=": order != 0, ">=": order >= 0, ">": order > 0}[op]  # fmt: skip
            left = "1" if result else "0"
        return left

    def sum(self) -> str:
        left = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            a, b = self.number(left), self.number(self.product())
            left = str(a + b if op == "+" else a - b)
        return left

    def product(self) -> str:
        left = self.primary()
        while self.peek() in ("*", "/", "%"):
            op = self.take()
            a, b = self.number(left), self.number(self.primary())
            if b == 0:
                raise ExprError("division by zero")
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            left = str(a * b if op == "*" else q if op == "/" else a - b * q)
        return left

    def primary(self) -> str:
        word = self.take()
        if word == "(":
            value = self.alternative()
            if self.take() != ")":
                raise ExprError("syntax error: expecting ')'")
            return value
        if word == "length":
            return str(len(self.primary()))
        if word == "+":
            return self.take()
        if word in (":", "match", "substr", "index"):
            raise ExprError(f"`{word}` is not read")
        if self.peek() == ":":
            raise ExprError("regular-expression matching (`:`) is not read")
        return word

"""Conditions as bash evaluates them: `test` / `[ … ]` (POSIX rules by argument count, then `!`,
`( )`, `-a` over `-o`) and `[[ … ]]` (no splitting, `==`/`!=` against a glob, `=~`, `&&` `||` `!`
`( )`, arithmetic operands for `-eq` and kin).

A test that cannot be decided here (a file test, an operand that cannot be expanded) is None,
with why in the shell's `undecided`, rather than an error: `-a`/`-o`/`&&`/`||` still decide when
the other side does, and the interpreter runs both ways through a condition left undecided."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from asyncdapo.tools.from_verl.bash import coreutils
from asyncdapo.tools.from_verl.bash.syntax import Word
from asyncdapo.tools.from_verl.bash.values import Blocked

if TYPE_CHECKING:
    from asyncdapo.tools.from_verl.bash.interpreter import Shell

_FILE_TESTS = frozenset(f"-{c}" for c in "abcdefghkprstuwxGLNOS")
_INT_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_STRING_TESTS = frozenset({"=", "==", "!=", "<", ">"})
_BINARY_TESTS = _INT_TESTS | _STRING_TESTS | {"-nt", "-ot", "-ef"}


class Undecidable(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def guard(shell: Shell, test: Callable[[], bool | None]) -> bool | None:
    """A test that may not be decidable: None (and why) instead of an error, so that
    `-a`/`-o`/`&&`/`||` can still decide when the other side does."""
    try:
        return test()
    except Undecidable as e:
        shell.undecided = e.why
    except Blocked as e:
        shell.undecided = e.unknown.brief()
    return None


def test(shell: Shell, words: list[str]) -> bool | None:
    """`test` / `[ ]` (POSIX rules by argument count); None: it cannot be evaluated here."""
    n = len(words)
    if n == 0:
        return False
    if n == 1:
        return words[0] != ""
    if n == 2:
        if words[0] == "!":
            return _not(test(shell, words[1:]))
        return guard(shell, lambda: unary(shell, words[0], words[1]))
    if n == 3:
        if words[1] in _BINARY_TESTS:
            return guard(shell, lambda: binary(shell, words[0], words[1], words[2], pattern=False))
        if words[1] == "-a":
            return _and(test(shell, words[:1]), test(shell, words[2:]))
        if words[1] == "-o":
            return _or(test(shell, words[:1]), test(shell, words[2:]))
    if n in (3, 4) and words[0] == "!":
        return _not(test(shell, words[1:]))
    if n in (3, 4) and words[0] == "(" and words[-1] == ")":
        return test(shell, words[1:-1])
    return _TestParser(shell, words).parse()


def cond_expr(shell: Shell, parts: list[Word | str]) -> bool | None:
    """`[[ … ]]`; None: it cannot be evaluated here."""
    return _CondParser(shell, parts).parse()


def unary(shell: Shell, op: str, operand: str) -> bool | None:
    if op == "-z":
        return operand == ""
    if op == "-n":
        return operand != ""
    if op == "-v":
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?", operand)
        if not m:
            return False
        try:
            return shell.lookup(m.group(1), m.group(2)) is not None
        except Blocked as e:
            raise Undecidable(e.unknown.brief()) from None
    if op in _FILE_TESTS:
        raise Undecidable(f"`{op}` tests the file system")
    raise Undecidable(f"`{op} {operand}` cannot be evaluated here")


def binary(shell: Shell, left: str, op: str, right: str | re.Pattern[str], *, pattern: bool) -> bool | None:
    if op in ("=", "==", "!="):
        same = right.fullmatch(left) is not None if isinstance(right, re.Pattern) else left == right
        return same if op != "!=" else not same
    assert isinstance(right, str)
    if op in ("<", ">"):
        return left < right if op == "<" else left > right
    if op in _INT_TESTS:
        if pattern:  # [[ ]]: the operands are arithmetic
            a, b = shell.arithmetic(left, left), shell.arithmetic(right, right)
        else:
            for operand in (left, right):
                if not coreutils.is_integer(operand):
                    raise Undecidable(f"{operand!r}: integer expression expected")
            a, b = int(left), int(right)
        return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
    raise Undecidable(f"`{op}` compares files")


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


class _Connectives(ABC):
    """What `[ ]` and `[[ ]]` share: `!` binds tightest, then and, then or; `( )` groups. Both
    sides of an and/or are evaluated, so that one side can decide when the other cannot."""

    BRACKET: ClassVar[str]  # as the messages name the command: "[" or "[["
    AND: ClassVar[str]
    OR: ClassVar[str]

    def __init__(self, shell: Shell) -> None:
        self.shell, self.i = shell, 0

    @abstractmethod
    def peek(self, n: int = 0) -> str | None: ...

    @abstractmethod
    def primary(self) -> bool | None: ...

    def disjunction(self) -> bool | None:
        value = self.conjunction()
        while self.peek() == self.OR:
            self.i += 1
            value = _or(value, self.conjunction())
        return value

    def conjunction(self) -> bool | None:
        value = self.negation()
        while self.peek() == self.AND:
            self.i += 1
            value = _and(value, self.negation())
        return value

    def negation(self) -> bool | None:
        if self.peek() == "!":
            self.i += 1
            return _not(self.negation())
        return self.primary()

    def group(self) -> bool | None:
        """`( … )`, its `(` the next word."""
        self.i += 1
        value = self.disjunction()
        if self.peek() != ")":
            raise Undecidable(f"`{self.BRACKET}`: `)` expected")
        self.i += 1
        return value


class _TestParser(_Connectives):
    """`[ … ]` with more than four arguments: `!`, `( )`, `-a` over `-o`."""

    BRACKET, AND, OR = "[", "-a", "-o"

    def __init__(self, shell: Shell, words: list[str]) -> None:
        super().__init__(shell)
        self.words = words

    def peek(self, n: int = 0) -> str | None:
        return self.words[self.i + n] if self.i + n < len(self.words) else None

    def parse(self) -> bool | None:
        value = self.disjunction()
        if self.i != len(self.words):
            raise Undecidable(f"`[ {' '.join(self.words)} ]`: too many arguments")
        return value

    def primary(self) -> bool | None:
        word = self.peek()
        if word is None:
            raise Undecidable("`[`: argument expected")
        if word == "(":
            return self.group()
        op = self.peek(1)
        if op is not None and op in _BINARY_TESTS and self.peek(2) is not None:
            self.i += 3
            right = self.words[self.i - 1]
            return guard(self.shell, lambda: binary(self.shell, word, op, right, pattern=False))
        if word.startswith("-") and len(word) == 2 and op is not None:
            self.i += 2
            return guard(self.shell, lambda: unary(self.shell, word, op))
        self.i += 1
        return word != ""


class _CondParser(_Connectives):
    """`[[ … ]]`: no splitting, `==`/`!=` against a glob, `=~`, `&&` `||` `!` `( )`."""

    BRACKET, AND, OR = "[[", "&&", "||"

    def __init__(self, shell: Shell, parts: list[Word | str]) -> None:
        super().__init__(shell)
        self.parts = parts

    def peek(self, n: int = 0) -> str | None:
        if self.i + n >= len(self.parts):
            return None
        part = self.parts[self.i + n]
        return part.text if isinstance(part, Word) else part

    def word(self) -> Word:
        part = self.parts[self.i] if self.i < len(self.parts) else None
        if part is None:
            raise Undecidable("`[[`: an operand is missing")
        self.i += 1
        return part if isinstance(part, Word) else Word(part, 0)

    def parse(self) -> bool | None:
        value = self.disjunction()
        if self.i != len(self.parts):
            raise Undecidable("`[[`: unexpected text")
        return value

    def primary(self) -> bool | None:
        if self.peek() == "(":
            return self.group()
        shell = self.shell
        first, op = self.peek(), self.peek(1)
        if first is not None and re.fullmatch(r"-[a-zA-Z]", first) and op not in (None, "&&", "||", ")"):
            self.i += 1
            operand = self.word()
            return guard(shell, lambda: unary(shell, first, shell.string(operand)))
        left = self.word()
        op = self.peek()
        if op in _BINARY_TESTS or op == "=~":
            self.i += 1
            right = self.word()
            assert op is not None
            return guard(shell, lambda: self.binary(left, op, right))
        return guard(shell, lambda: shell.string(left) != "")

    def binary(self, left: Word, op: str, right: Word) -> bool | None:
        shell = self.shell
        value = shell.string(left)
        if op in ("=", "==", "!="):
            return binary(shell, value, op, shell.pattern(right.text), pattern=True)
        if op == "=~":
            regex = "".join(re.escape(c) if quoted else c for c, quoted in shell.chars(right.text))
            try:
                return re.search(regex, value) is not None
            except re.error as e:
                raise Undecidable(f"the regular expression {right.text}: {e}") from None
        return binary(shell, value, op, shell.string(right), pattern=True)

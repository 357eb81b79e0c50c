"""bash's words and operators, as far as recipe scripts use them: where a quoted string, an
escape or an expansion ends (also used by `expansion` to find the end of `$( )`, `${ }` and
`$(( ))` inside a word), the operators and redirections, `NAME=(…)` arrays, line continuations,
comments (one ends the command even after a continued line, as in bash) and here-documents
(whose bodies are skipped). The grammar is in `parse`."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Literal

from asyncdapo.tools.from_verl.bash.syntax import ShellSyntaxError, Word

_META = frozenset(" \t\n;&|()<>")
_OPERATORS = (
    ";;&", "<<<", "<<-", "&>>",
    ";;", ";&", "&&", "||", "|&", "&>", ">>", "<<", ">&", "<&", "<>", ">|",
    ";", "&", "|", "(", ")", "<", ">",
)  # fmt: skip
REDIRECTIONS = frozenset({"<", ">", ">>", "<<", "<<-", "<<<", ">&", "<&", "<>", ">|", "&>", "&>>"})
_FD = re.compile(r"\d+(?=[<>])")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]*)\])?(\+?)=(.*)", re.DOTALL)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---------------------------------------------------------------------------------------------
# scanning: where a quoted string, an expansion or a word ends


def _unterminated(text: str, start: int, what: str) -> ShellSyntaxError:
    return ShellSyntaxError(text.count("\n", 0, start) + 1, f"unterminated {what}")


def skip_unit(text: str, i: int) -> int:
    """The index after one lexical unit at i: a quoted string, an escape, an expansion or a char."""
    c = text[i]
    if c == "\\":
        return min(i + 2, len(text))
    if c == "'":
        end = text.find("'", i + 1)
        if end < 0:
            raise _unterminated(text, i, "'…' string")
        return end + 1
    if c == '"':
        return skip_double_quoted(text, i + 1)
    if c == "`":
        return _skip_backquoted(text, i + 1)
    if c == "$" and i + 1 < len(text):
        nxt = text[i + 1]
        if text.startswith("$((", i):
            return skip_arithmetic(text, i + 3)
        if nxt == "(":
            return skip_parens(text, i + 2)
        if nxt == "{":
            return skip_braces(text, i + 2)
        if nxt == "'":
            return _skip_ansi(text, i + 2)
        if nxt == '"':
            return skip_double_quoted(text, i + 2)
    return i + 1


def skip_double_quoted(text: str, i: int) -> int:
    """The index after the closing quote of a "…" string whose content starts at i."""
    start = i
    while i < len(text):
        c = text[i]
        if c == '"':
            return i + 1
        if c == "\\":
            i += 2
        elif c == "`" or (c == "$" and text[i + 1 : i + 2] in ("(", "{")):
            i = skip_unit(text, i)
        else:
            i += 1
    raise _unterminated(text, start, '"…" string')


def _skip_backquoted(text: str, i: int) -> int:
    start = i
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == "`":
            return i + 1
        else:
            i += 1
    raise _unterminated(text, start, "`…` command")


def _skip_ansi(text: str, i: int) -> int:
    start = i
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == "'":
            return i + 1
        else:
            i += 1
    raise _unterminated(text, start, "$'…' string")


def skip_parens(text: str, i: int) -> int:
    """The index after the `)` closing a `$(` or `(` whose content starts at i."""
    start, depth, word_start = i, 1, True
    while i < len(text):
        c = text[i]
        if c == "#" and word_start:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if c in "\\'\"`$":
            i = skip_unit(text, i)
            word_start = False
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        word_start = c in " \t\n;&|()"
        i += 1
    raise _unterminated(text, start, "$( … ) command")


def skip_arithmetic(text: str, i: int) -> int:
    """The index after the `))` closing a `$((` whose content starts at i; bash's nesting rule:
    parentheses inside balance, so `$(((512*100)))` is arithmetic on `(512*100)`."""
    start, depth = i, 0
    while i < len(text):
        c = text[i]
        if c in "\\'\"`$":
            i = skip_unit(text, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                if text[i + 1 : i + 2] == ")":
                    return i + 2
                return skip_parens(text, start - 1)  # `$( (…) … )`: a command substitution
            depth -= 1
        i += 1
    raise _unterminated(text, start, "$(( … )) arithmetic")


def skip_braces(text: str, i: int) -> int:
    """The index after the `}` closing a `${` whose content starts at i."""
    start = i
    while i < len(text):
        c = text[i]
        if c == "}":
            return i + 1
        i = skip_unit(text, i) if c in "\\'\"`$" else i + 1
    raise _unterminated(text, start, "${ … } expansion")


def _skip_word(text: str, i: int) -> int:
    while i < len(text) and text[i] not in _META:
        i = skip_unit(text, i)
    return i


# ---------------------------------------------------------------------------------------------
# tokens


@dataclass(frozen=True)
class Token:
    kind: Literal["word", "op", "newline", "eof", "array", "arith"]
    text: str
    line: int
    start: int
    end: int
    items: tuple[Word, ...] = ()


@dataclass
class Lexer:
    text: str
    base_line: int = 1
    pos: int = 0
    pending_heredocs: list[tuple[str, bool]] = field(default_factory=list)
    expect_delimiter: bool | None = None  # after `<<` (True: `<<-`)
    line_starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]

    def line_at(self, pos: int) -> int:
        return bisect.bisect_right(self.line_starts, pos) - 1 + self.base_line

    def _skip_blanks(self) -> None:
        text = self.text
        while self.pos < len(text):
            if text[self.pos] in " \t\r":
                self.pos += 1
            elif text.startswith("\\\n", self.pos):
                self.pos += 2
            elif text[self.pos] == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return

    def next(self) -> Token:
        self._skip_blanks()
        text, start = self.text, self.pos
        line = self.line_at(start)
        if start >= len(text):
            return Token("eof", "", line, start, start)
        c = text[start]
        if c == "\n":
            self.pos += 1
            self._skip_heredoc_bodies()
            return Token("newline", "\n", line, start, start + 1)
        if text.startswith("((", start):
            end = skip_arithmetic(text, start + 2)
            self.pos = end
            return Token("arith", text[start + 2 : end - 2], line, start, end)
        if c in "<>" and text[start + 1 : start + 2] == "(":  # process substitution: a word
            end = _skip_word(text, skip_parens(text, start + 2))
            self.pos = end
            return self._word(text[start:end], line, start, end)
        m = _FD.match(text, start)
        fd = m.group() if m else ""
        for op in _OPERATORS:
            if text.startswith(op, start + len(fd)) and (not fd or op in REDIRECTIONS):
                self.pos = start + len(fd) + len(op)
                if op in ("<<", "<<-"):
                    self.expect_delimiter = op == "<<-"
                return Token("op", fd + op, line, start, self.pos)
        end = _skip_word(text, start)
        self.pos = end
        word = text[start:end]
        if ASSIGNMENT.fullmatch(word) and word.endswith("=") and text[end : end + 1] == "(":
            return self._array(word, line, start)
        return self._word(word, line, start, end)

    def _word(self, word: str, line: int, start: int, end: int) -> Token:
        if self.expect_delimiter is not None:
            delimiter = re.sub(r"""['"\\]""", "", word)
            self.pending_heredocs.append((delimiter, self.expect_delimiter))
            self.expect_delimiter = None
        return Token("word", word, line, start, end)

    def _array(self, head: str, line: int, start: int) -> Token:
        self.pos += 1  # the "("
        items: list[Word] = []
        while True:
            self._skip_blanks()
            if self.pos >= len(self.text):
                raise ShellSyntaxError(line, f"unterminated array {head}(…)")
            c = self.text[self.pos]
            if c == "\n":
                self.pos += 1
                continue
            if c == ")":
                self.pos += 1
                return Token("array", head, line, start, self.pos, tuple(items))
            end = _skip_word(self.text, self.pos)
            if end == self.pos:
                raise ShellSyntaxError(self.line_at(self.pos), f"unexpected {c!r} in array {head}(…)")
            items.append(Word(self.text[self.pos : end], self.line_at(self.pos)))
            self.pos = end

    def _skip_heredoc_bodies(self) -> None:
        for delimiter, strip_tabs in self.pending_heredocs:
            while self.pos < len(self.text):
                end = self.text.find("\n", self.pos)
                end = len(self.text) if end < 0 else end
                line = self.text[self.pos : end]
                self.pos = min(end + 1, len(self.text))
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.pending_heredocs.clear()

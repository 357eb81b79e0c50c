"""bash's grammar, as far as recipe scripts use it: words (kept as written, quotes included, to be
expanded later), simple commands with assignments and redirections, pipelines, `&&`/`||` lists,
`if`/`for`/`while`/`until`/`case`, functions, `{ }` and `( )` groups, `[[ ]]`, `(( ))`, arrays
and here-documents (whose bodies are skipped). Line continuations and comments are handled as
bash does: a comment ends the command even after a continued line."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

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


class ShellSyntaxError(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Word:
    text: str  # as written: quotes, escapes and expansions still in it
    line: int
    array: tuple[Word, ...] | None = None  # `declare NAME=( … )`: text is "NAME=", these the items


@dataclass(frozen=True)
class Redirect:
    op: str  # with its file descriptor, if one was written: "2>", ">&", "<<"
    target: Word


@dataclass(frozen=True)
class Assign:
    name: str
    index: str | None  # NAME[index]=…
    append: bool  # NAME+=…
    value: Word | None  # NAME=value
    array: tuple[Word, ...] | None  # NAME=( … )
    line: int


@dataclass(frozen=True)
class Simple:
    assigns: tuple[Assign, ...]
    words: tuple[Word, ...]
    redirects: tuple[Redirect, ...]
    line: int
    text: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]
    text: str
    line: int


@dataclass(frozen=True)
class AndOr:
    first: Node
    rest: tuple[tuple[str, Node], ...]  # ("&&" | "||", command)
    line: int


@dataclass(frozen=True)
class Pipeline:
    commands: tuple[Node, ...]
    negated: bool
    line: int


@dataclass(frozen=True)
class If:
    clauses: tuple[tuple[Seq, Seq], ...]  # (condition, body): the `if` and each `elif`
    otherwise: Seq | None
    line: int


@dataclass(frozen=True)
class Loop:
    kind: Literal["for", "select", "while", "until", "arith-for"]
    name: str  # the loop variable (for/select)
    items: tuple[Word, ...] | None  # `for NAME in …`; None: "$@"
    condition: Seq | None  # while/until
    body: Seq
    header: str
    line: int


@dataclass(frozen=True)
class Case:
    word: Word
    arms: tuple[tuple[tuple[Word, ...], Seq], ...]
    line: int


@dataclass(frozen=True)
class Function:
    name: str
    body: Node
    line: int


@dataclass(frozen=True)
class Group:
    body: Seq
    subshell: bool
    line: int


@dataclass(frozen=True)
class CondExpr:
    """`[[ … ]]`: words and the operators between them (&&, ||, !, (, ), <, >)."""

    parts: tuple[Word | str, ...]
    text: str
    line: int


@dataclass(frozen=True)
class ArithCommand:
    expression: str
    text: str
    line: int


Node = Simple | Seq | AndOr | Pipeline | If | Loop | Case | Function | Group | CondExpr | ArithCommand


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
class _Token:
    kind: Literal["word", "op", "newline", "eof", "array", "arith"]
    text: str
    line: int
    start: int
    end: int
    items: tuple[Word, ...] = ()


@dataclass
class _Lexer:
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

    def next(self) -> _Token:
        self._skip_blanks()
        text, start = self.text, self.pos
        line = self.line_at(start)
        if start >= len(text):
            return _Token("eof", "", line, start, start)
        c = text[start]
        if c == "\n":
            self.pos += 1
            self._skip_heredoc_bodies()
            return _Token("newline", "\n", line, start, start + 1)
        if text.startswith("((", start):
            end = skip_arithmetic(text, start + 2)
            self.pos = end
            return _Token("arith", text[start + 2 : end - 2], line, start, end)
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
                return _Token("op", fd + op, line, start, self.pos)
        end = _skip_word(text, start)
        self.pos = end
        word = text[start:end]
        if ASSIGNMENT.fullmatch(word) and word.endswith("=") and text[end : end + 1] == "(":
            return self._array(word, line, start)
        return self._word(word, line, start, end)

    def _word(self, word: str, line: int, start: int, end: int) -> _Token:
        if self.expect_delimiter is not None:
            delimiter = re.sub(r"""['"\\]""", "", word)
            self.pending_heredocs.append((delimiter, self.expect_delimiter))
            self.expect_delimiter = None
        return _Token("word", word, line, start, end)

    def _array(self, head: str, line: int, start: int) -> _Token:
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
                return _Token("array", head, line, start, self.pos, tuple(items))
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


# ---------------------------------------------------------------------------------------------
# grammar


class _Parser:
    def __init__(self, text: str, base_line: int) -> None:
        self.text = text
        self.lexer = _Lexer(text, base_line)
        self.ahead: list[_Token] = []
        self.last_end = 0

    def peek(self, n: int = 0) -> _Token:
        while len(self.ahead) <= n:
            self.ahead.append(self.lexer.next())
        return self.ahead[n]

    def take(self) -> _Token:
        tok = self.peek()
        self.ahead.pop(0)
        self.last_end = tok.end
        return tok

    def is_word(self, text: str, n: int = 0) -> bool:
        tok = self.peek(n)
        return tok.kind == "word" and tok.text == text

    def is_op(self, text: str, n: int = 0) -> bool:
        tok = self.peek(n)
        return tok.kind == "op" and tok.text == text

    def expect_word(self, text: str) -> _Token:
        self.skip_newlines()
        if not self.is_word(text):
            raise self.unexpected(f"`{text}`")
        return self.take()

    def expect_op(self, text: str) -> _Token:
        if not self.is_op(text):
            raise self.unexpected(f"`{text}`")
        return self.take()

    def unexpected(self, wanted: str) -> ShellSyntaxError:
        tok = self.peek()
        got = "the end of the script" if tok.kind == "eof" else repr(tok.text)
        return ShellSyntaxError(tok.line, f"expected {wanted}, found {got}")

    def skip_newlines(self) -> None:
        while self.peek().kind == "newline":
            self.take()

    def source(self, start: int, end: int | None = None) -> str:
        text = self.text[start : self.last_end if end is None else end]
        return " ".join(text.replace("\\\n", " ").split())

    def at_stop(self, stops: frozenset[str]) -> bool:
        tok = self.peek()
        return tok.kind == "eof" or (tok.kind in ("word", "op") and tok.text in stops)

    # lists -----------------------------------------------------------------------------------

    def parse_list(self, stops: frozenset[str]) -> Seq:
        items: list[Node] = []
        self.skip_newlines()
        start, line = self.peek().start, self.peek().line
        end = start
        while not self.at_stop(stops):
            items.append(self.parse_and_or())
            end = self.last_end
            if self.peek().kind == "newline" or self.is_op(";") or self.is_op("&"):
                self.take()
                self.skip_newlines()
            elif not self.at_stop(stops):
                raise self.unexpected("a new line or `;`")
        return Seq(tuple(items), self.source(start, end), line)

    def parse_and_or(self) -> Node:
        first = self.parse_pipeline()
        rest: list[tuple[str, Node]] = []
        while self.is_op("&&") or self.is_op("||"):
            op = self.take().text
            self.skip_newlines()
            rest.append((op, self.parse_pipeline()))
        return AndOr(first, tuple(rest), _line(first)) if rest else first

    def parse_pipeline(self) -> Node:
        line = self.peek().line
        negated = False
        while self.is_word("!") or self.is_word("time"):
            negated ^= self.take().text == "!"
        commands = [self.parse_command()]
        while self.is_op("|") or self.is_op("|&"):
            self.take()
            self.skip_newlines()
            commands.append(self.parse_command())
        if len(commands) == 1 and not negated:
            return commands[0]
        return Pipeline(tuple(commands), negated, line)

    # commands --------------------------------------------------------------------------------

    def parse_command(self) -> Node:
        tok = self.peek()
        node: Node
        if tok.kind == "word" and tok.text in _COMPOUND:
            node = _COMPOUND[tok.text](self)
        elif tok.kind == "word" and (
            tok.text == "function" or (NAME.fullmatch(tok.text) and self.is_op("(", 1) and self.is_op(")", 2))
        ):
            node = self.parse_function()
        elif tok.kind == "op" and tok.text == "(":
            self.take()
            body = self.parse_list(frozenset({")"}))
            self.expect_op(")")
            node = Group(body, True, tok.line)
        elif tok.kind == "arith":
            self.take()
            node = ArithCommand(tok.text, f"(({tok.text}))", tok.line)
        else:
            return self.parse_simple()
        while self.peek().kind == "op" and _is_redirect(self.peek().text):
            self.take()
            self.take_word()
        return node

    def take_word(self) -> Word:
        tok = self.peek()
        if tok.kind != "word":
            raise self.unexpected("a word")
        self.take()
        return Word(tok.text, tok.line)

    def parse_simple(self) -> Simple:
        first = self.peek()
        assigns: list[Assign] = []
        words: list[Word] = []
        redirects: list[Redirect] = []
        while True:
            tok = self.peek()
            if tok.kind == "array":
                self.take()
                m = ASSIGNMENT.fullmatch(tok.text)
                assert m is not None
                if words:
                    words.append(Word(tok.text, tok.line, tok.items))
                else:
                    assigns.append(
                        Assign(m.group(1), m.group(2), m.group(3) == "+", None, tok.items, tok.line)
                    )
            elif tok.kind == "word":
                self.take()
                m = ASSIGNMENT.fullmatch(tok.text)
                if m and not words:
                    value = Word(m.group(4), tok.line)
                    assigns.append(Assign(m.group(1), m.group(2), m.group(3) == "+", value, None, tok.line))
                else:
                    words.append(Word(tok.text, tok.line))
            elif tok.kind == "op" and _is_redirect(tok.text):
                self.take()
                redirects.append(Redirect(tok.text, self.take_word()))
            else:
                break
        if not (assigns or words or redirects):
            raise self.unexpected("a command")
        return Simple(tuple(assigns), tuple(words), tuple(redirects), first.line, self.source(first.start))

    def parse_if(self) -> If:
        line = self.take().line
        clauses: list[tuple[Seq, Seq]] = []
        otherwise = None
        while True:
            condition = self.parse_list(frozenset({"then"}))
            self.expect_word("then")
            body = self.parse_list(frozenset({"elif", "else", "fi"}))
            clauses.append((condition, body))
            if self.is_word("elif"):
                self.take()
                continue
            if self.is_word("else"):
                self.take()
                otherwise = self.parse_list(frozenset({"fi"}))
            self.expect_word("fi")
            return If(tuple(clauses), otherwise, line)

    def parse_for(self) -> Loop:
        tok = self.take()
        start = tok.start
        if self.peek().kind == "arith":
            self.take()
            header = self.source(start)
            if self.is_op(";"):
                self.take()
            body = self.parse_do()
            return Loop("arith-for", "", None, None, body, header, tok.line)
        name = self.take_word().text
        items: tuple[Word, ...] | None = None
        self.skip_newlines()
        if self.is_word("in"):
            self.take()
            collected: list[Word] = []
            while self.peek().kind == "word":
                collected.append(self.take_word())
            items = tuple(collected)
        header = self.source(start)
        if self.is_op(";"):
            self.take()
        body = self.parse_do()
        kind: Literal["for", "select"] = "select" if tok.text == "select" else "for"
        return Loop(kind, name, items, None, body, header, tok.line)

    def parse_while(self) -> Loop:
        tok = self.take()
        condition = self.parse_list(frozenset({"do"}))
        header = f"{tok.text} {condition.text}"
        body = self.parse_do()
        kind: Literal["while", "until"] = "until" if tok.text == "until" else "while"
        return Loop(kind, "", None, condition, body, header, tok.line)

    def parse_do(self) -> Seq:
        self.expect_word("do")
        body = self.parse_list(frozenset({"done"}))
        self.expect_word("done")
        return body

    def parse_case(self) -> Case:
        line = self.take().line
        word = self.take_word()
        self.expect_word("in")
        self.skip_newlines()
        arms: list[tuple[tuple[Word, ...], Seq]] = []
        while not self.is_word("esac"):
            if self.is_op("("):
                self.take()
            patterns = [self.take_word()]
            while self.is_op("|"):
                self.take()
                patterns.append(self.take_word())
            self.expect_op(")")
            body = self.parse_list(frozenset({";;", ";&", ";;&", "esac"}))
            arms.append((tuple(patterns), body))
            if self.peek().kind == "op" and self.peek().text in (";;", ";&", ";;&"):
                self.take()
            self.skip_newlines()
        self.take()
        return Case(word, tuple(arms), line)

    def parse_function(self) -> Function:
        tok = self.peek()
        if tok.text == "function":
            self.take()
        name = self.take_word().text
        if self.is_op("("):
            self.take()
            self.expect_op(")")
        self.skip_newlines()
        return Function(name, self.parse_command(), tok.line)

    def parse_group(self) -> Group:
        line = self.take().line
        body = self.parse_list(frozenset({"}"}))
        self.expect_word("}")
        return Group(body, False, line)

    def parse_cond(self) -> CondExpr:
        tok = self.take()
        parts: list[Word | str] = []
        while not self.is_word("]]"):
            nxt = self.peek()
            if nxt.kind == "eof":
                raise self.unexpected("`]]`")
            self.take()
            if nxt.kind == "word":
                parts.append(Word(nxt.text, nxt.line))
            elif nxt.kind == "op":
                parts.append(nxt.text)
        self.take()
        return CondExpr(tuple(parts), self.source(tok.start), tok.line)


_COMPOUND: dict[str, Callable[[_Parser], Node]] = {
    "if": _Parser.parse_if,
    "for": _Parser.parse_for,
    "select": _Parser.parse_for,
    "while": _Parser.parse_while,
    "until": _Parser.parse_while,
    "case": _Parser.parse_case,
    "{": _Parser.parse_group,
    "[[": _Parser.parse_cond,
}


def _is_redirect(op: str) -> bool:
    return op.lstrip("0123456789") in REDIRECTIONS


def _line(node: Node) -> int:
    return node.line


def parse(text: str, base_line: int = 1) -> Seq:
    """The script as a list of commands; raises ShellSyntaxError where bash would refuse it."""
    parser = _Parser(text, base_line)
    seq = parser.parse_list(frozenset())
    if parser.peek().kind != "eof":
        raise parser.unexpected("a command")
    return seq

"""bash's grammar, as far as recipe scripts use it: simple commands with assignments and
redirections, pipelines, `&&`/`||` lists, `if`/`for`/`while`/`until`/`case`, functions, `{ }` and
`( )` groups, `[[ ]]` and `(( ))`, built from the words and operators of `lexer` into the tree of
`syntax`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from asyncdapo.tools.from_verl.bash.lexer import ASSIGNMENT, NAME, REDIRECTIONS, Lexer, Token
from asyncdapo.tools.from_verl.bash.syntax import (
    AndOr,
    ArithCommand,
    Assign,
    Case,
    CondExpr,
    Function,
    Group,
    If,
    Loop,
    Node,
    Pipeline,
    Redirect,
    Seq,
    ShellSyntaxError,
    Simple,
    Word,
)


class _Parser:
    def __init__(self, text: str, base_line: int) -> None:
        self.text = text
        self.lexer = Lexer(text, base_line)
        self.ahead: list[Token] = []
        self.last_end = 0

    def peek(self, n: int = 0) -> Token:
        while len(self.ahead) <= n:
            self.ahead.append(self.lexer.next())
        return self.ahead[n]

    def take(self) -> Token:
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

    def expect_word(self, text: str) -> Token:
        self.skip_newlines()
        if not self.is_word(text):
            raise self.unexpected(f"`{text}`")
        return self.take()

    def expect_op(self, text: str) -> Token:
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

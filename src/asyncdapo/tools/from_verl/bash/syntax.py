"""The syntax tree of a bash script as `parse` builds it — words kept as written (quotes,
escapes and expansions still in them, to be expanded when run), simple commands, lists,
pipelines and the compound commands — and the error raised where bash would refuse the script.
Its own module because the lexer, the grammar and the interpreter all speak it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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

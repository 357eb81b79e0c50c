"""Runs a parsed script as bash would, without executing anything.

Assignments, `export`/`declare`/`local`, conditions (`[ ]`, `[[ ]]`, `test`, `(( ))`), `case`,
`for` over known words, functions, `eval`, `cd`, and the commands recipes use to compute values
inside `$( )` (echo, printf, expr, basename, dirname, pwd, readlink -f/realpath) run here; every
other command is recorded, not run, and its exit status is unknown.

A value that cannot be known is carried as an `Unknown` saying why (a variable nobody set, a
`$(date)`, a branch whose condition cannot be evaluated, a loop that is not run …) and becomes
an error only where a caller reads it: a variable assigned from `$(date)` but never used costs
nothing. bash stops at an unset variable under `set -u` (which recipes set) and reads it as
empty without it; both would hide a missing value, so an unset variable is always unknown here,
in arithmetic too, except in the `${VAR:-default}` family that exists to handle it.
Where a condition cannot be evaluated, each way through it is run from the same state and a
variable whose value differs between them becomes unknown; a way that ends in `exit` is dropped.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum

from asyncdapo.from_verl.bash import arith, coreutils, patterns
from asyncdapo.from_verl.bash.parse import (
    ASSIGNMENT,
    NAME,
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
    Seq,
    ShellSyntaxError,
    Simple,
    Word,
    parse,
    skip_arithmetic,
    skip_braces,
    skip_double_quoted,
    skip_parens,
    skip_unit,
)


class Cause(StrEnum):
    UNSET = "unset"  # a variable nobody set
    REQUIRED = "required"  # ${VAR:?message}
    ARGUMENT = "argument"  # $1, $2 …: the script is read without arguments
    SCRIPT_PATH = "script-path"  # $0, ${BASH_SOURCE[0]} when the script's path is not given
    COMMAND = "command"  # $( … ) running a command this reader does not run
    CONDITION = "condition"  # set under a condition that cannot be evaluated
    LOOP = "loop"  # set inside a loop that is not run
    ARITHMETIC = "arithmetic"  # $(( … )) that bash refuses
    UNSUPPORTED = "unsupported"  # a bash form this reader does not expand
    VOLATILE = "volatile"  # $RANDOM, $$ …: different on every run


@dataclass(frozen=True)
class Unknown:
    """Why a value cannot be known; `what` is the variable (UNSET, REQUIRED) or the text as written."""

    cause: Cause
    what: str
    line: int
    detail: str = ""
    name: str = ""  # CONDITION, LOOP: the variable whose value depends on it
    via: tuple[tuple[str, int], ...] = ()  # variables the value went through: (name, line assigned)

    def brief(self) -> str:
        match self.cause:
            case Cause.UNSET | Cause.REQUIRED:
                return f"{self.what} is not set"
            case Cause.ARGUMENT:
                return f"the script's argument {self.what} is not given"
            case Cause.SCRIPT_PATH:
                return f"{self.what} (the script's own path) is not known"
            case Cause.CONDITION:
                return f"`{self.what}` (line {self.line}) cannot be evaluated"
            case Cause.LOOP:
                return f"the loop `{self.what}` (line {self.line}) is not run"
        return f"{self.what} (line {self.line}) cannot be expanded"


class Blocked(Exception):
    """An expansion reached a value that cannot be known."""

    def __init__(self, unknown: Unknown) -> None:
        super().__init__(unknown.what)
        self.unknown = unknown


Value = str | dict[int, str] | Unknown


class _Kind(Enum):
    LITERAL = "literal"  # unquoted text as written: a glob in patterns, never split
    QUOTED = "quoted"  # quoted or escaped: itself only; keeps an empty field
    SPLIT = "split"  # the result of an unquoted expansion: split into fields, a glob in patterns
    BREAK = "break"  # a field boundary inside "${ARRAY[@]}" / "$@"


_Seg = tuple[str, _Kind]
_BREAK: _Seg = ("", _Kind.BREAK)
_PARAM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!\-])(?:\[([^\]]*)\])?")
_SHORT_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!\-]")
_OPERATOR = re.compile(r":[-=+?]|[-=+?]|##|#|%%|%|//|/#|/%|/|\^\^|\^|,,|,|:|@")
_VOLATILE = frozenset({"RANDOM", "SRANDOM", "SECONDS", "EPOCHSECONDS", "EPOCHREALTIME", "BASHPID"})
_FILE_TESTS = frozenset(f"-{c}" for c in "abcdefghkprstuwxGLNOS")
_INT_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_STRING_TESTS = frozenset({"=", "==", "!=", "<", ">"})
_BINARY_TESTS = _INT_TESTS | _STRING_TESTS | {"-nt", "-ot", "-ef"}
_DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})
_ABSENT = object()


@dataclass(frozen=True)
class Arg:
    """One argument of a command as bash would pass it; text None: it could not be expanded."""

    text: str | None
    word: Word
    unknown: Unknown | None = None


@dataclass(frozen=True)
class Command:
    """A command the script runs that this reader does not (python, ray, torchrun, …)."""

    line: int
    text: str
    args: tuple[Arg, ...]
    conditions: tuple[Unknown, ...]  # the conditions/loops it sits in that cannot be evaluated


@dataclass(frozen=True)
class Stop:
    line: int
    text: str


@dataclass
class Outcome:
    commands: list[Command] = field(default_factory=list)
    stopped: Stop | None = None  # the `exit` the script ended at, if it did


class _Exit(Exception):
    def __init__(self, line: int, text: str) -> None:
        super().__init__(text)
        self.line, self.text = line, text


class _Return(Exception):
    pass


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _NotRun(Exception):
    """Inside $( ): a command or a condition this reader cannot run, so the output is unknown."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Undecidable(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class _State:
    variables: dict[str, Value]
    args: list[str | Unknown]
    functions: dict[str, Function]


def _copy(variables: dict[str, Value]) -> dict[str, Value]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in variables.items()}


# ---------------------------------------------------------------------------------------------


class Shell:
    def __init__(
        self, env: Mapping[str, str], args: Sequence[str], path: str | None, cwd: str | None
    ) -> None:
        self.vars: dict[str, Value] = dict(env)
        if cwd is not None:
            self.vars["PWD"] = cwd
        self.args: list[str | Unknown] = list(args)
        self.path = path
        self.functions: dict[str, Function] = {}
        self.context: list[Unknown] = []
        self.commands: list[Command] = []
        self.sourced: list[tuple[str, int]] = []
        # arrays with elements that cannot be expanded: (the array's Unknown, known, unknown elements)
        self.partial: dict[str, tuple[Unknown, dict[int, str], dict[int, tuple[Word, Unknown]]]] = {}
        self.frames: list[dict[str, object]] = []  # per function call: locals' outer values
        self.status: int | None = 0
        self.why = ""  # why the status is unknown
        self.undecided = ""  # why the last test could not be decided
        self.current = ""  # the builtin being run, as called ("[" or "test", "readlink" or "realpath")
        self.out: list[str] | None = None  # the output being captured, inside $( )
        self.line = 1
        self.depth = 0

    # state -----------------------------------------------------------------------------------

    def fork(self, *, capture: bool) -> Shell:
        child = Shell({}, [], self.path, None)
        child.vars = _copy(self.vars)
        child.args = list(self.args)
        child.functions = dict(self.functions)
        child.sourced, child.partial = self.sourced, self.partial
        child.line, child.depth = self.line, self.depth + 1
        if capture:
            child.out = []
        else:
            child.out = self.out
            child.context = list(self.context)
            child.commands = self.commands  # commands in a subshell or a pipe still run
        return child

    def save(self) -> _State:
        return _State(_copy(self.vars), list(self.args), dict(self.functions))

    def load(self, state: _State) -> None:
        self.vars, self.args, self.functions = _copy(state.variables), list(state.args), dict(state.functions)

    def set_status(self, status: int | None, why: str = "") -> None:
        self.status, self.why = status, why

    def set_var(self, name: str, value: Value) -> None:
        self.vars[name] = value

    def via(self, unknown: Unknown, name: str, line: int) -> Unknown:
        return replace(unknown, via=(*unknown.via, (name, line)))

    def unset(self, name: str) -> Unknown:
        if name.isdigit():
            return Unknown(Cause.ARGUMENT, f"${name}", self.line, "the script is read without arguments")
        detail = ""
        if self.sourced:
            text, line = self.sourced[-1]
            detail = f"it may come from `{text}` (line {line}), which is not read"
        return Unknown(Cause.UNSET, name, self.line, detail)

    def speculate(self, branches: list[Callable[[], None] | None], why: Unknown) -> None:
        """Each way through a condition that cannot be evaluated, from the same state; what they
        agree on stays known."""
        if self.out is not None:
            raise _NotRun(f"`{why.what}` cannot be evaluated ({why.detail})")
        base = self.save()
        outcomes: list[_State] = []
        for branch in branches:
            self.load(base)
            self.context.append(why)
            try:
                if branch is not None:
                    branch()
                outcomes.append(self.save())
            except _Exit:
                pass
            except (_Break, _Continue, _Return):
                outcomes.append(self.save())
            finally:
                self.context.pop()
        if not outcomes:
            raise _Exit(why.line, why.what)
        merged = _State({}, outcomes[0].args, {})
        for state in outcomes:
            merged.functions.update(state.functions)
        for name in {n for state in outcomes for n in state.variables}:
            values = [state.variables.get(name) for state in outcomes]
            first = values[0]
            if any(v != first for v in values):
                merged.variables[name] = replace(why, name=name)
            elif first is not None:
                merged.variables[name] = first
        self.load(merged)
        self.set_status(None, why.brief())

    # running ---------------------------------------------------------------------------------

    def run(self, node: Node) -> None:
        if isinstance(node, Seq):
            for item in node.items:
                self.run(item)
        elif isinstance(node, Simple):
            self.simple(node)
        elif isinstance(node, AndOr):
            self.and_or(node)
        elif isinstance(node, Pipeline):
            self.pipeline(node)
        elif isinstance(node, If):
            self.if_(node.clauses, node.otherwise)
        elif isinstance(node, Loop):
            self.loop(node)
        elif isinstance(node, Case):
            self.case(node)
        elif isinstance(node, Function):
            self.functions[node.name] = node
            self.set_status(0)
        elif isinstance(node, Group):
            if node.subshell:
                child = self.fork(capture=False)
                with contextlib.suppress(_Exit, _Return, _Break, _Continue):
                    child.run(node.body)
                self.set_status(child.status, child.why)
            else:
                self.run(node.body)
        elif isinstance(node, CondExpr):
            self.line = node.line
            self.decide(lambda: self.cond_expr(list(node.parts)))
        else:
            self.line = node.line
            self.decide(lambda: bool(self.arithmetic(self.join(self.segs(node.expression)), node.text)))

    def runner(self, node: Node) -> Callable[[], None]:
        return lambda: self.run(node)

    def decide(self, test: Callable[[], bool | None]) -> None:
        self.undecided = ""
        try:
            result = test()
        except _Undecidable as e:
            self.set_status(None, e.why)
            return
        except Blocked as e:
            if self.out is not None:
                raise
            self.set_status(None, e.unknown.brief())
            return
        if result is None:
            self.set_status(None, self.undecided or "it cannot be evaluated")
        else:
            self.set_status(0 if result else 1)

    def guard(self, test: Callable[[], bool | None]) -> bool | None:
        """A test that may not be decidable: None (and why) instead of an error, so that
        `-a`/`-o`/`&&`/`||` can still decide when the other side does."""
        try:
            return test()
        except _Undecidable as e:
            self.undecided = e.why
        except Blocked as e:
            self.undecided = e.unknown.brief()
        return None

    def and_or(self, node: AndOr) -> None:
        self.run(node.first)
        left = node.first
        for op, right in node.rest:
            if self.status is None:
                why = Unknown(Cause.CONDITION, _text(left), left.line, self.why)
                self.speculate([self.runner(right), None], why)
            elif (self.status == 0) == (op == "&&"):
                self.run(right)
            left = right

    def pipeline(self, node: Pipeline) -> None:
        if len(node.commands) > 1:
            if self.out is not None:
                raise _NotRun("a pipe `|` is not run")
            for command in node.commands:  # each side of a pipe runs in a subshell
                child = self.fork(capture=False)
                with contextlib.suppress(_Exit, _Return, _Break, _Continue):
                    child.run(command)
            self.set_status(None, "the status of a pipe is not known")
        else:
            self.run(node.commands[0])
        if node.negated and self.status is not None:
            self.set_status(0 if self.status else 1)

    def if_(self, clauses: tuple[tuple[Seq, Seq], ...], otherwise: Seq | None) -> None:
        if not clauses:
            if otherwise is not None:
                self.run(otherwise)
            else:
                self.set_status(0)
            return
        (condition, body), rest = clauses[0], clauses[1:]
        self.run(condition)
        if self.status is None:
            why = Unknown(Cause.CONDITION, condition.text, condition.line, self.why)
            self.speculate([self.runner(body), lambda: self.if_(rest, otherwise)], why)
        elif self.status == 0:
            self.run(body)
        else:
            self.if_(rest, otherwise)

    def loop(self, node: Loop) -> None:
        detail = ""
        if node.kind == "for":
            try:
                items = (
                    self.known_args()
                    if node.items is None
                    else [f for w in node.items for f in self.fields(w)]
                )
            except Blocked as e:
                detail = e.unknown.brief()
            else:
                for item in items:
                    self.set_var(node.name, item)
                    try:
                        self.run(node.body)
                    except _Break:
                        break
                    except _Continue:
                        continue
                return
        elif node.kind in ("while", "until") and node.condition is not None:
            self.run(node.condition)
            if self.status is not None and (self.status == 0) != (node.kind == "while"):
                self.set_status(0)
                return
            detail = self.why or "it repeats until its condition changes"
        why = Unknown(Cause.LOOP, node.header, node.line, detail or "loops are not run")

        def body() -> None:
            if node.name:
                self.set_var(node.name, replace(why, name=node.name))
            self.run(node.body)

        self.speculate([body, None], why)

    def case(self, node: Case) -> None:
        self.line = node.line
        try:
            word = self.string(node.word)
            chosen = next(
                (body for arm, body in node.arms if any(self.pattern(p.text).fullmatch(word) for p in arm)),
                None,
            )
        except Blocked as e:
            if self.out is not None:
                raise
            why = Unknown(Cause.CONDITION, f"case {node.word.text}", node.line, e.unknown.brief())
            self.speculate([*(self.runner(body) for _, body in node.arms), None], why)
            return
        if chosen is None:
            self.set_status(0)
        else:
            self.run(chosen)

    # simple commands -------------------------------------------------------------------------

    def args_of(self, word: Word) -> list[Arg]:
        self.line = word.line
        try:
            return [Arg(text, word) for text in self.fields(word)]
        except Blocked as e:
            return self.partial_args(word) or [Arg(None, word, e.unknown)]

    def partial_args(self, word: Word) -> list[Arg]:
        """ "${NAME[@]}" of an array with elements that cannot be expanded: one argument per
        element, the unknown ones as written in the array."""
        m = re.fullmatch(r'("?)\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}\1', word.text)
        partial = self.partial.get(m.group(2)) if m else None
        if m is None or partial is None or self.vars.get(m.group(2)) is not partial[0]:
            return []
        _, known, failed = partial
        out: list[Arg] = []
        for index in sorted({*known, *failed}):
            if index in failed:
                element, unknown = failed[index]
                out.append(Arg(None, element, unknown))
            elif m.group(1):
                out.append(Arg(known[index], word))
            else:
                out += [Arg(text, word) for text in self.split([(known[index], _Kind.SPLIT)])]
        return out

    def known(self, args: Sequence[Arg]) -> list[str]:
        for arg in args:
            if arg.unknown is not None:
                raise Blocked(arg.unknown)
        return [arg.text for arg in args if arg.text is not None]

    def known_args(self) -> list[str]:
        out: list[str] = []
        for a in self.args:
            if isinstance(a, Unknown):
                raise Blocked(a)
            out.append(a)
        return out

    def write(self, text: str, cmd: Simple) -> None:
        if self.out is not None and not _stdout_elsewhere(cmd):
            self.out.append(text)

    def fail(self, detail: str) -> None:
        """A command this reader ran but cannot finish: fatal inside $( ), unknown status outside."""
        if self.out is not None:
            raise _NotRun(detail)
        self.set_status(None, detail)

    def simple(self, cmd: Simple) -> None:
        self.line = cmd.line
        words = list(cmd.words)
        head: list[Arg] = []
        i = 0
        while i < len(words) and not head:
            head = self.args_of(words[i])
            i += 1
        if not head:
            for assign in cmd.assigns:
                self.assign(assign)
            self.set_status(0)
            return
        name = head[0].text
        if name in _DECLARATIONS:
            assert name is not None
            self.declare(name, [*head[1:], *(Arg(w.text, w) for w in words[i:])], cmd)
            return
        args = [*head, *(a for w in words[i:] for a in self.args_of(w))]
        self.line = cmd.line
        if name is not None and name in self.functions:
            self.call(self.functions[name], args)
            return
        builtin = _BUILTINS.get(name or "")
        if builtin is not None:
            self.current = name or ""
            try:
                builtin(self, args[1:], cmd)
            except Blocked:
                if self.out is not None:
                    raise
                self.set_status(None, f"`{name}` had an argument that cannot be expanded")
            return
        shown = name if name is not None else head[0].word.text
        if self.out is not None:
            raise _NotRun(f"`{shown}` is not a command this reader runs")
        self.commands.append(Command(cmd.line, cmd.text, tuple(args), tuple(self.context)))
        self.set_status(None, f"`{shown}` is not run by this reader")

    def call(self, function: Function, args: list[Arg]) -> None:
        if self.depth > 64 or len(self.frames) > 64:
            self.fail(f"`{function.name}` calls itself too deeply")
            return
        saved = self.args
        self.args = [a.text if a.text is not None else a.unknown for a in args[1:]]  # type: ignore[misc]
        self.frames.append({})
        try:
            self.run(function.body)
        except _Return:
            pass
        finally:
            for name, outer in self.frames.pop().items():
                if outer is _ABSENT:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = outer  # type: ignore[assignment]
            self.args = saved

    def make_local(self, name: str) -> None:
        if self.frames and name not in self.frames[-1]:
            self.frames[-1][name] = self.vars.get(name, _ABSENT)

    def assign(self, assign: Assign, *, local: bool = False) -> None:
        self.line = assign.line
        if local:
            self.make_local(assign.name)
        value: Value
        try:
            if assign.array is not None:
                value = self.array_value(assign)  # its own Unknown when an element is unknown
            elif assign.index is not None:
                value = self.element_value(assign)
            else:
                assert assign.value is not None
                text = self.string(assign.value, assignment=True)
                if assign.append:
                    old = self.vars.get(assign.name, "")
                    if isinstance(old, Unknown):
                        raise Blocked(old)
                    if isinstance(old, dict):
                        value = {**old, 0: old.get(0, "") + text}
                        self.set_var(assign.name, value)
                        return
                    text = old + text
                value = text
        except Blocked as e:
            value = self.via(e.unknown, assign.name, assign.line)
        self.set_var(assign.name, value)

    def array_value(self, assign: Assign) -> Value:
        """NAME=( … ): an element that cannot be expanded makes the array unknown, but its other
        elements are kept for "${NAME[@]}" in a command, so each argument is read on its own."""
        assert assign.array is not None
        old = self.vars.get(assign.name)
        array: dict[int, str] = {}
        failed: dict[int, tuple[Word, Unknown]] = {}
        if assign.append and isinstance(old, Unknown):
            partial = self.partial.get(assign.name)
            if partial is None or partial[0] is not old:
                raise Blocked(old)
            array, failed = dict(partial[1]), dict(partial[2])
        elif assign.append:
            array = dict(old) if isinstance(old, dict) else {0: old} if isinstance(old, str) else {}
        nxt = max([*array, *failed], default=-1) + 1
        for word in assign.array:
            self.line = word.line
            try:
                m = re.fullmatch(r"\[([^\]]*)\]=(.*)", word.text, re.DOTALL)
                if m:
                    nxt = self.index(m.group(1), array)
                    array[nxt] = self.string(Word(m.group(2), word.line), assignment=True)
                    nxt += 1
                    continue
                for text in self.fields(word):
                    array[nxt] = text
                    nxt += 1
            except Blocked as e:
                failed[nxt] = (word, self.via(e.unknown, assign.name, word.line))
                nxt += 1
        if not failed:
            return array
        unknown = next(iter(failed.values()))[1]
        self.partial[assign.name] = (unknown, array, failed)
        return unknown

    def element_value(self, assign: Assign) -> dict[int, str]:
        assert assign.index is not None and assign.value is not None
        old = self.vars.get(assign.name)
        if isinstance(old, Unknown):
            raise Blocked(old)
        array = dict(old) if isinstance(old, dict) else {0: old} if isinstance(old, str) else {}
        index = self.index(assign.index, array)
        text = self.string(assign.value, assignment=True)
        array[index] = array.get(index, "") + text if assign.append else text
        return array

    def index(self, text: str, array: Mapping[int, str] | None = None) -> int:
        value = self.arithmetic(self.join(self.segs(text)), f"[{text}]")
        if value < 0 and array is not None:
            value += max(array, default=-1) + 1
        return value

    def declare(self, builtin: str, args: list[Arg], cmd: Simple) -> None:
        options = ""
        local = builtin == "local" or (builtin in ("declare", "typeset") and bool(self.frames))
        for arg in args:
            word = arg.word
            text = arg.text if arg.text is not None else word.text
            if text.startswith(("-", "+")) and not ASSIGNMENT.fullmatch(text):
                options += text[1:]
                continue
            if "f" in options or "F" in options or "p" in options:
                continue
            m = ASSIGNMENT.fullmatch(text)
            name = m.group(1) if m else text
            if not NAME.fullmatch(name):
                continue
            if "A" in options:  # associative arrays are not read: the variable is unknown
                why = Unknown(Cause.UNSUPPORTED, f"{builtin} -A {name}", word.line, "associative arrays")
                if local:
                    self.make_local(name)
                self.set_var(name, why)
                continue
            if m is None:
                if local:
                    self.make_local(name)
                    self.vars.pop(name, None)
                continue
            assign = Assign(
                name, m.group(2), m.group(3) == "+",
                None if word.array is not None else Word(m.group(4), word.line), word.array, word.line,
            )  # fmt: skip
            self.assign(assign, local=local)
        self.set_status(0)

    # expansion -------------------------------------------------------------------------------

    def fields(self, word: Word) -> list[str]:
        """The arguments a word becomes: expanded, split where unquoted, quotes removed."""
        self.line = word.line
        return self.split(self.segs(word.text, tilde=True))

    def string(self, word: Word, *, assignment: bool = False) -> str:
        """A word expanded without splitting (an assignment's value, a `case` word, `[[ ]]`)."""
        self.line = word.line
        return self.join(self.segs(word.text, tilde=True, assignment=assignment))

    @staticmethod
    def join(segs: list[_Seg]) -> str:
        return "".join(" " if kind is _Kind.BREAK else text for text, kind in segs)

    def ifs(self) -> str:
        value = self.vars.get("IFS", " \t\n")
        return value if isinstance(value, str) else " \t\n"

    def split(self, segs: list[_Seg]) -> list[str]:
        ifs = self.ifs()
        blanks = "".join(c for c in ifs if c in " \t\n")
        others = "".join(c for c in ifs if c not in " \t\n")
        blank = f"[{re.escape(blanks)}]" if blanks else ""
        alternatives = (
            [f"{blank}*[{re.escape(others)}]{blank}*" if blank else f"[{re.escape(others)}]"]
            if others
            else []
        )
        splitter = re.compile("|".join([*alternatives, *([f"{blank}+"] if blank else [])]))
        fields: list[str] = []
        current, keep = "", False
        for text, kind in segs:
            if kind is _Kind.BREAK:
                parts = ["", ""]
            elif kind is _Kind.SPLIT and ifs:
                parts = splitter.split(text)
            else:
                current += text
                keep = keep or kind is _Kind.QUOTED
                continue
            current += parts[0]
            for part in parts[1:]:
                if current or keep:
                    fields.append(current)
                current, keep = part, False
        if current or keep:
            fields.append(current)
        return fields

    def pattern(self, text: str) -> re.Pattern[str]:
        return patterns.compile_pattern(self.chars(text))

    def chars(self, text: str) -> list[tuple[str, bool]]:
        return [(c, kind is _Kind.QUOTED) for s, kind in self.segs(text, brace=True) for c in s]

    def segs(
        self,
        text: str,
        *,
        dq: bool = False,
        tilde: bool = False,
        assignment: bool = False,
        brace: bool = False,
    ) -> list[_Seg]:
        """The pieces a word expands to, each marked quoted, literal, or to be split."""
        out: list[_Seg] = []
        i, n = 0, len(text)
        inner = _Kind.QUOTED if dq else _Kind.SPLIT
        while i < n:
            c = text[i]
            if dq and c == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                if text[i + 1] != "\n":
                    out.append((text[i + 1], _Kind.QUOTED))
                i += 2
            elif dq and c == '"' and brace:  # "…" nested in ${ … } in "…"
                end = skip_double_quoted(text, i + 1)
                out += self.segs(text[i + 1 : end - 1], dq=True, brace=True) or [("", _Kind.QUOTED)]
                i = end
            elif not dq and c == "\\":
                if i + 1 < n and text[i + 1] != "\n":
                    out.append((text[i + 1], _Kind.QUOTED))
                i += 2
            elif not dq and c == "'":
                end = text.find("'", i + 1)
                end = n if end < 0 else end
                out.append((text[i + 1 : end], _Kind.QUOTED))
                i = end + 1
            elif not dq and (c == '"' or text.startswith('$"', i)):
                start = i + (2 if c == "$" else 1)
                end = skip_double_quoted(text, start)
                found = self.segs(text[start : end - 1], dq=True, brace=brace)
                out += found if found or end - start > 1 else [("", _Kind.QUOTED)]
                i = end
            elif not dq and text.startswith("$'", i):
                end = skip_unit(text, i)
                out.append((coreutils.unescape(text[i + 2 : end - 1], stop_at_c=False)[0], _Kind.QUOTED))
                i = end
            elif not dq and c == "~" and tilde and (i == 0 or (assignment and text[i - 1] in "=:")):
                m = re.compile(r"~([^/:]*)").match(text, i)
                assert m is not None
                if m.group(1) == "":
                    out.append((self.scalar("HOME"), _Kind.QUOTED))
                elif m.group(1) in ("+", "-"):
                    out.append((self.scalar("PWD" if m.group(1) == "+" else "OLDPWD"), _Kind.QUOTED))
                else:
                    out.append(("~", _Kind.LITERAL))
                    i += 1
                    continue
                i = m.end()
            elif c == "$":
                i = self.dollar(text, i, dq, out)
            elif c == "`":
                end = skip_unit(text, i)
                body = re.sub(r"\\([$`\\])", r"\1", text[i + 1 : end - 1])
                out.append((self.substitute(body, text[i:end]), inner))
                i = end
            else:
                out.append((c, _Kind.QUOTED if dq else _Kind.LITERAL))
                i += 1
        return _merged(out)

    def dollar(self, text: str, i: int, dq: bool, out: list[_Seg]) -> int:
        kind = _Kind.QUOTED if dq else _Kind.SPLIT
        if text.startswith("$((", i):
            end = skip_arithmetic(text, i + 3)
            if text[end - 2 : end] == "))":
                whole = text[i:end]
                expression = self.join(self.segs(text[i + 3 : end - 2]))
                out.append((str(self.arithmetic(expression, whole)), kind))
                return end
        if text.startswith("$(", i):
            end = skip_parens(text, i + 2)
            out.append((self.substitute(text[i + 2 : end - 1], text[i:end]), kind))
            return end
        if text.startswith("${", i):
            end = skip_braces(text, i + 2)
            out += self.braced(text[i + 2 : end - 1], dq, text[i:end])
            return end
        m = _SHORT_PARAM.match(text, i + 1)
        if m is None:
            out.append(("$", _Kind.QUOTED if dq else _Kind.LITERAL))
            return i + 1
        values = self.lookup(m.group(), None)
        if values is None:
            raise Blocked(self.unset(m.group()))
        out += self.emit(values, m.group() in ("@", "*"), m.group() == "*", dq)
        return m.end()

    def scalar(self, name: str) -> str:
        values = self.lookup(name, None)
        if values is None:
            raise Blocked(self.unset(name))
        return values[0] if values else ""

    def lookup(self, name: str, sub: str | None) -> list[str] | None:
        """A parameter's values: one for a scalar or an element, all for [@]/[*]; None: unset."""
        line = self.line
        if name in ("@", "*"):
            return self.known_args()
        if name == "#":
            return [str(len(self.args))]
        if name == "?":
            if self.status is None:
                raise Blocked(Unknown(Cause.VOLATILE, "$?", line, "the last command's status is not known"))
            return [str(self.status)]
        if name in ("$", "!", "-") or name in _VOLATILE:
            raise Blocked(Unknown(Cause.VOLATILE, f"${name}", line, "it differs on every run"))
        if name == "LINENO":
            return [str(line)]
        if name == "0" or (name == "BASH_SOURCE" and sub in (None, "0", "@", "*")):
            if self.path is None:
                raise Blocked(Unknown(Cause.SCRIPT_PATH, "$0" if name == "0" else "${BASH_SOURCE[0]}", line))
            return [self.path]
        if name.isdigit():
            position = int(name)
            if position > len(self.args):
                return None
            value = self.args[position - 1]
            if isinstance(value, Unknown):
                raise Blocked(value)
            return [value]
        found = self.vars.get(name)
        if found is None:
            return None
        if isinstance(found, Unknown):
            raise Blocked(found)
        if isinstance(found, str):
            found = {0: found}
        if sub in ("@", "*"):
            return [found[k] for k in sorted(found)]
        position = 0 if sub is None else self.index(sub, found)
        return [found[position]] if position in found else None

    @staticmethod
    def emit(values: list[str], multi: bool, star: bool, dq: bool) -> list[_Seg]:
        if not multi:
            return [(values[0] if values else "", _Kind.QUOTED if dq else _Kind.SPLIT)]
        if dq and star:
            return [(" ".join(values), _Kind.QUOTED)]
        out: list[_Seg] = []
        for k, value in enumerate(values):
            if k:
                out.append(_BREAK)
            out.append((value, _Kind.QUOTED if dq else _Kind.SPLIT))
        return out

    def braced(self, inner: str, dq: bool, whole: str) -> list[_Seg]:
        kind = _Kind.QUOTED if dq else _Kind.SPLIT
        if inner == "#":
            return [(str(len(self.args)), kind)]
        if inner.startswith("#") and (m := _PARAM.fullmatch(inner[1:])):
            values = self.lookup(m.group(1), m.group(2))
            if values is None:
                raise Blocked(self.unset(m.group(1)))
            multi = m.group(2) in ("@", "*") or m.group(1) in ("@", "*")
            return [(str(len(values) if multi else len(values[0])), kind)]
        if inner.startswith("!"):
            if m := _PARAM.fullmatch(inner[1:]):
                target = self.lookup(m.group(1), m.group(2))
                if target is None:
                    raise Blocked(self.unset(m.group(1)))
                if _PARAM.fullmatch(target[0]):
                    return self.braced(target[0], dq, whole)
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, self.line, "this form of ${!…} is not read"))
        m = _PARAM.match(inner)
        if m is None:
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, self.line, "bad substitution"))
        name, sub, rest = m.group(1), m.group(2), inner[m.end() :]
        multi = sub in ("@", "*") or name in ("@", "*")
        star = sub == "*" or name == "*"
        if not rest:
            values = self.lookup(name, sub)
            if values is None:
                raise Blocked(self.unset(name))
            return self.emit(values, multi, star, dq)
        op_match = _OPERATOR.match(rest)
        if op_match is None:
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, self.line, "bad substitution"))
        op, word = op_match.group(), rest[op_match.end() :]
        values = self.lookup(name, sub)
        if op.lstrip(":") in ("-", "=", "+", "?"):
            return self.defaulting(op, name, sub, values, word, multi, star, dq, whole)
        if values is None:
            raise Blocked(self.unset(name))
        if op in ("#", "##", "%", "%%"):
            rx = self.pattern(word)
            values = [patterns.strip(v, rx, prefix=op[0] == "#", longest=len(op) == 2) for v in values]
        elif op in ("/", "//", "/#", "/%"):
            cut = _top_level_slash(word)
            rx = self.pattern(word[:cut])
            replacement = patterns.Replacement(self.chars(word[cut + 1 :]) if cut < len(word) else [])
            anchor = op[1:] if op in ("/#", "/%") else ""
            values = [patterns.replace(v, rx, replacement, every=op == "//", anchor=anchor) for v in values]
        elif op in ("^", "^^", ",", ",,"):
            rx = self.pattern(word) if word else re.compile(".", re.DOTALL)
            values = [_case(v, rx, upper=op[0] == "^", every=len(op) == 2) for v in values]
        elif op == ":":
            values = self.substring(values, word, multi, name, whole)
        else:
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, self.line, "the ${VAR@…} operators are not read"))
        return self.emit(values, multi, star, dq)

    def defaulting(
        self, op: str, name: str, sub: str | None, values: list[str] | None, word: str,
        multi: bool, star: bool, dq: bool, whole: str,
    ) -> list[_Seg]:  # fmt: skip
        unset = values is None or (multi and not values)
        null = unset or " ".join(values or []) == ""
        use_word = null if op.startswith(":") else unset
        kind = op[-1]
        if not use_word:
            assert values is not None
            if kind == "+":
                return self.word_segs(word, dq)
            return self.emit(values, multi, star, dq)
        if kind == "-":
            return self.word_segs(word, dq)
        if kind == "+":
            return [("", _Kind.QUOTED)] if dq else []
        if kind == "?":
            message = self.join(self.segs(word, brace=True)) or (
                "parameter null or not set" if op.startswith(":") else "parameter not set"
            )
            raise Blocked(Unknown(Cause.REQUIRED, name, self.line, message))
        if not NAME.fullmatch(name):
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, self.line, f"${name}: cannot assign in this way"))
        value = self.join(self.word_segs(word, dq))
        if sub is None:
            self.set_var(name, value)
        else:
            self.element_assign(name, sub, value)
        return [(value, _Kind.QUOTED if dq else _Kind.SPLIT)]

    def element_assign(self, name: str, sub: str, value: str) -> None:
        old = self.vars.get(name)
        if isinstance(old, Unknown):
            raise Blocked(old)
        array = dict(old) if isinstance(old, dict) else {0: old} if isinstance(old, str) else {}
        array[self.index(sub, array)] = value
        self.set_var(name, array)

    def word_segs(self, word: str, dq: bool) -> list[_Seg]:
        """The word of ${VAR:-word} and kin: inside "…" all of it is quoted ('…' is plain text
        there, as in bash); outside, its unquoted parts are split."""
        if dq:
            return self.segs(word, dq=True, brace=True)
        segs = self.segs(word, tilde=True, brace=True)
        return [(t, _Kind.SPLIT if k is _Kind.LITERAL else k) for t, k in segs]

    def substring(self, values: list[str], spec: str, multi: bool, name: str, whole: str) -> list[str]:
        offset_text, sep, length_text = spec.partition(":")
        offset = self.arithmetic(self.join(self.segs(offset_text)), whole)
        length = self.arithmetic(self.join(self.segs(length_text)), whole) if sep else None
        if multi:
            items = values
            if name in ("@", "*"):  # ${@:1} starts at $1: $0 is element 0
                items = [self.path or "", *values]
            start = offset + len(items) if offset < 0 else offset
            if start < 0 or (length is not None and length < 0):
                raise Blocked(Unknown(Cause.ARITHMETIC, whole, self.line, "substring expression < 0"))
            return items[start : None if length is None else start + length]
        text = values[0]
        start = offset + len(text) if offset < 0 else offset
        if start < 0 or start > len(text):
            return [""]
        if length is None:
            return [text[start:]]
        end = len(text) + length if length < 0 else start + length
        if end < start:
            raise Blocked(Unknown(Cause.ARITHMETIC, whole, self.line, f"{length}: substring expression < 0"))
        return [text[start:end]]

    def arithmetic(self, expression: str, whole: str) -> int:
        line = self.line

        def lookup(name: str) -> str:
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?", name, re.DOTALL)
            assert m is not None
            values = self.lookup(m.group(1), m.group(2))
            if values is None:
                raise Blocked(self.unset(m.group(1)))
            return values[0] if values else ""

        def store(name: str, value: int) -> None:
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?", name, re.DOTALL)
            assert m is not None
            if m.group(2) is None:
                self.set_var(name, str(value))
            else:
                self.element_assign(m.group(1), m.group(2), str(value))

        try:
            return arith.evaluate(expression, lookup, store)
        except arith.ArithError as e:
            raise Blocked(Unknown(Cause.ARITHMETIC, whole, line, str(e))) from None

    def substitute(self, body: str, whole: str) -> str:
        """The output of `$( … )` / `` `…` ``, trailing newlines removed, when it runs only
        commands this reader runs."""
        line = self.line
        if self.depth > 32:
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, line, "nested too deeply"))
        try:
            tree = parse(body, line)
        except ShellSyntaxError as e:
            raise Blocked(Unknown(Cause.UNSUPPORTED, whole, line, e.message)) from None
        child = self.fork(capture=True)
        try:
            child.run(tree)
        except (_Exit, _Return, _Break, _Continue):
            pass
        except _NotRun as e:
            raise Blocked(Unknown(Cause.COMMAND, whole, line, e.detail)) from None
        assert child.out is not None
        return "".join(child.out).rstrip("\n")

    # conditions ------------------------------------------------------------------------------

    def test(self, words: list[str]) -> bool | None:
        """`test` / `[ ]` (POSIX rules by argument count); None: it cannot be evaluated here."""
        n = len(words)
        if n == 0:
            return False
        if n == 1:
            return words[0] != ""
        if n == 2:
            if words[0] == "!":
                return _not(self.test(words[1:]))
            return self.guard(lambda: self.unary(words[0], words[1]))
        if n == 3:
            if words[1] in _BINARY_TESTS:
                return self.guard(lambda: self.binary(words[0], words[1], words[2], pattern=False))
            if words[1] == "-a":
                return _and(self.test(words[:1]), self.test(words[2:]))
            if words[1] == "-o":
                return _or(self.test(words[:1]), self.test(words[2:]))
        if n in (3, 4) and words[0] == "!":
            return _not(self.test(words[1:]))
        if n in (3, 4) and words[0] == "(" and words[-1] == ")":
            return self.test(words[1:-1])
        return _TestParser(self, words).parse()

    def unary(self, op: str, operand: str) -> bool | None:
        if op == "-z":
            return operand == ""
        if op == "-n":
            return operand != ""
        if op == "-v":
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?", operand)
            if not m:
                return False
            try:
                return self.lookup(m.group(1), m.group(2)) is not None
            except Blocked as e:
                raise _Undecidable(e.unknown.brief()) from None
        if op in _FILE_TESTS:
            raise _Undecidable(f"`{op}` tests the file system")
        raise _Undecidable(f"`{op} {operand}` cannot be evaluated here")

    def binary(self, left: str, op: str, right: str | re.Pattern[str], *, pattern: bool) -> bool | None:
        if op in ("=", "==", "!="):
            same = right.fullmatch(left) is not None if isinstance(right, re.Pattern) else left == right
            return same if op != "!=" else not same
        assert isinstance(right, str)
        if op in ("<", ">"):
            return left < right if op == "<" else left > right
        if op in _INT_TESTS:
            if pattern:  # [[ ]]: the operands are arithmetic
                a, b = self.arithmetic(left, left), self.arithmetic(right, right)
            else:
                for operand in (left, right):
                    if not coreutils.is_integer(operand):
                        raise _Undecidable(f"{operand!r}: integer expression expected")
                a, b = int(left), int(right)
            return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[
                op
            ]
        raise _Undecidable(f"`{op}` compares files")

    def cond_expr(self, parts: list[Word | str]) -> bool | None:
        return _CondParser(self, parts).parse()


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


class _TestParser:
    """`[ … ]` with more than four arguments: `!`, `( )`, `-a` over `-o`."""

    def __init__(self, shell: Shell, words: list[str]) -> None:
        self.shell, self.words, self.i = shell, words, 0

    def peek(self, n: int = 0) -> str | None:
        return self.words[self.i + n] if self.i + n < len(self.words) else None

    def parse(self) -> bool | None:
        value = self.disjunction()
        if self.i != len(self.words):
            raise _Undecidable(f"`[ {' '.join(self.words)} ]`: too many arguments")
        return value

    def disjunction(self) -> bool | None:
        value = self.conjunction()
        while self.peek() == "-o":
            self.i += 1
            value = _or(value, self.conjunction())
        return value

    def conjunction(self) -> bool | None:
        value = self.negation()
        while self.peek() == "-a":
            self.i += 1
            value = _and(value, self.negation())
        return value

    def negation(self) -> bool | None:
        if self.peek() == "!":
            self.i += 1
            return _not(self.negation())
        return self.primary()

    def primary(self) -> bool | None:
        word = self.peek()
        if word is None:
            raise _Undecidable("`[`: argument expected")
        if word == "(":
            self.i += 1
            value = self.disjunction()
            if self.peek() != ")":
                raise _Undecidable("`[`: `)` expected")
            self.i += 1
            return value
        op = self.peek(1)
        if op is not None and op in _BINARY_TESTS and self.peek(2) is not None:
            self.i += 3
            right = self.words[self.i - 1]
            return self.shell.guard(lambda: self.shell.binary(word, op, right, pattern=False))
        if word.startswith("-") and len(word) == 2 and op is not None:
            self.i += 2
            return self.shell.guard(lambda: self.shell.unary(word, op))
        self.i += 1
        return word != ""


class _CondParser:
    """`[[ … ]]`: no splitting, `==`/`!=` against a glob, `=~`, `&&` `||` `!` `( )`."""

    def __init__(self, shell: Shell, parts: list[Word | str]) -> None:
        self.shell, self.parts, self.i = shell, parts, 0

    def peek(self, n: int = 0) -> str | None:
        if self.i + n >= len(self.parts):
            return None
        part = self.parts[self.i + n]
        return part.text if isinstance(part, Word) else part

    def word(self) -> Word:
        part = self.parts[self.i] if self.i < len(self.parts) else None
        if part is None:
            raise _Undecidable("`[[`: an operand is missing")
        self.i += 1
        return part if isinstance(part, Word) else Word(part, 0)

    def parse(self) -> bool | None:
        value = self.disjunction()
        if self.i != len(self.parts):
            raise _Undecidable("`[[`: unexpected text")
        return value

    def disjunction(self) -> bool | None:
        value = self.conjunction()
        while self.peek() == "||":
            self.i += 1
            value = _or(value, self.conjunction())
        return value

    def conjunction(self) -> bool | None:
        value = self.negation()
        while self.peek() == "&&":
            self.i += 1
            value = _and(value, self.negation())
        return value

    def negation(self) -> bool | None:
        if self.peek() == "!":
            self.i += 1
            return _not(self.negation())
        return self.primary()

    def primary(self) -> bool | None:
        if self.peek() == "(":
            self.i += 1
            value = self.disjunction()
            if self.peek() != ")":
                raise _Undecidable("`[[`: `)` expected")
            self.i += 1
            return value
        first, op = self.peek(), self.peek(1)
        if first is not None and re.fullmatch(r"-[a-zA-Z]", first) and op not in (None, "&&", "||", ")"):
            self.i += 1
            operand = self.word()
            return self.shell.guard(lambda: self.shell.unary(first, self.shell.string(operand)))
        left = self.word()
        op = self.peek()
        if op in _BINARY_TESTS or op == "=~":
            self.i += 1
            right = self.word()
            assert op is not None
            return self.shell.guard(lambda: self.binary(left, op, right))
        return self.shell.guard(lambda: self.shell.string(left) != "")

    def binary(self, left: Word, op: str, right: Word) -> bool | None:
        shell = self.shell
        value = shell.string(left)
        if op in ("=", "==", "!="):
            return shell.binary(value, op, shell.pattern(right.text), pattern=True)
        if op == "=~":
            regex = "".join(re.escape(c) if quoted else c for c, quoted in shell.chars(right.text))
            try:
                return re.search(regex, value) is not None
            except re.error as e:
                raise _Undecidable(f"the regular expression {right.text}: {e}") from None
        return shell.binary(value, op, shell.string(right), pattern=True)


def _case(value: str, rx: re.Pattern[str], *, upper: bool, every: bool) -> str:
    out = []
    for k, ch in enumerate(value):
        if (every or k == 0) and rx.fullmatch(ch):
            ch = ch.upper() if upper else ch.lower()
        out.append(ch)
    return "".join(out)


def _top_level_slash(word: str) -> int:
    """Where the pattern of ${VAR/pattern/replacement} ends: the first `/` not quoted or nested."""
    i = 0
    while i < len(word):
        if word[i] == "/":
            return i
        i = skip_unit(word, i) if word[i] in "\\'\"`$" else i + 1
    return len(word)


def _merged(segs: list[_Seg]) -> list[_Seg]:
    out: list[_Seg] = []
    for text, kind in segs:
        if out and out[-1][1] is kind and kind is not _Kind.BREAK and text:
            out[-1] = (out[-1][0] + text, kind)
        else:
            out.append((text, kind))
    return out


def _text(node: Node) -> str:
    if isinstance(node, (Simple, Seq, CondExpr, ArithCommand)):
        return node.text
    if isinstance(node, AndOr):
        return " ".join([_text(node.first), *(f"{op} {_text(n)}" for op, n in node.rest)])
    if isinstance(node, Pipeline):
        return ("! " if node.negated else "") + " | ".join(_text(n) for n in node.commands)
    if isinstance(node, Group):
        return f"{'(' if node.subshell else '{'} {node.body.text} {')' if node.subshell else '}'}"
    return f"the command on line {node.line}"


def _stdout_elsewhere(cmd: Simple) -> bool:
    for redirect in cmd.redirects:
        fd = re.match(r"\d*", redirect.op)
        number = fd.group() if fd else ""
        op = redirect.op[len(number) :]
        if op in ("&>", "&>>"):
            return True
        if number in ("", "1") and (op in (">", ">>", ">|") or (op == ">&" and redirect.target.text != "1")):
            return True
    return False


# builtins ------------------------------------------------------------------------------------

_Builtin = Callable[[Shell, list[Arg], Simple], None]


def _echo(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    newline, escapes = True, False
    while words and re.fullmatch(r"-[neE]+", words[0]):
        flags = words.pop(0)
        newline = newline and "n" not in flags
        escapes = "e" in flags if "e" in flags or "E" in flags else escapes
    text, stop = coreutils.unescape(" ".join(words)) if escapes else (" ".join(words), False)
    sh.write(text + ("\n" if newline and not stop else ""), cmd)
    sh.set_status(0)


def _printf_builtin(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    target = None
    if len(words) >= 2 and words[0] == "-v":
        target, words = words[1], words[2:]
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        sh.fail("printf without a format")
        return
    try:
        text = coreutils.printf(words[0], words[1:])
    except (ValueError, TypeError) as e:
        sh.fail(f"printf: {e}")
        return
    if target is not None:
        sh.set_var(target, text)
    else:
        sh.write(text, cmd)
    sh.set_status(0)


def _expr(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    try:
        value = coreutils.Expr(words).parse()
    except coreutils.ExprError as e:
        sh.fail(f"expr {' '.join(words)}: {e}")
        return
    sh.write(value + "\n", cmd)
    sh.set_status(1 if coreutils.Expr.null(value) else 0)


def _basename_builtin(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    multiple, suffix = False, None
    while words and words[0].startswith("-") and words[0] != "-":
        flag = words.pop(0)
        if flag == "--":
            break
        if flag in ("-a", "--multiple"):
            multiple = True
        elif flag in ("-s", "--suffix") and words:
            suffix, multiple = words.pop(0), True
        elif flag.startswith("--suffix="):
            suffix, multiple = flag.partition("=")[2], True
        elif flag not in ("-z", "--zero"):
            sh.fail(f"basename {flag}")
            return
    if not words:
        sh.fail("basename without a name")
        return
    if not multiple:
        words, suffix = words[:1], (words[1] if len(words) > 1 else None)
    sh.write("".join(coreutils.basename(w, suffix) + "\n" for w in words), cmd)
    sh.set_status(0)


def _dirname_builtin(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = [w for w in sh.known(args) if w not in ("--", "-z", "--zero")]
    if not words:
        sh.fail("dirname without a name")
        return
    sh.write("".join(coreutils.dirname(w) + "\n" for w in words), cmd)
    sh.set_status(0)


def _pwd(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    sh.write(sh.scalar("PWD") + "\n", cmd)
    sh.set_status(0)


def _resolve(sh: Shell, path: str) -> str:
    return path if path.startswith("/") else posixpath.join(sh.scalar("PWD"), path)


def _realpath(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    names = [w for w in words if not w.startswith("-")]
    if sh.current == "readlink" and not any(
        w in ("-f", "-e", "-m") or re.fullmatch(r"-[a-z]*[fem][a-z]*", w) for w in words
    ):
        sh.fail("readlink without -f")
        return
    if not names:
        sh.fail("realpath without a name")
        return
    sh.write("".join(os.path.realpath(_resolve(sh, n)) + "\n" for n in names), cmd)
    sh.set_status(0)


def _cd(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    try:
        words = [w for w in sh.known(args) if w not in ("-L", "-P", "-e", "-@", "--")]
        target = words[0] if words else sh.scalar("HOME")
        if target == "-":
            target = sh.scalar("OLDPWD")
        old = sh.scalar("PWD")
        new = posixpath.normpath(_resolve(sh, target))
    except Blocked as e:
        if sh.out is not None:
            raise
        sh.set_var("PWD", sh.via(e.unknown, "PWD", cmd.line))
        sh.set_status(None, e.unknown.brief())
        return
    sh.set_var("OLDPWD", old)
    sh.set_var("PWD", new)
    sh.set_status(0)


def _test_builtin(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    def evaluate() -> bool | None:
        try:
            words = sh.known(args)
        except Blocked as e:
            raise _Undecidable(e.unknown.brief()) from None
        if sh.current == "[":
            if not words or words[-1] != "]":
                raise _Undecidable("`[` without its `]`")
            words = words[:-1]
        return sh.test(words)

    sh.decide(evaluate)


def _status(value: int) -> _Builtin:
    def builtin(sh: Shell, args: list[Arg], cmd: Simple) -> None:
        sh.set_status(value)

    return builtin


def _unset_builtin(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    functions = "-f" in words
    for word in words:
        if word.startswith("-"):
            continue
        if functions:
            sh.functions.pop(word, None)
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?", word)
        if not m:
            continue
        if m.group(2) is None:
            sh.vars.pop(word, None)
        elif isinstance(old := sh.vars.get(m.group(1)), dict):
            old.pop(sh.index(m.group(2), old), None)
    sh.set_status(0)


def _set(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = [a.text if a.text is not None else a.unknown for a in args]
    if "--" in words:
        sh.args = words[words.index("--") + 1 :]  # type: ignore[assignment]
    elif words and isinstance(words[0], str) and not words[0].startswith(("-", "+")):
        sh.args = words  # type: ignore[assignment]
    sh.set_status(0)


def _shift(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    words = sh.known(args)
    count = int(words[0]) if words and words[0].isdigit() else 1
    sh.args = sh.args[count:]
    sh.set_status(0)


def _source(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    sh.sourced.append((cmd.text, cmd.line))
    sh.set_status(0)


def _eval(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    text = " ".join(sh.known(args))
    if sh.depth > 32:
        sh.fail("eval nested too deeply")
        return
    try:
        tree = parse(text, cmd.line)
    except ShellSyntaxError as e:
        sh.fail(f"eval: {e.message}")
        return
    sh.depth += 1
    try:
        sh.run(tree)
    finally:
        sh.depth -= 1


def _let(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    value = 0
    for word in sh.known(args):
        value = sh.arithmetic(word, f"let {word}")
    sh.set_status(0 if value else 1)


def _read(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    """read, mapfile, getopts: what they set comes from input this reader does not have."""
    words = [a.text or "" for a in args]
    names: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("-p", "-d", "-n", "-N", "-t", "-u", "-i", "-C", "-c", "-O", "-s"):
            skip = True
        elif word.startswith("-"):
            if word.endswith("a") and word != "-a":
                skip = False
            continue
        elif NAME.fullmatch(word):
            names.append(word)
    if sh.out is not None:
        raise _NotRun(f"`{cmd.text}` reads input")
    for name in names or ["REPLY"]:
        sh.set_var(name, Unknown(Cause.COMMAND, cmd.text, cmd.line, "it reads input", name=name))
    sh.set_status(None, f"`{cmd.text}` reads input")


def _exit(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise _Exit(cmd.line, cmd.text)


def _return(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise _Return()


def _break(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise _Break()


def _continue(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise _Continue()


_BUILTINS: dict[str, _Builtin] = {
    "echo": _echo,
    "printf": _printf_builtin,
    "expr": _expr,
    "basename": _basename_builtin,
    "dirname": _dirname_builtin,
    "pwd": _pwd,
    "realpath": _realpath,
    "readlink": _realpath,
    "cd": _cd,
    "test": _test_builtin,
    "[": _test_builtin,
    "true": _status(0),
    ":": _status(0),
    "false": _status(1),
    "unset": _unset_builtin,
    "set": _set,
    "shift": _shift,
    "source": _source,
    ".": _source,
    "eval": _eval,
    "let": _let,
    "read": _read,
    "mapfile": _read,
    "readarray": _read,
    "getopts": _read,
    "exit": _exit,
    "return": _return,
    "break": _break,
    "continue": _continue,
}


def run_script(
    text: str,
    *,
    env: Mapping[str, str],
    args: Sequence[str] = (),
    path: str | None = None,
    cwd: str | None = None,
) -> Outcome:
    """Run the script's shell logic; the commands it would run are recorded in the outcome.
    Raises ShellSyntaxError when bash could not parse it."""
    tree = parse(text)
    shell = Shell(env, args, path, cwd)
    outcome = Outcome(commands=shell.commands)
    try:
        shell.run(tree)
    except _Exit as e:
        outcome.stopped = Stop(e.line, e.text)
    except (_Return, _Break, _Continue):
        pass
    return outcome

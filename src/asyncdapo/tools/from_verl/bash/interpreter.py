"""Runs a parsed script as bash would, without executing anything.

Assignments, `export`/`declare`/`local`, conditions (`[ ]`, `[[ ]]`, `test`, `(( ))`), `case`,
`for` over known words, functions, `eval`, `cd`, and the commands recipes use to compute values
inside `$( )` (echo, printf, expr, basename, dirname, pwd, readlink -f/realpath) run here; every
other command is recorded, not run, and its exit status is unknown. The `Shell` here runs
commands and control flow; it builds on `expansion` for words, and hands conditions to
`conditions` and the commands it runs itself to `builtins`.

A value that cannot be known is carried as an `Unknown` saying why (a variable nobody set, a
`$(date)`, a branch whose condition cannot be evaluated, a loop that is not run …) and becomes
an error only where a caller reads it. Where a condition cannot be evaluated, each way through
it is run from the same state and a variable whose value differs between them becomes unknown;
a way that ends in `exit` is dropped.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from asyncdapo.tools.from_verl.bash import builtins, conditions
from asyncdapo.tools.from_verl.bash.conditions import Undecidable
from asyncdapo.tools.from_verl.bash.control_flow import Break, Continue, Exit, NotRun, Return
from asyncdapo.tools.from_verl.bash.expansion import Expansion
from asyncdapo.tools.from_verl.bash.parse import parse
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
    Seq,
    ShellSyntaxError,
    Simple,
    Word,
)
from asyncdapo.tools.from_verl.bash.values import Arg, Blocked, Cause, Command, Outcome, Stop, Unknown, Value

_ABSENT = object()


@dataclass
class _State:
    variables: dict[str, Value]
    args: list[str | Unknown]
    functions: dict[str, Function]


def _copy(variables: dict[str, Value]) -> dict[str, Value]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in variables.items()}


class Shell(Expansion):
    """Runs commands and control flow as bash would; records the commands it does not run."""

    def __init__(
        self, env: Mapping[str, str], args: Sequence[str], path: str | None, cwd: str | None
    ) -> None:
        super().__init__(env, args, path, cwd)
        self.functions: dict[str, Function] = {}
        self.context: list[Unknown] = []
        self.commands: list[Command] = []
        self.frames: list[dict[str, object]] = []  # per function call: locals' outer values
        self.why = ""  # why the status is unknown
        self.undecided = ""  # why the last test could not be decided
        self.current = ""  # the builtin being run, as called ("[" or "test", "readlink" or "realpath")
        self.out: list[str] | None = None  # the output being captured, inside $( )
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

    def via(self, unknown: Unknown, name: str, line: int) -> Unknown:
        return replace(unknown, via=(*unknown.via, (name, line)))

    def speculate(self, branches: list[Callable[[], None] | None], why: Unknown) -> None:
        """Each way through a condition that cannot be evaluated, from the same state; what they
        agree on stays known."""
        if self.out is not None:
            raise NotRun(f"`{why.what}` cannot be evaluated ({why.detail})")
        base = self.save()
        outcomes: list[_State] = []
        for branch in branches:
            self.load(base)
            self.context.append(why)
            try:
                if branch is not None:
                    branch()
                outcomes.append(self.save())
            except Exit:
                pass
            except (Break, Continue, Return):
                outcomes.append(self.save())
            finally:
                self.context.pop()
        if not outcomes:
            raise Exit(why.line, why.what)
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
                with contextlib.suppress(Exit, Return, Break, Continue):
                    child.run(node.body)
                self.set_status(child.status, child.why)
            else:
                self.run(node.body)
        elif isinstance(node, CondExpr):
            self.line = node.line
            self.decide(lambda: conditions.cond_expr(self, list(node.parts)))
        else:
            self.line = node.line
            self.decide(lambda: bool(self.arithmetic(self.join(self.segs(node.expression)), node.text)))

    def runner(self, node: Node) -> Callable[[], None]:
        return lambda: self.run(node)

    def decide(self, test: Callable[[], bool | None]) -> None:
        self.undecided = ""
        try:
            result = test()
        except Undecidable as e:
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
                raise NotRun("a pipe `|` is not run")
            for command in node.commands:  # each side of a pipe runs in a subshell
                child = self.fork(capture=False)
                with contextlib.suppress(Exit, Return, Break, Continue):
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
                    except Break:
                        break
                    except Continue:
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

    def write(self, text: str, cmd: Simple) -> None:
        if self.out is not None and not _stdout_elsewhere(cmd):
            self.out.append(text)

    def fail(self, detail: str) -> None:
        """A command this reader ran but cannot finish: fatal inside $( ), unknown status outside."""
        if self.out is not None:
            raise NotRun(detail)
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
        if name in builtins.DECLARATIONS:
            assert name is not None
            builtins.declare(self, name, [*head[1:], *(Arg(w.text, w) for w in words[i:])], cmd)
            return
        args = [*head, *(a for w in words[i:] for a in self.args_of(w))]
        self.line = cmd.line
        if name is not None and name in self.functions:
            self.call(self.functions[name], args)
            return
        builtin = builtins.BUILTINS.get(name or "")
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
            raise NotRun(f"`{shown}` is not a command this reader runs")
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
        except Return:
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

    # assignments -----------------------------------------------------------------------------

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

    # command substitution --------------------------------------------------------------------

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
        except (Exit, Return, Break, Continue):
            pass
        except NotRun as e:
            raise Blocked(Unknown(Cause.COMMAND, whole, line, e.detail)) from None
        assert child.out is not None
        return "".join(child.out).rstrip("\n")


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
    except Exit as e:
        outcome.stopped = Stop(e.line, e.text)
    except (Return, Break, Continue):
        pass
    return outcome

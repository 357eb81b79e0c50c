"""Read verl's `key=value` overrides out of a recipe shell script, as bash would expand them.

verl's recipes set shell variables (`train_prompt_bsz=512`, `overlong_buffer_len=$((1024 * 4))`,
`MODEL_PATH=${MODEL_PATH:-"${HOME}/models/…"}`), sometimes under `if`, and then run the trainer:
`python3 -m recipe.dapo.main_dapo key=${var} …`, possibly behind `ray job submit … --` or
`torchrun`. The script's shell logic runs in `from_verl.bash` (nothing is executed); this module
picks the trainer's command among those the script runs and reads its dotted `key=value`
arguments, `+`/`++` prefixes kept.

Variables come from the environment, then the script's own assignments, as in bash. Whatever a
read `key=value` needs but cannot be known (an unset variable, a `$(date)`, a value set under a
condition that cannot be evaluated) is an error naming the text, its line and the key; the key is
still listed, with its text as written, in `unresolved`. Errors are returned, all of them, not
raised: the caller prints them at once.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from asyncdapo.tools.from_verl.bash.interpreter import run_script
from asyncdapo.tools.from_verl.bash.syntax import ShellSyntaxError
from asyncdapo.tools.from_verl.bash.values import Arg, Cause, Command, Outcome, Unknown

# a Hydra override: optional +/++, a dotted key; its value follows the `=`
_OVERRIDE = re.compile(r"(\+{0,2})([A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)+)=")
_PYTHON = re.compile(r"python[0-9.]*|pypy[0-9.]*")
_PYTHON_FLAGS_WITH_VALUE = frozenset({"-X", "-W", "-Q"})
_TORCHRUN_FLAGS = frozenset({"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"})
_TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_NOT_TRAINERS = frozenset({"main_generation", "main_generation_server", "main_eval"})


@dataclass(frozen=True)
class ShellProblem:
    line: int
    key: str | None  # the verl key (no +/++) whose value it affects; None: the script as a whole
    text: str  # what could not be expanded or understood, as written in the script
    message: str  # the whole sentence, as listed in ShellRead.errors


@dataclass
class ShellRead:
    overrides: list[str] = field(default_factory=list)  # dotted key=value, in order
    unresolved: dict[str, str] = field(default_factory=dict)  # override -> what could not be expanded
    entry: str | None = None  # the trainer's `-m` module, or the script path it runs
    errors: list[str] = field(default_factory=list)  # every problem, one actionable sentence each
    problems: list[ShellProblem] = field(default_factory=list)  # the same, with line and key


@dataclass(frozen=True)
class _Invocation:
    command: Command
    entry: str | None
    entry_unknown: Arg | None  # the module or script word, when it cannot be expanded
    args: tuple[Arg, ...]  # what follows the module or script

    @property
    def rank(self) -> int:
        """2: a verl trainer entry (main_ppo, main_dapo, fully_async_main, …); 1: another python
        command given key=value arguments; 0: neither."""
        if self.entry is not None:
            last = posixpath.basename(self.entry).removesuffix(".py").rsplit(".", 1)[-1]
            if last not in _NOT_TRAINERS and re.fullmatch(r"(\w+_)?main(_\w+)?|\w*trainer\w*", last):
                return 2
        return 1 if any(_is_override(a) for a in self.args) else 0

    def shown(self) -> str:
        where = f"line {self.command.line} ({self.entry or self.command.text[:60]}"
        for condition in self.command.conditions:
            where += f", if `{condition.what}` on line {condition.line} holds"
        return where + ")"


def _written_arg(arg: Arg) -> str:
    """The argument, or as written when it cannot be expanded (options are told by their `-`)."""
    return arg.text if arg.text is not None else arg.word.text


def _is_override(arg: Arg) -> bool:
    return _OVERRIDE.match(_written_arg(arg)) is not None


def _invocation(command: Command) -> _Invocation | None:
    """The python (or torchrun) entry the command runs, wherever it sits in the command line
    (`ray job submit … -- python3 -m …`, `nohup python …`, `torchrun … -m …`)."""
    args = command.args
    for i, arg in enumerate(args):
        name = posixpath.basename(arg.text) if arg.text is not None else None
        nxt = args[i + 1].text if i + 1 < len(args) else None
        if name is not None and _PYTHON.fullmatch(name):
            found = _python(command, args[i + 1 :])
        elif name == "torchrun":
            found = _torchrun(command, args[i + 1 :])
        elif name is None and nxt == "-m":  # `$PYTHON -m …`
            found = _python(command, args[i + 1 :])
        else:
            continue
        if found is not None:
            return found
    return None


def _python(command: Command, args: tuple[Arg, ...]) -> _Invocation | None:
    i = 0
    while i < len(args):
        text = _written_arg(args[i])
        if re.fullmatch(r"-[a-zA-Z]*m", text):
            module = args[i + 1] if i + 1 < len(args) else None
            if module is None:
                return None
            if module.text in _TORCHRUN_MODULES:
                return _torchrun(command, args[i + 2 :])
            return _entry(command, module, args[i + 2 :])
        if text == "-c":
            return None
        if text.startswith("-") and text != "-":
            i += 2 if text in _PYTHON_FLAGS_WITH_VALUE else 1
            continue
        return _entry(command, args[i], args[i + 1 :])
    return None


def _torchrun(command: Command, args: tuple[Arg, ...]) -> _Invocation | None:
    i = 0
    while i < len(args):
        text = _written_arg(args[i])
        if text.startswith("-"):  # `-m`: what follows is a module, the entry still
            i += 1 if ("=" in text or text in _TORCHRUN_FLAGS or text in ("-m", "--module")) else 2
        else:
            return _entry(command, args[i], args[i + 1 :])
    return None


def _entry(command: Command, word: Arg, rest: tuple[Arg, ...]) -> _Invocation:
    if word.text is None:
        return _Invocation(command, None, word, rest)
    return _Invocation(command, word.text, None, rest)


# messages ------------------------------------------------------------------------------------


def _written(unknown: Unknown) -> str:
    """What could not be expanded, as the script writes it."""
    if unknown.cause in (Cause.UNSET, Cause.REQUIRED):
        return f"${unknown.what}"
    if unknown.name:  # set under a condition or in a loop: the variable is what is unknown
        return f"${unknown.name}"
    return unknown.what


def _explain(unknown: Unknown) -> str:
    """Why the value is unknown and what to do, in one sentence."""
    what, line = unknown.what, unknown.line
    detail = f" ({unknown.detail})" if unknown.detail else ""
    match unknown.cause:
        case Cause.UNSET:
            reason = f"{what} is not set{detail}"
            fix = f"run `{what}=<value> asyncdapo config from-verl …` or edit the script"
        case Cause.REQUIRED:
            reason = f"{what} is not set (the script says: {unknown.detail})"
            fix = f"run `{what}=<value> asyncdapo config from-verl …` or edit the script"
        case Cause.ARGUMENT:
            reason = f"{what} is an argument of the script, and from-verl reads the script without arguments"
            fix = f"give it a default in the script (${{{what[1:]}:-value}}) or write the value there"
        case Cause.SCRIPT_PATH:
            reason = f"{what} is the script's own path, which is not known here"
            fix = "give the script as a file, or write the value in the script"
        case Cause.COMMAND:
            reason = f"cannot expand {what} (line {line}){detail}"
            fix = "set the value by hand: write it in the script"
        case Cause.CONDITION:
            subject = f"{unknown.name} is" if unknown.name else "it is"
            reason = f"{subject} set under `{what}` (line {line}), which cannot be evaluated{detail}"
            fix = "set the value by hand: write it in the script outside the condition"
        case Cause.LOOP:
            subject = f"{unknown.name} is" if unknown.name else "it is"
            reason = f"{subject} set inside the loop `{what}` (line {line}), which is not run{detail}"
            fix = "set the value by hand: write it in the script outside the loop"
        case Cause.ARITHMETIC:
            reason = f"bash cannot compute {what} (line {line}): {unknown.detail}"
            fix = "fix the expression in the script"
        case Cause.VOLATILE:
            reason = f"{what} (line {line}) differs on every run"
            fix = "set the value by hand: write it in the script"
        case _:
            reason = f"{what} (line {line}) is a form this reader does not expand{detail}"
            fix = "set the value by hand: write it in the script"
    through = ""
    if unknown.via:
        through = " (through " + ", ".join(f"{name} on line {at}" for name, at in unknown.via) + ")"
    return f"{reason}{through}: {fix}"


class _Report:
    def __init__(self) -> None:
        self.read = ShellRead()

    def add(self, line: int, key: str | None, text: str, message: str) -> None:
        full = f"line {line}: {message}"
        self.read.problems.append(ShellProblem(line, key, text, full))
        self.read.errors.append(full)


def _read_arguments(chosen: _Invocation, report: _Report) -> None:
    read = report.read
    for arg in chosen.args:
        if arg.text is not None:
            if _OVERRIDE.match(arg.text):
                read.overrides.append(arg.text)
            continue
        assert arg.unknown is not None
        written = arg.word.text
        m = _OVERRIDE.match(written)
        if m is None:
            if not written.startswith("-"):
                report.add(
                    arg.word.line, None, written,
                    f"{written}: {_explain(arg.unknown)}; it is an argument of the trainer and may hold key=value overrides",
                )  # fmt: skip
            continue
        read.overrides.append(written)
        read.unresolved[written] = _written(arg.unknown)
        report.add(arg.word.line, m.group(2), _written(arg.unknown), f"{written}: {_explain(arg.unknown)}")


def _misplaced_overrides(outcome: Outcome, report: _Report) -> None:
    """A `key=value` run as a command: the trainer's command ended a line early (a comment between
    continued lines, a missing `\\`), so bash runs the rest as a command and fails."""
    for command in outcome.commands:
        first = command.args[0].text if command.args else None
        m = _OVERRIDE.match(first) if first is not None else None
        if first is not None and m is not None:
            report.add(
                command.line, m.group(2), first,
                f"`{command.text[:80]}` runs as a command of its own, not as arguments of the trainer: "
                "the command before it ends a line early (a comment line or a missing `\\` in between); "
                "bash fails here, and the trainer does not get these keys: fix the script",
            )  # fmt: skip


def read_script(
    script: str,
    *,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    path: str | None = None,
    cwd: str | None = None,
) -> ShellRead:
    """The trainer's dotted `key=value` arguments, expanded as bash would.

    env: the variables the script starts with (os.environ); args: its positional arguments (none);
    path: the script's own path, for $0 and ${BASH_SOURCE[0]}; cwd: the directory it runs in, for
    $PWD and `pwd` (the current one).
    """
    report = _Report()
    try:
        outcome = run_script(
            script,
            env=os.environ if env is None else env,
            args=args,
            path=path,
            cwd=os.getcwd() if cwd is None else cwd,
        )
    except ShellSyntaxError as e:
        report.add(e.line, None, "", f"bash cannot parse the script: {e.message}: fix the script")
        return report.read
    except RecursionError:  # a script that expands or calls itself without end
        report.add(1, None, "", "the script nests expansions or calls too deeply to be read: simplify it")
        return report.read
    _misplaced_overrides(outcome, report)
    found = [inv for c in outcome.commands if (inv := _invocation(c)) is not None]
    candidates = [inv for inv in found if inv.rank > 0]
    if not candidates:  # no python trainer: a command given key=value arguments, if just one
        candidates = [
            _Invocation(c, None, None, c.args[1:])
            for c in outcome.commands
            if any(_is_override(a) for a in c.args[1:])
        ]
    if not candidates:
        if outcome.stopped is not None:
            report.add(
                outcome.stopped.line, None, outcome.stopped.text,
                f"the script stops at `{outcome.stopped.text}` before it runs a verl trainer "
                "(from-verl reads it without arguments, with this environment): edit the script",
            )  # fmt: skip
        return report.read
    best = max(inv.rank for inv in candidates)
    top = [inv for inv in candidates if inv.rank == best]
    if len(top) > 1:
        report.add(
            top[0].command.line, None, "",
            "the script runs several trainer commands: " + ", ".join(inv.shown() for inv in top)
            + ": keep the one to convert in the script, or convert a script that runs one",
        )  # fmt: skip
        return report.read
    chosen = top[0]
    report.read.entry = chosen.entry
    if chosen.entry_unknown is not None and chosen.entry_unknown.unknown is not None:
        word = chosen.entry_unknown.word
        report.add(
            word.line, None, word.text,
            f"the trainer's entry {word.text}: {_explain(chosen.entry_unknown.unknown)}",
        )  # fmt: skip
    for condition in chosen.command.conditions:
        report.add(
            chosen.command.line, None, condition.what,
            f"the trainer's command runs only if `{condition.what}` (line {condition.line}) holds, "
            f"which cannot be evaluated ({condition.detail}): edit the script so that it runs the trainer unconditionally",
        )  # fmt: skip
    _read_arguments(chosen, report)
    return report.read

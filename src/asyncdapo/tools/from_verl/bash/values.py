"""What the interpreter knows and what it hands back: a variable's `Value` — text, an array,
or an `Unknown` saying why it cannot be known — the `Blocked` an expansion raises on reaching an
unknown, the arguments of a command not run (`Arg`, `Command`) and the `Outcome` of a script.

An unknown value becomes an error only where a caller reads it: a variable assigned from
`$(date)` but never used costs nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from asyncdapo.tools.from_verl.bash.syntax import Word


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

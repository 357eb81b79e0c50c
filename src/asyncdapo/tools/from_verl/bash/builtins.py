"""The commands this reader runs itself, as the Shell runs them: bash's builtins that change its
state (cd, set, shift, unset, export/declare/local, eval, let, read, source, exit, return, break,
continue, test/[) and the commands recipes call inside `$( )` to compute a value (echo, printf,
expr, basename, dirname, pwd, realpath, readlink -f): their options, their output (captured
inside `$( )`, dropped outside) and their exit status. The text work of the latter is
`coreutils`'s, which knows nothing of the Shell."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from asyncdapo.tools.from_verl.bash import conditions, coreutils
from asyncdapo.tools.from_verl.bash.conditions import Undecidable
from asyncdapo.tools.from_verl.bash.control_flow import Break, Continue, Exit, NotRun, Return
from asyncdapo.tools.from_verl.bash.lexer import ASSIGNMENT, NAME
from asyncdapo.tools.from_verl.bash.parse import parse
from asyncdapo.tools.from_verl.bash.syntax import Assign, ShellSyntaxError, Simple, Word
from asyncdapo.tools.from_verl.bash.values import Arg, Blocked, Cause, Unknown

if TYPE_CHECKING:
    from asyncdapo.tools.from_verl.bash.interpreter import Shell

DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})


def declare(sh: Shell, builtin: str, args: list[Arg], cmd: Simple) -> None:
    """export, declare, typeset, local, readonly: each later word is an assignment, expanded as
    one word (not split), as bash does; args holds them as written."""
    options = ""
    local = builtin == "local" or (builtin in ("declare", "typeset") and bool(sh.frames))
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
                sh.make_local(name)
            sh.set_var(name, why)
            continue
        if m is None:
            if local:
                sh.make_local(name)
                sh.vars.pop(name, None)
            continue
        assign = Assign(
            name, m.group(2), m.group(3) == "+",
            None if word.array is not None else Word(m.group(4), word.line), word.array, word.line,
        )  # fmt: skip
        sh.assign(assign, local=local)
    sh.set_status(0)


_Builtin = Callable[["Shell", list[Arg], Simple], None]


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
            raise Undecidable(e.unknown.brief()) from None
        if sh.current == "[":
            if not words or words[-1] != "]":
                raise Undecidable("`[` without its `]`")
            words = words[:-1]
        return conditions.test(sh, words)

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
        raise NotRun(f"`{cmd.text}` reads input")
    for name in names or ["REPLY"]:
        sh.set_var(name, Unknown(Cause.COMMAND, cmd.text, cmd.line, "it reads input", name=name))
    sh.set_status(None, f"`{cmd.text}` reads input")


def _exit(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise Exit(cmd.line, cmd.text)


def _return(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise Return()


def _break(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise Break()


def _continue(sh: Shell, args: list[Arg], cmd: Simple) -> None:
    raise Continue()


BUILTINS: dict[str, _Builtin] = {
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

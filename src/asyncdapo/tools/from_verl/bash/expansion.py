"""Word expansion as bash does it: tilde, then parameters (`$VAR`, `${VAR:-default}` and the rest
of the `${ }` family, arrays, `$@`), `$(( ))` arithmetic and `$( )` command substitution from left
to right, then splitting on IFS and quote removal; and the arguments a command's words become.
No file is read, so a glob is not matched against files: it stays as written.

`Expansion` holds the variables and positional arguments and reads them; the `Shell` of
`interpreter` builds on it and supplies `substitute`, which runs commands. An unset variable
is unknown (`Blocked`), in arithmetic too, except in the `${VAR:-default}` family that exists to
handle it: bash stops at one under `set -u` (which recipes set) and reads it as empty without
it, and both would hide a missing value."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from enum import Enum

from asyncdapo.tools.from_verl.bash import arith, coreutils, patterns
from asyncdapo.tools.from_verl.bash.lexer import (
    NAME,
    skip_arithmetic,
    skip_braces,
    skip_double_quoted,
    skip_parens,
    skip_unit,
)
from asyncdapo.tools.from_verl.bash.syntax import Word
from asyncdapo.tools.from_verl.bash.values import Arg, Blocked, Cause, Unknown, Value


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


class Expansion(ABC):
    """The variables, the positional arguments, and how words expand with them."""

    def __init__(
        self, env: Mapping[str, str], args: Sequence[str], path: str | None, cwd: str | None
    ) -> None:
        self.vars: dict[str, Value] = dict(env)
        if cwd is not None:
            self.vars["PWD"] = cwd
        self.args: list[str | Unknown] = list(args)
        self.path = path  # the script's own path: $0, ${BASH_SOURCE[0]}
        self.sourced: list[tuple[str, int]] = []  # the `source`d files (not read): (command, line)
        # arrays with elements that cannot be expanded: (the array's Unknown, known, unknown elements)
        self.partial: dict[str, tuple[Unknown, dict[int, str], dict[int, tuple[Word, Unknown]]]] = {}
        self.status: int | None = 0  # the last command's, for $?
        self.line = 1

    @abstractmethod
    def substitute(self, body: str, whole: str) -> str:
        """The output of `$( … )` / `` `…` ``: running its commands is the Shell's."""

    # variables -------------------------------------------------------------------------------

    def set_var(self, name: str, value: Value) -> None:
        self.vars[name] = value

    def unset(self, name: str) -> Unknown:
        if name.isdigit():
            return Unknown(Cause.ARGUMENT, f"${name}", self.line, "the script is read without arguments")
        detail = ""
        if self.sourced:
            text, line = self.sourced[-1]
            detail = f"it may come from `{text}` (line {line}), which is not read"
        return Unknown(Cause.UNSET, name, self.line, detail)

    def known_args(self) -> list[str]:
        out: list[str] = []
        for a in self.args:
            if isinstance(a, Unknown):
                raise Blocked(a)
            out.append(a)
        return out

    def index(self, text: str, array: Mapping[int, str] | None = None) -> int:
        value = self.arithmetic(self.join(self.segs(text)), f"[{text}]")
        if value < 0 and array is not None:
            value += max(array, default=-1) + 1
        return value

    # arguments -------------------------------------------------------------------------------

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

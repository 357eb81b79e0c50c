"""Read verl's `key=value` overrides out of a recipe shell script, as bash would expand them.

verl's recipes (recipe/dapo/*.sh) set shell variables first (`train_prompt_bsz=512`,
`overlong_buffer_len=$((1024 * 4))`, `MODEL_PATH=${MODEL_PATH:-"${HOME}/models/…"}`) and then
run `python3 -m … key=${var} …` over continued lines. This expands the subset of bash those
scripts use: `$NAME`, `${NAME}`, `${NAME:-default}` (nested), `$((integer arithmetic))` with bare
variable names, quoting and comments. Variables come from the script's own assignments, then the
environment. What cannot be expanded is kept verbatim and reported, never guessed.
"""

from __future__ import annotations

import ast
import operator
import os
import re
import shlex
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip


@dataclass
class ShellRead:
    overrides: list[str] = field(default_factory=list)  # dotted key=value, in order
    unresolved: dict[str, str] = field(default_factory=dict)  # override -> what could not be expanded


def _arith(expr: str, env: dict[str, str]) -> str:
    """bash $(( )) on integers; bare names are variables (unset: 0, as in bash)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return int(env.get(node.id, "0") or 0)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        raise ValueError(expr)

    expanded = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    return str(value(ast.parse(expanded.strip(), mode="eval").body))


class _Expander:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.missing: list[str] = []

    def lookup(self, name: str) -> str | None:
        return self.env.get(name, os.environ.get(name))

    def expand(self, text: str) -> str:
        out, i = [], 0
        quote = None  # inside '…' nothing expands
        while i < len(text):
            c = text[i]
            if c == "'" and quote != '"':
                quote = None if quote == "'" else "'"
            elif c == '"' and quote != "'":
                quote = None if quote == '"' else '"'
            if c != "$" or quote == "'" or i + 1 == len(text):
                out.append(c)
                i += 1
                continue
            nxt = text[i + 1]
            if text.startswith("$((", i):
                end = self._close(text, i + 3, "((", "))")
                body = text[i + 3 : end]
                try:
                    out.append(_arith(self.expand(body), self.env))
                except (ValueError, SyntaxError, ZeroDivisionError):
                    self.missing.append(f"$(({body}))")
                    out.append(f"$(({body}))")
                i = end + 2
            elif nxt == "{":
                end = self._close(text, i + 2, "{", "}")
                out.append(self._brace(text[i + 2 : end]))
                i = end + 1
            elif m := _NAME.match(text, i + 1):
                v = self.lookup(m.group())
                if v is None:
                    self.missing.append("$" + m.group())
                out.append(v if v is not None else "$" + m.group())
                i = m.end()
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def _brace(self, inner: str) -> str:
        name, sep, default = inner.partition(":-")
        v = self.lookup(name)
        if v:
            return v
        if sep:
            return _unquote(self.expand(default))
        self.missing.append("${" + inner + "}")
        return "${" + inner + "}"

    @staticmethod
    def _close(text: str, start: int, opening: str, closing: str) -> int:
        depth, i = 1, start
        while i < len(text):
            if text.startswith(closing, i):
                depth -= 1
                if depth == 0:
                    return i
                i += len(closing)
            elif text.startswith(opening, i):
                depth += 1
                i += len(opening)
            else:
                i += 1
        raise ValueError(f"unbalanced {opening!r} in {text!r}")


def _unquote(s: str) -> str:
    try:
        parts = shlex.split(s)
    except ValueError:
        return s
    return " ".join(parts) if parts else ""


def _logical_lines(script: str) -> list[str]:
    lines, current = [], ""
    for raw in script.splitlines():
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def read_script(script: str) -> ShellRead:
    """The dotted `key=value` arguments of the script's commands, expanded."""
    env: dict[str, str] = {}
    out = ShellRead()
    for line in _logical_lines(script):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _ASSIGN.match(line.strip())
        if m:
            try:
                value = shlex.split(_Expander(env).expand(m.group(2)), comments=True)
            except ValueError:
                value = []
            if len(value) <= 1:  # NAME=value (else an env prefix of a command: read as one)
                env[m.group(1)] = value[0] if value else ""
                continue
        ex = _Expander(env)
        try:
            expanded = ex.expand(line)
            tokens = shlex.split(expanded, comments=True)
        except ValueError:
            continue
        for tok in tokens:
            key, sep, _ = tok.partition("=")
            if sep and "." in key and re.fullmatch(r"\+{0,2}[A-Za-z_][\w.]*", key):
                out.overrides.append(tok)
                missing = [m for m in ex.missing if m in tok]
                if missing:
                    out.unresolved[tok] = ", ".join(missing)
    return out

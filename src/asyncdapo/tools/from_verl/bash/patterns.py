"""bash's glob patterns (`${VAR#pat}`, `${VAR/pat/rep}`, `case`, `[[ x == pat ]]`) as regular
expressions: `*`, `?` and `[…]` (with `!`/`^` negation and `[:class:]`) match as in bash, and
characters that were quoted in the script match only themselves."""

from __future__ import annotations

import re

_CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "digit": "0-9", "lower": "a-z",
    "upper": "A-Z", "space": " \\t\\n\\r\\f\\v", "xdigit": "0-9A-Fa-f", "word": "a-zA-Z0-9_",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "cntrl": "\\x00-\\x1f\\x7f",
    "print": "\\x20-\\x7e", "graph": "\\x21-\\x7e",
}  # fmt: skip


def _bracket(chars: list[tuple[str, bool]], i: int) -> tuple[str, int] | None:
    """The regex class for a `[…]` starting at chars[i], and the index after it; None: no `]`."""
    j = i + 1
    negate = j < len(chars) and chars[j][0] in "!^" and not chars[j][1]
    if negate:
        j += 1
    parts: list[str] = []
    first = True
    while j < len(chars):
        ch, quoted = chars[j]
        if ch == "]" and not quoted and not first:
            return ("[^" if negate else "[") + "".join(parts) + "]", j + 1
        if ch == "[" and not quoted and j + 1 < len(chars) and chars[j + 1][0] == ":":
            rest = "".join(c for c, _ in chars[j + 2 :])
            m = re.match(r"([a-z]+):\]", rest)
            if m and m.group(1) in _CLASSES:
                parts.append(_CLASSES[m.group(1)])
                j += 2 + m.end()
                first = False
                continue
        if ch == "-" and not quoted and parts and j + 1 < len(chars) and chars[j + 1][0] != "]":
            parts.append("-")
        else:
            parts.append(re.escape(ch))
        first = False
        j += 1
    return None


def to_regex(chars: list[tuple[str, bool]]) -> str:
    """The regex (without anchors) for a pattern given as (char, was-quoted) pairs."""
    out: list[str] = []
    i = 0
    while i < len(chars):
        ch, quoted = chars[i]
        if quoted:
            out.append(re.escape(ch))
        elif ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[" and (found := _bracket(chars, i)) is not None:
            out.append(found[0])
            i = found[1]
            continue
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def compile_pattern(chars: list[tuple[str, bool]]) -> re.Pattern[str]:
    return re.compile(to_regex(chars), re.DOTALL)


def strip(value: str, pattern: re.Pattern[str], *, prefix: bool, longest: bool) -> str:
    """`${V#p}` `${V##p}` (prefix) and `${V%p}` `${V%%p}` (suffix)."""
    cuts = range(len(value), -1, -1) if longest == prefix else range(len(value) + 1)
    for cut in cuts:
        part = value[:cut] if prefix else value[cut:]
        if pattern.fullmatch(part):
            return value[cut:] if prefix else value[:cut]
    return value


def _longest_end(value: str, pattern: re.Pattern[str], start: int) -> int | None:
    for end in range(len(value), start - 1, -1):
        if pattern.fullmatch(value, start, end):
            return end
    return None


def replace(
    value: str, pattern: re.Pattern[str], replacement: Replacement, *, every: bool, anchor: str
) -> str:
    """`${V/p/r}` (first), `${V//p/r}` (every), `${V/#p/r}` (at the start), `${V/%p/r}` (at the end):
    the longest match at the leftmost place; an empty pattern changes nothing."""
    if not pattern.pattern:
        return value
    if anchor == "#":
        end = _longest_end(value, pattern, 0)
        return value if end is None else replacement.render(value[:end]) + value[end:]
    if anchor == "%":
        for start in range(len(value) + 1):
            if pattern.fullmatch(value, start, len(value)):
                return value[:start] + replacement.render(value[start:])
        return value
    out: list[str] = []
    i = 0
    while i <= len(value):
        for start in range(i, len(value) + 1):
            end = _longest_end(value, pattern, start)
            if end is not None:
                break
        else:
            break
        out += [value[i:start], replacement.render(value[start:end])]
        i = end
        if not every:
            break
        if end == start:  # an empty match: step over one character, as bash does
            out.append(value[start : start + 1])
            i = start + 1
    out.append(value[i:])
    return "".join(out)


class Replacement:
    """A `${V/p/rep}` replacement: bash 5.2 puts the matched text where `rep` has an unquoted `&`."""

    def __init__(self, chars: list[tuple[str, bool]]) -> None:
        self.chars = chars

    def render(self, matched: str) -> str:
        return "".join(matched if ch == "&" and not quoted else ch for ch, quoted in self.chars)

"""One style for every configuration mistake, wherever it is found (`asyncdapo config check`,
`asyncdapo up`, the services' `--config`, the operator's TrainingRun status):

    field.path: <what was given>; <what is allowed>[; <what to do>]

e.g. `rollout.n: 0 given; must be >= 1`, `rollout.temprature: unknown key; did you mean
rollout.temperature?`. A `Problem` is that line as data; `problems_of` turns a pydantic
`ValidationError` into problems (its `input` is what was given, its `ctx` the bound that was
broken), and `conflict` is how a model validator reports an impossible combination of fields so
that it reads the same. Contract layer: pydantic only, no model of its own (the model whose field
paths a "did you mean" searches is passed in).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError


class ProblemKind(StrEnum):
    UNKNOWN_KEY = "unknown-key"  # no such field (a typo, or a verl key)
    INVALID = "invalid"  # a value out of bounds or of the wrong type
    MISSING = "missing"  # a required field left out
    CONFLICT = "conflict"  # each value fine alone, impossible together
    NOT_FOUND = "not-found"  # a file, directory or model that is not there (preflight)
    UNREADABLE = "unreadable"  # there, but it cannot be used (preflight)
    UNREACHABLE = "unreachable"  # a server that does not answer (preflight)


@dataclass(frozen=True)
class Problem:
    field: str  # dotted path (`rollout.n`, `data.train_files[0]`), or a flag (`--redis-url`)
    given: str  # what was given: "0 given", "unknown key", "missing" ("" where it says nothing)
    allowed: str  # what is allowed, or why it cannot work
    hint: str = ""  # what to do, where there is more to say than `allowed`
    kind: ProblemKind = ProblemKind.INVALID
    origin: str = ""  # the `key=value` override that set the field ("" for the file's own value)

    def __str__(self) -> str:
        text = f"{self.field}: " + "; ".join(p for p in (self.given, self.allowed, self.hint) if p)
        return text + (f" (from override {self.origin!r})" if self.origin else "")


def render(header: str, problems: Sequence[Problem], indent: str = "  ") -> str:
    """`header` and one indented line per problem."""
    return "\n".join([header, *(indent + str(p) for p in problems)])


def show(value: Any) -> str:
    """A given value as the user wrote it (YAML spelling for true/false/null), kept short."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, int | float):
        text = str(value)
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# --- model validators: impossible combinations ---------------------------------------------------

CONFLICT_TYPE = "config_conflict"


def conflict(problems: Sequence[Problem]) -> PydanticCustomError:
    """The error a model validator raises for impossible combinations: every problem, each naming
    its field relative to the model (`problems_of` prefixes where the model sits)."""
    detail = "; ".join(str(p) for p in problems)
    return PydanticCustomError(
        CONFLICT_TYPE,
        "{detail}",
        {
            "detail": detail,
            "problems": tuple(asdict(replace(p, kind=ProblemKind.CONFLICT)) for p in problems),
        },
    )


# --- pydantic errors ---------------------------------------------------------------------------

# what is allowed, per pydantic error type, from the error's ctx
_ALLOWED: dict[str, str] = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "enum": "must be one of {expected}",
    "literal_error": "must be one of {expected}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
    "string_too_short": "must have at least {min_length} character(s)",
    "string_too_long": "must have at most {max_length} character(s)",
    "string_pattern_mismatch": "must match {pattern}",
    "model_type": "must be a section (a mapping of keys)",
    "model_attributes_type": "must be a section (a mapping of keys)",
    "dict_type": "must be a mapping",
}

# A union's members appear in pydantic's loc (`int`, `constrained-str`, `list[str]`); they are no
# field of the user's and are left out of the path.
_UNION_TAG = re.compile(r"^(int|float|str|bool|none|bytes|constrained-[\w-]+|function-[\w-]+|[\w-]+\[.*\])$")


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_TAG.match(part):
            out += f".{part}" if out else part
    return out


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix.rstrip(".")
    return prefix + path if prefix.endswith(".") or path.startswith("[") else f"{prefix}.{path}"


def _leaves(value: Any, path: str) -> Iterator[str]:
    """The dotted keys under an unknown section (`actor_rollout_ref: {rollout: {n: 16}}` ->
    `actor_rollout_ref.rollout.n`), so that each is named as the user wrote it."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    else:
        yield path


def problems_of(
    err: ValidationError,
    model: type[BaseModel],
    prefix: str = "",
    patterns: Mapping[str, str] | None = None,
) -> list[Problem]:
    """One `Problem` per wrong field of `err` (raised validating `model`); field paths start with
    `prefix` (e.g. "spec."). `patterns` names regular expressions in words (a Kubernetes quantity
    reads better than its regex). Errors of a union's members on one field become one problem."""
    out: list[Problem] = []
    by_field: dict[str, int] = {}
    for e in err.errors(include_url=False):
        loc, ctx, value = e["loc"], e.get("ctx") or {}, e.get("input")
        path = _path(loc)
        if e["type"] == CONFLICT_TYPE:
            for p in ctx.get("problems", ()):
                out.append(Problem(**{**p, "field": _join(_join(prefix, path), p["field"])}))
            continue
        if e["type"] == "extra_forbidden":
            # the last part of loc is the unknown key as written, never a union member: named even
            # when it reads like one (`int`) or is empty
            last = loc[-1] if loc else ""
            key_text = f"[{last}]" if isinstance(last, int) else (last or '""')
            path = _join(_path(loc[:-1]), key_text)
            for key in _leaves(value, path):
                meant = did_you_mean(key, model)
                out.append(
                    Problem(
                        _join(prefix, key),
                        "unknown key",
                        _did_you_mean_text(meant, prefix) if meant else _no_such_key(key, model, prefix),
                        kind=ProblemKind.UNKNOWN_KEY,
                    )
                )
            continue
        field = _join(prefix, path)
        if e["type"] == "missing":
            out.append(Problem(field, "missing", "required", kind=ProblemKind.MISSING))
            continue
        if e["type"] in ("value_error", "assertion_error"):
            allowed = str(ctx.get("error", e["msg"]))
        elif e["type"] == "string_pattern_mismatch" and patterns and ctx.get("pattern") in patterns:
            allowed = f"must be {patterns[ctx['pattern']]}"
        else:
            allowed = _allowed(e["type"], ctx, e["msg"])
        # a model-level validator's input is the whole section: say only what is wrong
        given = "" if isinstance(value, dict) and e["type"] == "value_error" else f"{show(value)} given"
        if field in by_field:  # another member of a union: either would do
            i = by_field[field]
            out[i] = Problem(field, out[i].given, f"{out[i].allowed}, or {allowed.removeprefix('must ')}")
            continue
        by_field[field] = len(out)
        out.append(Problem(field, given, allowed))
    return out


def _allowed(error_type: str, ctx: dict[str, Any], msg: str) -> str:
    """What is allowed, from the bound in `ctx`; pydantic's own words where there is no template."""
    try:
        return _ALLOWED[error_type].format(
            **{k: v if isinstance(v, str) else show(v) for k, v in ctx.items()}
        )
    except KeyError:  # a type without a template, or a template whose bound pydantic did not give
        return re.sub(r"^Input should be", "must be", msg)


# --- field paths and "did you mean" -----------------------------------------------------------


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (`X`, `X | None`), or None for a value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for a in typing.get_args(annotation) if (m := _submodel(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


@functools.cache
def field_paths(model: type[BaseModel]) -> tuple[str, ...]:
    """Every dotted field path of `model`, sections and leaves (a field's alias where it has one,
    as the user writes it: `run.rollout.n`, `gateway.gpusPerPod`)."""
    out: list[str] = []
    for name, f in model.model_fields.items():
        key = f.alias or name
        out.append(key)
        sub = _submodel(f.annotation)
        if sub is not None:
            out += [f"{key}.{p}" for p in field_paths(sub)]
    return tuple(out)


def _section(path: str, model: type[BaseModel]) -> tuple[str, list[str]]:
    """The deepest known section above `path` and the names of its fields."""
    parts = path.split(".")
    known = set(field_paths(model))
    for i in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:i])
        if parent in known:
            kids = [p[len(parent) + 1 :] for p in field_paths(model) if p.startswith(parent + ".")]
            return parent, [k for k in kids if "." not in k]
    return "", [p for p in field_paths(model) if "." not in p]


def did_you_mean(path: str, model: type[BaseModel]) -> list[str]:
    """The field paths of `model` a misspelt `path` most likely meant (several when its field name
    is in several sections; none when nothing is close): a close name in the same section first,
    then a close path anywhere, then the same field name in another section."""
    path = re.sub(r"\[\d+\]", "", path)
    parent, siblings = _section(path, model)
    leaf = path[len(parent) + 1 :] if parent else path
    if "." not in leaf:
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.7)
        if close:
            return [f"{parent}.{close[0]}" if parent else close[0]]
    paths = field_paths(model)
    close = difflib.get_close_matches(path, paths, n=1, cutoff=0.8)
    if close:
        return close
    # the same field name elsewhere: only for a key put in the wrong known section (`trainer.
    # max_staleness`), or under a section of the same name (`x.rollout.n`); a common name under an
    # unknown section (`algorithm.filter_groups.enable`) would point anywhere
    head, _, name = path.rpartition(".")
    same = [
        p
        for p in paths
        if p.rpartition(".")[2] == name
        and (head == parent or head.rpartition(".")[2] == p.rpartition(".")[0].rpartition(".")[2])
    ]
    return same if len(same) <= 3 else []


def _did_you_mean_text(meant: Sequence[str], prefix: str) -> str:
    return "did you mean " + " or ".join(_join(prefix, m) for m in meant) + "?"


def _no_such_key(path: str, model: type[BaseModel], prefix: str = "") -> str:
    parent, _ = _section(re.sub(r"\[\d+\]", "", path), model)
    return f"{_join(prefix, parent)} has no such field" if parent else "no such section or field"

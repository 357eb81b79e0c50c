"""`key=value` overrides of a run config, as Hydra gives verl users: `trainer.lr=3e-6 rollout.n=16`.

An override is applied to the raw mapping read from the YAML, before validation, so a wrong key or
value gets the same error, naming the same dotted field, as it would in the file. Values are read
as YAML (`true`, `16`, `[a.parquet, b.parquet]`, `null`), except where the field is a string
(`name=0123` stays the string "0123"); a single value given to a list field becomes a one-item
list (`data.train_files=train.parquet`).
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel

from asyncdapo.contracts.config_problems import Problem, show
from asyncdapo.contracts.errors import AsyncdapoError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class OverrideError(AsyncdapoError, ValueError):
    """An override is not `dotted.key=value`, or walks into a value that is not a section."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def is_override(arg: str) -> bool:
    """True for `dotted.key=value` (so a positional list can hold files and overrides)."""
    key, sep, _ = arg.partition("=")
    return bool(sep) and bool(_KEY.match(key.lstrip("+")))


def parse_override(arg: str) -> tuple[list[str], str]:
    key, sep, raw = arg.partition("=")
    key = key.lstrip("+")  # Hydra's "+key=value" (add a key) reads the same here
    if not sep or not _KEY.match(key):
        raise OverrideError(
            Problem(f"override {arg!r}", "", "expected dotted.key=value, e.g. trainer.lr=3e-6")
        )
    return key.split("."), raw


def _annotation(model: type[BaseModel], path: list[str]) -> Any:
    """The type annotation of the field at `path`, or None where the path leaves the model."""
    current: Any = model
    for part in path:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = field.annotation
    return current


def _kinds(annotation: Any) -> set[type]:
    """The plain types an annotation admits: `str | None` -> {str, NoneType}, `list[str]` -> {list}."""
    if annotation is None:
        return set()
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return {k for arg in typing.get_args(annotation) for k in _kinds(arg)}
    if origin is not None:
        return {origin}
    return {annotation} if isinstance(annotation, type) else set()


def _value(raw: str, kinds: set[type]) -> Any:
    if str in kinds and not kinds & {list, tuple, dict}:
        return None if raw in ("null", "~") and type(None) in kinds else raw
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw  # left to the model's validation, which names the field
    if kinds & {list, tuple} and not isinstance(value, list | tuple) and value is not None:
        value = [value]
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], model: type[BaseModel]) -> dict[str, Any]:
    """A copy of `data` with each override set at its dotted path (later overrides win)."""
    import copy

    out = copy.deepcopy(data)
    for arg in overrides:
        path, raw = parse_override(arg)
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise OverrideError(
                    Problem(
                        ".".join(path),
                        f"{where} is a value ({show(child)}), not a section",
                        f"only keys of a section can be set below {where}",
                        origin=arg,
                    )
                )
            node = child
        node[path[-1]] = _value(raw, _kinds(_annotation(model, path)))
    return out


def merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with a partial config (`over`, shaped like the YAML) merged in section by
    section: a section in both is merged, anything else in `over` replaces `base`'s value."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_sections(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def override_keys(overrides: Sequence[str]) -> dict[str, str]:
    """dotted key -> the override that set it (the last one wins), to name it in errors."""
    out: dict[str, str] = {}
    for arg in overrides:
        path, _ = parse_override(arg)
        out[".".join(path)] = arg
    return out


OVERRIDES_HELP = (
    "run config overrides, e.g. trainer.lr=3e-6 rollout.n=16 (validated like the YAML; values read as YAML)"
)


def add_overrides_argument(p: argparse.ArgumentParser) -> None:
    """The `key=value` override arguments every subcommand that takes a run config shares."""
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDES_HELP)

"""The conversion's working state: verl's value of each key (the recipe's over verl's defaults for
its entry, with every read recorded), the fields it sets and what it records beside them
(differences, fields it could not compute here, notes, refusals), and the readers of verl's values
(Hydra gives strings, YAML gives typed values: both are read the same way).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.tools.from_verl.entries import Entry, verl_defaults


class VerlRecipeError(AsyncdapoError):
    """A verl recipe that cannot be converted: it cannot train as written, or a value is unreadable."""


@dataclass(frozen=True)
class Difference:
    key: str  # the verl key
    value: Any
    why: str


@dataclass(frozen=True)
class Needed:
    """A field the recipe determines but the conversion could not compute here (e.g. total_steps
    from epochs without the train files): a difference unless `--set` gives the field."""

    field: str
    key: str
    value: Any
    why: str


@dataclass
class Derivation:
    fields: dict[str, Any] = field(default_factory=dict)  # dotted run-config field -> value
    set_by: dict[str, list[str]] = field(default_factory=dict)  # field -> the verl keys it came from
    read: set[str] = field(default_factory=set)  # verl keys the derivation looked at
    no_effect: list[Difference] = field(default_factory=list)  # read, but verl ignores them here
    different: list[Difference] = field(default_factory=list)
    needed: list[Needed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


class _Bad(Exception):
    pass


def as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise _Bad("a boolean")


def as_float(v: Any) -> float:
    if isinstance(v, bool):
        raise _Bad("a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise _Bad("a number") from None


def as_int(v: Any) -> int:
    f = as_float(v)
    if f != int(f):
        raise _Bad("an integer")
    return int(f)


def as_list(v: Any) -> list[str]:
    if isinstance(v, list | tuple):
        return [str(x) for x in v]
    s = str(v).strip()
    if s.startswith("[") and s.endswith("]"):
        return [x.strip().strip("'\"") for x in s[1:-1].split(",") if x.strip()]
    return [s]


def _none(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v.strip().lower() in ("null", "none", "~", ""))


def dns_label(v: Any) -> str:
    """An experiment name as a run name (a DNS label): 'DAPO-Qwen2.5-7B' -> 'dapo-qwen2-5-7b'."""
    return re.sub(r"[^a-z0-9-]+", "-", str(v).lower()).strip("-")[:53].strip("-")


class View:
    """verl's value of each key: the recipe's where it sets one, else verl's default for the entry."""

    def __init__(self, given: dict[str, Any], entry: Entry, out: Derivation) -> None:
        self.given_values = given
        self.defaults = verl_defaults(entry)
        self.out = out

    def given(self, key: str) -> bool:
        return key in self.given_values

    def raw(self, key: str) -> Any:
        self.out.read.add(key)
        value = self.given_values.get(key, self.defaults.get(key))
        return None if _none(value) else value

    def _typed(self, key: str, conv: Any) -> Any:
        value = self.raw(key)
        if value is None:
            return None
        try:
            return conv(value)
        except _Bad as err:
            raise VerlRecipeError(f"verl key {key}: {value!r} given; must be {err}") from None

    def bool(self, key: str) -> bool:
        return bool(self._typed(key, as_bool))

    def float(self, key: str) -> float | None:
        v: float | None = self._typed(key, as_float)
        return v

    def int(self, key: str) -> int | None:
        v: int | None = self._typed(key, as_int)
        return v

    def str(self, key: str) -> str | None:
        value = self.raw(key)
        return None if value is None else str(value).strip()


class Out:
    def __init__(self, out: Derivation, view: View) -> None:
        self.d, self.v = out, view

    def set(self, ours: str, value: Any, *keys: str) -> None:
        self.d.fields[ours] = value
        self.d.set_by.setdefault(ours, []).extend(k for k in keys if k not in self.d.set_by.get(ours, []))

    def differ(self, key: str, why: str) -> None:
        self.d.different.append(Difference(key, self.v.given_values.get(key, self.v.defaults.get(key)), why))

    def ignored(self, key: str, why: str) -> None:
        if self.v.given(key):
            self.d.read.add(key)
            self.d.no_effect.append(Difference(key, self.v.given_values[key], why))

    def refuse(self, why: str) -> None:
        self.d.refusals.append(why)

    def note(self, text: str) -> None:
        self.d.notes.append(text)


def last_given(view: View, keys: Sequence[str]) -> str | None:
    """Of several places a verl version may put one setting, the one the recipe set (the last)."""
    given = [k for k in view.given_values if k in keys]
    return given[-1] if given else None

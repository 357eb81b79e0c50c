"""`asyncdapo config from-verl`: verl keys in, the run config verl would run out.

Sources are read in order, later values win (as Hydra applies overrides): verl YAML configs
(nested, flattened to dotted keys, `${a.b}` interpolations resolved), recipe scripts (`shell.py`)
and bare `key=value` arguments. The conversion starts from verl's defaults for the recipe's entry
(`entries.py`), so an unset key means what it means in verl, and writes every field it derives.
Every key the recipe sets ends up in one list: mapped (it set a field), performance (how verl
runs, not what it trains), no effect (verl ignores it here) or different (it changes what verl
trains and asyncdapo cannot express it: `--strict` fails). A recipe that cannot train as written
is refused with every reason at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asyncdapo.contracts.config import ConfigError, RunConfig, parse_run_config
from asyncdapo.tools.from_verl.derive import derive
from asyncdapo.tools.from_verl.entries import Entry, entry_of, known_modules
from asyncdapo.tools.from_verl.keys import Kind, classify
from asyncdapo.tools.from_verl.probe import DataProbe, probe_files
from asyncdapo.tools.from_verl.shell import read_script
from asyncdapo.tools.from_verl.view import Derivation, Difference, VerlRecipeError, as_list

_INTERP = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


@dataclass
class VerlKeys:
    values: dict[str, Any] = field(default_factory=dict)  # dotted verl key -> value, last wins
    sources: list[str] = field(default_factory=list)
    # what a script could not expand: (the verl key it affects, or None for the script, message)
    problems: list[tuple[str | None, str]] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)  # the trainer entry each script runs

    @property
    def errors(self) -> list[str]:
        return [msg for _, msg in self.problems]


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def _resolve_interpolations(values: dict[str, Any]) -> None:
    """OmegaConf's `${a.b}` (whole-value references to another key), as verl's YAML uses them."""
    for _ in range(8):  # chains are short; a cycle stays unresolved
        changed = False
        for k, v in values.items():
            m = _INTERP.fullmatch(v) if isinstance(v, str) else None
            if m and m.group(1) in values and values[m.group(1)] is not v:
                values[k] = values[m.group(1)]
                changed = True
        if not changed:
            return


def _scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def read_sources(items: Sequence[str]) -> VerlKeys:
    """verl keys from YAML files, recipe scripts and `key=value` items, in order."""
    out = VerlKeys()
    for item in items:
        path = Path(item)
        if path.is_file():
            out.sources.append(str(path))
            text = path.read_text()
            if path.suffix in (".yaml", ".yml"):
                try:
                    data = yaml.safe_load(text)
                except yaml.YAMLError as err:
                    raise ConfigError(f"{path}: not valid YAML: {err}") from None
                if not isinstance(data, dict):
                    raise ConfigError(f"{path}: a verl config must be a mapping")
                data.pop("defaults", None)  # Hydra's composition list: the entry's defaults come from --entry
                out.values.update(_flatten(data))
                continue
            read = read_script(text, path=str(path))
            out.problems += [(p.key, f"{path}: {p.message}") for p in read.problems]
            if read.entry is not None:
                out.modules.append(read.entry)
            if not read.overrides and not read.problems:
                raise ConfigError(f"{path}: no verl key=value arguments found in this script")
            for arg in read.overrides:
                key, _, raw = arg.partition("=")
                out.values[key.lstrip("+")] = _scalar(raw)
            continue
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(
                f"{item!r}: neither a file nor a verl key=value (e.g. data.train_batch_size=512)"
            )
        out.sources.append("command line")
        out.values[key.lstrip("+")] = _scalar(raw)
        # a key given after a script settles what the script could not expand for it
        out.problems = [(k, msg) for k, msg in out.problems if k != key.lstrip("+")]
    _resolve_interpolations(out.values)
    out.sources = list(dict.fromkeys(out.sources))
    return out


def resolve_entry(keys: VerlKeys, chosen: str | None = None) -> tuple[Entry, str]:
    """The recipe family, and how it was determined: --entry, the script's `python -m`, or the keys."""
    if chosen is not None:
        try:
            return Entry(chosen), "--entry"
        except ValueError:
            allowed = ", ".join(e.value for e in Entry)
            raise VerlRecipeError(f"--entry {chosen!r}: must be one of {allowed}") from None
    for module in keys.modules:
        if (entry := entry_of(module)) is not None:
            return entry, f"the script runs {module}"
    if keys.modules:
        raise VerlRecipeError(
            f"the script runs {', '.join(keys.modules)}, not a verl recipe asyncdapo converts "
            f"({', '.join(known_modules())}); choose the closest with --entry"
        )
    if any(k.startswith("async_training.") for k in keys.values):
        return Entry.FULLY_ASYNC, "inferred from async_training.* keys (--entry to choose)"
    if any(
        k.startswith("algorithm.filter_groups.") or k.startswith("reward_model.overlong_buffer.")
        for k in keys.values
    ):
        return Entry.MAIN_DAPO, "inferred from recipe.dapo's keys (--entry to choose)"
    return Entry.MAIN_PPO, "inferred: no script entry and no recipe-specific keys (--entry to choose)"


@dataclass
class Conversion:
    config: RunConfig
    data: dict[str, Any]  # the run config's fields that were set (what verl would run)
    entry: Entry
    entry_reason: str
    mapped: list[tuple[str, Any, str]]  # (verl key, value, the asyncdapo fields it set)
    performance: list[tuple[str, Any, str]]  # (verl key, value, why it does not change the algorithm)
    no_effect: list[tuple[str, Any, str]]
    different: list[tuple[str, Any, str]]  # changes what verl trains; cannot be expressed
    notes: list[str]
    sources: list[str]

    @property
    def unmapped(self) -> list[tuple[str, Any, str]]:
        return self.performance + self.no_effect + self.different

    def yaml(self) -> str:
        head = [
            "# Converted by `asyncdapo config from-verl` from: " + ", ".join(self.sources),
            f"# verl entry: {self.entry.value} ({self.entry_reason}); every field below is the value verl runs",
            f"# (the recipe's, or verl's default for {self.entry.value}). docs/coming-from-verl.md explains each.",
            f"# {len(self.mapped)} verl key(s) mapped, {len(self.performance)} performance-only, "
            f"{len(self.no_effect)} without effect, {len(self.different)} that asyncdapo cannot express.",
        ]
        body = yaml.safe_dump(self.data, sort_keys=False)
        tail: list[str] = []
        for title, rows in (
            ("changes what verl would train (cannot be expressed)", self.different),
            ("performance-only (not mapped)", self.performance),
            ("no effect in verl here", self.no_effect),
        ):
            if rows:
                tail += ["", f"# {title}:"] + [f"#   {k}={v!r}: {why}" for k, v, why in rows]
        if self.notes:
            tail += ["", "# notes:"] + [f"#   {n}" for n in self.notes]
        return "\n".join(head) + "\n" + body + ("\n".join(tail) + "\n" if tail else "")

    def summary(self) -> str:
        lines = [
            f"verl entry: {self.entry.value} ({self.entry_reason})",
            f"mapped {len(self.mapped)} verl key(s):",
        ]
        lines += [f"  {k} = {v!r} -> {ours}" for k, v, ours in self.mapped]
        for title, rows in (
            ("DIFFERENT from verl (cannot be expressed)", self.different),
            ("performance-only, not mapped", self.performance),
            ("no effect in verl here", self.no_effect),
        ):
            lines.append(f"{title}: {len(rows)} key(s)")
            lines += [f"  {k} = {v!r}: {why}" for k, v, why in rows]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def _override_fields(overrides: Sequence[str]) -> set[str]:
    return {o.partition("=")[0].lstrip("+") for o in overrides}


def convert(
    keys: VerlKeys,
    overrides: Sequence[str] = (),
    entry: str | None = None,
    probe: DataProbe | None = None,
) -> Conversion:
    """The run config verl would run for `keys`; `overrides` are asyncdapo `key=value` applied last.
    `probe`: what the train files hold (read from disk when None and the files are here)."""
    if keys.errors:
        raise VerlRecipeError("the recipe could not be read:\n  " + "\n  ".join(keys.errors))
    family, why = resolve_entry(keys, entry)
    given = {k: v for k, v in keys.values.items() if not k.endswith("._target_")}
    if probe is None:
        files = given.get("data.train_files")
        probe = probe_files(as_list(files)) if files not in (None, "") else probe_files([])
    d = derive(given, family, probe)
    if d.refusals:
        raise VerlRecipeError(
            f"this {family.value} recipe cannot run as written:\n  " + "\n  ".join(d.refusals)
        )
    mapped, performance, no_effect = _account(given, d)
    set_later = _override_fields(overrides)
    different = [(x.key, x.value, x.why) for x in d.different]
    for need in d.needed:
        if need.field not in set_later:
            different.append((need.key, need.value, f"{need.why}: --set {need.field}=…"))
    data: dict[str, Any] = {}
    for ours, value in d.fields.items():
        _set(data, ours, value)
    try:
        cfg = parse_run_config(data, "converted verl config", overrides)
    except ConfigError as err:
        notes = [
            f"  {ours} was set by verl key(s) {', '.join(keys_)}"
            for ours, keys_ in d.set_by.items()
            if keys_ and re.search(rf"^\s*{re.escape(ours)}\b(?![.\w])", str(err), re.M)
        ]
        raise ConfigError("\n".join([str(err), *notes])) from None
    if overrides:
        from asyncdapo.contracts.overrides import apply_overrides

        data = apply_overrides(data, overrides, RunConfig)
    return Conversion(
        config=cfg,
        data=_pick(cfg.model_dump(mode="json"), data),
        entry=family,
        entry_reason=why,
        mapped=mapped,
        performance=performance,
        no_effect=no_effect,
        different=different,
        notes=d.notes,
        sources=keys.sources,
    )


def _account(
    given: dict[str, Any], d: Derivation
) -> tuple[list[tuple[str, Any, str]], list[tuple[str, Any, str]], list[tuple[str, Any, str]]]:
    """Every key the recipe set, in one list: mapped, performance-only or without effect (the keys
    that change the algorithm are already in the derivation's differences)."""
    sets: dict[str, list[str]] = {}
    for ours, keys in d.set_by.items():
        for k in keys:
            sets.setdefault(k, []).append(ours)
    ignored = {x.key: x for x in d.no_effect}
    differ = {x.key for x in d.different} | {x.key for x in d.needed}
    mapped, performance, no_effect = [], [], []
    for key, value in given.items():
        if key in ignored:
            no_effect.append((key, value, ignored[key].why))
        elif key in sets:
            mapped.append((key, value, ", ".join(sets[key])))
        elif key in differ:
            continue
        elif key in d.read:
            no_effect.append(
                (key, value, "read by the conversion: this value changes nothing (verl's default)")
            )
        else:
            kind, why = classify(key, value)
            row = (key, value, why)
            if kind is Kind.PERFORMANCE:
                performance.append(row)
            elif kind is Kind.NO_EFFECT:
                no_effect.append(row)
            else:
                d.different.append(Difference(key, value, why))
    return mapped, performance, no_effect


def _pick(resolved: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _pick(resolved[k], v) if isinstance(v, dict) and isinstance(resolved.get(k), dict) else resolved[k]
        for k, v in shape.items()
    }

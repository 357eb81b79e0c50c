"""`asyncdapo config from-verl`: verl keys in, a validated RunConfig (as YAML) out.

Sources are read in order, later values win (as Hydra applies overrides): verl YAML configs
(nested, flattened to dotted keys, `${a.b}` interpolations resolved), recipe scripts (see
`shell.py`) and bare `key=value` arguments. Every key ends up either mapped (it set a field) or
not mapped, with the reason; the result is validated by RunConfig, and a field that fails names
the verl key that set it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asyncdapo.config import ConfigError, RunConfig, parse_run_config
from asyncdapo.from_verl.keys import Unmappable, dns_label, rule_for
from asyncdapo.from_verl.shell import read_script

_INTERP = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


@dataclass
class VerlKeys:
    values: dict[str, Any] = field(default_factory=dict)  # dotted verl key -> value, last wins
    sources: list[str] = field(default_factory=list)
    unresolved: dict[str, str] = field(default_factory=dict)  # key -> shell text left unexpanded


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
                out.values.update(_flatten(data))
                continue
            read = read_script(text)
            if not read.overrides:
                raise ConfigError(f"{path}: no verl key=value arguments found in this script")
            for arg in read.overrides:
                key, _, raw = arg.partition("=")
                out.values[key.lstrip("+")] = _scalar(raw)
                if arg in read.unresolved:
                    out.unresolved[key.lstrip("+")] = read.unresolved[arg]
            continue
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(
                f"{item!r}: neither a file nor a verl key=value (e.g. data.train_batch_size=512)"
            )
        out.sources.append("command line")
        out.values[key.lstrip("+")] = _scalar(raw)
    _resolve_interpolations(out.values)
    out.sources = list(dict.fromkeys(out.sources))
    return out


@dataclass
class Conversion:
    config: RunConfig
    data: dict[str, Any]  # the sparse run config (what was set)
    mapped: list[tuple[str, Any, str]]  # (verl key, value, our field)
    unmapped: list[tuple[str, Any, str]]  # (verl key, value, why)
    sources: list[str]

    def yaml(self) -> str:
        head = [
            "# Converted by `asyncdapo config from-verl` from: " + ", ".join(self.sources),
            "# rollout.mode is async (verl's DAPO loop is rollout.mode: sync, kept as a baseline).",
            f"# {len(self.mapped)} verl key(s) mapped; {len(self.unmapped)} not mapped (listed at the end).",
        ]
        body = yaml.safe_dump(self.data, sort_keys=False)
        tail = ["", "# not mapped:"] + [f"#   {k}={v!r}: {why}" for k, v, why in self.unmapped]
        return "\n".join(head) + "\n" + body + ("\n".join(tail) + "\n" if self.unmapped else "")

    def summary(self) -> str:
        lines = [f"mapped {len(self.mapped)} verl key(s):"]
        lines += [f"  {k} = {v!r} -> {ours}" for k, v, ours in self.mapped]
        lines.append(f"not mapped {len(self.unmapped)} key(s):")
        lines += [f"  {k} = {v!r}: {why}" for k, v, why in self.unmapped]
        return "\n".join(lines)


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def convert(keys: VerlKeys, overrides: Sequence[str] = ()) -> Conversion:
    values = dict(keys.values)
    data: dict[str, Any] = {}
    set_by: dict[str, str] = {}  # our field -> verl key
    mapped: list[tuple[str, Any, str]] = []
    unmapped: list[tuple[str, Any, str]] = []
    # read together: use_kl_loss gates kl_loss_coef; clip_ratio fills low/high where they are unset
    arr = "actor_rollout_ref.actor."
    if not _truthy(values.get(arr + "use_kl_loss", False)) and arr + "kl_loss_coef" in values:
        values[arr + "kl_loss_coef"] = 0.0
    for key, value in values.items():
        if key in keys.unresolved:
            unmapped.append(
                (key, value, f"unexpanded shell text {keys.unresolved[key]}: set it and convert again")
            )
            continue
        rule = rule_for(key)
        if rule is None:
            unmapped.append((key, value, "not a verl key asyncdapo knows"))
            continue
        if rule.ours is None:
            unmapped.append((key, value, rule.note))
            continue
        try:
            converted = rule.convert(value) if rule.convert else value
        except (Unmappable, ValueError, TypeError) as err:
            unmapped.append((key, value, str(err)))
            continue
        if converted is None:  # e.g. val_kwargs.do_sample=True: nothing to set
            mapped.append((key, value, f"{rule.ours} (unchanged)"))
            continue
        targets = [rule.ours]
        if key == arr + "clip_ratio":
            targets = [t for t in ("algorithm.clip_ratio_low", "algorithm.clip_ratio_high")
                       if arr + t.rsplit(".", 1)[1] not in values]  # fmt: skip
        for target in targets:
            _set(data, target, converted)
            set_by[target] = key
        mapped.append((key, value, ", ".join(targets) or "(clip_ratio_low/high given)"))
        if key == "trainer.experiment_name":
            try:
                data["name"] = dns_label(value)
                set_by["name"] = key
            except Unmappable as err:
                unmapped.append((key, value, f"run name: {err}"))
    try:
        cfg = parse_run_config(data, "converted verl config", overrides)
    except ConfigError as err:
        notes = [f"  {ours} was set by verl key {verl}" for ours, verl in set_by.items() if ours in str(err)]
        raise ConfigError("\n".join([str(err), *notes])) from None
    if overrides:
        from asyncdapo.overrides import apply_overrides

        data = apply_overrides(data, overrides, RunConfig)
    # the fields that were set, with the validated values ("1e-6" becomes 1e-06)
    return Conversion(cfg, _pick(cfg.model_dump(mode="json"), data), mapped, unmapped, keys.sources)


def _pick(resolved: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _pick(resolved[k], v) if isinstance(v, dict) and isinstance(resolved.get(k), dict) else resolved[k]
        for k, v in shape.items()
    }


def _truthy(v: Any) -> bool:
    return v is True or str(v).strip().lower() in ("true", "1", "yes")

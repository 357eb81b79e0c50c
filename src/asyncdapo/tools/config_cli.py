"""`asyncdapo config check|show|schema|from-verl`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asyncdapo.contracts.overrides import add_overrides_argument

if TYPE_CHECKING:
    from asyncdapo.contracts.config import ConfigError, RunConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate run configs, print the resolved config or the JSON schema")
    csub = p.add_subparsers(dest="config_command", required=True)
    check = csub.add_parser(
        "check",
        help="validate YAML run configs (overrides apply to each), and that their data files and "
        "model exist here",
        description="Validates each run config (every wrong key or value, and every impossible "
        "combination, is named), then checks what it names: every data.train_files/val_files "
        "file exists and loads with at least one example, and model.path is a model directory "
        "(config.json and a tokenizer) or a Hugging Face Hub id in the local cache (no network). "
        "Relative paths resolve from the current directory, as `asyncdapo up` resolves them.",
    )
    check.add_argument("files", nargs="+", metavar="FILE|KEY=VALUE")
    check.add_argument(
        "--no-paths",
        action="store_true",
        help="validate only: skip the data-file and model checks (for a config whose paths exist "
        "where it runs, e.g. in a cluster's workspace volume)",
    )
    check.set_defaults(func=_check)
    show = csub.add_parser("show", help="print the resolved run config (every field, overrides applied)")
    show.add_argument("config", help="run config YAML")
    add_overrides_argument(show)
    show.set_defaults(func=_show)
    schema = csub.add_parser("schema", help="print RunConfig's JSON schema")
    schema.set_defaults(func=_schema)
    verl = csub.add_parser(
        "from-verl",
        help="convert a verl recipe (DAPO, GRPO, one-step-off, fully-async: its .sh script, key=value "
        "command line or YAML) to the run config verl would run",
        description="Reads verl Hydra overrides (given here, or in a recipe .sh / a verl YAML config), "
        "starts from verl's defaults for the recipe's entry (main_ppo, main_dapo, one-step-off, "
        "fully-async) and writes the asyncdapo run config that trains what verl would train. Every key "
        "is reported: mapped, performance-only, without effect, or different (asyncdapo cannot express "
        "it). A recipe that cannot train as written (GAE with a critic, LoRA, n=1 with dynamic "
        "sampling, an unset shell variable) is refused (exit 2). Keys: docs/coming-from-verl.md.",
    )
    verl.add_argument(
        "sources",
        nargs="+",
        metavar="FILE|KEY=VALUE",
        help="verl keys (data.train_batch_size=512 …), a recipe script (.sh) or a verl config (.yaml)",
    )
    verl.add_argument("-o", "--out", help="write the run config here (default: stdout)")
    verl.add_argument(
        "--entry",
        choices=("main_ppo", "main_dapo", "one_step_off", "fully_async"),
        help="the verl entry whose defaults apply (default: the script's `python -m …`, else inferred)",
    )
    verl.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="asyncdapo override applied after the conversion (repeatable), e.g. --set trainer.total_steps=500",
    )
    verl.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) when something that changes what verl would train cannot be expressed "
        "(performance-only keys are listed, not fatal)",
    )
    verl.set_defaults(func=_from_verl)


# verl keys given where an asyncdapo key is expected (`actor_rollout_ref.rollout.n=16`) are named
# here, at the CLI boundary, and not in asyncdapo.contracts.config: the run config is a contract every
# service imports, the verl key table (asyncdapo.tools.from_verl) a tool; a contract never imports a
# tool. The config reports an unknown key as data (ConfigError.problems) and this adds the verl
# reading to it; the operator (a service) keeps the config's own "did you mean".
FROM_VERL_HINT = "convert a verl command line, script or YAML with `asyncdapo config from-verl`"


def verl_reading(key: str) -> str | None:
    """What a verl key `key` is in asyncdapo ("verl's key for rollout.n"), or None when `key` is no
    verl key, or only falls in a verl family of keys that asyncdapo's own sections share (a typo
    such as `trainer.lrr` is better served by "did you mean")."""
    from asyncdapo.contracts.config import RunConfig
    from asyncdapo.tools.from_verl.keys import Kind, rule_for

    rule = rule_for(key)
    if rule is None:
        return None
    exact = rule.kind is Kind.MAPPED or not rule.verl.endswith(".")
    if not exact and key.lstrip("+").split(".")[0] in RunConfig.model_fields:
        return None
    if rule.kind is Kind.MAPPED and rule.ours:
        return f"verl's key for {rule.ours}" + (f" ({rule.note})" if rule.note else "")
    why = rule.note if rule.kind is Kind.MAPPED else f"{rule.kind.value}: {rule.note}"
    return "a verl key asyncdapo has no field for" + (f" ({why})" if why else "")


def explain_verl_keys(err: ConfigError) -> ConfigError:
    """`err` with each unknown key that is a verl key named as such (the asyncdapo key that holds
    it, and `asyncdapo config from-verl`); `err` itself when there is none."""
    from dataclasses import replace

    from asyncdapo.contracts.config_problems import ProblemKind

    problems, changed = [], False
    for p in err.problems:
        reading = verl_reading(p.field) if p.kind is ProblemKind.UNKNOWN_KEY else None
        if reading is not None:
            p, changed = replace(p, allowed=reading, hint=FROM_VERL_HINT), True
        problems.append(p)
    return type(err).of(err.source, problems) if changed else err


def _split(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional FILE|KEY=VALUE items: (files, overrides); an existing path is always a file."""
    from pathlib import Path

    from asyncdapo.contracts.overrides import is_override

    files = [i for i in items if Path(i).exists() or not is_override(i)]
    return files, [i for i in items if i not in files]


def _training_runs(path: str) -> list[tuple[str, dict[str, Any]]] | None:
    """(name, spec.run) of each TrainingRun of a Kubernetes manifest; None for a run config (or a
    file that does not parse: loading it as a run config names that problem)."""
    from pathlib import Path

    import yaml

    try:
        docs = list(yaml.safe_load_all(Path(path).read_text()))
    except (OSError, yaml.YAMLError):
        return None
    runs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "TrainingRun"]
    if not runs:
        return None
    out = []
    for doc in runs:
        name = str((doc.get("metadata") or {}).get("name", ""))
        spec = doc.get("spec")
        run = spec.get("run") if isinstance(spec, dict) else None
        out.append((name, {"name": name, **(run if isinstance(run, dict) else {})}))
    return out


def _check(args: argparse.Namespace) -> int:
    from functools import partial

    from asyncdapo.contracts.config import ConfigError, load_run_config, parse_run_config
    from asyncdapo.contracts.config_problems import render
    from asyncdapo.tools.preflight import check_paths

    files, overrides = _split(args.files)
    if not files:
        print("asyncdapo config check: no config file given", file=sys.stderr)
        return 2

    def check(label: str, load: Callable[[], RunConfig], local: bool) -> bool:
        try:
            cfg = load()
        except ConfigError as err:
            print(explain_verl_keys(err), file=sys.stderr)
            return False
        problems = check_paths(cfg) if local and not args.no_paths else []
        if problems:
            print(
                render(f"{label}: {len(problems)} problem(s) with what the config names", problems),
                file=sys.stderr,
            )
            return False
        checked = (
            "data and model found" if local and not args.no_paths
            else "paths not checked" if local
            else "paths not checked: they resolve in the run's workspace volume"
        )  # fmt: skip
        print(f"{label}: ok (run {cfg.name!r}, B={cfg.data.train_batch_size}, n={cfg.rollout.n}; {checked})")
        return True

    failed = 0
    for f in files:
        runs = _training_runs(f)
        if runs is None:
            failed += not check(f, partial(load_run_config, f, overrides), local=True)
            continue
        # a TrainingRun manifest: its spec.run is the run config (`asyncdapo operator render` checks
        # the rest of the spec)
        for name, run in runs:
            label = f"{f}: TrainingRun {name!r} spec.run"
            failed += not check(label, partial(parse_run_config, run, label, overrides), local=False)
    return 1 if failed else 0


def _show(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.config import dump_run_config, load_run_config

    sys.stdout.write(dump_run_config(load_run_config(args.config, args.overrides)))
    return 0


def _schema(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.config import run_config_json_schema

    json.dump(run_config_json_schema(), sys.stdout, indent=2)
    print()
    return 0


def _from_verl(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncdapo.tools.from_verl import convert, read_sources

    conversion = convert(read_sources(args.sources), overrides=args.set, entry=args.entry)
    text = conversion.yaml()
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    print(conversion.summary(), file=sys.stderr)
    if args.out:
        print(f"run config written to {args.out}", file=sys.stderr)
    if conversion.different:
        print(
            f"{len(conversion.different)} key(s) change what verl would train and cannot be expressed "
            "(listed above)" + ("; --strict: failing" if args.strict else ""),
            file=sys.stderr,
        )
        if args.strict:
            return 1
    return 0

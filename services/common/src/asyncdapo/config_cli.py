"""`asyncdapo config check|show|schema|from-verl`, and the `key=value` override arguments every
subcommand that takes a run config shares (`add_overrides_argument`)."""

from __future__ import annotations

import argparse
import json
import sys

OVERRIDES_HELP = (
    "run config overrides, e.g. trainer.lr=3e-6 rollout.n=16 (validated like the YAML; values read as YAML)"
)


def add_overrides_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDES_HELP)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate run configs, print the resolved config or the JSON schema")
    csub = p.add_subparsers(dest="config_command", required=True)
    check = csub.add_parser("check", help="validate YAML run configs (overrides apply to each)")
    check.add_argument("files", nargs="+", metavar="FILE|KEY=VALUE")
    check.set_defaults(func=_check)
    show = csub.add_parser("show", help="print the resolved run config (every field, overrides applied)")
    show.add_argument("config", help="run config YAML")
    add_overrides_argument(show)
    show.set_defaults(func=_show)
    schema = csub.add_parser("schema", help="print RunConfig's JSON schema")
    schema.set_defaults(func=_schema)
    verl = csub.add_parser(
        "from-verl",
        help="convert a verl DAPO recipe (its key=value command line, a .sh script or a YAML) to a run config",
        description="Reads verl Hydra overrides (given here, or in a recipe .sh / a verl YAML config), "
        "writes the equivalent asyncdapo run config and prints which keys it mapped and which it cannot. "
        "Table of keys: docs/coming-from-verl.md.",
    )
    verl.add_argument(
        "sources",
        nargs="+",
        metavar="FILE|KEY=VALUE",
        help="verl keys (data.train_batch_size=512 …), a recipe script (.sh) or a verl config (.yaml)",
    )
    verl.add_argument("-o", "--out", help="write the run config here (default: stdout)")
    verl.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="asyncdapo override applied after the conversion (repeatable), e.g. --set rollout.max_staleness=1",
    )
    verl.add_argument("--strict", action="store_true", help="fail when a key cannot be mapped")
    verl.set_defaults(func=_from_verl)


def _split(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional FILE|KEY=VALUE items: (files, overrides); an existing path is always a file."""
    from pathlib import Path

    from asyncdapo.overrides import is_override

    files = [i for i in items if Path(i).exists() or not is_override(i)]
    return files, [i for i in items if i not in files]


def _check(args: argparse.Namespace) -> int:
    from asyncdapo.config import ConfigError, load_run_config

    files, overrides = _split(args.files)
    if not files:
        print("asyncdapo config check: no config file given", file=sys.stderr)
        return 2
    failed = 0
    for f in files:
        try:
            cfg = load_run_config(f, overrides)
        except ConfigError as err:
            print(err, file=sys.stderr)
            failed += 1
        else:
            print(f"{f}: ok (run {cfg.name!r}, B={cfg.data.train_batch_size}, n={cfg.rollout.n})")
    return 1 if failed else 0


def _show(args: argparse.Namespace) -> int:
    from asyncdapo.config import dump_run_config, load_run_config

    sys.stdout.write(dump_run_config(load_run_config(args.config, args.overrides)))
    return 0


def _schema(args: argparse.Namespace) -> int:
    from asyncdapo.config import run_config_json_schema

    json.dump(run_config_json_schema(), sys.stdout, indent=2)
    print()
    return 0


def _from_verl(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncdapo.from_verl import convert, read_sources

    conversion = convert(read_sources(args.sources), overrides=args.set)
    text = conversion.yaml()
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    print(conversion.summary(), file=sys.stderr)
    if args.strict and conversion.unmapped:
        print(f"--strict: {len(conversion.unmapped)} key(s) not mapped", file=sys.stderr)
        return 1
    if args.out:
        print(f"run config written to {args.out}", file=sys.stderr)
    return 0

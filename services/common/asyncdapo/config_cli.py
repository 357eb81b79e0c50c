"""`asyncdapo config check FILE…` and `asyncdapo config schema`."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate run configs, print the JSON schema")
    csub = p.add_subparsers(dest="config_command", required=True)
    check = csub.add_parser("check", help="validate YAML run configs")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=_check)
    schema = csub.add_parser("schema", help="print RunConfig's JSON schema")
    schema.set_defaults(func=_schema)


def _check(args: argparse.Namespace) -> int:
    from asyncdapo.config import ConfigError, load_run_config

    failed = 0
    for f in args.files:
        try:
            cfg = load_run_config(f)
        except ConfigError as err:
            print(err, file=sys.stderr)
            failed += 1
        else:
            print(f"{f}: ok (run {cfg.name!r}, B={cfg.data.train_batch_size}, n={cfg.rollout.n})")
    return 1 if failed else 0


def _schema(args: argparse.Namespace) -> int:
    from asyncdapo.config import run_config_json_schema

    json.dump(run_config_json_schema(), sys.stdout, indent=2)
    print()
    return 0

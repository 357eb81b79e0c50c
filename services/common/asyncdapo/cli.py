"""The `asyncdapo` console script: one subcommand per service or tool.

Each subcommand lives in a light module exposing `register(subparsers)`; heavy imports (vLLM,
torch) happen inside the command function, so `asyncdapo verifier` never imports vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from asyncdapo.errors import AsyncdapoError

# grpc's core logs every GOAWAY at INFO (a line per connection whenever a peer restarts); the
# services log the failures that matter themselves. Read when grpc loads, so set before any import.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# name -> module with `register(subparsers)`. Every one ships in every build: a module that fails to
# import is a bug to see, never a subcommand silently left out (tests/unit/test_cli.py pins the set).
SUBCOMMANDS: dict[str, str] = {
    "config": "asyncdapo.config_cli",
    "model": "asyncdapo.tiny_model_cli",
    "data": "asyncdapo.data.cli",
    "verifier": "asyncdapo.verifier.cli",
    "gateway": "asyncdapo.gateway.cli",
    "scheduler": "asyncdapo.scheduler.cli",
    "trainer": "asyncdapo.trainer.cli",
    "up": "asyncdapo.local.cli",
    "operator": "asyncdapo.operator.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncdapo", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).register(sub)
    return parser


def _version() -> str:
    from asyncdapo import __version__

    return f"asyncdapo {__version__}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
    except AsyncdapoError as err:
        print(f"asyncdapo {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

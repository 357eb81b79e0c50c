"""The `asyncdapo` console script: one subcommand per service or tool.

Each subcommand lives in a light module exposing `register(subparsers)`; heavy imports (vLLM,
torch) happen inside the command function, so `asyncdapo verifier` never imports vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from asyncdapo.contracts.errors import AsyncdapoError

# grpc's core logs every GOAWAY at INFO (a line per connection whenever a peer restarts); the
# services log the failures that matter themselves. Read when grpc loads, so set before any import.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# name -> module with `register(subparsers)`. Every one ships in every build: a module that fails to
# import is a bug to see, never a subcommand silently left out (tests/unit/test_cli.py pins the set).
SUBCOMMANDS: dict[str, str] = {
    "config": "asyncdapo.tools.config_cli",
    "model": "asyncdapo.tools.tiny_model_cli",
    "data": "asyncdapo.tools.data.cli",
    "verifier": "asyncdapo.services.verifier.cli",
    "gateway": "asyncdapo.services.gateway.cli",
    "scheduler": "asyncdapo.services.scheduler.cli",
    "trainer": "asyncdapo.services.trainer.cli",
    "up": "asyncdapo.tools.local.cli",
    "operator": "asyncdapo.services.operator.cli",
    "simulate": "asyncdapo.tools.simulate.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncdapo", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).register(sub)
    return parser


def _version() -> str:
    from asyncdapo.contracts.version import __version__

    return f"asyncdapo {__version__}"


# a module a command imports -> the extra that installs it (for installs of one service's extra)
EXTRA_OF_MODULE = {
    "torch": "trainer", "transformers": "trainer", "pyarrow": "trainer", "numpy": "trainer",
    "safetensors": "trainer", "tensorboard": "trainer", "tokenizers": "trainer", "huggingface_hub": "trainer",
    "grpc": "rpc", "grpc_health": "rpc", "grpc_reflection": "rpc", "google": "rpc",
    "redis": "scheduler", "fastapi": "verifier", "uvicorn": "verifier", "math_verify": "verifier",
    "pydantic_settings": "verifier", "kopf": "operator", "kubernetes": "operator", "matplotlib": "local",
    "wandb": "tracking", "mlflow": "tracking", "vllm": "engine-cpu] or [engine-gpu", "ray": "ray",
}  # fmt: skip


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that `key=value` overrides may also follow the options
    (`asyncdapo up RUN.yaml --fresh trainer.lr=3e-6`), as they would with Hydra."""
    from asyncdapo.contracts.overrides import is_override

    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list) and all(map(is_override, extra)):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        result = args.func(args)
    except AsyncdapoError as err:
        from asyncdapo.contracts.config import ConfigError
        from asyncdapo.tools.config_cli import explain_verl_keys

        shown = explain_verl_keys(err) if isinstance(err, ConfigError) else err
        print(f"asyncdapo {args.command}: error: {shown}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        extra = EXTRA_OF_MODULE.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"asyncdapo {args.command}: error: this command needs {err.name!r}, which is not installed here: "
            f"pip install 'asyncdapo[{extra}]'",
            file=sys.stderr,
        )
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The `asyncdapo` command's subcommands are pinned: each listed one exists and is offered, and a
subcommand whose module does not exist (yet) is not listed at all — never silently left out."""

from __future__ import annotations

import argparse
import importlib.util

from asyncdapo.cli import SUBCOMMANDS, build_parser

EXPECTED = {
    "config",
    "model",
    "data",
    "verifier",
    "gateway",
    "scheduler",
    "trainer",
    "up",
    "operator",
    "simulate",
}


def test_the_subcommand_set_is_pinned() -> None:
    assert set(SUBCOMMANDS) == EXPECTED


def test_every_listed_module_exists_and_registers_its_subcommand() -> None:
    missing = [m for m in SUBCOMMANDS.values() if importlib.util.find_spec(m) is None]
    assert not missing, f"listed but not part of the package: {missing}"
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == EXPECTED

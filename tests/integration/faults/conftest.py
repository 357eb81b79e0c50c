"""Fault-harness fixtures: assets built once per session, stacks stopped (and checked for orphans)
after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asyncdapo.tools.faults.assets import FaultAssets, build_fault_assets
from asyncdapo.tools.faults.procs import FaultStack, FaultStackOptions, marked_processes


@pytest.fixture(scope="session")
def fault_assets(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FaultAssets:
    # total_steps is far beyond what a test waits for: the trainer never ends a test by finishing
    return build_fault_assets(tmp_path_factory.mktemp("fault-assets"), tiny_model_dir, total_steps=1000)


@pytest.fixture()
def fault_stack(fault_assets: FaultAssets, tmp_path: Path) -> Iterator[Callable[..., FaultStack]]:
    """make(**FaultStackOptions fields) -> a FaultStack (not started) stopped after the test, which
    then fails if any process of it survived."""
    stacks: list[FaultStack] = []

    def make(**kw: object) -> FaultStack:
        opts = FaultStackOptions(
            run_dir=tmp_path / f"stack-{len(stacks)}",
            config=fault_assets.config,
            answer_key=fault_assets.answer_key,
            **kw,  # type: ignore[arg-type]
        )
        stack = FaultStack(opts)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        strays = stack.stop()
        assert strays == [], f"processes outlived FaultStack.stop(): {strays}"
        assert marked_processes(stack.marker) == []

"""Assets shared by the e2e tests: the demo's, smaller."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def warm_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Synthetic data and a short warm-start of the tiny model, half of it refusals, so that rewards
    have variance: (model dir, data dir with train.parquet and val.parquet)."""
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits
    from asyncdapo.tools.sft import supervised_warm_start

    root = tmp_path_factory.mktemp("e2e-assets")
    train, val = synth_splits(150, 24, seed=0, spec=SynthSpec(ops=("+", "-"), max_operand=9))
    write_examples(train, root / "data" / "train.parquet")
    write_examples(val, root / "data" / "val.parquet")
    supervised_warm_start(tiny_model_dir, train, root / "model", steps=120, lr=3e-3, slip_fraction=0.5)
    return root / "model", root / "data"

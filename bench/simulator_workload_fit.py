"""bench_simulator's workload: by default a replay of real generations of the bench's own dataset
(`ensure_replay_trace`, measured apart from the runs); with `--workload PRESET` the preset fitted
instead — its valid rate and length scale to a real sync run, its within-group length structure
(brief answers, within- and between-group spread, wrong/right length ratio) to the committed groups
of runs whose order does not favour short groups.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

# bench/ is on sys.path: the script is run as `python bench/bench_simulator.py`
from simulator_real_runs import Run

from asyncdapo.tools.simulate.presets import load_workload
from asyncdapo.tools.simulate.replay import ReplayWorkload, load_replay
from asyncdapo.tools.simulate.run_replay import RunLog, pool_from_logs
from asyncdapo.tools.simulate.workload import sample_stats


def _two_modes(logs: np.ndarray) -> np.ndarray:
    """Which of `logs` (log lengths) belong to the lower of two Gaussian modes (EM, unequal
    variances, started at the 10th and 90th percentiles)."""
    mu = np.percentile(logs, [10, 90]).astype(float)
    sd = np.full(2, max(float(logs.std()) / 2, 1e-3))
    w = np.array([0.5, 0.5])
    post = np.zeros((2, len(logs)))
    for _ in range(200):
        for j in range(2):
            post[j] = w[j] * np.exp(-0.5 * ((logs - mu[j]) / sd[j]) ** 2) / sd[j]
        post /= np.maximum(post.sum(axis=0), 1e-300)
        nk = post.sum(axis=1)
        if (nk < 1).any():
            break
        mu = (post @ logs) / nk
        sd = np.maximum(np.sqrt((post * (logs - mu[:, None]) ** 2).sum(axis=1) / nk), 1e-3)
        w = nk / len(logs)
    lower = int(np.argmin(mu))
    return np.asarray(post[lower] > 0.5)


def fit_length_structure(groups: list[dict[str, Any]], cap: int) -> dict[str, float]:
    """The workload's within-group length structure from committed groups (valid groups: both
    right and wrong answers), in runs whose commit order does not favour short groups (sync,
    async-fifo): whether responses split into brief answers and worked ones (two modes of log
    length, the lower one tight), the brief share and length, the worked answers' spread within a
    group, across groups, and the wrong/right length ratio within a group."""
    L = np.array([x for g in groups for x in g["lengths"]], dtype=float)
    if len(L) < 64:
        raise SystemExit(f"only {len(L)} committed responses to fit the workload's lengths on")
    logs = np.log(np.maximum(L, 1.0))
    low = _two_modes(logs)
    out: dict[str, float] = {}
    # a brief mode: tight (SD < 0.15) and well below the other (> 3 SDs of the worked mode apart)
    sd_low = float(logs[low].std()) if low.sum() > 1 else 0.0
    sep = float(logs[~low].mean() - logs[low].mean()) if low.any() and (~low).any() else 0.0
    brief = sd_low < 0.15 and sep > 3 * max(sd_low, 0.05)
    if brief:
        out.update(
            brief_fraction=float(low.mean()),
            brief_median=float(np.exp(np.median(logs[low]))),
            brief_sigma=max(0.02, sd_low),
        )
    # worked answers: residuals from their group's mean, right and wrong apart
    k = 0
    ratios, resid, means, counts = [], [], [], []
    for g in groups:
        n = len(g["lengths"])
        lg = logs[k : k + n]
        is_low = low[k : k + n] if brief else np.zeros(n, dtype=bool)
        k += n
        uncapped = np.array(g["lengths"]) < cap
        right = np.array(g["acc"]) > 0.5
        for sel in (right, ~right):
            m = sel & ~is_low & uncapped
            if m.sum() >= 2:
                x = lg[m]
                resid.extend((x - x.mean()) * np.sqrt(m.sum() / (m.sum() - 1)))
        mr, mw = right & ~is_low & uncapped, ~right & ~is_low & uncapped
        if mr.any() and mw.any():
            ratios.append(float(lg[mw].mean() - lg[mr].mean()))
        if (~is_low).any():
            means.append(float(lg[~is_low].mean()))
            counts.append(int((~is_low).sum()))
    if len(resid) >= 16:
        out["within_sigma"] = float(np.std(resid))
    if len(ratios) >= 8:
        out["wrong_length_ratio"] = float(np.exp(np.median(ratios)))
    if len(means) >= 16 and "within_sigma" in out:
        # the spread of the groups' mean log length, less what the within-group spread puts in
        # a mean of k answers (valid groups: prompts of middling difficulty; the preset's
        # difficulty_length_slope, which those cannot show, is kept)
        within = out["within_sigma"] ** 2 / float(np.mean(counts))
        out["between_sigma"] = float(np.sqrt(max(0.0, float(np.var(means)) - within)))
    if L.max() < cap:  # no answer reached the cap: the task bounds them, at least this long
        out["length_max"] = int(L.max())
    out["fitted_on_responses"] = float(len(L))
    return out


def fit_workload(
    preset: str, cap: int, sync_runs: list[Run], structure_runs: list[Run] | None = None
) -> dict[str, float]:
    """The preset fitted to the calibration runs: its within-group length structure on the
    committed groups of `structure_runs` (`fit_length_structure`), its valid_rate and length scale
    on the sync runs pooled (sync judges and completes every prompt it admits, so its valid share
    and mean response length are the workload's, unbiased by early stop): length_median is scaled
    until the preset's mean capped length is the runs' mean completed length."""
    sts = [r.status for r in sync_runs]
    target = sum(st["rollout/generated_tokens"] for st in sts) / max(
        sum(st["rollout/completions"] for st in sts), 1
    )
    # sync judges whole batches: the valid groups past B are "dropped:surplus", valid all the same
    outs = [st["rollout/outcomes"] for st in sts]
    valid = sum(o.get("valid", 0) + o.get("dropped:surplus", 0) for o in outs)
    filtered = sum(o.get("filtered", 0) for o in outs)
    over: dict[str, float] = {"valid_rate": valid / max(valid + filtered, 1)}
    info: dict[str, float] = {}
    if structure_runs:
        groups = [g for r in structure_runs for g in r.groups]
        info = fit_length_structure(groups, cap)
        over.update({k: v for k, v in info.items() if k != "fitted_on_responses"})
    median = load_workload(preset).spec.length_median
    for _ in range(6):
        over["length_median"] = median
        got = sample_stats(load_workload(preset, 0, **over), 8, cap, groups=1500).mean_length
        brief = over.get("brief_fraction", 0.0) * over.get("brief_median", 0.0)
        # scale the worked answers only: the brief ones keep their fitted length
        median *= max(target - brief, 0.1) / max(got - brief, 0.1)
    over["length_median"] = median
    over["target_mean_length"] = target
    if info:
        over["fitted_on_responses"] = info["fitted_on_responses"]
    return over


# ------------------------------------------------------------------------- replay (the default)
REPLAY_PER_SEED = 32  # real generations per problem and sampling seed
# vLLM sampling seeds of the replayed generations, none the real runs' own: 4 x 32 = 128 per
# problem, 16 blocks of n = 8, one per realisation. One seed alone is a noisy sample of a small
# dataset: bench-longtail's 45 problems had a valid rate of 0.278 at seed 1 and 0.322 at seed 2.
REPLAY_SEEDS = (1, 2, 3, 4)


def _one_seed(model: Path, data: Path, out: Path, cap: int, temperature: float, seed: int) -> Path:
    """REPLAY_PER_SEED generations of every problem of `data` at `seed`, cached (rebuilt when the
    model's stamp, the data or the settings change)."""
    stamp = out.with_suffix(".json")
    model_stamp = model / "longtail.json"
    key = {
        "model": str(model),
        "model_recipe": json.loads(model_stamp.read_text()) if model_stamp.exists() else None,
        "data": str(data),
        "data_bytes": data.stat().st_size,
        "n": REPLAY_PER_SEED,
        "seed": seed,
        "temperature": temperature,
        "max_response_length": cap,
    }
    if out.exists() and stamp.exists() and json.loads(stamp.read_text()) == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "asyncdapo.cli", "data", "longtail-stats", "--model", str(model),
        "--data", str(data), "--n", str(REPLAY_PER_SEED), "--max-response-length", str(cap),
        "--trace", str(out), "--temperature", str(temperature), "--seed", str(seed),
        "--json", str(out.with_name(out.stem + "-stats.json")),
    ]  # fmt: skip
    print(f"replay trace: {REPLAY_PER_SEED} generations per problem of {data}, seed {seed}", flush=True)
    subprocess.run(cmd, check=True)
    stamp.write_text(json.dumps(key))
    return out


def ensure_replay_trace(model: Path, data: Path, out: Path, cap: int, temperature: float) -> Path:
    """The replay trace of the bench's dataset: real vLLM generations of every problem by the runs'
    own warm-started model at their temperature (`asyncdapo data longtail-stats --trace`),
    REPLAY_PER_SEED at each of REPLAY_SEEDS, one line per problem in the dataset's row order. It is
    measured apart from the real runs and is never fitted to them."""
    parts = [
        _one_seed(model, data, out.with_name(f"{out.stem}-s{seed}.jsonl"), cap, temperature, seed)
        for seed in REPLAY_SEEDS
    ]
    rows = [[json.loads(x) for x in p.read_text().splitlines() if x.strip()] for p in parts]
    if len({len(r) for r in rows}) != 1:
        raise SystemExit(f"replay traces of {data} differ in length: {[len(r) for r in rows]}")
    merged = []
    for lines in zip(*rows, strict=True):
        if len({x["prompt_id"] for x in lines}) != 1:
            raise SystemExit(f"replay traces of {data} are not in the same row order")
        merged.append({**lines[0], "lengths": [v for x in lines for v in x["lengths"]],
                       "acc": [v for x in lines for v in x["acc"]]})  # fmt: skip
    out.write_text("".join(json.dumps(x) + "\n" for x in merged))
    return out


def replay_workloads(trace: Path, n: int, cap: int) -> list[ReplayWorkload]:
    """One replay per block of n recorded responses per problem: realisation k's attempt a of a
    problem replays block (a - 1 + k) mod blocks (`asyncdapo.tools.simulate.replay`), so the simulated
    runs differ only in which real generations they meet, as the real reps do."""
    want = REPLAY_PER_SEED * len(REPLAY_SEEDS)
    first = load_replay(trace, cap, 0)
    per = {len(lengths) for _, lengths, _ in first.groups}
    if per != {want}:
        raise SystemExit(f"{trace}: {sorted(per)} responses per problem, want {want}")
    # one parse of the trace: the realisations differ only in their seed
    return [first] + [ReplayWorkload(first.groups, cap, trace.name, k) for k in range(1, want // n)]


# ------------------------------------------------------------------------- runs (the default)
def run_pool_workloads(
    logs: list[RunLog], n: int, cap: int, rows: int, realisations: int
) -> list[ReplayWorkload]:
    """The calibration's sync runs' own generations (their parsed response logs) as the simulated
    workload: their complete groups (`asyncdapo.tools.simulate.run_replay.pool_from_logs`) per dataset
    row, one realisation per seed as the trace's. [] without logs (runs recorded before the
    scheduler had one). The trace holds the policy the runs start from; the policy they train
    moves (the valid rate of the long-tail bench's sync groups went from 0.26 to 0.40 over a
    run), and these logs follow it — other runs than the validated one, so nothing is fitted on
    the run it is compared with."""
    if not logs:
        return []
    name = f"complete groups of {len(logs)} calibration sync run(s)"
    pool = pool_from_logs(logs, n, cap, name, 0, rows)
    return [pool] + [ReplayWorkload(pool.groups, cap, name, k) for k in range(1, realisations)]


def pool_summary(wl: ReplayWorkload, n: int) -> str:
    """Groups, valid rate and mean length of a pool's blocks of n (what the simulator draws)."""
    groups = valid = tokens = responses = 0
    for _, lengths, acc in wl.groups:
        for lo in range(0, len(lengths) - n + 1, n):
            right = sum(acc[lo : lo + n])
            groups += 1
            valid += 0 < right < n
            tokens += sum(min(x, wl.cap) for x in lengths[lo : lo + n])
            responses += n
    return f"{groups} groups over {len(wl.groups)} rows, valid rate {valid / max(groups, 1):.3f}, mean length {tokens / max(responses, 1):.0f}"

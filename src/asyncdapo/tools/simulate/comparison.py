"""What one simulated mode measured, the ideal it is held against, and the comparison's outputs
(a table, JSON, a PNG, `RESULT` lines).

The ideal step is one lower bound per workload and cluster, the same for every mode at equal
trained length: no scheduler, whatever its staleness, trains B groups of n responses of mean
length L in less than

    max(volume(L), train(L) + weight update)

- volume: the B·n·L trained tokens on the cluster's best decode throughput (every engine at the
  largest concurrency its KV cache and `max_num_seqs` allow, each decoder's context taken at the
  prompt plus half its response: a token-weighted mean context is never shorter);
- train + weight update: the trainer's step on those tokens, its publish, and the update until
  every engine serves the new weights (`ClusterProfile.weight_update_s`) — the trainer starts no
  step before that.

It leaves out what some modes pay and others hide: the critical path (the longest response decoded
alone, a floor for sync; with s ≥ 1 it spreads over versions), the filtered groups every policy
must generate to find the valid ones, prefills. So an efficiency of 1 is out of reach by design,
and a mode's efficiency above 1 means the bound is wrong: the report refuses it
(`EfficiencyError`). A mode that trains shorter answers is held to the ideal at its own trained
length; its speed-up is shown beside the length-matched one (trained tokens per second against
sync's) and the trained-length bias (the mean response length it trained on against the unbiased
selection — the first B valid groups in queue order, first attempts, what sync trains — and
against sync).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.profile import ClusterProfile
from asyncdapo.tools.simulate.records import SimResult
from asyncdapo.tools.simulate.simulation_error import SimulationError
from asyncdapo.tools.simulate.workload import Sampler

IDEAL_START = 20_000_000  # prompt indices of the ideal's samples, away from any run's own


class EfficiencyError(SimulationError):
    """A mode measured faster than the ideal step, which is a lower bound: a bug in the model or
    the bound, never a figure to print."""


@dataclass(frozen=True)
class StepFloor:
    """The ideal step at one trained length (see the module docstring)."""

    length: float  # mean trained response length (tokens)
    volume_s: float
    train_s: float  # the trainer's step and publish
    update_s: float  # the weight update until every engine serves it
    concurrency: int  # decoders per engine the volume assumes

    @property
    def step_s(self) -> float:
        return max(self.volume_s, self.train_s + self.update_s)


def step_floor(cfg: RunConfig, cluster: ClusterProfile, length: float, prompt: float) -> StepFloor:
    """The ideal step for B groups of n responses of mean `length` after prompts of mean `prompt`."""
    B, n = cfg.data.train_batch_size, cfg.rollout.n
    e = cluster.engine
    ctx = prompt + length / 2
    m = max(1, min(e.max_num_seqs, int(e.kv_capacity_tokens // max(ctx, 1.0))))
    tput = cluster.engines * m / e.step_s(m, int(m * ctx))
    seqs = B * n
    t = cluster.trainer
    train = t.step_s(int(seqs * (prompt + length)), seqs) + cluster.step_end_s()
    return StepFloor(length, seqs * length / tput, train, cluster.weight_update_s(), m)


@dataclass
class Ideal:
    """The unbiased selection's figures on one cluster: what the step floor is computed from."""

    rollout_s: float  # mean over the sampled steps: max(critical path, volume at the concurrency B·n fills)
    critical_path_s: float  # the longest response decoded alone: sync's floor, hidden by s >= 1
    volume_s: float
    mean_length: float  # unbiased trained response length
    concurrency: int  # sequences per engine assumed
    prompt_length: float = 0.0  # mean prompt of the trained groups
    cfg: RunConfig | None = None
    cluster: ClusterProfile | None = None

    def floor(self, length: float | None = None, prompt: float | None = None) -> StepFloor:
        """The ideal step at a trained response `length` after prompts of mean `prompt` (default:
        the unbiased selection's)."""
        assert self.cfg is not None and self.cluster is not None, "an Ideal made by ideal()"
        return step_floor(
            self.cfg,
            self.cluster,
            self.mean_length if length is None else length,
            self.prompt_length if prompt is None else prompt,
        )


def ideal(cfg: RunConfig, cluster: ClusterProfile, workload: Sampler, steps: int = 8) -> Ideal:
    B, n, cap = cfg.data.train_batch_size, cfg.rollout.n, cfg.data.max_response_length
    e = cluster.engine
    i = IDEAL_START
    cps, vols, lens, concs, proms = [], [], [], [], []
    for _ in range(steps):
        picked: list[np.ndarray] = []
        prompts: list[int] = []
        while len(picked) < B:
            a = workload.attempt(i, 1, n)
            L = np.minimum(np.asarray(a.lengths), cap)
            ok = np.asarray(a.right) & (np.asarray(a.lengths) < cap)
            if 0 < ok.sum() < n:
                picked.append(L)
                prompts.append(workload.prompt_length(i))
            i += 1
        lengths = np.concatenate(picked)
        prompt = float(np.mean(prompts))
        mean = float(lengths.mean())
        lmax = int(lengths.max())
        per_seq_kv = prompt + mean
        m = max(
            1,
            min(e.max_num_seqs, int(e.kv_capacity_tokens // per_seq_kv), math.ceil(B * n / cluster.engines)),
        )
        ctx = prompt + mean / 2
        tput = cluster.engines * m / e.step_s(m, int(m * ctx))
        vols.append(float(lengths.sum()) / tput)
        cps.append(lmax * e.step_s(1, int(prompt + lmax / 2)))
        lens.append(mean)
        concs.append(m)
        proms.append(prompt)
    per_step = [max(c, v) for c, v in zip(cps, vols, strict=True)]
    return Ideal(
        rollout_s=statistics.fmean(per_step),
        critical_path_s=statistics.fmean(cps),
        volume_s=statistics.fmean(vols),
        mean_length=statistics.fmean(lens),
        concurrency=int(statistics.median(concs)),
        prompt_length=statistics.fmean(proms),
        cfg=cfg,
        cluster=cluster,
    )


@dataclass
class ModeReport:
    mode: str
    staleness_bound: float
    steps: int
    step_s: float  # mean end-to-end step (publish to publish), steps after the warm-up
    step_s_median: float
    rollout_s: float  # mean time the trainer waited for its batch (sync: the generation phase)
    train_s: float
    sync_s: float
    ideal_step_s: float
    efficiency: float
    speedup_vs_sync: float | None
    speedup_length_matched: float | None  # trained tokens per second against sync's
    tokens_generated: int
    tokens_aborted: int
    tokens_trained: int
    attempts_per_trained_prompt: float
    engine_idle_fraction: float
    preemptions: int
    staleness: dict[int, int]
    trained_length: float
    trained_prompt: float  # mean prompt of the trained sequences (the ideal is taken at both)
    length_bias_vs_unbiased: float
    length_bias_vs_sync: float | None
    outcomes: dict[str, int]
    long_tail: dict[str, int]
    per_step: list[dict[str, float]] = field(default_factory=list)
    warmup_steps: int = 0
    sim_cpu_s: float = 0.0
    sim_events: int = 0


def warmup_steps(versions: int) -> int:
    """Steps left out of the summary figures: the pipeline filling (with s >= 1 the first versions
    can only train the responses short enough to have finished yet)."""
    return max(1, versions // 4) if versions > 1 else 0


def mode_report(
    mode: str, cfg: RunConfig, res: SimResult, ideal_: Ideal, cpu_s: float, warmup: int | None = None
) -> ModeReport:
    """Summary figures over the steps after `warmup` (default `warmup_steps`); `per_step` has all."""
    w = warmup_steps(len(res.steps)) if warmup is None else warmup
    prev_all = [0.0] + [s.t_published for s in res.steps[:-1]]
    durations = [s.t_published - p for s, p in zip(res.steps, prev_all, strict=True)]
    steps = res.steps[w:] or res.steps
    body = durations[w:] or durations
    rollout = [s.t_data - s.t_free for s in steps]
    train = statistics.fmean(s.train_s for s in steps)
    sync = statistics.fmean(s.sync_s for s in steps)
    s_bound = cfg.rollout.max_staleness
    step_s = statistics.fmean(body)
    stale: Counter[int] = Counter(x for s in steps for x in s.staleness)
    trained_tokens = sum(s.tokens for s in steps)
    sequences = max(1, sum(len(s.staleness) for s in steps) * cfg.rollout.n)
    trained_len = trained_tokens / sequences
    trained_prompt = sum(s.prompt_tokens for s in steps) / sequences
    ideal_step = ideal_.floor(trained_len, trained_prompt).step_s
    efficiency = ideal_step / step_s if step_s > 0 else float("nan")
    if efficiency > 1.0 + 1e-9:
        raise EfficiencyError(
            f"{mode}: a step of {step_s:.3f} s beats the ideal {ideal_step:.3f} s at its trained length "
            f"{trained_len:.0f} (efficiency {efficiency:.3f}): the ideal is a lower bound, so the model or "
            "the bound is wrong; no figure is printed"
        )
    return ModeReport(
        mode=mode,
        staleness_bound=s_bound,
        steps=len(steps),
        step_s=step_s,
        step_s_median=statistics.median(body),
        rollout_s=statistics.fmean(rollout),
        train_s=train,
        sync_s=sync,
        ideal_step_s=ideal_step,
        efficiency=efficiency,
        speedup_vs_sync=None,
        speedup_length_matched=None,
        tokens_generated=res.decode_tokens,
        tokens_aborted=res.aborted_tokens,
        tokens_trained=trained_tokens,
        attempts_per_trained_prompt=statistics.fmean(a for s in steps for a in s.attempts),
        engine_idle_fraction=1.0 - res.busy_s / max(res.engines * res.sim_s, 1e-12),
        preemptions=res.preemptions,
        staleness=dict(sorted(stale.items())),
        trained_length=trained_len,
        trained_prompt=trained_prompt,
        length_bias_vs_unbiased=trained_len / ideal_.mean_length - 1.0,
        length_bias_vs_sync=None,
        outcomes=dict(res.counts.outcomes),
        long_tail=dict(res.counts.long_tail_actions),
        per_step=[
            {
                "version": s.version,
                "step_s": d,
                "rollout_s": s.t_data - s.t_free,
                "train_s": s.train_s,
                "sync_s": s.sync_s,
                "trained_length": s.lengths_mean,
                "longest": s.longest,
                "max_staleness": max(s.staleness),
            }
            for s, d in zip(res.steps, durations, strict=True)
        ],
        warmup_steps=w,
        sim_cpu_s=cpu_s,
        sim_events=res.events,
    )


def compare(reports: list[ModeReport]) -> None:
    """Fill the columns relative to sync (when sync is among the modes)."""
    sync = next((r for r in reports if r.mode == "sync"), None)
    if sync is None:
        return
    for r in reports:
        r.speedup_vs_sync = sync.step_s / r.step_s
        r.length_bias_vs_sync = r.trained_length / sync.trained_length - 1.0
        r.speedup_length_matched = r.speedup_vs_sync * r.trained_length / sync.trained_length


def table(reports: list[ModeReport]) -> str:
    lines = [
        f"{'mode':<16} {'step s':>9} {'wait s':>9} {'ideal s':>9} {'eff':>6} {'vs sync':>7} {'len-m':>6} "
        f"{'gen tok':>10} {'abort tok':>10} {'att':>6} {'idle':>6} {'len':>8} {'bias':>7} stale"
    ]
    for r in reports:
        vs = f"{r.speedup_vs_sync:.2f}x" if r.speedup_vs_sync is not None else "-"
        bias = f"{r.length_bias_vs_sync:+.1%}" if r.length_bias_vs_sync is not None else "-"
        lm = f"{r.speedup_length_matched:.2f}x" if r.speedup_length_matched is not None else "-"
        stale = ",".join(f"{k}:{v}" for k, v in r.staleness.items())
        lines.append(
            f"{r.mode:<16} {r.step_s:>9.1f} {r.rollout_s:>9.1f} {r.ideal_step_s:>9.1f} {r.efficiency:>6.2f} {vs:>7} {lm:>6} "
            f"{r.tokens_generated:>10.3g} {r.tokens_aborted:>10.3g} {r.attempts_per_trained_prompt:>6.2f} "
            f"{r.engine_idle_fraction:>6.2f} {r.trained_length:>8.0f} {bias:>7} {stale}"
        )
    return "\n".join(lines)


def result_lines(reports: list[ModeReport], extra: dict[str, Any]) -> list[str]:
    out = []
    for r in reports:
        vs = f"{r.speedup_vs_sync:.3f}" if r.speedup_vs_sync is not None else "na"
        bias = f"{r.length_bias_vs_sync:+.4f}" if r.length_bias_vs_sync is not None else "na"
        lm = f"{r.speedup_length_matched:.3f}" if r.speedup_length_matched is not None else "na"
        out.append(
            f"RESULT mode={r.mode} step_s={r.step_s:.2f} rollout_s={r.rollout_s:.2f} ideal_step_s={r.ideal_step_s:.2f} "
            f"efficiency={r.efficiency:.3f} speedup_vs_sync={vs} speedup_length_matched={lm} tokens_generated={r.tokens_generated} "
            f"tokens_aborted={r.tokens_aborted} attempts={r.attempts_per_trained_prompt:.3f} "
            f"idle={r.engine_idle_fraction:.3f} trained_length={r.trained_length:.1f} length_bias_vs_sync={bias} "
            f"max_staleness={max(r.staleness) if r.staleness else 0}"
        )
    out.append("RESULT " + " ".join(f"{k}={v}" for k, v in extra.items()))
    return out


def write_json(path: Path, reports: list[ModeReport], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "modes": [asdict(r) for r in reports]}, indent=1) + "\n")


def write_png(path: Path, reports: list[ModeReport], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r.mode for r in reports]
    x = np.arange(len(reports))
    wait = [r.rollout_s for r in reports]
    rest = [max(r.step_s - r.rollout_s, 0.0) for r in reports]
    ax1.bar(x, wait, label="trainer waits for rollout")
    ax1.bar(x, rest, bottom=wait, label="train + weight sync (exposed)")
    ax1.scatter(
        x, [r.ideal_step_s for r in reports], color="black", marker="_", s=400, label="ideal", zorder=3
    )
    ax1.set_xticks(x, names, rotation=20)
    ax1.set_ylabel("seconds per step (mean)")
    ax1.legend(fontsize=8)
    ax1.set_title("step time")
    for r in reports:
        vs = [p["step_s"] for p in r.per_step]
        ax2.plot(range(1, len(vs) + 1), vs, label=r.mode)
    ax2.set_xlabel("version")
    ax2.set_ylabel("step s")
    ax2.set_title("per version")
    ax2.legend(fontsize=8)
    fig.suptitle(f"SIMULATOR — {title}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

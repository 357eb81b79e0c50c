"""Statistics of a workload measured on real generations: what `asyncdapo data longtail-stats`
prints and docs/workloads.md publishes (and what the simulator's presets are checked against).

`measure` samples n responses per problem from a real vLLM engine (the gateway's own `VllmEngine`,
in this process), scores each with the verifier's math-verify path (`score_pair`) and returns the
groups; `summarize` (pure) turns groups into the figures. Nothing is taken from the generator's
parameters: lengths are the engine's token counts, truncation is its finish reason `length`,
correctness is math-verify's verdict, a valid group is one whose accuracies differ (DAPO's filter
on `acc`, as the benchmarks run it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    length: int  # response tokens
    truncated: bool  # finish reason `length`: cut at max_tokens
    acc: bool


@dataclass(frozen=True)
class GroupSample:
    klass: str  # the problem's difficulty class ("" when the dataset has none)
    responses: tuple[Sample, ...]
    prompt_tokens: int = 0

    def trace_line(self, prompt_id: str) -> dict[str, Any]:
        """The group as `asyncdapo simulate --replay` reads it (asyncdapo.tools.simulate.replay)."""
        return {
            "prompt_id": prompt_id,
            "prompt_tokens": self.prompt_tokens,
            "lengths": [r.length for r in self.responses],
            "acc": [int(r.acc) for r in self.responses],
        }

    @property
    def valid(self) -> bool:
        accs = {r.acc for r in self.responses}
        return len(accs) > 1


# (L_cut quantile, cap factor) pairs the statistics price; (0.8, 1.5) is the bench's pdsr setting
# (offload_fraction 0.2, cap_factor 1.5), the seed's cap
CAP_GRID = ((0.8, 1.5), (0.8, 2.0), (0.8, 3.0), (0.9, 1.5), (0.9, 2.0))


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    s = sorted(xs)
    rank = max(1, math.ceil(q / 100 * len(s)))
    return float(s[rank - 1])


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) < 2 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return float("nan")
    return statistics.correlation(xs, ys)


def _cv(xs: Sequence[int]) -> float:
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if m > 0 else 0.0


@dataclass
class WorkloadStats:
    groups: int
    responses: int
    length: dict[str, float]  # mean, p10 … p99, max
    truncated_rate: float
    overlong_penalised_rate: float  # longer than max_response_length - overlong buffer
    accuracy: float
    length_acc_corr: float  # Pearson (point-biserial) of length and correctness
    wrong_right_length_ratio: float  # mean length of wrong answers / of right ones
    long_right_rate: float  # correct share of responses above the length p75 (truncated ones count)
    short_wrong_rate: float  # wrong share of responses at or below the length p25
    within_group_cv: dict[str, float]  # mean, median, max over groups
    valid_rate: float
    top10_token_share: float  # tokens of the longest 10 % of responses / all tokens
    probe_offload_precision: float  # top-20 % probes (response 0) that are top-20 % groups by mean
    by_class: dict[str, dict[str, float]] = field(default_factory=dict)
    cap_costs: list[CapCost] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "cap_costs": [c.__dict__ for c in self.cap_costs]}


def summarize(groups: Sequence[GroupSample], max_response_length: int, overlong_buffer: int) -> WorkloadStats:
    if not groups:
        raise ValueError("no groups to summarize")
    flat = [r for g in groups for r in g.responses]
    lengths = [r.length for r in flat]
    accs = [1.0 if r.acc else 0.0 for r in flat]
    p25, p75 = percentile(lengths, 25), percentile(lengths, 75)
    right = [r.length for r in flat if r.acc]
    wrong = [r.length for r in flat if not r.acc]
    long = [r for r in flat if r.length > p75]
    short = [r for r in flat if r.length <= p25]
    top = sorted(lengths, reverse=True)[: max(1, len(lengths) // 10)]
    cvs = [_cv([r.length for r in g.responses]) for g in groups]
    by_class: dict[str, dict[str, float]] = {}
    for k in sorted({g.klass for g in groups}):
        gs = [g for g in groups if g.klass == k]
        rs = [r for g in gs for r in g.responses]
        by_class[k] = {
            "groups": len(gs),
            "valid_rate": sum(g.valid for g in gs) / len(gs),
            "accuracy": sum(r.acc for r in rs) / len(rs),
            "mean_length": statistics.fmean(r.length for r in rs),
            "truncated_rate": sum(r.truncated for r in rs) / len(rs),
        }
    return WorkloadStats(
        groups=len(groups),
        responses=len(flat),
        length={
            "mean": statistics.fmean(lengths),
            **{f"p{q}": percentile(lengths, q) for q in (10, 25, 50, 75, 90, 95, 99)},
            "max": float(max(lengths)),
        },
        truncated_rate=sum(r.truncated for r in flat) / len(flat),
        overlong_penalised_rate=sum(r.length > max_response_length - overlong_buffer for r in flat)
        / len(flat),
        accuracy=statistics.fmean(accs),
        length_acc_corr=_pearson([float(x) for x in lengths], accs),
        wrong_right_length_ratio=(
            statistics.fmean(wrong) / statistics.fmean(right) if wrong and right else float("nan")
        ),
        long_right_rate=sum(r.acc for r in long) / len(long) if long else float("nan"),
        short_wrong_rate=sum(not r.acc for r in short) / len(short),
        within_group_cv={
            "mean": statistics.fmean(cvs),
            "median": statistics.median(cvs),
            "max": max(cvs),
        },
        valid_rate=sum(g.valid for g in groups) / len(groups),
        top10_token_share=sum(top) / max(sum(lengths), 1),
        probe_offload_precision=_offload_precision(groups),
        by_class=by_class,
        cap_costs=[cap_cost(groups, q, f, max_response_length) for q, f in CAP_GRID],
    )


@dataclass(frozen=True)
class CapCost:
    """What cap-and-migrate P-DSR (asyncdapo.services.scheduler.policy.long_tail) costs on these lengths with
    L_cut the `quantile` of all lengths and the fast pool's cap ceil(cap_factor · L_cut), every
    response started on the fast pool: the circuit-break rates (responses / groups with a response
    that reached the cap), the partial tokens the heavy pool prefills again (`recompute_share`, of
    all response tokens: what a retry-from-scratch design such as the seed's would throw away and
    decode again) and the tokens the heavy pool decodes after them (`heavy_decode_share`)."""

    quantile: float
    cap_factor: float
    cap: int
    break_rate: float
    group_break_rate: float
    recompute_share: float
    heavy_decode_share: float


def cap_cost(
    groups: Sequence[GroupSample], quantile: float, cap_factor: float, max_response_length: int
) -> CapCost:
    lengths = [r.length for g in groups for r in g.responses]
    cap = min(max_response_length, max(1, math.ceil(cap_factor * percentile(lengths, 100 * quantile))))
    hit = cap < max_response_length  # the pdsr policy caps only below the run's own max_tokens
    capped = [x for x in lengths if hit and x >= cap]
    total = max(sum(lengths), 1)
    return CapCost(
        quantile=quantile,
        cap_factor=cap_factor,
        cap=cap,
        break_rate=len(capped) / len(lengths),
        group_break_rate=sum(any(hit and r.length >= cap for r in g.responses) for g in groups) / len(groups),
        recompute_share=cap * len(capped) / total,
        heavy_decode_share=sum(x - cap for x in capped) / total,
    )


def _offload_precision(groups: Sequence[GroupSample], fraction: float = 0.2) -> float:
    """P-DSR's offload precision with response 0 as the probe: of the prompts whose probe is among
    the longest `fraction`, the share whose group (its other responses' mean) is among the longest
    `fraction` too."""
    if len(groups) < 5 or any(len(g.responses) < 2 for g in groups):
        return float("nan")
    k = max(1, round(fraction * len(groups)))
    probe_top = sorted(range(len(groups)), key=lambda i: -groups[i].responses[0].length)[:k]
    rest = [statistics.fmean(r.length for r in g.responses[1:]) for g in groups]
    group_top = set(sorted(range(len(groups)), key=lambda i: -rest[i])[:k])
    return sum(i in group_top for i in probe_top) / k


def markdown(stats: WorkloadStats, title: str) -> str:
    """The statistics as the Markdown block docs/workloads.md publishes."""
    L = stats.length
    cv = stats.within_group_cv
    lines = [
        f"**{title}** ({stats.groups} groups, {stats.responses} responses)",
        "",
        "| figure | value |",
        "|---|---|",
        "| length mean / p10 / p25 / p50 / p75 / p90 / p95 / p99 / max (tokens) | "
        + " / ".join(f"{L[k]:.0f}" for k in ("mean", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "max"))
        + " |",
        f"| truncated at max_response_length | {stats.truncated_rate:.1%} |",
        f"| in the overlong buffer (penalised) | {stats.overlong_penalised_rate:.1%} |",
        f"| accuracy | {stats.accuracy:.3f} |",
        f"| length–correctness correlation (Pearson) | {stats.length_acc_corr:+.3f} |",
        f"| mean length wrong / right | {stats.wrong_right_length_ratio:.2f} |",
        f"| right among responses longer than p75 | {stats.long_right_rate:.1%} |",
        f"| wrong among responses at or below p25 | {stats.short_wrong_rate:.1%} |",
        f"| within-group length CV mean / median / max | {cv['mean']:.2f} / {cv['median']:.2f} / {cv['max']:.2f} |",
        f"| **valid-group rate** (acc differs within the group) | **{stats.valid_rate:.3f}** |",
        f"| tokens in the longest 10 % of responses | {stats.top10_token_share:.1%} |",
        f"| P-DSR offload precision (top-20 % probe → top-20 % group) | {stats.probe_offload_precision:.1%} |",
    ]
    if stats.cap_costs:
        lines += [
            "",
            "| P-DSR cap (L_cut quantile × factor) | cap (tokens) | circuit-break per response | per group | "
            "partial tokens prefilled again on heavy | decoded on heavy after them |",
            "|---|---|---|---|---|---|",
        ]
        for cc in stats.cap_costs:
            lines.append(
                f"| p{100 * cc.quantile:.0f} × {cc.cap_factor:g} | {cc.cap} | {cc.break_rate:.1%} | "
                f"{cc.group_break_rate:.1%} | {cc.recompute_share:.1%} | {cc.heavy_decode_share:.1%} |"
            )
    if stats.by_class:
        lines += [
            "",
            "| class | groups | valid rate | accuracy | mean length | truncated |",
            "|---|---|---|---|---|---|",
        ]
        for k, c in stats.by_class.items():
            lines.append(
                f"| {k} | {c['groups']:.0f} | {c['valid_rate']:.3f} | {c['accuracy']:.3f} | "
                f"{c['mean_length']:.0f} | {c['truncated_rate']:.1%} |"
            )
    return "\n".join(lines) + "\n"


async def measure(
    model_dir: str,
    examples: Sequence[Any],
    *,
    n: int,
    max_response_length: int,
    temperature: float = 1.0,
    seed: int = 0,
    max_concurrency: int = 128,
    kv_cache_gb: float = 1.0,
) -> list[GroupSample]:
    """n responses per example from a real vLLM engine, scored by math-verify."""
    import asyncio

    from transformers import AutoTokenizer

    from asyncdapo.contracts.prompting import prompt_token_ids
    from asyncdapo.services.gateway.engine import EngineRequest, Finish, Sampling
    from asyncdapo.services.gateway.vllm_engine import VllmEngine, VllmSettings
    from asyncdapo.services.verifier.math_verdict import score_pair

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [prompt_token_ids(e, tok) for e in examples]
    settings = VllmSettings(
        model=model_dir,
        max_concurrency=max_concurrency,
        max_model_len=max(len(p) for p in prompts) + max_response_length,
        dtype="float32",
        enforce_eager=True,
        kv_cache_gb=kv_cache_gb,
        seed=seed,
    )
    engine = await VllmEngine.start(settings)
    try:
        reqs = [
            EngineRequest(
                f"{i}:{j}",
                prompts[i],
                Sampling(
                    max_tokens=max_response_length, temperature=temperature, seed=seed * 1_000_003 + i * n + j
                ),
            )
            for i in range(len(examples))
            for j in range(n)
        ]
        outs = await asyncio.gather(*(engine.generate(r) for r in reqs))
    finally:
        await engine.shutdown()
    groups = []
    for i, e in enumerate(examples):
        samples = []
        for out in outs[i * n : (i + 1) * n]:
            text = str(tok.decode(out.token_ids, skip_special_tokens=True))  # one sequence: one string
            verdict = score_pair(e.ground_truth, text)
            samples.append(Sample(len(out.token_ids), out.finish is Finish.LENGTH, bool(verdict.acc)))
        groups.append(GroupSample(str(e.extra_info.get("difficulty", "")), tuple(samples), len(prompts[i])))
    return groups


def dataset_trace(
    rows: Sequence[Any], problem_lines: Sequence[dict[str, Any]], stem: str
) -> list[dict[str, Any]]:
    """A replay trace for a long-tail dataset from a trace over all of its problems (`--trace` of
    `problems.parquet`, one line per problem in `longtail.problems()` order): line k is row k's
    problem, every response of it kept (m ≥ 2n replays a requeued attempt from the same problem's
    next block: `asyncdapo.tools.simulate.replay`)."""
    from asyncdapo.tools.data.longtail import problem_index

    out = []
    for k, e in enumerate(rows):
        line = problem_lines[problem_index(e)]
        out.append({**line, "prompt_id": f"{stem}-{k}"})
    return out


def trace_groups(
    lines: Sequence[dict[str, Any]], n: int, cap: int, klass: Sequence[str]
) -> list[GroupSample]:
    """The groups of n a trace holds (each line cut into ⌊m / n⌋ blocks), for `summarize`; a
    response at `cap` tokens counts as truncated (the trace keeps no finish reason)."""
    groups = []
    for line, k in zip(lines, klass, strict=True):
        lengths, acc = [int(x) for x in line["lengths"]], [bool(x) for x in line["acc"]]
        for b in range(len(lengths) // n):
            s = slice(b * n, (b + 1) * n)
            samples = tuple(Sample(x, x >= cap, a) for x, a in zip(lengths[s], acc[s], strict=True))
            groups.append(GroupSample(k, samples, int(line.get("prompt_tokens", 0))))
    return groups

"""bench-longtail's report: medians and spreads per mode, the RESULT fields, P-DSR's cost as the
seed defines it. Split out of bench/bench_longtail.py."""

from __future__ import annotations

import json
import statistics
from typing import Any

# bench/ is on sys.path: the script is run as `python bench/bench_longtail.py`
from longtail_runs import MAX_RESPONSE_LENGTH, MODES, SYNC_MODES, TEMPERATURE, UNBIASED, B, N, Run

# ---------------------------------------------------------------------------------- report


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    return f"{min(xs):.2f}–{max(xs):.2f}" if xs else "-"


def report(rate: float, runs: dict[str, list[Run]]) -> dict[str, Any]:
    modes = [m for m in MODES if runs.get(m)]
    everything = [r for m in modes for r in runs[m]]
    # reference throughput: the most tokens per wall second any run of the bench sustained over its
    # steps (engines never idle; in practice a fully async run): what the two engines can do here
    tput = max(r.per_step("rollout/generated_tokens") / r.step_s for r in everything)
    best_sync = min(  # "" without a sync mode (--modes): the ratios to sync are nan
        (m for m in modes if m in SYNC_MODES), key=lambda m: med([r.step_s for r in runs[m]]), default=""
    )
    # sync is unbiased at every generation batch: its trained length is the median over all sync runs
    sync_len = med([r.mean("response_length/mean") for m in modes if m in SYNC_MODES for r in runs[m]])

    def ideal(r: Run) -> float:
        rollout = r.trained_tokens_per_step / max(r.valid_ratio, 1e-9) / tput
        compute = r.mean("timing/compute_s")
        overlaps = r.mode in ("s1", "s2")
        return max(rollout, compute) if overlaps else rollout + compute

    rows: list[tuple[str, Any]] = [
        ("end-to-end s/step median (spread)", lambda rs: f"{med([r.step_s for r in rs]):.2f} ({spread([r.step_s for r in rs])})"),
        ("rollout s/step median (spread)", lambda rs: f"{med([r.rollout_s for r in rs]):.2f} ({spread([r.rollout_s for r in rs])})"),
        ("  trainer wait s/step (timing/wait_s)", lambda rs: f"{med([r.mean('timing/wait_s') for r in rs]):.2f}"),
        ("  trainer compute s/step", lambda rs: f"{med([r.mean('timing/compute_s') for r in rs]):.2f}"),
        ("  weight fan-out s", lambda rs: f"{med([r.fanout_s for r in rs]):.2f}"),
        ("trained length (mean)", lambda rs: f"{med([r.mean('response_length/mean') for r in rs]):.1f}"),
        ("trained length / sync", lambda rs: f"{med([r.mean('response_length/mean') for r in rs]) / sync_len:.3f}"),
        ("trained clip ratio", lambda rs: f"{med([r.mean('response_length/clip_ratio') for r in rs]):.3f}"),
        ("valid ratio valid/(valid+filtered)", lambda rs: f"{med([r.valid_ratio for r in rs]):.3f}"),
        ("attempts per finished prompt", lambda rs: f"{med([r.attempts for r in rs]):.2f}"),
        ("generated tokens / step", lambda rs: f"{med([r.per_step('rollout/generated_tokens') for r in rs]):.0f}"),
        ("aborted tokens / step", lambda rs: f"{med([r.per_step('rollout/aborted_tokens') for r in rs]):.0f}"),
        ("outcomes (first run)", lambda rs: json.dumps(rs[0].outcomes, sort_keys=True)),
        ("efficiency vs ideal (own groups)", lambda rs: f"{med([ideal(r) / r.step_s for r in rs]):.3f}"),
        ("load average 1 min (start/end, median)", lambda rs: f"{med([r.loadavg[0] for r in rs]):.1f}/{med([r.loadavg[1] for r in rs]):.1f}"),
        ("runs", lambda rs: str(len(rs))),
    ]  # fmt: skip
    width = 14
    print(f"\n== valid rate {rate:g}: B={B}, n={N}, max_response_length {MAX_RESPONSE_LENGTH}; "
          f"reference throughput {tput:.0f} tokens/s (the best run's tokens per wall second)")  # fmt: skip
    print(f"{'':40s}" + "".join(f"{m:>{width}s}" for m in modes))
    for label, get in rows:
        cells = []
        for m in modes:
            try:
                cells.append(str(get(runs[m])))
            except (ValueError, ZeroDivisionError, statistics.StatisticsError):
                cells.append("-")
        print(f"{label:40s}" + "".join(f"{c:>{width}s}" if len(c) < width else f" {c}" for c in cells))
    pd = runs.get("pdsr", [])
    if pd:
        pdsr_costs(pd, runs.get("fifo", []))
    print("\nper run (mode rep: e2e s/step, rollout s/step, trained length, load avg):")
    for m in modes:
        print(f"  {m:10s} " + "  ".join(
            f"r{r.rep}: {r.step_s:.2f}/{r.rollout_s:.2f}/{r.mean('response_length/mean'):.0f}/{r.loadavg[1]:.1f}"
            for r in runs[m]))  # fmt: skip

    def step(m: str) -> float:
        return med([r.step_s for r in runs[m]]) if runs.get(m) else float("nan")

    def eff(m: str) -> float:
        return med([ideal(r) / r.step_s for r in runs[m]]) if runs.get(m) else float("nan")

    sync_s = step(best_sync)
    any_len = med([r.mean("response_length/mean") for r in runs["any"]]) if runs.get("any") else float("nan")
    best_unbiased = [m for m in UNBIASED if runs.get(m)]
    fields = {
        "valid_rate": f"{rate:g}",
        "temperature": f"{TEMPERATURE:g}",
        "sync_s": f"{sync_s:.3f}",
        "sync_best": best_sync,
        "sync_3B_s": f"{step('sync-3B'):.3f}",
        "async_any_s": f"{step('any'):.3f}",
        "async_fifo_s": f"{step('fifo'):.3f}",
        "fully_async_s1_s": f"{step('s1'):.3f}",
        "fully_async_s2_s": f"{step('s2'):.3f}",
        "pdsr_s": f"{step('pdsr'):.3f}",
        "fifo_ratio": f"{step('fifo') / sync_s:.3f}",
        "s1_ratio": f"{step('s1') / sync_s:.3f}",
        "pdsr_ratio": f"{step('pdsr') / sync_s:.3f}",
        "pdsr_vs_fifo": f"{step('pdsr') / step('fifo'):.3f}",
        "length_bias_any": f"{any_len / sync_len:.3f}",
        "efficiency_best": f"{max((eff(m) for m in best_unbiased), default=float('nan')):.3f}",
    }
    return fields


def pdsr_costs(pd: list[Run], fifo: list[Run]) -> None:
    """P-DSR's cost as the seed defines it, per run from the scheduler's long-tail counters and the
    two gateways' token counters (medians over runs): what a circuit break costs here (the partial
    tokens the heavy pool prefills again and the new tokens it decodes) and what is thrown away."""
    final = [r.lt("final") for r in pd]
    capped = [r.lt("cap_continue") for r in pd]
    groups = [r.outcomes.get("valid", 0) + r.outcomes.get("filtered", 0) for r in pd]
    resp_rate = med([c / f for c, f in zip(capped, final, strict=True) if f])
    group_rate = med([r.lt("cap_group") / g for r, g in zip(pd, groups, strict=True) if g])

    def share(r: Run, what: str) -> float:
        fast, heavy = r.pools.get("fast", {}), r.pools.get("heavy", {})
        decoded = fast.get("decoded", 0.0) + heavy.get("decoded", 0.0)  # every token sampled, both pools
        x = {
            "partial": r.lt("cap_continue", tokens=True),
            "heavy_decode": heavy.get("decoded", 0.0),
            "heavy_prefill": heavy.get("prefill", 0.0) - heavy.get("prefix_hits", 0.0),
            "aborted": float(r.status.get("rollout/aborted_tokens", 0)),
        }[what]
        return x / decoded if decoded else float("nan")

    print(f"pdsr: circuit-break rate per response {resp_rate:.3f} (seed: 0.13), per group {group_rate:.3f} "
          f"(groups with a capped response / judged groups; n = {N})")  # fmt: skip
    if not all(r.pools for r in pd):
        print("pdsr: no per-pool token counters in these runs (saved before they were recorded)")
        return
    f_abort = med([share(r, "aborted") for r in fifo if r.pools]) if fifo else float("nan")
    print("pdsr compute, shares of all tokens the two engines decoded (median over runs):\n"
          f"  new tokens decoded on heavy for continued responses  {med([share(r, 'heavy_decode') for r in pd]):.3f}"
          "  (work moved, not added)\n"
          f"  recompute: partial tokens carried to heavy            {med([share(r, 'partial') for r in pd]):.3f}\n"
          f"             prompt + partial prefilled on heavy (less prefix-cache hits) "
          f"{med([share(r, 'heavy_prefill') for r in pd]):.3f}  (one batched forward: far cheaper per token than "
          "decoding them; its engine time is priced in the simulator check below)\n"
          f"  lost: decoded, then thrown away (aborted by early stop) {med([share(r, 'aborted') for r in pd]):.3f}"
          f"  (s = 0 fifo without pdsr: {f_abort:.3f}); decoded and thrown away by a circuit break: 0 "
          "(a capped response continues from its partial tokens)\n"
          "  the seed's '< 10 % compute lost' is a retry design's: the partial tokens of every circuit-broken "
          "response are thrown away and decoded again, i.e. the 'partial tokens carried' line above; here "
          "those tokens cost a prefill, not a decode")  # fmt: skip

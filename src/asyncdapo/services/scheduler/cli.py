"""`asyncdapo scheduler`: run the scheduler of one training run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from asyncdapo.contracts.overrides import add_overrides_argument
from asyncdapo.runtime.redis_conn import add_password_flag


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "scheduler",
        help="run the rollout scheduler of one run (gRPC asyncdapo.v1.Scheduler)",
        description="Dispatches prompts to rollout gateways, scores responses with the verifier, "
        "filters groups and early-stops at the staleness bound.",
    )
    p.add_argument("--config", required=True, help="run config YAML (RunConfig)")
    add_overrides_argument(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=50061, help="gRPC port")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0: off)")
    p.add_argument("--redis", required=True, help="redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--verifier", required=True, help="verifier base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--gateways", required=True, help="host:port,host:port or dns:NAME:PORT (headless Service)"
    )
    p.add_argument("--token-file", help="bearer token for control RPCs (ours and the gateways')")
    p.add_argument(
        "--tls-cert", help="serve gRPC over TLS with this PEM certificate (chain); needs --tls-key"
    )
    p.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    p.add_argument(
        "--gateway-tls-ca",
        help="call the gateways over TLS, verifying their certificates against this PEM CA",
    )
    add_password_flag(p)
    p.add_argument("--tokenizer", help="directory with tokenizer.json (default: the run's model.path)")
    p.add_argument(
        "--tokenizer-from",
        metavar="HOST:PORT",
        help="fetch tokenizer.json from this WeightStore (the trainer's --weight-store-advertise) when the "
        "first response is scored, instead of reading --tokenizer / model.path: no model volume needed",
    )
    p.add_argument(
        "--tokenizer-tls-ca",
        help="--tokenizer-from over TLS, verifying the trainer's certificate against this PEM CA",
    )
    p.add_argument(
        "--response-log",
        help="append one JSON line per training response that ended (judged, aborted, late) to this file: "
        "the run's own generations, for `asyncdapo simulate --replay`",
    )
    p.add_argument("--start", action="store_true", help="start the run at once (else wait for StartRun)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from asyncdapo.contracts.config import load_run_config
    from asyncdapo.contracts.errors import AsyncdapoError
    from asyncdapo.runtime.grpc_security import client_tls_from_args, read_token_file, server_tls_from_args
    from asyncdapo.runtime.models import resolve_model
    from asyncdapo.runtime.redis_conn import apply_password_flag
    from asyncdapo.services.scheduler.gateway_pool import GatewaySpec, GatewaySpecError

    apply_password_flag(args)
    cfg = load_run_config(args.config, args.overrides)
    try:
        spec = GatewaySpec.parse(args.gateways)
    except GatewaySpecError as err:
        raise AsyncdapoError(str(err)) from None
    token = read_token_file(args.token_file) if args.token_file else None
    args.tls = server_tls_from_args(args)
    args.gateway_tls = client_tls_from_args(args, "--gateway-tls-ca")
    if args.tokenizer_from and args.tokenizer:
        raise AsyncdapoError("--tokenizer and --tokenizer-from both name the tokenizer: give one")
    tok_dir = None
    if args.tokenizer_from:  # a bad CA file fails now, not at the first score
        args.tokenizer_tls = client_tls_from_args(args, "--tokenizer-tls-ca")
    else:
        tok_dir = args.tokenizer or resolve_model(cfg.model.path, "model.path")  # a dir or a Hub id
        if not (Path(tok_dir) / "tokenizer.json").is_file():
            raise AsyncdapoError(f"--tokenizer / model.path: no tokenizer.json in {tok_dir}")
    asyncio.run(serve(cfg, spec, args, token, tok_dir))
    return 0


async def serve(
    cfg: Any, spec: Any, args: argparse.Namespace, token: str | None, tok_dir: str | None
) -> None:
    import asyncio
    import logging
    import signal

    from prometheus_client import start_http_server

    from asyncdapo.runtime.redis_conn import async_client, check_auth_async
    from asyncdapo.services.scheduler.gateway_pool import GatewayPool
    from asyncdapo.services.scheduler.metrics import SchedulerMetrics
    from asyncdapo.services.scheduler.rollout import Rollout
    from asyncdapo.services.scheduler.scheduler_service import build_server
    from asyncdapo.services.scheduler.score_batcher import Detokenizer, TextDecoder, VerifierScorer

    log = logging.getLogger("asyncdapo.services.scheduler")
    metrics = SchedulerMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
    # bounded socket waits: a Redis that hangs (paused, cut off) is noticed and waited for, not
    # blocked on forever
    r = async_client(args.redis, socket_timeout=10.0, socket_connect_timeout=5.0)
    await check_auth_async(r, args.redis)
    pool = GatewayPool(spec, token=token, tls=args.gateway_tls)
    detok: TextDecoder
    if tok_dir is None:
        import tempfile

        from asyncdapo.services.scheduler.streamed_tokenizer import StreamedDetokenizer

        dest = Path(tempfile.mkdtemp(prefix="asyncdapo-tokenizer-"))
        detok = StreamedDetokenizer(args.tokenizer_from, dest, token, args.tokenizer_tls)
    else:
        detok = Detokenizer(tok_dir)
    verifier = VerifierScorer(args.verifier, detok, cfg.reward, metrics)
    from asyncdapo.services.scheduler.response_log import ResponseLog

    responses = ResponseLog(args.response_log) if args.response_log else None
    rollout = Rollout(cfg, r, pool, verifier, metrics, response_log=responses)
    await pool.start()
    await rollout.open()
    server, port, _ = await build_server(rollout, f"{args.host}:{args.port}", token, args.tls)
    log.info("scheduler of run %s on %s:%d (%d gateways)", cfg.name, args.host, port, len(pool.members))
    if args.start:
        rollout.start_run()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: requeueing this scheduler's claims")
    await rollout.shutdown()
    await server.stop(grace=2.0)
    await rollout.close()
    await pool.close()
    await verifier.aclose()
    await r.aclose()
    if responses is not None:
        responses.close()

"""`asyncdapo verifier --host H --port P --workers W [--timeout-s S …]`: run the scoring service."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verifier",
        help="run the math-verify scoring service (HTTP)",
        description="Serve POST /v1/score, /healthz, /readyz, /metrics and OpenAPI docs at /docs. "
        "Flags override ASYNCDAPO_VERIFIER_* environment variables.",
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default 8000)")
    p.add_argument("--workers", type=int, help="scoring processes (default: usable CPU cores)")
    p.add_argument(
        "--spare-workers",
        type=int,
        dest="spare_workers",
        help="extra processes taking work while a worker is stuck on a slow item (default: 1 per 8 workers, at least 1)",
    )
    p.add_argument(
        "--stall-after-s",
        type=float,
        dest="stall_after_s",
        help="an item running longer than this frees its place for a spare (default 0.025)",
    )
    p.add_argument("--timeout-s", type=float, dest="timeout_s", help="hard per-item timeout (default 5)")
    p.add_argument(
        "--no-cooperative-timeout",
        dest="cooperative_timeout",
        action="store_const",
        const=False,
        help="rely on killing workers only (no in-worker alarm at 90%% of the timeout)",
    )
    p.add_argument("--max-items-per-request", type=int, dest="max_items_per_request")
    p.add_argument("--max-response-bytes", type=int, dest="max_response_bytes")
    p.add_argument("--max-ground-truth-bytes", type=int, dest="max_ground_truth_bytes")
    p.add_argument("--max-chunk", type=int, dest="max_chunk", help="most items sent to a worker at once")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from asyncdapo.contracts.errors import AsyncdapoError
    from asyncdapo.services.verifier.app import create_app
    from asyncdapo.services.verifier.settings import VerifierSettings

    overrides = {k: v for k, v in vars(args).items() if k in VerifierSettings.model_fields and v is not None}
    try:
        settings = VerifierSettings(**overrides)
    except ValidationError as err:
        raise AsyncdapoError(f"invalid verifier settings:\n{err}") from err
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
    )
    return 0

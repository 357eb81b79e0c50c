"""The verifier's HTTP service: `POST /v1/score`, `/healthz`, `/readyz`, `/metrics`, OpenAPI at `/docs`.

Status codes of `/v1/score`: 200 (every item has a result, possibly `timeout`/`error`, or `invalid`
for an item over a per-item size limit: that item alone), 411/413 (body without Content-Length /
over a request-size limit), 422 (malformed body, duplicate ids), 503 (pool not ready or queue full:
retry later). Limit errors name the limit:
`{"detail": "...", "limit": "max_items_per_request", "maximum": 1024, "actual": 2000}`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from asyncdapo.contracts.verifier_api import ItemStatus, ScoreRequest, ScoreResponse, check_items
from asyncdapo.contracts.version import __version__
from asyncdapo.services.verifier.limits import LimitViolation, check_body_size, check_request, item_limits
from asyncdapo.services.verifier.metrics import VerifierMetrics
from asyncdapo.services.verifier.protocol import Verdict, result_fields
from asyncdapo.services.verifier.settings import VerifierSettings
from asyncdapo.services.verifier.worker_pool import PoolClosed, WorkerPool

SCORE_PATH = "/v1/score"


class _BodySizeGuard:
    """ASGI middleware refusing oversized score requests before their body is read."""

    def __init__(self, app: Any, settings: VerifierSettings, metrics: VerifierMetrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == SCORE_PATH and scope["method"] == "POST":
            headers = dict(scope["headers"])
            raw = headers.get(b"content-length")
            if raw is None:
                response: Response = JSONResponse(
                    {"detail": "Content-Length is required (limit max_request_bytes)"}, status_code=411
                )
            elif (violation := check_body_size(int(raw), self.settings)) is not None:
                response = _limit_response(violation)
            else:
                await self.app(scope, receive, send)
                return
            self.metrics.requests.labels(code=str(response.status_code)).inc()
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _limit_response(violation: LimitViolation) -> JSONResponse:
    return JSONResponse(violation.body(), status_code=violation.status_code)


def create_app(settings: VerifierSettings) -> FastAPI:
    metrics = VerifierMetrics()
    limits = item_limits(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = WorkerPool(
            workers=settings.workers,
            timeout_s=settings.timeout_s,
            soft_timeout_s=settings.soft_timeout_s,
            max_chunk=settings.max_chunk,
            spares=settings.spare_workers,
            stall_after_s=settings.stall_after_s,
            start_method=settings.start_method,
            on_restart=metrics.on_restart,
            on_item=metrics.on_item,
            on_stall=metrics.stalled_items.inc,
        )
        await asyncio.to_thread(pool.start)
        metrics.track_pool(lambda: pool.ready_workers, lambda: pool.queued)
        app.state.pool = pool
        try:
            yield
        finally:
            await asyncio.to_thread(pool.close)

    app = FastAPI(
        title="asyncdapo verifier",
        version=__version__,
        description="Scores model responses against ground truths with math-verify in a pool of "
        "worker processes; every item has a hard timeout and comes back ok, timeout or error.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(_BodySizeGuard, settings=settings, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        metrics.requests.labels(code="422").inc()
        return await request_validation_exception_handler(request, exc)

    @app.post(
        SCORE_PATH,
        response_model=ScoreResponse,
        summary="Score a batch of responses",
        responses={
            411: {"description": "No Content-Length header."},
            413: {"description": "Over max_request_bytes or max_items_per_request (named in `limit`)."},
            422: {"description": "Malformed body or duplicate ids (an oversize item is `invalid`)."},
            503: {"description": "Worker pool not ready or queue full; retry with backoff."},
        },
    )
    async def score(body: ScoreRequest) -> Response:
        t0 = time.perf_counter()
        pool: WorkerPool = app.state.pool
        if (violation := check_request(body, settings)) is not None:
            metrics.requests.labels(code=str(violation.status_code)).inc()
            return _limit_response(violation)
        # An item over a per-item limit is answered `invalid` on its own; the others are scored.
        invalid = check_items(body.items, limits)
        todo = [item for i, item in enumerate(body.items) if i not in invalid]
        if not pool.ready or pool.queued + len(todo) > settings.max_queued_items:
            metrics.requests.labels(code="503").inc()
            why = "worker pool not ready" if not pool.ready else "queue full (max_queued_items)"
            return JSONResponse({"detail": why}, status_code=503, headers={"Retry-After": "1"})
        try:
            verdicts = await asyncio.wrap_future(
                pool.submit([(item.ground_truth, item.response) for item in todo])
            )
            scored = iter(verdicts)
        except PoolClosed as err:
            metrics.requests.labels(code="503").inc()
            return JSONResponse({"detail": str(err)}, status_code=503, headers={"Retry-After": "1"})
        verdicts = [
            Verdict(ItemStatus.INVALID, error=invalid[i].message) if i in invalid else next(scored)
            for i in range(len(body.items))
        ]
        if invalid:
            metrics.items.labels(status=ItemStatus.INVALID.value).inc(len(invalid))
        # Built as plain dicts (a ScoreResponse by construction): a third of pydantic's cost per item.
        results = [result_fields(item.id, v) for item, v in zip(body.items, verdicts, strict=True)]
        payload = json.dumps({"results": results}, ensure_ascii=False)
        metrics.requests.labels(code="200").inc()
        metrics.request_latency.observe(time.perf_counter() - t0)
        return Response(content=payload, media_type="application/json")

    @app.get("/healthz", summary="Liveness: the process serves HTTP")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness: every worker warmed up and the pool serving")
    async def readyz() -> Response:
        pool: WorkerPool | None = getattr(app.state, "pool", None)
        ready = pool is not None and pool.ready
        body = {
            "ready": ready,
            "workers_ready": pool.ready_workers if pool else 0,
            "workers": settings.workers,
            "spare_workers": settings.spare_workers,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

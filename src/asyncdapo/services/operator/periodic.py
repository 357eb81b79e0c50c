"""The operator's periodic pass: every `interval` seconds, one reconcile pass for each TrainingRun
that still has work, from kopf's in-memory index of TrainingRuns.

Why not kopf's `@kopf.timer`: a timer is a per-object daemon, and kopf puts a finalizer on every
object that has one (to stop the daemon before the object goes). With the operator down or
uninstalled, deleting such a run — or its namespace — would hang on that finalizer. The pass runs
instead from an `on.startup` task over an index (indexing needs no finalizer), so no TrainingRun
ever carries a finalizer; children go with their ownerReferences.

A finished run (Succeeded, or Failed for a reason the spec cannot fix) whose status has seen its
current generation gets no pass at all: its children already have their final shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from asyncdapo.services.operator.resource_status import parse_status
from asyncdapo.services.operator.status_machine import is_terminal

log = logging.getLogger(__name__)

INTERVAL_S = 30.0
CONCURRENCY = 8


def has_work(body: Mapping[str, Any]) -> bool:
    """Whether a reconcile pass can change anything for this TrainingRun."""
    status = parse_status(body.get("status"))
    meta = body.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    if meta.get("deletionTimestamp"):
        return False
    return not (is_terminal(status) and status.observed_generation == generation)


def snapshot(index: Mapping[Any, Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The bodies in a kopf index {key: store of bodies}, copied (the index changes under us)."""
    return [dict(body) for store in list(index.values()) for body in list(store)]


async def sweep(
    bodies: list[dict[str, Any]], run_pass: Callable[[dict[str, Any]], Awaitable[None]], concurrency: int
) -> int:
    """One pass over the runs that have work, at most `concurrency` at once; returns how many.
    A failing pass is logged (run_pass reports it) and does not stop the others."""
    due = [b for b in bodies if has_work(b)]
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> None:
        async with gate:
            try:
                await run_pass(body)
            except Exception:  # a boundary: one run's failure must not stop the sweep
                meta = body.get("metadata") or {}
                log.exception("periodic pass of %s/%s failed", meta.get("namespace"), meta.get("name"))

    await asyncio.gather(*(one(b) for b in due))
    return len(due)


async def run_forever(
    index: Mapping[Any, Iterable[Mapping[str, Any]]],
    run_pass: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    interval_s: float = INTERVAL_S,
    concurrency: int = CONCURRENCY,
    initial_delay_s: float = 5.0,
) -> None:
    """Sweep every `interval_s` until cancelled (the operator's cleanup cancels it)."""
    await asyncio.sleep(initial_delay_s)
    while True:
        started = asyncio.get_running_loop().time()
        n = await sweep(snapshot(index), run_pass, concurrency)
        log.debug("periodic pass: %d run(s) with work", n)
        elapsed = asyncio.get_running_loop().time() - started
        await asyncio.sleep(max(1.0, interval_s - elapsed))

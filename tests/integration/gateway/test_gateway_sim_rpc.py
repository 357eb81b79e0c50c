"""The gateway's gRPC contract over real gRPC, with the token-timing SIMULATOR as the engine
(auth, wire errors, abort, load streaming, drain, the CLI's SIGTERM handling)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from safetensors.numpy import save_file

from asyncdapo.services.gateway.engine import Finish, PauseMode, Sampling
from asyncdapo.services.gateway.gateway_client import GatewayClient
from asyncdapo.tools.local.ports import free_port

LONG = Sampling(max_tokens=100_000, ignore_eos=True)


async def _code(coro: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro  # type: ignore[misc]
    return info.value.code(), info.value.details() or ""


async def test_control_rpcs_need_the_bearer_token(sim_gateway_factory, gateway_token: str) -> None:
    gw = sim_gateway_factory()
    async with GatewayClient(gw.target) as anon, GatewayClient(gw.target, token="wrong") as wrong:
        for call in (anon.abort(all=True), anon.pause(), anon.resume(), anon.load_weights(1, "/tmp")):
            code, details = await _code(call)
            assert code is grpc.StatusCode.UNAUTHENTICATED and "authorization" in details
        for call in (wrong.abort(all=True), wrong.pause(), wrong.resume(), wrong.load_weights(1, "/tmp")):
            code, details = await _code(call)
            assert code is grpc.StatusCode.UNAUTHENTICATED and "wrong" in details
        assert (await anon.get_load()).paused is False  # the refused Pause changed nothing
        # data-plane RPCs are open
        assert (await anon.generate("a", [1, 2], Sampling(max_tokens=3))).finish_reason in (
            Finish.STOP,
            Finish.LENGTH,
        )
        assert (await anon.get_load()).engine == "sim"
    async with GatewayClient(gw.target, token=gateway_token) as ok:
        assert await ok.abort(all=True) == []
        await ok.pause()
        await ok.resume()


async def test_wire_errors_name_the_field_and_the_gateway_keeps_serving(
    sim_gateway_factory, gateway_token: str
) -> None:
    gw = sim_gateway_factory()
    async with GatewayClient(gw.target, token=gateway_token) as c:
        code, details = await _code(c.generate("a", [], Sampling(max_tokens=3)))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "prompt is empty" in details
        code, details = await _code(c.generate("a", [1], Sampling(max_tokens=0)))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "sampling.max_tokens" in details
        code, details = await _code(c.generate("a", [1] * 5000, Sampling(max_tokens=3)))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "context" in details
        code, details = await _code(c.abort())
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "request_ids" in details
        code, details = await _code(c.load_weights(-1, "/tmp"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "version" in details
        code, details = await _code(c.load_weights(1, "/definitely/not/here"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "uri" in details

        first = asyncio.create_task(c.generate("dup", [1], LONG))
        await asyncio.sleep(0.05)
        code, details = await _code(c.generate("dup", [1], Sampling(max_tokens=2)))
        assert code is grpc.StatusCode.ALREADY_EXISTS and "dup" in details
        assert await c.abort(["dup", "never-seen"]) == ["dup"]
        assert (await first).finish_reason is Finish.ABORT
        assert len((await c.generate("after", [1], Sampling(max_tokens=5, ignore_eos=True))).token_ids) == 5


async def test_abort_all_returns_partial_tokens(sim_gateway_factory, gateway_token: str) -> None:
    gw = sim_gateway_factory()
    async with GatewayClient(gw.target, token=gateway_token) as c:
        tasks = [asyncio.create_task(c.generate(f"r{i}", [1, 2, 3], LONG)) for i in range(4)]
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        assert sorted(await c.abort(all=True)) == [f"r{i}" for i in range(4)]
        results = await asyncio.gather(*tasks)
        assert time.monotonic() - t0 < 2.0
    for r in results:
        assert r.finish_reason is Finish.ABORT and len(r.token_ids) > 0
        assert len(r.logprobs) == len(r.token_ids) == sum(n for _, n in r.version_runs)


async def test_load_reports_in_flight_and_streams(sim_gateway_factory, gateway_token: str) -> None:
    gw = sim_gateway_factory(max_concurrency=2)
    async with GatewayClient(gw.target, token=gateway_token) as c:
        tasks = [asyncio.create_task(c.generate(f"r{i}", [1, 2, 3], LONG)) for i in range(3)]
        # until the three requests reached the gateway (a fixed 0.1 s was too short under CI's load)
        deadline = time.monotonic() + 5.0
        load = await c.get_load()
        while load.running + load.waiting < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            load = await c.get_load()
        assert (load.running, load.waiting, load.capacity) == (2, 1, 2)
        assert (load.gateway_id, load.pool, load.engine, load.paused, load.draining) == (
            "sim-test",
            "heavy",
            "sim",
            False,
            False,
        )
        seen = []
        async for item in c.watch_load(interval_ms=20):
            seen.append(item.generated_tokens_total)
            if len(seen) == 3:
                break
        assert seen[0] < seen[-1]
        await c.pause(PauseMode.KEEP)
        assert (await c.get_load()).paused
        await c.abort(all=True)
        await asyncio.gather(*tasks)
        await c.resume()


async def test_load_weights_checks_the_snapshot_before_any_change(
    sim_gateway_factory, gateway_token: str, tmp_path: Path
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    save_file({"w": np.zeros((4, 4), np.float32)}, str(served / "model.safetensors"))
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file({"w": np.zeros((4, 5), np.float32)}, str(bad / "model.safetensors"))
    gw = sim_gateway_factory(model_dir=served)
    async with GatewayClient(gw.target, token=gateway_token) as c:
        code, details = await _code(c.load_weights(3, str(bad)))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "'w' has shape [4, 5]" in details
        assert (await c.get_load()).weight_version == 0
        out = await c.load_weights(3, f"file://{served}")
        assert (out.version, out.num_tensors) == (3, 1)
        load = await c.get_load()
        assert load.weight_version == 3 and not load.paused  # it paused and resumed by itself
        r = await c.generate("v", [1], Sampling(max_tokens=4, ignore_eos=True))
        assert r.version_runs == [(3, 4)]


async def test_load_weights_with_a_uri_too_long_for_any_path_is_invalid_argument(
    sim_gateway_factory, gateway_token: str
) -> None:
    """The operating system refuses the name ("File name too long"): a caller's mistake, answered
    with a short message that fits gRPC's metadata (whole, the echo would turn the answer into
    RESOURCE_EXHAUSTED)."""
    gw = sim_gateway_factory()
    async with GatewayClient(gw.target, token=gateway_token) as c:
        code, details = await _code(c.load_weights(1, "/" + "w" * 70_000))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, details
        assert "File name too long" in details and "70001 characters" in details and len(details) < 300
        load = await c.get_load()
        assert load.weight_version == 0 and not load.paused


async def test_drain_aborts_at_the_deadline_and_refuses_new_work(
    sim_gateway_factory, gateway_token: str
) -> None:
    gw = sim_gateway_factory()
    async with GatewayClient(gw.target, token=gateway_token) as c:
        assert await c.healthy()
        task = asyncio.create_task(c.generate("long", [1], LONG))
        await asyncio.sleep(0.05)
        drain = asyncio.get_running_loop().run_in_executor(None, gw.call, gw.server.drain(0.2))
        r = await task
        assert r.finish_reason is Finish.ABORT and r.token_ids
        assert await drain == 1
        assert not await c.healthy()
        assert (await c.get_load()).draining
        code, details = await _code(c.generate("late", [1], Sampling(max_tokens=2)))
        assert code is grpc.StatusCode.UNAVAILABLE and "draining" in details


async def test_cli_drains_on_sigterm(tmp_path: Path, gateway_token: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(gateway_token + "\n")
    port, metrics_port = free_port(), free_port()
    cmd = [
        sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "sim", "--port", str(port),
        "--metrics-port", str(metrics_port), "--token-file", str(token_file), "--drain-timeout-s", "0.3",
        "--sim-base-step-ms", "2", "--gateway-id", "cli-sim",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        async with GatewayClient(f"127.0.0.1:{port}", token=gateway_token) as c:
            deadline = time.monotonic() + 30
            while not await c.healthy(timeout_s=0.5):
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "gateway did not become healthy"
                await asyncio.sleep(0.2)
            assert (await c.get_load()).gateway_id == "cli-sim"
            task = asyncio.create_task(c.generate("long", [1, 2], LONG))
            await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            r = await asyncio.wait_for(task, 10)
            assert r.finish_reason is Finish.ABORT and r.token_ids
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_reports_bad_flags(tmp_path: Path) -> None:
    empty = tmp_path / "empty-token"
    empty.write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "sim", "--token-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--token-file" in out.stderr and "empty" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "vllm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "needs --model" in out.stderr and "--weights-from" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "sim", "--model", str(tmp_path),
         "--weights-from", "127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "give one" in out.stderr, out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "vllm", "--model", str(tmp_path),
         "--vllm-executor", "uni"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "--vllm-executor uni on a CPU host needs --cpu-affinity" in out.stderr, (
        out.stderr
    )
    for cores, why in (("0-x", "is not a core id or a range"), ("4096", "are not available here")):
        out = subprocess.run(
            [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "sim", "--port", "0",
             "--metrics-port", "0", "--cpu-affinity", cores],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 2 and f"--cpu-affinity '{cores}'" in out.stderr and why in out.stderr, (
            out.stderr
        )
    for engine, extra, why in (
        ("vllm", ["--model", str(tmp_path), "--step-log", str(tmp_path / "no-such-dir" / "s.jsonl")],
         "does not exist"),
        ("sim", ["--step-log", str(tmp_path / "s.jsonl")], "the simulator has no engine steps"),
    ):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", engine, *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 2 and "--step-log" in out.stderr and why in out.stderr, out.stderr


async def test_port_is_held_while_the_engine_starts(gateway_token: str) -> None:
    from prometheus_client import CollectorRegistry

    from asyncdapo.services.gateway.gateway_service import GatewayOptions
    from asyncdapo.services.gateway.metrics import GatewayMetrics
    from asyncdapo.services.gateway.server import GatewayServer, ServerSettings
    from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine

    server = GatewayServer(
        None,
        GatewayOptions(gateway_id="late", capacity=4),
        ServerSettings(port=0, token=gateway_token),
        GatewayMetrics(CollectorRegistry()),
    )
    port = await server.start()
    try:
        async with GatewayClient(f"127.0.0.1:{port}", token=gateway_token) as c:
            assert not await c.healthy()
            load = await c.get_load()
            assert (load.gateway_id, load.engine, load.running) == ("late", "", 0)
            code, details = await _code(c.generate("early", [1], Sampling(max_tokens=2)))
            assert code is grpc.StatusCode.UNAVAILABLE and "starting" in details
            code, _ = await _code(c.pause())
            assert code is grpc.StatusCode.UNAVAILABLE
            await server.attach(SimulatedEngine(SimTiming(base_step_s=0.001), max_concurrency=4))
            assert await c.healthy()
            r = await c.generate("ok", [1], Sampling(max_tokens=3, ignore_eos=True))
            assert r.finish_reason is Finish.LENGTH and len(r.token_ids) == 3
    finally:
        await server.stop(grace_s=0)


def test_every_gateway_rpc_is_either_control_or_data_plane() -> None:
    """A new RPC must be classified: control ones need the token."""
    from asyncdapo.contracts.v1 import gateway_pb2
    from asyncdapo.services.gateway.gateway_service import CONTROL_METHODS, SERVICE_NAME

    every = {f"/{SERVICE_NAME}/{m.name}" for m in gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods}
    open_ = {f"/{SERVICE_NAME}/{m}" for m in ("Generate", "GenerateStream", "GetLoad", "WatchLoad")}
    assert every - open_ == CONTROL_METHODS
    assert {m.rsplit("/", 1)[1] for m in CONTROL_METHODS} == {"Abort", "Pause", "Resume", "LoadWeights"}


@pytest.mark.parametrize("interval_ms", [-1, 1, 9, 60_001, 2**31 - 1])
async def test_watch_load_rejects_an_interval_out_of_bounds(sim_gateway_factory, interval_ms: int) -> None:
    gw = sim_gateway_factory()
    async with GatewayClient(gw.target) as c:
        code, details = await _code(anext(c.watch_load(interval_ms=interval_ms)))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "interval_ms" in details
        for ok in (0, 10, 60_000):  # the default and both bounds stream
            loads = c.watch_load(interval_ms=ok)
            assert (await anext(loads)).engine == "sim"
            await loads.aclose()


async def test_tls_gateway_serves_verified_clients_only(
    sim_gateway_factory, gateway_token: str, tmp_path: Path
) -> None:
    from tls_certs import self_signed

    from asyncdapo.runtime.grpc_security import ClientTls, ServerTls

    cert, key = self_signed(tmp_path / "server")
    other_ca, _ = self_signed(tmp_path / "other", "someone-else")
    gw = sim_gateway_factory(tls=ServerTls.from_files(cert, key))
    async with GatewayClient(
        gw.target, token=gateway_token, tls=ClientTls.from_file(cert), timeout_s=10
    ) as c:
        r = await c.generate("tls", [1, 2], Sampling(max_tokens=4, ignore_eos=True))
        assert len(r.token_ids) == 4
        await c.pause()  # the token still guards control RPCs, over TLS
        await c.resume()
    async with GatewayClient(gw.target, tls=ClientTls.from_file(cert), timeout_s=10) as anon:
        code, _ = await _code(anon.pause())
        assert code is grpc.StatusCode.UNAUTHENTICATED
    for client in (
        GatewayClient(gw.target, timeout_s=5),  # plaintext to a TLS port
        GatewayClient(gw.target, tls=ClientTls.from_file(other_ca), timeout_s=5),  # a CA that did not sign it
    ):
        async with client:
            code, _ = await _code(client.get_load())
            assert code is grpc.StatusCode.UNAVAILABLE


def test_cli_rejects_bad_tls_files_before_starting(tmp_path: Path) -> None:
    from tls_certs import self_signed

    cert, key = self_signed(tmp_path)
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    base = [
        sys.executable,
        "-m",
        "asyncdapo.cli",
        "gateway",
        "--engine",
        "sim",
        "--port",
        "0",
        "--metrics-port",
        "0",
    ]
    for extra, message in (
        (["--tls-cert", str(cert)], "--tls-cert and --tls-key go together"),
        (["--tls-cert", str(not_pem), "--tls-key", str(key)], "holds no PEM certificate"),
        (["--tls-cert", str(cert), "--tls-key", str(tmp_path / "missing.key")], "No such file"),
    ):
        out = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr, (extra, out.returncode, out.stderr[-2000:])

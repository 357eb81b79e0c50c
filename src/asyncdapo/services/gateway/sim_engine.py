"""SIMULATOR — a token-timing simulator standing in for vLLM (`--engine sim`), for scheduler scale
tests and benchmarks only. It runs no model: token ids and log-probs are random numbers.

What it models is timing and load, like llm-d's inference simulator: continuous batching where one
decode step emits one token for every running request and takes
`base_step_s + per_seq_step_s * running` (so per-token latency grows with concurrency), a prefill
cost per admitted prompt token, at most `max_concurrency` running requests (the rest wait), a KV
cache of `kv_capacity_tokens` in blocks of `kv_block_tokens` with vLLM's admission and recompute
preemption (`sim_kv.py`: a request is admitted only while its context fits, and a running request
that needs a block when none is free preempts the newest one), and response lengths drawn from a configurable distribution
(`fixed`, `uniform` or `lognormal`; a length below max_tokens ends with EOS, finish `stop`).
Pause/abort/resume/reload and version labelling follow the same contract as the vLLM engine.

Answer-key mode (`answer_key=`, CLI `--sim-answer-key FILE --sim-accuracy P`, see `sim_answers`):
still a SIMULATOR, but each response ends in a boxed answer looked up in a key (right with
probability P), so the real verifier scores groups with real variance and the real trainer trains.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from asyncdapo.services.gateway.engine import (
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    Finish,
    PauseMode,
    PauseResult,
)
from asyncdapo.services.gateway.sim_answers import AnswerKeyError, AnswerSheet
from asyncdapo.services.gateway.sim_kv import KvCache, schedule_step, used_blocks
from asyncdapo.services.gateway.versions import RunTracker

LENGTH_DISTRIBUTIONS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class SimTiming:
    """Timing and length model of the simulator (pure; unit-tested)."""

    base_step_s: float = 0.010
    per_seq_step_s: float = 0.0002
    prefill_s_per_token: float = 0.00001
    length_dist: str = "lognormal"
    length_mean: float = 200.0
    length_sigma: float = 0.8  # lognormal: sigma of log-length; uniform: half-width / mean
    reload_s: float = 0.2
    kv_capacity_tokens: int = 1 << 20
    kv_block_tokens: int = 16  # vLLM's default block size

    def __post_init__(self) -> None:
        if self.length_dist not in LENGTH_DISTRIBUTIONS:
            raise ValueError(
                f"length_dist must be one of {', '.join(LENGTH_DISTRIBUTIONS)}, got {self.length_dist!r}"
            )
        if self.base_step_s < 0 or self.per_seq_step_s < 0 or self.prefill_s_per_token < 0:
            raise ValueError("simulator step times must be >= 0")
        if self.length_mean < 1:
            raise ValueError(f"length_mean must be >= 1, got {self.length_mean}")
        if self.length_sigma < 0:
            raise ValueError(f"length_sigma must be >= 0, got {self.length_sigma}")
        KvCache(self.kv_capacity_tokens, self.kv_block_tokens)  # raises on a cache that holds no block

    @property
    def kv(self) -> KvCache:
        return KvCache(self.kv_capacity_tokens, self.kv_block_tokens)

    def step_seconds(self, running: int, prefill_tokens: int = 0) -> float:
        """Duration of one decode step with `running` requests (plus prompts admitted this step)."""
        return self.base_step_s + self.per_seq_step_s * running + self.prefill_s_per_token * prefill_tokens

    def natural_length(self, rng: random.Random) -> int:
        """The length a response would reach without a max_tokens cap (>= 1)."""
        if self.length_dist == "fixed":
            n = self.length_mean
        elif self.length_dist == "uniform":
            half = self.length_mean * min(self.length_sigma, 1.0)
            n = rng.uniform(self.length_mean - half, self.length_mean + half)
        else:  # lognormal with the configured mean
            mu = math.log(self.length_mean) - self.length_sigma**2 / 2
            n = rng.lognormvariate(mu, self.length_sigma)
        return max(1, round(n))


class _State(Enum):
    RUNNING = "running"
    PAUSED_NEW = "paused_new"  # no admissions; running requests keep stepping (wait / abort modes)
    PAUSED_ALL = "paused_all"  # nothing steps (keep mode)


@dataclass(eq=False)  # identity: `in` / `remove` on the running list must not compare fields
class _SimRequest:
    request: EngineRequest
    rng: random.Random
    target: int  # tokens this response will have
    finish_at_target: Finish
    arrival: float
    done: asyncio.Future[EngineOutput]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: RunTracker = field(default_factory=RunTracker)
    first_token_at: float | None = None
    plan: list[int] | None = None  # answer-key mode: every token of the response, decided up front
    held_blocks: int = 0  # KV blocks held while running (sim_kv)
    preemptions: int = 0

    @property
    def context_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.tokens)


class SimulatedEngine:
    """SIMULATOR engine (see module docstring). Not a model: outputs are random numbers, or with an
    answer key, random filler ending in a looked-up (right or deliberately wrong) boxed answer."""

    def __init__(
        self,
        timing: SimTiming,
        *,
        max_concurrency: int,
        model_dir: str | None = None,
        initial_version: int = 0,
        seed: int = 0,
        answer_key: dict[str, str] | None = None,
        accuracy: float = 0.5,
    ) -> None:
        self.timing = timing
        self.max_concurrency = max_concurrency
        self.kv = timing.kv
        config = _read_config(model_dir)
        self.info = EngineInfo(
            kind="sim",
            model=model_dir or "simulator",
            max_model_len=int(config.get("max_position_embeddings", 4096)),
            vocab_size=int(config.get("vocab_size", 32000)),
        )
        if self.kv.blocks(self.info.max_model_len) > self.kv.capacity_blocks:
            # vLLM refuses to start the same way: one sequence of max_model_len must fit
            raise ValueError(
                f"the simulated KV cache ({timing.kv_capacity_tokens} tokens) cannot hold one sequence of "
                f"max_model_len {self.info.max_model_len}: raise --sim-kv-capacity-tokens"
            )
        self.preemptions = 0  # running requests sent back to wait (recompute), as vLLM counts them
        eos = config.get("eos_token_id", 0)
        self._eos = int(eos[0] if isinstance(eos, list) else eos)
        self._tokenizer = _load_tokenizer(model_dir)
        self.answers: AnswerSheet | None = None
        if answer_key is not None:
            if self._tokenizer is None:
                raise AnswerKeyError(
                    "--sim-answer-key needs --model with a tokenizer.json (to write answers)"
                )
            self.answers = AnswerSheet(
                answer_key,
                self._tokenizer,
                vocab_size=self.info.vocab_size,
                eos_token_id=self._eos,
                accuracy=accuracy,
            )
        self._rng = random.Random(seed)
        self._version = initial_version
        self._state = _State.RUNNING
        self._waiting: list[_SimRequest] = []
        self._running: list[_SimRequest] = []
        self._by_id: dict[str, _SimRequest] = {}
        self._step_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._generated_total = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    # --- Engine protocol ---

    def tokenize(self, text: str) -> list[int]:
        if self._tokenizer is not None:
            return list(self._tokenizer.encode(text).ids)
        # No tokenizer in the model dir: one token per UTF-8 byte (a simulator stand-in).
        return [b % self.info.vocab_size for b in text.encode()]

    async def generate(self, request: EngineRequest) -> EngineOutput:
        self._ensure_loop()
        context = len(request.prompt_token_ids) + request.sampling.max_tokens
        if self.kv.blocks(context) > self.kv.capacity_blocks:
            raise EngineError(
                f"request {request.request_id} may need {context} KV tokens; the simulated cache holds "
                f"{self.timing.kv_capacity_tokens} (--sim-kv-capacity-tokens)"
            )
        # A seeded request draws from its own generator (reproducible); others share the engine's,
        # which saves seeding a Mersenne Twister per request.
        seed = request.sampling.seed
        rng = random.Random(seed) if seed is not None else self._rng
        natural = self.timing.natural_length(rng)
        plan = None
        if self.answers is not None:
            sp = request.sampling
            planned = self.answers.plan(
                request.prompt_token_ids, natural, sp.max_tokens, rng,
                ignore_eos=sp.ignore_eos, stop_token_ids=sp.stop_token_ids,
            )  # fmt: skip
            plan, target, finish = planned.tokens, len(planned.tokens), planned.finish
        elif request.sampling.ignore_eos or natural >= request.sampling.max_tokens:
            target, finish = request.sampling.max_tokens, Finish.LENGTH
        else:
            target, finish = natural, Finish.STOP
        req = _SimRequest(
            request,
            rng,
            target,
            finish,
            time.monotonic(),
            asyncio.get_running_loop().create_future(),
            plan=plan,
        )
        self._by_id[request.request_id] = req
        self._waiting.append(req)
        self._wake.set()
        try:
            return await req.done
        except asyncio.CancelledError:
            self._drop(req)  # the caller's cancel also cancelled `done`
            raise

    async def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            req = self._by_id.get(rid)
            if req is not None:
                self._finish(req, Finish.ABORT)

    async def pause(self, mode: PauseMode, wait_timeout_s: float = 0.0) -> PauseResult:
        aborted = 0
        if mode is PauseMode.KEEP:
            self._state = _State.PAUSED_ALL
            async with self._step_lock:  # the step in progress completes before we return
                pass
        elif mode is PauseMode.ABORT:
            self._state = _State.PAUSED_NEW
            async with self._step_lock:
                victims = [*self._running, *self._waiting]
                for req in victims:
                    self._finish(req, Finish.ABORT)
                aborted = len(victims)
        else:
            self._state = _State.PAUSED_NEW
            self._wake.set()
            if self._running:
                self._drained.clear()
                try:
                    async with asyncio.timeout(wait_timeout_s or None):
                        await self._drained.wait()
                except TimeoutError:
                    async with self._step_lock:
                        victims = list(self._running)
                        for req in victims:
                            self._finish(req, Finish.ABORT)
                        aborted = len(victims)
        return PauseResult(aborted=aborted)

    async def resume(self) -> None:
        self._state = _State.RUNNING
        self._wake.set()

    async def load_weights(self, path: str, version: int) -> None:
        await asyncio.sleep(self.timing.reload_s)
        self._version = version

    def load(self) -> EngineLoad:
        return EngineLoad(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_cache_usage=min(1.0, used_blocks(self._running) / self.kv.capacity_blocks),
            generated_tokens_total=self._generated_total,
        )

    def is_healthy(self) -> bool:
        return not self._closed and (self._loop_task is None or not self._loop_task.done())

    async def shutdown(self) -> None:
        self._closed = True
        for req in list(self._by_id.values()):
            self._finish(req, Finish.ABORT)
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    # --- the step loop ---

    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-steps")

    def _drop(self, req: _SimRequest) -> None:
        """Forget `req` (finished or cancelled)."""
        if self._by_id.get(req.request.request_id) is req:
            del self._by_id[req.request.request_id]
        if req in self._running:
            self._running.remove(req)
            self._wake.set()  # its KV blocks are free: a waiting request may fit now
        elif req in self._waiting:
            self._waiting.remove(req)
        req.held_blocks = 0
        if not self._running:
            self._drained.set()

    def _finish(self, req: _SimRequest, finish: Finish) -> None:
        if req.done.done():
            return
        self._drop(req)
        queue_s = (req.first_token_at or time.monotonic()) - req.arrival
        req.done.set_result(EngineOutput(req.tokens, req.logprobs, finish, req.versions.runs, queue_s))

    async def _run(self) -> None:
        while not self._closed:
            admitting = self._state is _State.RUNNING and bool(self._waiting)
            if self._state is _State.PAUSED_ALL or not (self._running or admitting):
                self._wake.clear()
                await self._wake.wait()
                continue
            async with self._step_lock:
                plan = schedule_step(
                    self.kv, self._running, self._waiting, self.max_concurrency,  # type: ignore[arg-type]
                    admit=self._state is _State.RUNNING,
                )  # fmt: skip
                for req in plan.preempted:
                    req.preemptions += 1  # type: ignore[attr-defined]
                self.preemptions += len(plan.preempted)
                if not self._running:
                    if plan.preempted:
                        continue
                    # nothing fits and nothing runs: wait for a change (an abort, a new request)
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await asyncio.sleep(self.timing.step_seconds(len(self._running), plan.prefill_tokens))
                if self._state is _State.PAUSED_ALL:
                    continue  # a keep-pause arrived during the step: its tokens never happened
                now = time.monotonic()
                for req in list(self._running):
                    self._emit_token(req, now)
            await asyncio.sleep(0)

    def _emit_token(self, req: _SimRequest, now: float) -> None:
        last = len(req.tokens) + 1 == req.target
        if req.plan is not None:
            token = req.plan[len(req.tokens)]
        elif last and req.finish_at_target is Finish.STOP:
            token = self._eos
        else:
            token = req.rng.randrange(self.info.vocab_size)
        req.tokens.append(token)
        req.logprobs.append(-req.rng.expovariate(0.5))
        req.versions.add(self._version)
        self._generated_total += 1
        if req.first_token_at is None:
            req.first_token_at = now
        if token in req.request.sampling.stop_token_ids:
            self._finish(req, Finish.STOP)
        elif last:
            self._finish(req, req.finish_at_target)


def _read_config(model_dir: str | None) -> dict:
    if not model_dir:
        return {}
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _load_tokenizer(model_dir: str | None):  # -> tokenizers.Tokenizer | None
    if not model_dir or not (Path(model_dir) / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

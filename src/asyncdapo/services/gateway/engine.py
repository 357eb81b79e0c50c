"""The engine interface the gateway service drives, and the plain data that crosses it.

Two implementations: `vllm_engine.VllmEngine` (a real vLLM `AsyncLLM` in-process) and
`sim_engine.SimulatedEngine` (a token-timing simulator for scheduler scale tests; never a model).
The service owns validation, auth, request bookkeeping and metrics; an engine only generates,
aborts, pauses and reloads.

Invariants every engine keeps:
- `generate` returns (never raises) for an aborted request: the tokens produced so far and
  `Finish.ABORT`; `len(token_ids) == len(logprobs) == sum(n for _, n in version_runs)`.
- Every generated token is labelled with the weight version that produced it.
- `abort` returns promptly; the aborted `generate` calls return soon after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from asyncdapo.contracts.config import PauseMode
from asyncdapo.contracts.wire_enums import Finish
from asyncdapo.services.gateway.versions import Runs

__all__ = ["Engine", "EngineError", "EngineOutput", "Finish", "PauseMode", "PauseResult", "Sampling"]


class EngineError(RuntimeError):
    """The engine failed on a request or control call (not the caller's fault)."""


@dataclass(frozen=True)
class Sampling:
    """Validated sampling parameters (see `validation.py` for the checks)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: disabled
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]  # the prompt plus any continuation tokens
    sampling: Sampling  # max_tokens already reduced by the continuation length


@dataclass
class EngineOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish: Finish
    version_runs: Runs = field(default_factory=list)
    queue_s: float = 0.0  # arrival to first token (0 when unknown)


@dataclass(frozen=True)
class EngineInfo:
    kind: str  # "vllm" or "sim" (token-timing simulator)
    model: str
    max_model_len: int
    vocab_size: int


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int
    kv_cache_usage: float  # 0..1
    generated_tokens_total: int
    prompt_tokens_total: int = 0
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0  # of which found


@dataclass(frozen=True)
class PauseResult:
    aborted: int


@runtime_checkable
class Engine(Protocol):
    info: EngineInfo

    def tokenize(self, text: str) -> list[int]: ...

    async def generate(self, request: EngineRequest) -> EngineOutput: ...

    async def abort(self, request_ids: list[str]) -> None: ...

    async def pause(self, mode: PauseMode, wait_timeout_s: float = 0.0) -> PauseResult: ...

    async def resume(self) -> None: ...

    async def load_weights(self, path: str, version: int) -> None:
        """Reload weights in place from a (validated) safetensors directory; label later tokens
        with `version`. Called while paused; requests held by a keep-pause continue afterwards."""
        ...

    def load(self) -> EngineLoad: ...

    def is_healthy(self) -> bool: ...

    async def shutdown(self) -> None: ...

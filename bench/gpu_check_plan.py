"""What `bench/gpu_check.py` runs: the model shapes (random Qwen2.5-0.5B / 1.5B and a tiny one),
the synthetic long-tailed workload, the per-device plan (sizes, tolerances, budget priors) and the
figures one size produces."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Shape:
    """A Qwen2 model's shape (the Qwen2.5 checkpoints' config.json values)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


SHAPES = {
    "tiny": Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512),
    "0.5b": Shape(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
    "1.5b": Shape(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936),
}
# Seconds a size is expected to take on an H200 (build, warm-up and timed steps, export; the first
# size also its checks); scaled by how the sizes run so far compared with their own estimate.
PRIOR_S = {"tiny": 20.0, "0.5b": 110.0, "1.5b": 150.0}


@dataclass(frozen=True)
class Workload:
    """Synthetic groups: prompt lengths uniform, response lengths lognormal (a long tail) capped;
    the first response of each of the first `capped` groups runs to the cap (a truncated answer)."""

    groups: int
    n: int
    prompt_min: int
    prompt_max: int
    response_median: float
    response_sigma: float
    max_response_length: int
    capped: int = 1

    def batch(self, vocab: int, seed: int) -> Any:
        from asyncdapo.contracts.v1 import rollout_pb2
        from asyncdapo.services.trainer.batch import build_batch

        rng = random.Random(seed)
        groups = []
        for k in range(self.groups):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(self.prompt_min, self.prompt_max))]
            g = rollout_pb2.Group(prompt_id=f"p{k}", prompt_token_ids=prompt)
            for i in range(self.n):
                n = int(rng.lognormvariate(math.log(self.response_median), self.response_sigma))
                n = max(1, min(self.max_response_length, n))
                if i == 0 and k < self.capped:
                    n = self.max_response_length
                acc = float((i + k) % 3 == 0)  # mixed rewards within every group: non-zero advantages
                g.responses.add(
                    token_ids=[rng.randrange(3, vocab) for _ in range(n)], reward=acc, score=acc, acc=acc
                )
            groups.append(g)
        return build_batch(groups, pad_token_id=0)


@dataclass(frozen=True)
class Plan:
    """What a device runs: compute dtype, the workloads and the update settings' knobs."""

    dtype: str  # model.dtype
    train: Workload  # the throughput batch
    check: Workload  # the (smaller) batch the equality checks update on
    micro_batch_tokens: int  # the packed update's budget
    micro_batch_size: int  # the padded update's rows per micro-batch
    warmup_steps: int  # untimed
    timed_steps: int
    tol_packed: float  # relative tolerance, packed vs padded
    tol_resume_loss: float
    tol_resume_delta: float


PLANS = {
    "cuda": Plan(
        dtype="bfloat16",
        train=Workload(
            groups=8,
            n=8,
            prompt_min=64,
            prompt_max=512,
            response_median=600.0,
            response_sigma=1.0,
            max_response_length=16384,
        ),
        check=Workload(
            groups=4,
            n=4,
            prompt_min=32,
            prompt_max=256,
            response_median=300.0,
            response_sigma=0.8,
            max_response_length=1024,
        ),
        micro_batch_tokens=16384,
        micro_batch_size=4,
        warmup_steps=1,
        timed_steps=4,
        tol_packed=2e-2,
        tol_resume_loss=1e-5,
        tol_resume_delta=1e-2,
    ),
    "cpu": Plan(
        dtype="float32",
        train=Workload(
            groups=4,
            n=4,
            prompt_min=4,
            prompt_max=16,
            response_median=12.0,
            response_sigma=0.8,
            max_response_length=64,
        ),
        check=Workload(
            groups=4,
            n=4,
            prompt_min=4,
            prompt_max=16,
            response_median=10.0,
            response_sigma=0.8,
            max_response_length=48,
        ),
        micro_batch_tokens=96,
        micro_batch_size=3,
        warmup_steps=1,
        timed_steps=2,
        tol_packed=1e-5,
        tol_resume_loss=1e-6,
        tol_resume_delta=1e-5,
    ),
}


RESUME_STEPS = 2  # steps run after the restore: the second one's LR comes from the restored schedule


class CheckFailed(AssertionError):
    """A claim of this check does not hold; the message gives the measured values."""


@dataclass
class SizeResult:
    size: str
    params: int = 0
    attn_implementation: str = ""
    tok_per_s: float = 0.0
    response_tok_per_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    padded_tokens_per_step: int = 0
    peak_mem_gib: float = 0.0
    gather_s: float = 0.0
    export_s: float = 0.0
    export_gb: float = 0.0
    export_s_per_gb: float = 0.0
    wall_s: float = 0.0
    checks: dict[str, Any] = field(default_factory=dict)

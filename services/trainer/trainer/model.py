"""The policy: any Hugging Face causal-LM directory, and per-token log-probs / entropy of responses.

Parameters are kept in float32 (the optimizer's master copy); `dtype: bfloat16` (or `auto` on a
GPU) runs forward/backward under bf16 autocast, like verl's FSDP mixed precision.
Log-probs use the rollout temperature (logits / T), as verl does, so they are comparable with the
engine's sampled distribution.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from asyncdapo.errors import AsyncdapoError
from asyncdapo.trainer.algos import entropy_from_logits, log_probs_from_logits
from asyncdapo.trainer.batch import TrainBatch


class ModelDirError(AsyncdapoError, FileNotFoundError):
    """model.path is not a Hugging Face model directory."""


@dataclass(frozen=True)
class Precision:
    compute_dtype: torch.dtype  # autocast dtype (float32: no autocast)
    device: torch.device

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.compute_dtype == torch.float32:
            yield
        else:
            with torch.autocast(device_type=self.device.type, dtype=self.compute_dtype):
                yield


def resolve_precision(dtype: str, device: torch.device) -> Precision:
    if dtype == "auto":
        compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    elif dtype in ("float32", "fp32"):
        compute = torch.float32
    elif dtype in ("bfloat16", "bf16"):
        compute = torch.bfloat16
    else:
        raise ValueError(f"model.dtype must be auto|float32|bfloat16, got {dtype!r}")
    return Precision(compute, device)


def load_policy(
    path: str | Path, device: torch.device, trust_remote_code: bool = False
) -> tuple[nn.Module, Any]:
    """(model in float32 on `device`, tokenizer) from a Hugging Face directory or Hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncdapo.models import resolve_model

    path = Path(resolve_model(path, "model.path"))
    if not (path / "config.json").is_file():
        raise ModelDirError(f"model.path {path}: not a Hugging Face model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=trust_remote_code
    ).to(device)
    model.config.use_cache = False
    return model, tokenizer


def pad_token_id(tokenizer: Any) -> int:
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pid is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; cannot pad batches")
    return int(pid)


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    inner = model.module if hasattr(model, "module") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def forward_response(
    model: nn.Module,
    batch: TrainBatch,
    *,
    temperature: float,
    precision: Precision,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """(log-probs, entropy or None) of every response token, each (n, R); grads flow if enabled."""
    r_len = batch.responses.shape[1]
    kwargs: dict[str, Any] = {}
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = r_len + 1  # logits only where response tokens are predicted
    with precision.autocast():
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
            **kwargs,
        )
    logits = out.logits[:, -(r_len + 1) : -1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = log_probs_from_logits(logits, batch.responses)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs, entropy


@torch.no_grad()
def compute_log_probs(
    model: nn.Module,
    batch: TrainBatch,
    *,
    micro_batch_size: int,
    temperature: float,
    precision: Precision,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) of all rows of `batch` under `model`, in micro-batches, no grad."""
    was_training = model.training
    model.eval()
    lps, ents = [], []
    try:
        for start in range(0, batch.size, micro_batch_size):
            mb = batch.select(range(start, min(start + micro_batch_size, batch.size)))
            lp, ent = forward_response(
                model, mb, temperature=temperature, precision=precision, with_entropy=with_entropy
            )
            lps.append(lp)
            if ent is not None:
                ents.append(ent)
    finally:
        model.train(was_training)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a DistributedDataParallel wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

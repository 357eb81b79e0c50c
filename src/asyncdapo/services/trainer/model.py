"""The policy: any Hugging Face causal-LM directory, and per-token log-probs / entropy of responses.

Parameters are kept in float32 (the optimizer's master copy); `dtype: bfloat16` (or `auto` on a
GPU) runs forward/backward under bf16 autocast, like verl's FSDP mixed precision (with
`trainer.sharding: fsdp` the gathered parameters themselves are bf16, fsdp.py).
Log-probs use the rollout temperature (logits / T), as verl does, so they are comparable with the
engine's sampled distribution. They are computed in fp32 chunk by chunk along the response
(`LOGITS_CHUNK` positions): with a 150k vocabulary and 20k-token responses a whole fp32 copy of the
logits would be the update's largest tensor; a chunk's copy lives only while that chunk is computed
(and is recomputed in backward). With `packing` a micro-batch runs as one padding-free row
(packing.py) and its values come back in the padded layout.
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
from torch.utils.checkpoint import checkpoint

from asyncdapo.contracts.config import ModelDtype
from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.services.trainer.algos import entropy_from_logits, log_probs_from_logits
from asyncdapo.services.trainer.batch import TrainBatch
from asyncdapo.services.trainer.fsdp import aligned_forwards
from asyncdapo.services.trainer.packing import (
    PACKED_SDPA,
    first_fit_decreasing,
    pack_rows,
    row_tokens,
    scatter_response,
)

LOGITS_CHUNK = 4096  # response positions per fp32 log-softmax chunk


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


def resolve_precision(dtype: ModelDtype | str, device: torch.device) -> Precision:
    dtype = ModelDtype(dtype)  # a plain string is checked against the allowed values
    if dtype is ModelDtype.AUTO:
        compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    elif dtype is ModelDtype.FLOAT32:
        compute = torch.float32
    else:
        compute = torch.bfloat16
    return Precision(compute, device)


def load_policy(
    path: str | Path, device: torch.device, trust_remote_code: bool = False
) -> tuple[nn.Module, Any]:
    """(model in float32 on `device`, tokenizer) from a Hugging Face directory or Hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncdapo.runtime.models import resolve_model

    path = Path(resolve_model(path, "model.path"))
    if not (path / "config.json").is_file():
        raise ModelDirError(f"model.path {path}: not a Hugging Face model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    # transformers types `to` as @wraps(nn.Module.to) of an unbound method: mypy wants self first
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=trust_remote_code
    ).to(device)  # type: ignore[arg-type]
    model.config.use_cache = False
    return model, tokenizer


def pad_token_id(tokenizer: Any) -> int:
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pid is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; cannot pad batches")
    return int(pid)


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    inner: nn.Module = getattr(model, "module", model)  # DDP / FSDP keep the model in `.module`
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def packing_supported(model: nn.Module) -> bool:
    """Whether `model` reads packed sequences' boundaries from restarting position ids: the models
    transformers ships do (their masks and flash-attention paths detect the restarts); a model's
    own code (trust_remote_code) may not, and would attend across the packed sequences."""
    inner: nn.Module = getattr(model, "module", model)
    return type(inner).__module__.startswith("transformers.models.")


def forward_response(
    model: nn.Module,
    batch: TrainBatch,
    *,
    temperature: float,
    precision: Precision,
    with_entropy: bool,
    entropy_grad: bool = True,
    packing: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log-probs, entropy or None) of every response token, each (n, R); grads flow if enabled
    (`entropy_grad=False`: the entropy is only a metric, computed without a graph).

    `packing`: one padding-free pass over the rows packed end to end (packing.py); the values come
    back in the same (n, R) layout, 0 on padding."""
    if packing:
        return _forward_packed(
            model, batch, temperature=temperature, precision=precision,
            with_entropy=with_entropy, entropy_grad=entropy_grad,
        )  # fmt: skip
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
    logits = out.logits[:, -(r_len + 1) : -1, :]
    return _response_values(logits, batch.responses, temperature, with_entropy, entropy_grad)


def _forward_packed(
    model: nn.Module,
    batch: TrainBatch,
    *,
    temperature: float,
    precision: Precision,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    packed = pack_rows(batch)
    inner: nn.Module = getattr(model, "module", model)
    per_sequence = getattr(inner.config, "_attn_implementation", None) == PACKED_SDPA
    # PACKED_SDPA reads the boundaries on the host; flash kernels want them on the device
    kwargs: dict[str, Any] = packed.boundaries(
        torch.device("cpu") if per_sequence else packed.input_ids.device
    )
    keep = _accepts_logits_to_keep(model)
    if keep:
        kwargs["logits_to_keep"] = packed.logit_index  # logits only where response tokens are predicted
    # PACKED_SDPA: an all-ones mask, so that no (T, T) mask is built (it attends per sequence);
    # otherwise none: the model derives the boundaries from the restarting position ids
    mask = torch.ones_like(packed.input_ids) if per_sequence else None
    with precision.autocast():
        out = model(
            input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids, use_cache=False,
            **kwargs,
        )  # fmt: skip
    logits = out.logits if keep else out.logits[:, packed.logit_index]
    lp, ent = _response_values(logits, packed.labels.unsqueeze(0), temperature, with_entropy, entropy_grad)
    mask = batch.response_mask
    return scatter_response(lp[0], mask), (None if ent is None else scatter_response(ent[0], mask))


def _response_values(
    logits: Tensor, labels: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool
) -> tuple[Tensor, Tensor | None]:
    log_probs = response_log_probs(logits, labels, temperature)
    entropy = None
    if with_entropy and entropy_grad:
        entropy = response_entropy(logits, temperature)
    elif with_entropy:
        with torch.no_grad():
            entropy = response_entropy(logits.detach(), temperature)
    return log_probs, entropy


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    z = logits.float()
    return z / temperature if temperature != 1.0 else z


def _log_probs_chunk(logits: Tensor, labels: Tensor, temperature: float) -> Tensor:
    return log_probs_from_logits(_scaled(logits, temperature), labels)


def _entropy_chunk(logits: Tensor, temperature: float) -> Tensor:
    return entropy_from_logits(_scaled(logits, temperature))


def _by_chunks(fn: Any, logits: Tensor, *rest: Any, chunk: int) -> Tensor:
    n = logits.shape[1]
    if n <= chunk:
        return fn(logits, *rest)
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        args = [logits[:, sl], *(r[:, sl] if isinstance(r, Tensor) else r for r in rest)]
        parts.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return torch.cat(parts, dim=1)


def response_log_probs(
    logits: Tensor, labels: Tensor, temperature: float, chunk: int = LOGITS_CHUNK
) -> Tensor:
    """log softmax(logits / T)[labels] in fp32, `chunk` positions at a time (see the module doc)."""
    return _by_chunks(_log_probs_chunk, logits, labels, temperature, chunk=chunk)


def response_entropy(logits: Tensor, temperature: float, chunk: int = LOGITS_CHUNK) -> Tensor:
    """Entropy of softmax(logits / T) in fp32, `chunk` positions at a time."""
    return _by_chunks(_entropy_chunk, logits, temperature, chunk=chunk)


@torch.no_grad()
def compute_log_probs(
    model: nn.Module,
    batch: TrainBatch,
    *,
    micro_batch_size: int,
    temperature: float,
    precision: Precision,
    with_entropy: bool = True,
    packing: bool = False,
    micro_batch_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) of all rows of `batch` under `model`, in micro-batches, no grad:
    `micro_batch_size` rows each, or rows grouped by the `micro_batch_tokens` budget (packing.py);
    `packing`: each micro-batch in one padding-free pass."""
    was_training = model.training
    model.eval()
    tokens = row_tokens(batch, packing)
    if micro_batch_tokens is None:
        chunks = [
            list(range(s, min(s + micro_batch_size, batch.size)))
            for s in range(0, batch.size, micro_batch_size)
        ]
    else:
        chunks = first_fit_decreasing(range(batch.size), tokens, micro_batch_tokens)
    lps = torch.zeros_like(batch.response_mask)
    ents = torch.zeros_like(batch.response_mask)
    try:
        with aligned_forwards(model, len(chunks)) as n_forwards:
            for chunk in chunks:
                lp, ent = forward_response(
                    model, batch.select(chunk), temperature=temperature, precision=precision,
                    with_entropy=with_entropy, packing=packing,
                )  # fmt: skip
                idx = torch.as_tensor(chunk, device=lps.device)
                lps[idx] = lp.to(lps.dtype)
                if ent is not None:
                    ents[idx] = ent.to(ents.dtype)
            shortest = min(range(batch.size), key=lambda r: tokens[r])
            for _ in range(n_forwards - len(chunks)):  # a sharded model: match the other ranks' gathers
                forward_response(
                    model, batch.select([shortest]), temperature=temperature, precision=precision,
                    with_entropy=False, packing=packing,
                )  # fmt: skip
    finally:
        model.train(was_training)
    return lps, (ents if with_entropy else None)

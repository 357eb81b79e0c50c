"""The CPU gateway's default KV cache: fits what the node has, or says what to change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncdapo.services.gateway.kv_budget import (
    ENGINE_OVERHEAD_BYTES,
    GiB,
    KvCacheWontFit,
    per_token_kv_bytes,
    plan_kv_cache,
    weights_bytes,
)


def test_capped_by_what_the_sequences_need() -> None:
    plan = plan_kv_cache(per_token_bytes=1024, max_model_len=512, max_concurrency=64,
                         available_bytes=12 * GiB, weights_bytes=GiB)  # fmt: skip
    assert plan.kv_bytes == 64 * 512 * 1024 and plan.sequences == 64


def test_at_most_half_of_what_is_free_after_weights_and_engine() -> None:
    # a measured case: 11.63 GiB free of 12.96 on the node; a 1.2 GiB model
    avail, weights = int(11.63 * GiB), int(1.2 * GiB)
    plan = plan_kv_cache(per_token_bytes=114688, max_model_len=8192, max_concurrency=256,
                         available_bytes=avail, weights_bytes=weights)  # fmt: skip
    assert plan.kv_bytes <= (avail - weights - ENGINE_OVERHEAD_BYTES) / 2
    assert plan.kv_bytes >= (avail - weights - ENGINE_OVERHEAD_BYTES) / 2 - (1 << 20)
    assert plan.kv_bytes < avail  # what vLLM checks at start


def test_clear_error_when_one_sequence_cannot_fit() -> None:
    with pytest.raises(KvCacheWontFit, match=r"max_model_len=40960 .* Lower --max-model-len.*--kv-cache-gb"):
        plan_kv_cache(per_token_bytes=147456, max_model_len=40960, max_concurrency=64,
                      available_bytes=12 * GiB, weights_bytes=8 * GiB)  # fmt: skip


def test_model_shape_and_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
        "torch_dtype": "bfloat16",
    }))  # fmt: skip
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    assert per_token_kv_bytes(tmp_path, "float32") == 2 * 2 * 2 * 32 * 4
    assert per_token_kv_bytes(tmp_path, "auto") == 2 * 2 * 2 * 32 * 2
    assert weights_bytes(tmp_path, "auto") == 1000 and weights_bytes(tmp_path, "float32") == 2000

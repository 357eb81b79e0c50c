"""Pieces of the sharded trainer that need no process group: log-probs in fp32 chunks equal the
whole-tensor computation (values and gradients), and the memory arithmetic of the 8B example
(src/asyncdapo/services/trainer/SHARDING.md) counts Qwen3-8B's parameters exactly."""

from __future__ import annotations

import pytest
import torch

from asyncdapo.services.trainer.algos import entropy_from_logits, log_probs_from_logits
from asyncdapo.services.trainer.fsdp import count_parameters, memory_estimate
from asyncdapo.services.trainer.model import response_entropy, response_log_probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_log_probs_equal_the_whole_computation(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 37, 50, generator=gen).to(dtype).requires_grad_(True)
    labels = torch.randint(0, 50, (2, 37), generator=gen)
    whole = log_probs_from_logits(logits.float() / 0.7, labels)
    (grad_whole,) = torch.autograd.grad((whole * torch.arange(37)).sum(), logits)
    for chunk in (5, 16, 37, 64):
        part = response_log_probs(logits, labels, 0.7, chunk=chunk)
        assert torch.allclose(part, whole, atol=1e-6), chunk
        (grad,) = torch.autograd.grad((part * torch.arange(37)).sum(), logits)
        assert torch.allclose(grad.float(), grad_whole.float(), atol=1e-6), chunk
    with torch.no_grad():
        ent = response_entropy(logits, 0.7, chunk=8)
    assert torch.allclose(ent, entropy_from_logits(logits.float() / 0.7), atol=1e-5)


QWEN3_8B = dict(  # Qwen/Qwen3-8B config.json (the 8B example's model)
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
    max_position_embeddings=40960,
)  # fmt: skip


def test_memory_arithmetic_of_the_8b_example() -> None:
    from transformers import Qwen3Config

    cfg = Qwen3Config(**QWEN3_8B)
    n = count_parameters(cfg)
    assert 8.18e9 < n < 8.20e9  # Qwen3-8B: 8.19 B parameters
    shape = dict(micro_batch_size=1, prompt_length=2048, response_length=20480, activation_checkpointing=True)
    fsdp = memory_estimate(cfg, world=8, sharded=True, **shape)
    # the estimate's own parameter count (weights + grads + AdamW = 16 bytes each) matches the model
    assert fsdp.params + fsdp.grads + fsdp.optimizer == pytest.approx(16 * n / 8 / 1e9, rel=1e-3)
    ddp = memory_estimate(cfg, world=8, sharded=False, **shape)
    assert ddp.params + ddp.grads + ddp.optimizer > 130  # replicated fp32 training state alone
    assert ddp.total > 80 and fsdp.total < 60  # an 80 GB card: DDP cannot, FSDP fits with room
    no_ckpt = memory_estimate(cfg, world=8, sharded=True, **{**shape, "activation_checkpointing": False})
    assert no_ckpt.total > 80  # without activation checkpointing 22.5k-token sequences do not fit
    two = memory_estimate(cfg, world=8, sharded=True, **{**shape, "micro_batch_size": 2})
    assert 60 < two.total < 80  # micro_batch_size 2 would leave too little headroom
    # a token budget of one full sequence costs what one padded sequence does (logits: at most the
    # whole budget is response); twice the budget about what two sequences do
    one_seq = memory_estimate(cfg, world=8, sharded=True, **shape, micro_batch_tokens=2048 + 20480)
    assert one_seq.activations == pytest.approx(fsdp.activations) and one_seq.logits >= fsdp.logits
    assert one_seq.logits == pytest.approx(fsdp.logits, rel=0.12)
    small = memory_estimate(cfg, world=8, sharded=True, **shape, micro_batch_tokens=4096)
    assert small.total == pytest.approx(one_seq.total)  # a longer sequence runs alone: its size rules
    double = memory_estimate(cfg, world=8, sharded=True, **shape, micro_batch_tokens=2 * 22528)
    assert double.total == pytest.approx(two.total, rel=0.05)
    # the numbers SHARDING.md shows
    from pathlib import Path

    doc = (
        Path(__file__).resolve().parents[2] / "src" / "asyncdapo" / "services" / "trainer" / "SHARDING.md"
    ).read_text()
    for value in (fsdp.params, fsdp.optimizer, fsdp.gathered, fsdp.activations, fsdp.logits, fsdp.total,
                  ddp.params + ddp.grads + ddp.optimizer):  # fmt: skip
        assert f"{value:.1f} GB" in doc, value

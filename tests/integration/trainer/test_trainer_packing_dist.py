"""Packed, token-budgeted micro-batches (trainer.packing, trainer.micro_batch_tokens) over 2 gloo
processes on CPU, replicated (DDP) and sharded (FSDP2, also with activation checkpointing: the
recomputed layers attend per sequence too): the gradient and the loss equal the
single-process padded update with fixed-size micro-batches, although the two ranks need different
numbers of passes (the long rows all land on rank 0, whose extra passes rank 1 matches with
zero-weight ones).

Real torch.distributed (gloo over 127.0.0.1, a free port), real DDP / FSDP2, a small real Qwen2 model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncdapo.contracts.config import parse_run_config
from asyncdapo.contracts.v1 import rollout_pb2
from asyncdapo.services.trainer.algos import grpo_advantages
from asyncdapo.services.trainer.batch import build_batch
from asyncdapo.services.trainer.dist import DistContext
from asyncdapo.services.trainer.model import Precision, compute_log_probs
from asyncdapo.services.trainer.packing import row_tokens, use_packed_attention
from asyncdapo.services.trainer.update import UpdateSettings, budget_chunks, mini_batch_rows, ppo_update
from asyncdapo.tools.local.ports import free_port

CAP = 40  # responses 0 and 2 of every group reach it; 1 and 3 are a few tokens
CASES = {
    "ddp": ("ddp", False),
    "fsdp": ("fsdp", False),
    "fsdp-ac": ("fsdp", True),
}  # + activation checkpointing
PREC = Precision(torch.float32, torch.device("cpu"))


def _base_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).float()


def _groups() -> list[rollout_pb2.Group]:
    gen = torch.Generator().manual_seed(5)
    groups = []
    for k in range(4):
        g = rollout_pb2.Group(
            prompt_id=f"p{k}", prompt_token_ids=torch.randint(3, 90, (3 + 2 * k,), generator=gen).tolist()
        )
        for i in range(4):
            n = CAP if i % 2 == 0 else int(torch.randint(1, 5, (1,), generator=gen))
            g.responses.add(
                token_ids=torch.randint(3, 90, (n,), generator=gen).tolist(), reward=float((i + k) % 3 == 0)
            )
        groups.append(g)
    return groups


def _config(sharding: str, packed: bool, ac: bool = False) -> Any:
    return parse_run_config({
        "data": {"train_batch_size": 4, "max_response_length": CAP}, "rollout": {"n": 4},
        "reward": {"overlong_buffer": {"enable": False}}, "algorithm": {"loss_agg_mode": "seq-mean-token-mean"},
        "trainer": {"ppo_mini_batch_size": 2, "micro_batch_size": 3, "grad_clip": 1e9, "workers": 2,
                    "sharding": sharding, "packing": packed, "activation_checkpointing": ac,
                    "micro_batch_tokens": CAP + 12 if packed else None},
    })  # fmt: skip


class _RecordingSGD(torch.optim.SGD):
    """Keeps every parameter's whole gradient at each step (a collective when sharded); moves nothing."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        super().__init__(params, lr=0.0)  # the weights stay: each step's gradient at the same point
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad.detach()
                grads.append((g.full_tensor() if hasattr(g, "full_tensor") else g).clone())
        self.grads.append(grads)
        super().step()


def _update(model: torch.nn.Module, cfg: Any, dist: DistContext) -> tuple[dict[str, float], list[Any]]:
    batch = build_batch(_groups(), 0)
    old, _ = compute_log_probs(_base_model(), batch, micro_batch_size=16, temperature=1.0, precision=PREC)
    old = old - 0.03 * torch.arange(old.shape[1])  # ratio != 1: clipping takes part
    adv = grpo_advantages(batch.rewards, batch.group_ordinal)
    opt = _RecordingSGD(model.parameters())
    metrics = ppo_update(model, opt, batch, adv, old, UpdateSettings.from_config(cfg), dist, PREC)
    return metrics, opt.grads


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as tdist

    from asyncdapo.services.trainer.fsdp import Sharding

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist = DistContext(rank=rank, world=world)
    try:
        for name, (sharding, ac) in CASES.items():
            cfg = _config(sharding, packed=True, ac=ac)
            model = _base_model()
            use_packed_attention(model)  # as the trainer does: SDPA per sequence in packed passes
            model = Sharding(cfg.trainer, dist, torch.float32).wrap(model)
            metrics, grads = _update(model, cfg, dist)
            if rank == 0:
                torch.save({"metrics": metrics, "grads": grads}, Path(out) / f"{name}.pt")
    finally:
        tdist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("packing")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return out


def test_the_ranks_run_different_numbers_of_real_passes() -> None:
    """The setup the test relies on: rank 0 holds the long rows and needs more passes than rank 1."""
    cfg = _config("ddp", packed=True)
    batch = build_batch(_groups(), 0)
    tokens = row_tokens(batch, packing=True)
    rows = mini_batch_rows(batch, cfg.trainer.ppo_mini_batch_size)[0]
    chunks = [budget_chunks(rows, DistContext(rank=r, world=2), tokens, CAP + 12) for r in (0, 1)]
    real = [sum(1 for c in cs if c) for cs in chunks]
    assert len(chunks[0]) == len(chunks[1]) and real[0] > real[1]


@pytest.mark.parametrize("case", list(CASES))
def test_packed_budgeted_update_on_two_ranks_equals_the_padded_single_process_update(
    two_ranks: Path, case: str
) -> None:
    cfg = _config("ddp", packed=False)
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"workers": 1})})
    ref_metrics, ref_grads = _update(_base_model(), cfg, DistContext())
    got = torch.load(two_ranks / f"{case}.pt", weights_only=False)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl"):
        assert got["metrics"][key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-7), key
    assert len(got["grads"]) == len(ref_grads) == 2  # two mini-batches, two optimizer steps
    for step_got, step_ref in zip(got["grads"], ref_grads, strict=True):
        for i, (g, r) in enumerate(zip(step_got, step_ref, strict=True)):
            assert float((g - r).norm()) <= 1e-5 * float(r.norm()) + 1e-12, (case, i)
        assert any(float(r.abs().max()) > 0 for r in step_ref)

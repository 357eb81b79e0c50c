"""FSDP2 (trainer.sharding: fsdp) on CPU with 2 gloo processes: one sharded PPO update equals the
single-process update, with fp32 and with bf16 compute, with and without activation checkpointing;
the gathered checkpoint is the replicated format and loads back into shards; the gathered weights
make a valid weights snapshot.

Real torch.distributed (gloo over 127.0.0.1, a free port), real FSDP2, a small real Qwen2 model.
"""

from __future__ import annotations

import os
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
from asyncdapo.services.trainer.update import UpdateSettings, ppo_update
from asyncdapo.tools.local.ports import free_port

CASES = {  # name: (compute dtype, activation checkpointing)
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "bf16-ac": (torch.bfloat16, True),
}


def _base_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).float()


def _groups() -> list[rollout_pb2.Group]:
    gen = torch.Generator().manual_seed(1)
    groups = []
    for k in range(4):
        g = rollout_pb2.Group(
            prompt_id=f"p{k}", prompt_token_ids=torch.randint(3, 90, (3 + k,), generator=gen).tolist()
        )
        for i in range(4):
            n = int(torch.randint(2, 9, (1,), generator=gen))
            g.responses.add(
                token_ids=torch.randint(3, 90, (n,), generator=gen).tolist(), reward=float((i + k) % 3 == 0)
            )
        groups.append(g)
    return groups


def _config(sharding: str, ac: bool) -> Any:
    return parse_run_config({
        "data": {"train_batch_size": 4}, "rollout": {"n": 4}, "reward": {"overlong_buffer": {"enable": False}},
        "trainer": {"ppo_mini_batch_size": 2, "micro_batch_size": 3, "lr": 3e-3, "grad_clip": 0.5,
                    "weight_decay": 0.01, "workers": 2, "sharding": sharding, "activation_checkpointing": ac},
    })  # fmt: skip


def _inputs() -> tuple[Any, torch.Tensor, torch.Tensor]:
    batch = build_batch(_groups(), 0)
    prec = Precision(torch.float32, torch.device("cpu"))
    old, _ = compute_log_probs(_base_model(), batch, micro_batch_size=16, temperature=1.0, precision=prec)
    old = old - 0.03 * torch.arange(old.shape[1])  # ratio != 1: clipping takes part
    return batch, grpo_advantages(batch.rewards, batch.group_ordinal), old


def _update(
    model: torch.nn.Module, cfg: Any, dist: DistContext, prec: Precision
) -> tuple[dict[str, float], torch.optim.Optimizer]:
    batch, adv, old = _inputs()
    t = cfg.trainer
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    settings = UpdateSettings.from_config(cfg)
    metrics = ppo_update(model, opt, batch, adv, old, settings, dist, prec)
    return metrics, opt


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as tdist

    from asyncdapo.services.trainer.checkpoint import CheckpointStore, TrainerState
    from asyncdapo.services.trainer.fsdp import Sharding
    from asyncdapo.services.trainer.publish import write_snapshot

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist = DistContext(rank=rank, world=world)
    try:
        for name, (dtype, ac) in CASES.items():
            cfg = _config("fsdp", ac)
            sharding = Sharding(cfg.trainer, dist, dtype)
            model = sharding.wrap(_base_model())
            calls = [0]  # forwards of the first decoder layer: recomputed in backward under checkpointing
            model.model.layers[0].register_forward_pre_hook(
                lambda *_, calls=calls: calls.__setitem__(0, calls[0] + 1)
            )
            metrics, opt = _update(model, cfg, dist, Precision(dtype, torch.device("cpu")))
            metrics["layer0_forwards"] = calls[0]
            full = sharding.gather(model, opt)
            if rank == 0:
                assert full is not None
                torch.save({"model": full[0].state_dict(), "optimizer": full[1].state_dict(), "metrics": metrics},
                           Path(out) / f"{name}.pt")  # fmt: skip
            if name != "bf16":
                continue
            # the gathered state is a replicated checkpoint: save it, load it into fresh shards
            store = CheckpointStore(Path(out) / "ckpt")
            if rank == 0:
                store.save(
                    TrainerState(step=1),
                    full[0],
                    full[1],
                    torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0),
                )
                write_snapshot(full[0], None, Path(out) / "ckpt", 1, torch.bfloat16)
            tdist.barrier()
            fresh = Sharding(cfg.trainer, dist, dtype)
            model2 = fresh.wrap(_base_model())
            opt2 = torch.optim.AdamW(model2.parameters(), lr=cfg.trainer.lr)
            sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda k: 1.0)
            store.load_into(store.latest(), *fresh.loadable(model2, opt2), sched2, torch.device("cpu"))
            again = fresh.gather(model2, opt2)
            if rank == 0:
                torch.save(
                    {"model": again[0].state_dict(), "optimizer": again[1].state_dict()},
                    Path(out) / "reloaded.pt",
                )
    finally:
        tdist.destroy_process_group()


def _spawn(world: int, out: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, free_port(), str(out)), nprocs=world, join=True)


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> float:
    """‖Δa − Δb‖ / ‖Δb‖ over every parameter, Δ = after − before (the update itself)."""
    num = sum(float(((a[k].float() - base[k]) - (b[k].float() - base[k])).pow(2).sum()) for k in base)
    den = sum(float((b[k].float() - base[k]).pow(2).sum()) for k in base)
    return (num / den) ** 0.5


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _spawn(2, out)
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same sharded code in one process (a group of one): the single-process update under the
    same mixed precision (bf16 parameters for compute, fp32 master weights and reductions)."""
    out = tmp_path_factory.mktemp("fsdp1")
    _spawn(1, out)
    return out


def _reference(dtype: torch.dtype, ac: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The single-process update: the plain module (fp32 master weights, `dtype` autocast)."""
    cfg = _config("ddp", ac)
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"workers": 1})})
    model = _base_model()
    if ac:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    metrics, _ = _update(model, cfg, DistContext(), Precision(dtype, torch.device("cpu")))
    return model.state_dict(), metrics


def test_fsdp_update_equals_the_single_process_update(sharded: Path, one_process: Path) -> None:
    base = _base_model().state_dict()
    ref32, m32 = _reference(torch.float32, False)
    ref16, _ = _reference(torch.bfloat16, False)
    got = {name: torch.load(sharded / f"{name}.pt", weights_only=False) for name in CASES}
    one = {name: torch.load(one_process / f"{name}.pt", weights_only=False) for name in CASES}
    assert set(got["fp32"]["model"]) == set(base)  # the replicated names, tied head included
    moved = sum(float((ref32[k] - base[k]).pow(2).sum()) for k in base) ** 0.5
    assert moved > 1e-3  # the update moved the weights
    errors = {
        "fp32: 2 ranks vs the plain single-process update": _rel(got["fp32"]["model"], ref32, base),
        "bf16: 2 ranks vs 1 process": _rel(got["bf16"]["model"], one["bf16"]["model"], base),
        "bf16 + activation checkpointing vs bf16": _rel(got["bf16-ac"]["model"], got["bf16"]["model"], base),
        # for scale: what bf16 compute itself changes (not sharding): bf16 vs fp32, autocast vs fp32
        "bf16 2 ranks vs fp32 1 process": _rel(got["bf16"]["model"], ref32, base),
        "bf16 autocast vs fp32, 1 process": _rel(ref16, ref32, base),
    }
    print({k: f"{v:.2e}" for k, v in errors.items()})
    assert errors["fp32: 2 ranks vs the plain single-process update"] < 1e-4, errors
    # bf16: each rank's micro-batch gradients are rounded to bf16 before the fp32 reduce, so the
    # sum differs in the last bf16 bits, and AdamW's first steps (~sign(g)) amplify that for the
    # near-zero gradients; sharding must change the update less than bf16 compute itself does.
    bf16_itself = errors["bf16 autocast vs fp32, 1 process"]
    assert errors["bf16: 2 ranks vs 1 process"] < min(5e-2, bf16_itself), errors
    assert errors["bf16 + activation checkpointing vs bf16"] < 1e-4, errors
    ac, plain = got["bf16-ac"]["metrics"]["layer0_forwards"], got["bf16"]["metrics"]["layer0_forwards"]
    assert ac == 2 * plain > 0  # checkpointing was on: every layer forward ran again in backward
    assert errors["bf16 2 ranks vs fp32 1 process"] < 0.15, errors  # bf16 rounding, AdamW-normalised
    # the global gradient norm (clipped: grad_clip 0.5) and the loss agree too
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/pg_clipfrac"):
        assert got["fp32"]["metrics"][key] == pytest.approx(m32[key], rel=1e-4, abs=1e-6), key
        assert got["bf16"]["metrics"][key] == pytest.approx(
            one["bf16"]["metrics"][key], rel=1e-2, abs=1e-4
        ), key
    assert m32["actor/grad_norm"] > 0.5  # clipping was active
    # fp32 master weights and optimizer state (also when computing in bf16)
    assert all(v.dtype == torch.float32 for v in got["bf16"]["model"].values())
    state = got["bf16"]["optimizer"]["state"]
    assert len(state) == len(list(_base_model().parameters()))
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_gathered_checkpoint_loads_back_into_shards_and_snapshots(sharded: Path) -> None:
    saved = torch.load(sharded / "bf16.pt", weights_only=False)
    reloaded = torch.load(sharded / "reloaded.pt", weights_only=False)
    for k, v in saved["model"].items():
        assert torch.equal(reloaded["model"][k], v), k
    for i, s in saved["optimizer"]["state"].items():
        assert torch.equal(reloaded["optimizer"]["state"][i]["exp_avg_sq"], s["exp_avg_sq"]), i
    # the checkpoint is the replicated format: a plain module and a plain AdamW load it as is
    ckpt = sharded / "ckpt" / "checkpoints"
    (step,) = sorted(ckpt.glob("step-*"))
    plain = _base_model()
    plain.load_state_dict(torch.load(step / "model.pt", weights_only=True))
    opt = torch.optim.AdamW(plain.parameters())
    opt.load_state_dict(torch.load(step / "optimizer.pt", weights_only=True))
    # the weights snapshot is a Hugging Face directory with the gathered weights
    from transformers import AutoModelForCausalLM

    snap = AutoModelForCausalLM.from_pretrained(sharded / "ckpt" / "weights" / "v1", dtype=torch.float32)
    for k, v in snap.state_dict().items():
        assert torch.equal(v, saved["model"][k].to(torch.bfloat16).float()), k


# ----------------------------------------------------------------------------- old log-probs


def _fallback_worker(rank: int, world: int, port: int, out: str) -> None:
    """old_log_prob rollout on a sharded model where only rank 1 has rows without behaviour
    log-probs: rank 0 must still join the forward passes (one row), or rank 1's all-gathers hang."""
    import torch.distributed as tdist

    from asyncdapo.contracts.config import OldLogProbSource
    from asyncdapo.services.trainer.fsdp import Sharding
    from asyncdapo.services.trainer.update import old_log_probs, rows_of_rank

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist = DistContext(rank=rank, world=world)
    try:
        cfg = _config("fsdp", False)
        model = Sharding(cfg.trainer, dist, torch.float32).wrap(_base_model())
        batch = build_batch(_fallback_groups(), 0)
        mine = rows_of_rank(batch, cfg.trainer.ppo_mini_batch_size, dist)
        calls: list[list[int]] = []
        prec = Precision(torch.float32, torch.device("cpu"))

        def recompute(rows: list[int], with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
            calls.append(rows)
            lp, _ = compute_log_probs(model, batch.select(rows), micro_batch_size=2, temperature=1.0,
                                      precision=prec, with_entropy=with_entropy)  # fmt: skip
            full = torch.zeros_like(batch.response_mask)
            full[rows] = lp
            return full, torch.zeros_like(full)

        old, _, fallback = old_log_probs(OldLogProbSource.ROLLOUT, batch, mine, recompute)
        torch.save(
            {"old": old, "mine": mine, "calls": calls, "fallback": fallback}, Path(out) / f"rank{rank}.pt"
        )
    finally:
        tdist.destroy_process_group()


FALLBACK_ROWS = (1, 3, 5)  # rows of rank 1 (rank r owns rows[r::2] of each mini-batch)


def _fallback_groups() -> list[rollout_pb2.Group]:
    """_groups() with behaviour log-probs -1 on every token, except the responses of FALLBACK_ROWS."""
    groups = _groups()
    for i, r in enumerate(x for g in groups for x in g.responses):
        if i not in FALLBACK_ROWS:
            r.logprobs[:] = [-1.0] * len(r.token_ids)
    return groups


def test_rollout_log_prob_fallback_runs_on_every_rank_of_a_sharded_model(
    tmp_path: Path,
) -> None:
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_fallback_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["calls"] == [r0["mine"][:1]]  # nothing of its own to recompute: one row, in step
    assert r1["calls"] == [list(FALLBACK_ROWS)]
    assert r0["fallback"] == r1["fallback"] == list(FALLBACK_ROWS)
    batch = build_batch(_fallback_groups(), 0)
    prec = Precision(torch.float32, torch.device("cpu"))
    expected, _ = compute_log_probs(
        _base_model(), batch, micro_batch_size=16, temperature=1.0, precision=prec
    )
    mask = batch.response_mask.bool()
    for row in FALLBACK_ROWS:  # the current weights' values, as one process computes them
        assert torch.allclose(r1["old"][row][mask[row]], expected[row][mask[row]], atol=1e-5), row
    for row in r0["mine"]:  # the engine's values
        assert torch.equal(r0["old"][row][mask[row]], torch.full((int(mask[row].sum()),), -1.0)), row

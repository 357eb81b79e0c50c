"""The trainer's GPU path on one device (`make gpu-check`; docs/gpu-check.md).

What runs is the trainer's own code, nothing re-implemented: a Qwen2-architecture policy initialised
at random (Qwen2.5-0.5B and -1.5B shapes, no download) is sharded with FSDP2 by `Sharding.wrap`
(fsdp.py: a torch.distributed group of one, NCCL on a GPU, gloo on the CPU), trained by `ppo_update`
(update.py: DAPO's token-mean, clip-higher loss) on synthetic long-tailed batches (random token ids,
lognormal response lengths), checkpointed and restored by `CheckpointStore` (checkpoint.py, through
`Sharding.gather` / `Sharding.loadable` as the trainer does) and exported by `write_snapshot`
(publish.py: the safetensors directory a gateway loads).

Per model size it measures:
- tokens/s: real (prompt + response) tokens trained / wall seconds of `ppo_update`, over the steps
  after a warm-up step, with the settings a GPU run uses (`trainer.packing`, a `micro_batch_tokens`
  budget, bf16 compute);
- peak memory: the CUDA allocator's peak over those steps (on the CPU: the process's peak RSS);
- export: seconds per GB (1e9 bytes) that `write_snapshot` takes for the gathered weights.

And proves on the first size that runs (the claims do not depend on the size):
- packed == padded: one update of the same weights on the same batch, padded rows vs packed
  sequences under a token budget; its loss and gradient norm agree within 2e-2 in bf16 on a GPU, 1e-5
  in float32 on the CPU;
- resume == continue: after step k the state is checkpointed; steps k+1 and k+2 run on the live
  model and, after a fresh model, optimizer and LR schedule (another seed) are restored from the
  checkpoint, again on the restored ones. Step k+1's loss must be the same (same weights, same
  kernels) and the weight change of the two steps the same within 1e-2 (GPU: the backward's
  summation order is not fixed) / 1e-5 (CPU): that change depends on AdamW's moments and, in step
  k+2, on the LR schedule's step, so it fails if either was not restored.

The sizes run in order within `--budget-s`; a size whose estimated cost no longer fits is skipped and
reported as `skipped`, never left out. The last line is `RESULT key=value …`; with `--out` (default:
$OUT) a JSON line with every figure is appended to gpu_check.jsonl there. Exit status 1 when a check
fails, a size errs or no size ran.

`--device cpu --size tiny`: the same code on a tiny Qwen2 in float32 (gloo), seconds on a laptop CPU;
the tests run it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from gpu_check_plan import (
    PLANS,
    PRIOR_S,
    RESUME_STEPS,
    SHAPES,
    CheckFailed,
    Plan,
    Shape,
    SizeResult,
    Workload,
)

if TYPE_CHECKING:
    from asyncdapo.services.trainer.fsdp import Sharding

GB = 1e9
GIB = float(1 << 30)


# --- the pieces, each the trainer's own code -------------------------------------------------------


def run_config(plan: Plan, workload: Workload, *, packing: bool, lr: float) -> Any:
    from asyncdapo.contracts.config import parse_run_config

    return parse_run_config({
        "name": "gpu-check", "model": {"dtype": plan.dtype},
        "data": {"train_batch_size": workload.groups, "max_prompt_length": workload.prompt_max,
                 "max_response_length": workload.max_response_length},
        "rollout": {"n": workload.n},
        "reward": {"overlong_buffer": {"enable": False}},
        "trainer": {"ppo_mini_batch_size": max(1, workload.groups // 2), "micro_batch_size": plan.micro_batch_size,
                    "packing": packing, "micro_batch_tokens": plan.micro_batch_tokens if packing else None,
                    "lr": lr, "warmup_steps": 10, "sharding": "fsdp"},
    })  # fmt: skip


def build_model(shape: Shape, device: torch.device, seed: int) -> torch.nn.Module:
    """A Qwen2ForCausalLM with `shape`, random weights in float32 (the master copy), on `device`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_cache=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    with device:  # initialised where it trains: a 1.5B model's init on the CPU alone takes ~20 s
        model = Qwen2ForCausalLM(cfg)
    return model.float()


@dataclass
class Policy:
    """The policy as the trainer holds it: FSDP2-sharded module, AdamW, LR schedule."""

    sharding: Sharding
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any


def make_policy(cfg: Any, shape: Shape, dist: Any, precision: Any, seed: int) -> Policy:
    from asyncdapo.services.trainer.fsdp import Sharding
    from asyncdapo.services.trainer.lr_schedule import make_lr_scheduler
    from asyncdapo.services.trainer.packing import use_packed_attention

    t = cfg.trainer
    model = build_model(shape, dist.device, seed)
    if t.packing:  # as the trainer's setup does: SDPA attends sequence by sequence in packed passes
        use_packed_attention(model)
    sharding = Sharding(t, dist, precision.compute_dtype)
    model = sharding.wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    return Policy(sharding, model, optimizer, make_lr_scheduler(optimizer, t))


def update(policy: Policy, cfg: Any, batch: Any, adv: torch.Tensor, old: torch.Tensor, dist: Any,
           precision: Any) -> dict[str, float]:  # fmt: skip
    from asyncdapo.services.trainer.update import UpdateSettings, ppo_update

    settings = UpdateSettings.from_config(cfg)
    return ppo_update(policy.model, policy.optimizer, batch, adv, old, settings, dist, precision)


def train_step(policy: Policy, cfg: Any, batch: Any, adv: torch.Tensor, old: torch.Tensor, dist: Any,
               precision: Any) -> dict[str, float]:  # fmt: skip
    """One training step's update and LR-schedule step, as the trainer's loop runs them."""
    metrics = update(policy, cfg, batch, adv, old, dist, precision)
    policy.lr_scheduler.step()
    return metrics


def inputs(
    batch: Any, vocab: int, device: torch.device, old: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(GRPO advantages, old log-probs) on `device`. Without `old`: the log-prob of a uniform
    policy, which a randomly initialised model is close to (ratios near 1, as at a real step)."""
    from asyncdapo.services.trainer.algos import grpo_advantages

    adv = grpo_advantages(batch.rewards, batch.group_ordinal).to(device)
    if old is None:
        old = torch.full(batch.response_mask.shape, -math.log(vocab))
    return adv, (old * batch.response_mask).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # KiB on Linux


def close(a: float, b: float, tol: float, scale: float = 0.0) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tol * max(abs(a), abs(b), scale)


def relative_change_error(
    base: dict[str, torch.Tensor], a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]
) -> float:
    """‖Δa − Δb‖ / ‖Δa‖ over every tensor, Δ = after − base: how differently one step moved the weights."""
    num = den = 0.0
    for k, w in base.items():
        da = a[k].double() - w.double()
        num += float((da - (b[k].double() - w.double())).pow(2).sum())
        den += float(da.pow(2).sum())
    if den == 0.0:
        raise CheckFailed("the step did not change the weights: nothing to compare")
    return math.sqrt(num / den)


# --- the phases ----------------------------------------------------------------------------------


def check_packed_equals_padded(
    plan: Plan, shape: Shape, dist: Any, precision: Any, res: SizeResult, seed: int
) -> bool:
    """One update, padded vs packed under a token budget, from the same weights on the same batch."""
    from asyncdapo.services.trainer.model import compute_log_probs

    batch = plan.check.batch(shape.vocab, seed=seed + 1)
    padded = run_config(plan, plan.check, packing=False, lr=1e-5)
    packed = run_config(plan, plan.check, packing=True, lr=1e-5)
    policy = make_policy(packed, shape, dist, precision, seed)  # its padded passes are plain SDPA
    # lr 0 (and no schedule step): the weights stay put, so both updates start from the same ones
    for group in policy.optimizer.param_groups:
        group["lr"] = 0.0
    dev_batch = batch.to(dist.device)
    lp, _ = compute_log_probs(
        policy.model, dev_batch, micro_batch_size=plan.micro_batch_size, temperature=1.0,
        precision=precision, with_entropy=False,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    old = lp.cpu() + 0.1 * torch.randn(lp.shape, generator=gen)  # ratios != 1: the clip takes part
    adv, old = inputs(batch, shape.vocab, dist.device, old)
    a = update(policy, padded, batch, adv, old, dist, precision)
    b = update(policy, packed, batch, adv, old, dist, precision)
    scale = float(adv.abs().mean())  # the loss's natural size (it can be near 0 itself)
    ok = close(a["actor/pg_loss"], b["actor/pg_loss"], plan.tol_packed, scale) and close(
        a["actor/grad_norm"], b["actor/grad_norm"], plan.tol_packed
    )
    res.checks["packed"] = {
        "equal": ok, "tol": plan.tol_packed, "rows": batch.size,
        "padded": {"pg_loss": a["actor/pg_loss"], "grad_norm": a["actor/grad_norm"]},
        "packed": {"pg_loss": b["actor/pg_loss"], "grad_norm": b["actor/grad_norm"]},
    }  # fmt: skip
    print(f"  packed vs padded: pg_loss {a['actor/pg_loss']:.6g} vs {b['actor/pg_loss']:.6g}, grad_norm "
          f"{a['actor/grad_norm']:.6g} vs {b['actor/grad_norm']:.6g} (tol {plan.tol_packed:g}): "
          f"{'equal' if ok else 'DIFFERENT'}", flush=True)  # fmt: skip
    del policy
    free(dist.device)
    return ok


def check_resume(
    plan: Plan, shape: Shape, dist: Any, precision: Any, policy: Policy, cfg: Any, step: int,
    work: Path, res: SizeResult, seed: int,
) -> bool:  # fmt: skip
    """Checkpoint after `step` and continue RESUME_STEPS steps; restore a fresh policy from the
    checkpoint and run the same steps: the same losses and weight changes."""
    from asyncdapo.services.trainer.checkpoint import CheckpointStore, TrainerState
    from asyncdapo.services.trainer.fsdp import unwrap

    batch = plan.check.batch(shape.vocab, seed=seed + 2)
    adv, old = inputs(batch, shape.vocab, dist.device)
    store = CheckpointStore(work / "ckpt", writer="gpu-check")
    t0 = time.perf_counter()
    full = policy.sharding.gather(policy.model, policy.optimizer)
    model_view, optim_view = full or (unwrap(policy.model), policy.optimizer)
    path = store.save(TrainerState(step=step), model_view, optim_view, policy.lr_scheduler)
    before = {k: v.detach().cpu().clone() for k, v in model_view.state_dict().items()}
    save_s = time.perf_counter() - t0
    del full, model_view, optim_view

    a = [train_step(policy, cfg, batch, adv, old, dist, precision) for _ in range(RESUME_STEPS)]
    after_a = policy.sharding.gather(policy.model, policy.optimizer)
    assert after_a is not None, "an FSDP model on rank 0 gathers its state"
    cont = {k: v.detach().cpu().clone() for k, v in after_a[0].state_dict().items()}
    del after_a
    # the restart: nothing of the live policy survives; another seed, so only the checkpoint can
    # make the fresh model equal
    policy.model = policy.optimizer = policy.lr_scheduler = None  # type: ignore[assignment]
    free(dist.device)
    t0 = time.perf_counter()
    fresh = make_policy(cfg, shape, dist, precision, seed + 1000)
    state = store.load_into(
        path, *fresh.sharding.loadable(fresh.model, fresh.optimizer), fresh.lr_scheduler, dist.device
    )
    load_s = time.perf_counter() - t0
    b = [train_step(fresh, cfg, batch, adv, old, dist, precision) for _ in range(RESUME_STEPS)]
    after_b = fresh.sharding.gather(fresh.model, fresh.optimizer)
    assert after_b is not None, "an FSDP model on rank 0 gathers its state"
    restored = {k: v.detach().cpu().clone() for k, v in after_b[0].state_dict().items()}
    del after_b, fresh
    free(dist.device)

    scale = float(adv.abs().mean())
    loss_a, loss_b = [m["actor/pg_loss"] for m in a], [m["actor/pg_loss"] for m in b]
    # the first step's loss is computed at the restored weights; later ones also depend on the
    # restored optimizer (and the second step's LR on the restored schedule), as the weights do
    loss_ok = close(loss_a[0], loss_b[0], plan.tol_resume_loss, scale)
    delta_err = relative_change_error(before, cont, restored)
    ok = state.step == step and loss_ok and delta_err <= plan.tol_resume_delta
    res.checks["resume"] = {
        "equal": ok, "step": step, "restored_step": state.step, "save_s": save_s, "load_s": load_s,
        "checkpoint_gb": sum(f.stat().st_size for f in path.iterdir()) / GB,
        "pg_loss": [loss_a, loss_b], "grad_norm": [[m["actor/grad_norm"] for m in a], [m["actor/grad_norm"] for m in b]],
        "weight_change_rel_error": delta_err, "tol_loss": plan.tol_resume_loss, "tol_delta": plan.tol_resume_delta,
    }  # fmt: skip
    print(f"  resume after step {step}: pg_loss {loss_a[0]:.8g} continued vs {loss_b[0]:.8g} restored; the "
          f"weight change of {RESUME_STEPS} steps differs by {delta_err:.2e} (tol {plan.tol_resume_delta:g}); "
          f"save {save_s:.1f}s load {load_s:.1f}s: {'equal' if ok else 'DIFFERENT'}", flush=True)  # fmt: skip
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    return ok


def export(policy: Policy, precision: Any, work: Path, version: int, res: SizeResult) -> None:
    """`write_snapshot` of the gathered weights (as the trainer publishes), timed; then read back."""
    from safetensors import safe_open

    from asyncdapo.services.trainer.fsdp import unwrap
    from asyncdapo.services.trainer.publish import write_snapshot

    t0 = time.perf_counter()
    full = policy.sharding.gather(policy.model, policy.optimizer)
    res.gather_s = time.perf_counter() - t0
    view = full[0] if full else unwrap(policy.model)
    t0 = time.perf_counter()
    path = write_snapshot(view, None, work / "export", version, precision.compute_dtype, writer="gpu-check")
    res.export_s = time.perf_counter() - t0
    files = sorted(path.glob("*.safetensors"))
    res.export_gb = sum(f.stat().st_size for f in path.iterdir()) / GB
    res.export_s_per_gb = res.export_s / res.export_gb
    # what a gateway reads: Hugging Face names (the tied head once), the compute dtype
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                names.add(k)
                if (
                    st.get_slice(k).get_dtype()
                    != {torch.bfloat16: "BF16", torch.float32: "F32"}[precision.compute_dtype]
                ):
                    raise CheckFailed(f"snapshot tensor {k} is {st.get_slice(k).get_dtype()}")
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") != "qwen2" or "packed" in json.dumps(config):
        raise CheckFailed(f"snapshot config.json is not a plain Qwen2 config: {config}")
    expected = {k for k in view.state_dict() if k != "lm_head.weight"}
    if not files or names != expected:
        raise CheckFailed(f"snapshot names differ from the model's: {sorted(names ^ expected)[:5]}")
    print(f"  export: gather {res.gather_s:.1f}s, write_snapshot {res.export_gb:.2f} GB in {res.export_s:.1f}s "
          f"= {res.export_s_per_gb:.2f} s/GB", flush=True)  # fmt: skip
    del full, view
    shutil.rmtree(work / "export", ignore_errors=True)


def run_size(
    size: str, plan: Plan, dist: Any, precision: Any, work: Path, with_checks: bool, deadline: float,
    seed: int = 0,
) -> SizeResult:  # fmt: skip
    shape = SHAPES[size]
    res = SizeResult(size)
    t_start = time.perf_counter()
    print(f"{size}: {shape}", flush=True)
    if with_checks:
        res.checks["packed_equal"] = check_packed_equals_padded(plan, shape, dist, precision, res, seed)

    cfg = run_config(plan, plan.train, packing=True, lr=1e-5)
    policy = make_policy(cfg, shape, dist, precision, seed)
    res.params = sum(p.numel() for p in policy.model.parameters())
    res.attn_implementation = str(getattr(policy.model.config, "_attn_implementation", ""))
    batch = plan.train.batch(shape.vocab, seed=seed + 3)
    adv, old = inputs(batch, shape.vocab, dist.device)
    res.tokens_per_step = int(batch.attention_mask.sum()) * cfg.trainer.ppo_epochs
    res.padded_tokens_per_step = int(batch.input_ids.numel()) * cfg.trainer.ppo_epochs
    response_tokens = int(batch.response_mask.sum()) * cfg.trainer.ppo_epochs
    print(f"  {res.params / 1e6:,.1f}M parameters, attention {res.attn_implementation}; batch {batch.size} rows, "
          f"{res.tokens_per_step} tokens ({res.padded_tokens_per_step} padded), longest response "
          f"{int(batch.response_lengths.max())}", flush=True)  # fmt: skip
    if dist.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dist.device)
    step = 0
    for _ in range(plan.warmup_steps):
        train_step(policy, cfg, batch, adv, old, dist, precision)
        step += 1
    for i in range(plan.timed_steps):
        if i > 0 and time.perf_counter() + (res.step_s[-1] if res.step_s else 0.0) > deadline:
            print(f"  budget: stopping after {i} timed step(s)", flush=True)
            break
        sync(dist.device)
        t0 = time.perf_counter()
        m = train_step(policy, cfg, batch, adv, old, dist, precision)
        sync(dist.device)
        res.step_s.append(time.perf_counter() - t0)
        step += 1
        if not math.isfinite(m["actor/grad_norm"]):
            raise CheckFailed(f"step {step}: gradient norm {m['actor/grad_norm']}")
    res.peak_mem_gib = peak_memory_gib(dist.device)
    wall = sum(res.step_s)
    res.tok_per_s = res.tokens_per_step * len(res.step_s) / wall
    res.response_tok_per_s = response_tokens * len(res.step_s) / wall
    print(f"  {len(res.step_s)} timed step(s) {', '.join(f'{s:.2f}' for s in res.step_s)} s: "
          f"{res.tok_per_s:,.0f} tokens/s ({res.response_tok_per_s:,.0f} response tokens/s), peak "
          f"{res.peak_mem_gib:.1f} GiB", flush=True)  # fmt: skip
    export(policy, precision, work, step, res)
    if with_checks:
        res.checks["resume_equal"] = check_resume(
            plan, shape, dist, precision, policy, cfg, step, work, res, seed
        )
    del policy
    free(dist.device)
    res.wall_s = time.perf_counter() - t_start
    return res


# --- the tool ------------------------------------------------------------------------------------


def key(size: str) -> str:
    return size.replace(".", "_")


def result_line(device_name: str, sizes: list[str], done: dict[str, SizeResult], skipped: list[str],
                errors: dict[str, str], checks_on: str) -> str:  # fmt: skip
    fields: dict[str, str] = {"gpu": device_name}
    for s in sizes:
        r = done.get(s)
        state = "skipped" if s in skipped else "error"
        fields[f"model_{key(s)}_tok_per_s"] = f"{r.tok_per_s:.0f}" if r else state
    for s in sizes:
        r = done.get(s)
        state = "skipped" if s in skipped else "error"
        fields[f"peak_mem_gib_{key(s)}"] = f"{r.peak_mem_gib:.2f}" if r else state
    exported = [done[s] for s in sizes if s in done]
    fields["export_s_per_gb"] = f"{exported[-1].export_s_per_gb:.3f}" if exported else "na"
    for name in ("packed_equal", "resume_equal"):
        r = done.get(checks_on)
        fields[name] = str(int(r.checks[name])) if r and name in r.checks else "na"
    fields["checks_on"] = key(checks_on) if checks_on else "none"
    fields["skipped"] = ",".join(key(s) for s in skipped) or "none"
    fields["errors"] = ",".join(key(s) for s in errors) or "none"
    return "RESULT " + " ".join(f"{k}={v}" for k, v in fields.items())


@contextlib.contextmanager
def work_dir(path: str | None) -> Iterator[Path]:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="auto: cuda when available")  # fmt: skip
    ap.add_argument("--size", default=None,
                    help="comma-separated, run in order: tiny, 0.5b, 1.5b (default: 0.5b,1.5b on cuda, tiny on cpu)")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the whole check")
    ap.add_argument(
        "--steps", type=int, default=None, help="timed steps per size (default: the device's plan)"
    )
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: 1 with --device cpu, which suits a shared small box; torch's own on cuda)")  # fmt: skip
    ap.add_argument(
        "--work-dir", default=None, help="checkpoints and snapshots (default: a temporary directory)"
    )
    ap.add_argument("--out", default=os.environ.get("OUT"), help="append a JSON line to OUT/gpu_check.jsonl")
    args = ap.parse_args(argv)
    t_begin = time.perf_counter()
    deadline = t_begin + args.budget_s

    kind = args.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        print("gpu-check: --device cuda, but torch sees no CUDA device (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda})", file=sys.stderr)  # fmt: skip
        return 2
    sizes = (args.size or ("0.5b,1.5b" if kind == "cuda" else "tiny")).split(",")
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        print(
            f"gpu-check: --size {','.join(unknown)}: unknown; choose from {', '.join(SHAPES)}",
            file=sys.stderr,
        )
        return 2
    plan = PLANS[kind]
    threads = args.threads if args.threads is not None else (1 if kind == "cpu" else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    if args.steps is not None:
        plan = replace(plan, timed_steps=max(1, args.steps))

    from asyncdapo.contracts.config import ModelDtype
    from asyncdapo.services.trainer.dist import DistContext
    from asyncdapo.services.trainer.model import resolve_precision

    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    device_name = torch.cuda.get_device_name(device).replace(" ", "_") if kind == "cuda" else "cpu"
    dist = DistContext(device=device)
    precision = resolve_precision(ModelDtype(plan.dtype), device)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # save_pretrained's per-shard bar
    print(f"gpu-check on {device_name}: torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
          f"{transformers.__version__}, Python {sys.version.split()[0]}; sizes {','.join(sizes)}, "
          f"compute {precision.compute_dtype}, budget {args.budget_s:.0f}s", flush=True)  # fmt: skip

    done: dict[str, SizeResult] = {}
    skipped: list[str] = []
    errors: dict[str, str] = {}
    checks_on = ""
    slowdown = 1.0  # measured / estimated wall time of the sizes run so far
    with work_dir(args.work_dir) as work:
        for size in sizes:
            left = deadline - time.perf_counter()
            estimate = PRIOR_S[size] * slowdown
            if estimate > left:
                print(
                    f"{size}: skipped, ~{estimate:.0f}s estimated, {left:.0f}s of the budget left", flush=True
                )
                skipped.append(size)
                continue
            with_checks = not checks_on
            try:
                r = run_size(size, plan, dist, precision, work, with_checks, deadline)
            except Exception as err:  # the tool's boundary: report the size as failed, go on
                traceback.print_exc()
                errors[size] = f"{type(err).__name__}: {err}"
                free(device)
                continue
            done[size] = r
            if with_checks:
                checks_on = size
            slowdown = max(slowdown, r.wall_s / PRIOR_S[size])

    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.destroy_process_group()
    line = result_line(device_name, sizes, done, skipped, errors, checks_on)
    record = {
        "device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "python": sys.version.split()[0], "budget_s": args.budget_s,
        "wall_s": time.perf_counter() - t_begin, "sizes": {s: r.__dict__ for s, r in done.items()},
        "skipped": skipped, "errors": errors, "result": line,
    }  # fmt: skip
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with (Path(args.out) / "gpu_check.jsonl").open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")
    failed = (
        not done
        or bool(errors)
        or any(
            r.checks.get(name) is False for r in done.values() for name in ("packed_equal", "resume_equal")
        )
    )
    print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

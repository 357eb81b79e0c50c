"""Trainer step-time split on the tiny model (`make bench-trainer`).

A real trainer (real redis-server, real checkpoints and safetensors snapshots, Redis weight
announcements) trains `--steps` steps of B groups x n responses. The groups are SYNTHETIC: random
tokens of the tiny model's vocabulary with lognormal lengths and 0/1 rewards (content does not
change the cost of a step). By default they are all queued before the run, so `wait` is only the
trainer's own read cost; `--groups-per-s R` instead feeds them from a producer thread at R groups/s,
showing how the split moves when rollout is the bottleneck.

Baseline, measured in the same run on the same batch: the bare update (old-log-prob pass + PPO
mini/micro-batch update, no Redis, no checkpoint, no publish). `overhead_ratio = step_s /
bare_update_s` is what the trainer's I/O and bookkeeping cost on top of the math. The bare update is
also timed with `algorithm.old_log_prob: rollout` (the engines' log-probs, no pass before the update),
alternating with the default `recompute` on the same batch and weights: `rollout_saving` is the
share of the bare update's CPU time that the skipped pass costs.

Packed vs padded (`trainer.packing`, `trainer.micro_batch_tokens`), on a long-tailed batch: response
lengths drawn from the simulator's workload model (the `rollpacker-14b` preset, its brief-answer
share and cap set to bench-longtail's measured train-v0.3 figures: a 512-token cap that half the
responses reach, mean ~317 tokens; prompts as the `tiny-longtail` preset, ~30 tokens), 8 groups of
8 on the same tiny model. The same PPO update (old log-probs given, one optimizer step per 2
groups) runs padded (`micro_batch_size` 8 rows, every row the batch's full width) and packed
(one padding-free row per micro-batch, a token budget of the same 8 padded rows' tokens), each
from the same weights, 3 repetitions interleaved (ABBA...). Measured: trained (response) tokens per
CPU-second of the process (`time.process_time`: CPU, not wall, so other load on the machine
slows neither side's figure much), median and spread; the share of the tokens each forward computes
that are padding (counted at the model's input); and the relative difference of their losses.
Goal: packed >= 1.5x padded.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch


def synthetic_group(
    rng: random.Random, run: str, pid: str, vocab: int, eos: int, n: int, max_len: int
) -> Any:
    from asyncdapo.contracts.v1 import common_pb2, rollout_pb2

    g = rollout_pb2.Group(run=run, prompt_id=pid, prompt_token_ids=[rng.randrange(3, vocab) for _ in range(24)],
                          ground_truth="0", min_version=0, max_version=0)  # fmt: skip
    for i in range(n):
        length = max(1, min(max_len, int(rng.lognormvariate(2.8, 0.5))))
        toks = [rng.randrange(3, vocab) for _ in range(length - 1)] + [eos]
        acc = float(i % 2)
        g.responses.add(
            token_ids=toks, logprobs=[-3.0] * length,
            version_runs=[common_pb2.VersionRun(version=0, num_tokens=length)],
            finish_reason=common_pb2.FINISH_REASON_STOP, reward=acc, score=acc, acc=acc,
        )  # fmt: skip
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF model dir (default: build the tiny model)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="B groups per step")
    ap.add_argument("--n", type=int, default=8, help="responses per group")
    ap.add_argument("--max-response-length", type=int, default=48)
    ap.add_argument(
        "--groups-per-s", type=float, default=0.0, help="feed groups at this rate (0: all queued)"
    )
    ap.add_argument("--packing-groups", type=int, default=8, help="packed vs padded: groups in the batch")
    ap.add_argument("--packing-n", type=int, default=8, help="packed vs padded: responses per group")
    ap.add_argument("--packing-cap", type=int, default=512, help="packed vs padded: the response cap")
    ap.add_argument("--packing-reps", type=int, default=3, help="packed vs padded: repetitions of each")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (0: torch's default; 1 suits a shared small box)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, tmp: Path) -> None:

    from asyncdapo.contracts.config import OldLogProbSource, parse_run_config
    from asyncdapo.contracts.redis_keys import GROUP_FIELD, RunKeys
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.services.trainer.algos import grpo_advantages
    from asyncdapo.services.trainer.batch import build_batch
    from asyncdapo.services.trainer.dist import DistContext
    from asyncdapo.services.trainer.loop import Trainer
    from asyncdapo.services.trainer.model import compute_log_probs
    from asyncdapo.services.trainer.trainer_options import TrainerOptions
    from asyncdapo.services.trainer.update import old_log_probs, ppo_update, rows_of_rank
    from asyncdapo.tools.data.synth import synth_splits
    from asyncdapo.tools.local.redis_server import RedisServer

    model_dir = args.model
    if model_dir is None:
        from asyncdapo.tools.tiny_model import build_tiny_model

        model_dir = str(build_tiny_model(tmp / "tiny", seed=0))
    train, _ = synth_splits(64, 0, seed=0)
    data = write_examples(train, tmp / "train.jsonl")
    steps = args.steps + 1  # the first step warms up and is not counted
    cfg = parse_run_config({
        "name": "bench-trainer", "model": {"path": model_dir},
        "data": {"train_files": [str(data)], "train_batch_size": args.batch, "max_prompt_length": 128,
                 "max_response_length": args.max_response_length, "prompt_queue_watermark": 64},
        "rollout": {"n": args.n, "max_staleness": steps},
        "reward": {"overlong_buffer": {"enable": False}},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": max(1, args.batch // 2), "micro_batch_size": 16,
                    "lr": 1e-5, "warmup_steps": 0, "checkpoint_dir": str(tmp / "out")},
    })  # fmt: skip
    print(f"tiny-model trainer bench: B={args.batch} n={args.n} max_len={args.max_response_length} "
          f"steps={args.steps} (+1 warm-up) torch_threads={torch.get_num_threads()}")  # fmt: skip

    with RedisServer(tmp / "redis", appendonly=False) as redis_server:
        from asyncdapo.runtime.redis_conn import sync_client

        client = sync_client(redis_server.url)
        keys = RunKeys(cfg.name)
        trainer = Trainer(cfg, TrainerOptions(redis_server.url, tmp / "out", max_wait_s=120))
        vocab = trainer.vocab_size
        eos = int(trainer.tokenizer.eos_token_id)
        rng = random.Random(0)
        groups = [synthetic_group(rng, cfg.name, f"g{i}", vocab, eos, args.n, args.max_response_length)
                  for i in range(steps * args.batch)]  # fmt: skip

        def feed() -> None:
            for i, g in enumerate(groups):
                if args.groups_per_s > 0 and i >= args.batch:  # the warm-up step's groups come at once
                    time.sleep(1.0 / args.groups_per_s)
                client.xadd(keys.groups, {GROUP_FIELD: g.SerializeToString()})

        producer = threading.Thread(target=feed, daemon=True)
        producer.start()
        if args.groups_per_s <= 0:
            producer.join()
        records = [trainer.train_step() for _ in range(steps)][1:]
        trainer.close()
        producer.join()

        # baseline: the bare update on one step's batch, same model and settings, no I/O
        batch = build_batch(groups[: args.batch], trainer.pad_id)
        dist = DistContext()
        rows = rows_of_rank(batch, trainer.settings.groups_per_mini_batch, dist)
        bare: dict[OldLogProbSource, list[tuple[float, float]]] = {s: [] for s in OldLogProbSource}

        def recompute(rows: list[int], with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
            lp, ent = compute_log_probs(trainer.model, batch.select(rows), micro_batch_size=16, temperature=1.0,
                                        precision=trainer.precision, with_entropy=with_entropy)  # fmt: skip
            return lp, ent if ent is not None else torch.zeros_like(lp)  # rows == every row here

        for _ in range(5):  # alternate the modes: both see the same machine load
            for source in OldLogProbSource:
                t0, c0 = time.perf_counter(), time.process_time()
                old, _, _ = old_log_probs(source, batch, rows, recompute)
                adv = grpo_advantages(batch.rewards, batch.group_ordinal)
                ppo_update(
                    trainer.model, trainer.optimizer, batch, adv, old, trainer.settings, dist, trainer.precision,
                    first_epoch_stats=source is OldLogProbSource.ROLLOUT,
                )  # fmt: skip
                bare[source].append((time.perf_counter() - t0, time.process_time() - c0))

    def med(key: str) -> float:
        return statistics.median(r[key] for r in records)

    print(f"{'step':>4} {'wait_s':>8} {'compute_s':>9} {'ckpt_s':>7} {'publish_s':>9} {'step_s':>7}")
    for r in records:
        print(f"{r['step']:>4} {r['timing/wait_s']:8.3f} {r['timing/compute_s']:9.3f} "
              f"{r['timing/checkpoint_s']:7.3f} {r['timing/publish_s']:9.3f} {r['timing/step_s']:7.3f}")  # fmt: skip
    step_s = med("timing/step_s")
    bare_s, bare_cpu = (statistics.median(x[i] for x in bare[OldLogProbSource.RECOMPUTE]) for i in (0, 1))
    ro_s, ro_cpu = (statistics.median(x[i] for x in bare[OldLogProbSource.ROLLOUT]) for i in (0, 1))
    tokens = statistics.median(r["response_length/mean"] * r["batch/responses"] for r in records)
    print(f"median: step {step_s:.3f}s = wait {med('timing/wait_s'):.3f} + compute {med('timing/compute_s'):.3f} "
          f"+ checkpoint {med('timing/checkpoint_s'):.3f} + publish {med('timing/publish_s'):.3f} "
          f"(snapshot {med('timing/snapshot_s'):.3f}); {tokens / step_s:.0f} response tokens/s")  # fmt: skip
    print(f"baseline bare update (old log-probs + PPO update, no I/O): {bare_s:.3f}s (cpu {bare_cpu:.3f}s)")
    print(f"  with old_log_prob rollout (no pass before the update): {ro_s:.3f}s (cpu {ro_cpu:.3f}s), "
          f"saving {bare_cpu - ro_cpu:.3f} cpu-s = {1 - ro_cpu / bare_cpu:.0%}")  # fmt: skip
    pk = packing_experiment(args, model_dir)
    print(
        f"RESULT step_s={step_s:.3f} wait_frac={med('timing/wait_frac'):.3f} publish_s={med('timing/publish_s'):.3f} "
        f"checkpoint_s={med('timing/checkpoint_s'):.3f} compute_s={med('timing/compute_s'):.3f} "
        f"bare_update_s={bare_s:.3f} overhead_ratio={step_s / bare_s:.2f} "
        f"bare_cpu_s={bare_cpu:.3f} rollout_bare_cpu_s={ro_cpu:.3f} rollout_saving={1 - ro_cpu / bare_cpu:.3f} "
        + " ".join(f"{k}={v}" for k, v in pk.items())
    )


def long_tail_groups(n_groups: int, n: int, cap: int, seed: int = 0) -> list[Any]:
    """Groups whose prompt and response lengths follow the simulator's workload model: the
    rollpacker-14b preset with bench-longtail's train-v0.3 figures (half the responses answer
    briefly, ~100 tokens; the others run to the 512-token cap; mean ~317) and tiny-longtail's prompts. Tokens are random; rewards are the
    model's right/wrong draws (content does not change the cost)."""
    from asyncdapo.contracts.v1 import rollout_pb2
    from asyncdapo.tools.simulate.presets import load_workload

    work = load_workload(
        "rollpacker-14b", seed=seed, max_response_length=cap, length_median=16 * cap, brief_fraction=0.5,
        brief_median=100, brief_sigma=0.6, prompt_median=30, max_prompt_length=64, n_ref=n,
    )  # fmt: skip
    rng = random.Random(seed)
    groups = []
    for i in range(n_groups):
        att = work.attempt(i, 1, n)
        g = rollout_pb2.Group(
            prompt_id=f"lt{i}", prompt_token_ids=[rng.randrange(3, 500) for _ in range(work.prompt_length(i))]
        )
        for length, right in zip(att.lengths, att.right, strict=True):
            k = min(length, cap)
            g.responses.add(token_ids=[rng.randrange(3, 500) for _ in range(k)], reward=float(right),
                            score=float(right), acc=float(right))  # fmt: skip
        groups.append(g)
    return groups


class _TokenCount:
    """Tokens the model's forward passes compute, and how many of them are padding."""

    def __init__(self) -> None:
        self.computed = 0
        self.real = 0

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        self.computed += ids.numel()
        self.real += int(mask.sum()) if mask is not None else ids.numel()

    @property
    def pad_frac(self) -> float:
        return 1.0 - self.real / max(self.computed, 1)


def packing_experiment(args: argparse.Namespace, model_dir: str) -> dict[str, str]:
    """Packed vs padded micro-batches on a long-tailed batch (see the module docstring)."""
    from asyncdapo.contracts.config import parse_run_config
    from asyncdapo.services.trainer.algos import grpo_advantages
    from asyncdapo.services.trainer.batch import build_batch
    from asyncdapo.services.trainer.dist import DistContext
    from asyncdapo.services.trainer.model import Precision, compute_log_probs, load_policy
    from asyncdapo.services.trainer.packing import use_packed_attention
    from asyncdapo.services.trainer.update import UpdateSettings, ppo_update

    cpu = torch.device("cpu")
    prec = Precision(torch.float32, cpu)
    base, tok = load_policy(model_dir, cpu)
    batch = build_batch(
        long_tail_groups(args.packing_groups, args.packing_n, args.packing_cap), int(tok.eos_token_id)
    )
    micro = 8
    cfg = parse_run_config({
        "data": {"train_batch_size": args.packing_groups, "max_response_length": args.packing_cap},
        "rollout": {"n": args.packing_n}, "reward": {"overlong_buffer": {"enable": False}},
        "trainer": {"ppo_mini_batch_size": max(1, args.packing_groups // 2), "micro_batch_size": micro,
                    "lr": 1e-5, "packing": False},
    })  # fmt: skip
    padded = UpdateSettings.from_config(cfg)
    width = batch.input_ids.shape[1]
    settings = {
        "padded": padded,
        "packed": dataclasses.replace(padded, packing=True, micro_batch_tokens=micro * width),
    }
    models = {"padded": base, "packed": copy.deepcopy(base)}
    use_packed_attention(models["packed"])
    old, _ = compute_log_probs(base, batch, micro_batch_size=micro, temperature=1.0, precision=prec)
    old = old - 0.02  # ratio != 1: clipping takes part
    adv = grpo_advantages(batch.rewards, batch.group_ordinal)
    resp_tokens = int(batch.response_mask.sum())
    real_tokens = int(batch.attention_mask.sum())
    rate: dict[str, list[float]] = {k: [] for k in settings}
    loss: dict[str, list[float]] = {k: [] for k in settings}
    pad: dict[str, float] = {}
    load0 = os.getloadavg()[0]
    order = list(settings)
    for rep in range(args.packing_reps):
        for mode in order if rep % 2 == 0 else order[::-1]:  # interleaved: both see the same load
            model = copy.deepcopy(models[mode])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
            count = _TokenCount()
            hook = model.register_forward_pre_hook(count, with_kwargs=True)
            c0 = time.process_time()
            m = ppo_update(model, opt, batch, adv, old, settings[mode], DistContext(), prec)
            cpu_s = time.process_time() - c0
            hook.remove()
            rate[mode].append(resp_tokens / cpu_s)
            loss[mode].append(m["actor/pg_loss"])
            pad[mode] = count.pad_frac
    load1 = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in rate.items()}
    rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(loss["packed"], loss["padded"], strict=True))
    lengths = batch.response_mask.sum(-1)
    print(f"packed vs padded: {batch.size} responses, cap {args.packing_cap}: "
          f"{float((lengths >= args.packing_cap).float().mean()):.0%} at the cap, mean {float(lengths.mean()):.0f} "
          f"tokens; {real_tokens} real prompt+response tokens, padded width {width}; "
          f"{args.packing_reps} reps interleaved, load average {load0:.2f} -> {load1:.2f}")  # fmt: skip
    for mode in settings:
        print(f"  {mode:>6}: {med[mode]:7.0f} trained tokens/cpu-s (spread {min(rate[mode]):.0f}-"
              f"{max(rate[mode]):.0f}), padding {pad[mode]:.1%} of computed tokens, "
              f"pg_loss {loss[mode][0]:.6f}")  # fmt: skip
    print(f"  packed / padded: {med['packed'] / med['padded']:.2f}x, loss relative difference {rel:.1e}")
    return {
        "packed_tok_per_cpu_s": f"{med['packed']:.0f}",
        "padded_tok_per_cpu_s": f"{med['padded']:.0f}",
        "packed_speedup": f"{med['packed'] / med['padded']:.2f}",
        "padded_pad_frac": f"{pad['padded']:.3f}",
        "packed_pad_frac": f"{pad['packed']:.3f}",
        "loss_rel_diff": f"{rel:.1e}",
        "packing_load_avg": f"{max(load0, load1):.2f}",
    }


if __name__ == "__main__":
    main()

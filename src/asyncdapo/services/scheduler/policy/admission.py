"""Admission policies, pure: may the rollout take one more prompt from the queue now?

The hard limit is the staleness bound on valid groups, floor((v + 1 + s) · B)
(`RunConfig.valid_group_bound`); nothing is admitted at or beyond it. Below it, over-provisioning is the point (many groups are
filtered out), and a policy decides how much: `greedy` fills every prompt slot, `expected-valid`
stops once the prompts in flight are expected to cover what is left with a margin, `sync-batch`
is verl's DAPO loop (a whole generation batch at a time). The simulator compares them through the
same `AdmissionPolicy` interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from asyncdapo.contracts.config import AdmissionPolicyName, RolloutMode, RunConfig


class AdmitReason(StrEnum):
    ADMIT = "admit"
    BOUND = "bound"  # valid groups produced reached the staleness bound
    SLOTS = "slots"  # max_concurrent_prompts in flight
    EXPECTED = "expected"  # in-flight prompts are expected to cover the remaining valid groups
    BATCH = "batch"  # sync mode: the current generation batch is still running


@dataclass(frozen=True, slots=True)
class AdmissionState:
    valid_produced: int  # valid groups committed so far (all versions)
    bound: int  # floor((v + 1 + s) · B), s possibly fractional
    in_flight_prompts: int  # admitted, no outcome yet
    max_in_flight: int  # cfg.rollout.max_concurrent_prompts
    finished_groups: int = 0  # complete groups judged so far (valid + filtered), for the valid rate
    valid_groups: int = 0  # valid among `finished_groups` (before the bound check)
    batch_admitted: int = 0  # sync mode: prompts admitted into the current generation batch
    ready_valid: int = 0  # complete valid groups waiting for their commit turn (fifo order)

    @property
    def remaining(self) -> int:
        """Valid groups still needed to reach the bound."""
        return self.bound - self.valid_produced - self.ready_valid


def valid_rate(
    valid: int, finished: int, floor: float, prior_valid: float = 1.0, prior: float = 2.0
) -> float:
    """Running valid-group rate with a Beta(1, 1) prior, so the first prompts neither stall
    admission (rate 1) nor flood it (rate 0); never below `floor`."""
    return max(floor, (valid + prior_valid) / (finished + prior))


@dataclass(frozen=True, slots=True)
class Admit:
    ok: bool
    reason: AdmitReason


class AdmissionPolicy(Protocol):
    @property
    def name(self) -> str: ...  # read-only: the policies are frozen dataclasses

    def decide(self, s: AdmissionState) -> Admit: ...


def _hard_limits(s: AdmissionState) -> Admit | None:
    if s.remaining <= 0:
        return Admit(False, AdmitReason.BOUND)
    if s.in_flight_prompts >= s.max_in_flight:
        return Admit(False, AdmitReason.SLOTS)
    return None


@dataclass(frozen=True)
class GreedyPolicy:
    """Admit whenever a prompt slot is free and the bound is not reached."""

    name: str = "greedy"

    def decide(self, s: AdmissionState) -> Admit:
        return _hard_limits(s) or Admit(True, AdmitReason.ADMIT)


@dataclass(frozen=True)
class ExpectedValidPolicy:
    """Stop admitting once p̂ · in_flight ≥ margin · (bound − valid_produced): the prompts in
    flight are then expected to yield the remaining valid groups with `margin` to spare.
    p̂ is the running valid rate (`valid_rate`), floored at `min_valid_rate`."""

    margin: float = 1.2
    min_valid_rate: float = 0.05
    name: str = "expected-valid"

    def decide(self, s: AdmissionState) -> Admit:
        hard = _hard_limits(s)
        if hard is not None:
            return hard
        p = valid_rate(s.valid_groups, s.finished_groups, self.min_valid_rate)
        if p * s.in_flight_prompts >= self.margin * s.remaining:
            return Admit(False, AdmitReason.EXPECTED)
        return Admit(True, AdmitReason.ADMIT)


@dataclass(frozen=True)
class SyncBatchPolicy:
    """verl's DAPO loop: admit a generation batch of `batch_size` prompts, then nothing until
    every prompt of it has an outcome; repeat while the bound is not reached."""

    batch_size: int
    name: str = "sync-batch"

    def decide(self, s: AdmissionState) -> Admit:
        if s.remaining <= 0:
            return Admit(False, AdmitReason.BOUND)
        if s.batch_admitted >= self.batch_size:
            return Admit(False, AdmitReason.BATCH)
        return Admit(True, AdmitReason.ADMIT)


def make_policy(cfg: RunConfig) -> AdmissionPolicy:
    """The admission policy the run config asks for (the config's enum has already refused any other
    name, with the allowed values)."""
    if cfg.rollout.mode is RolloutMode.SYNC:
        return SyncBatchPolicy(batch_size=cfg.rollout.max_concurrent_prompts)
    a = cfg.rollout.admission
    if a.policy is AdmissionPolicyName.GREEDY:
        return GreedyPolicy()
    return ExpectedValidPolicy(margin=a.margin, min_valid_rate=a.min_valid_rate)

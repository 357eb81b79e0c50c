"""The workload model: what the policy would answer to each prompt — how long, and whether right.

A prompt has a difficulty p (the chance a response is right) drawn from Beta(m·κ, (1 − m)·κ),
with κ solved so that a group of n is *valid* (mixed right and wrong: DAPO's dynamic sampling
keeps it) with the stated probability: 1 − E[pⁿ] − E[(1 − p)ⁿ] = valid_rate; a length scale
(log-normal across prompts, longer for harder prompts when `difficulty_length_slope` > 0); and a
prompt length. Each response of an attempt is right with probability p; its natural length (where
it would stop without a cap) is the prompt's scale × `wrong_length_ratio` if wrong × a within-group
spread (log-normal, or log-t with `within_df` degrees of freedom for a heavier tail) — or, with
probability `brief_fraction`, a brief answer of about `brief_median` tokens whatever the prompt (a
model that answers some samples directly and works others out at length: the length spread is then
mostly *within* a group, which decides how much of an aborted group had already finished). A response
whose natural length reaches the run's `max_response_length` is cut there and scores wrong (no
answer), as in DAPO. A requeued prompt's new attempt draws new samples (new seeds), the prompt
itself (p, scale) stays.

Samples are a function of (seed, prompt index, attempt, n) only: every mode of a comparison sees the
same prompts and, for the same attempt, the same answers.

Presets are calibrated to published figures; `PRESETS[name].source` says which, and
tests/unit/test_simulate_workload.py checks each statistic within its stated tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from asyncdapo.contracts.errors import AsyncdapoError


class WorkloadError(AsyncdapoError, ValueError):
    pass


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str = Field("", description="The published figures this preset is calibrated to.")
    valid_rate: float = Field(
        0.5, gt=0.0, lt=1.0, description="Share of groups of n_ref with mixed correctness."
    )
    n_ref: int = Field(16, ge=2, description="Group size the valid rate is stated for.")
    mean_accuracy: float = Field(0.5, gt=0.0, lt=1.0, description="Mean chance a response is right.")
    length_median: float = Field(ge=1.0, description="Median natural length of a right answer (tokens).")
    between_sigma: float = Field(0.5, ge=0.0, description="SD of log length scale across prompts.")
    within_sigma: float = Field(0.3, ge=0.0, description="SD of log length within a group.")
    within_df: float = Field(0.0, ge=0.0, description="0: log-normal within a group; > 2: log-t, df.")
    wrong_length_ratio: float = Field(3.0, ge=0.1, description="Wrong answers are this many times longer.")
    brief_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of responses that answer briefly (a direct answer, no worked solution): "
        "brief_median x exp(brief_sigma x N(0, 1)) tokens whatever the prompt's length scale and "
        "correctness; the others follow the prompt's scale. 0: no brief answers.",
    )
    brief_median: float = Field(6.0, ge=1.0, description="Median length of a brief answer (tokens).")
    length_max: int = Field(
        0,
        ge=0,
        description="Longest natural answer (tokens): lengths are clipped here, a task whose answers "
        "are bounded (a worked count of at most 9 steps); 0: unbounded.",
    )
    brief_sigma: float = Field(0.05, ge=0.0, description="SD of log length of brief answers.")
    difficulty_length_slope: float = Field(
        0.0, description="log length scale += slope * (mean_accuracy - p): harder prompts answer longer."
    )
    prompt_median: int = Field(128, ge=1, description="Median prompt length (tokens).")
    prompt_sigma: float = Field(0.3, ge=0.0, description="SD of log prompt length.")
    max_response_length: int = Field(ge=1, description="The cap the figures were taken at.")
    max_prompt_length: int = Field(1024, ge=1, description="Prompts are clipped to this length.")

    @cached_property
    def concentration(self) -> float:
        return solve_concentration(self.mean_accuracy, self.valid_rate, self.n_ref)


def _valid_prob(m: float, kappa: float, n: int) -> float:
    """P(a group of n is mixed) for p ~ Beta(m kappa, (1 - m) kappa)."""
    a, b = m * kappa, (1 - m) * kappa
    all_right = all_wrong = 1.0
    for k in range(n):
        all_right *= (a + k) / (a + b + k)
        all_wrong *= (b + k) / (a + b + k)
    return 1.0 - all_right - all_wrong


def solve_concentration(m: float, valid_rate: float, n: int) -> float:
    """kappa such that a group of n is valid with probability `valid_rate` (bisection in log kappa;
    the valid probability rises with kappa from 0 to 1 - m^n - (1 - m)^n)."""
    top = 1.0 - m**n - (1 - m) ** n
    if valid_rate >= top:
        raise WorkloadError(
            f"valid_rate {valid_rate} is unreachable with mean accuracy {m} and n = {n} (at most {top:.3f})"
        )
    lo, hi = math.log(1e-4), math.log(1e6)
    for _ in range(100):
        mid = (lo + hi) / 2
        if _valid_prob(m, math.exp(mid), n) < valid_rate:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


@dataclass(slots=True)
class Attempt:
    """The n answers of one attempt: natural lengths (uncapped) and whether each is right."""

    lengths: list[int]
    right: list[bool]


class Sampler(Protocol):
    """What the simulator draws answers from: a `Workload`, or a `replay.ReplayWorkload`."""

    spec: WorkloadSpec

    @property
    def name(self) -> str: ...

    @property
    def dataset_size(self) -> int | None:
        """Rows of the replayed dataset (fed in the trainer's epoch order); None: an unbounded model."""
        ...

    def prompt_length(self, index: int) -> int: ...

    def attempt(self, index: int, attempt: int, n: int) -> Attempt:
        """Attempt `attempt` (1-based) of the prompt fed at `index`: epoch × dataset_size + row
        for a dataset (a sampler that keeps no per-epoch answers takes it modulo its rows)."""
        ...


class Workload:
    """Samples of a `WorkloadSpec` (see the module docstring)."""

    CHUNK = 1024

    def __init__(self, spec: WorkloadSpec, seed: int = 0) -> None:
        self.spec = spec
        self.seed = seed
        m, k = spec.mean_accuracy, spec.concentration
        self._a, self._b = m * k, (1 - m) * k
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # (chunk, attempt, n) -> that chunk's answers (`_answers`)
        self._att: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._log_wrong = math.log(spec.wrong_length_ratio)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dataset_size(self) -> int | None:
        return None  # prompts are drawn from the spec, not a dataset

    def _chunk(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        got = self._chunks.get(c)
        if got is None:
            s = self.spec
            rng = np.random.default_rng((self.seed, 0x5EED, c))
            p = rng.beta(self._a, self._b, self.CHUNK)
            z = rng.standard_normal(self.CHUNK)
            scale = (
                np.log(s.length_median)
                + s.between_sigma * z
                + s.difficulty_length_slope * (s.mean_accuracy - p)
            )
            plen = np.exp(np.log(s.prompt_median) + s.prompt_sigma * rng.standard_normal(self.CHUNK))
            plen = np.clip(np.rint(plen), 1, s.max_prompt_length).astype(np.int64)
            got = self._chunks[c] = (p, scale, plen)
        return got

    def prompt(self, index: int) -> tuple[float, float, int]:
        """(difficulty p, log length scale, prompt length) of prompt `index`."""
        p, scale, plen = self._chunk(index // self.CHUNK)
        i = index % self.CHUNK
        return float(p[i]), float(scale[i]), int(plen[i])

    def prompt_length(self, index: int) -> int:
        return self.prompt(index)[2]

    def _draws(self, c: int, attempt: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Uniforms (right or wrong) and within-group spreads of attempt `attempt` of every prompt
        of chunk `c`, drawn at once: one generator per (chunk, attempt), not per prompt (seeding a
        generator costs ~100 us, a sample ~10 ns)."""
        s = self.spec
        rng = np.random.default_rng((self.seed, 0xA77E, c, attempt, n))
        u = rng.random((self.CHUNK, n))
        shape = (self.CHUNK, n)
        eps = rng.standard_t(s.within_df, shape) if s.within_df > 0 else rng.standard_normal(shape)
        return u, eps

    def _answers(self, c: int, attempt: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Natural lengths and rightness of attempt `attempt` of every prompt of chunk `c`, as
        (CHUNK, n) matrices: computed a chunk at once, because numpy's cost per call on one
        group's row (~25 us an attempt) was a few per cent of a simulated run. Each element is
        the same arithmetic as for one row, so the samples do not depend on how many are drawn."""
        key = (c, attempt, n)
        got = self._att.get(key)
        if got is None:
            s = self.spec
            p, scale, _ = self._chunk(c)
            u, eps = self._draws(c, attempt, n)
            right = u < p[:, None]
            log_len = scale[:, None] + s.within_sigma * eps + np.where(right, 0.0, self._log_wrong)
            if s.brief_fraction > 0:
                ub, zb = self._brief(c, attempt, n)
                brief = math.log(s.brief_median) + s.brief_sigma * zb
                log_len = np.where(ub < s.brief_fraction, brief, log_len)
            lengths = np.maximum(1, np.rint(np.exp(np.minimum(log_len, 30.0)))).astype(np.int64)
            if s.length_max:
                lengths = np.minimum(lengths, s.length_max)
            got = self._att[key] = (lengths, right)
        return got

    def attempt(self, index: int, attempt: int, n: int) -> Attempt:
        """The answers of attempt `attempt` (1-based) of prompt `index`."""
        lengths, right = self._answers(index // self.CHUNK, attempt, n)
        i = index % self.CHUNK
        return Attempt(lengths[i].tolist(), right[i].tolist())

    def _brief(self, c: int, attempt: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Which responses answer briefly, and their spread: a generator of their own, so a
        workload without brief answers draws exactly what it drew before they existed."""
        rng = np.random.default_rng((self.seed, 0xB41E, c, attempt, n))
        shape = (self.CHUNK, n)
        return rng.random(shape), rng.standard_normal(shape)


# ----------------------------------------------------------------------------- statistics
@dataclass
class WorkloadStats:
    """What a workload looks like at a cap, from `groups` sampled groups of n (first attempts)."""

    groups: int
    n: int
    cap: int
    valid_rate: float
    accuracy: float
    mean_length: float  # capped response length, every response
    p50: float
    p75: float
    p90: float
    p99: float
    max_length: float
    truncated: float  # share of responses cut at the cap
    valid_mean_length: float  # capped length, responses of valid groups (what an unbiased policy trains)
    wrong_right_ratio: float  # median wrong length / median right length (uncapped)
    cv_mean: float  # within-group coefficient of variation of capped lengths: mean, max
    cv_max: float
    long_after_short: float  # P(some other response > 512 | the first one < 512)
    # Seer's figure: the share of a batch's decode time taken by its last 10 % of requests, with
    # finish time ~ length: 1 - P90 / max, per batch of `batch_groups` groups, averaged
    tail_time_share: float

    def row(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def sample_stats(
    w: Workload, n: int, cap: int, groups: int = 4000, start: int = 10_000_000, batch_groups: int = 64
) -> WorkloadStats:
    """Statistics of `groups` first attempts (prompts from index `start`, away from a run's own)."""
    lens = np.empty((groups, n), dtype=np.int64)
    right = np.empty((groups, n), dtype=bool)
    for g in range(groups):
        a = w.attempt(start + g, 1, n)
        lens[g] = a.lengths
        right[g] = a.right
    capped = np.minimum(lens, cap)
    ok = right & (lens < cap)
    k = ok.sum(axis=1)
    valid = (k > 0) & (k < n)
    mean = capped.mean(axis=1)
    cv = capped.std(axis=1) / np.maximum(mean, 1e-9)
    first = capped[:, 0]
    short = first < 512
    long_after: np.ndarray = np.asarray((capped[:, 1:] > 512).any(axis=1))
    batches = [capped[i : i + batch_groups] for i in range(0, groups - batch_groups + 1, batch_groups)]
    tail = [1.0 - np.percentile(b, 90) / b.max() for b in batches] or [float("nan")]
    wr = np.median(lens[~right]) / np.median(lens[right]) if right.any() and (~right).any() else float("nan")
    return WorkloadStats(
        groups=groups,
        n=n,
        cap=cap,
        valid_rate=float(valid.mean()),
        accuracy=float(ok.mean()),
        mean_length=float(capped.mean()),
        p50=float(np.percentile(capped, 50)),
        p75=float(np.percentile(capped, 75)),
        p90=float(np.percentile(capped, 90)),
        p99=float(np.percentile(capped, 99)),
        max_length=float(capped.max()),
        truncated=float((lens >= cap).mean()),
        valid_mean_length=float(capped[valid].mean()) if valid.any() else float("nan"),
        wrong_right_ratio=float(wr),
        cv_mean=float(cv.mean()),
        cv_max=float(cv.max()),
        long_after_short=float(long_after[short].mean()) if short.any() else float("nan"),
        tail_time_share=float(np.mean(tail)),
    )

"""A dataset mixed for a target valid-group rate from each problem's *measured* pass rate.

DAPO trains only on valid groups (rewards differ within the group); a problem the model always
solves, or never does, gives filtered groups. Curating prompts by the policy's measured pass rate
is what RL practitioners do offline; here it sets the long-tail workload's valid rate, which the
warm start's per-class rates (`asyncdapo.tools.data.longtail.CLASS_VALID_RATE`) cannot bring below 0.62.

The measurement is a `asyncdapo data longtail-stats --trace` over `problems.parquet` (one JSONL line
per problem, in the problems' order, m responses each, `acc` 1 right / 0 wrong). A problem's chance
of giving a valid group of n is 1 − E[p^n] − E[(1 − p)^n] under the Jeffreys posterior
Beta(k + ½, m − k + ½) of its pass rate p (k right of m): a problem seen right 0 times in 32 is not
certain to stay at 0, and the estimate says so instead of betting on it.

The dataset mixes two strata, *low* (valid probability < ½: mostly solved or mostly failed) and
*high*, in the proportion whose expected valid rate is the target, each sampled without replacement
(seeded). Where the low stratum is too small for the proportion at `max_size` problems, the dataset
is smaller (the trainer wraps epochs): `size` is the largest ≤ `max_size` both strata can fill.
Selecting on one measurement regresses to the mean on another: the valid rate a run measures is
expected a little nearer the middle than the target (bench-longtail prints each dataset's valid
rate on an independent measurement).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncdapo.contracts.verl_format import DatasetError, Example

LOW_STRATUM = 0.5  # valid probability below this: the problem is mostly solved or mostly failed
JEFFREYS = 0.5


@dataclass(frozen=True)
class PassRate:
    right: int
    total: int

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.right <= self.total:
            raise ValueError(
                f"a pass rate needs 0 <= right <= total and total >= 1, got {self.right}/{self.total}"
            )

    def valid_probability(self, n: int) -> float:
        """P(a group of n responses has both a right and a wrong answer), p ~ Beta(k + ½, m − k + ½)."""
        if n < 2:
            raise ValueError(f"a group needs n >= 2 responses to be valid, got {n}")
        a, b = self.right + JEFFREYS, self.total - self.right + JEFFREYS
        return 1.0 - math.exp(_lbeta(a + n, b) - _lbeta(a, b)) - math.exp(_lbeta(a, b + n) - _lbeta(a, b))


def _lbeta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def load_pass_rates(trace: Path, problems: int) -> list[PassRate]:
    """Per problem, from a `longtail-stats --trace` over the `problems` problems (in their order)."""
    rates = []
    for i, line in enumerate(trace.read_text().splitlines()):
        try:
            acc = [int(x) for x in json.loads(line)["acc"]]
        except (ValueError, KeyError, TypeError) as err:
            raise DatasetError(f"{trace}:{i + 1}: not a longtail-stats trace line ({err})") from err
        if any(x not in (0, 1) for x in acc):
            raise DatasetError(f"{trace}:{i + 1}: acc must hold 0 or 1, got {acc}")
        rates.append(PassRate(sum(acc), len(acc)))
    if len(rates) != problems:
        raise DatasetError(
            f"{trace} has {len(rates)} lines; the workload has {problems} problems: measure problems.parquet whole"
        )
    return rates


@dataclass(frozen=True)
class Mix:
    """The selected problems (indices into the problem list) and what they are expected to give."""

    indices: list[int]
    low: int  # of them, from the low stratum
    expected_valid_rate: float  # the mean valid probability of the selection (on the measurement used)


def mix_for(valid_rate: float, rates: Sequence[PassRate], n: int, max_size: int = 112, seed: int = 0) -> Mix:
    """The problems for `valid_rate` (module docstring); DatasetError when it is out of reach."""
    pv = [r.valid_probability(n) for r in rates]
    low = [i for i, v in enumerate(pv) if v < LOW_STRATUM]
    high = [i for i, v in enumerate(pv) if v >= LOW_STRATUM]
    if not low or not high:
        raise DatasetError(
            f"every problem is in one stratum (low {len(low)}, high {len(high)}): no valid rate to mix"
        )
    lo, hi = sum(pv[i] for i in low) / len(low), sum(pv[i] for i in high) / len(high)
    if not lo <= valid_rate <= hi:
        raise DatasetError(
            f"valid rate {valid_rate} is out of reach of these pass rates [{lo:.2f}, {hi:.2f}]"
        )
    f = (hi - valid_rate) / (hi - lo)  # share of the low stratum
    size = max_size
    if f > 0:
        size = min(size, math.floor(len(low) / f))
    if f < 1:
        size = min(size, math.floor(len(high) / (1 - f)))
    n_low = round(f * size)
    if size < 8:
        raise DatasetError(f"valid rate {valid_rate} leaves only {size} problems: too few for a dataset")
    rng = random.Random(seed)
    chosen = rng.sample(low, n_low) + rng.sample(high, size - n_low)
    rng.shuffle(chosen)
    return Mix(chosen, n_low, sum(pv[i] for i in chosen) / len(chosen))


def relabel(chosen: Sequence[Example], valid_rate: float) -> list[Example]:
    """Indices 0..k-1 in the selection's order, the target recorded in extra_info."""
    return [
        Example(e.prompt, e.ground_truth, e.data_source, i, {**e.extra_info, "valid_rate_target": valid_rate})
        for i, e in enumerate(chosen)
    ]

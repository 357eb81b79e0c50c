"""The reward verl gives a response, by the row's `data_source` (verl's `default_compute_score`).

verl picks a scoring function per data source; each gives a correct answer one value and a wrong
one another: the DAPO scorer (`math_dapo`, also used for AIME) +1 / -1, the GSM8K and MATH scorers
1 / 0. asyncdapo judges every answer with math-verify and takes the two values from the run config
(`reward.correct_reward`, `reward.incorrect_reward`), so a conversion sets them to what the
recipe's data would get in verl.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scorer:
    name: str  # verl's module under verl/utils/reward_score
    correct: float
    incorrect: float


MATH_DAPO = Scorer("math_dapo", 1.0, -1.0)
GSM8K = Scorer("gsm8k", 1.0, 0.0)
MATH = Scorer("math_reward", 1.0, 0.0)
PRIME_MATH = Scorer("prime_math", 1.0, 0.0)

_BY_SOURCE = {
    "openai/gsm8k": GSM8K,
    "lighteval/MATH": MATH,
    "DigitalLearningGmbH/MATH-lighteval": MATH,
    "HuggingFaceH4/MATH-500": MATH,
    "math_dapo": MATH_DAPO,
    "math": MATH_DAPO,
    "math_dapo_reasoning": MATH_DAPO,
    **{
        f"numina_{s}": PRIME_MATH
        for s in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12", "olympiads")
    },
}


def scorer_for(data_source: str) -> Scorer | None:
    """verl's scorer for rows of `data_source`, or None where verl has none (it fails on such rows
    unless the recipe sets custom_reward_function)."""
    if data_source in _BY_SOURCE:
        return _BY_SOURCE[data_source]
    return MATH_DAPO if data_source.startswith("aime") else None

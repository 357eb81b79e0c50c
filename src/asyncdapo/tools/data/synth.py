"""Synthetic arithmetic problems in verl's layout: the local demo's and the tests' dataset.

Problems are `a op b` with integer operands; the ground truth is the integer result. Each example
carries a reference `solution` (`\\boxed{N}`) in `extra_info`, used by the demo's supervised
warm-start and by the tokenizer corpus. Deterministic for a seed; train and validation problems
never overlap (validation is held out by construction).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from asyncdapo.contracts.verl_format import DatasetError, Example

DATA_SOURCE = "asyncdapo/synthetic-arith"
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class SynthSpec:
    ops: tuple[str, ...] = ("+", "-")
    max_operand: int = 20
    instruction: str = "Put the answer in \\boxed{}."

    def __post_init__(self) -> None:
        unknown = [o for o in self.ops if o not in _OPS]
        if unknown or not self.ops:
            raise DatasetError(f"ops must be a non-empty subset of {sorted(_OPS)}, got {list(self.ops)}")
        if self.max_operand < 1:
            raise DatasetError("max_operand must be >= 1")

    @property
    def num_problems(self) -> int:
        return len(self.ops) * (self.max_operand + 1) ** 2


def _example(a: int, op: str, b: int, index: int, spec: SynthSpec, split: str) -> Example:
    answer = _OPS[op](a, b)
    return Example(
        prompt=[{"role": "user", "content": f"{a} {op} {b} = ? {spec.instruction}"}],
        ground_truth=str(answer),
        data_source=DATA_SOURCE,
        index=index,
        extra_info={"split": split, "solution": f"\\boxed{{{answer}}}", "a": a, "b": b, "op": op},
    )


def synth_splits(
    n_train: int, n_val: int, seed: int = 0, spec: SynthSpec | None = None
) -> tuple[list[Example], list[Example]]:
    """Disjoint train and validation sets drawn without replacement from every `a op b`."""
    spec = spec or SynthSpec()
    if n_train < 0 or n_val < 0:
        raise DatasetError("n_train and n_val must be >= 0")
    if n_train + n_val > spec.num_problems:
        raise DatasetError(
            f"asked for {n_train + n_val} distinct problems but the spec has only {spec.num_problems}; "
            "raise max_operand or add ops"
        )
    rng = random.Random(seed)
    triples = [
        (a, op, b)
        for op in spec.ops
        for a in range(spec.max_operand + 1)
        for b in range(spec.max_operand + 1)
    ]
    rng.shuffle(triples)
    val = [_example(*t, i, spec, "val") for i, t in enumerate(triples[:n_val])]
    train = [_example(*t, i, spec, "train") for i, t in enumerate(triples[n_val : n_val + n_train])]
    return train, val

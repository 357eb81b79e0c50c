"""Replay: a trace recorded from a real run drives the simulator in place of a workload model.

A trace is JSONL, one line per group as the run judged it — filtered groups included:
    {"prompt_id": "e0-17", "prompt_tokens": 93, "lengths": [412, 1033, …], "acc": [1, 0, …]}
(`lengths`: each response's length in tokens, `acc`: 1 right, 0 wrong). The groups stream alone
is not a trace: it holds only the valid groups, and a replay of it would never filter.

The simulator feeds prompts in the trainer's own seeded epoch order over the N lines, so a trace
made from the run's dataset (line k = row k) replays each problem where the real run drew it.
A line's responses are cut into ⌊m / n⌋ blocks of n; let `b = a − 1 + seed` for attempt `a`. With
m ≥ 2n (a `longtail-stats --trace --n 32` at group size 8) attempt `a` of prompt `i` replays block
`b mod blocks` of line `i mod N`: a requeued attempt replays the same problem's next samples, as a
requeued attempt in the real run draws new seeds, and the seed picks another of its recorded
realisations. With one block per line it replays line `(i + b · 7919) mod N`, another recorded
group, since the same responses would bring an aborted-for-long prompt back exactly as long. A prompt's length is
its own line's. A response recorded at the run's cap is treated as cut there (its natural length
is unknown beyond it).
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncdapo.tools.simulate.workload import Attempt, WorkloadError, WorkloadSpec

STRIDE = 7919


class ReplayWorkload:
    def __init__(
        self, groups: list[tuple[int, list[int], list[bool]]], cap: int, name: str, seed: int = 0
    ) -> None:
        if not groups:
            raise WorkloadError(f"replay {name}: the trace has no groups")
        self.groups = groups
        self.seed = seed
        self.cap = cap
        lens = [x for _, ls, _ in groups for x in ls]
        med = sorted(lens)[len(lens) // 2]
        self.spec = WorkloadSpec(
            name=f"replay:{name}", source=f"recorded trace {name} ({len(groups)} groups)",
            length_median=max(1.0, float(med)), max_response_length=max(cap, 1),
        )  # fmt: skip

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dataset_size(self) -> int:
        """The simulator feeds prompts 0..N-1 in the trainer's epoch order over this many."""
        return len(self.groups)

    def prompt_length(self, index: int) -> int:
        return self.groups[index % len(self.groups)][0]

    def attempt(self, index: int, attempt: int, n: int) -> Attempt:
        """Attempt `attempt` (1-based) of prompt `index`: n recorded responses (module docstring)."""
        size = len(self.groups)
        blocks = len(self.groups[index % size][1]) // n
        b = attempt - 1 + self.seed
        line = index % size if blocks != 1 else (index + b * STRIDE) % size
        _, lengths, right = self.groups[line]
        if len(lengths) < n:
            raise WorkloadError(
                f"replay: a recorded group has {len(lengths)} responses, the run asks for n = {n}"
            )
        lo = (b % (len(lengths) // n)) * n
        return Attempt(
            [x if x < self.cap else self.cap + 1 for x in lengths[lo : lo + n]],
            [bool(r) for r in right[lo : lo + n]],
        )


def numbered_lines(path: Path) -> list[tuple[int, str]]:
    """A --replay file's non-blank lines with their 1-based numbers; WorkloadError if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise WorkloadError(f"--replay {path}: {err}") from None
    return [(no, line) for no, line in enumerate(lines, 1) if line.strip()]


def load_replay(path: Path, cap: int, seed: int = 0) -> ReplayWorkload:
    groups = []
    for no, line in numbered_lines(path):
        try:
            g = json.loads(line)
            lengths = [int(x) for x in g["lengths"]]
            acc = [bool(float(x) > 0.5) for x in g["acc"]]
            prompt = int(g.get("prompt_tokens", 1))
        except (ValueError, KeyError, TypeError) as err:
            raise WorkloadError(f"--replay {path}:{no}: not a group line ({err})") from None
        if len(lengths) != len(acc) or not lengths:
            raise WorkloadError(f"--replay {path}:{no}: lengths and acc differ in size or are empty")
        groups.append((max(1, prompt), lengths, acc))
    return ReplayWorkload(groups, cap, path.name, seed)

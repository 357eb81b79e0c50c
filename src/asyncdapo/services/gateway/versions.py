"""Policy-version runs: which weights produced which response tokens, run-length encoded.

A response is a sequence of tokens; `Runs` is `[(version, num_tokens), ...]` in token order.
Tokens sampled before a weight reload belong to the old version, tokens sampled after it to the
new one, so a request held across a reload (Pause keep → LoadWeights → Resume) has two runs.

Invariants (kept by every function here):
- every run has `num_tokens > 0`;
- adjacent runs have different versions (equal neighbours are merged);
- `total(runs)` equals the number of tokens described.
"""

from __future__ import annotations

from collections.abc import Iterable

Run = tuple[int, int]  # (version, num_tokens)
Runs = list[Run]


def append_run(runs: Runs, version: int, num_tokens: int) -> Runs:
    """Append `num_tokens` tokens of `version` in place (merging with the last run) and return runs."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if num_tokens == 0:
        return runs
    if runs and runs[-1][0] == version:
        runs[-1] = (version, runs[-1][1] + num_tokens)
    else:
        runs.append((version, num_tokens))
    return runs


def concat(head: Iterable[Run], tail: Iterable[Run]) -> Runs:
    """The runs of `head`'s tokens followed by `tail`'s tokens (a new list)."""
    out: Runs = []
    for version, n in (*head, *tail):
        append_run(out, version, n)
    return out


def total(runs: Iterable[Run]) -> int:
    return sum(n for _, n in runs)


def runs_from_spans(spans: Iterable[tuple[int, int, int]]) -> Runs:
    """Runs from `(version, start, end)` half-open token spans in order (vLLM's weight-version spans).

    Raises ValueError when the spans leave a gap, overlap, or run backwards.
    """
    out: Runs = []
    expected_start = 0
    for version, start, end in spans:
        if start != expected_start or end < start:
            raise ValueError(
                f"weight-version spans are not contiguous at token {start} (expected {expected_start})"
            )
        append_run(out, version, end - start)
        expected_start = end
    return out


def check_runs(runs: Iterable[Run], num_tokens: int, field: str) -> Runs:
    """Validate client-supplied runs against `num_tokens` tokens; return them normalised.

    Raises ValueError naming `field` when a run is malformed or the runs do not cover the tokens.
    """
    out: Runs = []
    for i, (version, n) in enumerate(runs):
        if version < 0:
            raise ValueError(f"{field}[{i}].version must be >= 0, got {version}")
        if n <= 0:
            raise ValueError(f"{field}[{i}].num_tokens must be > 0, got {n}")
        append_run(out, version, n)
    if total(out) != num_tokens:
        raise ValueError(f"{field} cover {total(out)} tokens but there are {num_tokens} continuation tokens")
    return out


class RunTracker:
    """Accumulates the runs of one response as tokens arrive (used by engines without native labels)."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: Runs = []

    def add(self, version: int, num_tokens: int = 1) -> None:
        append_run(self.runs, version, num_tokens)

    @property
    def num_tokens(self) -> int:
        return total(self.runs)

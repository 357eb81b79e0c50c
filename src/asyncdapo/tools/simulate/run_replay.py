"""Replay of a run's own generations: the scheduler's `--response-log` drives the simulator.

A groups trace (`replay.py`) is a pool of generations per problem, drawn apart from any run; a
response log is what one run generated, attempt by attempt (scheduler/response_log.py: one line
per response that ended — `judged` with its length and verdict, `aborted` with the tokens it had
when its task was cancelled, `late` when it finished after that). Replaying it puts the simulator
on the same draw of the workload as the run, so a comparison of the two is not blurred by which
responses happened to be long (on the long-tail bench one run's pdsr/sync ratio scatters by sd
0.17 from the draw alone).

Attempt `a` of the prompt fed as (epoch e, row r) — the run's prompt id `e{e}-{r}` — replays the
logged responses of that attempt, index by index:
- `judged`: its length and verdict (a length at the run's cap is cut there, as in a trace);
- `late`: its length; its verdict is the pool's response of that row nearest in length;
- `aborted` (or not in the log: the run never saw it end): its natural length is only known to be
  above the tokens it had (0 when not logged), so it is drawn from the pool's responses of that
  row longer than that — a fixed pick per (epoch, row, attempt, index), so every mode and every
  call sees the same answer; where the pool has none that long, one token more than it had, and
  the count of such fills is kept (`unresolved`).
An attempt the run never made (the simulator's decisions differ from the run's: it requeued a
prompt the run did not, or ran further) is the pool's own attempt. The pool is a groups trace of
the same dataset (line k = row k) when one is given; without one, each row's judged responses
over the whole log (a row the log never judged borrows the next row that it did).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from asyncdapo.tools.simulate.replay import STRIDE, ReplayWorkload, numbered_lines
from asyncdapo.tools.simulate.workload import Attempt, WorkloadError, WorkloadSpec

PID = re.compile(r"^e(\d+)-(\d+)$")
EVENTS = ("judged", "aborted", "late")


@dataclass(slots=True)
class Logged:
    """One logged response: its event, tokens, and verdict (judged only)."""

    event: str
    tokens: int
    acc: bool | None


@dataclass
class RunLog:
    """A response log, parsed: per (epoch, row, attempt) the logged responses by index."""

    attempts: dict[tuple[int, int, int], dict[int, Logged]] = field(default_factory=dict)
    prompt_tokens: dict[int, int] = field(default_factory=dict)  # row -> prompt length

    @property
    def rows(self) -> int:
        """Rows the log names: the largest row + 1."""
        return 1 + max((r for _, r, _ in self.attempts), default=-1)


def is_response_log(path: Path) -> bool:
    """Whether `path` is a response log (its first line has an `event`) rather than a groups trace."""
    try:
        with path.open() as f:
            for line in f:
                if line.strip():
                    return "event" in json.loads(line)
    except (OSError, ValueError):
        return False
    return False


def read_response_log(path: Path) -> RunLog:
    log = RunLog()
    for no, line in numbered_lines(path):
        try:
            x = json.loads(line)
            event, pid = str(x["event"]), str(x["pid"])
            attempt, idx, tokens = int(x["attempt"]), int(x["idx"]), int(x["tokens"])
            acc = bool(float(x["acc"]) > 0.5) if event == "judged" else None
            prompt = int(x.get("prompt_tokens", 1))
        except (ValueError, KeyError, TypeError) as err:
            raise WorkloadError(f"--replay {path}:{no}: not a response-log line ({err})") from None
        m = PID.match(pid)
        if m is None or event not in EVENTS or attempt < 1 or idx < 0 or tokens < 0:
            raise WorkloadError(
                f"--replay {path}:{no}: pid {pid!r} (want e<epoch>-<row>), event {event!r} (one of "
                f"{', '.join(EVENTS)}), attempt {attempt} (>= 1), idx {idx}, tokens {tokens} (>= 0)"
            )
        epoch, row = int(m[1]), int(m[2])
        log.attempts.setdefault((epoch, row, attempt), {})[idx] = Logged(event, tokens, acc)
        log.prompt_tokens[row] = max(1, prompt)
    if not log.attempts:
        raise WorkloadError(f"--replay {path}: the response log has no responses")
    return log


def pool_from_log(log: RunLog, cap: int, name: str) -> ReplayWorkload:
    """Each row's judged responses over the whole log, as a groups trace (rows never judged borrow
    another's: see the module docstring)."""
    per_row: dict[int, tuple[list[int], list[bool]]] = {}
    for (_, row, _), resp in sorted(log.attempts.items()):
        for x in resp.values():
            if x.event == "judged" and x.acc is not None:
                ls, acc = per_row.setdefault(row, ([], []))
                ls.append(x.tokens)
                acc.append(x.acc)
    if not per_row:
        raise WorkloadError(f"--replay {name}: the response log judged no response")
    groups = _rows(per_row, log.prompt_tokens, log.rows)
    return ReplayWorkload(groups, cap, f"{name} (pool: its own judged responses)")


def pool_from_logs(
    logs: list[RunLog], n: int, cap: int, name: str, seed: int = 0, rows: int | None = None
) -> ReplayWorkload:
    """The complete groups of several runs' logs — attempts whose n responses were all judged —
    as a groups trace, row by row in log order, so that each block of n is one real group.

    Why: a groups trace generated before a run holds the policy it started from; the policy a run
    trains moves (on the long-tail bench the valid rate of sync's groups went from 0.26 in the
    first three versions to 0.40 in the last three, the mean length from 312 to 289 tokens), and a
    simulation drawing from the trace asks for more groups per version than the run needed. Logs
    of sync runs are the unbiased source: sync judges every response it starts; an s = 0 run's
    complete groups are the ones that finished before an early stop, the shorter ones.
    `rows`: the dataset's size (default: the rows the logs name; a dataset's last rows may never
    have been drawn), so that the simulator feeds the same epoch order as the runs."""
    per_row: dict[int, tuple[list[int], list[bool]]] = {}
    prompts: dict[int, int] = {}
    for log in logs:
        prompts.update(log.prompt_tokens)
        for (_, row, _), resp in sorted(log.attempts.items()):
            if len(resp) != n or any(x.event != "judged" or x.acc is None for x in resp.values()):
                continue
            ls, acc = per_row.setdefault(row, ([], []))
            for i in sorted(resp):
                ls.append(resp[i].tokens)
                acc.append(bool(resp[i].acc))
    if not per_row:
        raise WorkloadError(f"{name}: no complete group of {n} judged responses in the response logs")
    named = max(log.rows for log in logs)
    if rows is not None and rows < named:
        raise WorkloadError(f"{name}: the response logs name row {named - 1}, the dataset has {rows} rows")
    groups = _rows(per_row, prompts, rows if rows is not None else named)
    return ReplayWorkload(groups, cap, name, seed)


def _rows(
    per_row: dict[int, tuple[list[int], list[bool]]], prompts: dict[int, int], rows: int
) -> list[tuple[int, list[int], list[bool]]]:
    """One group line per row 0..rows-1; a row with no responses borrows the next row that has
    some (a stride could cycle forever when it divides the rows)."""
    groups = []
    for r in range(rows):
        src = r
        while src not in per_row:  # per_row is not empty: this ends
            src = (src + 1) % rows
        ls, acc = per_row[src]
        groups.append((prompts.get(r, 1), ls, acc))
    return groups


class RunReplay:
    """The `Sampler` of a response log (module docstring)."""

    def __init__(self, log: RunLog, pool: ReplayWorkload, cap: int, name: str) -> None:
        if pool.dataset_size < log.rows:
            raise WorkloadError(
                f"replay {name}: the log names row {log.rows - 1}, the pool has {pool.dataset_size} rows"
            )
        self.log = log
        self.pool = pool
        self.cap = cap
        self.unresolved = 0  # aborted responses longer than every pool response of their row
        self.from_log = 0  # attempts replayed from the log
        self.from_pool = 0  # attempts the run never made: the pool's
        self.spec = WorkloadSpec(
            name=f"replay-run:{name}",
            source=f"response log {name} ({len(log.attempts)} attempts; pool {pool.spec.source})",
            length_median=pool.spec.length_median,
            max_response_length=max(cap, 1),
        )

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dataset_size(self) -> int:
        return self.pool.dataset_size

    def prompt_length(self, index: int) -> int:
        row = index % self.dataset_size
        return self.log.prompt_tokens.get(row) or self.pool.prompt_length(row)

    def attempt(self, index: int, attempt: int, n: int) -> Attempt:
        """Attempt `attempt` of the prompt at feed index `index` (epoch × rows + row)."""
        epoch, row = divmod(index, self.dataset_size)
        logged = self.log.attempts.get((epoch, row, attempt))
        if logged is None:
            self.from_pool += 1
            return self.pool.attempt(index, attempt, n)
        self.from_log += 1
        _, lengths, right = self.pool.groups[row]
        out_l: list[int] = []
        out_r: list[bool] = []
        for i in range(n):
            x = logged.get(i)
            if x is not None and x.event == "judged" and x.acc is not None:
                length, ok = x.tokens, x.acc
            elif x is not None and x.event == "late":
                near = min(range(len(lengths)), key=lambda k: (abs(lengths[k] - x.tokens), k))
                length, ok = x.tokens, right[near]
            else:
                had = x.tokens if x is not None else 0
                longer = [k for k in range(len(lengths)) if lengths[k] > had]
                if longer:
                    k = longer[(row * 1_000_003 + epoch * 131 + attempt * STRIDE + i * 31) % len(longer)]
                    length, ok = lengths[k], right[k]
                else:
                    self.unresolved += 1
                    k = max(range(len(lengths)), key=lambda j: (lengths[j], -j))
                    length, ok = had + 1, right[k]
            out_l.append(length if length < self.cap else self.cap + 1)
            out_r.append(bool(ok))
        return Attempt(out_l, out_r)


def load_run_replay(path: Path, cap: int, pool: ReplayWorkload | None = None) -> RunReplay:
    """A response log as a `Sampler`, over `pool` (a groups trace of the same dataset) or, without
    one, over the log's own judged responses."""
    log = read_response_log(path)
    return RunReplay(log, pool if pool is not None else pool_from_log(log, cap, path.name), cap, path.name)

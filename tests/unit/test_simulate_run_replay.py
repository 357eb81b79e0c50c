"""SIMULATOR replay of a run's own response log (scheduler --response-log): judged responses come
back as they were, an aborted one as a pool response longer than what it had, a late one with the
length it had; attempts the run never made are the pool's; the simulator meets them in the run's
order, epoch by epoch; bad logs are refused with the line that is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncdapo.cli import main
from asyncdapo.contracts.config import RunConfig
from asyncdapo.tools.simulate.driver import Simulation
from asyncdapo.tools.simulate.modes import mode_config
from asyncdapo.tools.simulate.profile import load_cluster
from asyncdapo.tools.simulate.replay import load_replay
from asyncdapo.tools.simulate.run_replay import (
    is_response_log,
    load_run_replay,
    pool_from_logs,
    read_response_log,
)
from asyncdapo.tools.simulate.workload import WorkloadError

N, ROWS, CAP = 4, 6, 1000


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return path


def judged(pid: str, attempt: int, idx: int, tokens: int, acc: float, prompt: int = 30) -> dict[str, Any]:
    return {"t": 0.0, "event": "judged", "pid": pid, "attempt": attempt, "idx": idx, "tokens": tokens,
            "acc": acc, "prompt_tokens": prompt}  # fmt: skip


def cut(event: str, pid: str, attempt: int, idx: int, tokens: int) -> dict[str, Any]:
    return {"t": 0.0, "event": event, "pid": pid, "attempt": attempt, "idx": idx, "tokens": tokens}


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    """Row k: 2n responses 100k + 10 j long (j = 0..2n-1), right when j is even."""
    return write(
        tmp_path / "pool.jsonl",
        [
            {"prompt_tokens": 20 + k, "lengths": [100 * k + 10 * j for j in range(2 * N)],
             "acc": [j % 2 == 0 for j in range(2 * N)]}
            for k in range(ROWS)
        ],
    )  # fmt: skip


def test_judged_responses_replay_exactly_and_the_cap_cuts(tmp_path: Path, pool: Path) -> None:
    log = write(
        tmp_path / "r.jsonl",
        [judged("e0-2", 1, i, [5, 17, CAP, 40][i], i % 2, prompt=77) for i in range(N)],
    )
    assert is_response_log(log) and not is_response_log(pool)
    wl = load_run_replay(log, CAP, load_replay(pool, CAP))
    a = wl.attempt(2, 1, N)
    assert a.lengths == [5, 17, CAP + 1, 40]  # at the cap: cut there, natural length unknown
    assert a.right == [False, True, False, True]
    assert wl.prompt_length(2) == 77 and wl.prompt_length(3) == 23  # the log's, else the pool's
    assert wl.dataset_size == ROWS


def test_aborted_and_missing_responses_are_drawn_longer_than_they_had(tmp_path: Path, pool: Path) -> None:
    rows = [judged("e0-3", 1, 0, 12, 1.0), cut("aborted", "e0-3", 1, 1, 345), cut("late", "e0-3", 1, 2, 333)]
    wl = load_run_replay(write(tmp_path / "r.jsonl", rows), CAP, load_replay(pool, CAP))
    a = wl.attempt(3, 1, N)
    pool3 = [300 + 10 * j for j in range(2 * N)]
    assert a.lengths[0] == 12 and a.right[0]
    assert a.lengths[1] in pool3 and a.lengths[1] > 345  # aborted at 345: a pool answer beyond it
    assert a.right[1] == (pool3.index(a.lengths[1]) % 2 == 0)
    assert a.lengths[2] == 333 and a.right[2] is False  # late: its own length; verdict of pool's 330 (j=3)
    assert a.lengths[3] in pool3  # never ended in the log: any of the row's answers
    assert wl.attempt(3, 1, N).lengths == a.lengths  # a fixed pick: every mode sees the same
    assert wl.unresolved == 0
    # longer than every pool answer of its row: one token more than it had, counted
    far = load_run_replay(
        write(tmp_path / "f.jsonl", [cut("aborted", "e0-3", 1, 0, 900)]), CAP, load_replay(pool, CAP)
    )
    assert far.attempt(3, 1, N).lengths[0] == 901 and far.unresolved == 1


def test_attempts_the_run_never_made_are_the_pools_and_epochs_stay_apart(tmp_path: Path, pool: Path) -> None:
    rows = [judged("e0-1", 1, i, 7, 1.0) for i in range(N)] + [judged("e1-1", 2, i, 9, 0.0) for i in range(N)]
    p = load_replay(pool, CAP)
    wl = load_run_replay(write(tmp_path / "r.jsonl", rows), CAP, p)
    assert wl.attempt(1, 1, N).lengths == [7] * N  # epoch 0, row 1
    assert wl.attempt(ROWS + 1, 2, N).lengths == [9] * N  # epoch 1, row 1, attempt 2
    assert wl.attempt(ROWS + 1, 1, N).lengths == p.attempt(ROWS + 1, 1, N).lengths  # not in the log
    assert wl.attempt(1, 2, N).lengths == p.attempt(1, 2, N).lengths
    assert (wl.from_log, wl.from_pool) == (2, 2)


def test_without_a_pool_the_logs_own_judged_responses_are_the_pool(tmp_path: Path) -> None:
    rows = [judged("e0-0", 1, i, 50 + i, i % 2) for i in range(N)] + [
        judged("e0-2", 1, i, 80 + i, 1.0) for i in range(N)
    ]
    wl = load_run_replay(write(tmp_path / "r.jsonl", [*rows, cut("aborted", "e0-2", 2, 0, 81)]), CAP)
    assert wl.dataset_size == 3
    assert wl.attempt(2, 2, N).lengths[0] in (82, 83)  # row 2's own answers longer than 81
    assert sorted(wl.attempt(1, 1, N).lengths) in ([50, 51, 52, 53], [80, 81, 82, 83])  # row 1: borrowed


def test_complete_groups_of_several_logs_are_one_pool_block_by_block(tmp_path: Path) -> None:
    """Blocks of n are the runs' real groups (validity is a property of a group); an attempt with
    a response that did not end judged is left out; rows no log saw borrow the next one."""
    one = write(
        tmp_path / "a.jsonl",
        [judged("e0-1", 1, i, 10 + i, float(i == 0)) for i in reversed(range(N))]  # written out of order
        + [judged("e0-3", 1, i, 50, 0.0) for i in range(N - 1)] + [cut("aborted", "e0-3", 1, N - 1, 9)]
        + [judged("e0-3", 2, i, 60 + i, 1.0, prompt=41) for i in range(N)],
    )  # fmt: skip
    two = write(tmp_path / "b.jsonl", [judged("e1-1", 1, i, 20 + i, 1.0) for i in range(N)])
    pool = pool_from_logs([read_response_log(one), read_response_log(two)], N, CAP, "cal", seed=1, rows=ROWS)
    assert pool.dataset_size == ROWS and pool.seed == 1
    assert pool.groups[1][1] == [10, 11, 12, 13, 20, 21, 22, 23]
    assert pool.groups[1][2] == [True, False, False, False, True, True, True, True]
    assert pool.groups[3][1] == [60, 61, 62, 63] and pool.groups[3][0] == 41
    assert pool.groups[4][1] == pool.groups[5][1] == pool.groups[0][1] == pool.groups[1][1]  # borrowed
    assert pool.groups[2][1] == pool.groups[3][1]
    # the simulator's realisation k meets block (a - 1 + k) of the row: group 2 of row 1 at seed 1
    assert pool.attempt(1, 1, N).lengths == [20, 21, 22, 23]
    with pytest.raises(WorkloadError, match="no complete group of 5 judged"):
        pool_from_logs([read_response_log(one)], N + 1, CAP, "cal")
    with pytest.raises(WorkloadError, match="the dataset has 2 rows"):
        pool_from_logs([read_response_log(one)], N, CAP, "cal", rows=2)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"event": "judged", "pid": "p-1", "attempt": 1, "idx": 0, "tokens": 3, "acc": 1}', "pid 'p-1'"),
        ('{"event": "done", "pid": "e0-1", "attempt": 1, "idx": 0, "tokens": 3}', "event 'done'"),
        ('{"event": "judged", "pid": "e0-1", "attempt": 1, "idx": 0, "tokens": 3}', "'acc'"),
        ('{"event": "aborted", "pid": "e0-1", "attempt": 0, "idx": 0, "tokens": 3}', "attempt 0"),
        ("not json", "not a response-log line"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(tmp_path: Path, line: str, why: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(judged("e0-0", 1, 0, 5, 1.0)) + "\n" + line + "\n")
    with pytest.raises(WorkloadError, match=f"bad.jsonl:2: .*{why}"):
        read_response_log(path)


def test_a_pool_smaller_than_the_log_is_refused(tmp_path: Path, pool: Path) -> None:
    log = write(tmp_path / "r.jsonl", [judged(f"e0-{ROWS + 2}", 1, 0, 5, 1.0)])
    with pytest.raises(WorkloadError, match=f"names row {ROWS + 2}, the pool has {ROWS} rows"):
        load_run_replay(log, CAP, load_replay(pool, CAP))


def test_the_simulator_replays_the_logged_groups_it_trains(tmp_path: Path, pool: Path) -> None:
    """Sync with one attempt per prompt: every trained group is a logged attempt, with the logged
    lengths."""
    run: dict[str, Any] = {
        "name": "sim",
        "data": {"train_batch_size": 2, "max_response_length": CAP, "max_prompt_length": 128},
        "rollout": {"n": N, "max_concurrent_prompts": 4},
        "trainer": {"ppo_mini_batch_size": 2},
    }
    cfg = mode_config(RunConfig.model_validate(run), "sync")
    rows = [judged(f"e{e}-{r}", 1, i, 10 * r + i + 1 + 100 * e, i % 2) for e in range(2) for r in range(ROWS) for i in range(N)]  # fmt: skip
    wl = load_run_replay(write(tmp_path / "r.jsonl", rows), CAP, load_replay(pool, CAP))
    drawn: dict[tuple[int, int], list[int]] = {}
    replay = wl.attempt

    def spy(index: int, attempt: int, n: int) -> Any:
        a = replay(index, attempt, n)
        drawn[(index, attempt)] = a.lengths
        return a

    wl.attempt = spy  # type: ignore[method-assign]
    res = Simulation(cfg, load_cluster("h100-7b", 2), wl, 4).simulate()
    assert len(res.steps) == 4 and drawn
    p = load_replay(pool, CAP)
    for (index, attempt), lengths in drawn.items():
        epoch, r = divmod(index, ROWS)
        logged = [10 * r + i + 1 + 100 * epoch for i in range(N)]
        assert lengths == (logged if attempt == 1 and epoch < 2 else p.attempt(index, attempt, N).lengths)
    assert any(index < 2 * ROWS for index, _ in drawn)
    totals = sorted(sum(x) for x in drawn.values())
    pairs = {a + b for i, a in enumerate(totals) for b in totals[i + 1 :]}
    assert all(st.tokens in pairs for st in res.steps)


def test_the_command_takes_a_response_log(
    tmp_path: Path, pool: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [judged(f"e0-{r}", 1, i, 10 * r + i + 1, i % 2) for r in range(ROWS) for i in range(N)]
    log = write(tmp_path / "r.jsonl", rows)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "name: sim\ndata: {train_batch_size: 2, max_response_length: 1000, max_prompt_length: 128}\n"
        "rollout: {n: 4, max_concurrent_prompts: 4}\ntrainer: {ppo_mini_batch_size: 2}\n"
    )
    args = ["simulate", str(cfg), "--cluster", "h100-7b", "--engines", "2", "--modes", "sync,async",
            "--versions", "2", "--out", str(tmp_path / "out"), "--no-png", "--replay", str(log)]  # fmt: skip
    assert main([*args, "--replay-pool", str(pool)]) == 0
    out = capsys.readouterr().out
    assert "replay-run:r.jsonl" in out and "RESULT" in out
    assert main(args) == 0  # the log's own judged responses as the pool
    assert main([*args[:-2], "--replay", str(pool), "--replay-pool", str(pool)]) == 2
    assert "--replay-pool goes with a --replay that is a scheduler --response-log" in capsys.readouterr().err

"""Policy-version runs: run-length bookkeeping of which weights produced which tokens."""

from __future__ import annotations

import pytest

from asyncdapo.services.gateway.versions import (
    RunTracker,
    append_run,
    check_runs,
    concat,
    runs_from_spans,
    total,
)


def test_tokens_before_and_after_a_reload_form_two_runs() -> None:
    tracker = RunTracker()
    for _ in range(5):
        tracker.add(3)
    tracker.add(4, 2)
    tracker.add(4)
    assert tracker.runs == [(3, 5), (4, 3)]
    assert tracker.num_tokens == 8


def test_append_merges_equal_neighbours_and_ignores_empty_runs() -> None:
    runs = [(1, 2)]
    append_run(runs, 1, 3)
    append_run(runs, 2, 0)
    assert runs == [(1, 5)]
    with pytest.raises(ValueError, match="num_tokens"):
        append_run(runs, 2, -1)


def test_concat_of_continuation_and_new_tokens_merges_at_the_seam() -> None:
    assert concat([(0, 4), (1, 2)], [(1, 3), (2, 1)]) == [(0, 4), (1, 5), (2, 1)]
    assert concat([], [(7, 1)]) == [(7, 1)]
    assert total(concat([(0, 4)], [(1, 3)])) == 7


def test_runs_from_contiguous_spans() -> None:
    assert runs_from_spans([(0, 0, 10), (1, 10, 25)]) == [(0, 10), (1, 15)]
    assert runs_from_spans([(0, 0, 3), (0, 3, 5)]) == [(0, 5)]
    assert runs_from_spans([]) == []
    with pytest.raises(ValueError, match="not contiguous"):
        runs_from_spans([(0, 0, 3), (1, 4, 6)])


def test_check_runs_names_the_field_and_the_problem() -> None:
    assert check_runs([(0, 2), (0, 1), (1, 2)], 5, "continuation_versions") == [(0, 3), (1, 2)]
    with pytest.raises(ValueError, match=r"continuation_versions cover 3 tokens but there are 4"):
        check_runs([(0, 3)], 4, "continuation_versions")
    with pytest.raises(ValueError, match=r"continuation_versions\[1\].num_tokens must be > 0"):
        check_runs([(0, 3), (1, 0)], 3, "continuation_versions")
    with pytest.raises(ValueError, match=r"continuation_versions\[0\].version must be >= 0"):
        check_runs([(-1, 3)], 3, "continuation_versions")
    assert check_runs([], 0, "continuation_versions") == []

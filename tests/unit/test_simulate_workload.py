"""SIMULATOR workload model: the presets match the published figures they cite (within the stated
tolerances), samples are a function of (seed, prompt, attempt), and the valid rate is solved."""

from __future__ import annotations

import pytest

from asyncdapo.tools.simulate.presets import PRESETS, TARGETS, load_workload
from asyncdapo.tools.simulate.workload import Workload, WorkloadError, WorkloadSpec, _valid_prob, sample_stats


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_matches_its_cited_statistics(name: str) -> None:
    spec = PRESETS[name]
    assert spec.source, "every preset cites what it is calibrated to"
    st = sample_stats(Workload(spec, seed=0), 16, spec.max_response_length, groups=3000).row()
    misses = {k: st[k] for k, (lo, hi) in TARGETS[name].items() if not lo <= st[k] <= hi}
    assert not misses, f"{name}: {misses} outside {TARGETS[name]}"


@pytest.mark.parametrize("rate", [0.2, 0.5, 0.7])
def test_valid_rate_is_solved(rate: float) -> None:
    spec = WorkloadSpec(name="v", length_median=100, max_response_length=4096, valid_rate=rate)
    assert _valid_prob(spec.mean_accuracy, spec.concentration, 16) == pytest.approx(rate, abs=1e-6)
    st = sample_stats(Workload(spec), 16, 1 << 20, groups=3000)
    assert st.valid_rate == pytest.approx(rate, abs=0.03)


def test_unreachable_valid_rate_is_a_clear_error() -> None:
    with pytest.raises(WorkloadError, match="unreachable"):
        _ = WorkloadSpec(
            name="v", length_median=100, max_response_length=10, valid_rate=0.99, mean_accuracy=0.9
        ).concentration


def test_samples_depend_on_seed_prompt_and_attempt_only() -> None:
    w1, w2 = load_workload("rollpacker-14b", seed=3), load_workload("rollpacker-14b", seed=3)
    assert w1.attempt(17, 1, 16) == w2.attempt(17, 1, 16)
    assert w1.attempt(17, 2, 16) != w1.attempt(17, 1, 16)  # a requeued attempt samples anew
    assert w1.prompt(17) == w1.prompt(17) and w1.prompt(17) != load_workload("rollpacker-14b", 4).prompt(17)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_an_attempt_does_not_depend_on_what_was_drawn_before_and_is_the_callers_copy(name: str) -> None:
    # answers are computed a chunk of prompts at a time (`Workload._answers`) and cached
    fresh = load_workload(name, seed=1).attempt(1030, 1, 16)
    w = load_workload(name, seed=1)
    for i in range(0, 2100, 97):  # other prompts, chunks, attempts and group sizes first
        for attempt, n in ((1, 16), (2, 16), (1, 8)):
            w.attempt(i, attempt, n)
    got = w.attempt(1030, 1, 16)
    assert got == fresh and len(got.lengths) == 16 and all(x >= 1 for x in got.lengths)
    got.lengths[0], got.right[0] = -1, not got.right[0]
    assert w.attempt(1030, 1, 16) == fresh


def test_wrong_answers_are_longer_by_the_ratio() -> None:
    spec = WorkloadSpec(name="r", length_median=200, max_response_length=1 << 20, wrong_length_ratio=3.0)
    st = sample_stats(Workload(spec), 16, 1 << 20, groups=2000)
    assert st.wrong_right_ratio == pytest.approx(3.0, rel=0.1)


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(WorkloadError, match="rollpacker-14b"):
        load_workload("nope")

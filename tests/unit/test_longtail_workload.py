"""The long-tail workload (asyncdapo.tools.data.longtail) and its statistics (asyncdapo.tools.data.longtail_stats)."""

from __future__ import annotations

import random
import re
import statistics

import pytest

from asyncdapo.contracts.verl_format import DatasetError
from asyncdapo.tools.data.longtail import (
    CLASS_VALID_RATE,
    DESIGN_VALID_RATE,
    FIRST_CLASS_VALID_RATE,
    Difficulty,
    LongTailSpec,
    dataset,
    demonstration,
    difficulty,
    medium_fraction,
    problems,
)
from asyncdapo.tools.data.longtail_stats import GroupSample, Sample, percentile, summarize


def _problem(a: int, op: str, b: int):
    return next(
        p for p in problems() if (p.extra_info["a"], p.extra_info["op"], p.extra_info["b"]) == (a, op, b)
    )


def _boxed(text: str) -> int:
    m = re.search(r"\\boxed\{(-?\d+)\}$", text)
    assert m, text
    return int(m.group(1))


def test_problems_cover_every_operand_pair_once_with_the_right_answer() -> None:
    ps = problems()
    assert len(ps) == 200 and len({p.prompt[0]["content"] for p in ps}) == 200
    for p in ps:
        a, op, b = p.extra_info["a"], p.extra_info["op"], p.extra_info["b"]
        assert int(p.ground_truth) == (a + b if op == "+" else a - b)
        assert p.extra_info["difficulty"] == difficulty(b).value


def test_demonstrations_are_right_or_wrong_by_difficulty_and_hold_no_digit_before_the_answer() -> None:
    spec = LongTailSpec(max_response_length=512)
    rng = random.Random(0)
    for (a, b), wrong_share in {(4, 1): 0.0, (4, 5): 0.5, (4, 8): 1.0}.items():
        p = _problem(a, "+", b)
        demos = [demonstration(p, rng, spec) for _ in range(400)]
        wrong = sum(_boxed(d) != a + b for d in demos) / len(demos)
        assert abs(wrong - wrong_share) < 0.08, (a, b, wrong)
        # a response cut before its \boxed{} has no number for math-verify to find
        assert all(not re.search(r"\d", d[: d.index("\\boxed")]) for d in demos)
        # a wrong answer is off by one and takes one more block (Step E)
        assert all((_boxed(d) == a + b + 1) == ("Step E:" in d) for d in demos)


def test_length_scale_grows_with_the_first_operand_and_spreads_within_a_problem() -> None:
    spec = LongTailSpec(max_response_length=512)
    rng = random.Random(1)
    means = []
    for a in (0, 3, 6, 9):
        lengths = [len(demonstration(_problem(a, "+", 1), rng, spec)) for _ in range(300)]
        means.append(statistics.fmean(lengths))
        if a == 9:
            assert statistics.pstdev(lengths) / statistics.fmean(lengths) > 0.3  # a within-group spread
    assert means == sorted(means) and means[-1] > 5 * means[0]
    assert spec.mean_restatements(0) == pytest.approx(spec.min_mean)
    assert spec.mean_restatements(9) == pytest.approx(spec.max_mean)


def test_spec_rejects_a_cap_too_small_for_the_format() -> None:
    with pytest.raises(ValueError, match="max_response_length"):
        LongTailSpec(max_response_length=32)
    with pytest.raises(ValueError, match="steps"):
        LongTailSpec(steps=0)


def test_datasets_mix_classes_for_the_target_valid_rate() -> None:
    for rates, per_class in (
        ((0.3, 0.5, 0.7), DESIGN_VALID_RATE),
        ((0.7, 0.8), CLASS_VALID_RATE),  # the measured warm start (docs/workloads.md)
        ((0.3, 0.35), FIRST_CLASS_VALID_RATE),
    ):
        for rate in rates:
            rows = dataset(rate, size=112, seed=0, class_valid=per_class)
            assert len(rows) == 112 and [e.index for e in rows] == list(range(112))
            assert len({e.prompt[0]["content"] for e in rows}) == 112
            share = {d: sum(e.extra_info["difficulty"] == d.value for e in rows) / 112 for d in Difficulty}
            expected = sum(share[d] * per_class[d] for d in Difficulty)
            assert expected == pytest.approx(rate, abs=0.02)
            assert medium_fraction(rate, per_class) == pytest.approx(share[Difficulty.MEDIUM], abs=0.01)
    assert dataset(0.7, seed=3) == dataset(0.7, seed=3)


def test_an_unreachable_valid_rate_is_a_clear_error() -> None:
    with pytest.raises(DatasetError, match="out of this workload's reach"):
        dataset(0.99)
    with pytest.raises(DatasetError, match="use a smaller size"):
        dataset(0.7, size=190, class_valid=DESIGN_VALID_RATE)


def test_summarize_measures_what_the_groups_hold() -> None:
    def g(klass: str, *rs: tuple[int, bool, bool]) -> GroupSample:
        return GroupSample(klass, tuple(Sample(n, t, a) for n, t, a in rs))

    groups = [
        g("easy", (10, False, True), (12, False, True)),  # all right: filtered
        g("medium", (40, False, True), (80, False, False)),  # valid
        g("hard", (100, False, False), (128, True, False)),  # all wrong: filtered
        g("medium", (20, False, False), (30, False, True)),  # valid
        g("easy", (128, True, False), (14, False, True)),  # valid (the truncated one is wrong)
    ]
    s = summarize(groups, max_response_length=128, overlong_buffer=32)
    assert s.groups == 5 and s.responses == 10
    assert s.valid_rate == pytest.approx(3 / 5)
    assert s.truncated_rate == pytest.approx(2 / 10)
    assert s.overlong_penalised_rate == pytest.approx(3 / 10)  # > 96 tokens
    assert s.accuracy == pytest.approx(5 / 10)
    assert s.length["max"] == 128 and s.length["p50"] == percentile(
        [g.length for x in groups for g in x.responses], 50
    )
    assert s.wrong_right_length_ratio > 1 and s.length_acc_corr < 0
    assert s.by_class["medium"]["valid_rate"] == 1.0 and s.by_class["hard"]["valid_rate"] == 0.0
    with pytest.raises(ValueError):
        summarize([], 128, 32)


def test_sft_refuses_slips_with_drawn_demonstrations(tmp_path) -> None:
    from asyncdapo.tools.sft import supervised_warm_start

    with pytest.raises(ValueError, match="slip_fraction"):
        supervised_warm_start(
            tmp_path / "none", problems()[:2], tmp_path / "out", steps=1, slip_fraction=0.5,
            demonstrate=lambda e, rng: "x",
        )  # fmt: skip


def test_cap_cost_prices_a_cap_on_the_measured_lengths() -> None:
    from asyncdapo.tools.data.longtail_stats import cap_cost

    # 10 groups of 2: lengths 10..100 and 100..190 (p80 of all 20 lengths, nearest rank 16: 150)
    groups = [
        GroupSample("", (Sample(10 * (k + 1), False, True), Sample(100 + 10 * k, False, False)))
        for k in range(10)
    ]
    c = cap_cost(groups, 0.8, 1.0, 512)
    assert c.cap == 150
    capped = [x for g in groups for x in (r.length for r in g.responses) if x >= 150]  # 150 … 190
    total = sum(r.length for g in groups for r in g.responses)
    assert c.break_rate == pytest.approx(len(capped) / 20)
    assert c.group_break_rate == pytest.approx(5 / 10)
    assert c.recompute_share == pytest.approx(150 * 5 / total)
    assert c.heavy_decode_share == pytest.approx(sum(x - 150 for x in capped) / total)
    # a cap at or above the run's max_tokens caps nothing (the pdsr policy leaves such requests alone)
    none = cap_cost(groups, 0.8, 4.0, 512)
    assert none.cap == 512 and none.break_rate == 0 and none.recompute_share == 0
    # the statistics carry the grid of caps, the bench's setting (p80 x 1.5) first
    s = summarize(groups, 512, 64)
    assert (s.cap_costs[0].quantile, s.cap_costs[0].cap_factor) == (0.8, 1.5)
    assert s.as_dict()["cap_costs"][0]["cap"] == 225


def test_a_group_writes_the_simulators_replay_line(tmp_path) -> None:
    import json

    from asyncdapo.tools.simulate.replay import load_replay

    g = GroupSample("easy", (Sample(30, False, True), Sample(512, True, False)), prompt_tokens=25)
    line = g.trace_line("train-v0.5-3")
    assert line == {"prompt_id": "train-v0.5-3", "prompt_tokens": 25, "lengths": [30, 512], "acc": [1, 0]}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert load_replay(path, 512).spec.name.startswith("replay")  # the simulator reads it back


def test_answer_weight_marks_the_boxed_answer_and_weighs_its_loss() -> None:
    import torch

    from asyncdapo.tools.sft import _backward, _demonstrated

    class Uniform(torch.nn.Module):
        """Logits that give every token the same loss, plus a learnable bias on token 0 only."""

        def __init__(self) -> None:
            super().__init__()
            self.b = torch.nn.Parameter(torch.zeros(()))

        def forward(self, input_ids, attention_mask):
            logits = torch.zeros(*input_ids.shape, 16)
            logits[..., 0] = self.b
            return type("Out", (), {"logits": logits})()

    # one response: 4 body tokens, 2 answer tokens; token 0 only among the answer's
    batch = [([5, 5, 1, 2, 3, 4, 0, 0], 2, 6)]
    grads = []
    for w in (1.0, 10.0):
        m = Uniform()
        _backward(m, batch, pad=0, micro_batch_tokens=None, answer_weight=w)
        grads.append(float(m.b.grad))
    # the bias's gradient comes from the answer tokens (target 0) pulling it up and the body pushing it
    # down; weighing the answer 10x makes the pull dominate
    assert grads[0] > grads[1]

    # where the answer starts: the first token of the last "\boxed{"
    class Tok:
        eos_token_id = 99

        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
            words = text.split(" ")
            offs, at = [], 0
            for wd in words:
                offs.append((at, at + len(wd)))
                at += len(wd) + 1
            return {"input_ids": list(range(len(words))), "offset_mapping": offs}

    ids, plen, ans = _demonstrated([7, 7], "Step A: x \\boxed{3}", Tok(), "\\boxed{")
    assert plen == 2 and ids[-1] == 99 and ans == 2 + 3  # the 4th word starts the answer
    ids, plen, ans = _demonstrated([7], "no answer here", Tok(), "\\boxed{")
    assert ans == len(ids) - 1  # only the EOS


def test_a_problem_trace_becomes_a_dataset_trace_and_its_groups() -> None:
    """Row k of a dataset replays its own problem's line; the line's 2n responses are two groups,
    a response at the cap counted as truncated."""
    from asyncdapo.tools.data.longtail import dataset_by_pass_rates, problems
    from asyncdapo.tools.data.longtail_stats import dataset_trace, summarize, trace_groups
    from asyncdapo.tools.data.pass_rates import PassRate

    every = problems()
    lines = [
        {"prompt_id": f"problems-{i}", "prompt_tokens": 20, "lengths": [i, 512] * 4, "acc": [1, 0] * 4}
        for i in range(len(every))
    ]
    rates = [PassRate(0 if e.extra_info["difficulty"] == "hard" else 16, 32) for e in every]
    rows, mix = dataset_by_pass_rates(0.5, rates, 4, max_size=40)
    trace = dataset_trace(rows, lines, "train-v0.5")
    assert [t["lengths"][0] for t in trace] == mix.indices
    assert [t["prompt_id"] for t in trace] == [f"train-v0.5-{k}" for k in range(len(rows))]
    groups = trace_groups(trace, 4, 512, [str(e.extra_info["difficulty"]) for e in rows])
    assert len(groups) == 2 * len(rows) and all(g.valid for g in groups)
    st = summarize(groups, 512, 64)
    assert st.truncated_rate == pytest.approx(0.5) and st.valid_rate == 1.0

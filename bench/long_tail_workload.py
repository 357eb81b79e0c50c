"""The long-tail workload of `bench_e2e.py`: the demo's tiny model, warm-started on a mix of direct
answers and worked solutions, so that response lengths vary the way they do in RL on math.

Why a variant: the demo's warm-start teaches only `\\boxed{N}` (about 6 tokens); at temperature 1.0
its 512 sampled responses to 64 training prompts were all 6 or 7 tokens long. With every response
the same length there is no tail for early stop to cut, and a sync/async comparison would measure
scheduling overhead only. Real reasoning models answer some samples briefly and others at length,
and a few never stop before `max_response_length` (what DAPO's overlong shaping is about).

A uniform 50 % accuracy is not realistic either: every group of 8 would then have reward variance,
DAPO's dynamic sampling would filter nothing (the first version of this workload measured a
valid-group ratio of 0.98), and the sync loop would never need a second generation batch. In RL on
math, easy problems come out all-correct and hard ones all-wrong — both filtered — and hard
problems take the longest solutions. So difficulty grows with the second operand b, which also
sets the length of a worked solution.

The variant keeps the demo's prompts, tokenizer and random-weight base model; only the
demonstrations change. Each training problem contributes 8 demonstrations (the warm-start samples
them uniformly, so the mix is per sample, not per problem): 6 direct answers (`\\boxed{11}`, or
`\\boxed{12}` when wrong: off by one) and 2 worked solutions (`6 + 1 = 7, 7 + 1 = 8, ..., 10 + 1 =
11. \\boxed{11}`, or a miscount: one step too many). The wrong share is 0 for b <= 2, 1/2 for
3 <= b <= 6 and 1 for b >= 7. Sampled at temperature 1.0, about a quarter of the responses are
worked solutions of 10–110 tokens and the rest 6–7 tokens; easy and hard problems mostly give
filtered groups, medium ones valid groups. The demo's assets and defaults are untouched: this model
is cached separately.
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncdapo.contracts.verl_format import Example, load_examples

# demonstrations per training problem, by kind; the wrong ones among them: see wrong_share
COPIES = {"direct": 6, "worked": 2}
SFT_STEPS = 600
SFT_LR = 3e-3
SFT_SEED = 0


def worked_solution(a: int, op: str, b: int, miscount: bool = False) -> str:
    """Count from `a` towards the result one unit at a time; `miscount` takes one step too many."""
    if op not in ("+", "-"):
        raise ValueError(f"worked solutions are defined for + and -, got {op!r}")
    unit = 1 if op == "+" else -1
    steps = b + (1 if miscount else 0)
    if steps == 0:
        return f"{a} {op} 0 = {a}. \\boxed{{{a}}}"
    chain, x = [], a
    for _ in range(steps):
        chain.append(f"{x} {op} 1 = {x + unit}")
        x += unit
    return ", ".join(chain) + f". \\boxed{{{x}}}"


def wrong_share(b: int) -> float:
    """Share of wrong demonstrations of a problem with second operand b (its difficulty)."""
    return 0.0 if b <= 2 else 1.0 if b >= 7 else 0.5


def demonstrations(e: Example) -> list[Example]:
    """The 8 demonstrations of one synthetic problem (see COPIES and wrong_share)."""
    a, op, b = int(e.extra_info["a"]), str(e.extra_info["op"]), int(e.extra_info["b"])
    answer = int(e.ground_truth)
    texts = {
        ("direct", True): f"\\boxed{{{answer}}}",
        ("direct", False): f"\\boxed{{{answer + 1}}}",
        ("worked", True): worked_solution(a, op, b),
        ("worked", False): worked_solution(a, op, b, miscount=True),
    }
    out = []
    for kind, copies in COPIES.items():
        wrong = round(copies * wrong_share(b))
        for right in [False] * wrong + [True] * (copies - wrong):
            info = {**e.extra_info, "solution": texts[kind, right]}
            out.append(Example(e.prompt, e.ground_truth, e.data_source, e.index, info))
    return out


def build_model(base_model: Path, train_file: Path, out_dir: Path) -> Path:
    """Warm-start `base_model` on the mixed demonstrations into `out_dir` (cached: reused when present)."""
    from asyncdapo.tools.sft import supervised_warm_start

    stamp = out_dir / "longtail.json"
    recipe = {
        "copies": COPIES, "wrong_share": [wrong_share(b) for b in range(10)],
        "steps": SFT_STEPS, "lr": SFT_LR, "seed": SFT_SEED, "base": str(base_model), "data": str(train_file),
    }  # fmt: skip
    if stamp.exists() and json.loads(stamp.read_text()) == recipe:
        return out_dir
    examples = [d for e in load_examples([str(train_file)]) for d in demonstrations(e)]
    res = supervised_warm_start(base_model, examples, out_dir, steps=SFT_STEPS, lr=SFT_LR, seed=SFT_SEED)
    print(
        f"warm-started the long-tail model in {res.wall_s:.0f} s (final loss {res.final_loss:.3f}): {out_dir}"
    )
    stamp.write_text(json.dumps(recipe))
    return out_dir

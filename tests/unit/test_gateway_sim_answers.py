"""The SIMULATOR's answer-key mode: labelled responses the real verifier scores with variance."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path

import pytest

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.services.gateway.engine import EngineRequest, Finish, Sampling
from asyncdapo.services.gateway.sim_answers import (
    AnswerKeyError,
    AnswerSheet,
    build_answer_key,
    load_answer_key,
    main,
    prompt_key,
    write_answer_key,
    wrong_answer,
)
from asyncdapo.services.gateway.sim_engine import SimTiming, SimulatedEngine
from asyncdapo.services.verifier.math_verdict import score_pair


@pytest.fixture(scope="module")
def assets(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:
    """(model dir, answer key file, examples) for 30 synthetic problems."""
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits

    root = tmp_path_factory.mktemp("sim-answers")
    train, val = synth_splits(24, 6, seed=3, spec=SynthSpec(ops=("+", "-"), max_operand=9))
    write_examples(train, root / "train.parquet")
    write_examples(val, root / "val.parquet")
    key = root / "answers.json"
    assert main(["--model", str(tiny_model_dir), "--data", str(root / "train.parquet"),
                 str(root / "val.parquet"), "--out", str(key)]) == 0  # fmt: skip
    return tiny_model_dir, key, train + val


def _sheet(model: Path, key: Path, accuracy: float = 0.5) -> AnswerSheet:
    from tokenizers import Tokenizer

    cfg = json.loads((model / "config.json").read_text())
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    return AnswerSheet(
        load_answer_key(key),
        tok,
        vocab_size=cfg["vocab_size"],
        eos_token_id=cfg["eos_token_id"],
        accuracy=accuracy,
    )


def _trainer_ids(model: Path, examples: list) -> list[list[int]]:
    """The prompt token ids exactly as the trainer queues them."""
    from transformers import AutoTokenizer

    from asyncdapo.services.trainer.data_feed import make_encoder

    encode = make_encoder(AutoTokenizer.from_pretrained(str(model)), apply_chat_template=True)
    return [encode(ex)[0] for ex in examples]


def test_prompt_key_is_stable_and_length_prefixed() -> None:
    assert prompt_key([1, 2, 3]) == prompt_key([1, 2, 3])
    assert prompt_key([1, 2, 3]).startswith("3:")
    assert prompt_key([1, 2, 3]) != prompt_key([1, 2, 4]) != prompt_key([12, 3])
    # a fixed value: the key is a file format, it must not change between versions
    assert prompt_key([1, 2, 3]) == "3:b85e2d4914e22b5ad3b82b312b3dc405dc17dcb8"


def test_key_matches_the_trainers_prompt_ids(assets: tuple[Path, Path, list]) -> None:
    model, key, examples = assets
    answers = load_answer_key(key)
    ids = _trainer_ids(model, examples)
    assert len(answers) == len({tuple(i) for i in ids}) == len(examples)
    for ex, prompt in zip(examples, ids, strict=True):
        assert answers[prompt_key(prompt)] == ex.ground_truth


def test_the_real_verifier_scores_right_and_wrong_answers(assets: tuple[Path, Path, list]) -> None:
    model, key, examples = assets
    sheet = _sheet(model, key, accuracy=0.5)
    rng = random.Random(0)
    seen = {True: 0, False: 0}
    for ex, prompt in zip(examples, _trainer_ids(model, examples), strict=True):
        for _ in range(4):
            plan = sheet.plan(prompt, natural_length=10, max_tokens=16, rng=rng)
            assert plan.finish is Finish.STOP and plan.tokens[-1] == sheet.eos
            text = sheet.tokenizer.decode(plan.tokens, skip_special_tokens=True)
            verdict = score_pair(ex.ground_truth, text)
            assert verdict.acc is plan.correct, (text, ex.ground_truth)
            seen[bool(plan.correct)] += 1
    assert seen[True] > 20 and seen[False] > 20


@pytest.mark.parametrize("accuracy", [0.0, 0.3, 1.0])
def test_accuracy_is_the_share_of_right_answers(assets: tuple[Path, Path, list], accuracy: float) -> None:
    model, key, examples = assets
    sheet = _sheet(model, key, accuracy)
    prompt = _trainer_ids(model, examples[:1])[0]
    rng = random.Random(1)
    plans = [sheet.plan(prompt, 10, 16, rng) for _ in range(1000)]
    share = sum(bool(p.correct) for p in plans) / len(plans)
    assert share == pytest.approx(accuracy, abs=0.05)
    assert sheet.stats["correct"] + sheet.stats["wrong"] == 1000


def test_lengths_vocab_cap_and_stop_tokens(assets: tuple[Path, Path, list]) -> None:
    model, key, examples = assets
    sheet = _sheet(model, key)
    prompt = _trainer_ids(model, examples[:1])[0]
    rng = random.Random(2)
    for natural in (1, 5, 12, 15):
        plan = sheet.plan(prompt, natural, 16, rng)
        suffix = len(sheet.answer_tokens(plan.answer or ""))
        assert len(plan.tokens) == max(natural, suffix + 1)  # the length model, or just the answer
        assert all(0 <= t < sheet.vocab_size for t in plan.tokens)
    # reaching max_tokens: `length`, no answer, no EOS (a truncated answer is no answer)
    for natural in (16, 40):
        capped = sheet.plan(prompt, natural, 16, rng)
        assert capped.finish is Finish.LENGTH and capped.answer is None and len(capped.tokens) == 16
        assert sheet.eos not in capped.tokens
    assert sheet.plan(prompt, 3, 16, rng, ignore_eos=True).finish is Finish.LENGTH
    # filler never contains a stop token the request asked for
    stop = set(sheet.filler_ids[:-1])
    plan = sheet.plan(prompt, 15, 16, rng, stop_token_ids=stop)
    body = plan.tokens[: -1 - len(sheet.answer_tokens(plan.answer or ""))]
    assert body and not stop & set(body)


def test_continuations_and_unknown_prompts(assets: tuple[Path, Path, list]) -> None:
    model, key, examples = assets
    sheet = _sheet(model, key)
    prompt = _trainer_ids(model, examples[:1])[0]
    # a continuation request (prompt + partial response, P-DSR) finds its prompt's answer
    assert sheet.lookup([*prompt, 5, 6, 7]) == examples[0].ground_truth
    plan = sheet.plan([9, 9, 9], 8, 16, random.Random(0))
    assert plan.answer is None and plan.finish is Finish.STOP and sheet.stats["no_key"] == 1


def test_wrong_answers_are_wrong() -> None:
    rng = random.Random(0)
    for gt in ("7", "-3", "0", "2.5", "\\frac{1}{2}", "1,000"):
        for _ in range(20):
            w = wrong_answer(gt, rng)
            assert w != gt and not score_pair(gt, f"\\boxed{{{w}}}").acc, (gt, w)


def test_bad_key_files_and_settings(tmp_path: Path, assets: tuple[Path, Path, list]) -> None:
    model, key, _ = assets
    with pytest.raises(AnswerKeyError, match="No such file"):
        load_answer_key(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(AnswerKeyError, match="non-empty JSON object"):
        load_answer_key(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps({"hello": "3"}))
    with pytest.raises(AnswerKeyError, match="LEN:SHA1"):
        load_answer_key(tmp_path / "bad.json")
    with pytest.raises(AnswerKeyError, match="sim-accuracy"):
        _sheet(model, key, accuracy=1.5)
    # answers must be written as text: no tokenizer, no answer-key mode
    with pytest.raises(AnswerKeyError, match=r"tokenizer\.json"):
        SimulatedEngine(
            SimTiming(), max_concurrency=1, model_dir=str(tmp_path), answer_key={"1:" + "0" * 40: "1"}
        )


def test_gateway_cli_rejects_the_key_without_the_simulator(tmp_path: Path) -> None:
    from asyncdapo.services.gateway import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(
        ["gateway", "--engine", "vllm", "--model", str(tmp_path), "--sim-answer-key", "k"]
    )
    with pytest.raises(AsyncdapoError, match="--engine sim"):
        cli._check_args(args)
    args = parser.parse_args(["gateway", "--engine", "sim", "--sim-answer-key", "k", "--sim-accuracy", "0.7"])
    assert args.sim_answer_key == "k" and args.sim_accuracy == 0.7


def test_engine_generates_labelled_reproducible_responses(assets: tuple[Path, Path, list]) -> None:
    model, key, examples = assets
    timing = SimTiming(base_step_s=0.0005, per_seq_step_s=0.0, prefill_s_per_token=0.0,
                       length_dist="uniform", length_mean=9, length_sigma=0.5)  # fmt: skip
    ex, prompt = examples[0], _trainer_ids(model, examples[:1])[0]

    async def run() -> list[tuple[list[int], Finish]]:
        engine = SimulatedEngine(
            timing, max_concurrency=8, model_dir=str(model), answer_key=load_answer_key(key), accuracy=0.5
        )
        try:
            outs = await asyncio.gather(
                *(engine.generate(EngineRequest(f"r{i}", prompt, Sampling(max_tokens=16, seed=100 + i)))
                  for i in range(16))
            )  # fmt: skip
        finally:
            await engine.shutdown()
        return [(o.token_ids, o.finish) for o in outs]

    first, again = asyncio.run(run()), asyncio.run(run())
    assert first == again  # a seeded request is reproducible
    sheet = _sheet(model, key)
    accs = []
    for tokens, finish in first:
        assert finish is Finish.STOP and all(0 <= t < sheet.vocab_size for t in tokens)
        accs.append(score_pair(ex.ground_truth, sheet.tokenizer.decode(tokens, skip_special_tokens=True)).acc)
    assert 0 < sum(accs) < len(accs)  # a group with variance: neither all right nor all wrong


def test_build_answer_key_writes_what_it_read(tmp_path: Path, assets: tuple[Path, Path, list]) -> None:
    model, _, examples = assets
    from asyncdapo.contracts.verl_format import write_examples

    write_examples(examples[:3], tmp_path / "d.jsonl")
    answers = build_answer_key([tmp_path / "d.jsonl"], model)
    assert sorted(answers.values()) == sorted(ex.ground_truth for ex in examples[:3])
    assert load_answer_key(write_answer_key(answers, tmp_path / "k.json")) == answers


@pytest.mark.parametrize("mode", ["left", "right", "middle", "drop"])
def test_answer_key_finds_prompts_fitted_as_data_truncation_says(
    tmp_path: Path, assets: tuple[Path, Path, list], mode: str
) -> None:
    """With a config, the key holds the ids the trainer queues after cutting (or leaves out what it drops)."""
    from asyncdapo.contracts.config import PromptTruncation
    from asyncdapo.contracts.prompting import fit_prompt
    from asyncdapo.contracts.verl_format import write_examples

    model, _, examples = assets
    write_examples(examples[:4], tmp_path / "d.parquet")
    full = _trainer_ids(model, examples[:4])
    limit = min(len(ids) for ids in full) - 1  # every prompt is over the limit
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{path: {model}}}\n"
        f"data: {{train_files: [{tmp_path / 'd.parquet'}], max_prompt_length: {limit}, truncation: {mode}}}\n"
    )
    assert main(["--config", str(config), "--out", str(tmp_path / "k.json")]) == 0
    answers = json.loads((tmp_path / "k.json").read_text())
    if mode == "drop":
        assert answers == {}  # every prompt dropped: never queued, no entry
        return
    for ex, ids in zip(examples[:4], full, strict=True):
        queued = fit_prompt(ids, limit, PromptTruncation(mode), "test")
        assert queued is not None and len(queued) == limit
        assert answers[prompt_key(queued)] == ex.ground_truth

"""SIMULATOR answer key: labelled responses for `--engine sim` gateways (fault and scale tests only).

The token-timing simulator runs no model; by default its responses are random token ids, which
the real verifier scores 0, so every group is filtered and nothing trains. In answer-key mode
(`asyncdapo gateway --engine sim --sim-answer-key FILE --sim-accuracy P`) a response is random
filler tokens followed by the tokenized text of a boxed answer, ` \\boxed{…}`: the prompt's ground
truth with probability P, a wrong number otherwise. A stack of SIMULATOR gateways + the real
verifier + the real trainer then produces groups with real reward variance. It is still a
simulator: the "answers" are looked up, not computed, and the filler is noise.

Answer key file: a JSON object `{prompt key: ground truth}`. The prompt key is `prompt_key(ids)`,
`"{len(ids)}:{sha1 of the ids}"` over the exact prompt token ids the trainer queues (chat template
applied, no extra special tokens: `asyncdapo.contracts.prompting.prompt_token_ids`). The length prefix
lets a continuation request (prompt + partial response, P-DSR) find its prompt. Write one with

    python -m asyncdapo.services.gateway.sim_answers --config RUN.yaml --out answers.json
    python -m asyncdapo.services.gateway.sim_answers --model DIR --data train.parquet val.parquet --out answers.json

Response plan (`AnswerSheet.plan`, pure given the rng): the length follows the simulator's length
distribution; a response that reaches max_tokens is `length` and carries no answer (as a real
truncated answer would not), otherwise it is filler + answer + EOS, `stop`. Filler tokens are
plain-word tokens of the vocabulary (letters and punctuation only: no digit, brace, backslash or
`$`), so the boxed answer is the only thing math-verify can extract.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncdapo.contracts.config import PromptTruncation
from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.services.gateway.engine import Finish

log = logging.getLogger(__name__)

# a filler token decodes to at least one letter and nothing math-verify could read as a number
_FILLER_TEXT = re.compile(r"[A-Za-z .,;:!?'\-]*[A-Za-z][A-Za-z .,;:!?'\-]*")
_WRONG_OFFSETS = (-3, -2, -1, 1, 2, 3)


class AnswerKeyError(AsyncdapoError):
    """The answer key file or the tokenizer cannot drive the SIMULATOR's labelled responses."""


def prompt_key(token_ids: Sequence[int]) -> str:
    """Stable key of a prompt: its length and the SHA-1 of its ids (decimal, comma-joined)."""
    digest = hashlib.sha1(",".join(str(int(t)) for t in token_ids).encode()).hexdigest()
    return f"{len(token_ids)}:{digest}"


def load_answer_key(path: str | Path) -> dict[str, str]:
    """Read and check an answer key file (a JSON object of prompt key -> ground truth)."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as err:
        raise AnswerKeyError(f"--sim-answer-key {str(path)!r}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise AnswerKeyError(f"--sim-answer-key {str(path)!r}: not JSON: {err}") from None
    if not isinstance(raw, dict) or not raw:
        raise AnswerKeyError(f"--sim-answer-key {str(path)!r}: expected a non-empty JSON object")
    bad = [k for k, v in raw.items() if not isinstance(v, str) or not re.fullmatch(r"\d+:[0-9a-f]{40}", k)]
    if bad:
        raise AnswerKeyError(
            f"--sim-answer-key {str(path)!r}: {len(bad)} entr(y/ies) are not 'LEN:SHA1' -> string, "
            f"e.g. {bad[0]!r}"
        )
    return dict(raw)


def write_answer_key(answers: Mapping[str, str], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(answers.items())), indent=0) + "\n")
    return path


def build_answer_key(
    files: Sequence[str | Path],
    model_dir: str | Path,
    *,
    prompt_field: str = "prompt",
    apply_chat_template: bool = True,
    trust_remote_code: bool = False,
    max_prompt_length: int | None = None,
    truncation: PromptTruncation = PromptTruncation.DROP,
) -> dict[str, str]:
    """The answer key of verl-format `files`, keyed by the prompt token ids the trainer queues
    (same tokenizer class and rendering as `asyncdapo.services.trainer.data_feed.make_encoder`; with
    `max_prompt_length`, fitted as `data.truncation` fits them, so a cut prompt is found too)."""
    from transformers import AutoTokenizer

    from asyncdapo.contracts.prompting import fit_prompt, prompt_token_ids
    from asyncdapo.contracts.verl_format import load_examples

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    answers: dict[str, str] = {}
    conflicts = 0
    # `error` would stop the trainer on an overlong prompt; here such a prompt just has no entry.
    mode = PromptTruncation.DROP if truncation is PromptTruncation.ERROR else truncation
    for ex in load_examples(files, prompt_field):
        full = prompt_token_ids(ex, tokenizer, apply_chat_template)
        ids = full if max_prompt_length is None else fit_prompt(full, max_prompt_length, mode, "")
        if ids is None:
            continue  # never queued: dropped as longer than max_prompt_length
        key = prompt_key(ids)
        if answers.setdefault(key, ex.ground_truth) != ex.ground_truth:
            conflicts += 1
    if conflicts:
        log.warning(
            "%d prompt(s) appear more than once with different ground truths; kept the first", conflicts
        )
    return answers


def wrong_answer(ground_truth: str, rng: random.Random) -> str:
    """A number that is not `ground_truth` (an integer or decimal nearby, else a large integer)."""
    text = ground_truth.strip()
    offset = rng.choice(_WRONG_OFFSETS)
    try:
        return str(int(text) + offset)
    except ValueError:
        pass
    try:
        return repr(float(text) + offset)
    except ValueError:
        return str(rng.randrange(10**6, 10**7))


@dataclass(frozen=True)
class Plan:
    """What one SIMULATOR response will be: every token (EOS last when `stop`) and how it ends."""

    tokens: list[int]
    finish: Finish
    answer: str | None = None  # the boxed text it ends with (None: capped, or no key entry)
    correct: bool | None = None  # whether `answer` is the ground truth


class AnswerSheet:
    """Plans labelled SIMULATOR responses from an answer key and the model's tokenizer."""

    def __init__(
        self,
        answers: Mapping[str, str],
        tokenizer: Any,  # tokenizers.Tokenizer
        *,
        vocab_size: int,
        eos_token_id: int,
        accuracy: float = 0.5,
    ) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise AnswerKeyError(f"--sim-accuracy must be within [0, 1], got {accuracy}")
        self.answers = dict(answers)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos = eos_token_id
        self.accuracy = accuracy
        self.lengths = sorted({int(k.split(":", 1)[0]) for k in self.answers}, reverse=True)
        self.filler_ids = self._filler_ids()
        self.stats: Counter[str] = Counter()  # correct | wrong | capped | no_key
        self._warned_missing = False

    def _filler_ids(self) -> list[int]:
        special = {self.eos}
        special.update(int(i) for i in getattr(self.tokenizer, "get_added_tokens_decoder", dict)())
        n = min(self.vocab_size, self.tokenizer.get_vocab_size(with_added_tokens=False))
        ids = [
            i
            for i in range(n)
            if i not in special and _FILLER_TEXT.fullmatch(self.tokenizer.decode([i]) or "") is not None
        ]
        if not ids:
            raise AnswerKeyError("the tokenizer has no plain-word token to build SIMULATOR filler from")
        return ids

    def lookup(self, prompt_token_ids: Sequence[int]) -> str | None:
        """The ground truth of a prompt, or of the prompt a continuation request starts with."""
        for n in self.lengths:
            if n <= len(prompt_token_ids):
                gt = self.answers.get(prompt_key(prompt_token_ids[:n]))
                if gt is not None:
                    return gt
        return None

    def answer_tokens(self, answer: str) -> list[int]:
        ids = list(self.tokenizer.encode(f" \\boxed{{{answer}}}", add_special_tokens=False).ids)
        outside = [t for t in ids if not 0 <= t < self.vocab_size]
        if outside:
            raise AnswerKeyError(f"answer {answer!r} tokenizes to ids {outside} outside the vocab")
        return ids

    def plan(
        self,
        prompt_token_ids: Sequence[int],
        natural_length: int,
        max_tokens: int,
        rng: random.Random,
        *,
        ignore_eos: bool = False,
        stop_token_ids: Collection[int] = (),
    ) -> Plan:
        """One response: filler + answer + EOS (`stop`), or filler up to max_tokens (`length`)."""
        right = rng.random() < self.accuracy  # always drawn: a seed gives the same plan either way
        gt = self.lookup(prompt_token_ids)
        answer = None
        if gt is None:
            self.stats["no_key"] += 1
            if not self._warned_missing:
                self._warned_missing = True
                log.warning(
                    "SIMULATOR answer key has no entry for a prompt of %d tokens (key %s); such "
                    "responses carry no answer",
                    len(prompt_token_ids),
                    prompt_key(prompt_token_ids),
                )
        else:
            answer = gt if right else wrong_answer(gt, rng)
        suffix = self.answer_tokens(answer) if answer is not None else []
        target = max(natural_length, len(suffix) + 1)
        fill = [i for i in self.filler_ids if i not in stop_token_ids] if stop_token_ids else self.filler_ids
        if ignore_eos or target >= max_tokens:
            self.stats["capped"] += 1
            return Plan([rng.choice(fill) for _ in range(max_tokens)], Finish.LENGTH)
        body = [rng.choice(fill) for _ in range(target - 1 - len(suffix))] + suffix
        if answer is not None:
            self.stats["correct" if right else "wrong"] += 1
        return Plan([*body, self.eos], Finish.STOP, answer, right if answer is not None else None)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m asyncdapo.services.gateway.sim_answers",
        description="Write the SIMULATOR answer key (prompt key -> ground truth) for sim gateways' "
        "--sim-answer-key, from a run config or from data files and a model directory.",
    )
    p.add_argument("--config", help="run config YAML: its model.path, train and val files, prompt rendering")
    p.add_argument("--model", help="model directory with the tokenizer (overrides model.path)")
    p.add_argument("--data", nargs="+", help="verl-format files (override the config's train + val files)")
    p.add_argument("--out", required=True, help="answer key JSON to write")
    args = p.parse_args(argv)
    prompt_field, template, trust = "prompt", True, False
    max_prompt_length: int | None = None
    truncation = PromptTruncation.DROP
    files: list[str] = list(args.data or [])
    model = args.model
    if args.config:
        from asyncdapo.contracts.config import load_run_config

        cfg = load_run_config(args.config)
        model = model or cfg.model.path
        files = files or [*cfg.data.train_files, *(cfg.data.val_files or [])]
        prompt_field, template = cfg.data.prompt_key, cfg.data.apply_chat_template
        trust = cfg.model.trust_remote_code
        max_prompt_length, truncation = cfg.data.max_prompt_length, cfg.data.truncation
    if not model or not files:
        p.error("give --config, or --model and --data")
    answers = build_answer_key(
        files,
        model,
        prompt_field=prompt_field,
        apply_chat_template=template,
        trust_remote_code=trust,
        max_prompt_length=max_prompt_length,
        truncation=truncation,
    )
    print(f"wrote {len(answers)} answers to {write_answer_key(answers, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

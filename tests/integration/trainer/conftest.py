"""Trainer integration fixtures: a real redis-server, the tiny model, and a rollout double.

`RolloutDouble` is a TEST DOUBLE of the rollout side (scheduler + gateways + verifier) for tests
that run before/without the scheduler: it samples responses from the tiny model with transformers,
scores them with math-verify and writes whole `rollout_pb2.Group`s to the groups stream, exactly
as the scheduler's contract says. Two concessions to a random-weight model, which never solves a
problem: sampling is restricted to digit tokens and EOS (so every answer parses), and the group's
ground truth is the first response's answer (so groups carry reward variance). Behaviour log-probs
are the model's full-vocabulary log-probs of the sampled tokens (raw logits / T), so the trainer's
recomputed log-probs must match them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncdapo.contracts.config import RunConfig, parse_run_config
from asyncdapo.contracts.prompts import PromptRecord, load_prompt, prompt_id
from asyncdapo.contracts.redis_keys import GROUP_FIELD, RunKeys
from asyncdapo.contracts.v1 import common_pb2, rollout_pb2
from asyncdapo.contracts.verl_format import write_examples
from asyncdapo.tools.data.synth import SynthSpec, synth_splits


class RolloutDouble:
    def __init__(self, model_dir: Path, cfg: RunConfig, seed: int = 0) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.cfg = cfg
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.gen = torch.Generator().manual_seed(seed)
        self.allowed = [self.tok.convert_tokens_to_ids(c) for c in "0123456789"] + [self.tok.eos_token_id]

    def records(self, n: int, epoch: int = 0) -> list[PromptRecord]:
        from asyncdapo.contracts.prompting import prompt_token_ids, render_prompt

        spec = SynthSpec(ops=("+",), max_operand=9)
        train, _ = synth_splits(n, 0, seed=epoch, spec=spec)
        return [
            PromptRecord(
                id=prompt_id(epoch, ex.index), prompt_token_ids=prompt_token_ids(ex, self.tok),
                prompt_text=render_prompt(ex, self.tok), ground_truth=ex.ground_truth,
                data_source=ex.data_source, epoch=epoch, index=ex.index,
            )
            for ex in train
        ]  # fmt: skip

    def _sample(
        self, prompt: list[int], n: int, max_tokens: int
    ) -> list[tuple[list[int], list[float], bool]]:
        """n responses: (token ids, behaviour log-probs, hit max_tokens)."""
        torch = self.torch
        temp = self.cfg.rollout.temperature or 1.0
        ids = torch.tensor([prompt] * n)
        outs: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        alive = [True] * n
        mask = torch.full((self.model.config.vocab_size,), float("-inf"))
        mask[self.allowed] = 0.0
        with torch.no_grad():
            for _ in range(max_tokens):
                logits = self.model(input_ids=ids).logits[:, -1, :].float() / temp
                logp = torch.log_softmax(logits, dim=-1)
                pick = torch.multinomial(torch.softmax(logits + mask, dim=-1), 1, generator=self.gen).squeeze(
                    -1
                )
                for i in range(n):
                    if alive[i]:
                        outs[i].append(int(pick[i]))
                        lps[i].append(float(logp[i, pick[i]]))
                        alive[i] = int(pick[i]) != self.tok.eos_token_id
                if not any(alive):
                    break
                ids = torch.cat([ids, pick.unsqueeze(-1)], dim=1)
        return [(o, lp, a) for o, lp, a in zip(outs, lps, alive, strict=True)]

    def group(self, rec: PromptRecord, version: int) -> rollout_pb2.Group | None:
        """A scored group for `rec`, or None when its rewards have no variance (DAPO filters it)."""
        from math_verify import parse, verify

        cfg = self.cfg
        samples = self._sample(rec.prompt_token_ids, cfg.rollout.n, cfg.data.max_response_length)
        texts = [self.tok.decode(t, skip_special_tokens=True) for t, _, _ in samples]
        truth = texts[0] or "0"
        gold = parse(f"${truth}$")
        g = rollout_pb2.Group(
            run=cfg.name, prompt_id=rec.id, prompt_token_ids=rec.prompt_token_ids, ground_truth=truth,
            data_source=rec.data_source, min_version=version, max_version=version,
            created_unix_ms=int(time.time() * 1000),
        )  # fmt: skip
        accs, rewards = [], []
        for (toks, lps, truncated), text in zip(samples, texts, strict=True):
            acc = bool(text) and bool(verify(gold, parse(f"\\boxed{{{text}}}")))
            score, penalty = cfg.reward_of(acc, len(toks))  # as the scheduler scores
            g.responses.add(
                token_ids=toks, logprobs=lps,
                version_runs=[common_pb2.VersionRun(version=version, num_tokens=len(toks))],
                finish_reason=common_pb2.FINISH_REASON_LENGTH if truncated else common_pb2.FINISH_REASON_STOP,
                reward=score + penalty, score=score, acc=float(acc), overlong_penalty=penalty, pred=text,
                gateway="rollout-double",
            )  # fmt: skip
            accs.append(float(acc))
            rewards.append(score + penalty)
        # as the scheduler's record: the mean reward, and the std of the filter metric (acc, the default)
        mean = sum(accs) / len(accs)
        std = (sum((r - mean) ** 2 for r in accs) / len(accs)) ** 0.5
        g.reward_mean, g.reward_std = sum(rewards) / len(rewards), std
        return g if std > cfg.reward.filter_eps else None

    def produce(
        self, client: Any, keys: RunKeys, records: Iterable[PromptRecord], count: int, version: int = 0
    ) -> list[rollout_pb2.Group]:
        """XADD `count` valid groups made from `records` (in order, skipping filtered ones); pass an
        iterator to continue where the previous call stopped."""
        made: list[rollout_pb2.Group] = []
        for rec in records:
            if len(made) == count:
                break
            made += self._emit(client, keys, rec, version)
        if len(made) < count:
            raise RuntimeError(f"only {len(made)} of {count} groups had reward variance; pass more records")
        return made

    def produce_from_queue(
        self, client: Any, keys: RunKeys, count: int, version: int = 0
    ) -> list[rollout_pb2.Group]:
        """Like the scheduler: pop prompt ids the trainer queued, read their PromptRecords."""
        made: list[rollout_pb2.Group] = []
        while len(made) < count:
            pid = client.lpop(keys.prompts)
            if pid is None:
                raise RuntimeError("the prompt queue ran dry")
            rec = load_prompt(client, keys, pid.decode())
            assert rec is not None, f"queued prompt {pid!r} has no data hash"
            made += self._emit(client, keys, rec, version)
        return made

    def _emit(self, client: Any, keys: RunKeys, rec: PromptRecord, version: int) -> list[rollout_pb2.Group]:
        g = self.group(rec, version)
        if g is None:
            return []
        client.xadd(keys.groups, {GROUP_FIELD: g.SerializeToString()})
        return [g]


def base_config(model_dir: Path, train_file: Path, ckpt: Path, **over: Any) -> RunConfig:
    data = {
        "name": "trainer-it",
        "model": {"path": str(model_dir)},
        "data": {"train_files": [str(train_file)], "train_batch_size": 2, "max_prompt_length": 64,
                 "max_response_length": 6, "prompt_queue_watermark": 8},
        "rollout": {"n": 4, "max_staleness": 0},
        "reward": {"overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 0.5}},
        # snapshot: these tests read the exported weights under checkpoint_dir/weights (the stream
        # path is tested with the scheduler and gateways, test_scheduler_weight_stream.py)
        "trainer": {"total_steps": 2, "ppo_mini_batch_size": 1, "micro_batch_size": 3, "lr": 1e-3,
                    "warmup_steps": 0, "checkpoint_dir": str(ckpt), "weight_transport": "snapshot"},
    }  # fmt: skip
    for dotted, value in over.items():
        section, key = dotted.split("__")
        data.setdefault(section, {})[key] = value
    return parse_run_config(data)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The test machine's few cores are shared: OpenMP's spinning threads make tiny-model steps ~5x
    slower than one thread does; restore the setting after each test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    train, _ = synth_splits(40, 0, seed=3, spec=SynthSpec(ops=("+",), max_operand=9))
    return write_examples(train, tmp_path_factory.mktemp("data") / "train.jsonl")


@pytest.fixture(scope="session")
def rollout(
    tiny_model_dir: Path, train_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> RolloutDouble:
    cfg = base_config(tiny_model_dir, train_file, tmp_path_factory.mktemp("unused"))
    return RolloutDouble(tiny_model_dir, cfg)


@pytest.fixture()
def make_config(tiny_model_dir: Path, train_file: Path) -> Any:
    """make_config(checkpoint_dir, section__key=value, ...) -> RunConfig for the tiny model."""
    return lambda ckpt, **over: base_config(tiny_model_dir, train_file, ckpt, **over)


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()

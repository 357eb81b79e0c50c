"""Preflight: what a valid config names (data files, the model, `up --redis-url`'s Redis) is checked
in seconds before anything starts, and every problem is named in the config's one style."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncdapo.contracts.config import RunConfig, parse_run_config
from asyncdapo.contracts.config_problems import ProblemKind
from asyncdapo.tools.preflight import check_data, check_model, check_redis, preflight

ROW = {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _model_dir(path: Path, **config: Any) -> Path:
    """A directory with every file a model needs (their contents are not read, but config.json's)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 1024, **config}))
    (path / "model.safetensors").write_bytes(b"")
    (path / "tokenizer.json").write_text("{}")
    return path


def _cfg(tmp_path: Path, **sections: Any) -> RunConfig:
    base: dict[str, Any] = {
        "model": {"path": str(tmp_path / "model")},
        "data": {
            "train_files": [str(tmp_path / "train.jsonl")],
            "max_prompt_length": 64,
            "max_response_length": 16,
        },
        "reward": {"overlong_buffer": {"len": 4}},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return parse_run_config(base)


@pytest.fixture()
def ready(tmp_path: Path) -> Path:
    """A model and a training file where _cfg looks for them."""
    _model_dir(tmp_path / "model")
    _jsonl(tmp_path / "train.jsonl", [ROW, ROW])
    return tmp_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- data ---


def test_good_data_and_model_have_no_problem(ready: Path) -> None:
    cfg = _cfg(ready, data={"val_files": [str(ready / "train.jsonl")]})
    assert check_data(cfg) == [] and check_model(cfg) == []


def test_a_dapo_math_17k_shaped_parquet_passes(ready: Path) -> None:
    """DAPO-Math-17k's rows: extra_info.index a UUID string, ability and style columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "math_dapo", "prompt": [{"content": "1+1?", "role": "user"}], "ability": "MATH",
             "reward_model": {"ground_truth": "2", "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"}}] * 3  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), ready / "dapo-math-17k.parquet")
    assert check_data(_cfg(ready, data={"train_files": [str(ready / "dapo-math-17k.parquet")]})) == []


def test_every_missing_or_unloadable_data_file_is_named(ready: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ready)
    (ready / "empty.jsonl").write_text("")
    (ready / "broken.jsonl").write_text("{not json\n")
    _jsonl(ready / "no-prompt.jsonl", [{"question": "1+1?", "reward_model": {"ground_truth": "2"}}])
    train = ["train.jsonl", "missing.parquet", "empty.jsonl"]
    val = ["broken.jsonl", "no-prompt.jsonl", str(ready)]
    problems = check_data(_cfg(ready, data={"train_files": train, "val_files": val}))
    by_field = {p.field: p for p in problems}
    assert list(by_field) == [
        "data.train_files[1]",
        "data.train_files[2]",
        "data.val_files[0]",
        "data.val_files[1]",
        "data.val_files[2]",
    ]
    missing = by_field["data.train_files[1]"]
    assert missing.kind is ProblemKind.NOT_FOUND
    assert (
        str(missing) == f"data.train_files[1]: 'missing.parquet' given; no such file (looked for in {ready})"
    )
    assert str(by_field["data.train_files[2]"]).endswith("holds no examples; at least one is needed")
    assert "cannot be loaded" in str(by_field["data.val_files[0]"])
    assert "'prompt'" in str(by_field["data.val_files[1]"])  # the prompt key it looked for
    assert "a directory, not a file" in str(by_field["data.val_files[2]"])


def test_no_training_file_at_all_is_a_problem(ready: Path) -> None:
    (problem,) = check_data(_cfg(ready, data={"train_files": []}))
    assert str(problem).startswith("data.train_files: [] given; at least one training file is needed")


# --- model ---


def test_a_model_path_that_is_no_model_is_named(ready: Path) -> None:
    def problem(path: str | Path) -> str:
        (p,) = check_model(_cfg(ready, model={"path": str(path)}))
        assert p.field == "model.path"
        return str(p)

    assert "no such directory" in problem(ready / "nope") and "Hub id" in problem(ready / "nope")
    assert "a file; must be a model directory" in problem(ready / "train.jsonl")
    partial = ready / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    text = problem(partial)
    assert "has no weights (*.safetensors or *.bin), no tokenizer (tokenizer.json" in text
    assert "config.json" not in text.split(" given; ")[1]  # it is there


def test_a_hub_id_is_looked_up_in_the_cache_without_the_network(
    ready: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    cache = ready / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (p,) = check_model(_cfg(ready, model={"path": "asyncdapo-test/absent"}))
    assert str(cache) in p.allowed and "hf download asyncdapo-test/absent" in p.hint
    # the layout huggingface_hub writes: models--OWNER--NAME/{refs/main, snapshots/COMMIT/…}
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--asyncdapo-test--cached"
    _model_dir(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert check_model(_cfg(ready, model={"path": "asyncdapo-test/cached"})) == []
    # fetching is allowed only when nothing else is wrong; offline, it fails naming why
    (p,) = check_model(_cfg(ready, model={"path": "asyncdapo-test/absent"}), fetch=True)
    assert "HF_HUB_OFFLINE is set" in p.allowed


def test_a_context_beyond_the_models_positions_is_named(ready: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    short = _model_dir(ready / "short", max_position_embeddings=64)
    cfg = _cfg(ready, model={"path": str(short)})  # 64 + 16 > 64
    (p,) = check_model(cfg)
    assert str(p).startswith(
        "data.max_response_length: 16 given (+ data.max_prompt_length 64 = 80); a prompt"
    )
    (p,) = check_model(cfg, max_model_len=100)
    assert str(p).startswith("--max-model-len: 100 given; must be <= the model's max_position_embeddings (64")
    assert check_model(cfg, context=False) == []  # the simulator has no context to exceed
    scaled = _model_dir(
        ready / "scaled", max_position_embeddings=64, rope_scaling={"rope_type": "yarn", "factor": 4}
    )
    assert check_model(_cfg(ready, model={"path": str(scaled)})) == []
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert check_model(cfg) == []


# --- Redis ---


def test_a_redis_nobody_runs_is_named_within_the_timeout() -> None:
    url = f"redis://:secret@127.0.0.1:{_free_port()}/0"
    start = time.monotonic()
    (p,) = check_redis(url, timeout_s=1.0)
    assert time.monotonic() - start < 3.0
    assert p.kind is ProblemKind.UNREACHABLE and p.field == "--redis-url"
    assert str(p).startswith(
        f"--redis-url: redis://***@127.0.0.1:{url.rsplit(':', 1)[1]} given; no Redis answered"
    )
    assert "secret" not in str(p)
    (p,) = check_redis("http://127.0.0.1:1/0")
    assert "not a Redis URL" in p.allowed


def test_preflight_names_every_problem_and_fetches_nothing_when_something_is_wrong(
    ready: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncdapo.runtime.models

    def no_download(*a: object, **k: object) -> str:
        raise AssertionError("a run that cannot start must not wait for a download")

    monkeypatch.setattr(asyncdapo.runtime.models, "resolve_model", no_download)
    cfg = _cfg(
        ready, model={"path": "asyncdapo-test/absent"}, data={"train_files": [str(ready / "gone.jsonl")]}
    )
    problems = preflight(cfg, redis_url=f"redis://127.0.0.1:{_free_port()}/0")
    assert [p.field for p in problems] == ["data.train_files[0]", "--redis-url", "model.path"]


# --- `asyncdapo up` ---


def _up(tmp_path: Path, config: dict[str, Any], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("REDIS_URL", None)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "up", str(path), "--engine", "sim", "--quiet",
         "--run-dir", str(tmp_path / "run"), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    return proc, time.monotonic() - start


def _up_config(ready: Path, **data: Any) -> dict[str, Any]:
    return {
        "name": "preflight",
        "model": {"path": str(ready / "model")},
        "data": {"train_files": [str(ready / "train.jsonl")], "max_prompt_length": 64, "max_response_length": 16,
                 **data},
        "reward": {"overlong_buffer": {"len": 4}},
        "logging": {"backends": ["jsonl"]},
    }  # fmt: skip


def test_up_with_a_missing_train_file_exits_at_once_and_starts_nothing(ready: Path) -> None:
    proc, wall = _up(ready, _up_config(ready, train_files=["data/train.parquet"]))
    assert proc.returncode == 2, proc.stderr
    assert "data.train_files[0]: 'data/train.parquet' given; no such file" in proc.stderr
    assert wall < 10.0, wall
    # nothing started: no run directory, so no service logs, no Redis data, no config written
    assert not (ready / "run").exists()
    assert "starting" not in proc.stdout


def test_up_with_an_unreachable_redis_exits_at_once_and_starts_nothing(ready: Path) -> None:
    port = _free_port()
    proc, wall = _up(ready, _up_config(ready), "--redis-url", f"redis://127.0.0.1:{port}/0")
    assert proc.returncode == 2, proc.stderr
    assert (
        f"--redis-url: redis://127.0.0.1:{port}/0 given; no Redis answered PING there within 2 s"
        in proc.stderr
    )
    assert wall < 10.0, wall
    assert not (ready / "run").exists()
    assert "starting" not in proc.stdout


# --- `asyncdapo config check` ---

REPO = Path(__file__).resolve().parents[2]


def _check(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "config", "check", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd,
    )  # fmt: skip


def test_config_check_checks_paths_unless_told_not_to(ready: Path) -> None:
    path = ready / "run.yaml"
    path.write_text(yaml.safe_dump(_up_config(ready, val_files=["val.jsonl"])))
    proc = _check(str(path), cwd=ready)
    assert proc.returncode == 1
    assert f"data.val_files[0]: 'val.jsonl' given; no such file (looked for in {ready})" in proc.stderr
    proc = _check("--no-paths", str(path), cwd=ready)
    assert proc.returncode == 0 and "paths not checked" in proc.stdout
    _jsonl(ready / "val.jsonl", [ROW])
    proc = _check(str(path), cwd=ready)
    assert proc.returncode == 0 and "data and model found" in proc.stdout, proc.stderr


def test_config_check_reads_a_training_runs_spec_run() -> None:
    manifests = sorted((REPO / "deploy" / "k8s" / "examples").glob("*.yaml"))
    proc = _check(*map(str, manifests))  # their paths are the workspace volume's: not checked here
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("spec.run: ok") == len(manifests)
    proc = _check(str(manifests[0]), "rollout.n=0")
    assert (
        proc.returncode == 1
        and "rollout.n: 0 given; must be >= 1 (from override 'rollout.n=0')" in proc.stderr
    )

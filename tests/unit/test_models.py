"""Model locations: a local directory, or a Hub id found in the Hugging Face cache (HF_HUB_CACHE)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncdapo.runtime.models import ModelNotFound, looks_like_hub_id

REPO_ID = "asyncdapo-test/tiny-cached"


def _place_in_hf_cache(model_dir: Path, cache: Path, repo_id: str) -> Path:
    """The layout huggingface_hub writes: models--OWNER--NAME/{refs/main, snapshots/COMMIT/…}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    shutil.copytree(model_dir, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snap


def _resolve(model: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # a fresh process: huggingface_hub reads HF_HUB_CACHE when it is imported
    code = "import sys; from asyncdapo.runtime.models import resolve_model; print(resolve_model(sys.argv[1]))"
    return subprocess.run(
        [sys.executable, "-c", code, model], capture_output=True, text=True, env=env, timeout=60
    )


def test_hub_id_resolves_through_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "tokenizer.json").write_text("{}")
    snap = _place_in_hf_cache(src, tmp_path / "hub", REPO_ID)
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    proc = _resolve(REPO_ID, env)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == snap


def test_missing_hub_model_says_how_to_pre_download(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    proc = _resolve("Qwen/Qwen3-8B", env)
    assert proc.returncode != 0
    assert "ModelNotFound" in proc.stderr and "hf download Qwen/Qwen3-8B" in proc.stderr
    assert str(tmp_path / "empty") in proc.stderr and "HF_HUB_OFFLINE is set" in proc.stderr


def test_local_paths(tmp_path: Path) -> None:
    from asyncdapo.runtime.models import resolve_model

    assert resolve_model(tmp_path) == str(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ModelNotFound, match="is a file"):
        resolve_model(tmp_path / "f")
    with pytest.raises(ModelNotFound, match="not a directory"):
        resolve_model(tmp_path / "a" / "b")
    assert looks_like_hub_id("Qwen/Qwen3-8B") and not looks_like_hub_id("./x/y")
    assert not looks_like_hub_id("/abs/path") and not looks_like_hub_id("a/b/c")

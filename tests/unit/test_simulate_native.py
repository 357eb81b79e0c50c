"""SIMULATOR: the mypyc-compiled event loop (asyncdapo.simulate.native) — loaded only for the sources
it was built from, and a run's results the same bit for bit as the plain modules'."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import asyncdapo.simulate.driver as driver
from asyncdapo.simulate import native

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def test_make_install_built_the_compiled_event_loop_for_these_sources_and_it_is_loaded() -> None:
    # `make test` runs `make install`, which builds it; a developer who edited a source since gets
    # this message rather than a silently slower simulator
    assert native.enabled(), "ASYNCDAPO_SIM_NATIVE is off in the test environment"
    assert native.active_build() is not None, (
        f"no compiled build for the current sources under {native.cache_root()}: run `make sim-native`"
    )
    assert driver.__file__ is not None and driver.__file__.endswith(SUFFIX), driver.__file__


def test_the_digest_changes_with_any_source_byte_or_file_and_ignores_caches(tmp_path: Path) -> None:
    (tmp_path / "simulate").mkdir()
    src = tmp_path / "simulate" / "driver.py"
    src.write_text("x = 1\n")
    d0 = native.digest([tmp_path], "tools")
    (tmp_path / "simulate" / "__pycache__").mkdir()
    (tmp_path / "simulate" / "__pycache__" / "driver.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "notes.txt").write_text("not a source")
    assert native.digest([tmp_path], "tools") == d0
    src.write_text("x = 2\n")
    d1 = native.digest([tmp_path], "tools")
    assert d1 != d0
    (tmp_path / "config.pyi").write_text("y: int\n")
    assert native.digest([tmp_path], "tools") != d1
    assert native.digest([tmp_path], "other mypy") != native.digest([tmp_path], "tools")


def test_an_incomplete_or_absent_build_is_not_used(tmp_path: Path) -> None:
    assert native.build_files(tmp_path / "missing") is None
    where = tmp_path / "b"
    pkg = where / "asyncdapo" / "simulate"
    pkg.mkdir(parents=True)
    (where / native.BUILD_INFO).write_text("{}")
    for m in native.NATIVE_MODULES[:-1]:
        (pkg / f"{m}{SUFFIX}").write_bytes(b"")
    assert native.build_files(where) is None  # the driver is missing
    (pkg / f"{native.NATIVE_MODULES[-1]}{SUFFIX}").write_bytes(b"")
    (where / f"abc__mypyc{SUFFIX}").write_bytes(b"")
    files = native.build_files(where)
    assert files is not None and set(files) == {f"asyncdapo.simulate.{m}" for m in native.NATIVE_MODULES} | {
        "abc__mypyc"
    }


def _simulate(tmp: Path, env_native: str, cache: Path | None = None) -> tuple[dict, str]:
    env = dict(os.environ, ASYNCDAPO_SIM_NATIVE=env_native)
    if cache is not None:
        env["ASYNCDAPO_NATIVE_CACHE"] = str(cache)
    out = tmp / f"out-{env_native}-{cache is not None}"
    cmd = [
        sys.executable, "-m", "asyncdapo.cli", "simulate", str(ROOT / "examples/simulate/h100-7b-512.yaml"),
        "--cluster", "h100-7b", "--engines", "32", "--modes", "sync,async,fully-async,pdsr", "--versions", "3",
        "--no-png", "--out", str(out), "data.train_batch_size=32", "rollout.max_concurrent_prompts=96", "trainer.ppo_mini_batch_size=32",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "simulate.json").read_text()), proc.stdout


def _results(doc: dict) -> list[dict]:
    """What a run simulated: everything but the simulator's own cost."""
    return [{k: v for k, v in m.items() if k not in ("sim_cpu_s",)} for m in doc["modes"]]


def test_compiled_and_plain_runs_agree_bit_for_bit(tmp_path: Path) -> None:
    if native.active_build() is None:
        pytest.fail("no compiled build to compare: run `make sim-native`")
    compiled, out_c = _simulate(tmp_path, "1")
    plain, out_p = _simulate(tmp_path, "0")
    assert "event loop: compiled (mypyc)" in out_c and "native=1" in out_c
    assert "event loop: plain Python" in out_p and "native=0" in out_p
    assert [m["mode"] for m in compiled["modes"]] == ["sync", "async", "fully-async", "pdsr"]
    assert _results(compiled) == _results(plain)


def test_a_build_for_other_sources_is_never_loaded(tmp_path: Path) -> None:
    # the current build copied under another digest, as if the sources had changed since
    active = native.active_build()
    assert active is not None, "no compiled build: run `make sim-native`"
    cache = tmp_path / "cache"
    shutil.copytree(active, cache / ("0" * 24))
    _, out = _simulate(tmp_path, "1", cache=cache)
    assert "event loop: plain Python" in out and "native=0" in out

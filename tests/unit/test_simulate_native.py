"""SIMULATOR: the mypyc-compiled event loop and scheduler core (asyncdapo.tools.simulate.native) — loaded
only for the sources it was built from, never mixed with plain ones in a process, and a run's
results the same bit for bit as the plain modules'."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncdapo.tools.simulate import native

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _build() -> Path:
    """The build for the current sources: `make test` runs `make install`, which builds it; a
    developer who edited a source since gets this message rather than a silently slower simulator."""
    assert native.enabled(), "ASYNCDAPO_SIM_NATIVE is off in the test environment"
    where = native.current_build()
    if where is None:
        pytest.fail(
            f"no compiled build for the current sources under {native.cache_root()}: run `make sim-native`"
        )
    return where


def _probe(code: str) -> list[str]:
    """Run `code` in a fresh interpreter (this test process may have imported plain modules)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_make_install_built_these_sources_and_a_simulator_process_loads_them() -> None:
    where = _build()
    files = _probe(
        "from asyncdapo.tools.simulate import native\n"
        "import asyncdapo.tools.simulate.driver, asyncdapo.services.scheduler.core, asyncdapo.services.scheduler.memstore\n"
        "print(native.active_build())\n"
        "print(asyncdapo.tools.simulate.driver.__file__, asyncdapo.services.scheduler.core.__file__,"
        " asyncdapo.services.scheduler.memstore.__file__)\n"
    )
    assert files[0] == str(where)
    assert all(f.endswith(SUFFIX) and f.startswith(str(where)) for f in files[1:]), files


def test_a_process_that_imported_a_scheduler_module_plain_never_mixes_in_compiled_ones() -> None:
    _build()
    files = _probe(
        "import asyncdapo.services.scheduler.tasks\n"
        "from asyncdapo.tools.simulate import native\n"
        "import asyncdapo.tools.simulate.driver, asyncdapo.services.scheduler.core\n"
        "print(native.active_build())\n"
        "print(asyncdapo.tools.simulate.driver.__file__, asyncdapo.services.scheduler.core.__file__)\n"
    )
    assert files[0] == "None"
    assert all(f.endswith(".py") for f in files[1:]), files


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
    where.mkdir()
    (where / native.BUILD_INFO).write_text("{}")

    def ext(module: str) -> Path:
        f = where / f"{module.replace('.', '/')}{SUFFIX}"
        f.parent.mkdir(parents=True, exist_ok=True)
        return f

    for m in native.NATIVE_MODULES[:-1]:
        ext(m).write_bytes(b"")
    assert native.build_files(where) is None  # the last module is missing
    ext(native.NATIVE_MODULES[-1]).write_bytes(b"")
    (where / f"abc__mypyc{SUFFIX}").write_bytes(b"")
    files = native.build_files(where)
    assert files is not None and set(files) == set(native.NATIVE_MODULES) | {"abc__mypyc"}
    assert {"asyncdapo.tools.simulate.driver", "asyncdapo.services.scheduler.core"} <= set(files)


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
    _build()
    compiled, out_c = _simulate(tmp_path, "1")
    plain, out_p = _simulate(tmp_path, "0")
    assert "event loop: compiled (mypyc)" in out_c and "native=1" in out_c
    assert "event loop: plain Python" in out_p and "native=0" in out_p
    assert [m["mode"] for m in compiled["modes"]] == ["sync", "async", "fully-async", "pdsr"]
    assert _results(compiled) == _results(plain)


def test_a_build_for_other_sources_is_never_loaded(tmp_path: Path) -> None:
    # the current build copied under another digest, as if the sources had changed since
    cache = tmp_path / "cache"
    shutil.copytree(_build(), cache / ("0" * 24))
    _, out = _simulate(tmp_path, "1", cache=cache)
    assert "event loop: plain Python" in out and "native=0" in out

"""The simulator's event loop compiled with mypyc: the same source, about two thirds of the CPU per event.

`make install` runs `python -m asyncdapo.tools.simulate.native_cli build`, which compiles `NATIVE_MODULES`
with mypyc into a cache directory named by a digest of every `asyncdapo` source file, mypy's
version and the interpreter: the simulator's clock, engine model, dispatch transport, verifier
model and driver, and the scheduler's decision code they run (the rollout core, the in-memory
store, the dispatch queue, the admission, dispatch and long-tail policies, the task, group and
outcome records). `activate()` (run when `asyncdapo.tools.simulate` is imported) loads those compiled
modules in place of the plain ones when a build for the current digest exists, and does nothing
otherwise. So a source edit anywhere in `asyncdapo` — a compiled module, or a class whose
declared types the compiled code checks — means the plain modules run until the next build; a
stale build is never loaded. Results are the same bit for bit (mypyc compiles the Python
semantics; tests/unit/test_simulate_native.py compares whole runs), only faster.

The scheduler service never imports `asyncdapo.tools.simulate`: it runs its own modules plain. A process
that imported any compiled module's plain version before `asyncdapo.tools.simulate` (a test session that
ran scheduler tests first) runs the simulator plain too: one process never mixes the two.

`ASYNCDAPO_SIM_NATIVE=0` turns the compiled modules off; `ASYNCDAPO_NATIVE_CACHE` moves the cache
(default `~/.cache/asyncdapo/simulate-native`).

Invariant: a module is loaded compiled only from a build whose recorded digest equals the digest
of the sources on disk at import time, and only in a process where no module of that build was
imported plain.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

# the hot path of a run; the rest (workload sampling with pydantic specs, reports, the CLI, the
# commit ledger: mypyc compiles no generic dataclass; the claim records: once per claim, beside an
# exception class mypyc does not compile) runs once per run or per chunk of draws and stays plain
# Python
NATIVE_MODULES = tuple(
    [f"asyncdapo.tools.simulate.{m}" for m in ("clock", "records", "engine_model", "transport", "verifier_model",
                                         "prompt_feed", "driver")]
    + [f"asyncdapo.services.scheduler.{m}" for m in ("core", "core_outcomes", "core_commands", "memstore", "tasks",
                                            "group_records", "outcome_records", "eligible", "dispatch_queue",
                                            "policy.dispatch", "policy.long_tail", "policy.admission")]
)  # fmt: skip
BUILD_INFO = "BUILD.json"
FORMAT = 2  # bump when what a build directory holds changes


def cache_root() -> Path:
    env = os.environ.get("ASYNCDAPO_NATIVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "asyncdapo" / "simulate-native"


def enabled() -> bool:
    return os.environ.get("ASYNCDAPO_SIM_NATIVE", "1") not in ("0", "false", "no", "off")


def source_roots() -> list[Path]:
    """Each `asyncdapo` directory of the namespace (one per service's source root)."""
    import asyncdapo

    return sorted(Path(p) for p in asyncdapo.__path__)


def digest(roots: Iterable[Path], tools: str) -> str:
    """A digest of every .py/.pyi file under `roots` (path and bytes) and `tools`."""
    h = hashlib.sha256(f"{FORMAT}\0{tools}\0".encode())
    for root in roots:
        for p in sorted(root.rglob("*.py*")):
            if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root)).encode() + b"\0")
                h.update(p.read_bytes())
                h.update(b"\0")
    return h.hexdigest()[:24]


def _tools() -> str:
    """The compiler and the interpreter a build depends on (cheap: no mypy import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mypy = version("mypy")
    except PackageNotFoundError:
        mypy = "none"
    return f"mypy {mypy}; {sys.implementation.cache_tag}; {sys.version}"


def current_digest() -> str:
    return digest(source_roots(), _tools())


class _Finder(importlib.abc.MetaPathFinder):
    """Resolves the compiled modules' names (and their shared runtime library) to a build's files."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        f = self.files.get(fullname)
        if f is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(f))
        return importlib.util.spec_from_file_location(fullname, f, loader=loader)


_active: Path | None = None


def active_build() -> Path | None:
    """The build directory whose modules this process runs, or None (plain Python)."""
    return _active


def build_files(where: Path) -> dict[str, Path] | None:
    """Module name → extension file of the complete build in `where`, or None (no build there, or
    one a module is missing from)."""
    if not (where / BUILD_INFO).is_file():
        return None
    files: dict[str, Path] = {}
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in NATIVE_MODULES:
        f = where / f"{name.replace('.', '/')}{suffix}"
        if not f.is_file():
            return None
        files[name] = f
    for f in where.glob(f"*__mypyc{suffix}"):  # mypyc's runtime library shared by the group
        files[f.name[: -len(suffix)]] = f
    return files


def current_build() -> Path | None:
    """The complete build for the sources on disk now, or None (not built since the last edit)."""
    where = cache_root() / current_digest()
    return where if build_files(where) is not None else None


def activate() -> Path | None:
    """Load the compiled modules for the current sources, if built (see the module docstring)."""
    global _active
    if _active is not None or not enabled():
        return _active
    where = cache_root() / current_digest()
    files = build_files(where)
    if files is None or any(m in sys.modules for m in files):
        return None  # already imported plain: never mix the two in one process
    sys.meta_path.insert(0, _Finder(files))
    _active = where
    return where


def build(force: bool = False, keep: int = 3) -> Path:
    """Compile NATIVE_MODULES for the current sources (a no-op when that build exists)."""
    d = current_digest()
    root = cache_root()
    where = root / d
    if (where / BUILD_INFO).is_file() and not force:
        print(f"simulator native build up to date: {where}")
        return where
    sources = [_source(m) for m in NATIVE_MODULES]
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        out = Path(tmp) / "out"
        # mypy's incremental cache beside the builds, not in the source tree: a rebuild after a small
        # edit type-checks only what changed. `asyncdapo` is a namespace package spread over one
        # source root per service: module names are taken relative to those roots (MYPYPATH).
        paths = ["--explicit-package-bases", "--cache-dir", str(root / ".mypy-cache")] + [
            str(p) for p in sources
        ]
        script = (
            "import sys\n"
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            "paths, target, out, temp = sys.argv[1].split(','), sys.argv[2], sys.argv[3], sys.argv[4]\n"
            "setup(name='asyncdapo-simulate-native', ext_modules=mypycify(paths, opt_level='3', target_dir=target),\n"
            "      script_args=['-q', 'build_ext', '--build-lib', out, '--build-temp', temp])\n"
        )
        env = dict(os.environ, MYPYPATH=os.pathsep.join(str(r.parent) for r in source_roots()))
        cmd = [sys.executable, "-c", script, ",".join(paths), f"{tmp}/c", str(out), f"{tmp}/t"]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"mypyc failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        if current_digest() != d:
            raise RuntimeError("the sources changed while they were compiled: build again")
        info = {
            "digest": d,
            "modules": list(NATIVE_MODULES),
            "tools": _tools(),
            "built_s": time.monotonic() - t0,
        }
        (out / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(where, ignore_errors=True)
        out.rename(where)
    _prune(root, keep, where)
    print(f"simulator native build: {where} ({time.monotonic() - t0:.0f} s)")
    return where


def _source(module: str) -> Path:
    rel = Path(*module.split(".")).with_suffix(".py")
    for r in source_roots():
        if (r.parent / rel).is_file():
            return r.parent / rel
    raise RuntimeError(f"{module}'s source not found on the path")


def _prune(root: Path, keep: int, current: Path) -> None:
    """Keep the `keep` newest builds (the current one always)."""
    builds = sorted(
        (p for p in root.iterdir() if p.is_dir() and (p / BUILD_INFO).is_file() and p != current),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in builds[max(0, keep - 1) :]:
        shutil.rmtree(old, ignore_errors=True)

"""Folder path = layer = import path.

Every module lives at src/<its dotted name>.py, and its second name is its layer:
`asyncdapo.contracts` ← `asyncdapo.runtime` ← `asyncdapo.services.<service>` ← `asyncdapo.tools`
(with the `asyncdapo` console script on top). Which layer may import which is import-linter's job
(`make lint`, contracts in pyproject.toml); these tests keep the tree itself in that shape."""

from __future__ import annotations

import importlib.machinery
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "src"
PKG = ROOT / "asyncdapo"
LAYERS = ("contracts", "runtime", "services", "tools")
SERVICES = ("gateway", "operator", "scheduler", "trainer", "verifier")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_the_source_root_holds_the_four_layers_and_the_console_script_only() -> None:
    # the package and its README (+ the editable install's metadata, not tracked)
    assert sorted(p.name for p in ROOT.iterdir() if p.suffix != ".egg-info") == ["README.md", "asyncdapo"]
    top = sorted(p.name for p in PKG.iterdir() if p.name != "__pycache__")
    assert top == sorted(["__init__.py", "cli.py", *LAYERS, "py.typed"])
    services = sorted(p.name for p in (PKG / "services").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert services == list(SERVICES)
    for pkg in [PKG, *(PKG / layer for layer in LAYERS), *(PKG / "services" / s for s in SERVICES)]:
        assert (pkg / "__init__.py").is_file(), pkg


def test_each_module_resolves_to_its_own_file_through_the_plain_path_finder() -> None:
    mods = _modules()
    assert len(mods) > 100
    for name, path in sorted(mods.items()):
        parent, _, leaf = name.rpartition(".")
        search = [str(ROOT / Path(*parent.split(".")))] if parent else [str(ROOT)]
        spec = importlib.machinery.PathFinder.find_spec(leaf, search)
        assert spec is not None and spec.origin == str(path), f"{name} -> {spec and spec.origin}, not {path}"


# Role names every service may have once: its command line, its Prometheus metrics, its package.
ROLE_NAMES = {"__init__", "cli", "metrics"}


def test_module_names_are_unique_outside_the_role_names() -> None:
    """A file name says which half it belongs to: `gateway_pool` (the scheduler's view of the
    gateways) and `worker_pool` (the verifier's processes), not two `pool.py`."""
    seen: dict[str, list[str]] = {}
    for name in _modules():
        seen.setdefault(name.rpartition(".")[2], []).append(name)
    dup = {leaf: names for leaf, names in seen.items() if len(names) > 1 and leaf not in ROLE_NAMES}
    assert not dup, dup


def test_the_wheel_finds_every_package_of_the_source_tree() -> None:
    """setuptools installs the packages it finds under src/: a folder without an __init__.py would
    work from the checkout and be missing from every installed wheel."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "src"} and setuptools["packages"]["find"]["where"] == ["src"]
    for d in PKG.rglob("*"):
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
            assert (d / "__init__.py").is_file(), f"{d.relative_to(REPO)} has modules but no __init__.py"


def test_import_linter_names_every_layer_and_service() -> None:
    """The layers contract lists what the tree holds: a new service or layer is under a contract
    the day it is added."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    flat = {name.strip() for level in layers for name in level.replace("|", " ").split()}
    assert flat == {"asyncdapo.cli", "asyncdapo.tools", "asyncdapo.runtime", "asyncdapo.contracts"} | {
        f"asyncdapo.services.{s}" for s in SERVICES
    }


def test_no_import_circle_among_the_benchmark_scripts() -> None:
    """bench/ holds scripts, not a package, so import-linter cannot see it: the same rule
    (every import counted, in functions and under TYPE_CHECKING too) checked here."""
    import ast

    bench = REPO / "bench"
    names = {p.stem for p in bench.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for p in bench.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[0] for a in node.names)
        graph[p.stem] = (deps & names) - {p.stem}
    state: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                raise AssertionError(f"import circle: {' -> '.join([*stack[stack.index(m) :], m])}")
            if m not in state:
                visit(m, [*stack, m])
        state[n] = 2

    assert len(graph) > 20
    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_every_top_level_folder_says_its_job_in_its_readme_first_line() -> None:
    """A reader names each folder's job from the first line of its README: `# <folder> — <job>`."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    folders = {p.split("/")[0] for p in tracked.stdout.splitlines() if "/" in p and not p.startswith(".")}
    layers = {f"src/asyncdapo/{layer}" for layer in LAYERS}
    assert {"bench", "deploy", "docs", "examples", "proto", "src", "tests"} <= folders
    for folder in sorted(folders | layers):
        readme = REPO / folder / "README.md"
        assert readme.is_file(), f"{folder}/ has no README.md"
        first = readme.read_text().splitlines()[0]
        name = folder.rsplit("/", 1)[-1]
        assert first.startswith(f"# {name} — ") and len(first) > len(name) + 15, f"{folder}: {first!r}"

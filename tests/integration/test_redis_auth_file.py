"""The Redis password reaches redis-server as a file only: the init container's script (the chart's
Redis and the operator's managed one run the same) turns the Secret's file into a `requirepass`
config file, and a real redis-server started with it admits exactly that password — quotes, spaces,
backslashes, a non-ASCII byte and a trailing newline included — and no other."""

from __future__ import annotations

import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import required
import yaml

from asyncdapo.services.operator.desired import Lifecycle, OperatorDefaults, RunRef, desired_state
from asyncdapo.services.operator.spec import parse_spec
from asyncdapo.tools.local.ports import free_port, port_open, wait_until

REPO = Path(__file__).resolve().parents[2]
PASSWORD = b'p "a\'ss" w\\o\\\\rd \\x41 \xff\n'  # the Secret's exact bytes, trailing newline included


def _operator_pod() -> dict[str, Any]:
    tr = yaml.safe_load((REPO / "deploy/k8s/examples/tiny-math-cpu.yaml").read_text())
    spec = parse_spec(tr["spec"], tr["metadata"]["name"])
    ref = RunRef(tr["metadata"]["name"], "ml", "00000000-0000-0000-0000-000000000001")
    objs = desired_state(spec, ref, OperatorDefaults(), Lifecycle.RUNNING)
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-redis"))
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


def _chart_pod() -> dict[str, Any]:
    required.module("helm_python")
    from asyncdapo.services.operator import chart

    docs = chart.render()
    sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "asyncdapo-redis")
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


@pytest.fixture(params=["chart", "operator"])
def redis_pod(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _chart_pod() if request.param == "chart" else _operator_pod()


def _run_init(pod: dict[str, Any], password_file: Path, conf: Path) -> subprocess.CompletedProcess[str]:
    """The init container's command with its two paths moved into the test's directory."""
    (init,) = pod["initContainers"]
    *script, _password_path, conf_path = init["command"]
    (redis,) = pod["containers"]
    assert redis["args"][0] == conf_path  # redis-server loads what the init container wrote
    return subprocess.run(
        [*script, str(password_file), str(conf)], capture_output=True, text=True, timeout=30
    )


def _commands(port: int, *commands: list[bytes]) -> list[bytes]:
    """The replies' first lines to commands sent on one connection (RESP, no client library: the
    bytes of the password go to Redis exactly as given)."""
    replies = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, s.makefile("rb") as f:
        for args in commands:
            s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
            replies.append(f.readline().rstrip(b"\r\n"))
    return replies


@pytest.fixture()
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def test_redis_started_with_the_init_containers_file_admits_exactly_the_password(
    redis_pod: dict[str, Any], tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on PATH (CI installs it)")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "password").write_bytes(PASSWORD)
    run = tmp_path / "run"
    run.mkdir()
    conf = run / "auth.conf"
    proc = _run_init(redis_pod, secret / "password", conf)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(conf.stat().st_mode) == 0o400  # its owner (redis-server's UID) only
    assert b"w\\o" not in conf.read_bytes()  # escaped: no byte of the password as it is
    # idempotent: a restarted init container rewrites its own read-only file
    assert _run_init(redis_pod, secret / "password", conf).returncode == 0

    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            str(conf),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started.append(server)
    wait_until(lambda: port_open("127.0.0.1", port), 10, "redis-server")
    ping, wrong, right, after = _commands(
        port, [b"PING"], [b"AUTH", PASSWORD.rstrip(b"\n")], [b"AUTH", PASSWORD], [b"PING"]
    )
    assert ping.startswith(b"-NOAUTH")  # no AUTH: refused
    assert wrong.startswith(b"-WRONGPASS")  # the trailing newline is part of the password
    assert (right, after) == (b"+OK", b"+PONG")


def test_an_empty_password_fails_the_init_container_and_writes_no_config(
    redis_pod: dict[str, Any], tmp_path: Path
) -> None:
    empty = tmp_path / "password"
    empty.write_bytes(b"")
    conf = tmp_path / "auth.conf"
    proc = _run_init(redis_pod, empty, conf)
    assert proc.returncode != 0
    assert "empty or missing" in proc.stderr
    assert not conf.exists()  # redis-server then cannot start without a password

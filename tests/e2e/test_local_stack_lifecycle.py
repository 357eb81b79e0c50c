"""`asyncdapo up` as a user's shell sees it: the stack it launches has a Redis that requires the
password it generated (every service uses it; a client without it is refused), and whatever ends
`up` — SIGTERM (a `kill`), SIGHUP (the terminal closed) or SIGKILL — nothing of the run is left
running 10 s later. The gateways run the token-timing SIMULATOR (`--engine sim`): this is about
processes, secrets and signals, which the engine kind does not change, and a sim stack starts in
seconds. Redis, the verifier, the scheduler and the trainer are the real ones."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from process_tree import descendants, survivors, with_env

from asyncdapo.tools.local.stack import RUN_DIR_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim_config(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits

    root = tmp_path_factory.mktemp("lifecycle")
    train, val = synth_splits(64, 4, seed=0, spec=SynthSpec(ops=("+",), max_operand=9))
    write_examples(train, root / "train.parquet")
    write_examples(val, root / "val.parquet")
    cfg = {
        "name": "lifecycle",
        "model": {"path": str(tiny_model_dir)},
        "data": {
            "train_files": [str(root / "train.parquet")],
            "val_files": [str(root / "val.parquet")],
            "train_batch_size": 4,
            "max_prompt_length": 64,
            "max_response_length": 16,
            "prompt_queue_watermark": 16,
        },
        "rollout": {"n": 2, "max_concurrent_prompts": 4, "val_n": 1},
        "reward": {"overlong_buffer": {"enable": True, "len": 4}},
        "trainer": {"total_steps": 100, "ppo_mini_batch_size": 4},
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _raw(port: int, command: bytes) -> bytes:
    """The server's first reply line to `command` on a fresh connection (no client library)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(command)
        return sock.recv(200)


def _http_get(port: int, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode(errors="replace")


def _flag(cmdline: list[str], flag: str) -> str:
    return cmdline[cmdline.index(flag) + 1]


def _service_cmdlines(up_pid: int) -> dict[str, list[str]]:
    """The command lines of up's services, by role (scheduler, redis, trainer, ...)."""
    found: dict[str, list[str]] = {}
    for p in descendants(up_pid):
        try:
            argv = Path(f"/proc/{p.pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv and "redis-server" in argv[0]:
            # started with --port; once up, it retitles itself "redis-server HOST:PORT"
            port = _flag(argv, "--port") if "--port" in argv else argv[0].rpartition(":")[2]
            if port.isdigit():
                found["redis"] = ["redis-server", "--port", port]
        elif "asyncdapo.cli" in argv:
            found[argv[argv.index("asyncdapo.cli") + 1]] = argv
    return found


def _wait_for_the_trainer(proc: subprocess.Popen[bytes], out: Path) -> dict[str, list[str]]:
    """Until the scheduler sees prompts the trainer fed into the stack's Redis: every service is up
    and has used the password. Returns the services' command lines."""
    import grpc

    from asyncdapo.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"up exited with {proc.returncode}:\n{out.read_text()[-3000:]}"
        services = _service_cmdlines(proc.pid)
        if "trainer" in services and "scheduler" in services:
            address = f"127.0.0.1:{_flag(services['scheduler'], '--port')}"
            with grpc.insecure_channel(address) as ch, contextlib.suppress(grpc.RpcError):
                st = scheduler_pb2_grpc.SchedulerStub(ch).GetRun(scheduler_pb2.GetRunRequest(), timeout=5)
                if st.queue_depth > 0 or st.completions > 0:
                    return services
        time.sleep(0.5)
    raise AssertionError(f"the trainer fed no prompts within 300 s:\n{out.read_text()[-3000:]}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_up_protects_its_redis_and_leaves_nothing_behind(
    sim_config: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    run_dir = tmp_path / "run"
    out = tmp_path / "up.out"
    env = {k: v for k, v in os.environ.items() if k != "ASYNCDAPO_REDIS_PASSWORD"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncdapo.cli", "up", str(sim_config), "--engine", "sim", "--gateways", "1",
         "--quiet", "--run-dir", str(run_dir), "--timeout-s", "600"],
        stdout=out.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        services = _wait_for_the_trainer(proc, out)

        # The password: generated into the run directory for its owner only, never on a command line.
        secrets_dir = run_dir / "secrets"
        password = (secrets_dir / "redis-password").read_text().strip()
        assert len(password) >= 32
        assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
        for f in ("redis-password", "token", "../redis/auth.conf"):
            assert stat.S_IMODE((secrets_dir / f).stat().st_mode) == 0o600, f
        token = (secrets_dir / "token").read_text().strip()
        assert len(token) >= 32
        secrets = {"the Redis password": password, "the gRPC token": token}
        pages = 0
        for what, secret in secrets.items():  # never on a command line, in a metric, or in a log
            assert not [argv for argv in services.values() if any(secret in a for a in argv)], what
            for name, argv in services.items():  # the verifier serves /metrics on its own port
                flag = (
                    "--metrics-port" if "--metrics-port" in argv else "--port" if name == "verifier" else ""
                )
                if flag:
                    page = _http_get(int(_flag(argv, flag)), "/metrics")
                    assert "# TYPE" in page and secret not in page, f"{what} in {name}'s /metrics"
                    pages += 1
        assert pages >= 2 * 3, pages  # verifier, gateway, scheduler at least
        url = f"redis://127.0.0.1:{_flag(services['redis'], '--port')}/0"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url).ping()
        assert _raw(int(_flag(services["redis"], "--port")), b"GET x\r\n").startswith(b"-NOAUTH")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url, password="not-it").ping()
        assert redis.Redis.from_url(url, password=password).dbsize() > 0  # the trainer's prompts

        tree = descendants(proc.pid)
        assert len(tree) >= 5, tree  # redis, verifier (+ its workers), gateway, scheduler, trainer, reaper
        os.kill(proc.pid, sig)  # `up` alone, as a user's `kill` or a closed terminal does
        code = proc.wait(60)
        if sig is signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:  # handled like Ctrl-C: services stopped in order, report written, exit 130
            assert code == 130, out.read_text()[-3000:]
            assert "interrupted: stopping every service" in out.read_text()
        left = survivors(tree, within_s=10.0)
        assert not left, f"alive 10 s after up got {sig.name}: {left}"
        # every file the run wrote (logs, reports, metrics, config) but the secrets' own 0600 files
        own = {secrets_dir / "redis-password", secrets_dir / "token", run_dir / "redis" / "auth.conf"}
        files = [f for f in run_dir.rglob("*") if f.is_file() and f not in own]
        assert any(f.suffix == ".log" for f in files), sorted(map(str, files))
        for f in files:
            data = f.read_bytes()
            for what, secret in secrets.items():
                assert secret.encode() not in data, f"{what} in {f.relative_to(run_dir)}"
        assert not with_env(RUN_DIR_ENV, str(run_dir.resolve()))
    finally:
        for p in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(30)

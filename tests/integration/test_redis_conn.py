"""Redis with a password (`requirepass`): one helper builds every client and finds the password
(URL, then `--redis-password-file`, then ASYNCDAPO_REDIS_PASSWORD); a client without it is refused;
the scheduler and trainer CLIs take it from the flag or the environment, and refuse to start,
naming where the password comes from, when it is missing or wrong."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
import yaml

from asyncdapo.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from asyncdapo.runtime.redis_conn import (
    PASSWORD_ENV,
    apply_password_flag,
    async_client,
    check_auth,
    sync_client,
)
from asyncdapo.tools.local.ports import free_port, port_open
from asyncdapo.tools.local.redis_server import RedisServer

PASSWORD = "correct-horse-battery-staple"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("locked-redis"), appendonly=False, password=PASSWORD).start()
    yield server
    server.stop()


def _noauth_reply(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET x\r\n")
        return sock.recv(200)


def test_the_server_requires_the_password_and_keeps_it_off_the_command_line(
    locked_redis: RedisServer,
) -> None:
    assert _noauth_reply(locked_redis.port).startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(locked_redis.url).ping()
    conf = locked_redis.workdir / "auth.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert locked_redis.proc is not None
    cmdline = Path(f"/proc/{locked_redis.proc.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in cmdline


def test_clients_take_the_password_from_env_flag_or_url(
    locked_redis: RedisServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(redis.AuthenticationError):
        sync_client(locked_redis.url).ping()
    with pytest.raises(Exception, match="ASYNCDAPO_REDIS_PASSWORD \\(which is not set\\)"):
        check_auth(sync_client(locked_redis.url), locked_redis.url)

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    assert sync_client(locked_redis.url).ping()
    assert asyncio.run(_async_ping(locked_redis.url))

    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    with pytest.raises(Exception, match="refused our credentials"):
        check_auth(sync_client(locked_redis.url), locked_redis.url)
    # a password in the URL wins over the environment
    assert sync_client(f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0").ping()

    # --redis-password-file sets it for this process and its children
    monkeypatch.delenv(PASSWORD_ENV)
    pw_file = tmp_path / "pw"
    pw_file.write_text(PASSWORD + "\n")
    apply_password_flag(argparse.Namespace(redis_password_file=str(pw_file)))
    assert os.environ[PASSWORD_ENV] == PASSWORD and sync_client(locked_redis.url).ping()
    pw_file.write_text("")
    with pytest.raises(Exception, match="is empty"):
        apply_password_flag(argparse.Namespace(redis_password_file=str(pw_file)))


async def _async_ping(url: str) -> bool:
    client = async_client(url)
    try:
        return bool(await client.ping())
    finally:
        await client.aclose()


def _scheduler_argv(cfg: Path, port: int, redis_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asyncdapo.cli", "scheduler", "--config", str(cfg), "--port", str(port),
            "--metrics-port", "0", "--redis", redis_url, "--verifier", "http://127.0.0.1:9",
            "--gateways", "127.0.0.1:9", *extra]  # fmt: skip


def test_scheduler_and_trainer_clis_use_the_password(
    locked_redis: RedisServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """End to end through the scheduler CLI: prompts queued in a locked Redis are seen through the
    scheduler's GetRun only when it has the password (flag or environment)."""
    from asyncdapo.contracts.prompts import PromptRecord, queue_prompts
    from asyncdapo.contracts.redis_keys import RunKeys

    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"name": "t", "model": {"path": str(tiny_model_dir)}, "data": {"train_batch_size": 4},
             "trainer": {"ppo_mini_batch_size": 4}}
        )
    )  # fmt: skip
    client = redis.Redis.from_url(locked_redis.url, password=PASSWORD)
    client.flushall()
    pipe = client.pipeline()
    queue_prompts(
        pipe, RunKeys("t"), [PromptRecord(f"p{i}", [1, 2, 3], "", "1", "test", 0, i) for i in range(8)]
    )
    pipe.execute()
    pw_file = tmp_path / "pw"
    pw_file.write_text(PASSWORD)
    clean = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}

    # without the password, or with a wrong one: refused at start, saying where it comes from
    for env in (clean, {**clean, PASSWORD_ENV: "wrong"}):
        out = subprocess.run(
            _scheduler_argv(cfg, free_port(), locked_redis.url),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2, out.stderr[-3000:]
        assert "refused our credentials" in out.stderr and PASSWORD_ENV in out.stderr, out.stderr[-3000:]
    trainer = subprocess.run(
        [sys.executable, "-m", "asyncdapo.cli", "trainer", "--config", str(cfg), "--redis", locked_redis.url],
        env=clean, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert trainer.returncode == 2 and "refused our credentials" in trainer.stderr, trainer.stderr[-3000:]

    for extra, env in (
        (("--redis-password-file", str(pw_file)), clean),
        ((), {**clean, PASSWORD_ENV: PASSWORD}),
    ):
        port = free_port()
        proc = subprocess.Popen(
            _scheduler_argv(cfg, port, locked_redis.url, *extra), env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not port_open("127.0.0.1", port):
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                assert time.monotonic() < deadline, "scheduler did not start"
                time.sleep(0.2)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                st = scheduler_pb2_grpc.SchedulerStub(ch).GetRun(
                    scheduler_pb2.GetRunRequest(run="t"), timeout=10
                )
            assert st.queue_depth == 8, extra
        finally:
            proc.terminate()
            proc.wait(30)
        assert proc.returncode == 0, proc.stderr.read().decode()[-3000:] if proc.stderr else ""


def test_preflight_pings_with_the_runs_password(
    locked_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`asyncdapo up --redis-url`'s preflight: a Redis that answers passes; one that refuses our
    password is named with where the password comes from."""
    from asyncdapo.tools.preflight import check_redis

    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    (p,) = check_redis(locked_redis.url)
    assert p.field == "--redis-url" and "refused our credentials" in p.allowed
    assert "--redis-password-file" in p.hint and f"{PASSWORD_ENV} (which is not set)" in p.hint
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    (p,) = check_redis(locked_redis.url)
    assert "refused our credentials" in p.allowed and "(which is set)" in p.hint
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    assert check_redis(locked_redis.url) == []
    monkeypatch.delenv(PASSWORD_ENV)
    url = locked_redis.url.replace("redis://", f"redis://:{PASSWORD}@")
    assert check_redis(url) == []  # the URL's own password

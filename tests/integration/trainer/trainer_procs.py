"""Process-level fault helpers for the trainer tests: a redis-server of the test's own that can be
SIGKILLed and restarted on the same port and directory (its AOF reloaded), and trainer processes
run through the real CLI, their logs in files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from asyncdapo.contracts.config import RunConfig
from asyncdapo.services.trainer.crash_points import ENV as CRASH_ENV
from asyncdapo.tools.local.ports import free_port
from asyncdapo.tools.local.redis_server import RedisServer


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


class KillableRedis:
    """A redis-server with AOF and appendfsync always (as the platform runs it), restartable."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.server: RedisServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def aof_dir(self) -> Path:
        return self.workdir / "appendonlydir"

    def start(self) -> KillableRedis:
        import redis

        self.server = RedisServer(self.workdir, port=self.port).start()
        redis.Redis(port=self.port).config_set("appendfsync", "always")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync."""
        assert self.server is not None and self.server.proc is not None
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait(10)

    def snapshot_aof(self, dest: Path) -> None:
        shutil.copytree(self.aof_dir, dest)

    def restore_aof(self, src: Path) -> None:
        """Replace the AOF by an older copy (Redis must be stopped): a rollback of everything after."""
        shutil.rmtree(self.aof_dir)
        shutil.copytree(src, self.aof_dir)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class TrainerProc:
    """`asyncdapo trainer` in a child process (its own session, so a SIGKILL takes only it)."""

    def __init__(
        self,
        cfg: RunConfig,
        redis_url: str,
        workdir: Path,
        trainer_id: str,
        crash: str | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.redis_url = redis_url
        self.out = Path(cfg.trainer.checkpoint_dir)
        self.trainer_id = trainer_id
        self.crash = crash
        self.metrics_port = metrics_port
        self.log_path = workdir / f"trainer-{trainer_id}-{int(time.monotonic() * 1000)}.log"
        self.config_path = workdir / f"run-{trainer_id}.yaml"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> TrainerProc:
        self.config_path.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json")))
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        env.pop(CRASH_ENV, None)
        if self.crash:
            env[CRASH_ENV] = self.crash
        cmd = [sys.executable, "-m", "asyncdapo.cli", "trainer", "--config", str(self.config_path),
               "--redis", self.redis_url, "--out", str(self.out), "--log-level", "INFO",
               "--trainer-id", self.trainer_id]  # fmt: skip
        if self.metrics_port:
            cmd += ["--metrics-port", str(self.metrics_port)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def assert_alive(self) -> None:
        assert self.alive(), (
            f"trainer {self.trainer_id} exited ({self.proc and self.proc.returncode}):\n" + self.log()[-4000:]
        )

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"trainer {self.trainer_id} still running:\n{self.log()[-4000:]}") from None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def wait_steps(self, n: int, timeout_s: float = 120) -> None:
        """Until metrics.jsonl records step n (this process must stay alive meanwhile)."""

        def done() -> bool:
            self.assert_alive()
            return n in metric_steps(self.out)

        wait_for(done, timeout_s, f"step {n} of trainer {self.trainer_id}")

    def wait_log(self, text: str, timeout_s: float = 60) -> None:
        def seen() -> bool:
            self.assert_alive()
            return text in self.log()

        wait_for(seen, timeout_s, f"{text!r} in the log of trainer {self.trainer_id}")

    def scrape(self, name: str) -> float | None:
        """The value of an unlabelled Prometheus sample from the trainer's metrics port."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None


def metric_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


def ledger(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "trained.jsonl").read_text().splitlines() if x.strip()]


def assert_trained_exactly_once(out: Path, expected_prompt_ids: list[str], steps: int) -> list[str]:
    """The ledger lists steps 1..steps once each and exactly the expected groups, once each, in
    stream order; returns the trained stream ids."""
    lines = ledger(out)
    assert [x["step"] for x in lines] == list(range(1, steps + 1)), [x["step"] for x in lines]
    trained = [pid for x in lines for pid in x["group_ids"]]
    assert trained == expected_prompt_ids, (trained, expected_prompt_ids)
    sids = [sid for x in lines for sid in x["stream_ids"]]
    assert len(sids) == len(set(sids))
    assert sids == sorted(sids, key=lambda s: tuple(int(p) for p in s.split("-")))
    return sids

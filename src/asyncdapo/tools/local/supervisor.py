"""Supervised subprocesses for the local stack.

Invariants:
- every child runs in its own session (process group), so stopping it also stops what it spawned
  (vLLM's engine-core processes, verifier pool workers): nothing is left orphaned;
- a child that exits while it should be running is reported by name, with its exit code, its log
  path and the log's last lines;
- `stop_all` stops children in reverse start order: SIGTERM (drain), then SIGKILL after a grace;
- a supervisor that dies without stopping its children (SIGKILL, OOM) does not leave them running:
  a reaper process (`reaper.py`) holds the list of their process groups and stops them when the
  supervisor's end of its stdin closes;
- within `interrupt_on(SIGTERM, SIGHUP)`, those signals stop the stack as Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError

log = logging.getLogger(__name__)


class ServiceFailed(AsyncdapoError):
    def __init__(self, name: str, reason: str, log_path: Path | None) -> None:
        self.name = name
        self.log_path = log_path
        tail = _tail(log_path) if log_path else ""
        where = f"; log: {log_path}" if log_path else ""
        super().__init__(
            f"service {name!r} {reason}{where}" + (f"\n--- last lines ---\n{tail}" if tail else "")
        )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class ServiceSpec:
    name: str
    argv: list[str]
    ready: Callable[[], bool] | None = None  # None: ready as soon as it is running
    ready_timeout_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    # A child that may finish on its own (the trainer after its last step).
    may_exit: bool = False


@dataclass
class Managed:
    spec: ServiceSpec
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def name(self) -> str:
        return self.spec.name

    def exited(self) -> int | None:
        return self.proc.poll()


class Supervisor:
    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.env = env or {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Managed] = []
        self._reaper: subprocess.Popen[bytes] | None = None

    def start(self, spec: ServiceSpec) -> Managed:
        """Start `spec` and wait until its readiness probe passes (or it fails, named)."""
        log_path = self.log_dir / f"{spec.name}.log"
        log = log_path.open("ab")
        env = {**os.environ, **self.env, **spec.env, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            spec.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=spec.cwd,
            start_new_session=True,
        )
        log.close()
        child = Managed(spec, proc, log_path)
        self.children.append(child)
        self.watch(proc.pid)
        self._wait_ready(child)
        return child

    def _wait_ready(self, child: Managed) -> None:
        if child.spec.ready is None:
            return
        deadline = time.monotonic() + child.spec.ready_timeout_s
        while time.monotonic() < deadline:
            code = child.exited()
            if code is not None:
                raise ServiceFailed(child.name, f"exited with code {code} while starting", child.log_path)
            try:
                if child.spec.ready():
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise ServiceFailed(child.name, f"not ready after {child.spec.ready_timeout_s:.0f} s", child.log_path)

    def check(self) -> None:
        """Raise ServiceFailed for the first child that exited when it should not have."""
        for child in self.children:
            code = child.exited()
            if code is None:
                continue
            if child.spec.may_exit and code == 0:
                continue
            raise ServiceFailed(child.name, f"exited with code {code}", child.log_path)

    def get(self, name: str) -> Managed:
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(name)

    def stop(self, name: str, grace_s: float = 15.0) -> None:
        """Stop the child `name` (its whole process group) and forget it; the others keep running."""
        child = self.get(name)
        _signal_group(child.proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(grace_s)
        _signal_group(child.proc, signal.SIGKILL)
        child.proc.wait()
        self.unwatch(child.proc.pid)
        self.children.remove(child)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for child in reversed(self.children):
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            # The group may outlive its leader (engine processes): kill whatever is left.
            _signal_group(child.proc, signal.SIGKILL)
            child.proc.wait()
            self.unwatch(child.proc.pid)

    # --- the reaper: stops the process groups if this process dies without stop_all ---

    def watch(self, pgid: int) -> None:
        """Have the reaper stop process group `pgid` if this process dies first."""
        if self._reaper is None:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "asyncdapo.tools.local.reaper"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        self._tell_reaper(f"+{pgid}")

    def unwatch(self, pgid: int) -> None:
        """`pgid` is stopped: the reaper forgets it."""
        if self._reaper is not None:
            self._tell_reaper(f"-{pgid}")

    def _tell_reaper(self, line: str) -> None:
        assert self._reaper is not None and self._reaper.stdin is not None
        try:
            self._reaper.stdin.write(f"{line}\n".encode())
            self._reaper.stdin.flush()
        except OSError as err:  # it died: the services still stop with us, unless we are killed
            log.warning(
                "the reaper process is gone (%s): a killed supervisor would leave services running", err
            )

    def close(self) -> None:
        """Stop everything and end the reaper (after `stop_all` it has nothing left to stop)."""
        self.stop_all()
        if self._reaper is not None:
            with contextlib.suppress(OSError):
                assert self._reaper.stdin is not None, "started with stdin=PIPE"
                self._reaper.stdin.close()
            try:
                self._reaper.wait(10)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """Within: each of `signals` raises KeyboardInterrupt in the main thread, as Ctrl-C does, so a
    `kill` (SIGTERM) or a closed terminal (SIGHUP) stops the stack in order instead of orphaning
    it."""
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)

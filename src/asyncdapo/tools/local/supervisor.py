"""Supervised subprocesses: the one supervisor of `asyncdapo up` (local/stack.py) and of the fault
harness (faults/procs.py).

Invariants:
- every child runs in its own session (process group), so a stop, a kill, a pause takes what it
  spawned with it (vLLM's engine-core processes, verifier pool workers): nothing is left orphaned;
- a child starts again with the same argv (hence the same port), its log appended: a
  `Managed` outlives its processes, as a Deployment's pod name outlives its containers;
- a child that exits while it should be running is reported by name, with its exit code, its log
  path and the log's last lines (`check`), or started again after a crash-loop backoff when its
  spec says `Restart.ON_CRASH` (`start_restarts`);
- `stop_all` stops children in reverse start order: SIGTERM (drain), then SIGKILL after a grace;
  every stop waits until nothing of the child's process group is left;
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
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.runtime.backoff import Backoff

log = logging.getLogger(__name__)

# Crash-loop backoff of `Restart.ON_CRASH`, by the crashes in a row before this one: 1 s after the
# first crash, doubled per consecutive crash, at most 10 s (Kubernetes' shape, on a test's time scale).
CRASH_BACKOFF = Backoff(1.0, 10.0)
RESTART_POLL_S = 0.5  # how often the restart loop looks at the children


class ServiceFailed(AsyncdapoError):
    def __init__(self, name: str, reason: str, log_path: Path | None) -> None:
        self.name = name
        self.log_path = log_path
        tail = log_tail(log_path) if log_path else ""
        where = f"; log: {log_path}" if log_path else ""
        super().__init__(
            f"service {name!r} {reason}{where}" + (f"\n--- last lines ---\n{tail}" if tail else "")
        )


class Restart(StrEnum):
    """What happens when a child exits on its own (an exit 0 of a `may_exit` child is no crash)."""

    NEVER = "never"  # a crash is a failure `Supervisor.check` raises (`asyncdapo up`)
    ON_CRASH = "on-crash"  # started again after a crash-loop backoff, as a Deployment's pod (fault harness)


class RestartEvent(StrEnum):
    """What the restart loop did, as told to `Supervisor(on_restart=...)`."""

    CRASHED = "crashed"  # a child exited on its own: it starts again after the backoff
    STARTED = "start"  # the restart loop started it again


def unexpected_exit(code: int | None, may_exit: bool) -> bool:
    """A child's exit it was not meant to make: any exit, unless it may finish and finished well."""
    return code is not None and not (may_exit and code == 0)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(proc.name))
    return out


@dataclass
class ServiceSpec:
    name: str
    argv: list[str]
    ready: Callable[[], bool] | None = None  # None: ready as soon as it is running
    ready_timeout_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    # A child that may finish on its own (the trainer after its last step; a Job, not a crash).
    may_exit: bool = False
    restart: Restart = Restart.NEVER


class _Reaper:
    """This process's end of the reaper (`reaper.py`): started with the first watched group."""

    def __init__(self, env: Callable[[], dict[str, str]]) -> None:
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # the restart loop and the main thread both write

    def watch(self, pgid: int) -> None:
        with self._lock:
            if self._proc is None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "asyncdapo.tools.local.reaper"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, **self._env()},
                )
            self._tell(f"+{pgid}")

    def unwatch(self, pgid: int) -> None:
        with self._lock:
            if self._proc is not None:
                self._tell(f"-{pgid}")

    def _tell(self, line: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(f"{line}\n".encode())
            self._proc.stdin.flush()
        except OSError as err:  # it died: the services still stop with us, unless we are killed
            log.warning(
                "the reaper process is gone (%s): a killed supervisor would leave services running", err
            )

    def close(self) -> None:
        with self._lock:
            if self._proc is None:
                return
            with contextlib.suppress(OSError):
                assert self._proc.stdin is not None, "started with stdin=PIPE"
                self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


class Managed:
    """One supervised child: `spec.argv` in a process group of its own, started again with the same
    argv (hence on the same port) as often as asked, its output appended to `log_path`."""

    def __init__(
        self, spec: ServiceSpec, log_path: Path, env: dict[str, str], reaper: _Reaper, banner: str | None
    ) -> None:
        self.spec = spec
        self.log_path = log_path
        self._env = env
        self._reaper = reaper
        self._banner = banner
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.paused = False
        # Stopped or paused on purpose (a fault holds it down): the restart loop leaves it alone.
        self.held = False
        self.crashes = 0  # consecutive crashes the restart loop saw (reset by `release`)
        self.restart_at: float | None = None  # monotonic time of the pending restart
        self._group_live = False  # False once nothing of the process group is left: signal nobody
        self.lock = threading.RLock()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        """The main process's pid, which is also its process group's id."""
        return self.proc.pid if self.proc is not None else None

    def exited(self) -> int | None:
        """The main process's exit code; None while it runs (or before its first start)."""
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- start ---

    def start(self, wait_ready: bool = True) -> None:
        """Start (again) and, with `wait_ready`, wait until the readiness probe passes."""
        with self.lock:
            if self.running():
                raise ServiceFailed(self.name, f"is already running (pid {self.pid})", None)
            if self.proc is not None:  # a restart replaces the whole group, as a container's does
                self.signal(signal.SIGKILL)
                self._reaper.unwatch(self.proc.pid)
            self.starts += 1
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as out:
                if self._banner is not None:
                    out.write(
                        f"\n===== {self._banner}: start #{self.starts} of {self.name} at {time.time():.3f}\n".encode()
                    )
                    out.flush()
                self.proc = subprocess.Popen(
                    self.spec.argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **self._env, "PYTHONUNBUFFERED": "1"},
                    cwd=self.spec.cwd,
                    start_new_session=True,
                )
            self._group_live = True
            self.paused = False
            self._reaper.watch(self.proc.pid)
        if wait_ready:
            self.wait_ready()

    def probe(self) -> bool:
        """The readiness probe once (an exception is a no); True when there is none."""
        if self.spec.ready is None:
            return True
        try:
            return bool(self.spec.ready())
        except Exception:
            return False

    def is_ready(self) -> bool:
        return self.running() and self.probe()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until the probe passes; ServiceFailed (named, with its log) if it exits or times out."""
        if self.spec.ready is None:
            return
        limit = timeout_s or self.spec.ready_timeout_s
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            code = self.exited()
            if code is not None:
                raise ServiceFailed(self.name, f"exited with code {code} while starting", self.log_path)
            if self.probe():
                return
            time.sleep(0.2)
        raise ServiceFailed(self.name, f"not ready after {limit:.0f} s", self.log_path)

    def release(self) -> None:
        """Back under its restart policy with a clean crash record (after a start by hand)."""
        self.held = False
        self.crashes = 0
        self.restart_at = None

    # --- signals (the whole process group) ---

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self._group_live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL the whole group and wait until none of it is left."""
        with self.lock:
            if self.proc is None:
                return
            self.signal(signal.SIGKILL)
            self._reap(timeout_s)

    def terminate(self, grace_s: float = 30.0, *, group: bool = False) -> int | None:
        """SIGTERM, SIGKILL of the group after `grace_s`; returns the main process's exit code.
        `group=False`: SIGTERM to the main process only (what Kubernetes sends a container's PID 1);
        `group=True`: to every process of the group (vLLM's engine processes drain too)."""
        with self.lock:
            if self.proc is None:
                return None
            self._send_term(group)
            return self._finish(grace_s)

    def _send_term(self, group: bool) -> None:
        assert self.proc is not None
        if group:
            self.signal(signal.SIGTERM)
        elif self._group_live:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        if self.paused:  # a stopped process only acts on SIGTERM once continued
            self.signal(signal.SIGCONT)
            self.paused = False

    def _finish(self, wait_s: float) -> int | None:
        """After a SIGTERM: wait up to `wait_s`, then SIGKILL whatever is left of the group."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(0.0, wait_s))
        code = self.proc.poll()
        self.signal(signal.SIGKILL)  # the group may outlive its leader (engine processes)
        self._reap(10.0)
        return code

    def _reap(self, timeout_s: float) -> None:
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        while (left := group_members(self.proc.pid)) and time.monotonic() < deadline:
            self.signal(signal.SIGKILL)
            time.sleep(0.05)
        self.paused = False
        if not left:
            self._group_live = False
            self._reaper.unwatch(self.proc.pid)


RestartListener = Callable[[Managed, RestartEvent, str], None]


class Supervisor:
    """Owns the children (in start order), the reaper, and the restart loop."""

    def __init__(
        self,
        log_dir: Path,
        env: dict[str, str] | None = None,
        *,
        banner: str | None = None,
        on_restart: RestartListener | None = None,
    ) -> None:
        """`env`: added to every child's environment (a child started later sees later changes);
        `banner`: a line `===== BANNER: start #N of NAME at T` in the log before each start;
        `on_restart`: told of each crash the restart loop saw and each restart it made."""
        self.log_dir = Path(log_dir)
        self.env = env if env is not None else {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Managed] = []
        self.banner = banner
        self._on_restart = on_restart
        self._reaper = _Reaper(lambda: self.env)
        self._restarts: threading.Thread | None = None
        self._stopping = threading.Event()

    def add(self, spec: ServiceSpec) -> Managed:
        """A child for `spec`, not started yet (logs to `LOG_DIR/NAME.log`)."""
        child = Managed(
            spec, self.log_dir / f"{spec.name}.log", {**self.env, **spec.env}, self._reaper, self.banner
        )
        self.children.append(child)
        return child

    def start(self, spec: ServiceSpec, wait_ready: bool = True) -> Managed:
        """Start `spec` and wait until its readiness probe passes (or it fails, named)."""
        child = self.add(spec)
        child.start(wait_ready=wait_ready)
        return child

    def check(self) -> None:
        """Raise ServiceFailed for the first child that exited when it should not have (children
        the restart loop restarts, and those held down on purpose, excepted)."""
        for child in self.children:
            if child.spec.restart is Restart.ON_CRASH or child.held:
                continue
            code = child.exited()
            if unexpected_exit(code, child.spec.may_exit):
                raise ServiceFailed(child.name, f"exited with code {code}", child.log_path)

    def get(self, name: str) -> Managed:
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(name)

    # --- the restart loop (Restart.ON_CRASH) ---

    def start_restarts(self) -> None:
        """Restart, from now on, each `Restart.ON_CRASH` child that exits on its own."""
        if self._restarts is None:
            self._stopping.clear()
            self._restarts = threading.Thread(
                target=self._restart_loop, name="supervisor-restarts", daemon=True
            )
            self._restarts.start()

    def stop_restarts(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._restarts is not None:
            self._restarts.join(timeout_s)
            self._restarts = None

    def _restart_loop(self) -> None:
        while not self._stopping.wait(RESTART_POLL_S):
            self.restart_crashed()

    def restart_crashed(self, now: float | None = None) -> None:
        """One pass of the restart loop: a crash seen for the first time is told and gets its
        restart time (`CRASH_BACKOFF`); a child whose restart time has come starts again (not
        waiting for its probe). Children held down, stopping or busy (locked) are skipped."""
        for child in list(self.children):
            if child.spec.restart is not Restart.ON_CRASH or child.held or child.proc is None:
                continue
            if not child.lock.acquire(blocking=False):
                continue
            try:
                code = child.exited()
                if not unexpected_exit(code, child.spec.may_exit) or self._stopping.is_set():
                    continue
                t = time.monotonic() if now is None else now
                if child.restart_at is None:
                    self._tell(child, RestartEvent.CRASHED, f"exit code {code}; log {child.log_path}")
                    child.restart_at = t + CRASH_BACKOFF.delay(child.crashes)
                    child.crashes += 1
                if t >= child.restart_at:
                    child.restart_at = None
                    self._tell(child, RestartEvent.STARTED, "restarted by the supervisor")
                    child.start(wait_ready=False)
            finally:
                child.lock.release()

    def _tell(self, child: Managed, event: RestartEvent, detail: str) -> None:
        if self._on_restart is not None:
            self._on_restart(child, event, detail)

    # --- stopping ---

    def stop(self, name: str, grace_s: float = 15.0) -> None:
        """Stop the child `name` (its whole process group) and forget it; the others keep running."""
        child = self.get(name)
        child.terminate(grace_s, group=True)
        self.children.remove(child)

    def stop_all(self, grace_s: float = 15.0) -> None:
        """SIGTERM every child's group in reverse start order, SIGKILL what is left after `grace_s`."""
        self.stop_restarts()
        started = [c for c in reversed(self.children) if c.proc is not None]
        for child in started:
            with child.lock:
                child._send_term(group=True)
        deadline = time.monotonic() + grace_s
        for child in started:
            with child.lock:
                child._finish(deadline - time.monotonic())

    def kill_all(self) -> None:
        """SIGKILL every child's group in reverse start order (no drain), each until none is left."""
        self.stop_restarts()
        for child in reversed(self.children):
            child.kill()

    # --- the reaper: stops the process groups if this process dies without stop_all ---

    def watch(self, pgid: int) -> None:
        """Have the reaper stop process group `pgid` (one not started here) if this process dies first."""
        self._reaper.watch(pgid)

    def unwatch(self, pgid: int) -> None:
        """`pgid` is stopped: the reaper forgets it."""
        self._reaper.unwatch(pgid)

    def close(self) -> None:
        """Stop everything and end the reaper (after `stop_all` it has nothing left to stop)."""
        self.stop_all()
        self._reaper.close()

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

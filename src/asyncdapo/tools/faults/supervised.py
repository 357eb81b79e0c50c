"""One supervised subprocess of the fault harness (`Service`), and process-tree helpers.

A service runs in its own process group (session), so a kill takes whatever it spawned with it
(the verifier's worker pool, vLLM's engine processes), as a container's death would. Restarts
reuse the same argv, hence the same port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.tools.local.supervisor import _tail

MARKER_ENV = "ASYNCDAPO_FAULTS_RUN"


class FaultStackError(AsyncdapoError):
    """A service of the fault stack failed to start or to become ready; names it and its log."""


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


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment carries `MARKER_ENV=marker`."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] != "Z":
            found.append((int(proc.name), cmd.strip()))
    return found


@dataclass
class FaultEvent:
    t: float  # unix seconds
    service: str
    action: str  # start | kill | term | pause | resume | crashed | ready | …
    detail: str = ""


class Service:
    """One supervised subprocess in its own process group, restartable with the same argv."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        env: dict[str, str],
        ready: Callable[[], bool] | None = None,
        ready_timeout_s: float = 120.0,
        may_exit: bool = False,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.ready = ready
        self.ready_timeout_s = ready_timeout_s
        self.may_exit = may_exit  # exit 0 is the end of its work (a Job), not a crash
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.paused = False
        self.held = False  # a fault holds it down: the supervisor leaves it alone
        self.lock = threading.RLock()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait_ready: bool = True) -> None:
        with self.lock:
            if self.running():
                raise FaultStackError(f"service {self.name!r} is already running (pid {self.pid})")
            self.starts += 1
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                log.write(
                    f"\n===== fault harness: start #{self.starts} of {self.name} at {time.time():.3f}\n".encode()
                )
                log.flush()
                self.proc = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                )
            self.paused = False
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        if self.ready is None:
            return
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                raise FaultStackError(
                    f"service {self.name!r} exited with {code} while starting; log {self.log_path}:\n"
                    + _tail(self.log_path)
                )
            with contextlib.suppress(Exception):
                if self.ready():
                    return
            time.sleep(0.2)
        raise FaultStackError(
            f"service {self.name!r} not ready after {timeout_s or self.ready_timeout_s:.0f} s; "
            f"log {self.log_path}:\n" + _tail(self.log_path)
        )

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL the whole group and wait until none of it is left."""
        with self.lock:
            if self.proc is None:
                return
            self.signal_group(signal.SIGKILL)
            self._reap(timeout_s)

    def terminate(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the main process (what Kubernetes sends PID 1), SIGKILL the group after
        `grace_s`; returns the main process's exit code."""
        with self.lock:
            if self.proc is None:
                return None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            if self.paused:  # a stopped process only acts on SIGTERM once continued
                self.signal_group(signal.SIGCONT)
                self.paused = False
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
            code = self.proc.poll()
            self.signal_group(signal.SIGKILL)  # whatever the main process left behind
            self._reap(10.0)
            return code

    def _reap(self, timeout_s: float) -> None:
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            self.signal_group(signal.SIGKILL)
            time.sleep(0.05)
        self.paused = False

    def pause(self) -> None:
        self.signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal_group(signal.SIGCONT)
        self.paused = False

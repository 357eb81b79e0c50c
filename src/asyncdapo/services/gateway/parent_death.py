"""vLLM's engine processes die with the process that started them, even when it is SIGKILLed.

vLLM starts an engine-core process (and, with its `mp` executor, worker processes under it) and
stops them when the frontend shuts down cleanly. A SIGKILLed gateway (an OOM kill, a chaos test, a
kubelet past the grace period) runs no shutdown: its engine core kept running, holding the model,
the KV cache and its cores, and a restarted gateway then found its memory taken.

Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) fixes that from inside each child.
Each process vLLM starts arms it against its parent as its first act:
- forked children (vLLM's default on GPU while the frontend has not initialised CUDA) through an
  `os.register_at_fork` hook installed in the gateway by `die_with_parent_for_children()`; forked
  processes inherit the hook, so grandchildren (workers forked by the engine core) arm it too;
- spawned children (vLLM's CPU platform always spawns; on GPU once CUDA is initialised) through
  our vLLM general plugin (`vllm_shm.register` calls `on_plugin_load`), which vLLM runs in every
  engine process it spawns; they learn that they should from the environment variable the gateway
  sets.
A parent that died before its child armed the signal (fork, then SIGKILL, then prctl) is caught
by comparing the parent pid after arming with the one before the fork.

The signal follows the *thread* that forked the child: the gateway builds its engine on the event
loop's default executor, whose threads live as long as the loop, so the engine is not killed
while the gateway runs. Nothing of this runs unless the gateway asked for it, and nothing runs on
a system without prctl (not Linux): there the engine behaves as vLLM's own.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from typing import Any

log = logging.getLogger(__name__)

ENV = "ASYNCDAPO_ENGINE_DIES_WITH_PARENT"
_PR_SET_PDEATHSIG = 1

_prctl: Any = None  # resolved before any fork: after a fork only this call runs
_hook_installed = False
_forking_pid = 0  # set in the parent just before each fork; the child reads its copy


def _resolve_prctl() -> Any:
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        _prctl = libc.prctl
        _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _prctl.restype = ctypes.c_int
    return _prctl


def arm(expected_parent: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; if the parent is already gone
    (it is not `expected_parent` any more), die now. Returns False where prctl is unavailable."""
    prctl = _resolve_prctl()
    if prctl is None:
        return False
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != expected_parent:  # orphaned between fork and prctl: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _after_fork_in_child() -> None:
    arm(_forking_pid)


def _install_fork_hook() -> None:
    global _hook_installed
    if _hook_installed or _resolve_prctl() is None:
        return
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    _hook_installed = True


def die_with_parent_for_children() -> None:
    """In the gateway, before it starts the engine: every process it forks or vLLM spawns from now
    on (and theirs) is killed when its parent dies."""
    os.environ[ENV] = "1"
    _install_fork_hook()
    if _prctl is None:
        log.warning("no prctl on %s: vLLM's engine processes outlive a killed gateway", sys.platform)


def on_plugin_load() -> None:
    """From our vLLM general plugin, in every vLLM process that loads it (the gateway included)."""
    if os.environ.get(ENV) != "1":
        return
    _install_fork_hook()
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:  # a process vLLM spawned
        arm(parent.pid)

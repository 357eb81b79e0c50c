"""How vLLM's engine processes wait for each other, as a vLLM general plugin.

vLLM's engine core and its workers pass every step through shared-memory queues. A reader that
read something in the last `busy_loop_s` (1 s, not configurable in vLLM 0.32) spins on
`sched_yield`; after that it blocks on a ZeroMQ notification, re-checking the queue every
`SHM_READER_RECHECK_INTERVAL_MS` (5 s). Two costs follow on a CPU host:
- for a second after every step, the engine core and each worker spin. In RL that second is
  when the trainer computes (on-policy runs leave the engines idle while it trains), and on a
  small host the spinning processes take its cores;
- a notification that is lost (the writer's queue holds one) leaves the reader asleep until the
  next re-check: generation stalls for up to 5 s. Seen as rare 4-6 s rollout steps on the local
  stack, always after an idle gap longer than `busy_loop_s`.

The plugin shortens both when asked to through the environment (`ASYNCDAPO_VLLM_SHM_SPIN_S`,
`ASYNCDAPO_VLLM_SHM_RECHECK_MS`); the gateway sets them before it starts the engine, so the engine
processes it spawns inherit them. vLLM loads general plugins in every engine process before it
builds its queues. Without those variables, or with a vLLM whose internals differ, nothing is
changed (the latter is logged). Measured on the local stack (2 cores, `make bench-e2e`, async):
rollout 1.30-1.46 s/step and step period 2.6-2.9 s with vLLM's defaults; 1.14 s and 1.9 s with
50 ms / 20 ms, and no stalled step.
"""

from __future__ import annotations

import os
from typing import Any

ENV_SPIN_S = "ASYNCDAPO_VLLM_SHM_SPIN_S"
ENV_RECHECK_MS = "ASYNCDAPO_VLLM_SHM_RECHECK_MS"
CPU_SPIN_S = 0.05  # well above one decode step, so a reader spins only between steps
CPU_RECHECK_MS = 20  # what a lost notification costs; an idle reader polls this often


def configure(spin_s: float | None, recheck_ms: int | None) -> None:
    """Ask the plugin, in the engine processes started after this call, for these settings
    (None: vLLM's own). Raises ValueError naming a bad value."""
    if spin_s is not None and not spin_s >= 0:
        raise ValueError(f"vLLM shm spin must be >= 0 s, got {spin_s}")
    if recheck_ms is not None and not recheck_ms >= 1:
        raise ValueError(f"vLLM shm re-check interval must be >= 1 ms, got {recheck_ms}")
    for name, value in ((ENV_SPIN_S, spin_s), (ENV_RECHECK_MS, recheck_ms)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)


def register() -> None:
    """The `vllm.general_plugins` entry point (may run more than once per process). Also arms the
    engine processes vLLM spawns to die with their parent (`parent_death.py`) and lets them use
    AMX tiles (`amx.py`: without it vLLM's bfloat16 CPU kernels die with SIGILL on AMX hosts)."""
    from asyncdapo.services.gateway import amx, parent_death

    parent_death.on_plugin_load()
    amx.request_tile_permission()
    spin, recheck = os.environ.get(ENV_SPIN_S), os.environ.get(ENV_RECHECK_MS)
    if spin is None and recheck is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.logger import init_logger  # configured in vLLM's processes, unlike the root logger

    vlog = init_logger(__name__)
    if not _patchable(shm_broadcast):
        vlog.warning("vLLM's shared-memory queue has changed: %s / %s ignored", ENV_SPIN_S, ENV_RECHECK_MS)
        return
    if recheck is not None:
        shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = int(recheck)
    if spin is not None:
        _set_reader_spin(shm_broadcast.SpinCondition, float(spin))
    vlog.info("asyncdapo: shared-memory readers spin %s s, re-check every %s ms", spin, recheck)


def _patchable(module: Any) -> bool:
    cond = getattr(module, "SpinCondition", None)
    init = getattr(cond, "_asyncdapo_original_init", getattr(cond, "__init__", None))  # vLLM's own
    return isinstance(getattr(module, "SHM_READER_RECHECK_INTERVAL_MS", None), int) and (
        init is not None and "busy_loop_s" in init.__code__.co_varnames
    )


def _set_reader_spin(cls: Any, spin_s: float) -> None:
    original = getattr(cls, "_asyncdapo_original_init", cls.__init__)

    def __init__(self: Any, is_reader: bool, *args: Any, **kwargs: Any) -> None:
        original(self, is_reader, *args, **kwargs)
        if is_reader:
            self.busy_loop_s = spin_s

    cls._asyncdapo_original_init = original
    cls.__init__ = __init__

"""Intel AMX in vLLM's engine processes: ask Linux for the tile state before any kernel uses it.

Linux (5.16+) gives a process AMX tile data only after it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)`); an AMX instruction without that permission raises SIGILL. PyTorch asks in
the process that initialises oneDNN, but vLLM's CPU worker processes run vLLM's own AMX kernels
(bfloat16 attention and GEMMs, chosen from the CPU's flags) without asking: on a Sapphire Rapids or
newer host the first bfloat16 forward kills the worker (exit -4) and the engine dies at warm-up.
Called from the vLLM plugin, which vLLM loads in every engine process. The permission is per
process and inherited by threads; asking twice is harmless.
"""

from __future__ import annotations

import ctypes
import platform
import sys

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request_tile_permission() -> bool:
    """True when this process may use AMX tiles (asked now, or already granted); False where there
    is no AMX (the kernel refuses: EINVAL) or off x86_64 Linux. Never raises."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False

"""Intel AMX permission for vLLM's engine processes (asyncdapo.services.gateway.amx)."""

from __future__ import annotations


def test_amx_tile_permission_is_granted_where_the_cpu_has_amx() -> None:
    """A process that asked may use AMX (the engine processes ask through the plugin); on a CPU
    without AMX the kernel refuses and nothing else changes."""
    import ctypes
    import platform
    import sys
    from pathlib import Path

    from asyncdapo.services.gateway.amx import request_tile_permission

    granted = request_tile_permission()
    has_amx = sys.platform == "linux" and "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    assert granted == (has_amx and platform.machine() == "x86_64")
    if granted:  # ARCH_GET_XCOMP_PERM: the tile-data bit (18) is now in this process's permitted set
        mask = ctypes.c_ulong(0)
        assert ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)) == 0 and mask.value >> 18 & 1
    assert request_tile_permission() == granted  # asking twice is harmless

"""Free loopback ports and readiness waits for locally started services."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the kernel's ephemeral range no outgoing connection is given our port between the moment
# we pick it and the moment the service binds it (bind(0) picks *from* that range, and a test that
# starts Redis, gRPC and HTTP clients in between lost that race: "cannot bind 127.0.0.1:53837").
_FALLBACK_EPHEMERAL_LOW = 32768
_LOWEST = 10000
_handed_out: set[int] = set()
_lock = threading.Lock()


def ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's default when unreadable)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A TCP port on `host` that is free now, outside the ephemeral range, not handed out before.

    Another process may still bind it before our service does (the race is inherent to picking a
    port for someone else), but no outgoing connection of ours or anybody's can take it, and this
    process never hands the same port out twice. Falls back to the OS's pick when the range below
    the ephemeral ports is too small or exhausted.
    """
    high = ephemeral_low()
    rng = random.Random()
    with _lock:
        if high - _LOWEST >= 1000:
            for _ in range(attempts):
                port = rng.randrange(_LOWEST, high)
                if port not in _handed_out and _bindable(host, port):
                    _handed_out.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll `check` until it returns True; raise TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
